//! Reading requests: extractors whose rejections come out in the v4 envelope instead of
//! axum's plain text, bodies within the server's limit, JSON bodies and query numbers.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{FromRequestParts, Path, Query};
use axum::http::StatusCode;
use axum::http::request::Parts;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// Path parameters.
pub struct V4Path<T>(pub T);

impl<T, S> FromRequestParts<S> for V4Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(V4Path(value)),
            Err(e) => Err(ApiError::bad_request(format!("The request is malformed: {}", e.body_text()))),
        }
    }
}

/// The query string as name → value.
pub struct V4Query(pub HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for V4Query {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Query::<HashMap<String, String>>::from_request_parts(parts, state).await {
            Ok(Query(map)) => Ok(V4Query(map)),
            Err(e) => Err(ApiError::bad_request(format!("The request is malformed: {}", e.body_text()))),
        }
    }
}

/// Reads a whole request body, within the server's limit. Handlers call it after checking the
/// caller, so nobody without access to the account makes the server buffer a large body.
pub async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, crate::state::MAX_BODY_BYTES).await.map_err(|e| {
        let too_large = std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if too_large {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                7400,
                format!("The request body is larger than {} MB", crate::state::MAX_BODY_BYTES / (1024 * 1024)),
            )
        } else {
            ApiError::bad_request(format!("The request body could not be read: {e}"))
        }
    })
}

/// Reads and throws away what is left of a request body a handler refused after it began
/// (up to `limit` bytes; a larger rest is left for the connection's close). A client writing its
/// body while the answer comes would otherwise find the connection reset under it, and report
/// that instead of the answer.
pub async fn discard_rest<S, E>(body: &mut S, limit: u64)
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
{
    use futures_util::StreamExt as _;
    let mut seen = 0u64;
    while seen <= limit {
        match body.next().await {
            Some(Ok(chunk)) => seen += chunk.len() as u64,
            Some(Err(_)) | None => return,
        }
    }
}

/// Parses a JSON body; anything malformed is a 400 with serde's explanation.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("The request is malformed: the body must be a JSON object"));
    }
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("The request is malformed: {e}")))
}

/// Reads an optional positive integer from the query string.
pub fn query_number(query: &HashMap<String, String>, name: &str) -> Result<Option<u64>, ApiError> {
    match query.get(name) {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => v.parse::<u64>().map(Some).map_err(|_| {
            ApiError::bad_request(format!("Invalid query parameter {name}: expected a positive integer, got '{v}'"))
        }),
    }
}
