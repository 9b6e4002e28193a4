//! R2 on several nodes: bodies live in a store every node reaches ([`BlobStore`], which the
//! cluster layer implements over an S3-compatible object store), and each bucket's metadata
//! file has one owner node, placed by a [`Placement`] that ships its every commit before it is
//! acknowledged. Blob first, row last still holds: a body is whole in the store before the row
//! naming it commits (and ships).

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;
use futures_util::stream::BoxStream;
use kura_sqlite::Placement;

/// Where bodies live when several nodes serve the same buckets. Names are composed by the
/// engine from ids it made (`blobs/<bucket id>/<blob id>`), never from user input, and each is
/// written once.
#[async_trait::async_trait]
pub trait BlobStore: Send + Sync + fmt::Debug + 'static {
    /// Starts writing a new object `name`; it exists only once [`BlobWriter::finish`] returns.
    async fn create(&self, name: &str) -> io::Result<Box<dyn BlobWriter>>;
    /// Streams `length` bytes of `name` from `offset`.
    async fn read(&self, name: &str, offset: u64, length: u64) -> io::Result<BoxStream<'static, io::Result<Bytes>>>;
    /// Removes an object; a missing one is not an error.
    async fn delete(&self, name: &str) -> io::Result<()>;
    /// The names of every object under `prefix` (a folder, ending with `/`).
    async fn list(&self, prefix: &str) -> io::Result<Vec<String>>;
}

/// A new object being written to a [`BlobStore`].
#[async_trait::async_trait]
pub trait BlobWriter: Send {
    /// Appends bytes.
    async fn write(&mut self, chunk: Bytes) -> io::Result<()>;
    /// Makes the object whole and durable in the store.
    async fn finish(self: Box<Self>) -> io::Result<()>;
    /// Gives the object up (a failed or refused upload): nothing is left under its name.
    async fn abort(self: Box<Self>);
}

/// How the engine runs as one node of several.
#[derive(Clone)]
pub struct Shared {
    /// Which node owns each bucket's metadata file.
    pub placement: Arc<dyn Placement>,
    /// Where bodies live.
    pub blobs: Arc<dyn BlobStore>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared").field("placement", &self.placement).field("blobs", &self.blobs).finish()
    }
}

/// An object body from any stream of bytes (in a cluster, another node's answer).
pub fn byte_stream(stream: impl Stream<Item = io::Result<Bytes>> + Send + 'static) -> crate::ByteStream {
    Box::pin(SyncStream::new(Box::pin(stream)))
}

/// A stream that is `Sync` because only its owner ever polls it (`Mutex::get_mut` takes no
/// lock): what a store's `Send`-only stream needs to become an object body.
pub(crate) struct SyncStream<S>(std::sync::Mutex<S>);

impl<S> SyncStream<S> {
    pub(crate) fn new(inner: S) -> Self {
        SyncStream(std::sync::Mutex::new(inner))
    }
}

impl<S: Stream + Unpin> Stream for SyncStream<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let inner = self.get_mut().0.get_mut().unwrap_or_else(|p| p.into_inner());
        Pin::new(inner).poll_next(cx)
    }
}
