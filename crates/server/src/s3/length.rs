//! Bodies sent without a length (`Transfer-Encoding: chunked`, no `Content-Length`): SigV4
//! and the engine need the length before the first byte is stored, so such a body is read
//! whole first, within a bound per request and a bound for all such requests at once.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use tokio::sync::{Semaphore, SemaphorePermit};

/// The most one unsized body may hold; larger uploads send a length (or use a multipart upload).
pub(super) const UNSIZED_BODY_MAX: usize = 16 << 20;

/// The most all unsized bodies read at once may hold, in units of [`UNIT`] bytes.
const UNSIZED_UNITS: usize = 256;
const UNIT: usize = 1 << 20;

static READING: Semaphore = Semaphore::const_new(UNSIZED_UNITS);

/// Whether `request` carries a body whose length it does not say.
fn needs_length(request: &Request) -> bool {
    let headers = request.headers();
    (request.method() == Method::PUT || request.method() == Method::POST)
        && !headers.contains_key(header::CONTENT_LENGTH)
        && !headers.contains_key("x-amz-decoded-content-length")
        && headers.contains_key(header::TRANSFER_ENCODING)
}

/// `request` with a known length: as it came, or with its unsized body read whole (and the
/// permit that bounds the memory held, to keep until the request is answered).
pub(super) async fn with_length(request: Request) -> Result<(Request, Option<SemaphorePermit<'static>>), Response> {
    if !needs_length(&request) {
        return Ok((request, None));
    }
    let (mut parts, body) = request.into_parts();
    let mut body = body.into_data_stream();
    let mut bytes = Vec::new();
    let mut held: Option<SemaphorePermit<'static>> = None;
    while let Some(chunk) = futures_util::StreamExt::next(&mut body).await {
        let chunk = chunk.map_err(|_| {
            super::xml::error(StatusCode::BAD_REQUEST, "IncompleteBody", "The request body ended early.")
        })?;
        bytes.extend_from_slice(&chunk);
        if bytes.len() > UNSIZED_BODY_MAX {
            return Err(super::xml::error(
                StatusCode::LENGTH_REQUIRED,
                "MissingContentLength",
                &format!(
                    "A body sent without Content-Length may hold at most {} MiB; send its length, or use a multipart upload.",
                    UNSIZED_BODY_MAX >> 20
                ),
            ));
        }
        let units = bytes.len().div_ceil(UNIT);
        let have = held.as_ref().map_or(0, SemaphorePermit::num_permits);
        if units > have {
            let more = READING.try_acquire_many((units - have) as u32).map_err(|_| busy())?;
            match held.as_mut() {
                Some(permit) => permit.merge(more),
                None => held = Some(more),
            }
        }
    }
    parts.headers.remove(header::TRANSFER_ENCODING);
    parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    Ok((Request::from_parts(parts, Body::from(bytes)), held))
}

fn busy() -> Response {
    let mut refusal =
        super::xml::error(StatusCode::SERVICE_UNAVAILABLE, "SlowDown", "Please reduce your request rate.");
    refusal.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    refusal
}
