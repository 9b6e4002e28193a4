//! The blob store: immutable blobs named by random ids, written and synced before any row
//! points at them, removed only after the row that pointed at them is gone, and never while a
//! read holds them. Alone, a blob is a file under the bucket's directory; in a cluster, an
//! object in the shared store ([`BlobStore`]).

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::error::{R2Error, Result};
use crate::object::{Digester, ExpectedDigests};
use crate::shared::{BlobStore, BlobWriter, SyncStream};

/// Bytes gathered before each write to the file.
const WRITE_CHUNK: usize = 1 << 20;
/// Bytes per chunk handed to a reader.
const READ_CHUNK: usize = 256 * 1024;

/// A fresh random id: 32 hex characters.
pub(crate) fn new_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the operating system's random source failed");
    hex::encode(bytes)
}

/// The directory a local blob `id` of the bucket in `bucket_dir` lies in (its id's first two
/// characters shard the bucket's blobs).
pub(crate) fn shard_dir(bucket_dir: &Path, id: &str) -> PathBuf {
    bucket_dir.join("blobs").join(&id[..2])
}

/// Blob ids are only ever kura's own hex ids; anything else is refused before it reaches a path.
pub(crate) fn is_blob_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

#[derive(Default)]
struct Leases {
    readers: HashMap<String, usize>,
    /// Blobs whose row is gone but a reader still streams them.
    doomed: HashSet<String>,
}

/// The blobs of every bucket under one root (`<data>/r2`), or in a shared store.
pub(crate) struct Blobs {
    root: PathBuf,
    /// In a cluster, where the blobs are (the root then holds only metadata files).
    shared: Option<Arc<dyn BlobStore>>,
    /// Blobs being written whose row has not committed yet: the sweep leaves them alone.
    pending: Mutex<HashSet<String>>,
    /// Body bytes received (inline ones included) and sent, since the engine started.
    pub(crate) received: AtomicU64,
    pub(crate) sent: AtomicU64,
    leases: Mutex<Leases>,
}

/// What a body to receive must be and where it may go.
#[derive(Clone, Copy)]
pub(crate) struct Expected<'a> {
    /// Its length, when the client declared it: met exactly.
    pub size: Option<u64>,
    /// The most bytes accepted.
    pub max_size: u64,
    /// Bodies up to this size stay in memory (for their row); `None` always makes a blob.
    pub inline_max: Option<usize>,
    /// Digests the bytes must match.
    pub digests: &'a ExpectedDigests,
}

/// Where a received body is.
pub(crate) enum Stored {
    /// Small enough to live in its row.
    Inline(Bytes),
    /// In a synced blob file, not yet named by a row.
    Blob(PendingBlob),
}

/// A received body: where it is, its size and its digests.
pub(crate) struct Received {
    pub stored: Stored,
    pub size: u64,
    pub md5: [u8; 16],
    pub checksums: std::collections::BTreeMap<String, String>,
}

/// Keeps a blob out of the sweep until its row commits or the write is abandoned (then the
/// file is removed).
pub(crate) struct PendingBlob {
    blobs: Arc<Blobs>,
    bucket: String,
    id: String,
    committed: bool,
}

impl PendingBlob {
    /// The write's outcome is unknown (its commit failed midway): the file stays, and the sweep
    /// removes it if no row names it.
    pub(crate) fn abandon(mut self) {
        self.committed = true;
    }

    /// The blob's id.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The row now points at the blob: it is no longer ours to remove.
    pub(crate) fn committed(mut self) {
        self.committed = true;
    }
}

impl Drop for PendingBlob {
    fn drop(&mut self) {
        if !self.committed {
            self.blobs.unlink(&self.bucket, &self.id);
        }
        self.blobs.lock_pending().remove(&self.id);
    }
}

/// Read access to some blobs: while it lives, none of them is removed.
pub(crate) struct Lease {
    blobs: Arc<Blobs>,
    bucket: String,
    ids: Vec<String>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut unlink = Vec::new();
        {
            let mut leases = self.blobs.lock_leases();
            for id in &self.ids {
                let count = leases.readers.get_mut(id).map(|c| {
                    *c -= 1;
                    *c
                });
                if count == Some(0) {
                    leases.readers.remove(id);
                    if leases.doomed.remove(id) {
                        unlink.push(id.clone());
                    }
                }
            }
        }
        for id in unlink {
            self.blobs.unlink(&self.bucket, &id);
        }
    }
}

/// One stretch of one blob (or of an object's inline bytes).
#[derive(Debug, Clone)]
pub(crate) struct Piece {
    pub blob: String,
    pub offset: u64,
    pub length: u64,
    pub inline: Option<Bytes>,
}

/// Where a blob being received goes.
enum Sink {
    File(tokio::fs::File),
    Shared(Box<dyn BlobWriter>),
}

impl Sink {
    async fn write(&mut self, bytes: Bytes) -> io::Result<()> {
        match self {
            Sink::File(file) => file.write_all(&bytes).await,
            Sink::Shared(writer) => writer.write(bytes).await,
        }
    }

    async fn abort(self) {
        if let Sink::Shared(writer) = self {
            writer.abort().await;
        }
    }
}

impl Blobs {
    pub(crate) fn new(root: PathBuf, shared: Option<Arc<dyn BlobStore>>) -> Self {
        Blobs {
            root,
            shared,
            pending: Mutex::default(),
            leases: Mutex::default(),
            received: AtomicU64::new(0),
            sent: AtomicU64::new(0),
        }
    }

    /// The shared store's name of a blob.
    fn shared_name(bucket: &str, id: &str) -> String {
        format!("blobs/{bucket}/{id}")
    }

    /// Removes one blob whose row is gone; a failure is left to the sweep. In a shared store
    /// the removal runs in the background (callers hold locks or run on an actor).
    fn unlink(&self, bucket: &str, id: &str) {
        let Some(store) = &self.shared else {
            if let Err(e) = std::fs::remove_file(self.path(bucket, id))
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(bucket, blob = id, %e, "could not remove a blob; the sweep will retry");
            }
            return;
        };
        let (store, name) = (Arc::clone(store), Self::shared_name(bucket, id));
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(e) = store.delete(&name).await {
                        tracing::warn!(blob = name, %e, "could not remove a blob; the sweep will retry");
                    }
                });
            }
            Err(_) => tracing::debug!(blob = name, "no runtime to remove a blob on; the sweep will"),
        }
    }

    fn lock_pending(&self) -> MutexGuard<'_, HashSet<String>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_leases(&self) -> MutexGuard<'_, Leases> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn bucket_dir(&self, bucket: &str) -> PathBuf {
        self.root.join(bucket)
    }

    fn blob_dir(&self, bucket: &str, id: &str) -> PathBuf {
        shard_dir(&self.root.join(bucket), id)
    }

    pub(crate) fn path(&self, bucket: &str, id: &str) -> PathBuf {
        self.blob_dir(bucket, id).join(id)
    }

    /// Receives a body, hashing on the way: kept in memory when it ends within
    /// `expected.inline_max` bytes, else (or always, with `None`) streamed into a new blob of
    /// `bucket`, which is synced with its directory (or whole in the shared store).
    pub(crate) async fn receive<S, E>(
        self: &Arc<Self>,
        bucket: &str,
        body: S,
        expected: &Expected<'_>,
    ) -> Result<Received>
    where
        S: Stream<Item = Result<Bytes, E>> + Send,
        E: std::fmt::Display,
    {
        if expected.size.is_some_and(|n| n > expected.max_size) {
            return Err(R2Error::EntityTooLarge);
        }
        let mut sink = None;
        let received = self.receive_into(bucket, body, expected, &mut sink).await;
        if received.is_err()
            && let Some((_, sink)) = sink.take()
        {
            sink.abort().await;
        }
        received
    }

    /// [`Blobs::receive`]'s work; `sink` holds the blob being written, for the caller to abort
    /// if this fails.
    async fn receive_into<S, E>(
        self: &Arc<Self>,
        bucket: &str,
        body: S,
        expected: &Expected<'_>,
        sink: &mut Option<(PendingBlob, Sink)>,
    ) -> Result<Received>
    where
        S: Stream<Item = Result<Bytes, E>> + Send,
        E: std::fmt::Display,
    {
        let Expected { size: expected_size, max_size, inline_max, digests } = *expected;
        let io_err = |e: io::Error| R2Error::storage("writing a blob", e);
        let mut digester = Digester::new(digests);
        let mut size = 0u64;
        let mut buffer = BytesMut::new();
        let inline_max = match inline_max {
            Some(max) if expected_size.is_none_or(|n| n <= max as u64) => max,
            _ => {
                *sink = Some(self.create(bucket).await?);
                0
            }
        };
        let mut body = std::pin::pin!(body);
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| R2Error::IncompleteBody(e.to_string()))?;
            size += chunk.len() as u64;
            self.received.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            if size > max_size {
                return Err(R2Error::EntityTooLarge);
            }
            digester.update(&chunk);
            buffer.extend_from_slice(&chunk);
            if sink.is_none() && buffer.len() > inline_max {
                *sink = Some(self.create(bucket).await?);
            }
            if let Some((_, out)) = sink
                && buffer.len() >= WRITE_CHUNK
            {
                out.write(buffer.split().freeze()).await.map_err(io_err)?;
            }
        }
        if let Some(expected) = expected_size
            && expected != size
        {
            return Err(R2Error::IncompleteBody(format!("expected {expected} bytes, received {size}")));
        }
        let Some((_, out)) = sink else {
            let (md5, checksums) = digester.finish(digests)?;
            return Ok(Received { stored: Stored::Inline(buffer.freeze()), size, md5, checksums });
        };
        if !buffer.is_empty() {
            out.write(buffer.freeze()).await.map_err(io_err)?;
        }
        let (md5, checksums) = digester.finish(digests)?;
        let (pending, out) = sink.take().expect("a blob is being written");
        match out {
            Sink::File(mut file) => {
                // tokio writes in the background: a failed last write (a full disk) is reported
                // by flush, never by sync_all, which would sync a shorter file and succeed.
                file.flush().await.map_err(io_err)?;
                file.sync_all().await.map_err(io_err)?;
                let written = file.metadata().await.map_err(io_err)?.len();
                if written != size {
                    return Err(R2Error::storage(
                        "writing a blob",
                        io::Error::other(format!("{written} of {size} bytes reached the disk")),
                    ));
                }
                drop(file);
                let dir = self.blob_dir(bucket, &pending.id);
                tokio::task::spawn_blocking(move || std::fs::File::open(dir)?.sync_all())
                    .await
                    .map_err(|e| R2Error::storage("syncing a blob directory", e))?
                    .map_err(io_err)?;
            }
            Sink::Shared(writer) => writer.finish().await.map_err(|e| R2Error::storage("storing a blob", e))?,
        }
        Ok(Received { stored: Stored::Blob(pending), size, md5, checksums })
    }

    /// A new, empty blob of `bucket`, kept out of the sweep until its row commits.
    async fn create(self: &Arc<Self>, bucket: &str) -> Result<(PendingBlob, Sink)> {
        let io_err = |e: io::Error| R2Error::storage("writing a blob", e);
        let id = new_id();
        self.lock_pending().insert(id.clone());
        let pending = PendingBlob { blobs: self.clone(), bucket: bucket.to_owned(), id: id.clone(), committed: false };
        if let Some(store) = &self.shared {
            let writer = store
                .create(&Self::shared_name(bucket, &id))
                .await
                .map_err(|e| R2Error::storage("storing a blob", e))?;
            return Ok((pending, Sink::Shared(writer)));
        }
        let dir = self.blob_dir(bucket, &id);
        if !tokio::fs::try_exists(&dir).await.map_err(io_err)? {
            // Buckets are created with every shard; one missing is made here, never the
            // bucket's own directory (a deleted bucket stays deleted), and made durable.
            let blobs = self.bucket_dir(bucket).join("blobs");
            match tokio::fs::create_dir(&dir).await {
                Ok(()) => {
                    tokio::task::spawn_blocking(move || sync_dir(&blobs))
                        .await
                        .map_err(|e| R2Error::storage("syncing a blob directory", e))?
                        .map_err(io_err)?;
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(R2Error::NoSuchBucket),
                Err(e) => return Err(io_err(e)),
            }
        }
        let file =
            tokio::fs::OpenOptions::new().write(true).create_new(true).open(dir.join(&id)).await.map_err(io_err)?;
        Ok((pending, Sink::File(file)))
    }

    /// Leases `ids` for reading. Called on the bucket's actor, in the same step that read the
    /// rows naming them, so no removal can come between.
    pub(crate) fn lease(self: &Arc<Self>, bucket: &str, ids: Vec<String>) -> Lease {
        let mut leases = self.lock_leases();
        for id in &ids {
            *leases.readers.entry(id.clone()).or_default() += 1;
        }
        Lease { blobs: self.clone(), bucket: bucket.to_owned(), ids }
    }

    /// Removes blobs whose rows are gone (called after the commit); a blob still being read is
    /// removed when its last reader finishes.
    pub(crate) fn remove(&self, bucket: &str, ids: impl IntoIterator<Item = String>) {
        let mut unlink = Vec::new();
        {
            let mut leases = self.lock_leases();
            for id in ids {
                if !is_blob_id(&id) {
                    continue;
                }
                if leases.readers.contains_key(&id) {
                    leases.doomed.insert(id);
                } else {
                    unlink.push(id);
                }
            }
        }
        for id in unlink {
            self.unlink(bucket, &id);
        }
    }

    /// Whether the blobs are in a shared store.
    pub(crate) fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// The ids of the blobs of `bucket` in the shared store (for its sweep: listed before the
    /// rows are read, so a blob written after the listing is never taken for an orphan).
    pub(crate) async fn list_shared(&self, bucket: &str) -> io::Result<Vec<String>> {
        let Some(store) = &self.shared else { return Ok(Vec::new()) };
        let folder = format!("blobs/{bucket}/");
        let names = store.list(&folder).await?;
        Ok(names.into_iter().filter_map(|n| n.strip_prefix(&folder).map(str::to_owned)).collect())
    }

    /// Of `listed`, the blobs that `referenced` does not name and that are neither being written
    /// nor read: they can never be named again (a row only ever names a new blob). Runs on the
    /// bucket's actor, so no commit interleaves.
    pub(crate) fn orphans(&self, listed: Vec<String>, referenced: &HashSet<String>) -> Vec<String> {
        listed
            .into_iter()
            .filter(|id| {
                is_blob_id(id)
                    && !referenced.contains(id)
                    && !self.lock_pending().contains(id)
                    && !self.lock_leases().readers.contains_key(id)
            })
            .collect()
    }

    /// Removes orphans of `bucket` from the shared store.
    pub(crate) async fn remove_shared(&self, bucket: &str, ids: &[String]) -> io::Result<()> {
        let Some(store) = &self.shared else { return Ok(()) };
        for id in ids {
            store.delete(&Self::shared_name(bucket, id)).await?;
        }
        Ok(())
    }

    /// Removes every blob file of `bucket` that `referenced` does not name, is not being written
    /// and is not being read. Runs on the bucket's actor, so no commit interleaves. Returns how
    /// many were removed.
    pub(crate) fn sweep(&self, bucket: &str, referenced: &HashSet<String>) -> io::Result<usize> {
        let blobs = self.bucket_dir(bucket).join("blobs");
        let mut removed = 0;
        let entries = match std::fs::read_dir(&blobs) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        for shard in entries {
            let shard = shard?;
            if !shard.file_type()?.is_dir() {
                continue;
            }
            for file in std::fs::read_dir(shard.path())? {
                let file = file?;
                let name = file.file_name().to_string_lossy().into_owned();
                // Checked now, file by file: a write may have begun since the listing started
                // (it enters `pending` before its file exists).
                if referenced.contains(&name)
                    || self.lock_pending().contains(&name)
                    || self.lock_leases().readers.contains_key(&name)
                {
                    continue;
                }
                match std::fs::remove_file(file.path()) {
                    Ok(()) => removed += 1,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(removed)
    }

    /// Streams `pieces` of `bucket`'s blobs in order, holding `lease` until the stream ends or
    /// is dropped.
    pub(crate) fn stream(
        self: &Arc<Self>,
        bucket: &str,
        pieces: Vec<Piece>,
        lease: Lease,
    ) -> impl Stream<Item = io::Result<Bytes>> + Send + Sync + 'static {
        /// The piece being read, with the bytes it still owes.
        enum Reading {
            File(tokio::fs::File, u64),
            Shared(futures_util::stream::BoxStream<'static, io::Result<Bytes>>, u64),
        }
        struct State {
            blobs: Arc<Blobs>,
            bucket: String,
            pieces: std::collections::VecDeque<Piece>,
            current: Option<Reading>,
            _lease: Lease,
        }
        let short = || io::Error::new(io::ErrorKind::UnexpectedEof, "a blob is shorter than its row says");
        let state = State {
            blobs: self.clone(),
            bucket: bucket.to_owned(),
            pieces: pieces.into_iter().filter(|p| p.length > 0).collect(),
            current: None,
            _lease: lease,
        };
        // The stream is polled by its one reader: `SyncStream` makes it `Sync` for the body
        // types without asking the store's futures to be.
        SyncStream::new(Box::pin(futures_util::stream::try_unfold(state, move |mut state| async move {
            loop {
                match &mut state.current {
                    Some(Reading::File(_, 0) | Reading::Shared(_, 0)) => state.current = None,
                    Some(Reading::File(file, remaining)) => {
                        let want = (*remaining).min(READ_CHUNK as u64) as usize;
                        let mut buffer = BytesMut::zeroed(want);
                        let mut filled = 0;
                        while filled < want {
                            let n = file.read(&mut buffer[filled..]).await?;
                            if n == 0 {
                                return Err(short());
                            }
                            filled += n;
                        }
                        *remaining -= want as u64;
                        state.blobs.sent.fetch_add(want as u64, Ordering::Relaxed);
                        return Ok(Some((buffer.freeze(), state)));
                    }
                    Some(Reading::Shared(stream, remaining)) => {
                        let Some(chunk) = stream.next().await.transpose()? else { return Err(short()) };
                        let chunk = chunk.slice(..(chunk.len() as u64).min(*remaining) as usize);
                        *remaining -= chunk.len() as u64;
                        state.blobs.sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                        return Ok(Some((chunk, state)));
                    }
                    None => {
                        let Some(piece) = state.pieces.pop_front() else { return Ok(None) };
                        if let Some(bytes) = &piece.inline {
                            let end = (piece.offset + piece.length) as usize;
                            state.blobs.sent.fetch_add(piece.length, Ordering::Relaxed);
                            return Ok(Some((bytes.slice(piece.offset as usize..end), state)));
                        }
                        state.current = Some(match &state.blobs.shared {
                            Some(store) => {
                                let name = Self::shared_name(&state.bucket, &piece.blob);
                                let stream = store.read(&name, piece.offset, piece.length).await?;
                                Reading::Shared(stream, piece.length)
                            }
                            None => {
                                let mut file =
                                    tokio::fs::File::open(state.blobs.path(&state.bucket, &piece.blob)).await?;
                                if piece.offset > 0 {
                                    file.seek(io::SeekFrom::Start(piece.offset)).await?;
                                }
                                Reading::File(file, piece.length)
                            }
                        });
                    }
                }
            }
        })))
    }

    /// Creates a bucket's directory tree (with a shared store, only the directory of its
    /// metadata file), durably.
    pub(crate) fn create_bucket(&self, bucket: &str) -> io::Result<()> {
        let dir = self.bucket_dir(bucket);
        if self.shared.is_some() {
            std::fs::create_dir_all(&dir)?;
            sync_dir(&dir)?;
            return sync_dir(&self.root);
        }
        let blobs = dir.join("blobs");
        std::fs::create_dir_all(&blobs)?;
        for shard in 0..=255u8 {
            let shard = blobs.join(format!("{shard:02x}"));
            match std::fs::create_dir(&shard) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
        }
        sync_dir(&blobs)?;
        sync_dir(&dir)?;
        sync_dir(&self.root)
    }

    /// The bucket directories present (for removing those of deleted buckets).
    pub(crate) fn bucket_dirs(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.root)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                out.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        Ok(out)
    }

    /// Removes every blob of a deleted bucket from the shared store.
    pub(crate) async fn remove_shared_bucket(&self, bucket: &str) -> io::Result<()> {
        let ids = self.list_shared(bucket).await?;
        self.remove_shared(bucket, &ids).await
    }

    /// Removes a bucket's whole directory.
    pub(crate) fn remove_bucket(&self, bucket: &str) -> io::Result<()> {
        match std::fs::remove_dir_all(self.bucket_dir(bucket)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}
