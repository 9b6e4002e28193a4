//! The binding protocols' failures: D1's `{success: false, error}` (workerd's shim reads only
//! `error`), R2's `cf-r2-error` header carrying R2's v4 code, which workerd turns into the
//! exception (or the `null`) a Worker sees, and KV's status line, whose reason phrase is the
//! message workerd shows (`KV PUT failed: 413 Value length of … exceeds limit of 26214400.`).

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kura_r2::R2Error;

use super::ApiError;

/// The header an R2 binding's failure travels in.
pub const R2_ERROR_HEADER: &str = "cf-r2-error";

/// `error` as the D1 binding answers it. The status is the v4 API's for the same error (a SQL
/// error is a 400, where Miniflare answers 500): the shim reads only `error`, and a user's bad
/// SQL is not a server fault.
pub fn d1_error(error: &ApiError) -> Response {
    let body = serde_json::json!({ "success": false, "error": error.message() });
    (error.status(), axum::Json(body)).into_response()
}

/// An R2 binding failure with no body: the status, and `cf-r2-error` naming the code.
pub fn r2_error(status: StatusCode, code: u32, message: &str) -> Response {
    let mut response = status.into_response();
    mark_r2_error(&mut response, code, message);
    response
}

/// Adds `cf-r2-error` to `response` (which may carry an object, for a failed precondition).
pub fn mark_r2_error(response: &mut Response, code: u32, message: &str) {
    let error = serde_json::json!({"version": 1, "v4code": code, "message": message}).to_string();
    if let Ok(value) = HeaderValue::from_bytes(error.as_bytes()) {
        response.headers_mut().insert(R2_ERROR_HEADER, value);
    }
}

/// The status, code and message the R2 binding answers `e` with: the S3 endpoint's status
/// (but a validator's "not modified" is a failed precondition to a Worker), R2's v4 code, and
/// the message with every digest in hex.
pub fn r2_binding_failure(e: &R2Error) -> (StatusCode, u32, String) {
    let status = match e {
        R2Error::NotModified => StatusCode::PRECONDITION_FAILED,
        other => super::r2_status(other),
    };
    (status, super::r2_v4_code(e), e.binding_message())
}

/// A KV binding failure: the status, with the message as its reason phrase and as its body.
pub fn kv_error(e: &kura_kv::KvError) -> Response {
    let (status, message) = match e {
        // A namespace deleted since the deploy: not a missing key (404 is `null` to workerd).
        kura_kv::KvError::NamespaceNotFound => (StatusCode::BAD_REQUEST, e.to_string()),
        kura_kv::KvError::Storage(R2Error::Storage(detail)) => {
            let api = ApiError::internal_text(detail);
            (api.status(), api.message().to_owned())
        }
        kura_kv::KvError::Storage(inner) => (super::engines::r2_status(inner), inner.to_string()),
        _ => (super::engines::kv_status(e), e.to_string()),
    };
    status_line_failure(status, &message)
}

/// A binding failure whose message travels in the status line (KV's, and queue producers'
/// without `queue_expose_error_codes`), at most 512 characters, as Miniflare's.
pub fn status_line_failure(status: StatusCode, message: &str) -> Response {
    let message: String = message.chars().take(512).collect();
    let mut response = (status, message.clone()).into_response();
    // A reason phrase may hold visible ASCII, spaces and tabs only.
    let phrase: String = message.chars().map(|c| if c == '\t' || (' '..='~').contains(&c) { c } else { '?' }).collect();
    if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(phrase.into_bytes()) {
        response.extensions_mut().insert(phrase);
    }
    response
}
