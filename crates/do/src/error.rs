//! The Durable Objects engine's errors, worded as workerd words them where it has words.

use crate::id::IdError;

/// What can go wrong, grouped by what the caller must do: [`DoError::Id`], [`DoError::Sql`],
/// [`DoError::Invalid`], [`DoError::ReadOnly`] and [`DoError::InvalidBookmark`] are the
/// caller's to fix; [`DoError::Overloaded`] and [`DoError::Closed`] are transient; the rest are
/// the operator's.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DoError {
    /// The id is malformed or belongs to another namespace.
    #[error(transparent)]
    Id(#[from] IdError),
    /// A statement failed: `<sqlite message>[ at offset N]: SQLITE_<CODE>`.
    #[error("{message}")]
    Sql {
        /// The message.
        message: String,
        /// SQLite's primary result code.
        code: i32,
    },
    /// An argument is out of range (KV batch or entry size, list options, alarm time).
    #[error("{0}")]
    Invalid(String),
    /// The caller may only read, and the statement writes.
    #[error("this credential may only read, and the statement writes: {sql}")]
    ReadOnly {
        /// The statement.
        sql: String,
    },
    /// The request's transaction was lost (SQLite rolled it back after a critical error);
    /// nothing of the request was kept.
    #[error("{0}")]
    Reset(String),
    /// A bookmark is malformed, unknown or outside the 30-day window.
    #[error("{0}")]
    InvalidBookmark(String),
    /// The object's queue is full; nothing was run.
    #[error("Durable Object is overloaded. Too many requests queued.")]
    Overloaded,
    /// The engine is shutting down; nothing was run.
    #[error("the Durable Object's storage closed before the request ran")]
    Closed,
    /// In a cluster: the namespace or object cannot be served here for now (its ownership is
    /// moving, or the store or the coordinator failed); nothing was run, retry shortly.
    #[error("{0}")]
    Unavailable(String),
    /// The file system or the history failed.
    #[error("storage failure: {0}")]
    Storage(String),
    /// The disk is full; nothing was changed. Writes succeed again once space is freed.
    #[error("storage failure: the server's disk is full")]
    InsufficientStorage,
}

/// Results of the engine.
pub type Result<T, E = DoError> = std::result::Result<T, E>;

impl DoError {
    /// A failure of the file system or the history: a full disk (by the error's type,
    /// [`kura_sqlite::is_disk_full`]) is [`DoError::InsufficientStorage`].
    pub(crate) fn storage(e: impl std::error::Error + 'static) -> Self {
        match kura_sqlite::is_disk_full(&e) {
            true => {
                tracing::error!(error = %e, "the disk is full");
                DoError::InsufficientStorage
            }
            false => DoError::Storage(e.to_string()),
        }
    }

    /// Translates an error of the SQLite core.
    pub(crate) fn from_sql(e: kura_sqlite::Error) -> Self {
        use kura_sqlite::Error as E;
        match e {
            E::Sql { message, code, .. } => DoError::Sql { message, code },
            E::NoStatements => DoError::Sql {
                message: "SQL code did not contain a statement.".into(),
                code: libsqlite3_sys::SQLITE_MISUSE,
            },
            E::ReadOnly { sql } => DoError::ReadOnly { sql },
            E::Overloaded => DoError::Overloaded,
            E::Closed => DoError::Closed,
            e @ E::Reopening => DoError::Unavailable(e.to_string()),
            E::InvalidBookmark { message } => DoError::InvalidBookmark(message),
            E::Superseded { .. } => {
                DoError::Unavailable("another node took this namespace over; the request did not take effect".into())
            }
            other => DoError::storage(other),
        }
    }

    pub(crate) fn internal(e: rusqlite::Error) -> Self {
        match e.sqlite_error() {
            Some(s) if s.code == rusqlite::ErrorCode::DiskFull || s.extended_code & 0xff == 18 => DoError::Sql {
                message: format!("{e}: {}", kura_sqlite::code_name(s.extended_code & 0xff)),
                code: s.extended_code & 0xff,
            },
            _ => DoError::storage(e),
        }
    }

    /// Whether the caller's input is at fault (HTTP 400) rather than the server.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            DoError::Id(_)
                | DoError::Sql { .. }
                | DoError::Invalid(_)
                | DoError::ReadOnly { .. }
                | DoError::InvalidBookmark(_)
        )
    }
}
