//! The catalog several nodes share: each node keeps a copy, a write takes the `catalog`
//! ownership for as long as it runs (so writes from different nodes are serialised by the
//! coordinator, each on the newest copy), and the copy with the write is an object in the store,
//! published under that ownership's epoch, before the write is acknowledged. Other nodes bring
//! the newest copy in when they look for something they do not find, and every few hundred
//! milliseconds.
//!
//! The catalog is small and written rarely (databases, buckets and tokens created or removed),
//! so each write publishes the whole file rather than a log of changes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kura_catalog::{Catalog, Replication, ReplicationError};
use serde::{Deserialize, Serialize};

use crate::coordinator::{Acquired, Coordinator, Lease};
use crate::storage::{PutMode, SharedStorage, StorageError};
use crate::wait;

/// The coordinator's resource for the catalog.
pub const CATALOG_RESOURCE: &str = "catalog";

/// How long a write waits for other nodes' writes before it gives up.
const WRITE_WAIT: Duration = Duration::from_secs(15);

/// A published copy, as its manifest entry names it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CatalogEntry {
    object: String,
    len: u64,
}

/// One node's side of the shared catalog (see the module's documentation).
pub struct SharedCatalog {
    storage: SharedStorage,
    coordinator: Arc<dyn Coordinator>,
    runtime: tokio::runtime::Handle,
    /// Where copies from the store land, beside the catalog file (the install renames it).
    incoming: PathBuf,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The manifest position this node's copy reflects.
    applied: u64,
    /// The ownership a write in progress holds.
    writing: Option<Lease>,
}

impl std::fmt::Debug for SharedCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCatalog").field("coordinator", &self.coordinator.describe()).finish_non_exhaustive()
    }
}

impl SharedCatalog {
    /// The shared side of the catalog file at `catalog_path`. Must be made inside a Tokio
    /// runtime with several worker threads (its calls block in place).
    pub fn new(storage: SharedStorage, coordinator: Arc<dyn Coordinator>, catalog_path: &Path) -> Self {
        SharedCatalog {
            storage,
            coordinator,
            runtime: tokio::runtime::Handle::current(),
            incoming: catalog_path.with_extension("sqlite.incoming"),
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The newest published copy after `after`, downloaded to the incoming file, with its
    /// position; `None` if nothing newer was published.
    async fn fetch_after(&self, after: u64) -> Result<Option<(u64, PathBuf)>, ReplicationError> {
        // A copy can be removed between reading the manifest and fetching it (two writes
        // later): read the manifest again.
        for _ in 0..5 {
            let entries = self.coordinator.manifest(CATALOG_RESOURCE, after).await.map_err(coordinator)?;
            // Fences (a new owner's empty entry) carry no copy.
            let Some(newest) = entries.iter().rev().find(|e| !e.entry.is_empty()) else {
                if let Some(last) = entries.last() {
                    let mut state = self.state();
                    state.applied = state.applied.max(last.seq);
                }
                return Ok(None);
            };
            let entry: CatalogEntry = serde_json::from_slice(&newest.entry)
                .map_err(|e| ReplicationError::Unusable(format!("catalog manifest entry {}: {e}", newest.seq)))?;
            let bytes = match self.storage.get(&entry.object).await {
                Ok((bytes, _)) => bytes,
                Err(StorageError::NotFound { .. }) => continue,
                Err(e) => return Err(store(e)),
            };
            if bytes.len() as u64 != entry.len {
                return Err(ReplicationError::Unusable(format!(
                    "catalog copy {} is {} bytes, not {}",
                    entry.object,
                    bytes.len(),
                    entry.len
                )));
            }
            write_synced(&self.incoming, &bytes).map_err(|source| ReplicationError::File {
                doing: "",
                path: self.incoming.clone(),
                source,
            })?;
            return Ok(Some((newest.seq, self.incoming.clone())));
        }
        Err(ReplicationError::TooFast)
    }

    fn fetch(&self, after: u64) -> Result<Option<PathBuf>, ReplicationError> {
        let fetched = wait(&self.runtime, self.fetch_after(after))?;
        Ok(fetched.map(|(seq, path)| {
            self.state().applied = seq;
            path
        }))
    }

    async fn take_ownership(&self) -> Result<Lease, ReplicationError> {
        let deadline = Instant::now() + WRITE_WAIT;
        loop {
            match self.coordinator.acquire(CATALOG_RESOURCE).await.map_err(coordinator)? {
                Acquired::Owned(lease) => return Ok(lease),
                Acquired::Held(owner) if Instant::now() >= deadline => {
                    return Err(ReplicationError::Held { node: owner.node, waited: WRITE_WAIT });
                }
                Acquired::Held(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    async fn publish_copy(&self, lease: &Lease, copy: &Path) -> Result<u64, ReplicationError> {
        let bytes = std::fs::read(copy).map_err(|source| ReplicationError::File {
            doing: "",
            path: copy.to_owned(),
            source,
        })?;
        let mut random = [0u8; 12];
        getrandom::fill(&mut random).expect("the system has randomness");
        let object = format!("{CATALOG_RESOURCE}/{}/{}", lease.epoch(), hex::encode(random));
        let entry = CatalogEntry { object: object.clone(), len: bytes.len() as u64 };
        self.storage.put(&object, Bytes::from(bytes), PutMode::New).await.map_err(store)?;
        let entry = serde_json::to_vec(&entry).expect("an entry serialises");
        let seq = match self.coordinator.publish(lease, Bytes::from(entry)).await {
            Ok(seq) => seq,
            // The answer may be lost while the entry landed: the manifest says which.
            Err(e) => match self.newest_entry().await {
                Ok(Some((seq, newest))) if newest.object == object => seq,
                _ => return Err(coordinator(e)),
            },
        };
        // Only the newest copy matters; the one before it stays a while for nodes fetching it.
        if let Err(e) = self.tidy(lease, seq, &object).await {
            tracing::warn!(error = %e, "could not remove older catalog copies");
        }
        Ok(seq)
    }

    async fn newest_entry(&self) -> Result<Option<(u64, CatalogEntry)>, ReplicationError> {
        let entries = self.coordinator.manifest(CATALOG_RESOURCE, 0).await.map_err(coordinator)?;
        let Some(newest) = entries.iter().rev().find(|e| !e.entry.is_empty()) else { return Ok(None) };
        let entry = serde_json::from_slice(&newest.entry)
            .map_err(|e| ReplicationError::Unusable(format!("catalog manifest entry {}: {e}", newest.seq)))?;
        Ok(Some((newest.seq, entry)))
    }

    /// Forgets manifest entries before the newest two and removes copies of earlier epochs
    /// that neither names; a later owner's copies (higher epochs) are never touched, even if
    /// this node's ownership ended meanwhile.
    async fn tidy(&self, lease: &Lease, seq: u64, newest: &str) -> Result<(), ReplicationError> {
        let kept = self.coordinator.manifest(CATALOG_RESOURCE, seq.saturating_sub(2)).await.map_err(coordinator)?;
        let mut keep: Vec<String> = vec![newest.to_owned()];
        for published in &kept {
            if let Ok(entry) = serde_json::from_slice::<CatalogEntry>(&published.entry) {
                keep.push(entry.object);
            }
        }
        self.coordinator.forget(lease, seq.saturating_sub(1)).await.map_err(coordinator)?;
        let folder = format!("{CATALOG_RESOURCE}/");
        for info in self.storage.list(&folder).await.map_err(store)? {
            let epoch =
                info.name.strip_prefix(&folder).and_then(|r| r.split('/').next()).and_then(|e| e.parse::<u64>().ok());
            if epoch.is_some_and(|e| e < lease.epoch()) && !keep.contains(&info.name) {
                self.storage.delete(&info.name).await.map_err(store)?;
            }
        }
        Ok(())
    }
}

impl Replication for SharedCatalog {
    fn begin_write(&self) -> Result<Option<PathBuf>, ReplicationError> {
        let lease = wait(&self.runtime, self.take_ownership())?;
        self.state().writing = Some(lease);
        let applied = self.state().applied;
        let fetched = self.fetch(applied);
        if fetched.is_err() {
            self.end_write();
        }
        fetched
    }

    fn publish(&self, copy: &Path) -> Result<(), ReplicationError> {
        let lease = self.state().writing.clone().ok_or(ReplicationError::NotWriting)?;
        let seq = wait(&self.runtime, self.publish_copy(&lease, copy))?;
        self.state().applied = seq;
        Ok(())
    }

    fn end_write(&self) {
        let Some(lease) = self.state().writing.take() else { return };
        if let Err(e) = wait(&self.runtime, self.coordinator.release(&lease)) {
            tracing::warn!(error = %e, "could not give the catalog up; retrying in the background");
            let coordinator = Arc::clone(&self.coordinator);
            self.runtime.spawn(async move {
                for _ in 0..20 {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    if !lease.is_valid() || coordinator.release(&lease).await.is_ok() {
                        return;
                    }
                }
                tracing::error!(
                    "could not give the catalog up; other nodes' catalog writes wait for this node's lease to end"
                );
            });
        }
    }

    fn newer(&self) -> Result<Option<PathBuf>, ReplicationError> {
        let applied = self.state().applied;
        self.fetch(applied)
    }

    fn wait(&self, f: &mut dyn FnMut()) {
        match tokio::runtime::Handle::try_current() {
            Ok(_) => tokio::task::block_in_place(f),
            Err(_) => f(),
        }
    }
}

fn coordinator(e: crate::coordinator::CoordinatorError) -> ReplicationError {
    ReplicationError::Coordinator(Box::new(e))
}

fn store(e: StorageError) -> ReplicationError {
    ReplicationError::Store(Box::new(e))
}

/// Brings newer copies of a shared catalog in every `every` until `stop` resolves.
pub async fn follow(catalog: Arc<Catalog>, every: Duration, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(every) => {
                let catalog = Arc::clone(&catalog);
                if let Ok(Err(e)) = tokio::task::spawn_blocking(move || catalog.refresh()).await {
                    tracing::warn!(error = %e, "could not bring in the cluster's catalog");
                }
            }
        }
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}
