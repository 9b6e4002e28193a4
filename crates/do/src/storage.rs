//! One object's storage as its code sees it during a request: SQL with Durable Objects' rules,
//! the KV API kept in `_cf_KV` as workerd keeps it, the alarm in `_cf_METADATA`, nested
//! `transaction_sync` savepoints and `delete_all`. Everything runs inside the request's open
//! transaction, on the object's actor thread; the owner commits or rolls back at the end.

use kura_sqlite::{Access, Database, Request, ResultMode, Statement, StatementResult, Value};
use rusqlite::OptionalExtension;

use crate::error::{DoError, Result};

/// Most keys one KV batch may name (Durable Objects' documented limit).
pub const MAX_KV_BATCH: usize = 128;
/// Largest KV key plus value, in bytes (the documented limit of SQLite-backed objects).
pub const MAX_KV_ENTRY_BYTES: usize = 2 * 1024 * 1024;

const KV_TABLE: &str = "CREATE TABLE IF NOT EXISTS _cf_KV (key TEXT PRIMARY KEY, value BLOB) WITHOUT ROWID";
const METADATA_TABLE: &str = "CREATE TABLE IF NOT EXISTS _cf_METADATA (key INTEGER PRIMARY KEY, value BLOB)";
/// `_cf_METADATA` key of the alarm time, in nanoseconds since the Unix epoch (as workerd).
const ALARM_KEY: i64 = 1;

/// What a request's commit must first settle with the object's namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommitNotice {
    /// The alarm changed.
    pub alarm: Option<AlarmChange>,
    /// The object stores something for the first time (since it was last listed): it joins
    /// the namespace's index.
    pub first_write: bool,
}

/// The result of one `exec`: the last statement's columns and rows, and its counters.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Cursor {
    /// Column names, duplicates kept.
    pub columns: Vec<String>,
    /// Rows, one value per column.
    pub rows: Vec<Vec<Value>>,
    /// Rows read by every statement of the text.
    pub rows_read: u64,
    /// Rows written by every statement of the text.
    pub rows_written: u64,
}

impl From<StatementResult> for Cursor {
    fn from(r: StatementResult) -> Self {
        Cursor { columns: r.columns, rows: r.rows, rows_read: r.meta.rows_read, rows_written: r.meta.rows_written }
    }
}

/// Which KV entries `list` returns (`compileListOptions` in workerd).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListOptions {
    /// First key, inclusive.
    pub start: Option<String>,
    /// First key, exclusive (not with `start`).
    pub start_after: Option<String>,
    /// Last key, exclusive.
    pub end: Option<String>,
    /// Only keys with this prefix.
    pub prefix: Option<String>,
    /// Descending order.
    pub reverse: bool,
    /// Most entries; must be positive.
    pub limit: Option<u64>,
}

/// How the alarm changed during a request: what it was when first looked at, and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlarmChange {
    /// Before, in Unix milliseconds.
    pub before: Option<i64>,
    /// After.
    pub after: Option<i64>,
}

/// An object's storage for the length of one request. See the module docs.
pub struct Storage<'a> {
    db: &'a mut Database,
    depth: u32,
    alarm_before: Option<Option<i64>>,
    alarm_now: Option<i64>,
    kv_ready: bool,
    /// Whether a PRAGMA may have changed the connection, which must then be reset.
    pub(crate) used_pragma: bool,
}

impl<'a> Storage<'a> {
    /// The storage of an object whose request transaction is open on `db`.
    pub fn new(db: &'a mut Database) -> Self {
        Storage { db, depth: 0, alarm_before: None, alarm_now: None, kv_ready: false, used_pragma: false }
    }

    /// The connection underneath, for ending the request.
    pub(crate) fn database(&mut self) -> &mut Database {
        self.db
    }

    /// Runs SQL under Durable Objects' rules: several statements may be given, only the last
    /// may take parameters, and the result is the last statement's.
    pub fn exec(&mut self, sql: &str, params: Vec<Value>) -> Result<Cursor> {
        self.exec_with(sql, params, Access::ReadWrite)
    }

    /// Runs SQL that must not write.
    pub fn exec_read_only(&mut self, sql: &str, params: Vec<Value>) -> Result<Cursor> {
        self.exec_with(sql, params, Access::ReadOnly)
    }

    fn exec_with(&mut self, sql: &str, params: Vec<Value>, access: Access) -> Result<Cursor> {
        self.used_pragma |= sql.as_bytes().windows(6).any(|w| w.eq_ignore_ascii_case(b"pragma"));
        let request =
            Request { statements: vec![Statement::with_params(sql, params)], mode: ResultMode::Cursor, access };
        let mut results = self.db.execute(&request).map_err(DoError::from_sql)?;
        self.check_transaction()?;
        Ok(results.pop().map(Cursor::from).unwrap_or_default())
    }

    /// The bookmark of the last committed state (this request's writes are not in it yet).
    pub fn bookmark(&self) -> Result<kura_sqlite::Bookmark> {
        self.db.bookmark().map_err(DoError::from_sql)
    }

    /// The bookmark of the last commit at or before `time_ms` (Unix milliseconds, within 30
    /// days).
    pub fn bookmark_for_time(&mut self, time_ms: i64) -> Result<kura_sqlite::Bookmark> {
        self.db.bookmark_for_time(time_ms).map_err(DoError::from_sql)
    }

    /// The object's database file.
    pub(crate) fn path(&self) -> &std::path::Path {
        self.db.path()
    }

    /// Bytes in use, free pages excluded (`databaseSize`).
    pub fn database_size(&mut self) -> Result<u64> {
        self.db.size().map_err(DoError::from_sql)
    }

    /// SQLite rolls a transaction back by itself on a few errors; the request cannot go on then.
    fn check_transaction(&self) -> Result<()> {
        if self.db.in_transaction() {
            Ok(())
        } else {
            Err(DoError::Reset("Cannot commit transaction due to an earlier SQL critical error".into()))
        }
    }

    fn internal<T>(&mut self, f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T>) -> Result<T> {
        let out = self.db.with_internal(f).map_err(DoError::internal)?;
        self.check_transaction()?;
        Ok(out)
    }

    fn kv_table(&mut self) -> Result<()> {
        if !self.kv_ready {
            self.internal(|c| c.prepare_cached(KV_TABLE)?.execute([]))?;
            self.kv_ready = true;
        }
        Ok(())
    }

    fn kv_table_exists(&mut self) -> Result<bool> {
        if self.kv_ready {
            return Ok(true);
        }
        self.internal(|c| c.prepare_cached("SELECT 1 FROM sqlite_schema WHERE name = '_cf_KV'")?.exists([]))
    }

    /// The value of `key`.
    pub fn kv_get(&mut self, key: &str) -> Result<Option<Vec<u8>>> {
        if !self.kv_table_exists()? {
            return Ok(None);
        }
        self.internal(|c| {
            c.prepare_cached("SELECT value FROM _cf_KV WHERE key = ?1")?.query_row([key], |r| r.get(0)).optional()
        })
    }

    /// The values of those of `keys` that exist, in key order.
    pub fn kv_get_many(&mut self, keys: &[String]) -> Result<Vec<(String, Vec<u8>)>> {
        check_batch(keys.len())?;
        let mut found = Vec::new();
        for key in keys {
            if let Some(value) = self.kv_get(key)? {
                found.push((key.clone(), value));
            }
        }
        found.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        found.dedup_by(|a, b| a.0 == b.0);
        Ok(found)
    }

    /// Stores `value` under `key`.
    pub fn kv_put(&mut self, key: &str, value: &[u8]) -> Result<()> {
        check_entry(key, value)?;
        self.kv_table()?;
        self.internal(|c| {
            c.prepare_cached("INSERT INTO _cf_KV VALUES (?1, ?2) ON CONFLICT DO UPDATE SET value = excluded.value")?
                .execute((key, value))
        })?;
        Ok(())
    }

    /// Stores every entry, all or none.
    pub fn kv_put_many(&mut self, entries: &[(String, Vec<u8>)]) -> Result<()> {
        check_batch(entries.len())?;
        for (key, value) in entries {
            check_entry(key, value)?;
        }
        self.transaction_sync(|s| entries.iter().try_for_each(|(k, v)| s.kv_put(k, v)))
    }

    /// Deletes `key`; whether it existed.
    pub fn kv_delete(&mut self, key: &str) -> Result<bool> {
        if !self.kv_table_exists()? {
            return Ok(false);
        }
        let n = self.internal(|c| c.prepare_cached("DELETE FROM _cf_KV WHERE key = ?1")?.execute([key]))?;
        Ok(n > 0)
    }

    /// Deletes every key given; how many existed.
    pub fn kv_delete_many(&mut self, keys: &[String]) -> Result<u64> {
        check_batch(keys.len())?;
        let mut deleted = 0;
        for key in keys {
            deleted += u64::from(self.kv_delete(key)?);
        }
        Ok(deleted)
    }

    /// Entries in key order (bytewise UTF-8), as `list()` selects them.
    pub fn kv_list(&mut self, options: &ListOptions) -> Result<Vec<(String, Vec<u8>)>> {
        let Some((start, end)) = compile_range(options)? else { return Ok(Vec::new()) };
        if !self.kv_table_exists()? {
            return Ok(Vec::new());
        }
        let mut sql = String::from("SELECT key, value FROM _cf_KV WHERE key >= ?1");
        if end.is_some() {
            sql.push_str(" AND key < ?2");
        }
        sql.push_str(if options.reverse { " ORDER BY key DESC" } else { " ORDER BY key" });
        sql.push_str(" LIMIT ?3");
        let limit = options.limit.map_or(-1, |l| l.min(i64::MAX as u64) as i64);
        self.internal(|c| {
            let mut statement = c.prepare_cached(&sql)?;
            let end = end.unwrap_or_default();
            let rows = statement.query_map(rusqlite::params![start, end, limit], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect()
        })
    }

    /// The alarm, in Unix milliseconds.
    pub fn get_alarm(&mut self) -> Result<Option<i64>> {
        if self.alarm_before.is_some() {
            return Ok(self.alarm_now);
        }
        let stored = self.stored_alarm()?;
        self.alarm_before = Some(stored);
        self.alarm_now = stored;
        Ok(stored)
    }

    fn stored_alarm(&mut self) -> Result<Option<i64>> {
        let exists =
            self.internal(|c| c.prepare_cached("SELECT 1 FROM sqlite_schema WHERE name = '_cf_METADATA'")?.exists([]))?;
        if !exists {
            return Ok(None);
        }
        let nanos: Option<Option<i64>> = self.internal(|c| {
            c.prepare_cached("SELECT value FROM _cf_METADATA WHERE key = ?1")?
                .query_row([ALARM_KEY], |r| r.get(0))
                .optional()
        })?;
        Ok(nanos.flatten().map(|n| n.div_euclid(1_000_000)))
    }

    /// Sets the alarm to `time_ms` (Unix milliseconds); times in the past mean "now".
    pub fn set_alarm(&mut self, time_ms: i64) -> Result<()> {
        if time_ms <= 0 {
            return Err(DoError::Invalid("setAlarm() cannot be called with an alarm time <= 0".into()));
        }
        let time_ms = time_ms.max(now_ms());
        self.get_alarm()?;
        self.internal(|c| {
            c.prepare_cached(METADATA_TABLE)?.execute([])?;
            c.prepare_cached(
                "INSERT INTO _cf_METADATA VALUES (?1, ?2) ON CONFLICT DO UPDATE SET value = excluded.value",
            )?
            .execute([ALARM_KEY, time_ms.saturating_mul(1_000_000)])
        })?;
        self.alarm_now = Some(time_ms);
        Ok(())
    }

    /// Removes the alarm.
    pub fn delete_alarm(&mut self) -> Result<()> {
        if self.get_alarm()?.is_some() {
            self.internal(|c| c.prepare_cached("DELETE FROM _cf_METADATA WHERE key = ?1")?.execute([ALARM_KEY]))?;
        }
        self.alarm_now = None;
        Ok(())
    }

    /// Before a commit: what the namespace must hear of first, if anything. A request that
    /// writes to an object not yet listed marks it listed (in the same transaction).
    pub(crate) fn prepare_commit(&mut self) -> Result<Option<CommitNotice>> {
        let first_write = self.db.writes_pending() && !self.listed()?;
        if first_write {
            self.internal(|c| c.execute_batch("PRAGMA user_version = 1"))?;
        }
        let alarm = self.alarm_change();
        Ok((first_write || alarm.is_some()).then_some(CommitNotice { alarm, first_write }))
    }

    /// Whether the object is in its namespace's index: kura marks it in the file header's
    /// `user_version`, which no statement of the object's may set (the authorizer refuses the
    /// pragma) and which `delete_all` keeps, as the index keeps the object. Read through the
    /// pragma, which SQLite prepares afresh each time (a microsecond or two a commit): the
    /// header page read through a statement kept prepared would be cheaper, but that statement
    /// costs every idle object 12 KiB of memory.
    fn listed(&mut self) -> Result<bool> {
        self.internal(|c| c.prepare_cached("PRAGMA user_version")?.query_row([], |r| r.get::<_, i64>(0)))
            .map(|v| v != 0)
    }

    /// How the alarm changed in this request, if it was touched and is different.
    pub fn alarm_change(&self) -> Option<AlarmChange> {
        let before = self.alarm_before?;
        (before != self.alarm_now).then_some(AlarmChange { before, after: self.alarm_now })
    }

    /// Runs `f` in a savepoint: what it did stays if it returns `Ok`, and is undone if it
    /// returns an error (which is returned). Nestable.
    pub fn transaction_sync<T, E>(
        &mut self,
        f: impl FnOnce(&mut Self) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E>
    where
        E: From<DoError>,
    {
        let name = format!("_cf_sync_savepoint_{}", self.depth);
        self.internal(|c| c.execute_batch(&format!("SAVEPOINT {name}")))?;
        let alarm = (self.alarm_before, self.alarm_now);
        self.depth += 1;
        let outcome = f(self);
        self.depth -= 1;
        match outcome {
            Ok(value) => {
                self.internal(|c| c.execute_batch(&format!("RELEASE {name}")))?;
                Ok(value)
            }
            Err(e) => {
                self.check_transaction()?;
                self.internal(|c| c.execute_batch(&format!("ROLLBACK TO {name}; RELEASE {name}")))?;
                // Tables created inside may be gone again.
                self.kv_ready = false;
                (self.alarm_before, self.alarm_now) = alarm;
                Err(e)
            }
        }
    }

    /// Deletes everything stored: every table, index, view and trigger, the KV entries and the
    /// alarm (as `deleteAll()` with a compatibility date from 2026-02-24 on). It is a write in
    /// the request's transaction like any other, so it is atomic and can be undone with a
    /// point-in-time restore.
    pub fn delete_all(&mut self) -> Result<()> {
        if self.depth > 0 {
            return Err(DoError::Invalid("Cannot call deleteAll() within a transaction".into()));
        }
        self.get_alarm()?;
        let objects: Vec<(String, String)> = self.internal(|c| {
            c.prepare(
                "SELECT type, name FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%' AND type IN ('table', 'view')",
            )?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect()
        })?;
        self.internal(|c| {
            // Foreign keys between the tables must not stop their dropping.
            c.execute_batch("PRAGMA defer_foreign_keys = ON")?;
            for (kind, name) in &objects {
                let quoted = name.replace('"', "\"\"");
                let kind = if kind == "view" { "VIEW" } else { "TABLE" };
                c.execute_batch(&format!("DROP {kind} IF EXISTS \"{quoted}\""))?;
            }
            let sequence: bool = c.prepare("SELECT 1 FROM sqlite_schema WHERE name = 'sqlite_sequence'")?.exists([])?;
            if sequence {
                c.execute_batch("DELETE FROM sqlite_sequence")?;
            }
            c.execute_batch("PRAGMA defer_foreign_keys = OFF")
        })?;
        self.kv_ready = false;
        self.alarm_now = None;
        Ok(())
    }
}

fn check_batch(n: usize) -> Result<()> {
    if n > MAX_KV_BATCH {
        return Err(DoError::Invalid(format!(
            "Maximum number of key value pairs is {MAX_KV_BATCH}. {n} pairs were provided."
        )));
    }
    Ok(())
}

fn check_entry(key: &str, value: &[u8]) -> Result<()> {
    let size = key.len() + value.len();
    if size > MAX_KV_ENTRY_BYTES {
        return Err(DoError::Invalid(format!(
            "Key and value combined cannot exceed {MAX_KV_ENTRY_BYTES} bytes. An entry of size {size} was provided."
        )));
    }
    Ok(())
}

/// The first key (inclusive) and the end (exclusive, `None`: no end) that `options` select, or
/// `None` when the range is empty.
fn compile_range(options: &ListOptions) -> Result<Option<(String, Option<String>)>> {
    if options.start.is_some() && options.start_after.is_some() {
        return Err(DoError::Invalid("list() cannot be called with both start and startAfter values.".into()));
    }
    if options.limit == Some(0) {
        return Err(DoError::Invalid("List limit must be positive.".into()));
    }
    let mut start = match (&options.start, &options.start_after) {
        (Some(s), _) => s.clone(),
        (None, Some(after)) => format!("{after}\0"),
        (None, None) => String::new(),
    };
    let mut end = options.end.clone();
    if let Some(prefix) = &options.prefix {
        if start.as_bytes() < prefix.as_bytes() {
            start = prefix.clone();
        }
        if let Some(successor) = successor(prefix)
            && end.as_ref().is_none_or(|e| e.as_bytes() > successor.as_bytes())
        {
            end = Some(successor);
        }
        if !start.starts_with(prefix.as_str()) {
            return Ok(None);
        }
    }
    if end.as_ref().is_some_and(|e| e.as_bytes() <= start.as_bytes()) {
        return Ok(None);
    }
    Ok(Some((start, end)))
}

/// The smallest string greater than every string with this prefix, if there is one: the
/// prefix with its last character incremented (trailing `char::MAX` dropped).
fn successor(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (last as u32 + 1..=char::MAX as u32).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_ranges_follow_workerd() {
        let range = |o: ListOptions| compile_range(&o).unwrap();
        assert_eq!(range(ListOptions::default()), Some((String::new(), None)));
        assert_eq!(
            range(ListOptions { start_after: Some("a".into()), ..Default::default() }),
            Some(("a\0".into(), None))
        );
        assert_eq!(
            range(ListOptions { prefix: Some("user:".into()), ..Default::default() }),
            Some(("user:".into(), Some("user;".into())))
        );
        assert_eq!(
            range(ListOptions { prefix: Some("b".into()), start: Some("c".into()), ..Default::default() }),
            None
        );
        assert_eq!(range(ListOptions { start: Some("b".into()), end: Some("a".into()), ..Default::default() }), None);
        assert!(
            compile_range(&ListOptions {
                start: Some("a".into()),
                start_after: Some("b".into()),
                ..Default::default()
            })
            .is_err()
        );
        assert!(compile_range(&ListOptions { limit: Some(0), ..Default::default() }).is_err());
    }
}
