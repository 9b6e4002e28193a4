//! Request bodies that stop arriving: a body on which no byte has arrived for
//! [`BODY_IDLE_TIMEOUT`] while its handler waits for it fails, so a client that sends its
//! headers and then trickles (or never sends) its body holds a connection and a request no
//! longer than that, as the header timeout bounds a client that trickles its headers.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// How long a handler waits for the next bytes of a request body.
pub const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(20);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body with [`BODY_IDLE_TIMEOUT`] between its frames. The clock runs only while
/// the handler waits: a handler busy elsewhere (writing what it read) never makes it fire.
pub struct StallLimited<B> {
    inner: B,
    /// Armed when a read finds nothing ready; disarmed by the next frame.
    waiting: Option<Pin<Box<Sleep>>>,
}

impl<B> StallLimited<B> {
    pub fn new(inner: B) -> Self {
        StallLimited { inner, waiting: None }
    }
}

impl<B> Body for StallLimited<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.waiting = None;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let waiting = this
                    .waiting
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + BODY_IDLE_TIMEOUT)));
                match waiting.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                        "no byte of the request body arrived for {} s",
                        BODY_IDLE_TIMEOUT.as_secs()
                    )
                    .into()))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
