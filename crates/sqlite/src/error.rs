//! Errors of the SQLite core, with SQL errors worded the way D1 and Durable Objects word them.

use std::path::PathBuf;

use libsqlite3_sys as ffi;

/// The text D1 and Durable Objects answer when user SQL tries to open or close a transaction.
pub const TRANSACTION_MESSAGE: &str = "To execute a transaction, please use the state.storage.transaction() or \
state.storage.transactionSync() APIs instead of the SQL BEGIN TRANSACTION or SAVEPOINT statements. \
The JavaScript API is safer because it will automatically roll back on exceptions, and because it \
interacts correctly with Durable Objects' automatic atomic write coalescing.";

/// Everything that can go wrong running SQL through the core.
///
/// Grouped by what the caller must do: [`Error::Sql`] and [`Error::NoStatements`] are the
/// client's fault (fix the SQL); [`Error::ReadOnly`] is a permission problem; [`Error::Overloaded`]
/// and [`Error::Closed`] are transient (retry); [`Error::Open`] and [`Error::Io`] are the
/// operator's problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A statement failed. `message` reads like workerd's:
    /// `<sqlite message>[ at offset N]: SQLITE_<CODE>[ (extended: SQLITE_<CODE>_<DETAIL>)]`.
    #[error("{message}")]
    Sql {
        /// The full, client-facing message.
        message: String,
        /// SQLite's primary result code (`SQLITE_CONSTRAINT`, `SQLITE_AUTH`, …).
        code: i32,
        /// SQLite's extended result code (`SQLITE_CONSTRAINT_UNIQUE`, …); equal to `code` when
        /// SQLite gave none, or the error is kura's own.
        extended: i32,
    },
    /// The request held no statement, only whitespace or comments.
    #[error("No SQL statements detected.")]
    NoStatements,
    /// A caller allowed only to read ran a statement that writes.
    #[error("this credential may only read, and the statement writes: {sql}")]
    ReadOnly {
        /// The statement that would have written.
        sql: String,
    },
    /// The database's queue is full; nothing was run.
    #[error("too many requests queued")]
    Overloaded,
    /// The database is closing or was deleted while the request waited; nothing was run.
    #[error("the database closed before the request ran")]
    Closed,
    /// A commit before this request failed — on the disk (full, or an I/O error), or in
    /// shipping its history (in a cluster, a node whose ownership ended) — so the connection is
    /// being reopened; this request did not run. Retry: the reopened file answers (with the
    /// disk's error if it persists; a node that no longer owns the database sends it on).
    #[error(
        "the database is reopening after a commit failed (on the disk, or in shipping its history); the request did not run, retry it"
    )]
    Reopening,
    /// The database file could not be opened or configured.
    #[error("cannot open database {path}: {message}")]
    Open {
        /// The file that failed to open.
        path: PathBuf,
        /// What SQLite or the file system said.
        message: String,
        /// Whether it failed because the disk is full (told from the failure's type where it
        /// was made), so the surfaces answer that as such.
        disk_full: bool,
    },
    /// A bookmark or timestamp does not name a restorable point: malformed, unknown, outside
    /// the Time Travel window, or in the future.
    #[error("{message}")]
    InvalidBookmark {
        /// What is wrong with it.
        message: String,
    },
    /// The history log or a snapshot is damaged where a restore needs it; the restore stopped
    /// and changed nothing.
    #[error("the history is damaged: {message}")]
    HistoryDamaged {
        /// What is damaged, and where.
        message: String,
    },
    /// Another node took the database over: this node's commit was not shipped and never will
    /// be, so it did not take effect.
    #[error("another node took this database over; the request did not take effect: {message}")]
    Superseded {
        /// What the shipper was told.
        message: String,
    },
    /// The database keeps no history.
    #[error("this database keeps no history")]
    NoHistory,
    /// The file system failed outside SQLite.
    #[error("{context}: {source}")]
    Io {
        /// What kura was doing.
        context: String,
        /// The underlying failure.
        source: std::io::Error,
    },
}

/// A convenient alias for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// SQLite's primary result code, if this is an SQL error.
    pub fn sqlite_code(&self) -> Option<i32> {
        match self {
            Error::Sql { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Opening `path` failed while `doing` (`""`, `"cannot create it: "`) with `e`.
    pub(crate) fn open(path: &std::path::Path, doing: &str, e: impl std::error::Error + 'static) -> Self {
        Error::Open { path: path.to_owned(), message: format!("{doing}{e}"), disk_full: is_disk_full(&e) }
    }

    /// An SQL error from a result code and SQLite's message, without an offset.
    pub(crate) fn sql(code: i32, message: &str) -> Self {
        Error::Sql { message: format!("{message}: {}", code_name(code)), code: code & 0xff, extended: code }
    }

    /// The connection's most recent error, worded as D1 words it.
    ///
    /// # Safety
    /// `db` must be a valid, open connection.
    pub(crate) unsafe fn from_connection(db: *mut ffi::sqlite3, rc: i32, with_offset: bool) -> Self {
        let message = unsafe { std::ffi::CStr::from_ptr(ffi::sqlite3_errmsg(db)) }.to_string_lossy();
        let offset = if with_offset { unsafe { ffi::sqlite3_error_offset(db) } } else { -1 };
        let code = rc & 0xff;
        let mut message = if offset >= 0 {
            format!("{message} at offset {offset}: {}", code_name(code))
        } else {
            format!("{message}: {}", code_name(code))
        };
        if let Some(name) = extended_code_name(rc) {
            message = format!("{message} (extended: {name})");
        }
        Error::Sql { message, code, extended: rc }
    }

    /// Wraps a rusqlite failure that happened while running kura's own statements.
    pub(crate) fn internal(err: rusqlite::Error) -> Self {
        match err.sqlite_error() {
            Some(e) => Error::sql(e.extended_code, &err.to_string()),
            None => Error::sql(ffi::SQLITE_ERROR, &err.to_string()),
        }
    }
}

/// Whether a failure is the disk being full: SQLite's `SQLITE_FULL`, or `ENOSPC` from a write,
/// found by type along the error's chain of sources (never by its text). The one storage
/// failure a client can do something about, so the surfaces answer it as such (HTTP 507)
/// rather than as an internal error.
pub fn is_disk_full(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        let full = if let Some(io) = error.downcast_ref::<std::io::Error>() {
            io.kind() == std::io::ErrorKind::StorageFull || io.raw_os_error() == Some(libc::ENOSPC)
        } else if let Some(sqlite) = error.downcast_ref::<rusqlite::Error>() {
            sqlite.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
        } else if let Some(error) = error.downcast_ref::<Error>() {
            match error {
                Error::Sql { code, .. } => *code == ffi::SQLITE_FULL,
                Error::Open { disk_full, .. } => *disk_full,
                _ => false,
            }
        } else {
            false
        };
        if full {
            return true;
        }
        next = error.source();
    }
    false
}

/// How a statement given the wrong number of values is refused (D1 adds the counts in
/// parentheses; workerd's Durable Objects end the sentence there).
pub(crate) const WRONG_PARAMETER_COUNT: &str = "Wrong number of parameter bindings for SQL query";

/// How parameters on any statement but the last of a multi-statement text are refused.
pub(crate) const PARAMETERS_ON_LAST_STATEMENT_ONLY: &str =
    "When executing multiple SQL statements in a single call, only the last statement can have parameters.";

/// The symbolic name of an extended result code that says more than its primary code, as
/// workerd appends it to SQL errors since 2026-03 (` (extended: SQLITE_CONSTRAINT_UNIQUE)`);
/// `None` for a primary code, or one kura does not name.
pub fn extended_code_name(extended: i32) -> Option<&'static str> {
    Some(match extended {
        ffi::SQLITE_CONSTRAINT_CHECK => "SQLITE_CONSTRAINT_CHECK",
        ffi::SQLITE_CONSTRAINT_COMMITHOOK => "SQLITE_CONSTRAINT_COMMITHOOK",
        ffi::SQLITE_CONSTRAINT_FOREIGNKEY => "SQLITE_CONSTRAINT_FOREIGNKEY",
        ffi::SQLITE_CONSTRAINT_FUNCTION => "SQLITE_CONSTRAINT_FUNCTION",
        ffi::SQLITE_CONSTRAINT_NOTNULL => "SQLITE_CONSTRAINT_NOTNULL",
        ffi::SQLITE_CONSTRAINT_PINNED => "SQLITE_CONSTRAINT_PINNED",
        ffi::SQLITE_CONSTRAINT_PRIMARYKEY => "SQLITE_CONSTRAINT_PRIMARYKEY",
        ffi::SQLITE_CONSTRAINT_ROWID => "SQLITE_CONSTRAINT_ROWID",
        ffi::SQLITE_CONSTRAINT_TRIGGER => "SQLITE_CONSTRAINT_TRIGGER",
        ffi::SQLITE_CONSTRAINT_UNIQUE => "SQLITE_CONSTRAINT_UNIQUE",
        ffi::SQLITE_CONSTRAINT_VTAB => "SQLITE_CONSTRAINT_VTAB",
        ffi::SQLITE_CONSTRAINT_DATATYPE => "SQLITE_CONSTRAINT_DATATYPE",
        ffi::SQLITE_ERROR_MISSING_COLLSEQ => "SQLITE_ERROR_MISSING_COLLSEQ",
        ffi::SQLITE_ERROR_RETRY => "SQLITE_ERROR_RETRY",
        ffi::SQLITE_ERROR_SNAPSHOT => "SQLITE_ERROR_SNAPSHOT",
        ffi::SQLITE_AUTH_USER => "SQLITE_AUTH_USER",
        _ => return None,
    })
}

/// The symbolic name of SQLite's primary result code, as D1 prints it.
pub fn code_name(code: i32) -> &'static str {
    match code & 0xff {
        ffi::SQLITE_OK => "SQLITE_OK",
        ffi::SQLITE_ERROR => "SQLITE_ERROR",
        ffi::SQLITE_INTERNAL => "SQLITE_INTERNAL",
        ffi::SQLITE_PERM => "SQLITE_PERM",
        ffi::SQLITE_ABORT => "SQLITE_ABORT",
        ffi::SQLITE_BUSY => "SQLITE_BUSY",
        ffi::SQLITE_LOCKED => "SQLITE_LOCKED",
        ffi::SQLITE_NOMEM => "SQLITE_NOMEM",
        ffi::SQLITE_READONLY => "SQLITE_READONLY",
        ffi::SQLITE_INTERRUPT => "SQLITE_INTERRUPT",
        ffi::SQLITE_IOERR => "SQLITE_IOERR",
        ffi::SQLITE_CORRUPT => "SQLITE_CORRUPT",
        ffi::SQLITE_NOTFOUND => "SQLITE_NOTFOUND",
        ffi::SQLITE_FULL => "SQLITE_FULL",
        ffi::SQLITE_CANTOPEN => "SQLITE_CANTOPEN",
        ffi::SQLITE_PROTOCOL => "SQLITE_PROTOCOL",
        ffi::SQLITE_EMPTY => "SQLITE_EMPTY",
        ffi::SQLITE_SCHEMA => "SQLITE_SCHEMA",
        ffi::SQLITE_TOOBIG => "SQLITE_TOOBIG",
        ffi::SQLITE_CONSTRAINT => "SQLITE_CONSTRAINT",
        ffi::SQLITE_MISMATCH => "SQLITE_MISMATCH",
        ffi::SQLITE_MISUSE => "SQLITE_MISUSE",
        ffi::SQLITE_NOLFS => "SQLITE_NOLFS",
        ffi::SQLITE_AUTH => "SQLITE_AUTH",
        ffi::SQLITE_FORMAT => "SQLITE_FORMAT",
        ffi::SQLITE_RANGE => "SQLITE_RANGE",
        ffi::SQLITE_NOTADB => "SQLITE_NOTADB",
        ffi::SQLITE_NOTICE => "SQLITE_NOTICE",
        ffi::SQLITE_WARNING => "SQLITE_WARNING",
        ffi::SQLITE_ROW => "SQLITE_ROW",
        ffi::SQLITE_DONE => "SQLITE_DONE",
        _ => "SQLITE_ERROR",
    }
}

#[cfg(test)]
mod tests {

    #[derive(Debug, thiserror::Error)]
    #[error("wrapped: {0}")]
    struct Wrapped(#[source] Box<dyn std::error::Error + Send + Sync>);

    #[test]
    fn a_full_disk_is_told_by_type_along_the_chain_never_by_text() {
        let enospc = || std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(is_disk_full(&enospc()));
        assert!(is_disk_full(&Error::Io { context: "writing".into(), source: enospc() }));
        assert!(is_disk_full(&Wrapped(Box::new(Error::Io { context: "writing".into(), source: enospc() }))));
        assert!(is_disk_full(&Error::sql(ffi::SQLITE_FULL, "database or disk is full")));
        assert!(is_disk_full(&Error::open(std::path::Path::new("x"), "", enospc())));
        let sqlite_full = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(ffi::SQLITE_FULL), None);
        assert!(is_disk_full(&sqlite_full));

        let other = std::io::Error::from_raw_os_error(libc::EACCES);
        assert!(!is_disk_full(&other));
        assert!(!is_disk_full(&Error::open(std::path::Path::new("x"), "", other)));
        // Text that merely says so is not a full disk: the type decides.
        assert!(!is_disk_full(&Wrapped("No space left on device (os error 28)".into())));
        assert!(!is_disk_full(&Error::sql(ffi::SQLITE_ERROR, "database or disk is full")));
    }

    use super::*;

    #[test]
    fn names_primary_codes_even_from_extended_ones() {
        assert_eq!(code_name(ffi::SQLITE_CONSTRAINT_UNIQUE), "SQLITE_CONSTRAINT");
        assert_eq!(code_name(ffi::SQLITE_TOOBIG), "SQLITE_TOOBIG");
        assert_eq!(code_name(ffi::SQLITE_AUTH), "SQLITE_AUTH");
    }

    #[test]
    fn formats_like_d1() {
        let e = Error::sql(ffi::SQLITE_TOOBIG, "string or blob too big");
        assert_eq!(e.to_string(), "string or blob too big: SQLITE_TOOBIG");
        assert_eq!(e.sqlite_code(), Some(ffi::SQLITE_TOOBIG));
    }
}
