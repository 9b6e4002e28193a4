//! A namespace's index, `meta.sqlite` beside its objects: every object ever created (with its
//! name, so objects can be listed by name) and the alarm schedule; in a cluster, also the
//! alarms of objects workerd runs as last captured (`workerd_alarms`, in workerd's
//! nanoseconds), which the node taking the namespace over hands its workerd. The objects' own files are
//! authoritative for their alarms; the schedule may only run early, never late (see
//! [`crate::alarm`]).

use rusqlite::{Connection, OptionalExtension};

use crate::error::DoError;

pub(crate) const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS objects (
        id         TEXT PRIMARY KEY,
        name       TEXT,
        created_ms INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS alarms (
        id           TEXT PRIMARY KEY,
        name         TEXT,
        scheduled_ms INTEGER NOT NULL,
        retries      INTEGER NOT NULL DEFAULT 0
    ) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS alarms_by_time ON alarms (scheduled_ms);
    CREATE TABLE IF NOT EXISTS workerd_alarms (
        id           TEXT PRIMARY KEY,
        scheduled_ns INTEGER NOT NULL
    ) WITHOUT ROWID;
";

/// An object as the index knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectEntry {
    /// The id, 64 hex digits.
    pub id: String,
    /// The name it was first reached by, if it was reached by name.
    pub name: Option<String>,
    /// When it was first used, Unix milliseconds.
    pub created_ms: i64,
}

/// An alarm the schedule says is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueAlarm {
    /// The object's id.
    pub id: String,
    /// The object's name, if known.
    pub name: Option<String>,
    /// When the schedule says it runs, Unix milliseconds.
    pub scheduled_ms: i64,
    /// Failed attempts so far.
    pub retries: u32,
}

pub(crate) fn storage(e: rusqlite::Error) -> DoError {
    match kura_sqlite::is_disk_full(&e) {
        true => DoError::storage(e),
        false => DoError::Storage(format!("namespace index: {e}")),
    }
}

pub(crate) fn register(c: &Connection, id: &str, name: Option<&str>, now_ms: i64) -> rusqlite::Result<()> {
    c.prepare_cached(
        "INSERT INTO objects (id, name, created_ms) VALUES (?1, ?2, ?3) \
         ON CONFLICT (id) DO UPDATE SET name = coalesce(objects.name, excluded.name)",
    )?
    .execute((id, name, now_ms))?;
    Ok(())
}

pub(crate) fn list(c: &Connection, after: &str, limit: u64) -> rusqlite::Result<Vec<ObjectEntry>> {
    c.prepare_cached("SELECT id, name, created_ms FROM objects WHERE id > ?1 ORDER BY id LIMIT ?2")?
        .query_map((after, limit.min(i64::MAX as u64) as i64), |r| {
            Ok(ObjectEntry { id: r.get(0)?, name: r.get(1)?, created_ms: r.get(2)? })
        })?
        .collect()
}

pub(crate) fn find(c: &Connection, id: &str) -> rusqlite::Result<Option<ObjectEntry>> {
    c.prepare_cached("SELECT id, name, created_ms FROM objects WHERE id = ?1")?
        .query_row([id], |r| Ok(ObjectEntry { id: r.get(0)?, name: r.get(1)?, created_ms: r.get(2)? }))
        .optional()
}

pub(crate) fn count(c: &Connection) -> rusqlite::Result<u64> {
    c.prepare_cached("SELECT count(*) FROM objects")?.query_row([], |r| r.get::<_, i64>(0)).map(|n| n.max(0) as u64)
}

/// Makes the schedule run no later than `at` (a new alarm, before it commits).
pub(crate) fn schedule_no_later(c: &Connection, id: &str, name: Option<&str>, at: i64) -> rusqlite::Result<()> {
    c.prepare_cached(
        "INSERT INTO alarms (id, name, scheduled_ms, retries) VALUES (?1, ?2, ?3, 0) \
         ON CONFLICT (id) DO UPDATE SET scheduled_ms = min(alarms.scheduled_ms, excluded.scheduled_ms), \
         name = coalesce(alarms.name, excluded.name)",
    )?
    .execute((id, name, at))?;
    Ok(())
}

/// Sets the schedule to exactly `at` with `retries`, or removes it.
pub(crate) fn schedule(
    c: &Connection,
    id: &str,
    name: Option<&str>,
    at: Option<i64>,
    retries: u32,
) -> rusqlite::Result<()> {
    match at {
        Some(at) => c
            .prepare_cached(
                "INSERT INTO alarms (id, name, scheduled_ms, retries) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (id) DO UPDATE SET scheduled_ms = excluded.scheduled_ms, retries = excluded.retries, \
                 name = coalesce(alarms.name, excluded.name)",
            )?
            .execute((id, name, at, retries))?,
        None => c.prepare_cached("DELETE FROM alarms WHERE id = ?1")?.execute([id])?,
    };
    Ok(())
}

pub(crate) fn due(c: &Connection, now_ms: i64, limit: u64) -> rusqlite::Result<Vec<DueAlarm>> {
    c.prepare_cached(
        "SELECT id, name, scheduled_ms, retries FROM alarms WHERE scheduled_ms <= ?1 ORDER BY scheduled_ms LIMIT ?2",
    )?
    .query_map((now_ms, limit as i64), |r| {
        Ok(DueAlarm { id: r.get(0)?, name: r.get(1)?, scheduled_ms: r.get(2)?, retries: r.get(3)? })
    })?
    .collect()
}

pub(crate) fn next(c: &Connection) -> rusqlite::Result<Option<i64>> {
    c.prepare_cached("SELECT min(scheduled_ms) FROM alarms")?.query_row([], |r| r.get(0))
}

/// Records a workerd-run object's alarm as captured (`None`: it has none).
pub(crate) fn set_workerd_alarm(c: &Connection, id: &str, scheduled_ns: Option<i64>) -> rusqlite::Result<()> {
    match scheduled_ns {
        Some(at) => c
            .prepare_cached(
                "INSERT INTO workerd_alarms (id, scheduled_ns) VALUES (?1, ?2) \
                 ON CONFLICT (id) DO UPDATE SET scheduled_ns = excluded.scheduled_ns",
            )?
            .execute((id, at))?,
        None => c.prepare_cached("DELETE FROM workerd_alarms WHERE id = ?1")?.execute([id])?,
    };
    Ok(())
}

/// Every workerd-run object's alarm the index holds: (object id, nanoseconds).
pub(crate) fn workerd_alarms(c: &Connection) -> rusqlite::Result<Vec<(String, i64)>> {
    c.prepare_cached("SELECT id, scheduled_ns FROM workerd_alarms ORDER BY id")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect()
}
