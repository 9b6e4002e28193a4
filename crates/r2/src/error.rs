//! What the R2 engine answers when it cannot do what was asked, with R2's own texts. Which
//! status and code each failure is on the wire (S3's, the v4 API's, the binding's) is the
//! server's to say.

/// An R2 failure, with R2's own message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum R2Error {
    /// The bucket is unknown (or was deleted while the request ran).
    #[error("The specified bucket does not exist.")]
    NoSuchBucket,
    /// The key holds no object.
    #[error("The specified key does not exist.")]
    NoSuchKey,
    /// The upload id is unknown, completed, aborted or expired.
    #[error("The specified multipart upload does not exist.")]
    NoSuchUpload,
    /// A precondition (If-Match, If-Unmodified-Since, or any on a write) did not hold.
    #[error("At least one of the pre-conditions you specified did not hold.")]
    PreconditionFailed,
    /// A cache validator (If-None-Match, If-Modified-Since) says the client's copy is current.
    #[error("Not Modified")]
    NotModified,
    /// The range starts past the end, or the object is empty.
    #[error("The requested range is not satisfiable")]
    InvalidRange,
    /// The key is longer than 1,024 bytes.
    #[error("The specified object name is not valid.")]
    InvalidObjectName,
    /// Custom metadata over 8,192 bytes.
    #[error("Your metadata headers exceed the maximum allowed metadata size.")]
    MetadataTooLarge,
    /// A single upload over the size limit.
    #[error("Your proposed upload exceeds the maximum allowed object size.")]
    EntityTooLarge,
    /// A non-last multipart part under the minimum part size.
    #[error("Your proposed upload is smaller than the minimum allowed object size.")]
    EntityTooSmall,
    /// The body does not match a checksum the client sent.
    #[error("{}", digest_message(algorithm, sent, actual, DigestText::AsS3))]
    BadDigest {
        /// R2's name of the algorithm (`MD5`, `SHA-256`).
        algorithm: &'static str,
        /// The digest the client sent.
        sent: Vec<u8>,
        /// The digest of what arrived.
        actual: Vec<u8>,
    },
    /// A part named in a completion is unknown or its ETag differs.
    #[error("One or more of the specified parts could not be found.")]
    InvalidPart,
    /// The parts of a completion break R2's rules (duplicates, unequal sizes, a larger last part).
    #[error("There was a problem with the multipart upload.")]
    BadUpload,
    /// DeleteBucket on a bucket that still holds objects.
    #[error("The bucket you tried to delete is not empty.")]
    BucketNotEmpty,
    /// An argument is out of its domain.
    #[error("{0}")]
    InvalidArgument(String),
    /// The request body ended before its declared length, or failed to arrive.
    #[error("The request body terminated unexpectedly: {0}")]
    IncompleteBody(String),
    /// The bucket's queue is full; retry later.
    #[error("Reduce your request rate.")]
    Busy,
    /// In a cluster: the bucket cannot be served for now (its ownership is moving, or the
    /// store or the coordinator failed); nothing was changed, retry shortly.
    #[error("Service unavailable: {0}")]
    Unavailable(String),
    /// The disk or the metadata file failed; nothing was changed.
    #[error("We encountered an internal error. Please try again.")]
    Storage(String),
    /// The disk is full; nothing was changed. Writes succeed again once space is freed.
    #[error("There is not enough space on the server's disk to store this. Free some and retry.")]
    InsufficientStorage,
}

impl R2Error {
    /// The message as the Workers binding words it: every digest in hex.
    pub fn binding_message(&self) -> String {
        match self {
            R2Error::BadDigest { algorithm, sent, actual } => digest_message(algorithm, sent, actual, DigestText::Hex),
            other => other.to_string(),
        }
    }

    /// A storage failure while `context`, logged as it is made: a full disk (by the error's
    /// type, [`kura_sqlite::is_disk_full`]) is [`R2Error::InsufficientStorage`].
    pub fn storage(context: &str, e: impl std::error::Error + 'static) -> Self {
        if kura_sqlite::is_disk_full(&e) {
            tracing::error!(%e, "{context}");
            return R2Error::InsufficientStorage;
        }
        R2Error::storage_text(context, e)
    }

    /// A storage failure while `context` known only by its description (never a full disk),
    /// logged as it is made.
    pub fn storage_text(context: &str, e: impl std::fmt::Display) -> Self {
        tracing::error!(%e, "{context}");
        R2Error::Storage(format!("{context}: {e}"))
    }
}

impl From<kura_sqlite::Error> for R2Error {
    fn from(e: kura_sqlite::Error) -> Self {
        match e {
            kura_sqlite::Error::Overloaded => R2Error::Busy,
            // A commit a newer owner fenced: it did not take effect.
            kura_sqlite::Error::Superseded { .. } => {
                R2Error::Unavailable("another node took this bucket over; the request did not take effect".into())
            }
            // A retired actor: the bucket was deleted under the request.
            kura_sqlite::Error::Closed => R2Error::NoSuchBucket,
            e @ kura_sqlite::Error::Reopening => R2Error::Unavailable(e.to_string()),
            other => R2Error::storage("bucket metadata", other),
        }
    }
}

impl From<rusqlite::Error> for R2Error {
    fn from(e: rusqlite::Error) -> Self {
        R2Error::storage("bucket metadata", e)
    }
}

/// How a digest mismatch shows the digests: S3 shows MD5 in hex and its checksums in base64,
/// as the headers carry them; the Workers binding shows all in hex.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DigestText {
    AsS3,
    Hex,
}

fn digest_message(algorithm: &str, sent: &[u8], actual: &[u8], text: DigestText) -> String {
    use base64::Engine;
    let show = |b: &[u8]| match text {
        DigestText::AsS3 if algorithm != "MD5" => base64::engine::general_purpose::STANDARD.encode(b),
        _ => hex::encode(b),
    };
    format!(
        "The {algorithm} checksum you specified did not match what we received.\nYou provided a {algorithm} checksum with value: {}\nActual {algorithm} was: {}",
        show(sent),
        show(actual)
    )
}

/// Results of R2 calls.
pub type Result<T, E = R2Error> = std::result::Result<T, E>;
