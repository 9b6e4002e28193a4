//! Extractors whose rejections come out in the v4 envelope instead of axum's plain text.

use std::collections::HashMap;

use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::ApiError;

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

/// The whole body, within the server's body limit.
pub struct V4Body(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for V4Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(V4Body(bytes)),
            Err(BytesRejection::FailedToBufferBody(e)) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    7400,
                    "The request body is larger than this server accepts",
                ))
            }
            Err(e) => Err(ApiError::bad_request(format!("The request body could not be read: {}", e.body_text()))),
        }
    }
}
