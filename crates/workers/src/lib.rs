//! kura's Workers layer: users' JavaScript Workers, deployed with `wrangler deploy` and run in
//! the real workerd, with their D1, R2 and Durable Object bindings served by kura.
//!
//! - [`Workers`]: uploads ([`version`]: what wrangler sends, what kura keeps), deployments,
//!   secrets, the configuration of the workerd kura supervises ([`config`], [`runtime`]), the
//!   listener that routes requests to Workers by host ([`proxy`]), and their logs ([`logs`]).
//! - It knows the catalog, not the engines: the server serves the bindings (D1, R2, KV, queue
//!   producers, object announcements) on the socket [`Workers::bindings_socket`] names, to
//!   requests carrying [`Workers::secret`]. The one engine it drives is the Queues engine, whose
//!   messages it pushes to consumer Workers (`queue_delivery`).
//!
//! On disk, under its directory (`<data>/workers`):
//!
//! ```text
//! versions/<version id>/<n>     one file per module of an upload (never a name from the upload)
//! config/                       workerd's configuration as last written, and generated modules
//! disks/<script id>/<key>       per Durable Object class, a link to <data>/do/<namespace id>/workerd
//! run/                          sockets: kura's binding listener, one per script
//! ```

#![deny(missing_docs)]

pub mod assets;
pub mod config;
pub mod cron;
mod deploy;
mod error;
pub mod gate;
pub mod logs;
mod objects;
pub mod obtain;
pub mod proxy;
mod queue_delivery;
pub mod runtime;
mod served;
mod shared;
pub use shared::SharedFiles;
pub mod tails;
mod triggers;
pub use triggers::CronRun;
pub mod version;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use kura_catalog::{Catalog, DoNamespace, WorkerScript};

pub use deploy::{UploadOptions, Uploaded};
pub use error::{Result, WorkersError};
pub use runtime::{RuntimeSettings, WORKERD_VERSION, WorkerdBinary, find_workerd, install_command};
pub use version::{Binding, ModuleKind, StoredVersion, Upload, UploadMetadata, UploadedModule};

/// How the Workers layer runs.
#[derive(Debug, Clone, Default)]
pub struct WorkersSettings {
    /// workerd and its restarts.
    pub runtime: RuntimeSettings,
    /// Domains under which `<script>.<domain>` reaches a script (`localhost` always does).
    pub domains: Vec<String>,
    /// Run nothing (no workerd): for commands that change the catalog without a server.
    pub offline: bool,
    /// Serve Miniflare's `/cdn-cgi/handler/scheduled` (and wrangler's `/__scheduled`) on the
    /// Workers listener, which run a Worker's `scheduled` handler by URL: for development and
    /// tests only, since anyone who reaches the listener can then run it.
    pub test_scheduled: bool,
    /// The store a cluster's nodes share (`None` on a node of its own): every version's files
    /// go there, and this node runs whatever the shared catalog deploys.
    pub shared: Option<Arc<dyn SharedFiles>>,
}

struct Inner {
    dir: PathBuf,
    do_root: PathBuf,
    catalog: Arc<Catalog>,
    /// The supervised workerd, started once one is found (or obtained).
    runtime: std::sync::OnceLock<runtime::Runtime>,
    runtime_settings: RuntimeSettings,
    offline: bool,
    test_scheduled: bool,
    /// Where each script is served: shared by the runtime and the listener's connector, so the
    /// connector exists before workerd does.
    sockets: runtime::Sockets,
    /// One search for (or fetch of) workerd at a time.
    finding: tokio::sync::Mutex<()>,
    layout: config::Layout,
    routes: RwLock<proxy::Routes>,
    upstream: proxy::Upstream,
    logs: logs::Logs,
    tails: tails::Tails,
    /// Every version's static assets, and the upload sessions.
    assets: assets::AssetStore,
    /// The deployed versions' assets, by script id.
    served_assets: RwLock<std::collections::HashMap<String, Arc<assets::serve::ServedAssets>>>,
    /// Uploads, deployments, deletions and secret changes, one at a time.
    changes: tokio::sync::Mutex<()>,
    /// What wakes the queues' delivery loops.
    deliveries: queue_delivery::Signals,
    /// See [`WorkersSettings::shared`].
    shared: Option<Arc<dyn SharedFiles>>,
    /// Asset hashes known to be in the shared store.
    known_shared: shared::KnownShared,
    /// What workerd was last configured with.
    applied: std::sync::Mutex<Option<served::Applied>>,
    /// Cron Trigger runs this node claimed and started (in a cluster, each minute's run is one
    /// node's).
    cron_runs: std::sync::atomic::AtomicU64,
}

/// The Workers layer of one data directory. Cheap to clone.
#[derive(Clone)]
pub struct Workers {
    inner: Arc<Inner>,
}

/// The longest path a unix socket may have (`sun_path` less its terminator).
const MAX_SOCKET_PATH: usize = 107;

impl Workers {
    /// Opens the layer in `dir` (Durable Object classes store their objects under `do_root`,
    /// beside kura's own). Without a workerd the layer opens all the same: deploys then answer
    /// which command installs one. Must be called inside a Tokio runtime.
    ///
    /// Relative paths are made absolute here, from kura's working directory: workerd runs in
    /// a directory of its own, and every path kura hands it must name the same file there.
    pub fn open(dir: PathBuf, do_root: PathBuf, catalog: Arc<Catalog>, settings: WorkersSettings) -> Result<Workers> {
        let absolute = |path: PathBuf| {
            std::path::absolute(&path).map_err(WorkersError::io(format!("resolving {}", path.display())))
        };
        let (dir, do_root) = (absolute(dir)?, absolute(do_root)?);
        for sub in ["versions", "config", "disks", "logs", "assets"] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(WorkersError::io(format!("creating {}", path.display())))?;
        }
        let socket_dir = socket_dir(&dir)?;
        let secret = random_hex(32);
        let layout = config::Layout {
            config_dir: dir.join("config"),
            bindings_socket: socket_dir.join("bindings.sock"),
            socket_dir,
            secret,
            disks_dir: dir.join("disks"),
            max_compatibility_date: None,
            clustered: settings.shared.is_some(),
        };
        let sockets = runtime::Sockets::default();
        let upstream = proxy::upstream(Arc::clone(&sockets));
        let workers = Workers {
            inner: Arc::new(Inner {
                do_root,
                catalog,
                runtime: std::sync::OnceLock::new(),
                runtime_settings: settings.runtime,
                offline: settings.offline,
                test_scheduled: settings.test_scheduled,
                sockets,
                finding: tokio::sync::Mutex::new(()),
                layout,
                routes: RwLock::new(proxy::Routes { domains: settings.domains, ..Default::default() }),
                upstream,
                logs: logs::Logs::in_dir(dir.join("logs")),
                tails: tails::Tails::default(),
                assets: assets::AssetStore::new(dir.join("assets")),
                served_assets: RwLock::default(),
                dir,
                changes: tokio::sync::Mutex::new(()),
                deliveries: Default::default(),
                shared: settings.shared,
                known_shared: Default::default(),
                applied: Default::default(),
                cron_runs: Default::default(),
            }),
        };
        workers.sweep_versions()?;
        if !settings.offline {
            let configured = workers.inner.runtime_settings.workerd.as_deref();
            match find_workerd(configured, &obtain::obtained_path(&workers.inner.dir)) {
                Ok(binary) => {
                    workers.start_runtime(binary);
                }
                Err(e) if configured.is_some() => tracing::warn!("{e}; Workers cannot be deployed until it runs"),
                Err(_) => tracing::info!(
                    "no workerd is installed here: the first deploy fetches workerd {WORKERD_VERSION} from the npm registry (or install it with `{}`, or name one with --workerd)",
                    install_command()
                ),
            }
        }
        // Requests that arrive before workerd has started wait at the gate for their Worker.
        workers.set_routes(&workers.served_scripts()?);
        Ok(workers)
    }

    /// Starts serving what is deployed (called once the binding listener listens). Workers
    /// deployed before, with no workerd here now (a kura that pins a newer build, a data
    /// directory moved to another machine), get one fetched in the background, as a deploy
    /// would.
    pub async fn start(&self) -> Result<()> {
        let _changes = self.inner.changes.lock().await;
        let fetch_later = self.inner.runtime.get().is_none()
            && !self.inner.offline
            && self.inner.runtime_settings.workerd.is_none()
            && !self.inner.catalog.deployed_worker_scripts()?.is_empty();
        if fetch_later {
            let workers = self.clone();
            tokio::spawn(async move {
                let _changes = workers.inner.changes.lock().await;
                let started = match workers.runtime().await {
                    Ok(_) => workers.reload().await,
                    Err(e) => Err(e),
                };
                if let Err(e) = started {
                    tracing::error!(error = %e, "the deployed Workers cannot run: no workerd");
                }
            });
        }
        self.reload().await
    }

    /// Stops workerd.
    pub async fn shutdown(&self) {
        if let Some(runtime) = self.inner.runtime.get() {
            runtime.shutdown().await;
        }
    }

    /// The socket kura's binding listener must listen on.
    pub fn bindings_socket(&self) -> &Path {
        &self.inner.layout.bindings_socket
    }

    /// The secret every binding request carries in [`config::headers::SECRET`].
    pub fn secret(&self) -> &str {
        &self.inner.layout.secret
    }

    /// Whether this node is one of a cluster's, running whatever the shared catalog deploys
    /// ([`Workers::follow_catalog`]).
    pub fn is_clustered(&self) -> bool {
        self.inner.shared.is_some()
    }

    /// The scripts this node's workerd runs now, with their versions: (account, name,
    /// version id), by name.
    pub fn running(&self) -> Vec<(String, String, String)> {
        let applied = self.inner.applied.lock().unwrap_or_else(|p| p.into_inner());
        applied.as_ref().map(|a| a.scripts.clone()).unwrap_or_default()
    }

    /// How many Cron Trigger runs this node has started since it started.
    pub fn cron_runs(&self) -> u64 {
        self.inner.cron_runs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The catalog.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.inner.catalog
    }

    /// Whether the Workers listener runs `scheduled` handlers by URL ([`WorkersSettings::test_scheduled`]).
    pub fn test_scheduled(&self) -> bool {
        self.inner.test_scheduled
    }

    /// The workerd in use, if one runs yet.
    pub fn workerd(&self) -> Option<&WorkerdBinary> {
        self.inner.runtime.get().map(|r| r.binary())
    }

    /// The supervised workerd: the one already started, else one found now (installed since
    /// kura started, say), else one fetched from the npm registry.
    async fn runtime(&self) -> Result<&runtime::Runtime> {
        self.find_runtime(true).await
    }

    /// [`Workers::runtime`], fetching workerd only when `fetch` is set.
    async fn find_runtime(&self, fetch: bool) -> Result<&runtime::Runtime> {
        if let Some(runtime) = self.inner.runtime.get() {
            return Ok(runtime);
        }
        if self.inner.offline {
            return Err(WorkersError::Runtime("Workers do not run without a server".into()));
        }
        let _finding = self.inner.finding.lock().await;
        if let Some(runtime) = self.inner.runtime.get() {
            return Ok(runtime);
        }
        let configured = self.inner.runtime_settings.workerd.as_deref();
        let obtained = obtain::obtained_path(&self.inner.dir);
        let binary = match find_workerd(configured, &obtained) {
            // One kura fetched that does not say its version (damaged, or not for this host)
            // is fetched again rather than kept for the life of the process.
            Ok(binary) if binary.path == obtained && binary.max_date.is_none() && fetch => {
                tracing::warn!(path = %obtained.display(), "the workerd fetched before does not run here; fetching it again");
                let _ = std::fs::remove_file(&obtained);
                let path = obtain::obtain(&self.inner.dir).await?;
                find_workerd(Some(&path), &obtained)?
            }
            Ok(binary) => binary,
            // A binary named by the operator is theirs to install: nothing is fetched.
            Err(WorkersError::NoWorkerd { .. }) if fetch && configured.is_none() => {
                let path = obtain::obtain(&self.inner.dir).await?;
                find_workerd(Some(&path), &obtained)?
            }
            Err(e) => return Err(e),
        };
        Ok(self.start_runtime(binary))
    }

    /// Supervises `binary` from now on (the first binary set wins).
    fn start_runtime(&self, binary: WorkerdBinary) -> &runtime::Runtime {
        tracing::info!(workerd = %binary.path.display(), "Workers run in workerd");
        if binary.max_date.as_deref() != Some(runtime::WORKERD_DATE) {
            tracing::warn!(
                found = binary.max_date.as_deref().unwrap_or("an unknown version"),
                "kura is tested with workerd {WORKERD_VERSION} (workerd {}); this one may differ",
                runtime::WORKERD_DATE
            );
        }
        let settings = self.inner.runtime_settings.clone();
        let config_dir = self.inner.layout.config_dir.clone();
        let sockets = Arc::clone(&self.inner.sockets);
        self.inner.runtime.get_or_init(|| runtime::Runtime::start(binary, settings, config_dir, sockets))
    }

    /// The layout configurations are rendered with for `runtime`'s workerd.
    fn layout_for(&self, runtime: &runtime::Runtime) -> config::Layout {
        config::Layout { max_compatibility_date: runtime.binary().max_date.clone(), ..self.inner.layout.clone() }
    }

    /// The script a request for `host` goes to.
    pub fn route(&self, host: &str) -> Option<String> {
        self.routes().route(host).map(str::to_owned)
    }

    /// The routing table.
    pub fn routes(&self) -> proxy::Routes {
        self.inner.routes.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) async fn runtime_enter(&self, script_id: &str) -> Option<(gate::Pass, PathBuf)> {
        self.inner.runtime.get()?.enter(script_id, false).await
    }

    pub(crate) fn upstream(&self) -> &proxy::Upstream {
        &self.inner.upstream
    }

    /// The logs.
    pub fn logs(&self) -> &logs::Logs {
        &self.inner.logs
    }

    /// A script's logged events from its files (what `logs` answers without a server).
    pub fn logged(&self, script_id: &str) -> Vec<logs::LogEvent> {
        logs::read_files(&self.inner.dir.join("logs"), script_id)
    }

    /// The store of static assets (and their upload sessions).
    pub fn assets(&self) -> &assets::AssetStore {
        &self.inner.assets
    }

    /// The deployed version's assets of a script, if it has any.
    pub fn served_assets(&self, script_id: &str) -> Option<Arc<assets::serve::ServedAssets>> {
        self.inner.served_assets.read().unwrap_or_else(|p| p.into_inner()).get(script_id).cloned()
    }

    /// The live tails.
    pub fn tails(&self) -> &tails::Tails {
        &self.inner.tails
    }

    /// Takes what a script's tail worker sent: every event to the script's live tails, the
    /// noteworthy ones (console output, exceptions, failures, cron runs) to its logs. Answers
    /// whether the script is being tailed, so its tail worker knows to send every event.
    pub fn record_logs(&self, script_id: &str, mut events: Vec<logs::LogEvent>) -> Result<bool> {
        let script = self.inner.catalog.worker_script_by_id(script_id)?.ok_or(WorkersError::ScriptNotFound)?;
        logs::name_events(&mut events, &script.name);
        self.inner.tails.publish(script_id, &events);
        events.retain(logs::noteworthy);
        self.inner.logs.record(script_id, events);
        Ok(self.inner.tails.tailing(script_id))
    }

    /// Takes a script's events another node's Worker produced (in a cluster): to this node's
    /// live tails only (that node keeps its own logs).
    pub fn record_remote_logs(&self, script_id: &str, mut events: Vec<logs::LogEvent>) -> Result<()> {
        let script = self.inner.catalog.worker_script_by_id(script_id)?.ok_or(WorkersError::ScriptNotFound)?;
        logs::name_events(&mut events, &script.name);
        self.inner.tails.publish(script_id, &events);
        Ok(())
    }

    /// The script with this storage id.
    pub fn script_by_id(&self, script_id: &str) -> Result<WorkerScript> {
        self.inner.catalog.worker_script_by_id(script_id)?.ok_or(WorkersError::ScriptNotFound)
    }

    /// The namespace of a Durable Object class a script implements in workerd.
    pub fn class_namespace(&self, script: &WorkerScript, class_name: &str) -> Result<Option<DoNamespace>> {
        Ok(self
            .inner
            .catalog
            .list_do_namespaces(&script.account_id)?
            .into_iter()
            .find(|n| n.hosted_by_workerd() && n.script.as_deref() == Some(&script.name) && n.class_name == class_name))
    }

    /// The directory workerd keeps a namespace's objects in.
    pub fn objects_dir(&self, namespace: &DoNamespace) -> PathBuf {
        self.inner.do_root.join(&namespace.id).join("workerd")
    }

    /// Stops workerd while `work` runs (a restore of an object's file), then starts it again:
    /// the file has no other owner meanwhile. Requests to Workers wait at the gate, as during a
    /// deploy.
    pub async fn with_workerd_stopped<T>(&self, work: impl std::future::Future<Output = T>) -> Result<T> {
        let _changes = self.inner.changes.lock().await;
        // Nothing to fetch: without a workerd, no object is workerd's.
        self.find_runtime(false).await?.pause().await?;
        let outcome = work.await;
        self.reload().await?;
        Ok(outcome)
    }

    /// Removes version files no version owns (an upload cut short, a deleted script's), then
    /// the asset files no remaining version lists.
    fn sweep_versions(&self) -> Result<()> {
        self.remove_unknown_versions()?;
        self.sweep_assets()
    }

    /// Removes the version directories no version of the catalog owns. Callers hold the change
    /// lock, or run before anything else (an upload's files are not in the catalog until it
    /// is recorded).
    pub(crate) fn remove_unknown_versions(&self) -> Result<()> {
        let known: std::collections::HashSet<String> =
            self.inner.catalog.all_worker_version_ids()?.into_iter().collect();
        let dir = self.inner.dir.join("versions");
        for entry in std::fs::read_dir(&dir).map_err(WorkersError::io("reading the versions"))? {
            let entry = entry.map_err(WorkersError::io("reading the versions"))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !known.contains(&name) {
                tracing::info!(version = name, "removing the files of a version the catalog does not have");
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        Ok(())
    }

    /// Removes the asset files no version lists (a deleted script's, an abandoned upload's).
    pub(crate) fn sweep_assets(&self) -> Result<()> {
        let dir = self.inner.dir.join("versions");
        let mut listed = std::collections::HashSet::new();
        for version in self.inner.catalog.all_worker_version_ids()? {
            if let Some(assets) = assets::VersionAssets::read(&dir.join(version))? {
                listed.extend(assets.files.into_values().map(|a| a.hash));
            }
        }
        let removed = self.inner.assets.sweep(&listed)?;
        if removed > 0 {
            tracing::info!(files = removed, "removed asset files no version lists");
        }
        Ok(())
    }

    fn version_dir(&self, version_id: &str) -> PathBuf {
        self.inner.dir.join("versions").join(version_id)
    }
}

/// Where the sockets go: `<dir>/run`, or a private directory under the system's temporary
/// directory when that path is too long for a unix socket — the longest being a deploy check's,
/// one directory further down (`k<6 hex>/w-<16 hex>.sock`).
fn socket_dir(dir: &Path) -> Result<PathBuf> {
    let preferred = dir.join("run");
    let longest = preferred.join("k0123ab").join("w-0123456789abcdef.sock");
    let chosen = if longest.as_os_str().len() <= MAX_SOCKET_PATH {
        preferred
    } else {
        let digest = <sha2::Sha256 as sha2::Digest>::digest(dir.as_os_str().as_encoded_bytes());
        std::env::temp_dir().join(format!("kura-{}", &hex::encode(digest)[..16]))
    };
    std::fs::create_dir_all(&chosen).map_err(WorkersError::io(format!("creating {}", chosen.display())))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&chosen, std::fs::Permissions::from_mode(0o700))
        .map_err(WorkersError::io(format!("restricting {}", chosen.display())))?;
    Ok(chosen)
}

/// `n` random bytes as hex.
fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    getrandom::fill(&mut bytes).expect("the operating system's random source failed");
    hex::encode(bytes)
}
