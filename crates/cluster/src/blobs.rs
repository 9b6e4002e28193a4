//! R2's bodies in the shared store: the [`kura_r2::BlobStore`] of a cluster node, over the
//! same [`Storage`] the history and the coordinator use.

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use kura_r2::{BlobStore, BlobWriter};

use crate::storage::{ObjectWriter, SharedStorage, StorageError};

/// The shared store, as R2's engine writes and reads bodies in it.
#[derive(Debug, Clone)]
pub struct StoreBlobs {
    storage: SharedStorage,
}

impl StoreBlobs {
    /// Bodies in `storage`.
    pub fn new(storage: SharedStorage) -> Arc<Self> {
        Arc::new(StoreBlobs { storage })
    }
}

fn io_error(e: StorageError) -> io::Error {
    match e {
        StorageError::NotFound { .. } => io::Error::new(io::ErrorKind::NotFound, e.to_string()),
        StorageError::Io { source, .. } => source,
        other => io::Error::other(other.to_string()),
    }
}

struct Writer(Box<dyn ObjectWriter>);

#[async_trait::async_trait]
impl BlobWriter for Writer {
    async fn write(&mut self, chunk: Bytes) -> io::Result<()> {
        self.0.write(chunk).await.map_err(io_error)
    }

    async fn finish(self: Box<Self>) -> io::Result<()> {
        self.0.finish().await.map_err(io_error)
    }

    async fn abort(self: Box<Self>) {
        self.0.abort().await
    }
}

#[async_trait::async_trait]
impl BlobStore for StoreBlobs {
    async fn create(&self, name: &str) -> io::Result<Box<dyn BlobWriter>> {
        Ok(Box::new(Writer(self.storage.writer(name).await.map_err(io_error)?)))
    }

    async fn read(&self, name: &str, offset: u64, length: u64) -> io::Result<BoxStream<'static, io::Result<Bytes>>> {
        let stream = self.storage.read(name, offset..offset + length).await.map_err(io_error)?;
        Ok(stream.map_err(io_error).boxed())
    }

    async fn delete(&self, name: &str) -> io::Result<()> {
        self.storage.delete(name).await.map_err(io_error)
    }

    async fn list(&self, prefix: &str) -> io::Result<Vec<String>> {
        Ok(self.storage.list(prefix).await.map_err(io_error)?.into_iter().map(|info| info.name).collect())
    }
}
