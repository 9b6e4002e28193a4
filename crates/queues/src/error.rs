//! What the Queues engine answers when it cannot do what was asked, with Cloudflare's codes
//! beside Cloudflare's (or Miniflare's) texts. Which status each is on the wire is the
//! server's to say.

/// A Queues failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The queue is unknown (or was deleted while the request ran).
    #[error("Queue not found")]
    NotFound,
    /// A message over 128 KB.
    #[error("message length of {0} bytes exceeds limit of 128000")]
    MessageTooLarge(usize),
    /// A batch over 256 KB.
    #[error("batch size of {0} bytes exceeds limit of 256000")]
    BatchTooLarge(usize),
    /// A batch of no message or of more than 100.
    #[error("batch of {0} messages is out of bounds: send 1 to 100 messages")]
    BatchCount(usize),
    /// A delay beyond 12 hours.
    #[error("message delay {0} is invalid: specify whole seconds from 0 to 43200")]
    InvalidDelay(String),
    /// A content type other than text, json, bytes and v8.
    #[error("message content type {0} is invalid; if specified, must be one of 'text', 'json', 'bytes', or 'v8'")]
    InvalidContentType(String),
    /// The storage underneath failed or is unavailable.
    #[error("{0}")]
    Storage(#[from] kura_sqlite::Error),
    /// A statement of the engine's own failed.
    #[error("queue storage: {0}")]
    Sql(#[from] rusqlite::Error),
    /// The queue's directory could not be made or removed.
    #[error("queue storage: {0}")]
    Io(std::io::Error),
    /// In a cluster: the queue cannot be served here now (its ownership is moving, or another
    /// node took it over); nothing happened, and the request may be retried.
    #[error("{0}")]
    Unavailable(String),
}

impl QueueError {
    /// Cloudflare's code for the failure (its Queues error codes).
    pub fn code(&self) -> u32 {
        match self {
            QueueError::NotFound => 10104,
            QueueError::InvalidDelay(_) => 10202,
            QueueError::InvalidContentType(_) => 10203,
            QueueError::MessageTooLarge(_) => 10204,
            QueueError::BatchTooLarge(_) => 10205,
            QueueError::BatchCount(_) => 10206,
            QueueError::Storage(kura_sqlite::Error::Overloaded) | QueueError::Unavailable(_) => 10250,
            QueueError::Storage(_) | QueueError::Sql(_) | QueueError::Io(_) => 15000,
        }
    }
}

/// A Queues result.
pub type Result<T, E = QueueError> = std::result::Result<T, E>;
