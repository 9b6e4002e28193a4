//! The Durable Object runtime: the [`DurableObject`] trait, the [`Runtime`] and its
//! [`Namespace`]s, [`Stub`]s, and the [`State`] and [`Storage`] an object sees.
//!
//! An object's instance lives as long as it is used: it is built on its first request (and
//! again after it was evicted for idleness, or reset by a failure), and requests to it take
//! turns through a fair lock, so they never interleave. Each request holds a session on the
//! object's storage (kura-do): its writes commit when the request returns `Ok`.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use kura_do::alarm::{AlarmInvocation, AlarmRunner, Deliver};
use kura_do::{Bookmark, Cursor, DoError, DoSettings, DurableObjects, ListOptions, ObjectId, Session, Value};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::BoxFuture;

/// An HTTP request to an object's `fetch`.
pub type Request = http::Request<bytes::Bytes>;
/// An object's HTTP response.
pub type Response = http::Response<bytes::Bytes>;

/// What can go wrong in a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The storage refused or failed (SQL errors come out in workerd's words).
    #[error(transparent)]
    Storage(#[from] DoError),
    /// The object's own code failed.
    #[error("{0}")]
    Object(String),
    /// The object was reset (a failed `block_concurrency_while`, a panic, a failed commit):
    /// its in-memory state is gone and the request's writes were rolled back.
    #[error("{0}")]
    Reset(String),
    /// Storage was used outside a request of its object, or from a task other than the
    /// request's own.
    #[error("storage can only be used by a request of its object, from the request's own task")]
    NoRequest,
}

impl Error {
    /// An error of the object's own, with this message.
    pub fn msg(message: impl std::fmt::Display) -> Self {
        Error::Object(message.to_string())
    }
}

/// Results of the runtime and of object code.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What `alarm()` is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlarmInfo {
    /// Attempts that failed before this one.
    pub retry_count: u32,
    /// Whether this is a retry.
    pub is_retry: bool,
}

/// An object class. `new` runs on the first request to an instance; `fetch` and `alarm` are
/// optional; plain `async fn`s on the type are reached with [`Stub::call`].
pub trait DurableObject: Sized + Send + 'static {
    /// What every instance is given (bindings, configuration).
    type Env: Clone + Send + Sync + 'static;

    /// Builds an instance; its storage may already hold data.
    fn new(state: State, env: Self::Env) -> impl Future<Output = Result<Self>> + Send;

    /// Answers an HTTP request.
    fn fetch(&mut self, request: Request) -> impl Future<Output = Result<Response>> + Send {
        let _ = request;
        async {
            Ok(http::Response::builder()
                .status(501)
                .body(bytes::Bytes::from_static(b"this Durable Object has no fetch handler"))
                .expect("a static response is valid"))
        }
    }

    /// Runs when the object's alarm is due. An error is retried with backoff.
    fn alarm(&mut self, info: AlarmInfo) -> impl Future<Output = Result<()>> + Send {
        let _ = info;
        async {
            tracing::warn!("Attempted to run a scheduled alarm without a handler");
            Ok(())
        }
    }
}

/// How the runtime keeps instances.
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    /// The storage engine's settings.
    pub engine: DoSettings,
    /// An instance unused this long is dropped (its storage stays).
    pub idle_timeout: Duration,
    /// Most instances kept per namespace; the idle ones go first when there are more.
    pub max_instances: usize,
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        RuntimeSettings { engine: DoSettings::default(), idle_timeout: Duration::from_secs(70), max_instances: 10_000 }
    }
}

/// The runtime: an embedded storage engine and the namespaces registered on it.
#[derive(Clone)]
pub struct Runtime {
    engine: DurableObjects,
    settings: RuntimeSettings,
}

impl Runtime {
    /// A runtime keeping its objects under `dir`, with default settings.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self> {
        Self::open_with(dir, RuntimeSettings::default())
    }

    /// A runtime keeping its objects under `dir`.
    pub fn open_with(dir: impl Into<PathBuf>, settings: RuntimeSettings) -> Result<Self> {
        let engine = DurableObjects::open(dir.into().join("do"), settings.engine.clone())?;
        Ok(Runtime { engine, settings })
    }

    /// The storage engine.
    pub fn engine(&self) -> &DurableObjects {
        &self.engine
    }

    /// Registers the class `T` as the namespace `name`, whose object ids derive from
    /// `unique_key` (`<script>-<class>` in Miniflare). Its storage lives under a directory
    /// named by a digest of the name, so the same name reaches the same objects across runs.
    pub fn namespace<T: DurableObject>(&self, name: &str, unique_key: &str, env: T::Env) -> Result<Namespace<T>> {
        let storage_id = storage_id_for(name);
        let ns = kura_do::Namespace::new(&storage_id, unique_key)?;
        let inner = Arc::new(NamespaceInner {
            engine: self.engine.clone(),
            ns,
            env,
            slots: Mutex::new(HashMap::new()),
            settings: self.settings.clone(),
        });
        let namespace = Namespace { inner };
        namespace.start_sweeper();
        Ok(namespace)
    }

    /// Closes every object file.
    pub async fn shutdown(&self) {
        self.engine.shutdown().await;
    }
}

/// 32 hex digits derived from a namespace name.
fn storage_id_for(name: &str) -> String {
    use std::fmt::Write;
    // FNV-1a, twice with different seeds: a stable, dependency-free digest of a short name.
    let fnv = |seed: u64| name.bytes().fold(seed, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
    let mut out = String::new();
    let _ = write!(out, "{:016x}{:016x}", fnv(0xcbf2_9ce4_8422_2325), fnv(0x8422_2325_cbf2_9ce4));
    out
}

/// One object's instance and the fair lock requests take turns on.
struct Slot<T> {
    instance: Arc<tokio::sync::Mutex<Option<T>>>,
    /// Set when a request ended without finishing (it timed out or panicked outside the
    /// object's code): the next request builds a fresh instance.
    reset_next: Arc<AtomicBool>,
    last_used: Mutex<Instant>,
    /// The request now running, which the instance's [`State`] reaches its storage through.
    current: Arc<Mutex<Weak<RequestLink>>>,
}

struct NamespaceInner<T: DurableObject> {
    engine: DurableObjects,
    ns: kura_do::Namespace,
    env: T::Env,
    slots: Mutex<HashMap<ObjectId, Arc<Slot<T>>>>,
    settings: RuntimeSettings,
}

/// A namespace of objects of class `T`. Cheap to clone.
pub struct Namespace<T: DurableObject> {
    inner: Arc<NamespaceInner<T>>,
}

impl<T: DurableObject> Clone for Namespace<T> {
    fn clone(&self) -> Self {
        Namespace { inner: Arc::clone(&self.inner) }
    }
}

impl<T: DurableObject> Namespace<T> {
    /// The id of the object called `name`.
    pub fn id_from_name(&self, name: &str) -> ObjectId {
        self.inner.ns.id_from_name(name)
    }

    /// A new, random id: a new, empty object.
    pub fn new_unique_id(&self) -> ObjectId {
        self.inner.ns.new_unique_id(None).expect("no jurisdiction was asked for")
    }

    /// Parses an id (64 hex digits) and checks it belongs to this namespace.
    pub fn id_from_string(&self, text: &str) -> Result<ObjectId> {
        Ok(self.inner.ns.id_from_string(text)?)
    }

    /// A stub for the object `id`.
    pub fn get(&self, id: ObjectId) -> Stub<T> {
        Stub { namespace: self.clone(), id }
    }

    /// A stub for the object called `name`.
    pub fn get_by_name(&self, name: &str) -> Stub<T> {
        self.get(self.id_from_name(name))
    }

    /// The engine's view of this namespace (for listing, export and fan-out queries).
    pub fn engine_namespace(&self) -> &kura_do::Namespace {
        &self.inner.ns
    }

    /// How many instances are in memory.
    pub fn instances(&self) -> usize {
        self.inner.slots.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Delivers this namespace's alarms to its objects' `alarm()` until the returned handle is
    /// aborted.
    pub fn serve_alarms(&self) -> tokio::task::JoinHandle<()> {
        let deliver = Arc::new(AlarmDeliver { namespace: self.clone() });
        let runner = AlarmRunner::new(self.inner.engine.clone(), deliver);
        let ns = self.inner.ns.clone();
        tokio::spawn(runner.run(move || std::future::ready(vec![ns.clone()]), std::future::pending()))
    }

    fn slot(&self, id: &ObjectId) -> Arc<Slot<T>> {
        let mut slots = self.inner.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot = slots.entry(id.clone()).or_insert_with(|| {
            Arc::new(Slot {
                instance: Arc::new(tokio::sync::Mutex::new(None)),
                reset_next: Arc::new(AtomicBool::new(false)),
                last_used: Mutex::new(Instant::now()),
                current: Arc::new(Mutex::new(Weak::new())),
            })
        });
        *slot.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        Arc::clone(slot)
    }

    /// Drops instances idle too long, and the idlest ones beyond the cap.
    fn sweep(&self) {
        let settings = &self.inner.settings;
        let mut slots = self.inner.slots.lock().unwrap_or_else(|p| p.into_inner());
        let idle_since = |s: &Arc<Slot<T>>| *s.last_used.lock().unwrap_or_else(|p| p.into_inner());
        // A slot whose lock is free and that nobody else holds is not in use.
        let unused = |s: &Arc<Slot<T>>| Arc::strong_count(s) == 1 && s.instance.try_lock().is_ok();
        slots.retain(|_, s| !(unused(s) && idle_since(s).elapsed() >= settings.idle_timeout));
        if slots.len() > settings.max_instances {
            let mut idle: Vec<(Instant, ObjectId)> =
                slots.iter().filter(|(_, s)| unused(s)).map(|(id, s)| (idle_since(s), id.clone())).collect();
            idle.sort_by_key(|(at, _)| *at);
            // Down to 90% of the cap, so the sweep (a sort of every instance) runs once per
            // tenth of the cap's new objects rather than on each.
            let excess = slots.len() - settings.max_instances * 9 / 10;
            for (_, id) in idle.into_iter().take(excess) {
                slots.remove(&id);
            }
        }
    }

    fn start_sweeper(&self) {
        let weak: Weak<NamespaceInner<T>> = Arc::downgrade(&self.inner);
        let period = (self.inner.settings.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                loop {
                    tokio::time::sleep(period).await;
                    let Some(inner) = weak.upgrade() else { return };
                    Namespace { inner }.sweep();
                }
            });
        }
    }

    /// Runs one request on the object `id`: waits its turn, then, on the object's own thread
    /// (where its storage calls need no hop), builds the instance if needed, runs `f`, and
    /// commits or rolls back what it wrote; a restore it asked for is applied before the next.
    async fn invoke<R, F>(&self, id: &ObjectId, alarm: bool, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: for<'a> FnOnce(&'a mut T) -> BoxFuture<'a, Result<R>> + Send + 'static,
    {
        if self.instances() > self.inner.settings.max_instances {
            self.sweep();
        }
        let slot = self.slot(id);
        let (namespace, id) = (self.clone(), id.clone());
        // Whole even if its caller stops waiting: committed, and any restore it asked for
        // applied before the next request.
        let request = EndsWhole::new(async move {
            let instance = Arc::clone(&slot.instance).lock_owned().await;
            let (inner, held, object) = (namespace.clone(), Arc::clone(&slot), id.clone());
            let served = namespace
                .inner
                .engine
                .serve(&namespace.inner.ns, &id, move |session| -> kura_do::BoxFuture<'static, _> {
                    Box::pin(inner.request(instance, held, object, session, alarm, f))
                })
                .await;
            let (mut instance, result, restore) = match served {
                Ok(done) => done,
                Err(e) => {
                    slot.reset_next.store(true, Ordering::SeqCst);
                    return Err(e.into());
                }
            };
            if let Some(bookmark) = restore {
                *instance = None;
                namespace.inner.engine.restore(&namespace.inner.ns, &id, &bookmark).await?;
            }
            result
        });
        AssertUnwindSafe(request)
            .catch_unwind()
            .await
            .unwrap_or_else(|_| Err(Error::Reset("the request's task failed: it panicked".into())))
    }

    /// One request, on the object's thread, holding its instance.
    async fn request<R, F>(
        self,
        mut instance: tokio::sync::OwnedMutexGuard<Option<T>>,
        slot: Arc<Slot<T>>,
        id: ObjectId,
        session: Session,
        alarm: bool,
        f: F,
    ) -> (tokio::sync::OwnedMutexGuard<Option<T>>, Result<R>, Option<Bookmark>)
    where
        R: Send + 'static,
        F: for<'a> FnOnce(&'a mut T) -> BoxFuture<'a, Result<R>> + Send + 'static,
    {
        let current = Arc::clone(&slot.current);
        if slot.reset_next.swap(false, Ordering::SeqCst) {
            *instance = None;
        }
        if alarm {
            // While its handler runs, the alarm reads as unset (it is deleted for good if the
            // handler succeeds).
            if let Err(e) = session.call(|s| s.delete_alarm()).await.and_then(|deleted| deleted) {
                session.rollback().await;
                return (instance, Err(e.into()), None);
            }
        }
        let session = Arc::new(session);
        let link = Arc::new(RequestLink {
            session: Mutex::new(Some(Arc::clone(&session))),
            reset: AtomicBool::new(false),
            restore: Mutex::new(None),
        });
        *current.lock().unwrap_or_else(|p| p.into_inner()) = Arc::downgrade(&link);
        let outcome = AssertUnwindSafe(async {
            if instance.is_none() {
                let state = State { id: id.clone(), storage: Storage { current: Arc::clone(&current) } };
                *instance = Some(T::new(state, self.inner.env.clone()).await?);
            }
            let object = instance.as_mut().expect("the instance was just built");
            f(object).await
        })
        .catch_unwind()
        .await
        .unwrap_or_else(|_| Err(Error::Reset("the Durable Object panicked and was reset".into())));
        link.session.lock().unwrap_or_else(|p| p.into_inner()).take();
        let session = Arc::try_unwrap(session).map_err(|_| Error::Reset("a storage call outlived its request".into()));
        let reset = link.reset.load(Ordering::SeqCst);
        let result = match (outcome, session) {
            (Ok(value), Ok(session)) if !reset => match session.commit().await {
                Ok(()) => Ok(value),
                Err(e) => {
                    *instance = None;
                    Err(Error::Reset(format!(
                        "the request's writes could not be committed, and the object was reset: {e}"
                    )))
                }
            },
            (outcome, session) => {
                if let Ok(session) = session {
                    session.rollback().await;
                }
                if reset || matches!(outcome, Err(Error::Reset(_))) {
                    *instance = None;
                }
                match outcome {
                    Err(e) => Err(e),
                    Ok(_) => Err(Error::Reset("the Durable Object was reset during the request".into())),
                }
            }
        };
        let restore = link.restore.lock().unwrap_or_else(|p| p.into_inner()).take();
        (instance, result, restore)
    }
}

/// A future run by its caller's task, whose rest, if the caller drops it unfinished, goes on
/// on a task of its own. A task per request from the start cost a spawn, a wake and a join on
/// every call (a tenth of the runtime's own CPU in a benchmark of small requests); callers that
/// stop waiting are the rare case.
struct EndsWhole<F: Future<Output: Send + 'static> + Send + 'static> {
    future: Option<std::pin::Pin<Box<F>>>,
    /// Where the rest goes: the runtime the request began on, wherever it is dropped.
    runtime: tokio::runtime::Handle,
}

impl<F: Future<Output: Send + 'static> + Send + 'static> EndsWhole<F> {
    /// Panics outside a tokio runtime, as spawning the request would.
    fn new(future: F) -> Self {
        EndsWhole { future: Some(Box::pin(future)), runtime: tokio::runtime::Handle::current() }
    }
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Future for EndsWhole<F> {
    type Output = F::Output;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<F::Output> {
        let Some(future) = self.future.as_mut() else { panic!("polled after it ended") };
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(polled) => {
                if polled.is_ready() {
                    self.future = None;
                }
                polled
            }
            // A future that panicked cannot go on: nothing of it is left to finish.
            Err(panic) => {
                self.future = None;
                std::panic::resume_unwind(panic)
            }
        }
    }
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Drop for EndsWhole<F> {
    fn drop(&mut self) {
        if let Some(rest) = self.future.take() {
            self.runtime.spawn(rest);
        }
    }
}

/// What links an instance to the request it is serving.
struct RequestLink {
    session: Mutex<Option<Arc<Session>>>,
    reset: AtomicBool,
    restore: Mutex<Option<Bookmark>>,
}

/// A handle to one object.
pub struct Stub<T: DurableObject> {
    namespace: Namespace<T>,
    id: ObjectId,
}

impl<T: DurableObject> Clone for Stub<T> {
    fn clone(&self) -> Self {
        Stub { namespace: self.namespace.clone(), id: self.id.clone() }
    }
}

impl<T: DurableObject> Stub<T> {
    /// The object's id.
    pub fn id(&self) -> &ObjectId {
        &self.id
    }

    /// The name the stub was made from, if any.
    pub fn name(&self) -> Option<&str> {
        self.id.name()
    }

    /// Calls a method of the object, as one request:
    /// `stub.call(|room: &mut Room| -> BoxFuture<'_, _> { Box::pin(room.add("alice")) })`.
    pub async fn call<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: for<'a> FnOnce(&'a mut T) -> BoxFuture<'a, Result<R>> + Send + 'static,
    {
        self.namespace.invoke(&self.id, false, f).await
    }

    /// Sends an HTTP request to the object's `fetch`.
    pub async fn fetch(&self, request: Request) -> Result<Response> {
        self.call(move |object: &mut T| -> BoxFuture<'_, Result<Response>> { Box::pin(object.fetch(request)) }).await
    }
}

struct AlarmDeliver<T: DurableObject> {
    namespace: Namespace<T>,
}

impl<T: DurableObject> Deliver for AlarmDeliver<T> {
    fn deliver(
        &self,
        _ns: &kura_do::Namespace,
        alarm: AlarmInvocation,
    ) -> kura_do::alarm::BoxFuture<'static, Result<(), kura_do::alarm::DeliveryError>> {
        let namespace = self.namespace.clone();
        Box::pin(async move {
            let info = AlarmInfo { retry_count: alarm.retry_count, is_retry: alarm.is_retry() };
            namespace
                .invoke(&alarm.id, true, move |object: &mut T| -> BoxFuture<'_, Result<()>> {
                    Box::pin(object.alarm(info))
                })
                .await
                .map_err(|e| kura_do::alarm::DeliveryError::Handler(Box::new(e)))
        })
    }
}

/// What an object knows of itself: its id (and name) and its storage.
#[derive(Clone)]
pub struct State {
    id: ObjectId,
    storage: Storage,
}

impl State {
    /// The object's id; `id().name()` is the name it was reached by, if any.
    pub fn id(&self) -> &ObjectId {
        &self.id
    }

    /// The object's storage.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Runs `f` while no other request of this object may start (they already wait their
    /// turn; this adds DO's 30-second limit). If `f` fails or takes longer, the object is
    /// reset.
    pub async fn block_concurrency_while<R>(&self, f: impl Future<Output = Result<R>>) -> Result<R> {
        match tokio::time::timeout(Duration::from_secs(30), f).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                self.mark_reset();
                Err(Error::Reset(format!("blockConcurrencyWhile() failed and the Durable Object was reset: {e}")))
            }
            Err(_) => {
                self.mark_reset();
                Err(Error::Reset(
                    "A call to blockConcurrencyWhile() in a Durable Object waited for too long. The call was canceled \
                     and the Durable Object was reset."
                        .into(),
                ))
            }
        }
    }

    fn mark_reset(&self) {
        if let Ok(link) = self.storage.link() {
            link.reset.store(true, Ordering::SeqCst);
        }
    }
}

/// An object's storage, as its code sees it during a request.
#[derive(Clone)]
pub struct Storage {
    /// The request now running on the object.
    current: Arc<Mutex<Weak<RequestLink>>>,
}

impl Storage {
    fn link(&self) -> Result<Arc<RequestLink>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner()).upgrade().ok_or(Error::NoRequest)
    }

    fn session(&self) -> Result<Arc<Session>> {
        self.link()?.session.lock().unwrap_or_else(|p| p.into_inner()).clone().ok_or(Error::NoRequest)
    }

    async fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut kura_do::Storage<'_>) -> kura_do::Result<R> + Send + 'static,
    ) -> Result<R> {
        let session = self.session()?;
        match session.call(f).await {
            // Only the request's own task reaches its storage (the request runs on its
            // object's thread).
            Err(DoError::Closed) => Err(Error::NoRequest),
            Err(e) => Err(e.into()),
            Ok(answer) => Ok(answer?),
        }
    }

    /// Runs SQL (several statements allowed; only the last may take parameters).
    pub async fn exec(&self, sql: &str, params: impl Into<Vec<Value>>) -> Result<Cursor> {
        let (sql, params) = (sql.to_owned(), params.into());
        self.call(move |s| s.exec(&sql, params)).await
    }

    /// The value stored under `key` (as JSON).
    pub async fn get<V: DeserializeOwned>(&self, key: &str) -> Result<Option<V>> {
        let key = key.to_owned();
        match self.call(move |s| s.kv_get(&key)).await? {
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(Error::msg),
            None => Ok(None),
        }
    }

    /// Stores `value` under `key` (as JSON).
    pub async fn put<V: Serialize + ?Sized>(&self, key: &str, value: &V) -> Result<()> {
        let (key, bytes) = (key.to_owned(), serde_json::to_vec(value).map_err(Error::msg)?);
        self.call(move |s| s.kv_put(&key, &bytes)).await
    }

    /// Deletes `key`; whether it existed.
    pub async fn delete(&self, key: &str) -> Result<bool> {
        let key = key.to_owned();
        self.call(move |s| s.kv_delete(&key)).await
    }

    /// Entries in key order, as `list()` selects them.
    pub async fn list<V: DeserializeOwned>(&self, options: ListOptions) -> Result<Vec<(String, V)>> {
        let entries = self.call(move |s| s.kv_list(&options)).await?;
        entries.into_iter().map(|(k, v)| serde_json::from_slice(&v).map(|v| (k, v)).map_err(Error::msg)).collect()
    }

    /// The alarm, Unix milliseconds.
    pub async fn get_alarm(&self) -> Result<Option<i64>> {
        self.call(|s| s.get_alarm()).await
    }

    /// Sets the alarm (Unix milliseconds; the past means now).
    pub async fn set_alarm(&self, time_ms: i64) -> Result<()> {
        self.call(move |s| s.set_alarm(time_ms)).await
    }

    /// Removes the alarm.
    pub async fn delete_alarm(&self) -> Result<()> {
        self.call(|s| s.delete_alarm()).await
    }

    /// Runs `f` synchronously on the storage, in a savepoint: all of it stays, or none.
    pub async fn transaction_sync<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut kura_do::Storage<'_>) -> kura_do::Result<R> + Send + 'static,
    ) -> Result<R> {
        self.call(move |s| s.transaction_sync(f)).await
    }

    /// Deletes everything stored (SQL, KV and the alarm).
    pub async fn delete_all(&self) -> Result<()> {
        self.call(|s| s.delete_all()).await
    }

    /// Bytes in use.
    pub async fn database_size(&self) -> Result<u64> {
        self.call(|s| s.database_size()).await
    }

    /// The bookmark of the last committed state.
    pub async fn get_current_bookmark(&self) -> Result<Bookmark> {
        self.call(|s| s.bookmark()).await
    }

    /// The bookmark of the last commit at or before `time_ms` (within 30 days).
    pub async fn get_bookmark_for_time(&self, time_ms: i64) -> Result<Bookmark> {
        self.call(move |s| s.bookmark_for_time(time_ms)).await
    }

    /// Restores the storage to `bookmark` once this request ends (the instance is dropped and
    /// rebuilt on the next request). Returns the bookmark of the last committed state, to
    /// undo the restore with.
    pub async fn on_next_session_restore_bookmark(&self, bookmark: Bookmark) -> Result<Bookmark> {
        let undo = self.get_current_bookmark().await?;
        *self.link()?.restore.lock().unwrap_or_else(|p| p.into_inner()) = Some(bookmark);
        Ok(undo)
    }
}
