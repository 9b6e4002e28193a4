//! The binding protocols' failures: D1's `{success: false, error}` (workerd's shim reads only
//! `error`), and R2's `cf-r2-error` header carrying R2's v4 code, which workerd turns into the
//! exception (or the `null`) a Worker sees.

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
