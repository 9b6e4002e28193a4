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
            crate::error::s3::xml_error(StatusCode::BAD_REQUEST, "IncompleteBody", "The request body ended early.")
        })?;
        bytes.extend_from_slice(&chunk);
        if bytes.len() > UNSIZED_BODY_MAX {
            drop((bytes, held));
            return Err(refuse_past_bound(body).await);
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

/// How much more of an unsized body past its bound is read and thrown away before the refusal,
/// and for how long at most.
const DISCARDED_PAST_BOUND: usize = 4 * UNSIZED_BODY_MAX;
const DISCARDING_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// The refusal of an unsized body past its bound, answered once the client has sent the rest
/// (within a bound): a client that writes its whole body before reading the answer (Node's
/// fetch does) would otherwise find the connection closed mid-write and never see the 411.
async fn refuse_past_bound(mut rest: axum::body::BodyDataStream) -> Response {
    let mut refusal = crate::error::s3::xml_error(
        StatusCode::LENGTH_REQUIRED,
        "MissingContentLength",
        &format!(
            "A body sent without Content-Length may hold at most {} MiB; send its length, or use a multipart upload.",
            UNSIZED_BODY_MAX >> 20
        ),
    );
    let discard = async {
        let mut discarded = 0;
        loop {
            match futures_util::StreamExt::next(&mut rest).await {
                None => return true,
                Some(Ok(chunk)) => discarded += chunk.len(),
                Some(Err(_)) => return false,
            }
            if discarded > DISCARDED_PAST_BOUND {
                return false;
            }
        }
    };
    let whole = tokio::time::timeout(DISCARDING_FOR, discard).await.unwrap_or(false);
    if !whole {
        refusal.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    refusal
}

fn busy() -> Response {
    let mut refusal =
        crate::error::s3::xml_error(StatusCode::SERVICE_UNAVAILABLE, "SlowDown", "Please reduce your request rate.");
    refusal.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    refusal
}
