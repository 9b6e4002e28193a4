//! kura's R2 engine: buckets of objects with R2's semantics, on the blob store and one SQLite
//! metadata file per bucket.
//!
//! - [`R2`]: the engine over one data directory's `r2/` folder. Buckets are named by storage
//!   ids (the catalog maps names to ids); each bucket's `meta.sqlite` is owned by one actor of a
//!   [`kura_sqlite::Registry`], so its writes are serialised and its reads consistent.
//! - Blob first, row last: a body streams into a new immutable blob (hashed on the way in),
//!   which is synced before the row that points at it commits; an overwritten or deleted
//!   object's blobs are removed only after the row change commits, and not while a read still
//!   streams them. A crash leaves at worst an orphan blob, which [`R2::sweep`] removes.
//! - [`object`]: metadata, conditionals, ranges, checksums and limits; [`ListOptions`]: listing.
//!
//! ```no_run
//! # async fn demo() -> kura_r2::Result<()> {
//! use kura_r2::{PutOptions, R2, R2Settings};
//! let r2 = R2::open("/tmp/r2".into(), R2Settings::default())?;
//! r2.create_bucket("0123456789abcdef0123456789abcdef").await?;
//! let body = futures_util::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from("hello"))]);
//! let info = r2.put_object("0123456789abcdef0123456789abcdef", "greeting", body, PutOptions::default()).await?;
//! assert_eq!(info.etag, "5d41402abc4b2a76b9719d911017c592");
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod blob;
mod check;
mod error;
mod list;
mod meta;
mod multipart;
pub mod object;
mod options;
mod shared;
mod sweep;

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::Stream;
use kura_sqlite::{DatabaseOptions, HistorySettings, PlacementError, Registry};
use rusqlite::Connection;

use crate::blob::{Blobs, Expected, PendingBlob, Piece, Stored};
pub use crate::check::{BucketCheck, BucketDamage, check_bucket};
pub use crate::error::{R2Error, Result};
pub use crate::list::{ListOptions, Listing, MAX_LIST_LIMIT};
use crate::meta::Data;
pub use crate::object::{
    ByteRange, ChecksumAlgorithm, Conditional, DeclaredChecksum, EtagCondition, ExpectedDigests, HttpMetadata,
    ObjectInfo, TrailingChecksum,
};
use crate::object::{MAX_UPLOAD_BYTES, check_custom_metadata, check_key};
pub use crate::options::{
    ByteStream, CompleteOptions, CopySource, GetOptions, MetadataDirective, ObjectBody, PartInfo, PartListing,
    PartOptions, PutOptions, R2Settings, SweepReport, UploadInfo,
};
pub use crate::shared::{BlobStore, BlobWriter, Shared, byte_stream};

/// The R2 engine of one data directory.
pub struct R2 {
    blobs: Arc<Blobs>,
    registry: Registry,
    root: PathBuf,
    settings: R2Settings,
}

fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

fn valid_bucket_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

impl From<PlacementError> for R2Error {
    fn from(e: PlacementError) -> Self {
        R2Error::Unavailable(format!("the bucket is {e}"))
    }
}

impl R2 {
    /// Opens the engine over `root` (created if missing).
    pub fn open(root: PathBuf, settings: R2Settings) -> Result<Self> {
        std::fs::create_dir_all(&root).map_err(|e| R2Error::storage("creating the R2 directory", e))?;
        let opener_root = root.clone();
        let placement = settings.shared.as_ref().map(|s| Arc::clone(&s.placement));
        let registry = Registry::new(settings.registry.clone(), move |bucket: &str| {
            let dir = opener_root.join(bucket);
            if !valid_bucket_id(bucket) || !dir.is_dir() {
                return None;
            }
            let mut options = DatabaseOptions::new(dir.join("meta.sqlite")).create(true);
            // D1 caps a database at 10 GB; a bucket's metadata (with its inline bodies) may
            // grow past that.
            options.limits.max_database_bytes = 1 << 44;
            match &placement {
                // A bucket this node does not own (any more) is not opened here.
                Some(placement) => placement
                    .shipper(bucket)
                    .map(|shipper| options.history(HistorySettings::shipped_only(), bucket).shipper(shipper)),
                None => Some(options),
            }
        });
        let blobs = Blobs::new(root.clone(), settings.shared.as_ref().map(|s| Arc::clone(&s.blobs)));
        Ok(R2 { blobs: Arc::new(blobs), registry, root, settings })
    }

    fn meta_path(&self, bucket: &str) -> PathBuf {
        self.root.join(bucket).join("meta.sqlite")
    }

    /// In a cluster, makes sure this node may serve the bucket — it owns its metadata, rebuilt
    /// from the store — or says which node does. Alone, a no-op.
    pub async fn claim(&self, bucket: &str) -> Result<(), PlacementError> {
        let Some(shared) = &self.settings.shared else { return Ok(()) };
        if !valid_bucket_id(bucket) || shared.placement.is_current(bucket) {
            return Ok(());
        }
        // Whatever an earlier ownership left open goes before the file is rebuilt.
        let (registry, key) = (self.registry.clone(), bucket.to_owned());
        let release_file = Box::pin(async move { registry.close(&key).await });
        shared.placement.claim(bucket, &self.meta_path(bucket), release_file).await
    }

    /// In a cluster: the node last named as the bucket's owner did not serve it; look again
    /// next time.
    pub fn forget_owner(&self, bucket: &str) {
        if let Some(shared) = &self.settings.shared {
            shared.placement.forget_owner(bucket);
        }
    }

    /// Whether this node serves the bucket now (always, alone).
    pub fn owns(&self, bucket: &str) -> bool {
        self.settings.shared.as_ref().is_none_or(|s| s.placement.is_current(bucket))
    }

    /// In a cluster, refuses work on a bucket this node does not own (its lease ended since the
    /// request was placed).
    fn check_owned(&self, bucket: &str) -> Result<()> {
        match self.owns(bucket) {
            true => Ok(()),
            false => Err(R2Error::Unavailable("this node's ownership of the bucket ended; retry".into())),
        }
    }

    async fn on_bucket<T, F>(&self, bucket: &str, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        if !valid_bucket_id(bucket) {
            return Err(R2Error::NoSuchBucket);
        }
        self.check_owned(bucket)?;
        let outcome = self.registry.with_database(bucket, move |db| db.with_internal(f)).await;
        self.while_owned(bucket, outcome.map_err(R2Error::from).and_then(|r| r))
    }

    /// In a cluster, a bucket that could not be opened because this node's ownership ended
    /// meanwhile is unavailable (retry), not missing.
    fn while_owned<T>(&self, bucket: &str, outcome: Result<T>) -> Result<T> {
        match outcome {
            Err(R2Error::NoSuchBucket) if !self.owns(bucket) => {
                Err(R2Error::Unavailable("this node's ownership of the bucket ended; retry".into()))
            }
            other => other,
        }
    }

    /// Commits writes to the bucket's metadata inside a group commit, answering once they are
    /// durable; `f` returns its answer and the blobs its change unlinked from rows. The commit
    /// and what follows run as a task of their own, so a caller that goes away cannot leave a
    /// committed row without its blob (`pending`) or a replaced blob on disk: the new blob is
    /// kept if the row committed, removed if the work was undone or never ran, and left to the
    /// sweep if the commit's outcome is unknown.
    async fn commit<T, F>(&self, bucket: &str, pending: Option<PendingBlob>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&Connection) -> Result<(T, Vec<String>)> + Send + 'static,
    {
        if !valid_bucket_id(bucket) {
            return Err(R2Error::NoSuchBucket);
        }
        self.check_owned(bucket)?;
        let bucket_id = bucket;
        let (registry, blobs, bucket) = (self.registry.clone(), Arc::clone(&self.blobs), bucket.to_owned());
        let task = tokio::spawn(async move {
            match registry.write_grouped(&bucket, f).await {
                Ok(Ok((answer, unlinked))) => {
                    if let Some(pending) = pending {
                        pending.committed();
                    }
                    blobs.remove(&bucket, unlinked);
                    Ok(answer)
                }
                Ok(Err(e)) => Err(e),
                // Not run: the blob is no row's, and goes with `pending`.
                Err(
                    e @ (kura_sqlite::Error::Overloaded | kura_sqlite::Error::Closed | kura_sqlite::Error::Reopening),
                ) => Err(e.into()),
                Err(e) => {
                    if let Some(pending) = pending {
                        pending.abandon();
                    }
                    Err(e.into())
                }
            }
        });
        let outcome = task.await.map_err(|e| R2Error::storage("committing", e)).and_then(|r| r);
        self.while_owned(bucket_id, outcome)
    }

    /// Creates the storage of a bucket (its directory and metadata file). In a cluster this
    /// node becomes its owner first, so even its empty state is in the store.
    pub async fn create_bucket(&self, bucket: &str) -> Result<()> {
        if !valid_bucket_id(bucket) {
            return Err(R2Error::InvalidArgument(format!("invalid bucket storage id '{bucket}'")));
        }
        self.claim(bucket).await?;
        self.blobs.create_bucket(bucket).map_err(|e| R2Error::storage("creating a bucket", e))?;
        self.commit(bucket, None, |tx| Ok((meta::ensure_schema(tx)?, Vec::new()))).await
    }

    /// Whether the bucket holds no object.
    pub async fn is_empty(&self, bucket: &str) -> Result<bool> {
        self.on_bucket(bucket, |conn| Ok(!meta::has_objects(conn)?)).await
    }

    /// Marks the bucket deleted, in one step with the check that it holds no object (so no
    /// write can slip in between: every write checks the mark); refused while it holds objects.
    pub async fn mark_deleted(&self, bucket: &str) -> Result<()> {
        self.commit(bucket, None, |tx| {
            if meta::has_objects(tx)? {
                return Err(R2Error::BucketNotEmpty);
            }
            meta::set_deleted(tx, true)?;
            Ok(((), Vec::new()))
        })
        .await
    }

    /// Takes back [`R2::mark_deleted`] (when the catalog could not forget the bucket).
    pub async fn unmark_deleted(&self, bucket: &str) -> Result<()> {
        self.commit(bucket, None, |tx| Ok((meta::set_deleted(tx, false)?, Vec::new()))).await
    }

    /// Removes a bucket's storage for good, refusing while it holds objects (unfinished uploads
    /// go with it).
    pub async fn delete_bucket(&self, bucket: &str) -> Result<()> {
        self.mark_deleted(bucket).await?;
        self.delete_bucket_contents(bucket).await
    }

    /// Removes a bucket's storage whatever it holds (for a bucket the catalog has already
    /// forgotten); in a cluster, its blobs and history in the store too.
    pub async fn delete_bucket_contents(&self, bucket: &str) -> Result<()> {
        self.registry.retire(bucket).await;
        if let Some(shared) = &self.settings.shared {
            self.blobs.remove_shared_bucket(bucket).await.map_err(|e| R2Error::storage("removing a bucket", e))?;
            shared.placement.release(bucket).await;
        }
        self.blobs.remove_bucket(bucket).map_err(|e| R2Error::storage("removing a bucket", e))
    }

    /// Stores an object: the body streams into a new blob, then the row commits if the
    /// preconditions hold on the object it replaces.
    pub async fn put_object<S, E>(&self, bucket: &str, key: &str, body: S, options: PutOptions) -> Result<ObjectInfo>
    where
        S: Stream<Item = Result<Bytes, E>> + Send,
        E: std::fmt::Display,
    {
        check_key(key)?;
        check_custom_metadata(&options.custom)?;
        let storage_class = check_storage_class(options.storage_class.as_deref())?;
        // Preconditions are checked at commit, after the body has been read: refusing before it
        // would leave the body unread on the connection, which then cannot carry another request.
        let received = self
            .blobs
            .receive(
                bucket,
                body,
                &Expected {
                    size: options.size,
                    max_size: options.max_size.map_or(MAX_UPLOAD_BYTES, |m| m.min(MAX_UPLOAD_BYTES)),
                    inline_max: Some(self.settings.inline_max),
                    digests: &options.digests,
                },
            )
            .await?;
        let mut checksums = received.checksums.clone();
        checksums.insert("md5".into(), hex::encode(received.md5));
        let info = ObjectInfo {
            key: key.to_owned(),
            version: blob::new_id(),
            size: received.size,
            etag: hex::encode(received.md5),
            uploaded_ms: now_ms(),
            http: options.http,
            custom: options.custom,
            checksums,
            storage_class,
            parts: None,
        };
        let conditional = options.conditional;
        let stored = info.clone();
        let (pending, inline) = match received.stored {
            Stored::Blob(pending) => (Some(pending), None),
            Stored::Inline(bytes) => (None, Some(bytes)),
        };
        let blob_id = pending.as_ref().map(|p| p.id().to_owned());
        self.commit(bucket, pending, move |tx| {
            meta::check_live(tx)?;
            let current = meta::get_object(tx, &stored.key)?;
            conditional.check_write(current.as_ref().map(|c| &c.info))?;
            let old = meta::remove_object(tx, &stored.key)?;
            let data = match (&blob_id, &inline) {
                (Some(id), _) => Data::Blob(id),
                (None, Some(bytes)) => Data::Inline(bytes),
                (None, None) => Data::Inline(&[]),
            };
            meta::insert_object(tx, &stored, data)?;
            Ok(((), old))
        })
        .await?;
        Ok(info)
    }

    /// The object's metadata, if it exists.
    pub async fn head_object(&self, bucket: &str, key: &str) -> Result<Option<ObjectInfo>> {
        let key = key.to_owned();
        self.on_bucket(bucket, move |conn| Ok(meta::get_object(conn, &key)?.map(|o| o.info))).await
    }

    /// Reads an object (or a range or part of it), after its preconditions.
    pub async fn get_object(&self, bucket: &str, key: &str, options: GetOptions) -> Result<ObjectBody> {
        let key = key.to_owned();
        let blobs = self.blobs.clone();
        let bucket_id = bucket.to_owned();
        let (info, range, pieces, lease) = self
            .on_bucket(bucket, move |conn| {
                let Some(object) = meta::get_object(conn, &key)? else { return Err(R2Error::NoSuchKey) };
                options.conditional.check_read(Some(&object.info))?;
                let layout: Vec<Extent> = match (&object.blob, &object.upload_id) {
                    (Some(blob), _) => vec![Extent { blob: blob.clone(), size: object.info.size, inline: None }],
                    (None, Some(upload_id)) => meta::parts(conn, upload_id)?
                        .into_iter()
                        .map(|p| Extent { blob: p.blob, size: p.size, inline: None })
                        .collect(),
                    (None, None) => {
                        let bytes = meta::inline_data(conn, &key)?.unwrap_or_default();
                        vec![Extent { blob: String::new(), size: bytes.len() as u64, inline: Some(Bytes::from(bytes)) }]
                    }
                };
                let range = match (options.part_number, options.range) {
                    (Some(n), _) => {
                        let Some(index) = (n as usize).checked_sub(1).filter(|i| *i < layout.len()) else {
                            return Err(R2Error::InvalidRange);
                        };
                        let offset: u64 = layout[..index].iter().map(|e| e.size).sum();
                        // An empty part is the whole (empty) answer, not a range of nothing.
                        Some((offset, layout[index].size)).filter(|(_, size)| *size > 0)
                    }
                    (None, Some(range)) => Some(range.resolve(object.info.size)?),
                    (None, None) => None,
                };
                let (offset, length) = range.unwrap_or((0, object.info.size));
                let pieces = slice(&layout, offset, length);
                let lease = blobs
                    .lease(&bucket_id, pieces.iter().filter(|p| p.inline.is_none()).map(|p| p.blob.clone()).collect());
                Ok((object.info, range, pieces, lease))
            })
            .await?;
        let body = Box::pin(self.blobs.stream(bucket, pieces, lease));
        Ok(ObjectBody { info, range, body })
    }

    /// Deletes an object; deleting a missing key succeeds.
    pub async fn delete_object(&self, bucket: &str, key: &str) -> Result<()> {
        self.delete_objects(bucket, vec![key.to_owned()]).await
    }

    /// Deletes up to 1,000 objects in one transaction; missing keys are not errors.
    pub async fn delete_objects(&self, bucket: &str, keys: Vec<String>) -> Result<()> {
        if keys.len() > 1000 {
            return Err(R2Error::InvalidArgument("at most 1000 keys may be deleted at once".into()));
        }
        self.commit(bucket, None, move |tx| {
            let mut old = Vec::new();
            for key in &keys {
                old.extend(meta::remove_object(tx, key)?);
            }
            Ok(((), old))
        })
        .await
    }

    /// Deletes each `(key, version)` whose key still holds that version, in one transaction,
    /// and says how many went: a key written again since its version was read is kept. (What
    /// removes expired entries uses it, so a fresh write is never taken for the stale one.)
    pub async fn delete_versions(&self, bucket: &str, versions: Vec<(String, String)>) -> Result<usize> {
        if versions.len() > 1000 {
            return Err(R2Error::InvalidArgument("at most 1000 keys may be deleted at once".into()));
        }
        self.commit(bucket, None, move |tx| {
            let (mut deleted, mut old) = (0, Vec::new());
            for (key, version) in &versions {
                if meta::get_object(tx, key)?.is_some_and(|o| o.info.version == *version) {
                    old.extend(meta::remove_object(tx, key)?);
                    deleted += 1;
                }
            }
            Ok((deleted, old))
        })
        .await
    }

    /// Lists one page of a bucket.
    pub async fn list(&self, bucket: &str, options: ListOptions) -> Result<Listing> {
        self.on_bucket(bucket, move |conn| list::list(conn, &options)).await
    }

    /// Copies a whole object to another key, in the same or another bucket. The source's
    /// preconditions are checked when it is read; `destination` carries the write's own.
    pub async fn copy_object(
        &self,
        source: CopySource<'_>,
        bucket: &str,
        key: &str,
        directive: MetadataDirective,
        destination: PutOptions,
    ) -> Result<ObjectInfo> {
        let source = self
            .get_object(source.bucket, source.key, GetOptions { conditional: source.conditional, ..Default::default() })
            .await?;
        self.copy_from(source, bucket, key, directive, destination).await
    }

    /// Stores a whole object read elsewhere (this engine, or in a cluster another node) as a
    /// copy: its metadata with `directive`, its storage class unless `destination` names one.
    pub async fn copy_from(
        &self,
        source: ObjectBody,
        bucket: &str,
        key: &str,
        directive: MetadataDirective,
        mut destination: PutOptions,
    ) -> Result<ObjectInfo> {
        match directive {
            MetadataDirective::Copy => {
                destination.http = source.info.http.clone();
                destination.custom = source.info.custom.clone();
            }
            MetadataDirective::Replace { http, custom } => {
                destination.http = http;
                destination.custom = custom;
            }
        }
        if destination.storage_class.is_none() {
            destination.storage_class = Some(source.info.storage_class.clone());
        }
        destination.size = Some(source.length());
        self.put_object(bucket, key, source.body, destination).await
    }

    /// Object bytes received (by writes and parts) and sent (by reads) since the engine started.
    pub fn bytes_moved(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering;
        (self.blobs.received.load(Ordering::Relaxed), self.blobs.sent.load(Ordering::Relaxed))
    }

    /// What the buckets' metadata files did since the engine started.
    pub fn stats(&self) -> &kura_sqlite::Stats {
        self.registry.stats()
    }

    /// How many buckets' metadata files are open now.
    pub fn open_buckets(&self) -> usize {
        self.registry.open_count()
    }

    /// Closes every bucket's metadata file.
    pub async fn shutdown(&self) {
        self.registry.shutdown().await;
    }
}

fn check_storage_class(class: Option<&str>) -> Result<String> {
    match class {
        None | Some("Standard") => Ok("Standard".into()),
        Some("InfrequentAccess") => Ok("InfrequentAccess".into()),
        Some(other) => Err(R2Error::InvalidArgument(format!("unknown storage class '{other}'"))),
    }
}

/// One stretch of an object's bytes: a blob, or bytes kept in the row.
struct Extent {
    blob: String,
    size: u64,
    inline: Option<Bytes>,
}

/// The pieces of the extents (laid end to end) that cover `offset..offset+length`.
fn slice(layout: &[Extent], offset: u64, length: u64) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let (mut start, end) = (offset, offset + length);
    let mut base = 0u64;
    for extent in layout {
        let (lo, hi) = (base, base + extent.size);
        if start < hi && end > lo && start < end {
            let piece_end = end.min(hi);
            pieces.push(Piece {
                blob: extent.blob.clone(),
                offset: start - lo,
                length: piece_end - start,
                inline: extent.inline.clone(),
            });
            start = piece_end;
        }
        base = hi;
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_exactly_the_range() {
        let extent = |blob: &str, size| Extent { blob: blob.into(), size, inline: None };
        let layout = vec![extent("a", 10), extent("b", 10), extent("c", 5)];
        let s = slice(&layout, 8, 5);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].blob.as_str(), s[0].offset, s[0].length), ("a", 8, 2));
        assert_eq!((s[1].blob.as_str(), s[1].offset, s[1].length), ("b", 0, 3));
        assert_eq!(slice(&layout, 0, 25).len(), 3);
        assert_eq!(slice(&layout, 20, 5)[0].blob, "c");
    }
}
