//! S3's errors as R2 answers them: the XML body (`<Error><Code/><Message/></Error>`, no
//! namespace, no request id), the error `s3s` renders for an operation, and the R2 engine's,
//! the catalog's and bucket management's errors as S3 codes.

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::Response;
use kura_r2::R2Error;
use s3s::{S3Error, S3ErrorCode};

/// Escapes text for XML as R2 does (`'` as `&apos;`).
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// An S3 error response in R2's shape.
pub fn xml_error(status: StatusCode, code: &str, message: &str) -> Response {
    xml_error_with(status, code, message, &[])
}

/// An S3 error response in R2's shape, with extra fields after the message.
pub fn xml_error_with(status: StatusCode, code: &str, message: &str, extra: &[(&str, String)]) -> Response {
    let fields: String = extra.iter().map(|(name, value)| format!("<{name}>{}</{name}>", escape(value))).collect();
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{}</Code><Message>{}</Message>{fields}</Error>",
        escape(code),
        escape(message)
    );
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/xml")
        .body(Body::from(body))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// The error `s3s` answers an operation with, in R2's XML shape.
pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> S3Error {
    let mut e =
        S3Error::with_message(code.parse::<S3ErrorCode>().unwrap_or(S3ErrorCode::InternalError), message.into());
    e.set_status_code(status);
    e
}

/// The R2 engine's error as S3 answers it.
pub fn engine_error(e: R2Error) -> S3Error {
    error(super::r2_status(&e), r2_code(&e), e.to_string())
}

/// A catalog failure during a bucket operation, as S3 answers it.
pub fn catalog_error(e: kura_catalog::Error) -> S3Error {
    match e {
        kura_catalog::Error::Invalid(m) => error(StatusCode::BAD_REQUEST, "InvalidBucketName", m),
        kura_catalog::Error::Duplicate { .. } => {
            error(StatusCode::CONFLICT, "BucketAlreadyExists", "The requested bucket name is not available.")
        }
        other if kura_sqlite::is_disk_full(&other) => engine_error(R2Error::storage("catalog", other)),
        other => {
            tracing::error!(error = %other, "catalog failure");
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "We encountered an internal error. Please try again.",
            )
        }
    }
}

/// Creating or deleting a bucket failed, as S3 answers it.
pub fn bucket_error(e: crate::buckets::BucketError) -> S3Error {
    use crate::buckets::BucketError as B;
    match e {
        B::InvalidName(m) => error(StatusCode::BAD_REQUEST, "InvalidBucketName", m),
        B::Exists => error(
            StatusCode::CONFLICT,
            "BucketAlreadyOwnedByYou",
            "The bucket you tried to create already exists, and you own it.",
        ),
        B::NotFound => engine_error(R2Error::NoSuchBucket),
        B::Catalog(e) => catalog_error(e),
        B::Engine(e) => engine_error(e),
    }
}

/// S3's error code for `e`.
pub fn r2_code(e: &R2Error) -> &'static str {
    match e {
        R2Error::NoSuchBucket => "NoSuchBucket",
        R2Error::NoSuchKey => "NoSuchKey",
        R2Error::NoSuchUpload => "NoSuchUpload",
        R2Error::PreconditionFailed => "PreconditionFailed",
        R2Error::NotModified => "NotModified",
        R2Error::InvalidRange => "InvalidRange",
        R2Error::InvalidObjectName => "InvalidObjectName",
        R2Error::MetadataTooLarge => "MetadataTooLarge",
        R2Error::EntityTooLarge => "EntityTooLarge",
        R2Error::EntityTooSmall => "EntityTooSmall",
        R2Error::BadDigest { .. } => "BadDigest",
        R2Error::InvalidPart | R2Error::BadUpload => "InvalidPart",
        R2Error::BucketNotEmpty => "BucketNotEmpty",
        R2Error::InvalidArgument(_) => "InvalidArgument",
        R2Error::IncompleteBody(_) => "IncompleteBody",
        R2Error::Busy => "SlowDown",
        R2Error::Unavailable(_) => "ServiceUnavailable",
        R2Error::InsufficientStorage => "InsufficientStorage",
        _ => "InternalError",
    }
}
