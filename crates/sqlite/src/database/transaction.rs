//! Transactions on a database: the group commit's savepoints and what becomes of a request run
//! in one, a request alone in its own transaction, and the connection state a request may leave.

use libsqlite3_sys as ffi;

use super::Database;
use crate::error::{Error, Result};
use crate::request::{Request, StatementResult};

/// What became of a request run inside a group's transaction.
pub(crate) enum Grouped {
    /// It succeeded; its changes wait in the open transaction for the group's COMMIT.
    Done(Vec<StatementResult>),
    /// It failed; its changes are undone and the transaction is still usable.
    Failed(Error),
    /// It must run in a transaction of its own; nothing of it remains.
    RunAlone,
    /// The transaction is gone (SQLite rolled it back, or a savepoint could not be released
    /// or rolled back), and with it the group's earlier requests. With an error, the request
    /// itself failed; without, it may simply be run again.
    Lost(Option<Error>),
}

/// What became of a request tried on its caller's thread ([`Database::execute_read`]).
pub(crate) enum Inline {
    /// It only read, and finished within its budget.
    Done(Vec<StatementResult>),
    /// It failed as it would have in a group (a SQL error, a read-only caller's write).
    Failed(Error),
    /// It must go elsewhere: it would write or may change the connection's state (a PRAGMA).
    /// Nothing of it remains.
    Declined,
    /// It ran past its budget and was interrupted; nothing of it remains.
    TooLong,
}

const SAVEPOINT: &str = "SAVEPOINT _cf_kura_request";
const RELEASE: &str = "RELEASE _cf_kura_request";
const ROLLBACK_TO: &str = "ROLLBACK TO _cf_kura_request";

impl Database {
    /// Whether a transaction is open (SQLite may roll one back by itself on some errors).
    pub fn in_transaction(&self) -> bool {
        unsafe { ffi::sqlite3_get_autocommit(self.handle()) == 0 }
    }

    /// Whether the open transaction has written anything (SQLite holds its write lock).
    pub fn writes_pending(&self) -> bool {
        // SAFETY: the handle is open; "main" is a valid NUL-terminated schema name.
        unsafe { ffi::sqlite3_txn_state(self.handle(), c"main".as_ptr()) == ffi::SQLITE_TXN_WRITE }
    }

    /// Opens a transaction for a group of requests.
    pub fn begin(&mut self) -> Result<()> {
        self.retry_full_history();
        self.internal("BEGIN")
    }

    /// Commits the open transaction; on failure it is rolled back and the error returned. A
    /// capture or checkpoint the commit makes due is done before this returns.
    pub fn commit(&mut self) -> Result<()> {
        self.commit_answered_first()?;
        self.settle_if_due();
        Ok(())
    }

    /// Commits as [`Database::commit`] does, but leaves a capture or checkpoint the commit
    /// makes due to [`Database::settle_if_due`], for the caller to run once its answer is out
    /// (the actor does after each round of its commands).
    pub fn commit_answered_first(&mut self) -> Result<()> {
        let started = std::time::Instant::now();
        let committed = self.commit_and_capture();
        if let Some((stats, figures)) = &self.options.stats {
            match &committed {
                Ok(()) => stats.committed(figures, started.elapsed()),
                Err(_) => {
                    stats.failed_commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        committed
    }

    /// [`Database::commit`]'s work: COMMIT, then the history's capture and shipment.
    fn commit_and_capture(&mut self) -> Result<()> {
        let result = self.internal("COMMIT");
        match &result {
            Ok(()) => return self.after_commit(),
            Err(e) => {
                if matches!(e.sqlite_code(), Some(ffi::SQLITE_IOERR | ffi::SQLITE_CORRUPT | ffi::SQLITE_NOTADB)) {
                    self.poisoned = true;
                }
                self.rollback();
            }
        }
        result
    }

    /// Rolls back the open transaction, if any.
    pub fn rollback(&mut self) {
        if self.in_transaction()
            && let Err(e) = self.internal("ROLLBACK")
        {
            tracing::warn!(path = %self.path.display(), error = %e, "rollback failed");
        }
        self.size = None;
    }

    /// Runs a request inside the open transaction, in a savepoint of its own, and says what
    /// became of it (see [`Grouped`]).
    pub(crate) fn execute_in_savepoint(&mut self, request: &Request) -> Grouped {
        if self.internal(SAVEPOINT).is_err() {
            self.rollback();
            return Grouped::Lost(None);
        }
        match self.execute(request) {
            Ok(_) if !self.in_transaction() => {
                self.rollback();
                Grouped::Lost(None)
            }
            // Deferred constraints are checked only at COMMIT, which this request would share
            // with others: undo it here and run it in a transaction of its own.
            Ok(_) if self.has_unresolved_foreign_keys() => {
                if self.undo_savepoint() {
                    Grouped::RunAlone
                } else {
                    Grouped::Lost(None)
                }
            }
            Ok(results) => match self.internal(RELEASE) {
                Ok(()) => Grouped::Done(results),
                Err(_) => {
                    self.rollback();
                    Grouped::Lost(None)
                }
            },
            Err(e) if !self.in_transaction() => {
                self.size = None;
                Grouped::Lost(Some(e))
            }
            Err(e) => {
                if self.undo_savepoint() {
                    Grouped::Failed(e)
                } else {
                    Grouped::Lost(Some(e))
                }
            }
        }
    }

    /// Runs kura's own work (`f`, with the authorizer off) inside the open transaction, in a
    /// savepoint of its own: `Ok(true)` if it succeeded and waits for the group's COMMIT,
    /// `Ok(false)` if it failed and was undone alone, `Err(())` if the transaction was lost with
    /// it (the group must be replayed).
    pub(crate) fn work_in_savepoint(&mut self, f: impl FnOnce(&rusqlite::Connection) -> bool) -> Result<bool, ()> {
        if self.internal(SAVEPOINT).is_err() {
            self.rollback();
            return Err(());
        }
        let succeeded = self.with_internal(f);
        if !self.in_transaction() {
            self.rollback();
            return Err(());
        }
        if succeeded {
            return match self.internal(RELEASE) {
                Ok(()) => Ok(true),
                Err(_) => {
                    self.rollback();
                    Err(())
                }
            };
        }
        if self.undo_savepoint() { Ok(false) } else { Err(()) }
    }

    /// Rolls the request's savepoint back; if even that fails, the whole transaction goes and
    /// this returns false.
    fn undo_savepoint(&mut self) -> bool {
        self.size = None;
        if self.internal(ROLLBACK_TO).and_then(|()| self.internal(RELEASE)).is_ok() {
            return true;
        }
        self.rollback();
        false
    }

    /// Whether the open transaction holds foreign-key violations not yet resolved.
    fn has_unresolved_foreign_keys(&self) -> bool {
        let (mut current, mut highest) = (0, 0);
        let rc = unsafe {
            ffi::sqlite3_db_status(self.handle(), ffi::SQLITE_DBSTATUS_DEFERRED_FKS, &mut current, &mut highest, 0)
        };
        rc == ffi::SQLITE_OK && current > 0
    }

    /// Marks the connection untrustworthy: its owner closes and reopens the file.
    pub(crate) fn mark_for_reopening(&mut self) {
        self.poisoned = true;
    }

    /// Whether a commit failed in a way that leaves the connection untrustworthy (an I/O error
    /// after which the page cache may not match the disk): the owner must close and reopen it.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Runs a request that only reads, in a read transaction of its own, if it finishes within
    /// `budget`: a statement that would write is refused before it runs, and a request still
    /// running at the budget is interrupted; either way it is declined and nothing remains of
    /// it. Reads see every commit acknowledged before (they were committed under the lock the
    /// caller holds) and nothing not yet committed.
    pub(crate) fn execute_read(&mut self, request: &Request, budget: std::time::Duration) -> Inline {
        if self.poisoned || self.in_transaction() || request.needs_own_transaction() || self.begin().is_err() {
            return Inline::Declined;
        }
        let started = self.epoch.elapsed();
        self.reads_only = true;
        let outcome = self.execute_for(request, budget);
        self.reads_only = false;
        let over_budget = self.epoch.elapsed() >= started + budget;
        // Nothing was written, so the size measured stays true past the rollback.
        let size = self.size;
        self.rollback();
        self.size = size;
        match outcome {
            Ok(results) => Inline::Done(results),
            Err(Error::ReadOnly { .. }) if request.access != crate::request::Access::ReadOnly => Inline::Declined,
            Err(Error::Sql { code: ffi::SQLITE_INTERRUPT, .. }) if over_budget => Inline::TooLong,
            Err(e) => Inline::Failed(e),
        }
    }

    /// Runs a request in a transaction of its own and commits it.
    pub fn execute_alone(&mut self, request: &Request) -> Result<Vec<StatementResult>> {
        let outcome = self.execute_alone_answered_first(request);
        self.settle_if_due();
        outcome
    }

    /// Runs a request alone as [`Database::execute_alone`] does, leaving a capture or
    /// checkpoint it makes due to [`Database::settle_if_due`] (see
    /// [`Database::commit_answered_first`]): for the actor, and for a write on its caller's
    /// thread, whose caller captures once the answer is out ([`Database::capture_due`]).
    pub(crate) fn execute_alone_answered_first(&mut self, request: &Request) -> Result<Vec<StatementResult>> {
        self.begin()?;
        let outcome = match self.execute(request) {
            Ok(results) => self.commit_answered_first().map(|()| results),
            Err(e) => {
                self.rollback();
                Err(e)
            }
        };
        if request.needs_own_transaction() {
            self.reset_connection_pragmas();
        }
        outcome
    }

    /// PRAGMAs in D1 apply to one request; undo whatever the last one changed.
    pub fn reset_connection_pragmas(&mut self) {
        let reset = "PRAGMA foreign_keys = ON; PRAGMA case_sensitive_like = OFF; \
                     PRAGMA ignore_check_constraints = OFF; PRAGMA legacy_alter_table = OFF; \
                     PRAGMA recursive_triggers = OFF; PRAGMA reverse_unordered_selects = OFF; \
                     PRAGMA defer_foreign_keys = OFF;";
        if let Err(e) = self.internal_batch(reset) {
            tracing::warn!(path = %self.path.display(), error = %e, "resetting pragmas failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::database::DatabaseOptions;
    use crate::request::{Statement, Value};

    fn open() -> (tempfile::TempDir, Database) {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::open(&DatabaseOptions::new(dir.path().join("db.sqlite")).create(true)).unwrap();
        (dir, db)
    }

    fn request(sql: &str) -> Request {
        Request::new(vec![Statement::new(sql)])
    }

    #[test]
    fn deferred_foreign_keys_never_ride_on_a_shared_commit() {
        let (_dir, mut db) = open();
        db.execute_alone(&request(
            "CREATE TABLE parent (id INTEGER PRIMARY KEY);
             CREATE TABLE child (pid INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)",
        ))
        .unwrap();
        db.begin().unwrap();
        assert!(matches!(db.execute_in_savepoint(&request("INSERT INTO parent VALUES (1)")), Grouped::Done(_)));
        // An orphan that a later request of the same group would have made whole must not pass.
        assert!(matches!(db.execute_in_savepoint(&request("INSERT INTO child VALUES (7)")), Grouped::RunAlone));
        assert!(matches!(db.execute_in_savepoint(&request("INSERT INTO parent VALUES (7)")), Grouped::Done(_)));
        db.commit().unwrap();
        let e = db.execute_alone(&request("INSERT INTO child VALUES (8)")).unwrap_err();
        assert!(e.to_string().contains("FOREIGN KEY constraint failed"), "{e}");
        let count = db.execute_alone(&request("SELECT count(*) FROM child")).unwrap();
        assert_eq!(count[0].rows[0][0], Value::Integer(0));
    }

    #[test]
    fn a_failure_that_ends_the_transaction_is_reported_as_lost() {
        let (_dir, mut db) = open();
        db.execute_alone(&request("CREATE TABLE t (id INTEGER PRIMARY KEY); INSERT INTO t VALUES (1)")).unwrap();
        db.begin().unwrap();
        assert!(matches!(db.execute_in_savepoint(&request("INSERT INTO t VALUES (2)")), Grouped::Done(_)));
        assert!(matches!(
            db.execute_in_savepoint(&request("INSERT OR ROLLBACK INTO t VALUES (1)")),
            Grouped::Lost(Some(_))
        ));
        assert!(!db.in_transaction());
        let count = db.execute_alone(&request("SELECT count(*) FROM t")).unwrap();
        assert_eq!(count[0].rows[0][0], Value::Integer(1), "the earlier request went with the transaction");
    }
}
