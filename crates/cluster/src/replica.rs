//! A database whose history lives in shared storage: its log shipped as it grows — each
//! commit acknowledged only once its records are objects in the store and an entry of the
//! manifest under the owner's epoch (RPO 0) — and rebuilt from there on the node that takes it
//! over.
//!
//! Objects are named `history/<resource>/<epoch>/<random>`: nothing of the user's, never
//! written twice. A manifest entry lists the objects one shipment made (snapshots whole,
//! segments as byte ranges), so a fenced owner's late uploads are objects no entry names.
//!
//! A small shipment (a group commit's records, up to [`INLINE_MAX`]) travels inside its manifest
//! entry instead: one round trip to the coordinator rather than a PUT and then that round trip.
//! So that the manifest stays small, once [`COMPACT_AFTER`] bytes went inline the shipper
//! uploads them as one object per segment and publishes a *base* entry that lists every object
//! the log needs, then drops the entries before it; a rebuild starts over at a base.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures_util::StreamExt;
use kura_sqlite::{LogShipper, LogView, ShipError};
use serde::{Deserialize, Serialize};

use crate::coordinator::{Coordinator, CoordinatorError, Lease};
use crate::storage::{PutMode, SharedStorage, StorageError};

/// Objects a rebuild fetches at once.
const REBUILD_FETCHES: usize = 8;

/// Records up to this many bytes ship inside their manifest entry, with no object of their own.
pub const INLINE_MAX: u64 = 256 * 1024;

/// Bytes shipped inline after which they are compacted into objects and a base entry.
pub const COMPACT_AFTER: u64 = 4 * 1024 * 1024;

/// What one shipment put in the store, as its manifest entry records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Item {
    /// A whole snapshot file.
    Snapshot { seq: u64, object: String, len: u64 },
    /// Bytes `[offset, offset + len)` of the segment whose first record is `segment`.
    Records { segment: u64, offset: u64, len: u64, object: String },
    /// The same, carried in the entry itself (base64).
    Inline { segment: u64, offset: u64, len: u64, data: String },
}

impl Item {
    /// The object the item names, if it has one.
    fn object(&self) -> Option<&str> {
        match self {
            Item::Snapshot { object, .. } | Item::Records { object, .. } => Some(object),
            Item::Inline { .. } => None,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Shipment {
    pub(crate) items: Vec<Item>,
    /// The entry lists everything the log needs: a rebuild starts over here.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) base: bool,
}

/// How much of the log the store holds: snapshots by position, segments by length; and what a
/// base entry would list (the object-backed items since the last base, and where each
/// segment's inline bytes begin).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shipped {
    snapshots: BTreeSet<u64>,
    segments: BTreeMap<u64, u64>,
    objects: Vec<Item>,
    inline: BTreeMap<u64, u64>,
    inline_bytes: u64,
}

impl Shipped {
    /// Notes what a published shipment held.
    fn record(&mut self, items: &[Item]) {
        for item in items {
            match item {
                Item::Snapshot { seq, .. } => {
                    self.snapshots.insert(*seq);
                }
                Item::Records { segment, offset, len, .. } | Item::Inline { segment, offset, len, .. } => {
                    self.segments.insert(*segment, offset + len);
                }
            }
            match item {
                Item::Inline { segment, offset, len, .. } => {
                    let from = self.inline.entry(*segment).or_insert(*offset);
                    *from = (*from).min(*offset);
                    self.inline_bytes += len;
                }
                object => self.objects.push(object.clone()),
            }
        }
    }
}

/// A replica failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicaError {
    /// The coordinator refused or failed (fenced: another node owns the resource now).
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
    /// The store failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The manifest names something that does not fit (a gap, a short object).
    #[error("{resource}: {message}")]
    Inconsistent {
        /// The resource.
        resource: String,
        /// What does not fit.
        message: String,
    },
    /// Writing the rebuilt files failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// Building the database from the rebuilt log failed.
    #[error(transparent)]
    Database(#[from] kura_sqlite::Error),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ReplicaError + '_ {
    move |source| ReplicaError::Io { path: path.to_owned(), source }
}

/// Ships one database's log under its owner's lease. Called on the database's thread; the
/// uploads and the manifest commit run on the runtime it was made on.
#[derive(Debug)]
pub struct HistoryShipper {
    storage: SharedStorage,
    coordinator: Arc<dyn Coordinator>,
    lease: Lease,
    runtime: tokio::runtime::Handle,
    shipped: std::sync::Mutex<Shipped>,
    puts: AtomicU64,
    shipments: AtomicU64,
    compact_after: u64,
}

impl HistoryShipper {
    /// A shipper for the resource `lease` owns, starting from what the store holds already.
    /// Must be made inside a Tokio runtime.
    pub fn new(storage: SharedStorage, coordinator: Arc<dyn Coordinator>, lease: Lease, shipped: Shipped) -> Self {
        HistoryShipper {
            storage,
            coordinator,
            lease,
            runtime: tokio::runtime::Handle::current(),
            shipped: std::sync::Mutex::new(shipped),
            puts: AtomicU64::new(0),
            shipments: AtomicU64::new(0),
            compact_after: COMPACT_AFTER,
        }
    }

    /// Compacts once this many bytes went inline, instead of [`COMPACT_AFTER`].
    pub fn compact_after(mut self, bytes: u64) -> Self {
        self.compact_after = bytes;
        self
    }

    /// Objects written and manifest entries published so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.puts.load(Ordering::Relaxed), self.shipments.load(Ordering::Relaxed))
    }

    fn object_name(&self) -> String {
        let mut random = [0u8; 12];
        getrandom::fill(&mut random).expect("the system has randomness");
        format!("history/{}/{}/{}", self.lease.resource(), self.lease.epoch(), hex::encode(random))
    }

    /// What the view holds beyond what was shipped, with the bytes to upload.
    fn pending(&self, log: &LogView, shipped: &Shipped) -> Result<Vec<(Item, Bytes)>, ShipError> {
        let fail =
            |what: &str, path: &Path, e: std::io::Error| ShipError::new(format!("{what} {}: {e}", path.display()));
        let mut pending = Vec::new();
        for (seq, path) in &log.snapshots {
            if shipped.snapshots.contains(seq) {
                continue;
            }
            let bytes = std::fs::read(path).map_err(|e| fail("reading", path, e))?;
            let item = Item::Snapshot { seq: *seq, object: self.object_name(), len: bytes.len() as u64 };
            pending.push((item, Bytes::from(bytes)));
        }
        for segment in &log.segments {
            let sent = shipped.segments.get(&segment.first_seq).copied().unwrap_or(0);
            if segment.len < sent {
                // Recovery cut a damaged tail: the store's copy is cut at the same place.
                let item = Item::Records {
                    segment: segment.first_seq,
                    offset: segment.len,
                    len: 0,
                    object: self.object_name(),
                };
                pending.push((item, Bytes::new()));
                continue;
            }
            if segment.len == sent {
                continue;
            }
            let file = std::fs::File::open(&segment.path).map_err(|e| fail("opening", &segment.path, e))?;
            let mut bytes = vec![0u8; (segment.len - sent) as usize];
            file.read_exact_at(&mut bytes, sent).map_err(|e| fail("reading", &segment.path, e))?;
            let item = Item::Records {
                segment: segment.first_seq,
                offset: sent,
                len: bytes.len() as u64,
                object: self.object_name(),
            };
            pending.push((item, Bytes::from(bytes)));
        }
        Ok(pending)
    }

    /// Uploads the items' objects, then publishes the entry; answers the items as published and
    /// the entry's position.
    async fn upload_and_publish(
        &self,
        pending: Vec<(Item, Bytes)>,
        base: bool,
    ) -> Result<(Vec<Item>, u64), ReplicaError> {
        let uploads = pending.iter().filter_map(|(item, bytes)| {
            item.object().map(|object| self.storage.put(object, bytes.clone(), PutMode::New))
        });
        let mut puts = 0;
        for uploaded in futures_util::future::join_all(uploads).await {
            uploaded?;
            puts += 1;
        }
        self.puts.fetch_add(puts, Ordering::Relaxed);
        let items: Vec<Item> = pending.into_iter().map(|(item, _)| item).collect();
        let entry = Shipment { items, base };
        let bytes = serde_json::to_vec(&entry).expect("a shipment serialises");
        let published = self.coordinator.publish(&self.lease, Bytes::from(bytes)).await;
        tracing::debug!(
            resource = self.lease.resource(),
            epoch = self.lease.epoch(),
            ?published,
            base,
            "publishing a shipment"
        );
        let seq = published?;
        self.shipments.fetch_add(1, Ordering::Relaxed);
        Ok((entry.items, seq))
    }

    /// Turns the bytes shipped inline since the last base into objects (one per segment, from
    /// where its inline bytes begin to what was shipped) and publishes a base entry listing
    /// every object the log needs, then drops the entries before it. A segment the local log no
    /// longer holds was pruned: it lies wholly before a snapshot the log keeps, so no rebuild
    /// needs its inline part, and the base leaves it out.
    async fn compact(&self, log: &LogView, shipped: &mut Shipped) -> Result<(), ReplicaError> {
        let mut consolidated = Vec::new();
        for (segment, from) in &shipped.inline {
            let Some(file) = log.segments.iter().find(|s| s.first_seq == *segment) else { continue };
            let to = shipped.segments.get(segment).copied().unwrap_or(0);
            // A segment cut shorter than where its inline bytes began (recovery) is cut there.
            let start = (*from).min(to);
            let mut bytes = vec![0u8; (to - start) as usize];
            let opened = std::fs::File::open(&file.path).map_err(io(&file.path))?;
            opened.read_exact_at(&mut bytes, start).map_err(io(&file.path))?;
            let item =
                Item::Records { segment: *segment, offset: start, len: bytes.len() as u64, object: self.object_name() };
            consolidated.push((item, Bytes::from(bytes)));
        }
        // Per segment, the objects before its inline bytes, then the object that replaces them
        // (a rebuild cuts the segment where an item starts).
        let mut base: Vec<(Item, Bytes)> = shipped
            .objects
            .iter()
            .filter(|item| match item {
                Item::Records { segment, offset, .. } => {
                    let to = shipped.segments.get(segment).copied().unwrap_or(0);
                    shipped.inline.get(segment).is_none_or(|from| *offset < (*from).min(to))
                }
                _ => true,
            })
            .map(|item| (item.clone(), Bytes::new()))
            .collect();
        let uploads = consolidated.iter().map(|(item, bytes)| {
            self.storage.put(item.object().expect("consolidated records are objects"), bytes.clone(), PutMode::New)
        });
        for uploaded in futures_util::future::join_all(uploads).await {
            uploaded?;
        }
        self.puts.fetch_add(consolidated.len() as u64, Ordering::Relaxed);
        base.extend(consolidated.into_iter().map(|(item, _)| (item, Bytes::new())));
        // The objects are uploaded already: publish the entry alone.
        let entry = Shipment { items: base.into_iter().map(|(item, _)| item).collect(), base: true };
        let bytes = serde_json::to_vec(&entry).expect("a shipment serialises");
        let seq = self.coordinator.publish(&self.lease, Bytes::from(bytes)).await?;
        self.shipments.fetch_add(1, Ordering::Relaxed);
        shipped.objects = entry.items;
        shipped.inline.clear();
        shipped.inline_bytes = 0;
        self.coordinator.forget(&self.lease, seq).await?;
        Ok(())
    }
}

impl LogShipper for HistoryShipper {
    fn ship(&self, log: &LogView) -> Result<(), ShipError> {
        let mut shipped = self.shipped.lock().unwrap_or_else(|e| e.into_inner());
        let mut pending = self.pending(log, &shipped)?;
        if pending.is_empty() {
            return Ok(());
        }
        // A group commit's records go inside the entry; snapshots and large shipments as objects.
        let bytes: u64 = pending.iter().map(|(_, b)| b.len() as u64).sum();
        if bytes <= INLINE_MAX && pending.iter().all(|(item, _)| matches!(item, Item::Records { .. })) {
            use base64::Engine;
            for (item, data) in &mut pending {
                if let Item::Records { segment, offset, len, .. } = *item {
                    let data = base64::engine::general_purpose::STANDARD.encode(data);
                    *item = Item::Inline { segment, offset, len, data };
                }
            }
        }
        let fail = |e: ReplicaError| match e {
            ReplicaError::Coordinator(CoordinatorError::Fenced { .. }) => ShipError::superseded(e.to_string()),
            other => ShipError::new(other.to_string()),
        };
        let (items, _) = self.runtime.block_on(self.upload_and_publish(pending, false)).map_err(fail)?;
        shipped.record(&items);
        if shipped.inline_bytes >= self.compact_after {
            // The commit is in the store now, whatever becomes of the compaction: it is
            // acknowledged. A failed compaction is tried again at the next shipment (which
            // finds out, if so, that this node was fenced).
            if let Err(e) = self.runtime.block_on(self.compact(log, &mut shipped)) {
                tracing::warn!(resource = self.lease.resource(), error = %e, "compacting the manifest failed; retrying later");
            }
        }
        Ok(())
    }
}

/// Rebuilds the database at `db_path` (its file and the `log` directory beside it, whatever
/// was there before is removed) from the resource's history in the store, at its newest
/// position. Returns what the store holds, for the shipper that continues it; a resource with
/// no history yet leaves an empty directory.
pub async fn rebuild(
    storage: &SharedStorage,
    coordinator: &dyn Coordinator,
    resource: &str,
    db_path: &Path,
) -> Result<Shipped, ReplicaError> {
    let log = kura_sqlite::log_dir(db_path);
    rebuild_to(storage, coordinator, resource, db_path, &log).await.map(|(shipped, _)| shipped)
}

/// [`rebuild`] with the log in `log` (wherever it is kept), answering also the manifest
/// position the files hold everything up to.
pub(crate) async fn rebuild_to(
    storage: &SharedStorage,
    coordinator: &dyn Coordinator,
    resource: &str,
    db_path: &Path,
    log: &Path,
) -> Result<(Shipped, u64), ReplicaError> {
    let inconsistent = |message: String| ReplicaError::Inconsistent { resource: resource.to_owned(), message };
    let manifest = coordinator.manifest(resource, 0).await?;
    let reached = manifest.last().map_or(0, |published| published.seq);
    let beside = |suffix: &str| {
        let mut name = db_path.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    for stale in [db_path.to_owned(), beside("-wal"), beside("-shm")] {
        match std::fs::remove_file(&stale) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&stale)(e)),
            _ => {}
        }
    }
    match std::fs::remove_dir_all(log) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(log)(e)),
        _ => {}
    }
    std::fs::create_dir_all(log).map_err(io(log))?;
    let mut shipped = Shipped::default();
    let mut items = Vec::new();
    for published in manifest {
        let shipment: Shipment = serde_json::from_slice(&published.entry)
            .map_err(|e| inconsistent(format!("manifest entry {}: {e}", published.seq)))?;
        if shipment.base {
            // It lists everything the log needs: what came before it is superseded.
            items.clear();
        }
        items.extend(shipment.items);
    }
    // What a base would list, from the items; the positions are counted again as they apply.
    shipped.record(&items);
    shipped.snapshots.clear();
    shipped.segments.clear();
    // Fetched several at a time (restore time is download time), applied in manifest order.
    let mut fetched = futures_util::stream::iter(items.into_iter().map(|item| async move {
        match &item {
            Item::Inline { segment, data, .. } => {
                use base64::Engine;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .map_err(|e| inconsistent(format!("inline records of segment {segment}: {e}")))?;
                Ok((item, Bytes::from(bytes)))
            }
            Item::Snapshot { object, .. } | Item::Records { object, .. } => {
                let (bytes, _) = storage.get(object).await?;
                Ok::<_, ReplicaError>((item, bytes))
            }
        }
    }))
    .buffered(REBUILD_FETCHES);
    while let Some(next) = fetched.next().await {
        let (item, bytes) = next?;
        match item {
            Item::Snapshot { seq, len, .. } => {
                if bytes.len() as u64 != len {
                    return Err(inconsistent(format!("snapshot {seq} is {} bytes, not {len}", bytes.len())));
                }
                let path = log.join(kura_sqlite::snapshot_file_name(seq));
                std::fs::write(&path, &bytes).map_err(io(&path))?;
                shipped.snapshots.insert(seq);
            }
            Item::Records { segment, offset, len, .. } | Item::Inline { segment, offset, len, .. } => {
                if bytes.len() as u64 != len {
                    return Err(inconsistent(format!(
                        "records of segment {segment} are {} bytes, not {len}",
                        bytes.len()
                    )));
                }
                let have = shipped.segments.get(&segment).copied().unwrap_or(0);
                if offset > have {
                    return Err(inconsistent(format!("segment {segment} has a gap at {have}..{offset}")));
                }
                let path = log.join(kura_sqlite::segment_file_name(segment));
                let file =
                    OpenOptions::new().create(true).write(true).truncate(false).open(&path).map_err(io(&path))?;
                // A later shipment from an earlier offset replaces what followed it.
                file.set_len(offset).map_err(io(&path))?;
                file.write_all_at(&bytes, offset).map_err(io(&path))?;
                shipped.segments.insert(segment, offset + len);
            }
        }
    }
    for entry in std::fs::read_dir(log).map_err(io(log))? {
        let path = entry.map_err(io(log))?.path();
        std::fs::File::open(&path).and_then(|f| f.sync_all()).map_err(io(&path))?;
    }
    std::fs::File::open(log).and_then(|d| d.sync_all()).map_err(io(log))?;
    kura_sqlite::materialize_in(db_path, log)?;
    Ok((shipped, reached))
}

/// The objects a manifest names.
fn referenced(resource: &str, manifest: &[crate::coordinator::Published]) -> Result<BTreeSet<String>, ReplicaError> {
    let mut objects = BTreeSet::new();
    for published in manifest {
        // An entry that cannot be read might name anything: nothing is swept.
        let shipment: Shipment = serde_json::from_slice(&published.entry).map_err(|e| ReplicaError::Inconsistent {
            resource: resource.to_owned(),
            message: format!("manifest entry {}: {e}", published.seq),
        })?;
        objects.extend(shipment.items.iter().filter_map(Item::object).map(str::to_owned));
    }
    Ok(objects)
}

/// Removes the resource's objects no manifest entry names that were written under an epoch
/// before `lease`'s: uploads of owners that were fenced (or whose publish failed) and can never
/// be referenced now. The current owner's own objects are left alone, since one may be between
/// its upload and its publish. Returns how many were removed.
pub async fn sweep(
    storage: &SharedStorage,
    coordinator: &dyn Coordinator,
    lease: &Lease,
) -> Result<usize, ReplicaError> {
    let folder = format!("history/{}/", lease.resource());
    let listed = storage.list(&folder).await?;
    let keep = referenced(lease.resource(), &coordinator.manifest(lease.resource(), 0).await?)?;
    let mut removed = 0;
    for info in listed {
        let epoch =
            info.name.strip_prefix(&folder).and_then(|rest| rest.split('/').next()).and_then(|e| e.parse::<u64>().ok());
        if epoch.is_some_and(|e| e < lease.epoch()) && !keep.contains(&info.name) {
            storage.delete(&info.name).await?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Ships a database's log in the background instead of before each answer: commits are
/// acknowledged after the local fsync, and what they wrote reaches the store within about one
/// `interval` (the RPO of `--durability async`; a failover loses at most that). The newest view
/// of the log is kept and shipped whole each round, so a burst of commits costs one shipment.
#[derive(Debug)]
pub struct AsyncShipper {
    inner: Arc<HistoryShipper>,
    pending: Arc<std::sync::Mutex<Pending>>,
    wake: Arc<std::sync::Condvar>,
}

#[derive(Debug, Default)]
struct Pending {
    view: Option<LogView>,
    /// When the oldest commit not yet in the store was handed over.
    since: Option<std::time::Instant>,
    stopped: bool,
}

impl AsyncShipper {
    /// Ships through `inner` every `interval` on a thread of its own, until the ownership ends
    /// or the shipper is dropped.
    pub fn new(inner: Arc<HistoryShipper>, interval: std::time::Duration) -> Self {
        let pending: Arc<std::sync::Mutex<Pending>> = Arc::default();
        let wake = Arc::new(std::sync::Condvar::new());
        let (shipper, queue, signal) = (Arc::clone(&inner), Arc::clone(&pending), Arc::clone(&wake));
        std::thread::Builder::new()
            .name(format!("kura-ship-{}", &inner.lease.resource().chars().rev().take(8).collect::<String>()))
            .spawn(move || ship_in_background(shipper, queue, signal, interval))
            .expect("a shipping thread starts");
        AsyncShipper { inner, pending, wake }
    }

    /// How long the oldest commit not yet in the store has waited; zero when all are there.
    pub fn lag(&self) -> std::time::Duration {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.since.map(|s| s.elapsed()).unwrap_or_default()
    }

    /// The shipper underneath, for its counts.
    pub fn inner(&self) -> &Arc<HistoryShipper> {
        &self.inner
    }
}

impl Drop for AsyncShipper {
    fn drop(&mut self) {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).stopped = true;
        self.wake.notify_all();
    }
}

impl LogShipper for AsyncShipper {
    fn ship(&self, log: &LogView) -> Result<(), ShipError> {
        if !self.inner.lease.is_valid() {
            // Acknowledging a commit no one will ever ship would be a lie even in this mode.
            return Err(ShipError::superseded(format!(
                "{}: this node's ownership has ended",
                self.inner.lease.resource()
            )));
        }
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.view = Some(log.clone());
        pending.since.get_or_insert_with(std::time::Instant::now);
        Ok(())
    }
}

fn ship_in_background(
    shipper: Arc<HistoryShipper>,
    pending: Arc<std::sync::Mutex<Pending>>,
    wake: Arc<std::sync::Condvar>,
    interval: std::time::Duration,
) {
    loop {
        let (view, since) = {
            let mut guard = pending.lock().unwrap_or_else(|p| p.into_inner());
            guard = wake.wait_timeout(guard, interval).unwrap_or_else(|p| p.into_inner()).0;
            if guard.stopped && guard.view.is_none() {
                return;
            }
            match guard.view.take() {
                Some(view) => (view, guard.since.take()),
                None => continue,
            }
        };
        match shipper.ship(&view) {
            Ok(()) => {}
            Err(e) if e.is_superseded() => {
                tracing::error!(resource = shipper.lease.resource(), error = %e, "the ownership ended with commits not yet shipped; they are lost to the cluster");
                return;
            }
            Err(e) => {
                tracing::warn!(resource = shipper.lease.resource(), error = %e, "background shipping failed; retrying");
                let mut guard = pending.lock().unwrap_or_else(|p| p.into_inner());
                // A newer view supersedes this one; the lag still counts from the older commit.
                guard.view.get_or_insert(view);
                guard.since = since.or(guard.since);
            }
        }
    }
}
