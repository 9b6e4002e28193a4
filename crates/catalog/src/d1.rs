//! The registry of D1 databases (which account owns which database, by name and id) and their
//! hourly usage counters.

use rusqlite::OptionalExtension;

use crate::{Catalog, Error, Result, now_iso};

/// A D1 database as the catalog records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct D1Database {
    /// The database id: a lowercase hyphenated UUID.
    pub uuid: String,
    /// The owning account.
    pub account_id: String,
    /// The name, unique within the account.
    pub name: String,
    /// ISO 8601 creation time.
    pub created_at: String,
    /// The location hint given at creation (`weur`, …), kept for the API's sake.
    pub primary_location_hint: Option<String>,
    /// The jurisdiction given at creation (`eu`, `fedramp`), kept for the API's sake.
    pub jurisdiction: Option<String>,
    /// Read replication mode: `disabled` or `auto`.
    pub read_replication: String,
}

/// What creating a database needs.
#[derive(Debug, Clone, Default)]
pub struct NewD1Database<'a> {
    /// The id to record (a fresh random UUID when `None`).
    pub uuid: Option<&'a str>,
    /// The owning account.
    pub account_id: &'a str,
    /// The name.
    pub name: &'a str,
    /// Optional location hint.
    pub primary_location_hint: Option<&'a str>,
    /// Optional jurisdiction.
    pub jurisdiction: Option<&'a str>,
    /// Most databases the account may hold.
    pub max_per_account: u64,
}

/// One page of a listing, with the total across all pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct D1DatabaseList {
    /// The databases on this page.
    pub databases: Vec<D1Database>,
    /// How many match in all.
    pub total: u64,
}

/// Usage to add for one database in one hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UsageDelta<'a> {
    /// The database.
    pub database_id: &'a str,
    /// Start of the hour, in seconds since the Unix epoch.
    pub hour: i64,
    /// Statements that only read.
    pub read_queries: u64,
    /// Statements that wrote.
    pub write_queries: u64,
    /// Rows read.
    pub rows_read: u64,
    /// Rows written.
    pub rows_written: u64,
}

/// Usage of one database in one hour.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Usage {
    /// The database.
    pub database_id: String,
    /// Start of the hour, in seconds since the Unix epoch.
    pub hour: i64,
    /// Statements that only read.
    pub read_queries: u64,
    /// Statements that wrote.
    pub write_queries: u64,
    /// Rows read.
    pub rows_read: u64,
    /// Rows written.
    pub rows_written: u64,
}

/// D1's name rule: a letter or digit, then letters, digits, `_` or `-`; kura caps it at 64.
pub fn is_valid_database_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 64
        && bytes[0].is_ascii_alphanumeric()
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-')
}

const COLUMNS: &str = "uuid, account_id, name, created_at, primary_location_hint, jurisdiction, read_replication";

fn database_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<D1Database> {
    Ok(D1Database {
        uuid: row.get(0)?,
        account_id: row.get(1)?,
        name: row.get(2)?,
        created_at: row.get(3)?,
        primary_location_hint: row.get(4)?,
        jurisdiction: row.get(5)?,
        read_replication: row.get(6)?,
    })
}

impl Catalog {
    /// Registers a new database under a fresh id.
    pub fn create_d1_database(&self, new: &NewD1Database<'_>) -> Result<D1Database> {
        if !is_valid_database_name(new.name) {
            return Err(Error::Invalid(format!(
                "invalid database name '{}': use 1 to 64 letters, digits, '_' or '-', starting with a letter or digit",
                new.name
            )));
        }
        let database = D1Database {
            uuid: new.uuid.map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_owned),
            account_id: new.account_id.to_owned(),
            name: new.name.to_owned(),
            created_at: now_iso(),
            primary_location_hint: new.primary_location_hint.map(str::to_owned),
            jurisdiction: new.jurisdiction.map(str::to_owned),
            read_replication: "disabled".to_owned(),
        };
        self.write_checked(|tx| {
            let storage = |e| self.storage(e);
            let count: u64 = tx
                .query_row("SELECT count(*) FROM d1_databases WHERE account_id = ?1", [new.account_id], |r| r.get(0))
                .map_err(storage)?;
            if count >= new.max_per_account {
                return Err(Error::LimitReached { what: "databases per account", limit: new.max_per_account });
            }
            let taken = tx
                .query_row(
                    "SELECT 1 FROM d1_databases WHERE account_id = ?1 AND name = ?2",
                    [new.account_id, new.name],
                    |_| Ok(()),
                )
                .optional()
                .map_err(storage)?;
            if taken.is_some() {
                return Err(Error::Duplicate { kind: "database" });
            }
            tx.execute(
                &format!("INSERT INTO d1_databases ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
                (
                    &database.uuid,
                    &database.account_id,
                    &database.name,
                    &database.created_at,
                    &database.primary_location_hint,
                    &database.jurisdiction,
                    &database.read_replication,
                ),
            )
            .map_err(storage)?;
            Ok(())
        })?;
        Ok(database)
    }

    /// The account's database with this id, or else with this name.
    pub fn d1_database(&self, account_id: &str, id_or_name: &str) -> Result<Option<D1Database>> {
        self.remembered(&self.d1_seen, format!("{account_id}\0{id_or_name}"), || {
            self.read_found(|c| {
                c.prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM d1_databases WHERE account_id = ?1 AND (uuid = lower(?2) OR name = ?2) \
                     ORDER BY uuid = lower(?2) DESC LIMIT 1"
                ))?
                .query_row([account_id, id_or_name], database_from_row)
                .optional()
            })
        })
    }

    /// The database with this id, whatever its account.
    pub fn d1_database_by_uuid(&self, uuid: &str) -> Result<Option<D1Database>> {
        self.read_found(|c| {
            c.prepare_cached(&format!("SELECT {COLUMNS} FROM d1_databases WHERE uuid = ?1"))?
                .query_row([uuid], database_from_row)
                .optional()
        })
    }

    /// One page (1-based) of the account's databases, oldest first; `name` filters by a
    /// case-insensitive substring.
    pub fn list_d1_databases(
        &self,
        account_id: &str,
        name: Option<&str>,
        page: u64,
        per_page: u64,
    ) -> Result<D1DatabaseList> {
        let filter = name.unwrap_or("");
        let offset = page.saturating_sub(1).saturating_mul(per_page);
        self.read_current(|c| {
            let total: u64 = c
                .prepare_cached(
                    "SELECT count(*) FROM d1_databases WHERE account_id = ?1 AND instr(lower(name), lower(?2)) > 0",
                )?
                .query_row((account_id, filter), |r| r.get(0))?;
            let databases = c
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM d1_databases WHERE account_id = ?1 AND instr(lower(name), lower(?2)) > 0 \
                     ORDER BY created_at, rowid LIMIT ?3 OFFSET ?4"
                ))?
                .query_map(
                    (account_id, filter, per_page as i64, offset.min(i64::MAX as u64) as i64),
                    database_from_row,
                )?
                .collect::<rusqlite::Result<_>>()?;
            Ok(D1DatabaseList { databases, total })
        })
    }

    /// Every database id, for sweeping directories that no longer belong to a database.
    pub fn d1_database_ids(&self) -> Result<Vec<String>> {
        self.read(|c| c.prepare_cached("SELECT uuid FROM d1_databases")?.query_map([], |r| r.get(0))?.collect())
    }

    /// Removes the account's database from the registry; false if there was none.
    pub fn delete_d1_database(&self, account_id: &str, uuid: &str) -> Result<bool> {
        let removed = self.write(|tx| {
            tx.execute("DELETE FROM d1_usage WHERE database_id = ?1", [uuid])?;
            tx.execute("DELETE FROM d1_databases WHERE account_id = ?1 AND uuid = ?2", [account_id, uuid])
        })?;
        Ok(removed == 1)
    }

    /// Sets the read replication mode; false if the account has no such database.
    pub fn set_d1_read_replication(&self, account_id: &str, uuid: &str, mode: &str) -> Result<bool> {
        if mode != "auto" && mode != "disabled" {
            return Err(Error::Invalid(format!("read_replication.mode must be 'auto' or 'disabled', not '{mode}'")));
        }
        let changed = self.write(|tx| {
            tx.execute(
                "UPDATE d1_databases SET read_replication = ?3 WHERE account_id = ?1 AND uuid = ?2",
                [account_id, uuid, mode],
            )
        })?;
        Ok(changed == 1)
    }

    /// Adds usage counters.
    pub fn add_d1_usage(&self, deltas: &[UsageDelta<'_>]) -> Result<()> {
        if deltas.is_empty() {
            return Ok(());
        }
        self.write(|tx| {
            let mut upsert = tx.prepare_cached(
                "INSERT INTO d1_usage (database_id, hour, read_queries, write_queries, rows_read, rows_written) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
                 ON CONFLICT (database_id, hour) DO UPDATE SET \
                 read_queries = read_queries + excluded.read_queries, write_queries = write_queries + excluded.write_queries, \
                 rows_read = rows_read + excluded.rows_read, rows_written = rows_written + excluded.rows_written",
            )?;
            for d in deltas {
                upsert.execute((
                    d.database_id,
                    d.hour,
                    d.read_queries as i64,
                    d.write_queries as i64,
                    d.rows_read as i64,
                    d.rows_written as i64,
                ))?;
            }
            Ok(())
        })
    }

    /// Usage of one database in the hours from `from_hour` to `to_hour` inclusive, oldest first.
    pub fn d1_usage(&self, database_id: &str, from_hour: i64, to_hour: i64) -> Result<Vec<Usage>> {
        self.read(|c| {
            c.prepare_cached(
                "SELECT database_id, hour, read_queries, write_queries, rows_read, rows_written FROM d1_usage \
                 WHERE database_id = ?1 AND hour BETWEEN ?2 AND ?3 ORDER BY hour",
            )?
            .query_map((database_id, from_hour, to_hour), |r| {
                Ok(Usage {
                    database_id: r.get(0)?,
                    hour: r.get(1)?,
                    read_queries: r.get::<_, i64>(2)? as u64,
                    write_queries: r.get::<_, i64>(3)? as u64,
                    rows_read: r.get::<_, i64>(4)? as u64,
                    rows_written: r.get::<_, i64>(5)? as u64,
                })
            })?
            .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_d1s_pattern() {
        assert!(is_valid_database_name("prod-db_2"));
        assert!(is_valid_database_name("9lives"));
        assert!(!is_valid_database_name("-leading"));
        assert!(!is_valid_database_name("has space"));
        assert!(!is_valid_database_name(""));
        assert!(!is_valid_database_name(&"a".repeat(65)));
    }
}
