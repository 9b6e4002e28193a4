//! The storage trait every shared byte goes through — R2 bodies, history segments, snapshots,
//! and the object-store coordinator's leases and manifest — with its two implementations: a
//! local directory (one machine) and an S3-compatible object store through `object_store`.
//!
//! Names are composed by kura from ids it generated, never from user input, and a name is
//! written once: [`PutMode::New`] for uniquely named objects (a fenced writer's late upload is
//! then an orphan no manifest refers to), [`PutMode::Create`] and [`PutMode::Replace`] only for
//! the few objects a coordinator compares and swaps.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use object_store::ObjectStore;
use object_store::path::Path as StorePath;

/// How a write treats an object that may already exist under its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutMode {
    /// The name is unique (it carries an epoch, a position and random bits): the store need not
    /// check, and a plain PUT is enough.
    New,
    /// Fail with [`StorageError::AlreadyExists`] if anything is there (`If-None-Match: *`).
    Create,
    /// Replace exactly this version, or fail with [`StorageError::Precondition`] (`If-Match`).
    Replace(Version),
}

/// An object's version as the store reports it: its ETag (or, locally, its size and time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version(pub String);

/// What a listing or a head says of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The object's name, relative to the storage's root.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its version.
    pub version: Version,
}

/// A storage failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// Nothing is stored under the name.
    #[error("no object {name}")]
    NotFound {
        /// The name asked for.
        name: String,
    },
    /// A [`PutMode::Create`] found an object there.
    #[error("object {name} already exists")]
    AlreadyExists {
        /// The name written.
        name: String,
    },
    /// A [`PutMode::Replace`] found another version (or none).
    #[error("object {name} is not at the version the write expected")]
    Precondition {
        /// The name written.
        name: String,
    },
    /// The storage cannot do this kind of write at all.
    #[error("{storage} cannot {what}")]
    Unsupported {
        /// The storage's description.
        storage: String,
        /// What was asked.
        what: &'static str,
    },
    /// A name kura composed is not a valid object name (a bug, never user input).
    #[error("invalid object name {0:?}")]
    InvalidName(String),
    /// The local filesystem failed.
    #[error("{path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The object store failed (unreachable, refused, timed out).
    #[error("object store: {0}")]
    Store(#[source] object_store::Error),
}

/// A new object being written piece by piece ([`Storage::writer`]), without holding it whole
/// in memory.
#[async_trait]
pub trait ObjectWriter: Send {
    /// Appends bytes.
    async fn write(&mut self, bytes: Bytes) -> Result<(), StorageError>;
    /// Makes the object whole and durable under its name.
    async fn finish(self: Box<Self>) -> Result<(), StorageError>;
    /// Gives the object up: nothing appears under its name.
    async fn abort(self: Box<Self>);
}

/// An object's bytes as they arrive.
pub type ByteStream = BoxStream<'static, Result<Bytes, StorageError>>;

/// Bytes shared between nodes. Every call is one request to the store (or one file operation),
/// but for [`Storage::writer`] and [`Storage::read`], which stream.
#[async_trait]
pub trait Storage: Send + Sync + fmt::Debug + 'static {
    /// Where the bytes live, for messages (`s3://bucket/prefix at http://…`, a directory).
    fn describe(&self) -> String;
    /// Writes `body` under `name`, durably before returning.
    async fn put(&self, name: &str, body: Bytes, mode: PutMode) -> Result<Version, StorageError>;
    /// Reads a whole object with its version.
    async fn get(&self, name: &str) -> Result<(Bytes, Version), StorageError>;
    /// Reads `range` of an object (clamped to its end).
    async fn get_range(&self, name: &str, range: Range<u64>) -> Result<Bytes, StorageError>;
    /// The object's size and version, without its bytes.
    async fn head(&self, name: &str) -> Result<ObjectInfo, StorageError>;
    /// Every object whose name starts with `prefix` (a folder: ends with `/`), sorted by name.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StorageError>;
    /// Removes an object; removing a missing one is not an error.
    async fn delete(&self, name: &str) -> Result<(), StorageError>;
    /// Starts writing a new, uniquely named object ([`PutMode::New`]) from pieces; a large one
    /// goes as a multipart upload. Nothing is under the name until the writer finishes.
    async fn writer(&self, name: &str) -> Result<Box<dyn ObjectWriter>, StorageError>;
    /// Streams `range` of an object, which must lie within it.
    async fn read(&self, name: &str, range: Range<u64>) -> Result<ByteStream, StorageError>;
}

/// A shared handle to some storage.
pub type SharedStorage = Arc<dyn Storage>;

fn check_name(name: &str) -> Result<(), StorageError> {
    let bad = name.is_empty()
        || name.starts_with('/')
        || name.ends_with('/')
        || name.split('/').any(|part| part.is_empty() || part == "." || part == "..")
        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
    if bad { Err(StorageError::InvalidName(name.to_owned())) } else { Ok(()) }
}

/// Storage in a local directory: the embedded default's layout for shared bytes, and what the
/// tests of a single node use. Writes go to a temporary file, are synced, and are linked into
/// place (a link never replaces, so [`PutMode::Create`] is exact); the directory is synced after.
#[derive(Debug, Clone)]
pub struct LocalStorage {
    root: PathBuf,
}

impl LocalStorage {
    /// Storage rooted at `root`, created if missing.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StorageError> {
        let root = root.into();
        std::fs::create_dir_all(&root).map_err(|source| StorageError::Io { path: root.clone(), source })?;
        Ok(LocalStorage { root })
    }

    fn path(&self, name: &str) -> Result<PathBuf, StorageError> {
        check_name(name)?;
        Ok(self.root.join(name))
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StorageError + '_ {
    move |source| StorageError::Io { path: path.to_owned(), source }
}

fn local_version(meta: &std::fs::Metadata) -> Version {
    let modified =
        meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
    Version(format!("{:x}-{:x}", meta.len(), modified))
}

fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

fn write_new(root: &Path, path: &Path, body: &[u8]) -> Result<Version, StorageError> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(root);
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).map_err(|e| StorageError::Io { path: dir.to_owned(), source: e.into() })?;
    let temp = dir.join(format!(".tmp-{}", hex::encode(random)));
    let written = (|| {
        let mut file = std::fs::File::create_new(&temp)?;
        file.write_all(body)?;
        file.sync_all()
    })();
    let linked = written.and_then(|()| std::fs::hard_link(&temp, path));
    let _ = std::fs::remove_file(&temp);
    match linked {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Err(StorageError::AlreadyExists { name: path.display().to_string() })
        }
        Err(source) => Err(StorageError::Io { path: path.to_owned(), source }),
        Ok(()) => {
            sync_dir(dir)?;
            let meta = std::fs::metadata(path).map_err(io(path))?;
            Ok(local_version(&meta))
        }
    }
}

fn not_found(name: &str) -> impl FnOnce(std::io::Error) -> StorageError + '_ {
    move |e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            StorageError::NotFound { name: name.to_owned() }
        } else {
            StorageError::Io { path: PathBuf::from(name), source: e }
        }
    }
}

fn list_local(root: &Path, prefix: &str) -> Result<Vec<ObjectInfo>, StorageError> {
    // The folder the prefix names, walked fully (names are a few levels deep at most).
    let folder = match prefix.rfind('/') {
        Some(at) => root.join(&prefix[..at]),
        None => root.to_owned(),
    };
    let mut found = Vec::new();
    let mut pending = vec![folder];
    while let Some(dir) = pending.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(StorageError::Io { path: dir, source }),
        };
        for entry in entries {
            let entry = entry.map_err(io(&dir))?;
            let meta = entry.metadata().map_err(io(&dir))?;
            let path = entry.path();
            if meta.is_dir() {
                pending.push(path);
                continue;
            }
            let Ok(relative) = path.strip_prefix(root) else { continue };
            let name = relative.to_string_lossy().into_owned();
            if name.starts_with(prefix) && !entry.file_name().to_string_lossy().starts_with(".tmp-") {
                found.push(ObjectInfo { name, size: meta.len(), version: local_version(&meta) });
            }
        }
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(found)
}

#[async_trait]
impl Storage for LocalStorage {
    fn describe(&self) -> String {
        format!("the directory {}", self.root.display())
    }

    async fn put(&self, name: &str, body: Bytes, mode: PutMode) -> Result<Version, StorageError> {
        let path = self.path(name)?;
        if let PutMode::Replace(_) = mode {
            // Only a shared store needs compare-and-swap; one machine has one writer per name.
            return Err(StorageError::Unsupported {
                storage: self.describe(),
                what: "replace an object conditionally",
            });
        }
        let root = self.root.clone();
        let name = name.to_owned();
        blocking(move || {
            write_new(&root, &path, &body).map_err(|e| match e {
                StorageError::AlreadyExists { .. } => StorageError::AlreadyExists { name },
                other => other,
            })
        })
        .await
    }

    async fn get(&self, name: &str) -> Result<(Bytes, Version), StorageError> {
        let path = self.path(name)?;
        let name = name.to_owned();
        blocking(move || {
            let bytes = std::fs::read(&path).map_err(not_found(&name))?;
            let meta = std::fs::metadata(&path).map_err(not_found(&name))?;
            Ok((Bytes::from(bytes), local_version(&meta)))
        })
        .await
    }

    async fn get_range(&self, name: &str, range: Range<u64>) -> Result<Bytes, StorageError> {
        use std::io::{Read, Seek, SeekFrom};
        let path = self.path(name)?;
        let name = name.to_owned();
        blocking(move || {
            let mut file = std::fs::File::open(&path).map_err(not_found(&name))?;
            file.seek(SeekFrom::Start(range.start)).map_err(io(&path))?;
            let mut bytes = Vec::new();
            file.take(range.end.saturating_sub(range.start)).read_to_end(&mut bytes).map_err(io(&path))?;
            Ok(Bytes::from(bytes))
        })
        .await
    }

    async fn head(&self, name: &str) -> Result<ObjectInfo, StorageError> {
        let path = self.path(name)?;
        let name = name.to_owned();
        blocking(move || {
            let meta = std::fs::metadata(&path).map_err(not_found(&name))?;
            Ok(ObjectInfo { name, size: meta.len(), version: local_version(&meta) })
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StorageError> {
        let root = self.root.clone();
        let prefix = prefix.to_owned();
        blocking(move || list_local(&root, &prefix)).await
    }

    async fn delete(&self, name: &str) -> Result<(), StorageError> {
        let path = self.path(name)?;
        let name = name.to_owned();
        blocking(move || match std::fs::remove_file(&path) {
            Ok(()) => sync_dir(path.parent().expect("a named object has a folder")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(not_found(&name)(e)),
        })
        .await
    }
    async fn writer(&self, name: &str) -> Result<Box<dyn ObjectWriter>, StorageError> {
        let path = self.path(name)?;
        let dir = path.parent().unwrap_or(&self.root).to_owned();
        tokio::fs::create_dir_all(&dir).await.map_err(io(&dir))?;
        let mut random = [0u8; 8];
        getrandom::fill(&mut random).map_err(|e| StorageError::Io { path: dir.clone(), source: e.into() })?;
        let temp = dir.join(format!(".tmp-{}", hex::encode(random)));
        let file = tokio::fs::File::create_new(&temp).await.map_err(io(&temp))?;
        Ok(Box::new(LocalWriter { file, temp, path, dir }))
    }

    async fn read(&self, name: &str, range: Range<u64>) -> Result<ByteStream, StorageError> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let path = self.path(name)?;
        let mut file = tokio::fs::File::open(&path).await.map_err(not_found(name))?;
        file.seek(std::io::SeekFrom::Start(range.start)).await.map_err(io(&path))?;
        let reader = file.take(range.end.saturating_sub(range.start));
        let stream = tokio_util::io::ReaderStream::with_capacity(reader, 256 * 1024);
        Ok(stream.map_err(move |source| StorageError::Io { path: path.clone(), source }).boxed())
    }
}

/// A local object being written: a temporary file beside its name, linked into place once
/// synced (a link never replaces, as [`PutMode::New`] promises).
struct LocalWriter {
    file: tokio::fs::File,
    temp: PathBuf,
    path: PathBuf,
    dir: PathBuf,
}

#[async_trait]
impl ObjectWriter for LocalWriter {
    async fn write(&mut self, bytes: Bytes) -> Result<(), StorageError> {
        use tokio::io::AsyncWriteExt;
        self.file.write_all(&bytes).await.map_err(io(&self.temp))
    }

    async fn finish(self: Box<Self>) -> Result<(), StorageError> {
        let LocalWriter { mut file, temp, path, dir } = *self;
        // A failed background write is reported by flush, not by sync_all.
        tokio::io::AsyncWriteExt::flush(&mut file).await.map_err(io(&temp))?;
        file.sync_all().await.map_err(io(&temp))?;
        drop(file);
        blocking(move || {
            let linked = std::fs::hard_link(&temp, &path).map_err(io(&path));
            let _ = std::fs::remove_file(&temp);
            linked?;
            sync_dir(&dir)
        })
        .await
    }

    async fn abort(self: Box<Self>) {
        let _ = tokio::fs::remove_file(&self.temp).await;
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, StorageError> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// Where an S3-compatible store is and how to sign for it.
#[derive(Clone)]
pub struct S3Config {
    /// The endpoint (`http://127.0.0.1:3900`); `None` for AWS itself.
    pub endpoint: Option<String>,
    /// The bucket kura keeps everything in.
    pub bucket: String,
    /// A folder inside the bucket (empty for its root), so several clusters can share one.
    pub prefix: String,
    /// The region to sign for (`garage` for Garage, `auto` for R2).
    pub region: String,
    /// The access key id.
    pub access_key_id: String,
    /// The secret access key.
    pub secret_access_key: String,
}

impl fmt::Debug for S3Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// Storage in an object store through the `object_store` crate: S3 itself, R2, Garage, MinIO,
/// Ceph — or `object_store`'s in-memory store in unit tests.
pub struct RemoteStorage {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    description: String,
}

impl fmt::Debug for RemoteStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.description)
    }
}

impl RemoteStorage {
    /// An S3-compatible store, addressed path-style (what Garage and MinIO need; S3 accepts it).
    pub fn s3(config: &S3Config) -> Result<Self, StorageError> {
        let mut builder = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key)
            .with_virtual_hosted_style_request(false)
            .with_conditional_put(object_store::aws::S3ConditionalPut::ETagMatch);
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint).with_allow_http(endpoint.starts_with("http://"));
        }
        let store = builder.build().map_err(StorageError::Store)?;
        let at = config.endpoint.as_deref().unwrap_or("AWS");
        let description = format!("s3://{}/{} at {at}", config.bucket, config.prefix.trim_matches('/'));
        Ok(Self::new(Arc::new(store), &config.prefix, description))
    }

    /// Any `object_store` store, with names under `prefix`.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str, description: String) -> Self {
        let prefix = prefix.trim_matches('/');
        let prefix = if prefix.is_empty() { String::new() } else { format!("{prefix}/") };
        RemoteStorage { store, prefix, description }
    }

    fn path(&self, name: &str) -> Result<StorePath, StorageError> {
        check_name(name)?;
        StorePath::parse(format!("{}{name}", self.prefix)).map_err(|_| StorageError::InvalidName(name.to_owned()))
    }

    fn relative(&self, path: &StorePath) -> String {
        let full = path.as_ref();
        full.strip_prefix(&self.prefix).unwrap_or(full).to_owned()
    }

    fn error(name: &str, error: object_store::Error) -> StorageError {
        match error {
            object_store::Error::NotFound { .. } => StorageError::NotFound { name: name.to_owned() },
            object_store::Error::AlreadyExists { .. } => StorageError::AlreadyExists { name: name.to_owned() },
            object_store::Error::Precondition { .. } => StorageError::Precondition { name: name.to_owned() },
            other => StorageError::Store(other),
        }
    }
}

fn version_of(e_tag: Option<String>, version: Option<String>) -> Version {
    Version(e_tag.or(version).unwrap_or_default())
}

#[async_trait]
impl Storage for RemoteStorage {
    fn describe(&self) -> String {
        self.description.clone()
    }

    async fn put(&self, name: &str, body: Bytes, mode: PutMode) -> Result<Version, StorageError> {
        let path = self.path(name)?;
        let mode = match mode {
            PutMode::New => object_store::PutMode::Overwrite,
            PutMode::Create => object_store::PutMode::Create,
            PutMode::Replace(Version(e_tag)) => {
                object_store::PutMode::Update(object_store::UpdateVersion { e_tag: Some(e_tag), version: None })
            }
        };
        let options = object_store::PutOptions { mode, ..Default::default() };
        let result = self.store.put_opts(&path, body.into(), options).await.map_err(|e| Self::error(name, e))?;
        Ok(version_of(result.e_tag, result.version))
    }

    async fn get(&self, name: &str) -> Result<(Bytes, Version), StorageError> {
        let path = self.path(name)?;
        let result = self.store.get(&path).await.map_err(|e| Self::error(name, e))?;
        let version = version_of(result.meta.e_tag.clone(), result.meta.version.clone());
        let bytes = result.bytes().await.map_err(|e| Self::error(name, e))?;
        Ok((bytes, version))
    }

    async fn get_range(&self, name: &str, range: Range<u64>) -> Result<Bytes, StorageError> {
        let path = self.path(name)?;
        let size = self.store.head(&path).await.map_err(|e| Self::error(name, e))?.size;
        let range = range.start.min(size)..range.end.min(size);
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        self.store.get_range(&path, range).await.map_err(|e| Self::error(name, e))
    }

    async fn head(&self, name: &str) -> Result<ObjectInfo, StorageError> {
        let path = self.path(name)?;
        let meta = self.store.head(&path).await.map_err(|e| Self::error(name, e))?;
        Ok(ObjectInfo { name: name.to_owned(), size: meta.size, version: version_of(meta.e_tag, meta.version) })
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StorageError> {
        // object_store lists by folder; the rest of the prefix is filtered here.
        let folder = match prefix.rfind('/') {
            Some(at) => format!("{}{}", self.prefix, &prefix[..at]),
            None => self.prefix.trim_end_matches('/').to_owned(),
        };
        let folder = (!folder.is_empty()).then(|| StorePath::from(folder));
        let mut found: Vec<ObjectInfo> = self
            .store
            .list(folder.as_ref())
            .map_ok(|meta| ObjectInfo {
                name: self.relative(&meta.location),
                size: meta.size,
                version: version_of(meta.e_tag, meta.version),
            })
            .try_filter(|info| std::future::ready(info.name.starts_with(prefix)))
            .try_collect()
            .await
            .map_err(StorageError::Store)?;
        found.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(found)
    }

    async fn delete(&self, name: &str) -> Result<(), StorageError> {
        let path = self.path(name)?;
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(StorageError::Store(e)),
        }
    }
    async fn writer(&self, name: &str) -> Result<Box<dyn ObjectWriter>, StorageError> {
        let path = self.path(name)?;
        let writer = object_store::buffered::BufWriter::with_capacity(Arc::clone(&self.store), path, MULTIPART_PART);
        Ok(Box::new(RemoteWriter { writer, name: name.to_owned() }))
    }

    async fn read(&self, name: &str, range: Range<u64>) -> Result<ByteStream, StorageError> {
        if range.is_empty() {
            return Ok(futures_util::stream::empty().boxed());
        }
        let path = self.path(name)?;
        let options =
            object_store::GetOptions { range: Some(object_store::GetRange::Bounded(range)), ..Default::default() };
        let result = self.store.get_opts(&path, options).await.map_err(|e| Self::error(name, e))?;
        let name = name.to_owned();
        Ok(result.into_stream().map_err(move |e| Self::error(&name, e)).boxed())
    }
}

/// Bytes buffered before a remote object becomes a multipart upload, and the size of each of
/// its parts (S3 wants at least 5 MiB for every part but the last).
const MULTIPART_PART: usize = 8 * 1024 * 1024;

/// A remote object being written: one PUT when it stays under [`MULTIPART_PART`], else a
/// multipart upload (`object_store`'s `BufWriter`).
struct RemoteWriter {
    writer: object_store::buffered::BufWriter,
    name: String,
}

#[async_trait]
impl ObjectWriter for RemoteWriter {
    async fn write(&mut self, bytes: Bytes) -> Result<(), StorageError> {
        self.writer.put(bytes).await.map_err(|e| RemoteStorage::error(&self.name, e))
    }

    async fn finish(mut self: Box<Self>) -> Result<(), StorageError> {
        use tokio::io::AsyncWriteExt;
        self.writer
            .shutdown()
            .await
            .map_err(|e| StorageError::Store(object_store::Error::Generic { store: "S3", source: Box::new(e) }))
    }

    async fn abort(mut self: Box<Self>) {
        if let Err(e) = self.writer.abort().await {
            tracing::warn!(object = self.name, error = %e, "could not abort an upload to the store");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn exercise(storage: &dyn Storage) {
        storage.put("a/b/one", Bytes::from_static(b"1"), PutMode::New).await.unwrap();
        storage.put("a/b/two", Bytes::from_static(b"22"), PutMode::Create).await.unwrap();
        storage.put("a/c", Bytes::from_static(b"333"), PutMode::New).await.unwrap();
        let again = storage.put("a/b/two", Bytes::from_static(b"x"), PutMode::Create).await;
        assert!(matches!(again, Err(StorageError::AlreadyExists { .. })), "{again:?}");
        let (bytes, _) = storage.get("a/b/two").await.unwrap();
        assert_eq!(&bytes[..], b"22", "a refused create changes nothing");
        assert_eq!(&storage.get_range("a/c", 1..10).await.unwrap()[..], b"33");
        let names: Vec<_> = storage.list("a/b/").await.unwrap().into_iter().map(|i| i.name).collect();
        assert_eq!(names, ["a/b/one", "a/b/two"]);
        let names: Vec<_> = storage.list("a/").await.unwrap().into_iter().map(|i| i.name).collect();
        assert_eq!(names, ["a/b/one", "a/b/two", "a/c"]);
        assert_eq!(storage.head("a/c").await.unwrap().size, 3);
        storage.delete("a/c").await.unwrap();
        storage.delete("a/c").await.unwrap();
        assert!(matches!(storage.get("a/c").await, Err(StorageError::NotFound { .. })));
        assert!(matches!(storage.head("../x").await, Err(StorageError::InvalidName(_))));

        let mut writer = storage.writer("big/one").await.unwrap();
        let piece = Bytes::from(vec![7u8; 3 << 20]);
        for _ in 0..4 {
            writer.write(piece.clone()).await.unwrap();
        }
        assert!(storage.head("big/one").await.is_err(), "nothing is there before the writer finishes");
        writer.finish().await.unwrap();
        assert_eq!(storage.head("big/one").await.unwrap().size, 12 << 20);
        let read: Vec<Bytes> =
            storage.read("big/one", (5 << 20)..(5 << 20) + 10).await.unwrap().try_collect().await.unwrap();
        assert_eq!(read.concat(), vec![7u8; 10]);
        let mut abandoned = storage.writer("big/two").await.unwrap();
        abandoned.write(piece).await.unwrap();
        abandoned.abort().await;
        assert!(matches!(storage.head("big/two").await, Err(StorageError::NotFound { .. })));
        let names: Vec<_> = storage.list("big/").await.unwrap().into_iter().map(|i| i.name).collect();
        assert_eq!(names, ["big/one"], "an aborted writer leaves nothing behind");
    }

    #[tokio::test]
    async fn local_storage_writes_once_and_lists_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LocalStorage::open(dir.path()).unwrap();
        exercise(&storage).await;
        let replace = storage.put("a/b/one", Bytes::new(), PutMode::Replace(Version("x".into()))).await;
        assert!(matches!(replace, Err(StorageError::Unsupported { .. })));
    }

    #[tokio::test]
    async fn remote_storage_keeps_names_under_its_prefix() {
        let memory = Arc::new(object_store::memory::InMemory::new());
        let storage = RemoteStorage::new(memory.clone(), "cluster-1", "memory".into());
        exercise(&storage).await;
        let (_, version) = storage.get("a/b/one").await.unwrap();
        let wrong = storage.put("a/b/one", Bytes::new(), PutMode::Replace(Version("\"nope\"".into()))).await;
        assert!(matches!(wrong, Err(StorageError::Precondition { .. })), "{wrong:?}");
        storage.put("a/b/one", Bytes::from_static(b"new"), PutMode::Replace(version)).await.unwrap();
        let raw = memory.head(&StorePath::from("cluster-1/a/b/one")).await.unwrap();
        assert_eq!(raw.size, 3);
    }
}
