//! Read replicas on the nodes that do not own a file: a copy rebuilt from the store as a
//! takeover would rebuild it, then kept current by reading the manifest after the position it
//! holds and applying what each entry shipped ([`kura_sqlite::Replica`]).
//!
//! A copy is made the first time a read asks for one (that read, and any until the copy is
//! built, go to the owner), is caught up every [`POLL`] while reads keep coming, and at once when
//! a read needs a newer state than it holds; after [`IDLE`] without reads it is dropped with its
//! files. Whatever does not follow from the copy (a restore, a cut, a gap the manifest cannot
//! fill) makes a new one from the store, and the old one is dropped once its last read ends.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kura_sqlite::{Continuity, DatabaseOptions, ReadReplicas, Replica, ReplicaFigures};

use crate::coordinator::Coordinator;
use crate::placement::Kind;
use crate::replica::{Item, ReplicaError, Shipment, rebuild_to};
use crate::storage::SharedStorage;

/// How often a copy in use reads the manifest for what its owner shipped since.
pub const POLL: Duration = Duration::from_millis(100);

/// A copy no read asked for in this long is dropped.
pub const IDLE: Duration = Duration::from_secs(60);

/// Copies made in this process, naming each one's directory.
static GENERATIONS: AtomicU64 = AtomicU64::new(0);

/// Catch-ups failing in a row after which a copy is no longer served (about a second): its
/// staleness would have no bound.
const FAILURES_BEFORE_DROPPING: u32 = 10;

/// How long a read that needs the copy caught up waits for a catch-up or build under way
/// before it goes to the owner instead.
const CATCH_UP_WAIT: Duration = Duration::from_millis(50);

/// This node's copies of one kind of file (D1 databases) owned by other nodes.
#[derive(Clone)]
pub struct ClusterReplicas {
    inner: Arc<Inner>,
}

struct Inner {
    kind: Kind,
    storage: SharedStorage,
    coordinator: Arc<dyn Coordinator>,
    root: PathBuf,
    copies: Mutex<HashMap<String, Arc<Copy>>>,
}

/// One file's copy, and where in the owner's manifest it is.
struct Copy {
    key: String,
    current: Mutex<Option<Arc<Replica>>>,
    /// Held while building or catching up: the manifest position the copy holds everything to.
    following: tokio::sync::Mutex<u64>,
    building: AtomicBool,
    last_read: Mutex<Instant>,
    /// When the copy was last found holding everything the manifest lists.
    current_at: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for ClusterReplicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterReplicas").field("kind", &self.inner.kind).finish_non_exhaustive()
    }
}

/// Whether a manifest entry is a base (it lists everything the log needs).
fn is_base(entry: &[u8]) -> bool {
    serde_json::from_slice::<Shipment>(entry).is_ok_and(|shipment| shipment.base)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Copy {
    fn current(&self) -> Option<Arc<Replica>> {
        lock(&self.current).clone()
    }
}

impl ClusterReplicas {
    /// Copies of `kind`, to be kept under `root`.
    pub fn new(kind: Kind, storage: SharedStorage, coordinator: Arc<dyn Coordinator>, root: PathBuf) -> Self {
        let copies = Mutex::default();
        ClusterReplicas { inner: Arc::new(Inner { kind, storage, coordinator, root, copies }) }
    }

    /// Removes the copies an earlier run left (once the data directory is this process's): a
    /// copy is never reused after a restart, since its owner may have moved on in any way.
    pub fn remove_leftovers(&self) -> std::io::Result<()> {
        match std::fs::remove_dir_all(&self.inner.root) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

impl Inner {
    fn copy(&self, key: &str) -> Arc<Copy> {
        let mut copies = lock(&self.copies);
        let copy = copies.entry(key.to_owned()).or_insert_with(|| {
            Arc::new(Copy {
                key: key.to_owned(),
                current: Mutex::default(),
                following: tokio::sync::Mutex::new(0),
                building: AtomicBool::new(false),
                last_read: Mutex::new(Instant::now()),
                current_at: Mutex::default(),
            })
        });
        Arc::clone(copy)
    }

    fn is_kept(&self, copy: &Arc<Copy>) -> bool {
        lock(&self.copies).get(&copy.key).is_some_and(|kept| Arc::ptr_eq(kept, copy))
    }

    /// Builds a new copy from the store, in a directory of its own, and serves it from now on.
    async fn build(&self, copy: &Copy, following: &mut u64, options: DatabaseOptions) -> Result<(), ReplicaError> {
        let asked_at = Instant::now();
        // Unique in the process: a copy made after another of the same file was dropped (or
        // while it is still being read) never shares its directory.
        let generation = GENERATIONS.fetch_add(1, Ordering::Relaxed) + 1;
        let dir = self.root.join(&copy.key).join(generation.to_string());
        let io = |e: std::io::Error| ReplicaError::Io { path: dir.clone(), source: e };
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io)?;
        }
        std::fs::create_dir_all(&dir).map_err(io)?;
        let db_path = dir.join("db.sqlite");
        let resource = self.kind.resource(&copy.key);
        let built = async {
            let (_, reached) =
                rebuild_to(&self.storage, &*self.coordinator, &resource, &db_path, &kura_sqlite::log_dir(&db_path))
                    .await?;
            let key = copy.key.clone();
            let opened = tokio::task::spawn_blocking(move || Replica::open(&key, &db_path, options)).await;
            let replica = opened.map_err(|e| io(std::io::Error::other(e)))??;
            Ok::<_, ReplicaError>((replica, reached))
        };
        match built.await {
            Ok((replica, reached)) => {
                *following = reached;
                *lock(&copy.current) = Some(Arc::new(replica));
                *lock(&copy.current_at) = Some(asked_at);
                tracing::debug!(resource, position = reached, "a read replica was built");
                Ok(())
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// Applies what the manifest lists after the copy's position; a copy that stops following
    /// is built again. With `at_least`, a copy found there already once its turn comes is left.
    async fn catch_up(
        &self,
        copy: &Copy,
        at_least: Option<u64>,
        options: &DatabaseOptions,
    ) -> Result<(), ReplicaError> {
        let mut following = match at_least {
            // A read waits only briefly (a build may take long): the owner serves it meanwhile.
            Some(_) => match tokio::time::timeout(CATCH_UP_WAIT, copy.following.lock()).await {
                Ok(following) => following,
                Err(_) => return Ok(()),
            },
            None => copy.following.lock().await,
        };
        let Some(replica) = copy.current() else { return Ok(()) };
        if at_least.is_some_and(|at_least| replica.position() >= at_least) {
            return Ok(());
        }
        let asked_at = Instant::now();
        let resource = self.kind.resource(&copy.key);
        let inconsistent = |message: String| ReplicaError::Inconsistent { resource: resource.clone(), message };
        for published in self.coordinator.manifest(&resource, *following).await? {
            if published.seq > *following + 1 && !is_base(&published.entry) {
                // Entries the copy never saw were dropped: only a base may stand for them.
                let why = format!("manifest entries {} to {} were dropped", *following + 1, published.seq - 1);
                tracing::info!(resource, why, "a read replica cannot follow its owner's manifest; building it again");
                *lock(&copy.current) = None;
                return self.build(copy, &mut following, options.clone()).await;
            }
            let shipment: Shipment = serde_json::from_slice(&published.entry)
                .map_err(|e| inconsistent(format!("manifest entry {}: {e}", published.seq)))?;
            for item in shipment.items {
                let (segment, offset, len) = match &item {
                    Item::Snapshot { .. } => continue,
                    Item::Records { segment, offset, len, .. } | Item::Inline { segment, offset, len, .. } => {
                        (*segment, *offset, *len)
                    }
                };
                if !replica.lacks(segment, offset, len) {
                    continue;
                }
                let bytes = match item {
                    Item::Inline { data, .. } => {
                        use base64::Engine;
                        base64::engine::general_purpose::STANDARD
                            .decode(data)
                            .map_err(|e| inconsistent(format!("inline records of segment {segment}: {e}")))?
                            .into()
                    }
                    Item::Records { object, .. } => self.storage.get(&object).await?.0,
                    Item::Snapshot { .. } => continue,
                };
                let applying = Arc::clone(&replica);
                let applied = tokio::task::spawn_blocking(move || applying.append(segment, offset, &bytes)).await;
                let continuity = applied.map_err(|e| ReplicaError::Io {
                    path: self.root.join(&copy.key),
                    source: std::io::Error::other(e),
                })??;
                if let Continuity::Broken(why) = continuity {
                    tracing::info!(
                        resource,
                        why,
                        "a read replica stopped following its owner's log; building it again"
                    );
                    // Not served from now on: what it holds may not be the owner's any more.
                    *lock(&copy.current) = None;
                    return self.build(copy, &mut following, options.clone()).await;
                }
            }
            *following = published.seq;
        }
        *lock(&copy.current_at) = Some(asked_at);
        Ok(())
    }

    /// Builds the copy in the background, then keeps it current while reads use it.
    fn start(self: &Arc<Self>, copy: Arc<Copy>, options: DatabaseOptions) {
        if copy.building.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = Arc::clone(self);
        tokio::spawn(async move {
            {
                let mut following = copy.following.lock().await;
                if let Err(e) = inner.build(&copy, &mut following, options.clone()).await {
                    tracing::warn!(key = copy.key, error = %e, "building a read replica failed; reads go to the owner");
                    // The next read tries again.
                    lock(&inner.copies).retain(|_, kept| !Arc::ptr_eq(kept, &copy));
                    return;
                }
            }
            let mut failing = 0u32;
            loop {
                tokio::time::sleep(POLL).await;
                if !inner.is_kept(&copy) {
                    break;
                }
                if lock(&copy.last_read).elapsed() >= IDLE {
                    lock(&inner.copies).retain(|_, kept| !Arc::ptr_eq(kept, &copy));
                    tracing::debug!(key = copy.key, "dropped a read replica no read asked for lately");
                    break;
                }
                let caught_up = match copy.current().is_some() {
                    true => inner.catch_up(&copy, None, &options).await,
                    // No longer served: built again.
                    false => {
                        let mut following = copy.following.lock().await;
                        inner.build(&copy, &mut following, options.clone()).await
                    }
                };
                match caught_up {
                    Ok(()) => failing = 0,
                    Err(e) => {
                        failing += 1;
                        if failing == 1 {
                            tracing::warn!(key = copy.key, error = %e, "catching a read replica up failed; retrying");
                        }
                        if failing == FAILURES_BEFORE_DROPPING {
                            tracing::warn!(key = copy.key, "a read replica that cannot catch up is no longer served");
                            *lock(&copy.current) = None;
                        }
                    }
                }
            }
        });
    }
}

#[async_trait::async_trait]
impl ReadReplicas for ClusterReplicas {
    async fn replica(
        &self,
        key: &str,
        at_least: u64,
        options: &(dyn Fn() -> DatabaseOptions + Sync),
    ) -> Option<Arc<Replica>> {
        let copy = self.inner.copy(key);
        *lock(&copy.last_read) = Instant::now();
        let Some(replica) = copy.current().filter(|replica| replica.broken().is_none()) else {
            self.inner.start(copy, options());
            return None;
        };
        if replica.position() >= at_least {
            return Some(replica);
        }
        if let Err(e) = self.inner.catch_up(&copy, Some(at_least), &options()).await {
            tracing::debug!(key, error = %e, "catching a read replica up failed; the read goes to the owner");
            return None;
        }
        copy.current().filter(|replica| replica.position() >= at_least && replica.broken().is_none())
    }

    fn discard(&self, key: &str) {
        lock(&self.inner.copies).remove(key);
    }

    fn figures(&self) -> Vec<ReplicaFigures> {
        let copies: Vec<Arc<Copy>> = lock(&self.inner.copies).values().cloned().collect();
        let mut figures: Vec<ReplicaFigures> = copies
            .iter()
            .map(|copy| ReplicaFigures {
                key: copy.key.clone(),
                position: copy.current().map_or(0, |replica| replica.position()),
                behind: lock(&copy.current_at).map(|at| at.elapsed()),
            })
            .collect();
        figures.sort_by(|a, b| a.key.cmp(&b.key));
        figures
    }
}
