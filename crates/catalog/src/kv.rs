//! The registry of Workers KV namespaces: which account owns which namespace, under which id
//! (also its storage id), and its title.

use rusqlite::OptionalExtension;

use crate::{Catalog, Error, Result, now_iso, random_hex};

/// Most namespaces an account may hold (Cloudflare's limit).
pub const MAX_KV_NAMESPACES: u64 = 1000;

/// Longest title, in characters.
pub const MAX_KV_TITLE_CHARS: usize = 512;

/// A KV namespace as the catalog records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvNamespace {
    /// 32 hex characters: the id the API and bindings name it by, and its storage's name.
    pub id: String,
    /// The owning account.
    pub account_id: String,
    /// The title, unique within the account.
    pub title: String,
    /// ISO 8601 creation time.
    pub created_at: String,
}

/// How a listing of namespaces is sorted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvOrder {
    /// By id.
    #[default]
    Id,
    /// By title.
    Title,
}

const COLUMNS: &str = "id, account_id, title, created_at";

fn namespace_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<KvNamespace> {
    Ok(KvNamespace { id: row.get(0)?, account_id: row.get(1)?, title: row.get(2)?, created_at: row.get(3)? })
}

fn check_title(title: &str) -> Result<()> {
    if title.trim().is_empty() {
        return Err(Error::Invalid("missing title".into()));
    }
    if title.chars().count() > MAX_KV_TITLE_CHARS {
        return Err(Error::Invalid(format!("a namespace title may hold at most {MAX_KV_TITLE_CHARS} characters")));
    }
    Ok(())
}

impl Catalog {
    /// Registers a new namespace for an account.
    pub fn create_kv_namespace(&self, account_id: &str, title: &str) -> Result<KvNamespace> {
        self.create_kv_namespace_with_id(account_id, &random_hex(16), title)
    }

    /// Registers a new namespace under a given id (32 hex characters): an import keeps the id
    /// a project's configuration already names.
    pub fn create_kv_namespace_with_id(&self, account_id: &str, id: &str, title: &str) -> Result<KvNamespace> {
        check_title(title)?;
        if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::Invalid(format!("'{id}' is not a KV namespace id (32 hex characters)")));
        }
        let namespace = KvNamespace {
            id: id.to_ascii_lowercase(),
            account_id: account_id.to_owned(),
            title: title.to_owned(),
            created_at: now_iso(),
        };
        self.write_checked(|tx| {
            let storage = |e| self.storage(e);
            let count: u64 = tx
                .query_row("SELECT count(*) FROM kv_namespaces WHERE account_id = ?1", [account_id], |r| r.get(0))
                .map_err(storage)?;
            if count >= MAX_KV_NAMESPACES {
                return Err(Error::LimitReached { what: "KV namespaces per account", limit: MAX_KV_NAMESPACES });
            }
            let taken = tx
                .query_row(
                    "SELECT 1 FROM kv_namespaces WHERE account_id = ?1 AND title = ?2",
                    [account_id, title],
                    |_| Ok(()),
                )
                .optional()
                .map_err(storage)?;
            if taken.is_some() {
                return Err(Error::Duplicate { kind: "KV namespace" });
            }
            let id_taken = tx
                .query_row("SELECT 1 FROM kv_namespaces WHERE id = ?1", [&namespace.id], |_| Ok(()))
                .optional()
                .map_err(storage)?;
            if id_taken.is_some() {
                return Err(Error::Conflict(format!("the KV namespace id {} is taken", namespace.id)));
            }
            tx.execute(
                &format!("INSERT INTO kv_namespaces ({COLUMNS}) VALUES (?1, ?2, ?3, ?4)"),
                (&namespace.id, &namespace.account_id, &namespace.title, &namespace.created_at),
            )
            .map_err(storage)?;
            Ok(())
        })?;
        Ok(namespace)
    }

    /// The account's namespace with this id.
    pub fn kv_namespace(&self, account_id: &str, id: &str) -> Result<Option<KvNamespace>> {
        self.remembered(&self.kv_seen, format!("{account_id}\0{id}"), || {
            self.read_found(|c| {
                c.prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM kv_namespaces WHERE account_id = ?1 AND id = lower(?2)"
                ))?
                .query_row([account_id, id], namespace_from_row)
                .optional()
            })
        })
    }

    /// The account's namespaces, sorted, one page (`page` from 1) and the total count.
    pub fn list_kv_namespaces(
        &self,
        account_id: &str,
        order: KvOrder,
        descending: bool,
        page: u64,
        per_page: u64,
    ) -> Result<(Vec<KvNamespace>, u64)> {
        let column = match order {
            KvOrder::Id => "id",
            KvOrder::Title => "title",
        };
        let direction = if descending { "DESC" } else { "ASC" };
        let offset = page.saturating_sub(1).saturating_mul(per_page);
        self.read_current(|c| {
            let total: u64 =
                c.query_row("SELECT count(*) FROM kv_namespaces WHERE account_id = ?1", [account_id], |r| r.get(0))?;
            let found = c
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM kv_namespaces WHERE account_id = ?1 ORDER BY {column} {direction}, id \
                     LIMIT ?2 OFFSET ?3"
                ))?
                .query_map(
                    (account_id, per_page.min(i64::MAX as u64) as i64, offset.min(i64::MAX as u64) as i64),
                    namespace_from_row,
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok((found, total))
        })
    }

    /// Every namespace of every account (for sweeps).
    pub fn all_kv_namespaces(&self) -> Result<Vec<KvNamespace>> {
        self.read(|c| {
            c.prepare_cached(&format!("SELECT {COLUMNS} FROM kv_namespaces ORDER BY id"))?
                .query_map([], namespace_from_row)?
                .collect()
        })
    }

    /// Renames a namespace; `None` if the account has no such namespace.
    pub fn rename_kv_namespace(&self, account_id: &str, id: &str, title: &str) -> Result<Option<KvNamespace>> {
        check_title(title)?;
        let changed = self.write_checked(|tx| {
            let storage = |e| self.storage(e);
            let other = tx
                .query_row(
                    "SELECT id FROM kv_namespaces WHERE account_id = ?1 AND title = ?2",
                    [account_id, title],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .map_err(storage)?;
            if other.is_some_and(|other| other != id.to_ascii_lowercase()) {
                return Err(Error::Duplicate { kind: "KV namespace" });
            }
            tx.execute(
                "UPDATE kv_namespaces SET title = ?3 WHERE account_id = ?1 AND id = lower(?2)",
                (account_id, id, title),
            )
            .map_err(storage)
        })?;
        if changed == 0 {
            return Ok(None);
        }
        self.kv_namespace(account_id, id)
    }

    /// Forgets a namespace; false if the account had no such namespace.
    pub fn delete_kv_namespace(&self, account_id: &str, id: &str) -> Result<bool> {
        let changed = self.write(|tx| {
            tx.execute("DELETE FROM kv_namespaces WHERE account_id = ?1 AND id = lower(?2)", [account_id, id])
        })?;
        Ok(changed == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_created_listed_renamed_and_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path().join("catalog.sqlite")).unwrap();
        let account = catalog.create_account(None, "me").unwrap();
        let b = catalog.create_kv_namespace(&account.id, "b").unwrap();
        let a = catalog.create_kv_namespace(&account.id, "a").unwrap();
        assert!(matches!(catalog.create_kv_namespace(&account.id, "a"), Err(Error::Duplicate { .. })));
        assert!(matches!(catalog.create_kv_namespace(&account.id, " "), Err(Error::Invalid(_))));
        let (page, total) = catalog.list_kv_namespaces(&account.id, KvOrder::Title, false, 1, 1).unwrap();
        assert_eq!((page[0].title.as_str(), total), ("a", 2));
        let (page, _) = catalog.list_kv_namespaces(&account.id, KvOrder::Title, false, 2, 1).unwrap();
        assert_eq!(page[0].title, "b");
        let (page, _) = catalog.list_kv_namespaces(&account.id, KvOrder::Title, false, 3, 1).unwrap();
        assert!(page.is_empty());
        assert!(matches!(catalog.rename_kv_namespace(&account.id, &b.id, "a"), Err(Error::Duplicate { .. })));
        assert_eq!(catalog.rename_kv_namespace(&account.id, &b.id, "c").unwrap().unwrap().title, "c");
        assert_eq!(catalog.kv_namespace(&account.id, &a.id.to_uppercase()).unwrap().unwrap().title, "a");
        assert!(catalog.kv_namespace("other", &a.id).unwrap().is_none());
        assert!(catalog.delete_kv_namespace(&account.id, &a.id).unwrap());
        assert!(!catalog.delete_kv_namespace(&account.id, &a.id).unwrap());
    }
}
