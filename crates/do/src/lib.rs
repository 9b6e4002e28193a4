//! kura's Durable Objects engine: namespaces' object ids ([`id`], derived exactly as workerd
//! derives them locally), one SQLite file per object owned by an actor (requests to one object
//! run one at a time, in arrival order; objects run in parallel), the storage API a request
//! sees ([`Storage`]: SQL, KV, alarm, `transaction_sync`, `delete_all`), point-in-time
//! recovery on the Time Travel log, the namespace index that lists objects by name, exports,
//! fan-out queries, and the alarm schedule ([`alarm`]).
//!
//! On disk, under the engine's root:
//!
//! ```text
//! <namespace id>/meta.sqlite                    the index: objects (with names) and alarms
//! <namespace id>/<xx>/<object id>/db.sqlite     one object's storage (xx: its first two digits)
//! <namespace id>/<xx>/<object id>/log/          its history, for point-in-time recovery
//! ```
//!
//! Directory names are storage ids and object ids (hex), never names a user chose.

#![deny(missing_docs)]

pub mod alarm;
mod error;
mod hosted;
pub mod id;
mod index;
mod namespace;
mod session;
mod storage;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use kura_sqlite::dump::{DumpOptions, dump};
use kura_sqlite::{DatabaseOptions, HistorySettings, Limits, Placement, PlacementError, Registry, RegistrySettings};
use tokio::sync::{Notify, oneshot};

pub use error::{DoError, Result};

/// A boxed future, as requests and alarm deliveries are.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;
pub use id::{IdError, IdFactory, ObjectId};
pub use index::{DueAlarm, ObjectEntry};
pub use kura_sqlite::{Bookmark, Restored, Value};
pub use namespace::Namespace;
pub use session::Session;
pub use storage::{AlarmChange, CommitNotice, Cursor, ListOptions, MAX_KV_BATCH, MAX_KV_ENTRY_BYTES, Storage, now_ms};

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct DoSettings {
    /// The object actors: how many files stay open, how long an idle one stays open.
    pub registry: RegistrySettings,
    /// Each object's history (point-in-time recovery keeps 30 days).
    pub history: HistorySettings,
    /// Longest a request may hold its object before it is rolled back: in all, for a request
    /// served on its object's thread ([`DurableObjects::serve`]); between two storage calls,
    /// for a [`Session`] from [`DurableObjects::begin`] (an alarm handler may run for 15
    /// minutes).
    pub session_idle_limit: Duration,
    /// Objects a fan-out query reads at once.
    pub fan_out_parallelism: usize,
    /// In a cluster, which node serves each namespace and holds its objects' files; `None`
    /// serves everything here.
    pub cluster: Option<DoCluster>,
}

/// How the engine runs as one node of several (kura-cluster implements both placements). A
/// namespace is served by one node at a time — its index, its alarms, its fan-outs and every
/// request to its objects — so a namespace's work never spans nodes; each object's file is
/// shipped on its own, and claimed (rebuilt from the store) by the namespace's node as it is
/// reached.
#[derive(Debug, Clone)]
pub struct DoCluster {
    /// Namespaces' indexes, by storage id.
    pub namespaces: Arc<dyn Placement>,
    /// Objects' files, by `<namespace id>/<object id>`.
    pub objects: Arc<dyn Placement>,
}

impl Default for DoSettings {
    fn default() -> Self {
        DoSettings {
            registry: RegistrySettings {
                max_open: 1024,
                queue_depth: 256,
                idle_timeout: Duration::from_secs(30),
                max_group: 64,
            },
            history: HistorySettings {
                // Objects are many and mostly small: seal and snapshot on smaller logs than D1.
                segment_bytes: 16 * 1024 * 1024,
                snapshot_log_bytes: 16 * 1024 * 1024,
                ..HistorySettings::default()
            },
            session_idle_limit: Duration::from_secs(15 * 60),
            fan_out_parallelism: 4,
            cluster: None,
        }
    }
}

/// One object's row of a fan-out query: its rows, or why it has none.
#[derive(Debug)]
pub struct FanOutRow {
    /// The object.
    pub object: ObjectEntry,
    /// Its result.
    pub outcome: Result<Cursor>,
}

/// One object of a listing, with its size on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectSummary {
    /// The index entry.
    pub entry: ObjectEntry,
    /// Bytes its database file and WAL take (0: nothing stored yet).
    pub stored_bytes: u64,
}

struct Inner {
    root: PathBuf,
    registry: Registry,
    settings: DoSettings,
    /// Namespaces whose index schema is in place (one entry per namespace ever used).
    indexed: Mutex<HashSet<String>>,
    alarm_wake: Notify,
    /// The histories of objects another process runs.
    hosted: Arc<hosted::Hosted>,
    /// What alarm deliveries came to.
    alarm_figures: alarm::AlarmFigures,
    /// In a cluster, asks the process that runs hosted objects to let go of every file it has
    /// open (workerd restarts), for a file this node must rebuild.
    hosted_let_go: std::sync::OnceLock<Arc<dyn Fn() + Send + Sync>>,
    /// In a cluster, namespaces found to have a history in the store.
    with_history: Mutex<HashSet<String>>,
}

/// How long a claim waits for the process running hosted objects to close a file it opened
/// while the claim was under way, before rebuilding it anyway.
/// Longer than a restart's drain of the Workers' requests and its start.
const HOSTED_CLOSE_PATIENCE: Duration = Duration::from_secs(60);

/// How long a call waits for an object another call or a rebuild holds. A call can wait on
/// itself (an object calling itself, or a chain back to it, while its file must be rebuilt):
/// it then fails as unavailable instead of waiting for ever.
const HOSTED_CALL_PATIENCE: Duration = Duration::from_secs(5);

/// A call to an object another process runs, claimed on this node (in a cluster): the
/// object's file is not rebuilt while this is held.
#[derive(Debug)]
pub struct HostedCall {
    _held: Option<tokio::sync::OwnedRwLockReadGuard<()>>,
}

/// The engine. Cheap to clone.
#[derive(Clone)]
pub struct DurableObjects {
    inner: Arc<Inner>,
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

impl DurableObjects {
    /// The engine keeping its files under `root`.
    pub fn open(root: impl Into<PathBuf>, settings: DoSettings) -> Result<Self> {
        let root = root.into();
        std::fs::create_dir_all(&root).map_err(|e| match kura_sqlite::is_disk_full(&e) {
            true => DoError::storage(e),
            false => DoError::Storage(format!("creating {}: {e}", root.display())),
        })?;
        let opener_root = root.clone();
        let history = settings.history.clone();
        let hosted = hosted::Hosted::start(
            root.clone(),
            history.clone(),
            settings.cluster.as_ref().map(|c| Arc::clone(&c.objects)),
        );
        if settings.cluster.is_some() {
            hosted::unschedule_everywhere(&root);
        }
        let cluster = settings.cluster.clone();
        let registry = Registry::new(settings.registry.clone(), move |key: &str| {
            open_options(&opener_root, &history, cluster.as_ref(), key)
        });
        Ok(DurableObjects {
            inner: Arc::new(Inner {
                root,
                registry,
                settings,
                indexed: Mutex::new(HashSet::new()),
                alarm_wake: Notify::new(),
                hosted,
                alarm_figures: alarm::AlarmFigures::default(),
                hosted_let_go: std::sync::OnceLock::new(),
                with_history: Mutex::new(HashSet::new()),
            }),
        })
    }

    fn object_dir(&self, ns: &Namespace, id: &ObjectId) -> PathBuf {
        let hex = id.to_string();
        self.inner.root.join(&ns.storage_id).join(&hex[..2]).join(hex)
    }

    /// The file another process keeps an object of a namespace hosted elsewhere in.
    fn hosted_file(&self, ns: &Namespace, hex: &str) -> PathBuf {
        self.inner.hosted.file(&ns.storage_id, hex)
    }

    /// Refuses to run requests on objects another process runs.
    fn runs_here(&self, ns: &Namespace) -> Result<()> {
        if ns.elsewhere {
            return Err(DoError::Invalid(
                "this namespace's objects run in workerd (a deployed Worker's class): kura lists, reads and exports them, \
                 but requests go through the Worker"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Opens a hosted object's file read-only, beside the process that writes it.
    fn open_hosted(&self, ns: &Namespace, hex: &str) -> Result<Option<kura_sqlite::Database>> {
        let path = self.hosted_file(ns, hex);
        if !path.exists() {
            return Ok(None);
        }
        let mut options = DatabaseOptions::new(path).read_only(true).compact(true);
        options.limits = Limits::durable_object();
        kura_sqlite::Database::open(&options).map(Some).map_err(DoError::from_sql)
    }

    /// Lists an object another process runs (announced as it starts), with its name, and
    /// starts capturing its history.
    pub async fn register(&self, ns: &Namespace, id: &ObjectId) -> Result<()> {
        let (hex, name, now) = (id.to_string(), id.name().map(str::to_owned), now_ms());
        self.index_write(ns, move |c| index::register(c, &hex, name.as_deref(), now)).await?;
        if ns.elsewhere {
            let (hosted, ns, hex) = (Arc::clone(&self.inner.hosted), ns.storage_id.clone(), id.to_string());
            blocking(move || hosted.announce(&ns, &hex)).await?;
        }
        Ok(())
    }

    /// In a cluster, what asks the process running hosted objects to close their files (see
    /// [`DurableObjects::claim_hosted`]); set once, when that process's supervisor exists.
    pub fn set_hosted_let_go(&self, let_go: Arc<dyn Fn() + Send + Sync>) {
        let _ = self.inner.hosted_let_go.set(let_go);
    }

    /// In a cluster, before a call reaches an object another process runs: its namespace is
    /// served here, and its file is this node's, rebuilt from the store with its history when
    /// first reached here. A file the other process still has open from an earlier ownership
    /// of this node's is not rebuilt under it: the process is asked to let go, and the call is
    /// refused as unavailable (a retry finds the file closed). Alone, a no-op.
    ///
    /// The answer holds the object for the call: its file is not rebuilt until it is dropped
    /// (hold it until the call has been made and shipped).
    pub async fn claim_hosted(&self, ns: &Namespace, id: &ObjectId) -> Result<HostedCall> {
        self.claim_hosted_at(&ns.storage_id, &id.to_string()).await
    }

    /// [`DurableObjects::claim_hosted`] by the namespace's storage id and the object's.
    async fn claim_hosted_at(&self, storage_id: &str, hex: &str) -> Result<HostedCall> {
        let Some(cluster) = &self.inner.settings.cluster else { return Ok(HostedCall { _held: None }) };
        self.check_serving_at(storage_id).await?;
        let key = format!("{storage_id}/{hex}");
        let calls = self.inner.hosted.calls(&key);
        let busy = |_| {
            DoError::Unavailable(
                "the object is held by a rebuild or by a call waiting on this one; retry shortly".into(),
            )
        };
        let held = tokio::time::timeout(HOSTED_CALL_PATIENCE, Arc::clone(&calls).read_owned()).await.map_err(busy)?;
        if cluster.objects.is_current(&key) {
            return Ok(HostedCall { _held: Some(held) });
        }
        drop(held);
        // The rebuild waits for the calls holding the object, and holds off new ones.
        let rebuilding = tokio::time::timeout(HOSTED_CALL_PATIENCE, calls.write_owned()).await.map_err(busy)?;
        if cluster.objects.is_current(&key) {
            return Ok(HostedCall { _held: Some(rebuilding.downgrade()) });
        }
        let (hosted, namespace, object) = (Arc::clone(&self.inner.hosted), storage_id.to_owned(), hex.to_owned());
        let (file, log) = (hosted.file(&namespace, &object), hosted.log(&namespace, &object));
        let still_open = || {
            DoError::Unavailable(
                "the object's file is still open from this node's earlier ownership; it is being closed, retry shortly"
                    .into(),
            )
        };
        if kura_sqlite::open_elsewhere(&file).is_some() {
            // Not waited for here: the restart drains the Workers' requests, and this call may
            // be one of them.
            self.let_go_of_hosted();
            return Err(still_open());
        }
        let engine = self.clone();
        let release = Box::pin(async move {
            hosted.forget(&namespace, &object);
            // Opened since the look above (an alarm workerd still had)? Closed before rebuilding.
            let deadline = tokio::time::Instant::now() + HOSTED_CLOSE_PATIENCE;
            while kura_sqlite::open_elsewhere(&hosted.file(&namespace, &object)).is_some()
                && tokio::time::Instant::now() < deadline
            {
                engine.let_go_of_hosted();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        cluster
            .objects
            .claim_at(&key, &file, &log, release)
            .await
            .map_err(|e| DoError::Unavailable(format!("the object is {e}")))?;
        if kura_sqlite::open_elsewhere(&file).is_some() {
            tracing::error!(file = %file.display(), "workerd kept an object's file open through its rebuild");
            return Err(still_open());
        }
        // The rebuilt file's alarm is the one to fire: workerd's schedule learns it.
        if self.inner.hosted_let_go.get().is_some() {
            let (metadata, object) = (self.inner.hosted.scheduler_file(storage_id), hex.to_owned());
            let synced =
                blocking(move || hosted::schedule_in(&metadata, &[(object, hosted::file_alarm(&file)?)])).await;
            match synced {
                Ok(true) => self.let_go_of_hosted(),
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "cannot schedule a rebuilt object's alarm"),
            }
        }
        Ok(HostedCall { _held: Some(rebuilding.downgrade()) })
    }

    /// Asks the process running hosted objects to close their files (see
    /// [`DurableObjects::set_hosted_let_go`]).
    fn let_go_of_hosted(&self) {
        if let Some(let_go) = self.inner.hosted_let_go.get() {
            let_go();
        }
    }

    /// In a cluster, once a call to an object another process runs has been answered there:
    /// captures what the object committed and ships it, so the store holds every commit made
    /// before the call's answer (which waits for this). Alone, a no-op.
    pub async fn ship_hosted(&self, ns: &Namespace, id: &ObjectId) -> Result<()> {
        if self.inner.settings.cluster.is_none() {
            return Ok(());
        }
        let (hosted, namespace, hex) = (Arc::clone(&self.inner.hosted), ns.storage_id.clone(), id.to_string());
        blocking(move || hosted.capture_and_ship(&namespace, &hex)).await?;
        self.record_hosted_alarms(Some((&ns.storage_id, &id.to_string()))).await
    }

    /// In a cluster, writes the alarms of objects another process runs, as captured since
    /// last recorded, into their namespaces' indexes (each object's, or all with `None`), so
    /// the node that takes a namespace over schedules them. A namespace this node no longer
    /// serves is skipped: its new node's captures count.
    pub async fn record_hosted_alarms(&self, only: Option<(&str, &str)>) -> Result<()> {
        let mut by_namespace: std::collections::BTreeMap<String, Vec<(String, Option<i64>)>> = Default::default();
        for (namespace, object, alarm) in self.inner.hosted.take_alarm_changes(only) {
            by_namespace.entry(namespace).or_default().push((object, alarm));
        }
        let mut outcome = Ok(());
        for (namespace, changes) in by_namespace {
            if !self.serves_namespace(&namespace) {
                continue;
            }
            let rows = changes.clone();
            let written = self
                .index_write_at(&namespace, move |c| {
                    rows.iter().try_for_each(|(object, alarm)| index::set_workerd_alarm(c, object, *alarm))
                })
                .await;
            if let Err(e) = written {
                let back = changes.into_iter().map(|(object, alarm)| (namespace.clone(), object, alarm)).collect();
                self.inner.hosted.restore_alarm_changes(back);
                outcome = Err(e);
            }
        }
        outcome
    }

    /// In a cluster, once this node has taken a namespace over: the alarms its index holds for
    /// objects another process runs are handed to that process's scheduler (their objects'
    /// files claimed first), which reads them when it starts — so it is restarted if any
    /// changed. Boxed: it claims, and claims lead here.
    fn schedule_hosted_alarms(&self, storage_id: String) -> futures_util::future::BoxFuture<'static, ()> {
        let engine = self.clone();
        Box::pin(async move {
            let alarms = match engine.index_write_at(&storage_id, index::workerd_alarms).await {
                Ok(alarms) => alarms,
                Err(e) => {
                    tracing::warn!(namespace = %storage_id, error = %e, "cannot read the namespace's alarms");
                    return;
                }
            };
            if alarms.is_empty() {
                return;
            }
            // The index says which objects had alarms; each one's file says when (the index may
            // lag it by a capture).
            let mut claimed = Vec::with_capacity(alarms.len());
            for (object, _) in alarms {
                match engine.claim_hosted_at(&storage_id, &object).await {
                    Ok(_) => {
                        let file = engine.inner.hosted.file(&storage_id, &object);
                        match blocking(move || hosted::file_alarm(&file)).await {
                            Ok(at) => claimed.push((object, at)),
                            Err(e) => {
                                tracing::warn!(namespace = %storage_id, object, error = %e, "an alarm's object cannot be read")
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(namespace = %storage_id, object, error = %e, "an alarm's object cannot be claimed")
                    }
                }
            }
            let metadata = engine.inner.hosted.scheduler_file(&storage_id);
            match blocking(move || hosted::schedule_in(&metadata, &claimed)).await {
                Ok(false) => {}
                Ok(true) => {
                    tracing::info!(namespace = %storage_id, "alarms taken over; workerd restarts to schedule them");
                    engine.let_go_of_hosted();
                }
                Err(e) => tracing::warn!(namespace = %storage_id, error = %e, "cannot schedule the namespace's alarms"),
            }
        })
    }

    /// Whether the object has ever stored anything (it is then listed in its namespace).
    pub async fn exists(&self, ns: &Namespace, id: &ObjectId) -> Result<bool> {
        Ok(self.entry(ns, id).await?.is_some())
    }

    /// Whether the object has a file (it may have been reached without storing anything); in
    /// a cluster, once its file is claimed here.
    pub(crate) async fn has_files(&self, ns: &Namespace, id: &ObjectId) -> Result<bool> {
        self.claim_object(ns, id).await?;
        Ok(self.object_dir(ns, id).join("db.sqlite").exists())
    }

    /// In a cluster, makes this node the namespace's server — its index rebuilt from the store
    /// — or says which node is. Alone, a no-op. A node that finds the namespace elsewhere gives
    /// up the files of its objects it still held.
    pub async fn claim_namespace(&self, storage_id: &str) -> std::result::Result<(), PlacementError> {
        let Some(cluster) = &self.inner.settings.cluster else { return Ok(()) };
        if !is_hex(storage_id, 32) || cluster.namespaces.is_current(storage_id) {
            return Ok(());
        }
        let (registry, key) = (self.inner.registry.clone(), storage_id.to_owned());
        let release = Box::pin(async move { registry.close(&key).await });
        let path = self.inner.root.join(storage_id).join("meta.sqlite");
        let claimed = cluster.namespaces.claim(storage_id, &path, release).await;
        match &claimed {
            Err(_) => cluster.objects.give_up_under(&format!("{storage_id}/")).await,
            Ok(()) if self.inner.hosted_let_go.get().is_some() => {
                tokio::spawn(self.schedule_hosted_alarms(storage_id.to_owned()));
            }
            Ok(()) => {}
        }
        claimed
    }

    /// In a cluster, gives up the files this node still holds of objects of a namespace it no
    /// longer serves (its node claims them as it reaches them).
    /// Its alarms of objects another process runs are taken from that process's scheduler
    /// too (which is restarted to forget them), so they fire only on the namespace's node.
    pub async fn give_up_unserved(&self, storage_id: &str) {
        if let Some(cluster) = &self.inner.settings.cluster
            && !cluster.namespaces.is_current(storage_id)
        {
            cluster.objects.give_up_under(&format!("{storage_id}/")).await;
            let metadata = self.inner.hosted.scheduler_file(storage_id);
            if metadata.exists() {
                match blocking(move || hosted::unschedule_all(&metadata)).await {
                    Ok(true) => {
                        tracing::info!(namespace = %storage_id, "served elsewhere now: its alarms leave this node's workerd");
                        self.let_go_of_hosted();
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(namespace = %storage_id, error = %e, "cannot unschedule the namespace's alarms")
                    }
                }
            }
        }
    }

    /// In a cluster, whether the namespace was ever served (its index has a history in the
    /// store): one worth adopting for its alarms when no node serves it.
    pub async fn has_history(&self, storage_id: &str) -> bool {
        let Some(cluster) = &self.inner.settings.cluster else { return true };
        // Once served, a namespace keeps its history until it is deleted: asked once.
        if self.inner.with_history.lock().unwrap_or_else(|p| p.into_inner()).contains(storage_id) {
            return true;
        }
        let has = cluster.namespaces.has_history(storage_id).await;
        if has {
            self.inner.with_history.lock().unwrap_or_else(|p| p.into_inner()).insert(storage_id.to_owned());
        }
        has
    }

    /// In a cluster: the node last named as the namespace's server did not serve it.
    pub fn forget_namespace_owner(&self, storage_id: &str) {
        if let Some(cluster) = &self.inner.settings.cluster {
            cluster.namespaces.forget_owner(storage_id);
        }
    }

    /// Whether this node serves the namespace now (always, alone).
    pub fn serves_namespace(&self, storage_id: &str) -> bool {
        self.inner.settings.cluster.as_ref().is_none_or(|c| c.namespaces.is_current(storage_id))
    }

    /// In a cluster, whether this node should adopt the namespace when no node serves it (for
    /// its alarms); alone, always.
    pub async fn is_home(&self, storage_id: &str) -> bool {
        match &self.inner.settings.cluster {
            Some(cluster) => cluster.namespaces.is_home(storage_id).await,
            None => true,
        }
    }

    /// In a cluster, refuses work on a namespace this node no longer serves. A lease that
    /// lapsed since the request was placed (a renewal late on a loaded machine) is claimed
    /// again first, as the client's retry would: the coordinator still decides, so a namespace
    /// another node took meanwhile is refused.
    async fn check_serving(&self, ns: &Namespace) -> Result<()> {
        self.check_serving_at(&ns.storage_id).await
    }

    /// [`DurableObjects::check_serving`] for the namespace with this storage id.
    async fn check_serving_at(&self, storage_id: &str) -> Result<()> {
        if self.serves_namespace(storage_id) {
            return Ok(());
        }
        match self.claim_namespace(storage_id).await {
            Ok(()) => {
                tracing::info!(namespace = %storage_id, "the namespace's lease had lapsed; claimed again");
                Ok(())
            }
            Err(_) => Err(DoError::Unavailable("this node no longer serves the namespace; retry".into())),
        }
    }

    /// In a cluster, before an object is reached: its namespace is served here, and its file
    /// is this node's (rebuilt from the store when it is first reached here).
    async fn claim_object(&self, ns: &Namespace, id: &ObjectId) -> Result<()> {
        let Some(cluster) = &self.inner.settings.cluster else { return Ok(()) };
        self.check_serving(ns).await?;
        let key = ns.object_key(id);
        if cluster.objects.is_current(&key) {
            return Ok(());
        }
        let (registry, closing) = (self.inner.registry.clone(), key.clone());
        let release = Box::pin(async move { registry.close(&closing).await });
        let path = self.object_dir(ns, id).join("db.sqlite");
        cluster
            .objects
            .claim(&key, &path, release)
            .await
            .map_err(|e| DoError::Unavailable(format!("the object is {e}")))
    }

    /// Runs `f` on the namespace's index, inside a group commit.
    async fn index_write<T: Send + 'static>(
        &self,
        ns: &Namespace,
        f: impl FnMut(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        self.index_write_at(&ns.storage_id, f).await
    }

    /// [`DurableObjects::index_write`] on the namespace with this storage id.
    async fn index_write_at<T: Send + 'static>(
        &self,
        storage_id: &str,
        mut f: impl FnMut(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        self.check_serving_at(storage_id).await?;
        let fresh = !self.inner.indexed.lock().unwrap_or_else(|p| p.into_inner()).contains(storage_id);
        let outcome = self
            .inner
            .registry
            .write_grouped(storage_id, move |c| {
                if fresh {
                    c.execute_batch(index::SCHEMA)?;
                }
                f(c)
            })
            .await
            .map_err(DoError::from_sql)?
            .map_err(index::storage)?;
        if fresh {
            self.inner.indexed.lock().unwrap_or_else(|p| p.into_inner()).insert(storage_id.to_owned());
        }
        Ok(outcome)
    }

    /// Makes sure the object's directory exists, and returns the object's key in the registry;
    /// the object joins the namespace's index with the first request that writes to it.
    async fn ensure(&self, ns: &Namespace, id: &ObjectId) -> Result<String> {
        self.runs_here(ns)?;
        let key = ns.object_key(id);
        self.claim_object(ns, id).await?;
        // An open object's directory exists (nothing removes one): no look at the disk.
        if self.inner.registry.is_open(&key) {
            return Ok(key);
        }
        let dir = self.object_dir(ns, id);
        if !dir.exists() {
            std::fs::create_dir_all(&dir).map_err(|e| match kura_sqlite::is_disk_full(&e) {
                true => DoError::storage(e),
                false => DoError::Storage(format!("creating {}: {e}", dir.display())),
            })?;
        }
        Ok(key)
    }

    /// Starts a request on an object (creating it on first use): its transaction opens once
    /// the requests before it have finished.
    pub async fn begin(&self, ns: &Namespace, id: &ObjectId) -> Result<Session> {
        let key = self.ensure(ns, id).await?;
        let (tx, rx) = std::sync::mpsc::channel();
        let (ready, is_ready) = oneshot::channel();
        let idle_limit = self.inner.settings.session_idle_limit;
        let registry = self.inner.registry.clone();
        tokio::spawn(async move {
            let _ = registry.with_database(&key, move |db| session::serve(db, rx, ready, idle_limit)).await;
        });
        // The actor answers once the transaction is open, or drops `ready` if it cannot run.
        match is_ready.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(DoError::Closed),
        }
        Ok(Session {
            link: session::SessionLink::Remote(tx),
            engine: self.clone(),
            namespace: ns.clone(),
            id: id.clone(),
        })
    }

    /// Runs `request` as one request on the thread the object's actor runs on (creating the
    /// object on first use), after the requests before it: its [`Session`]'s storage calls run
    /// there directly, with no hop between threads, and it ends the request with
    /// [`Session::commit`] or [`Session::rollback`] (what it leaves undecided is rolled back).
    /// The thread is the object's alone until the request ends (the pool starts another for
    /// other objects' work), so the request may await anything, except another request to the same
    /// object, which would wait for it forever. Storage calls from other threads fail.
    pub async fn serve<T, F>(
        &self,
        ns: &Namespace,
        id: &ObjectId,
        request: impl FnOnce(Session) -> F + Send + 'static,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: std::future::Future<Output = T>,
    {
        let key = self.ensure(ns, id).await?;
        let handle = tokio::runtime::Handle::current();
        let limit = self.inner.settings.session_idle_limit;
        let (engine, namespace, object) = (self.clone(), ns.clone(), id.clone());
        let served = self
            .inner
            .registry
            .with_database(&key, move |db| {
                // Timers, spawned tasks and I/O the request uses run on the caller's runtime.
                let _runtime = handle.enter();
                session::serve_local(db, |link| {
                    let session = Session { link, engine, namespace, id: object };
                    // A request that never ends would hold its object for ever.
                    session::block_on(tokio::time::timeout(limit, request(session)))
                })
            })
            .await
            .map_err(DoError::from_sql)??;
        served.map_err(|_| {
            tracing::warn!(limit = ?limit, "a request held its object too long; it was rolled back");
            DoError::Reset(format!("the request ran longer than {} s and was rolled back", limit.as_secs()))
        })
    }

    /// Runs `f` as one request: everything it writes commits together if it returns `Ok`,
    /// and nothing of it if it returns an error.
    pub async fn run<T: Send + 'static>(
        &self,
        ns: &Namespace,
        id: &ObjectId,
        f: impl FnOnce(&mut Storage<'_>) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        // The request's future stays on the object's thread's stack: a box the size of its
        // states cost a large allocation per request.
        self.serve(ns, id, move |session| async move {
            match session.call(f).await {
                Ok(Ok(value)) => {
                    session.commit().await?;
                    Ok(value)
                }
                Ok(Err(e)) | Err(e) => {
                    session.rollback().await;
                    Err(e)
                }
            }
        })
        .await?
    }

    /// The objects of a namespace after `after` (an id; "" for the first page), in id order,
    /// with their names and sizes.
    pub async fn list(&self, ns: &Namespace, after: &str, limit: u64) -> Result<Vec<ObjectSummary>> {
        let after = after.to_owned();
        let entries = self.index_write(ns, move |c| index::list(c, &after, limit)).await?;
        Ok(entries
            .into_iter()
            .map(|entry| {
                let stored_bytes = if ns.elsewhere {
                    let file = self.hosted_file(ns, &entry.id);
                    file_len(&file) + file_len(&file.with_extension("sqlite-wal"))
                } else {
                    match self.id_dir(ns, &entry.id).filter(|_| self.holds_file(ns, &entry.id)) {
                        Some(dir) => file_len(&dir.join("db.sqlite")) + file_len(&dir.join("db.sqlite-wal")),
                        None => 0,
                    }
                };
                ObjectSummary { entry, stored_bytes }
            })
            .collect())
    }

    /// How many objects the namespace has.
    pub async fn count(&self, ns: &Namespace) -> Result<u64> {
        self.index_write(ns, index::count).await
    }

    /// The index entry of an object, if it exists.
    pub async fn entry(&self, ns: &Namespace, id: &ObjectId) -> Result<Option<ObjectEntry>> {
        let hex = id.to_string();
        self.index_write(ns, move |c| index::find(c, &hex)).await
    }

    /// Whether this node's copy of the object's file is current: always alone; in a cluster,
    /// once reached since the namespace came here (a listing shows 0 bytes until then).
    fn holds_file(&self, ns: &Namespace, hex: &str) -> bool {
        let key = format!("{}/{hex}", ns.storage_id);
        self.inner.settings.cluster.as_ref().is_none_or(|c| c.objects.is_current(&key))
    }

    fn id_dir(&self, ns: &Namespace, hex: &str) -> Option<PathBuf> {
        is_hex(hex, 64).then(|| self.inner.root.join(&ns.storage_id).join(&hex[..2]).join(hex))
    }

    /// The object's storage as SQL text: its tables, rows, indexes, triggers and views, and its
    /// KV entries (`_cf_KV`), in D1's dump format. An object never used exports as empty.
    pub async fn export(&self, ns: &Namespace, id: &ObjectId) -> Result<String> {
        let options = DumpOptions { reserved_tables: vec!["_cf_KV".into()], ..Default::default() };
        if ns.elsewhere {
            // In a cluster, the file as the store has it (if not claimed here since a move).
            let _call = self.claim_hosted(ns, id).await?;
            let (engine, ns, hex) = (self.clone(), ns.clone(), id.to_string());
            let bytes = tokio::task::spawn_blocking(move || {
                let Some(mut db) = engine.open_hosted(&ns, &hex)? else { return Ok(Vec::new()) };
                let mut out = Vec::new();
                dump(&mut db, &options, &mut out).map_err(DoError::storage)?;
                Ok::<_, DoError>(out)
            })
            .await
            .map_err(|e| DoError::Storage(e.to_string()))??;
            if bytes.is_empty() {
                return Ok("PRAGMA defer_foreign_keys=TRUE;\n".to_owned());
            }
            return String::from_utf8(bytes).map_err(|e| DoError::Storage(e.to_string()));
        }
        if !self.has_files(ns, id).await? {
            return Ok("PRAGMA defer_foreign_keys=TRUE;\n".to_owned());
        }
        let bytes = self
            .inner
            .registry
            .with_database(&ns.object_key(id), move |db| {
                let mut out = Vec::new();
                dump(db, &options, &mut out).map(|_| out)
            })
            .await
            .map_err(DoError::from_sql)?
            .map_err(DoError::storage)?;
        String::from_utf8(bytes).map_err(|e| DoError::Storage(e.to_string()))
    }

    /// Runs one read-only statement on each of `objects` (all of the namespace's objects when
    /// `None`), a few at a time, and returns each object's rows or error, in the order given
    /// (id order for all). This is not one snapshot: each object is read at its own moment.
    pub async fn fan_out(
        &self,
        ns: &Namespace,
        objects: Option<Vec<ObjectId>>,
        sql: &str,
        params: Vec<Value>,
    ) -> Result<Vec<FanOutRow>> {
        let entries: Vec<ObjectEntry> = match objects {
            Some(ids) => ids
                .into_iter()
                .map(|id| ObjectEntry { id: id.to_string(), name: id.name().map(str::to_owned), created_ms: 0 })
                .collect(),
            None => {
                let mut all = Vec::new();
                loop {
                    let after = all.last().map_or(String::new(), |e: &ObjectEntry| e.id.clone());
                    let page = self.index_write(ns, move |c| index::list(c, &after, 1000)).await?;
                    let done = page.len() < 1000;
                    all.extend(page);
                    if done {
                        break all;
                    }
                }
            }
        };
        let parallelism = self.inner.settings.fan_out_parallelism.max(1);
        let rows = futures_util::stream::iter(entries.into_iter().map(|object| {
            let (sql, params) = (sql.to_owned(), params.clone());
            async move {
                let outcome = self.read_one(ns, &object.id, sql, params).await;
                FanOutRow { object, outcome }
            }
        }))
        .buffered(parallelism)
        .collect()
        .await;
        Ok(rows)
    }

    async fn read_one(&self, ns: &Namespace, hex: &str, sql: String, params: Vec<Value>) -> Result<Cursor> {
        let fan_out_error = |e| match e {
            DoError::ReadOnly { sql } => {
                DoError::Invalid(format!("a fan-out runs read-only statements only, and this one writes: {sql}"))
            }
            other => other,
        };
        if ns.elsewhere {
            let _call = self.claim_hosted(ns, &ns.id_from_string(hex)?).await?;
            let (engine, ns, hex) = (self.clone(), ns.clone(), hex.to_owned());
            return tokio::task::spawn_blocking(move || {
                let Some(mut db) = engine.open_hosted(&ns, &hex)? else {
                    return Err(DoError::Invalid("the object has stored nothing yet".into()));
                };
                db.begin().map_err(DoError::from_sql)?;
                let outcome = Storage::new(&mut db).exec_read_only(&sql, params).map_err(fan_out_error);
                db.rollback();
                outcome
            })
            .await
            .map_err(|e| DoError::Storage(e.to_string()))?;
        }
        let id = ns.id_from_string(hex)?;
        if !self.has_files(ns, &id).await? {
            return Err(DoError::Invalid("the object has stored nothing yet".into()));
        }
        self.inner
            .registry
            .with_database(&format!("{}/{hex}", ns.storage_id), move |db| {
                db.begin().map_err(DoError::from_sql)?;
                let outcome = Storage::new(db).exec_read_only(&sql, params).map_err(fan_out_error);
                db.rollback();
                outcome
            })
            .await
            .map_err(DoError::from_sql)?
    }

    /// The bookmark of the object's current state.
    pub async fn bookmark(&self, ns: &Namespace, id: &ObjectId) -> Result<Bookmark> {
        if ns.elsewhere {
            let _call = self.claim_hosted(ns, id).await?;
            let (hosted, ns, hex) = (Arc::clone(&self.inner.hosted), ns.storage_id.clone(), id.to_string());
            return blocking(move || hosted.bookmark(&ns, &hex)).await;
        }
        let key = self.ensure(ns, id).await?;
        self.inner.registry.with_database(&key, |db| db.bookmark()).await.and_then(|b| b).map_err(DoError::from_sql)
    }

    /// Writes into every open object's history the commits it still owes, and waits
    /// ([`Registry::capture_histories`]).
    pub async fn capture_histories(&self) {
        self.inner.registry.capture_histories().await;
    }

    /// The bookmark of the object's last commit at or before `time_ms` (within 30 days).
    pub async fn bookmark_for_time(&self, ns: &Namespace, id: &ObjectId, time_ms: i64) -> Result<Bookmark> {
        if ns.elsewhere {
            let _call = self.claim_hosted(ns, id).await?;
            let (hosted, ns, hex) = (Arc::clone(&self.inner.hosted), ns.storage_id.clone(), id.to_string());
            return blocking(move || hosted.bookmark_for_time(&ns, &hex, time_ms)).await;
        }
        let key = self.ensure(ns, id).await?;
        self.inner
            .registry
            .with_database(&key, move |db| db.bookmark_for_time(time_ms))
            .await
            .and_then(|b| b)
            .map_err(DoError::from_sql)
    }

    /// Restores the object to `bookmark`, between two of its requests. Returns the new
    /// bookmark and the one just before (restoring that undoes this). An object another
    /// process runs must be closed by it first (stop the process).
    pub async fn restore(&self, ns: &Namespace, id: &ObjectId, bookmark: &Bookmark) -> Result<Restored> {
        if ns.elsewhere && self.inner.settings.cluster.is_some() {
            return Err(DoError::Invalid(
                "restoring an object of a deployed Worker's class is not served by a kura cluster yet: \
                 its history is kept and shipped, and the object can be exported"
                    .into(),
            ));
        }
        if ns.elsewhere {
            let (hosted, ns, hex, bookmark) =
                (Arc::clone(&self.inner.hosted), ns.storage_id.clone(), id.to_string(), *bookmark);
            return blocking(move || hosted.restore(&ns, &hex, &bookmark)).await;
        }
        let key = self.ensure(ns, id).await?;
        let bookmark = *bookmark;
        let restored = self
            .inner
            .registry
            .with_database(&key, move |db| db.restore(&bookmark))
            .await
            .and_then(|r| r)
            .map_err(DoError::from_sql)?;
        // The restored state has its own alarm: the schedule follows it.
        let alarm = self.run(ns, id, |s| s.get_alarm()).await?;
        let (hex, name) = (id.to_string(), id.name().map(str::to_owned));
        self.index_write(ns, move |c| index::schedule(c, &hex, name.as_deref(), alarm, 0)).await?;
        self.inner.alarm_wake.notify_one();
        Ok(restored)
    }

    /// How many object files are open now.
    pub fn open_objects(&self) -> usize {
        self.inner.registry.open_count()
    }

    /// What the objects' and indexes' files did since the engine started.
    pub fn stats(&self) -> &kura_sqlite::Stats {
        self.inner.registry.stats()
    }

    /// What alarm deliveries came to since the engine started.
    pub fn alarm_figures(&self) -> &alarm::AlarmFigures {
        &self.inner.alarm_figures
    }

    /// Closes every object; later requests are refused.
    pub async fn shutdown(&self) {
        // The followers' last captures (shipped, in a cluster) and the alarms they noted go
        // first, while the namespaces' indexes are still open.
        let hosted = Arc::clone(&self.inner.hosted);
        let _ = tokio::task::spawn_blocking(move || hosted.stop()).await;
        if let Err(e) = self.record_hosted_alarms(None).await {
            tracing::warn!(error = %e, "could not record the last alarms of objects workerd ran");
        }
        self.inner.registry.shutdown().await;
    }

    /// Waits until an alarm may have become due earlier than the schedule last said.
    pub(crate) async fn alarm_changed(&self) {
        self.inner.alarm_wake.notified().await;
    }
}

/// How the registry opens a key: a namespace's index (`<ns>`) or an object (`<ns>/<id>`). In a
/// cluster, only what this node owns opens, with its ownership's shipper.
fn open_options(
    root: &Path,
    history: &HistorySettings,
    cluster: Option<&DoCluster>,
    key: &str,
) -> Option<DatabaseOptions> {
    match key.split_once('/') {
        None if is_hex(key, 32) => {
            let dir = root.join(key);
            std::fs::create_dir_all(&dir).ok()?;
            let options = DatabaseOptions::new(dir.join("meta.sqlite")).create(true);
            match cluster {
                Some(cluster) => cluster
                    .namespaces
                    .shipper(key)
                    .map(|shipper| options.history(HistorySettings::shipped_only(), key).shipper(shipper)),
                None => Some(options),
            }
        }
        Some((ns, id)) if is_hex(ns, 32) && is_hex(id, 64) => {
            let dir = root.join(ns).join(&id[..2]).join(id);
            let mut options = DatabaseOptions::new(dir.join("db.sqlite"))
                .create(true)
                .compact(true)
                .reports_size(false)
                .history(history.clone(), key);
            options.limits = Limits::durable_object();
            match cluster {
                Some(cluster) => cluster.objects.shipper(key).map(|shipper| options.shipper(shipper)),
                None => Some(options),
            }
        }
        _ => None,
    }
}

/// Runs blocking file work off the async runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| DoError::Storage(e.to_string()))?
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}
