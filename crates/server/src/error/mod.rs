//! The one place where a failure becomes its wire form. Handlers return [`ApiError`] (or an
//! engine's error, converted here); each protocol renders it in its own shape:
//!
//! - the v4 API's envelope, `{result: null, success: false, errors: [{code, message}]}`, and
//!   its success twin ([`ok`], [`ok_paged`]);
//! - [`engines`]: every engine's error as a status, a Cloudflare code and a message;
//! - [`s3`]: S3's XML errors with R2's codes, and the R2 engine's errors as S3 answers them;
//! - [`binding`]: the D1 binding's `{success: false, error}` and the R2 binding's `cf-r2-error`;
//! - [`Wire`]: a refusal made before any handler ran (the cluster's placement) in the shape of
//!   the protocol the request speaks.

pub mod binding;
mod engines;
pub mod s3;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

pub use engines::{queue_status, r2_status, r2_v4_code};

use kura_client::v4::Envelope;
pub use kura_client::v4::ResultInfo;

/// Wraps a result in the success envelope.
pub fn ok<T: Serialize>(result: T) -> Response {
    json_response(&Envelope::success(result))
}

/// Wraps a page of results in the success envelope.
pub fn ok_paged<T: Serialize>(result: T, info: ResultInfo) -> Response {
    json_response(&Envelope::paged(result, info))
}

/// A JSON answer, written into a buffer sized for a typical envelope (`axum::Json` starts at
/// 128 bytes and reallocates its way up, several times for a D1 result's `meta`).
pub(crate) fn json_response(value: &impl Serialize) -> Response {
    let mut body = Vec::with_capacity(512);
    match serde_json::to_writer(&mut body, value) {
        Ok(()) => ([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// An error in Cloudflare's envelope: `{result: null, success: false, errors: [{code, message}]}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: u32,
    message: String,
}

impl ApiError {
    /// An error with an explicit status, Cloudflare code and message.
    pub fn new(status: StatusCode, code: u32, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into() }
    }

    /// A route that exists, asked with a method it does not serve.
    pub fn method_not_allowed() -> Self {
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, 7001, "Method not allowed for this URI")
    }

    /// A malformed request (D1's code 7400).
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, 7400, message)
    }

    /// No credentials at all.
    pub fn missing_credentials() -> Self {
        ApiError::new(StatusCode::UNAUTHORIZED, 9106, "Missing X-Auth-Key, X-Auth-Email or Authorization headers")
    }

    /// An Authorization header that is not `Bearer <token>`.
    pub fn malformed_credentials() -> Self {
        ApiError::new(StatusCode::UNAUTHORIZED, 6111, "Invalid format for Authorization header")
    }

    /// A token that is unknown or revoked.
    pub fn invalid_token() -> Self {
        ApiError::new(StatusCode::UNAUTHORIZED, 10000, "Authentication error")
    }

    /// A path no route serves (Cloudflare's 7003).
    pub fn no_route() -> Self {
        ApiError::new(StatusCode::NOT_FOUND, 7003, "No route for that URI")
    }

    /// A valid token that may not do this (another account, or too narrow a scope).
    pub fn forbidden() -> Self {
        ApiError::new(StatusCode::FORBIDDEN, 10000, "Authentication error")
    }

    /// A failure that is kura's fault: logged in full, answered with a reference.
    /// A full disk (by the error's type, [`kura_sqlite::is_disk_full`]) is answered as such.
    pub fn internal(error: &(dyn std::error::Error + 'static)) -> Self {
        if kura_sqlite::is_disk_full(error) {
            tracing::error!(error = %error, "internal error");
            return ApiError::insufficient_storage();
        }
        ApiError::internal_text(error)
    }

    /// A failure that is kura's fault, known only by its description (never a full disk).
    pub fn internal_text(error: &dyn std::fmt::Display) -> Self {
        let reference = format!("{:016x}", jiff::Timestamp::now().as_nanosecond() as u64);
        tracing::error!(reference, error = %error, "internal error");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, 7500, format!("internal error; reference = {reference}"))
    }

    /// The server's disk is full: nothing was changed, and writes succeed again once space is
    /// freed (no restart needed).
    pub fn insufficient_storage() -> Self {
        ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            7500,
            "Insufficient storage: the server's disk is full; nothing was changed. Free some space and retry.",
        )
    }

    /// A cluster that cannot serve this right now (an owner being replaced, the coordinator or
    /// the store out of reach): worth retrying in a moment.
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, 7500, message)
    }

    /// The status this error is answered with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Cloudflare's code for it.
    pub fn code(&self) -> u32 {
        self.code
    }

    /// The message, as the envelope carries it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status;
        let mut response = json_response(&Envelope::<()>::failure(self.code, self.message));
        *response.status_mut() = status;
        response
    }
}

/// The protocol a request speaks, so that a refusal made before its handler ran (by the
/// cluster's placement) reads as that protocol's own errors do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// Cloudflare's v4 envelope.
    V4,
    /// The D1 binding's `{success, error}`.
    D1Binding,
    /// S3's XML error.
    S3,
    /// The R2 binding's `cf-r2-error` header.
    R2Binding,
    /// KV's and queue producers' bindings: the message as the status line's reason phrase,
    /// which workerd shows in the exception.
    StatusLine,
}

impl Wire {
    /// `error` in this protocol's shape.
    pub fn refuse(self, error: ApiError) -> Response {
        match self {
            Wire::V4 => error.into_response(),
            Wire::D1Binding => binding::d1_error(&error),
            Wire::S3 => {
                let code = match error.status() {
                    StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailable",
                    StatusCode::NOT_IMPLEMENTED => "NotImplemented",
                    _ => "InternalError",
                };
                s3::xml_error(error.status(), code, error.message())
            }
            Wire::R2Binding => binding::r2_error(error.status(), error.code(), error.message()),
            Wire::StatusLine => binding::status_line_failure(error.status(), error.message()),
        }
    }
}
