//! One open database file: its read-write connection, configured for D1, and the executor that
//! runs a request's statements and computes D1's per-statement meta.

mod counters;
mod execute;
mod file_lock;
mod open;
mod time_travel;
mod transaction;

use counters::IndexColumns;
use execute::CachedStatement;
use file_lock::FileLock;
pub use open::{COMPACT_CACHE_KIB, DatabaseOptions, make_compact};
pub(crate) use time_travel::CAPTURE_DELAY;
pub(crate) use transaction::{Grouped, Inline};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use libsqlite3_sys as ffi;

use crate::error::{Error, Result};
use crate::history::History;
use crate::policy::Authorizer;
use crate::raw::{RawStatement, SqlText};

/// An open database: the connection that owns the file's writes, and D1's execution rules.
///
/// Not `Sync`: its actor holds it behind a lock, and lends it between commands to a caller that
/// only reads (see `actor::Lender`).
pub struct Database {
    /// Prepared statements by SQL text; declared before `conn` so they are finalized first.
    statements: HashMap<String, CachedStatement>,
    /// The statement that reads page 1 for `size_after`, prepared on first use.
    page_one: Option<RawStatement>,
    /// kura's own statements (BEGIN, COMMIT, savepoints) by their text, each prepared on first
    /// use: rusqlite's statement cache looked each up by hashing its text, twice a request.
    own: Vec<(&'static str, RawStatement)>,
    conn: rusqlite::Connection,
    /// Keeps other processes off the file; declared after `conn`, so it outlives the close
    /// (which may checkpoint). `None` for a read-only connection.
    file_lock: Option<FileLock>,
    authorizer: Authorizer,
    /// Nanoseconds after `epoch` at which the running request is interrupted; 0 = none.
    deadline: Arc<AtomicU64>,
    epoch: Instant,
    request_timeout: Duration,
    page_size: u64,
    /// Size after the last statement, so each statement measures once.
    size: Option<u64>,
    /// Indexes per table (lower-cased), for counting index writes; cleared on schema changes.
    indexes: HashMap<String, Vec<IndexColumns>>,
    /// Bytes of results the running request may still collect.
    result_budget: usize,
    max_result_bytes: usize,
    /// Set while a request is tried on its caller's thread: a statement that would write stops
    /// it before it runs (see [`Database::execute_read`]).
    reads_only: bool,
    poisoned: bool,
    /// The Time Travel history, if the database keeps one.
    history: Option<History>,
    /// Which commits the history holds and which it is owed, and whether it can grow.
    capture: Capture,
    options: DatabaseOptions,
    path: PathBuf,
}

/// A database's bookkeeping between its WAL and its history: commits the history holds, those
/// answered before their capture and owed to it, the last checkpoint, and whether the history
/// could grow.
pub(super) struct Capture {
    /// Since when the history could not be opened for lack of space (its log could not take
    /// what the WAL holds beyond it). The database is then served read-only (`query_only`):
    /// the WAL keeps every commit, and the next open, once there is room, captures them.
    pub(super) history_full_since: Option<Instant>,
    /// Bytes free on the history's filesystem when it last could not grow: more than that, and
    /// the next write tries it again at once rather than after [`HISTORY_RETRY_IN_PLACE`].
    pub(super) history_full_free: Option<u64>,
    /// What the WAL hook reported: frames after the last commit, and commits so far.
    pub(super) wal: Arc<WalProgress>,
    /// Commits (as the WAL hook counts them) the history holds: those after were answered
    /// before their capture and are owed to it ([`Database::capture_due`]).
    pub(super) captured_commits: u64,
    /// When each owed commit was answered, oldest first: the time its record will carry.
    pub(super) owed_times: Vec<i64>,
    /// When the oldest owed commit was answered, by the monotonic clock (for
    /// [`Database::capture_due`], which a step of the wall clock must not hurry or hold up).
    pub(super) oldest_owed: Option<Instant>,
    /// Commits (as the WAL hook counts them) when the WAL was last checkpointed: the hook's
    /// frame count is the WAL's only once a commit follows.
    pub(super) checkpointed_at_commits: u64,
}

/// What the WAL hook (registered with a history) reports after each commit of the connection.
#[derive(Debug, Default)]
pub(crate) struct WalProgress {
    /// Frames in the WAL after the last commit.
    frames: AtomicU32,
    /// Commits so far: one call of the hook each.
    commits: AtomicU64,
}

// SAFETY: the connection is opened with SQLITE_OPEN_NO_MUTEX ("multi-thread" mode), in which a
// connection and its statements may be used from any thread, one thread at a time. Its prepared
// statements (raw pointers, hence not `Send` alone) never leave the `Database`, so they move
// only together with their connection; the actor's lock makes their use one thread at a time.
unsafe impl Send for Database {}

impl Database {
    /// Sets the longest statement accepted, in bytes, and returns the previous limit. Imports
    /// raise it: a dump's INSERT of a 2 MB value is a statement of up to 4 MB.
    pub fn set_max_statement_bytes(&mut self, bytes: i32) -> i32 {
        self.conn.set_limit(rusqlite::limits::Limit::SQLITE_LIMIT_SQL_LENGTH, bytes).unwrap_or(bytes)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Forgets the size measured last: another connection (a replica's) may have changed it.
    pub(crate) fn forget_size(&mut self) {
        self.size = None;
    }

    /// The options it was opened with.
    pub(crate) fn options(&self) -> &DatabaseOptions {
        &self.options
    }

    /// Notes the history's size in the database's figures (at open and at each checkpoint).
    pub(crate) fn measure_history(&self) {
        if let (Some((_, figures)), Some(history)) = (&self.options.stats, &self.history) {
            figures.history_bytes.store(history.disk_bytes(), Ordering::Relaxed);
        }
    }

    fn handle(&self) -> *mut ffi::sqlite3 {
        // SAFETY: the handle stays valid while `self.conn` lives; it is used on this thread only.
        unsafe { self.conn.handle() }
    }

    /// Runs kura's own SQL on the connection, with the authorizer's rules off.
    pub fn with_internal<T>(&mut self, f: impl FnOnce(&rusqlite::Connection) -> T) -> T {
        let conn = &self.conn;
        self.authorizer.internal(|| f(conn))
    }

    fn internal_batch(&mut self, sql: &str) -> Result<()> {
        self.with_internal(|c| c.execute_batch(sql)).map_err(Error::internal)
    }

    /// Finalizes every statement kept prepared, before the connection closes.
    fn finalize_statements(&mut self) {
        self.statements.clear();
        self.page_one = None;
        self.own.clear();
    }

    /// Prepares one of kura's own statements (one statement, which the authorizer lets through).
    fn prepare_own(&self, sql: &'static str) -> Result<RawStatement> {
        let text = SqlText::new(sql)?;
        let db = self.handle();
        // SAFETY: the handle is open and used by this thread only.
        let prepared = self.authorizer.internal(|| unsafe { RawStatement::prepare(db, &text, 0) })?;
        prepared.statement.ok_or_else(|| Error::sql(ffi::SQLITE_INTERNAL, "an empty statement of kura's"))
    }

    /// Runs one of kura's own statements, kept prepared (BEGIN, COMMIT, savepoints).
    fn internal(&mut self, sql: &'static str) -> Result<()> {
        let at = match self.own.iter().position(|(text, _)| *text == sql) {
            Some(at) => at,
            None => {
                let statement = self.prepare_own(sql)?;
                self.own.push((sql, statement));
                self.own.len() - 1
            }
        };
        let (authorizer, statement) = (&self.authorizer, &mut self.own[at].1);
        let stepped = authorizer.internal(|| statement.step());
        statement.reset();
        stepped.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{Request, Statement};

    /// A database kura writes alone keeps its WAL index on the heap: no `-shm` file to create,
    /// extend, map and have written back, for one of many open at once as for a D1 database.
    #[test]
    fn an_exclusively_written_database_keeps_no_shared_memory_file() {
        for compact in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("db.sqlite");
            for _ in 0..2 {
                // Opened twice: once made, once found with its WAL.
                let mut db = Database::open(&DatabaseOptions::new(&path).create(true).compact(compact)).unwrap();
                let write = "CREATE TABLE IF NOT EXISTS t (x); INSERT INTO t VALUES (1)";
                db.execute(&Request::new(vec![Statement::new(write)])).unwrap();
                assert!(path.with_extension("sqlite-wal").exists(), "the database is in WAL mode");
                assert!(!path.with_extension("sqlite-shm").exists(), "compact {compact}: a -shm file was made");
            }
        }
    }
    /// A new file is made whole under another name and renamed into place, already in WAL
    /// mode (no rollback journal, one sync); what a crash left of an earlier attempt is
    /// removed first.
    #[test]
    fn a_new_database_is_made_in_wal_mode_and_a_half_made_one_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let building = dir.path().join("db.sqlite-new");
        std::fs::write(&building, b"what a crash left halfway").unwrap();
        let mut db = Database::open(&DatabaseOptions::new(&path).create(true)).unwrap();
        assert!(!building.exists(), "the half-made file is still there");
        let header = std::fs::read(&path).unwrap();
        assert_eq!((header.len(), header[18], header[19]), (4096, 2, 2), "one page, WAL mode from the start");
        db.execute(&Request::new(vec![Statement::new("CREATE TABLE t (x); INSERT INTO t VALUES (1)")])).unwrap();
        drop(db);
        let mut db = Database::open(&DatabaseOptions::new(&path)).unwrap();
        let rows = db.execute(&Request::new(vec![Statement::new("SELECT x FROM t")])).unwrap();
        assert_eq!(rows[0].rows, vec![vec![crate::request::Value::Integer(1)]]);
    }
    /// A WAL left without its database is not replayed onto a new one: the new file starts
    /// empty, as SQLite starts one beside an empty file.
    #[test]
    fn a_wal_left_without_its_database_is_not_replayed_onto_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let wal = dir.path().join("db.sqlite-wal");
        let old = rusqlite::Connection::open(&path).unwrap();
        old.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0; CREATE TABLE old (x); INSERT INTO old VALUES (1);",
        )
        .unwrap();
        let left = std::fs::read(&wal).unwrap();
        drop(old);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&wal, left).unwrap();
        let mut db = Database::open(&DatabaseOptions::new(&path).create(true)).unwrap();
        let tables = db.execute(&Request::new(vec![Statement::new("SELECT count(*) FROM sqlite_schema")])).unwrap();
        assert_eq!(tables[0].rows, vec![vec![crate::request::Value::Integer(0)]], "the old WAL was replayed");
    }

    /// A database that does not report its size (a Durable Object's) still counts its writes
    /// and answers its size when asked; one that does (D1's) reports it after every write.
    #[test]
    fn size_after_each_write_is_measured_only_where_it_is_reported() {
        for reports_size in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let options = DatabaseOptions::new(dir.path().join("db.sqlite")).create(true).reports_size(reports_size);
            let mut db = Database::open(&options).unwrap();
            let write = "CREATE TABLE t (x); INSERT INTO t VALUES (zeroblob(20000))";
            let results = db.execute(&Request::new(vec![Statement::new(write)])).unwrap();
            let insert = &results[1].meta;
            assert_eq!((insert.changes, insert.changed_db), (1, true), "reports_size {reports_size}");
            let size = db.size().unwrap();
            assert!(size > 20_000, "the database holds the blob: {size} bytes");
            let expected = if reports_size { size } else { 0 };
            assert_eq!(insert.size_after, expected, "reports_size {reports_size}");
            // Measured on request, the size is not carried into later writes' results.
            let again = db.execute(&Request::new(vec![Statement::new("INSERT INTO t VALUES (1)")])).unwrap();
            let expected = if reports_size { db.size().unwrap() } else { 0 };
            assert_eq!(again[0].meta.size_after, expected, "reports_size {reports_size}");
        }
    }
}
