//! How hyper calls a listener's application ([`Served`]): the peer's address (axum's
//! `ConnectInfo`), each body's stall limit, and for
//! requests sent with `Expect: 100-continue` whose body was never asked for, an answer that
//! closes the connection, because the server cannot know whether the body will follow.
//!
//! hyper sends `100 Continue` when a handler first reads the body. A handler that refuses
//! first (an unknown upload, a bad token) answers without it, and the client may then send
//! the body anyway (botocore does once it has waited a second) or not at all (botocore does
//! when the answer came first). Kept alive, the connection would take the first bytes of the
//! client's next request for the unsent body: botocore's next request then arrived as
//! `OST /…` and failed its signature check. `Connection: close` ends that doubt: the client
//! opens a new connection for its next request.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{HeaderValue, Request, header};
use axum::response::Response;
use bytes::Bytes;
use futures_util::future::{BoxFuture, Either};
use http_body::{Frame, SizeHint};

use crate::stall::StallLimited;

/// A listener's application as hyper calls it: each request's body limited in how long it may
/// stall ([`StallLimited`]), and the answer marked `Connection: close` when the request
/// expected `100 Continue` and its body was never read. Only those requests pay for more than
/// the application's own future.
#[derive(Clone)]
pub struct Served<S> {
    /// The application.
    pub app: S,
    /// Who connected.
    pub peer: std::net::SocketAddr,
}

impl<S> tower::Service<Request<hyper::body::Incoming>> for Served<S>
where
    S: tower::Service<Request<Body>, Response = Response, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<S::Future, BoxFuture<'static, Result<Response, Infallible>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.app.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<hyper::body::Incoming>) -> Self::Future {
        request.extensions_mut().insert(axum::extract::ConnectInfo(self.peer));
        let expects_continue =
            request.headers().get(header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        if !expects_continue {
            return Either::Left(self.app.call(request.map(|body| Body::new(StallLimited::new(body)))));
        }
        let asked = Arc::new(AtomicBool::new(false));
        let body = |body| Body::new(Asked { inner: StallLimited::new(body), asked: Arc::clone(&asked) });
        let answer = self.app.call(request.map(body));
        Either::Right(Box::pin(async move {
            let mut response = answer.await?;
            if !asked.load(Ordering::Acquire) {
                response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(response)
        }))
    }
}

/// A body that records its first read (when hyper sends `100 Continue`).
struct Asked<B> {
    inner: B,
    asked: Arc<AtomicBool>,
}

impl<B: http_body::Body<Data = Bytes> + Unpin> http_body::Body for Asked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
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
