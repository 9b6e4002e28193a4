//! Requests sent with `Expect: 100-continue` whose body was never asked for: their answer
//! closes the connection, because the server cannot know whether the body will follow.
//!
//! hyper sends `100 Continue` when a handler first reads the body. A handler that refuses
//! first (an unknown upload, a bad token) answers without it, and the client may then send
//! the body anyway (botocore does once it has waited a second) or not at all (botocore does
//! when the answer came first). Kept alive, the connection would take the first bytes of the
//! client's next request for the unsent body: botocore's next request then arrived as
//! `OST /…` and failed its signature check. `Connection: close` ends that doubt: the client
//! opens a new connection for its next request.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Frame, SizeHint};

/// The middleware: marks the answer `Connection: close` when the request expected
/// `100 Continue` and its body was never read.
pub async fn close_if_body_never_asked(request: Request, next: Next) -> Response {
    let expects_continue =
        request.headers().get(header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if !expects_continue {
        return next.run(request).await;
    }
    let asked = Arc::new(AtomicBool::new(false));
    let request = request.map(|body| Body::new(Asked { inner: body, asked: Arc::clone(&asked) }));
    let mut response = next.run(request).await;
    if !asked.load(Ordering::Acquire) {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A body that records its first read (when hyper sends `100 Continue`).
struct Asked {
    inner: Body,
    asked: Arc<AtomicBool>,
}

impl http_body::Body for Asked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.asked.store(true, Ordering::Release);
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
