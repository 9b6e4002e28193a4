//! What the KV engine answers when it cannot do what was asked, with the texts Workers KV
//! uses. Which status and code each failure is on the wire is the server's to say.

use kura_r2::R2Error;

/// A KV failure, with KV's own message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KvError {
    /// The namespace is unknown (or was deleted while the request ran).
    #[error("namespace not found")]
    NamespaceNotFound,
    /// An empty key.
    #[error("Key names must not be empty")]
    EmptyKey,
    /// `.` or `..`, which cannot be a URL path segment.
    #[error("Illegal key name \"{0}\". Please use a different name.")]
    IllegalKey(String),
    /// A key (or a list prefix) over 512 bytes of UTF-8.
    #[error("UTF-8 encoded length of {0} exceeds key length limit of 512.")]
    KeyTooLong(usize),
    /// A key whose percent-encoding does not decode to UTF-8.
    #[error("Could not URL-decode key name")]
    UndecodableKey,
    /// `cacheTtl` below 30 seconds, or not a number.
    #[error("Invalid cache_ttl of {0}. Cache TTL must be at least 30.")]
    InvalidCacheTtl(String),
    /// `expirationTtl` not a positive integer.
    #[error("Invalid expiration_ttl of {0}. Please specify integer greater than 0.")]
    ExpirationTtlNotPositive(String),
    /// `expirationTtl` under 60 seconds.
    #[error("Invalid expiration_ttl of {0}. Expiration TTL must be at least 60.")]
    ExpirationTtlTooShort(String),
    /// `expiration` not after now.
    #[error(
        "Invalid expiration of {0}. Please specify integer greater than the current number of seconds since the UNIX epoch."
    )]
    ExpirationPast(String),
    /// `expiration` less than 60 seconds from now.
    #[error("Invalid expiration of {0}. Expiration times must be at least 60 seconds in the future.")]
    ExpirationTooSoon(String),
    /// Metadata whose JSON is over 1,024 bytes.
    #[error("Metadata length of {0} exceeds limit of 1024.")]
    MetadataTooLarge(usize),
    /// Metadata that is not JSON.
    #[error("Metadata must be valid JSON: {0}")]
    MetadataNotJson(String),
    /// A value over 25 MiB (its length, when it was declared).
    #[error("Value length of {} exceeds limit of 26214400.", .0.map_or("more than 26214400".to_owned(), |n| n.to_string()))]
    ValueTooLarge(Option<u64>),
    /// A list limit under 1.
    #[error("Invalid key_count_limit of {0}. Please specify an integer greater than 0.")]
    LimitTooSmall(String),
    /// A list limit over 1,000.
    #[error("Invalid key_count_limit of {0}. Please specify an integer less than 1000.")]
    LimitTooLarge(String),
    /// A cursor this engine did not hand out.
    #[error("Invalid cursor")]
    InvalidCursor,
    /// A bulk read of more than 100 keys.
    #[error("You can request a maximum of 100 keys")]
    TooManyKeys,
    /// A bulk read of no key.
    #[error("You must request a minimum of 1 key")]
    NoKeys,
    /// A bulk read type other than `text` and `json`.
    #[error("\"{0}\" is not a valid type. Use \"json\" or \"text\"")]
    InvalidType(String),
    /// A bulk read whose values add up to more than 25 MiB.
    #[error("Total size of request exceeds the limit of 25MB")]
    BulkTooLarge,
    /// A bulk read as JSON of a value that is not JSON.
    #[error("At least one of the requested keys corresponds to a non-json value")]
    NotJson,
    /// The storage underneath failed or is unavailable.
    #[error(transparent)]
    Storage(R2Error),
}

impl From<R2Error> for KvError {
    fn from(e: R2Error) -> Self {
        match e {
            R2Error::NoSuchBucket => KvError::NamespaceNotFound,
            R2Error::EntityTooLarge => KvError::ValueTooLarge(None),
            other => KvError::Storage(other),
        }
    }
}

/// A KV result.
pub type Result<T, E = KvError> = std::result::Result<T, E>;
