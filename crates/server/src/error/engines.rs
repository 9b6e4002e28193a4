//! Every engine's error as the v4 API answers it: a status, Cloudflare's code, a message.
//! Failures that are kura's own (a storage or catalog fault) are logged and answered with a
//! reference ([`ApiError::internal`]).

use axum::http::StatusCode;
use kura_do::DoError;
use kura_kv::KvError;
use kura_queues::QueueError;
use kura_r2::R2Error;
use kura_workers::WorkersError;

use super::ApiError;
use crate::buckets::BucketError;

impl From<kura_d1::Error> for ApiError {
    fn from(e: kura_d1::Error) -> Self {
        use kura_d1::Error as E;
        use kura_d1::SqlError as S;
        match e {
            E::NotFound(id) => {
                ApiError::new(StatusCode::NOT_FOUND, 7404, format!("The database {id} could not be found"))
            }
            E::InvalidId(id) => ApiError::bad_request(format!("Invalid property: databaseId => Invalid uuid: {id}")),
            E::DuplicateName => {
                ApiError::new(StatusCode::BAD_REQUEST, 7502, "A database with that name already exists")
            }
            E::TooManyRestores { limit, minutes } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                7400,
                format!("too many restores: at most {limit} per {minutes} minutes for one database"),
            ),
            E::LimitReached(n) => ApiError::new(
                StatusCode::BAD_REQUEST,
                7406,
                format!("System limit reached: databases per account ({n})"),
            ),
            E::Invalid(m) => ApiError::bad_request(m),
            E::Placement(e) => ApiError::unavailable(format!("the database is {e}")),
            E::Catalog(kura_catalog::Error::Replication(e)) => ApiError::unavailable(e.to_string()),
            E::Import(e) => ApiError::new(StatusCode::BAD_REQUEST, 7500, e.to_string()),
            E::Export(e) => ApiError::new(StatusCode::BAD_REQUEST, 7500, e.to_string()),
            E::Sql(sql) => match sql {
                S::InvalidBookmark { message } => ApiError::bad_request(message),
                S::HistoryDamaged { .. } => {
                    tracing::error!(error = %sql, "restore refused: damaged history");
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, 7500, sql.to_string())
                }
                S::Sql { message, .. } => ApiError::new(StatusCode::BAD_REQUEST, 7500, message),
                S::NoStatements => ApiError::new(StatusCode::BAD_REQUEST, 7500, "No SQL statements detected."),
                S::ReadOnly { sql } => ApiError::new(
                    StatusCode::FORBIDDEN,
                    10000,
                    format!(
                        "Authentication error: this token may only read (D1 Read), and this statement writes: {sql}"
                    ),
                ),
                S::Superseded { .. } => ApiError::unavailable(sql.to_string()),
                S::Overloaded => {
                    ApiError::new(StatusCode::TOO_MANY_REQUESTS, 7500, "D1 DB is overloaded. Too many requests queued.")
                }
                S::Reopening => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, 7500, S::Reopening.to_string()),
                S::Closed => ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    7500,
                    "D1 DB is closing or was deleted while the request waited; retry the operation",
                ),
                other => ApiError::internal(&other),
            },
            other => ApiError::internal(&other),
        }
    }
}

impl From<kura_catalog::Error> for ApiError {
    fn from(e: kura_catalog::Error) -> Self {
        match e {
            kura_catalog::Error::Invalid(m) => ApiError::bad_request(m),
            kura_catalog::Error::Replication(e) => ApiError::unavailable(e.to_string()),
            other => ApiError::internal(&other),
        }
    }
}

impl From<R2Error> for ApiError {
    fn from(e: R2Error) -> Self {
        if let R2Error::Storage(detail) = &e {
            return ApiError::internal_text(detail);
        }
        ApiError::new(r2_status(&e), r2_v4_code(&e), e.to_string())
    }
}

impl From<BucketError> for ApiError {
    fn from(e: BucketError) -> Self {
        match e {
            BucketError::InvalidName(m) => ApiError::new(StatusCode::BAD_REQUEST, 10005, m),
            BucketError::Exists => ApiError::new(StatusCode::CONFLICT, 10004, e.to_string()),
            BucketError::NotFound => R2Error::NoSuchBucket.into(),
            BucketError::Catalog(e) => ApiError::internal(&e),
            BucketError::Engine(e) => e.into(),
        }
    }
}

impl From<DoError> for ApiError {
    fn from(e: DoError) -> Self {
        let (status, code) = match &e {
            DoError::Id(_) => (StatusCode::BAD_REQUEST, 10011),
            DoError::Sql { .. } => (StatusCode::BAD_REQUEST, 10021),
            DoError::Invalid(_) => (StatusCode::BAD_REQUEST, 10022),
            DoError::InvalidBookmark(_) => (StatusCode::BAD_REQUEST, 10023),
            DoError::Reset(_) => (StatusCode::BAD_REQUEST, 10024),
            DoError::ReadOnly { .. } => (StatusCode::FORBIDDEN, 10000),
            DoError::Overloaded => (StatusCode::TOO_MANY_REQUESTS, 10025),
            DoError::Closed => (StatusCode::SERVICE_UNAVAILABLE, 10026),
            DoError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, 10026),
            DoError::InsufficientStorage => return ApiError::insufficient_storage(),
            _ => return ApiError::internal(&e),
        };
        ApiError::new(status, code, e.to_string())
    }
}

impl From<WorkersError> for ApiError {
    fn from(e: WorkersError) -> Self {
        match e {
            WorkersError::InvalidUpload(m)
            | WorkersError::ScriptRejected(m)
            | WorkersError::InvalidCron(m)
            | WorkersError::InvalidTail(m)
            | WorkersError::InvalidAssets(m) => ApiError::new(StatusCode::BAD_REQUEST, 10021, m),
            WorkersError::MissingTarget { code, message } => ApiError::new(StatusCode::BAD_REQUEST, code, message),
            WorkersError::ScriptNotFound => ApiError::new(StatusCode::NOT_FOUND, 10007, e.to_string()),
            WorkersError::Unavailable(m) => ApiError::unavailable(m),
            WorkersError::NotFound(m) => ApiError::new(StatusCode::NOT_FOUND, 10007, m),
            WorkersError::MigrationConflict(m) => ApiError::new(StatusCode::BAD_REQUEST, 10079, m),
            WorkersError::NoWorkerd { .. } => ApiError::new(StatusCode::BAD_REQUEST, 10021, e.to_string()),
            WorkersError::Catalog(e) => e.into(),
            other => ApiError::internal(&other),
        }
    }
}

impl From<KvError> for ApiError {
    fn from(e: KvError) -> Self {
        match e {
            KvError::Storage(e) => e.into(),
            e => ApiError::new(kv_status(&e), kv_v4_code(&e), e.to_string()),
        }
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> Self {
        let status = queue_status(&e);
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            return ApiError::internal(&e);
        }
        ApiError::new(status, e.code(), e.to_string())
    }
}

/// The status Queues answers `e` with, on the v4 API and on the producer binding alike.
pub fn queue_status(e: &QueueError) -> StatusCode {
    match e {
        QueueError::NotFound => StatusCode::NOT_FOUND,
        QueueError::MessageTooLarge(_) | QueueError::BatchTooLarge(_) | QueueError::BatchCount(_) => {
            StatusCode::PAYLOAD_TOO_LARGE
        }
        QueueError::InvalidDelay(_) | QueueError::InvalidContentType(_) => StatusCode::BAD_REQUEST,
        QueueError::Storage(kura_sqlite::Error::Overloaded) => StatusCode::TOO_MANY_REQUESTS,
        QueueError::Storage(kura_sqlite::Error::Reopening) | QueueError::Unavailable(_) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The status Workers KV answers `e` with, on the v4 API and on the binding alike.
pub fn kv_status(e: &KvError) -> StatusCode {
    match e {
        KvError::NamespaceNotFound => StatusCode::NOT_FOUND,
        KvError::KeyTooLong(_) => StatusCode::URI_TOO_LONG,
        KvError::MetadataTooLarge(_) | KvError::ValueTooLarge(_) | KvError::BulkTooLarge => {
            StatusCode::PAYLOAD_TOO_LARGE
        }
        KvError::Storage(e) => r2_status(e),
        _ => StatusCode::BAD_REQUEST,
    }
}

/// Cloudflare's v4 code for `e`: KV's own where known (namespace not found, payload too large,
/// bad limit), 10012 ("malformed value") for the other refusals of bad input.
pub fn kv_v4_code(e: &KvError) -> u32 {
    match e {
        KvError::NamespaceNotFound => 10013,
        KvError::MetadataTooLarge(_) | KvError::ValueTooLarge(_) | KvError::BulkTooLarge => 10024,
        KvError::LimitTooSmall(_) | KvError::LimitTooLarge(_) => 10028,
        KvError::Storage(e) => r2_v4_code(e),
        _ => 10012,
    }
}

/// The status R2 answers `e` with (its S3 endpoint's, which the v4 API and the binding share).
pub fn r2_status(e: &R2Error) -> StatusCode {
    match e {
        R2Error::NoSuchBucket | R2Error::NoSuchKey | R2Error::NoSuchUpload => StatusCode::NOT_FOUND,
        R2Error::PreconditionFailed => StatusCode::PRECONDITION_FAILED,
        R2Error::NotModified => StatusCode::NOT_MODIFIED,
        R2Error::InvalidRange => StatusCode::RANGE_NOT_SATISFIABLE,
        R2Error::BucketNotEmpty => StatusCode::CONFLICT,
        R2Error::Busy | R2Error::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        R2Error::Storage(_) => StatusCode::INTERNAL_SERVER_ERROR,
        R2Error::InsufficientStorage => StatusCode::INSUFFICIENT_STORAGE,
        _ => StatusCode::BAD_REQUEST,
    }
}

/// Cloudflare's v4 code for `e` (the v4 API's, and the one the R2 binding carries).
pub fn r2_v4_code(e: &R2Error) -> u32 {
    match e {
        R2Error::NoSuchBucket => 10006,
        R2Error::NoSuchKey => 10007,
        R2Error::NoSuchUpload => 10024,
        R2Error::PreconditionFailed | R2Error::NotModified => 10031,
        R2Error::InvalidRange => 10039,
        R2Error::InvalidObjectName => 10020,
        R2Error::MetadataTooLarge => 10012,
        R2Error::EntityTooLarge => 100100,
        R2Error::EntityTooSmall => 10011,
        R2Error::BadDigest { .. } => 10037,
        R2Error::InvalidPart => 10025,
        R2Error::BadUpload => 10048,
        R2Error::BucketNotEmpty => 10008,
        R2Error::InvalidArgument(_) => 10029,
        R2Error::IncompleteBody(_) => 10013,
        R2Error::Busy => 10058,
        R2Error::Unavailable(_) => 10043,
        _ => 10001,
    }
}
