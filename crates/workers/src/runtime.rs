//! The one workerd process kura supervises: found on disk, started on the configuration of the
//! deployed scripts, restarted on every deploy (behind the [`Gate`], so requests wait instead of
//! failing) and whenever it dies, stopped with kura. Its output goes to kura's log. A candidate
//! script is first checked by a workerd of its own, so a script workerd refuses never replaces
//! one that serves.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};

use crate::config::WorkerdConfig;
use crate::error::{Result, WorkersError};
use crate::gate::Gate;

/// The workerd build wrangler 4.85.0 runs (its Miniflare's), which kura is tested with.
pub const WORKERD_VERSION: &str = "1.20260424.1";

/// What that build's `workerd --version` says.
pub const WORKERD_DATE: &str = "2026-04-24";

/// The command that installs it next to where kura runs.
pub fn install_command() -> String {
    format!("npm install workerd@{WORKERD_VERSION}")
}

/// How the runtime runs.
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    /// The workerd binary; searched for when `None`.
    pub workerd: Option<PathBuf>,
    /// Longest a restart waits for requests in progress to finish.
    pub drain_timeout: Duration,
    /// Longest workerd may take to start listening.
    pub start_timeout: Duration,
    /// Longest a request waits at the gate during a restart.
    pub request_patience: Duration,
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        RuntimeSettings {
            workerd: None,
            drain_timeout: Duration::from_secs(30),
            start_timeout: Duration::from_secs(30),
            request_patience: Duration::from_secs(60),
        }
    }
}

/// A workerd binary and the newest compatibility date it supports.
#[derive(Debug, Clone)]
pub struct WorkerdBinary {
    /// The executable.
    pub path: PathBuf,
    /// `YYYY-MM-DD`, from `workerd --version`.
    pub max_date: Option<String>,
}

/// Where each script is served (its socket), by script id.
pub type Sockets = Arc<RwLock<HashMap<String, PathBuf>>>;

/// Finds workerd: the configured path, else `KURA_WORKERD`, else a `node_modules` in the
/// current directory or one above it, else the one kura fetched before (at `obtained`).
pub fn find_workerd(configured: Option<&Path>, obtained: &Path) -> std::result::Result<WorkerdBinary, WorkersError> {
    let mut searched = Vec::new();
    let candidate = match configured {
        Some(path) => Some(path.to_owned()),
        None => match std::env::var_os("KURA_WORKERD") {
            Some(path) => Some(PathBuf::from(path)),
            None => {
                let mut found = None;
                if let Ok(dir) = std::env::current_dir() {
                    for dir in dir.ancestors() {
                        for relative in [
                            "node_modules/workerd/bin/workerd",
                            "node_modules/@cloudflare/workerd-linux-64/bin/workerd",
                        ] {
                            let path = dir.join(relative);
                            if found.is_none() && path.is_file() {
                                found = Some(path);
                            }
                        }
                        searched.push(dir.join("node_modules").display().to_string());
                        if found.is_some() {
                            break;
                        }
                    }
                }
                found.or_else(|| obtained.is_file().then(|| obtained.to_owned()))
            }
        },
    };
    let Some(path) = candidate else {
        let searched = match searched.len() {
            0 => "no current directory".to_owned(),
            n => format!("searched {} and {} more directories above it", searched[0], n - 1),
        };
        return Err(WorkersError::NoWorkerd { searched, install: install_command() });
    };
    let output = std::process::Command::new(&path).arg("--version").output().map_err(|e| WorkersError::NoWorkerd {
        searched: format!("{} could not be run: {e}", path.display()),
        install: install_command(),
    })?;
    let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let max_date = version.strip_prefix("workerd ").filter(|d| d.len() == 10).map(str::to_owned);
    Ok(WorkerdBinary { path, max_date })
}

enum Order {
    Apply(WorkerdConfig, oneshot::Sender<Result<()>>),
    Pause(oneshot::Sender<()>),
    Shutdown(oneshot::Sender<()>),
}

/// The supervised workerd. Cheap to share behind an `Arc`.
pub struct Runtime {
    binary: WorkerdBinary,
    settings: RuntimeSettings,
    gate: Arc<Gate>,
    sockets: Sockets,
    commands: mpsc::Sender<Order>,
}

/// The last lines workerd wrote to stderr, for error messages.
type StderrTail = Arc<Mutex<Vec<String>>>;

struct Running {
    child: Child,
    stderr: StderrTail,
    started: Instant,
}

struct Supervisor {
    binary: WorkerdBinary,
    settings: RuntimeSettings,
    config_dir: PathBuf,
    gate: Arc<Gate>,
    sockets: Sockets,
    running: Option<Running>,
    last_good: Option<WorkerdConfig>,
    retry_at: Option<tokio::time::Instant>,
    backoff: Duration,
}

impl Runtime {
    /// Starts supervising (no process runs until a configuration with scripts is applied).
    /// `config_dir` is where configurations are written; `sockets` is kept up to date with where
    /// each script is served.
    pub fn start(binary: WorkerdBinary, settings: RuntimeSettings, config_dir: PathBuf, sockets: Sockets) -> Runtime {
        let (commands, rx) = mpsc::channel(16);
        // Closed until the first configuration runs.
        let gate = Arc::new(Gate::closed());
        let supervisor = Supervisor {
            binary: binary.clone(),
            settings: settings.clone(),
            config_dir,
            gate: Arc::clone(&gate),
            sockets: Arc::clone(&sockets),
            running: None,
            last_good: None,
            retry_at: None,
            backoff: Duration::from_millis(500),
        };
        tokio::spawn(supervisor.run(rx));
        Runtime { binary, settings, gate, sockets, commands }
    }

    /// The binary in use.
    pub fn binary(&self) -> &WorkerdBinary {
        &self.binary
    }

    /// Replaces the running configuration: requests in progress finish, new ones wait, workerd
    /// restarts on `config`. If workerd will not run it, the previous configuration serves on
    /// and the error says why.
    pub async fn apply(&self, config: WorkerdConfig) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Order::Apply(config, reply))
            .await
            .map_err(|_| WorkersError::Runtime("the runtime has stopped".into()))?;
        answer.await.map_err(|_| WorkersError::Runtime("the runtime has stopped".into()))?
    }

    /// Stops workerd with the gate closed: requests wait until the next [`Runtime::apply`].
    pub async fn pause(&self) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Order::Pause(reply))
            .await
            .map_err(|_| WorkersError::Runtime("the runtime has stopped".into()))?;
        answer.await.map_err(|_| WorkersError::Runtime("the runtime has stopped".into()))
    }

    /// Stops workerd.
    pub async fn shutdown(&self) {
        let (reply, answer) = oneshot::channel();
        if self.commands.send(Order::Shutdown(reply)).await.is_ok() {
            let _ = answer.await;
        }
    }

    /// Runs `config` in a workerd of its own in `dir` until it listens, then stops it: whether
    /// workerd accepts the configuration, and if not, what it said.
    pub async fn check(&self, config: &WorkerdConfig, dir: &Path) -> Result<()> {
        // Without --experimental: workerd itself then refuses a user's experimental
        // compatibility flags (kura's own Workers, which need one, are not checked).
        let mut running = spawn(&self.binary, dir, config, false).await?;
        let outcome = wait_listening(&mut running, config, self.settings.start_timeout).await;
        stop(&mut running).await;
        outcome.map_err(|e| match e {
            WorkersError::Runtime(message) => WorkersError::ScriptRejected(message),
            other => other,
        })
    }

    /// Waits at the gate, then answers where the script is served (`nested`: for a request
    /// one already through the gate waits on, see [`crate::gate::Gate::join`]).
    pub async fn enter(&self, script_id: &str, nested: bool) -> Option<(crate::gate::Pass, PathBuf)> {
        let pass = match nested {
            true => self.gate.join(self.settings.request_patience).await?,
            false => self.gate.enter(self.settings.request_patience).await?,
        };
        let socket = self.sockets.read().unwrap_or_else(|p| p.into_inner()).get(script_id).cloned()?;
        Some((pass, socket))
    }
}

impl Supervisor {
    async fn run(mut self, mut commands: mpsc::Receiver<Order>) {
        loop {
            let retry_at = self.retry_at;
            let exited = async {
                match self.running.as_mut() {
                    Some(running) => running.child.wait().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                command = commands.recv() => match command {
                    Some(Order::Apply(config, reply)) => {
                        let outcome = self.apply(config).await;
                        let _ = reply.send(outcome);
                    }
                    Some(Order::Pause(reply)) => {
                        let unfinished = self.gate.close(self.settings.drain_timeout).await;
                        if unfinished > 0 {
                            tracing::warn!(unfinished, "requests still running after the drain timeout are cut off");
                        }
                        self.stop().await;
                        self.retry_at = None;
                        let _ = reply.send(());
                    }
                    Some(Order::Shutdown(reply)) => {
                        self.stop().await;
                        let _ = reply.send(());
                        return;
                    }
                    None => {
                        self.stop().await;
                        return;
                    }
                },
                status = exited => {
                    let ran = self.running.take().map(|r| (r.started.elapsed(), r.stderr));
                    let (ran_for, stderr) = ran.unwrap_or_default();
                    tracing::error!(status = ?status.ok(), ran_for = ?ran_for, last_output = %tail_text(&stderr), "workerd exited; restarting it");
                    self.gate.close(Duration::ZERO).await;
                    if ran_for > Duration::from_secs(60) {
                        self.backoff = Duration::from_millis(500);
                    }
                    self.retry_at = Some(tokio::time::Instant::now() + self.backoff);
                    self.backoff = (self.backoff * 2).min(Duration::from_secs(30));
                }
                _ = sleep_until(retry_at) => {
                    self.retry_at = None;
                    if let Some(config) = self.last_good.clone() {
                        match self.launch(&config).await {
                            Ok(()) => self.gate.open(),
                            Err(e) => {
                                tracing::error!(error = %e, "workerd would not restart; trying again");
                                self.retry_at = Some(tokio::time::Instant::now() + self.backoff);
                                self.backoff = (self.backoff * 2).min(Duration::from_secs(30));
                            }
                        }
                    }
                }
            }
        }
    }

    async fn apply(&mut self, config: WorkerdConfig) -> Result<()> {
        let unfinished = self.gate.close(self.settings.drain_timeout).await;
        if unfinished > 0 {
            tracing::warn!(unfinished, "requests still running after the drain timeout are cut off by the restart");
        }
        self.stop().await;
        self.retry_at = None;
        let outcome = self.launch(&config).await;
        match &outcome {
            Ok(()) => self.last_good = Some(config),
            Err(e) => {
                tracing::error!(error = %e, "workerd refused the new configuration; the previous one serves on");
                if let Some(previous) = self.last_good.clone()
                    && let Err(e) = self.launch(&previous).await
                {
                    tracing::error!(error = %e, "workerd would not run the previous configuration either; retrying");
                    self.retry_at = Some(tokio::time::Instant::now() + self.backoff);
                }
            }
        }
        self.gate.open();
        outcome
    }

    /// Writes `config` and starts workerd on it (nothing, for a configuration without scripts).
    async fn launch(&mut self, config: &WorkerdConfig) -> Result<()> {
        if config.sockets.is_empty() {
            self.sockets.write().unwrap_or_else(|p| p.into_inner()).clear();
            return Ok(());
        }
        let mut running = spawn(&self.binary, &self.config_dir, config, true).await?;
        if let Err(e) = wait_listening(&mut running, config, self.settings.start_timeout).await {
            stop(&mut running).await;
            return Err(e);
        }
        *self.sockets.write().unwrap_or_else(|p| p.into_inner()) = config.sockets.iter().cloned().collect();
        self.running = Some(running);
        Ok(())
    }

    async fn stop(&mut self) {
        if let Some(mut running) = self.running.take() {
            stop(&mut running).await;
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn tail_text(stderr: &StderrTail) -> String {
    stderr.lock().unwrap_or_else(|p| p.into_inner()).join("\n")
}

/// Writes the configuration's files into `dir` and starts workerd there.
/// Starts workerd on `config` in `dir`; `experimental` allows experimental compatibility flags
/// (the served configuration's cron triggers need `service_binding_extra_handlers`).
async fn spawn(binary: &WorkerdBinary, dir: &Path, config: &WorkerdConfig, experimental: bool) -> Result<Running> {
    std::fs::create_dir_all(dir).map_err(WorkersError::io(format!("creating {}", dir.display())))?;
    for (name, contents) in &config.generated {
        std::fs::write(dir.join(name), contents).map_err(WorkersError::io(format!("writing {name}")))?;
    }
    let config_path = dir.join("workerd.capnp");
    std::fs::write(&config_path, &config.text).map_err(WorkersError::io("writing workerd's configuration"))?;
    for (_, socket) in &config.sockets {
        let _ = std::fs::remove_file(socket);
        if let Some(parent) = socket.parent() {
            std::fs::create_dir_all(parent).map_err(WorkersError::io(format!("creating {}", parent.display())))?;
        }
    }
    let mut command = Command::new(&binary.path);
    command.arg("serve");
    if experimental {
        command.arg("--experimental");
    }
    command
        .arg("workerd.capnp")
        .current_dir(dir)
        // Workers run in UTC, on Cloudflare as under Miniflare.
        .env("TZ", "UTC")
        .envs(config.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    die_with_kura(&mut command);
    let mut child = spawn_from_lasting_thread(command)
        .await
        .map_err(|e| WorkersError::Runtime(format!("cannot start {}: {e}", binary.path.display())))?;
    let stderr: StderrTail = Arc::default();
    if let Some(out) = child.stdout.take() {
        tokio::spawn(forward(BufReader::new(out), None));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(forward(BufReader::new(err), Some(Arc::clone(&stderr))));
    }
    Ok(Running { child, stderr, started: Instant::now() })
}

/// Makes the child die with kura, even a kura killed with SIGKILL.
fn die_with_kura(command: &mut Command) {
    let kura = std::process::id();
    // SAFETY: the closure runs in the forked child before exec; it calls only async-signal-safe
    // functions (prctl, getppid) and allocates nothing (its errors are raw OS errors).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // kura may have died between the fork and the prctl: then no signal comes.
            if libc::getppid() as u32 != kura {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Starts `command` from a thread that lives as long as kura. Linux sends the parent-death
/// signal when the *thread* that forked the child ends, not the process: started from a tokio
/// thread that retires (a blocking-pool thread, or a worker once handed to `block_in_place`, as
/// the cluster's catalog does), workerd would be killed with that thread.
async fn spawn_from_lasting_thread(command: Command) -> std::io::Result<Child> {
    type Job = (Command, tokio::runtime::Handle, oneshot::Sender<std::io::Result<Child>>);
    static SPAWNER: std::sync::OnceLock<std::io::Result<std::sync::mpsc::Sender<Job>>> = std::sync::OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, received) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new().name("kura-workerd-spawner".into()).spawn(move || {
            for (mut command, runtime, reply) in received {
                // Nobody waits for a child asked for by a caller since gone (its runtime may have
                // shut down, and the child would run unsupervised).
                if reply.is_closed() {
                    continue;
                }
                // tokio reaps the child with the runtime's own driver.
                let _entered = runtime.enter();
                let _ = reply.send(command.spawn());
            }
        })?;
        Ok(jobs)
    });
    let spawner = spawner.as_ref().map_err(|e| std::io::Error::new(e.kind(), e.to_string()))?;
    let (reply, spawned) = oneshot::channel();
    spawner
        .send((command, tokio::runtime::Handle::current(), reply))
        .map_err(|_| std::io::Error::other("the workerd spawner thread is gone"))?;
    spawned.await.map_err(|_| std::io::Error::other("the workerd spawner thread is gone"))?
}

/// Copies workerd's output into kura's log, keeping stderr's last lines.
async fn forward(reader: impl tokio::io::AsyncBufRead + Unpin, keep: Option<StderrTail>) {
    let mut lines = reader.lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match &keep {
            Some(kept) => {
                // Uncaught exceptions and console.error also reach the tail worker, which logs
                // them under the Worker's name; what workerd itself says on failing is kept.
                tracing::debug!(target: "workerd", "{line}");
                let mut kept = kept.lock().unwrap_or_else(|p| p.into_inner());
                if kept.len() == 50 {
                    kept.remove(0);
                }
                kept.push(line);
            }
            // Console output; each Worker's tail worker reports it under the Worker's name.
            None => tracing::debug!(target: "workerd", "{line}"),
        }
    }
}

/// Waits until every socket of the configuration accepts connections, or workerd exits.
async fn wait_listening(running: &mut Running, config: &WorkerdConfig, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut pending: Vec<&PathBuf> = config.sockets.iter().map(|(_, s)| s).collect();
    loop {
        if let Some(status) = running.child.try_wait().map_err(WorkersError::io("watching workerd"))? {
            // Give the output a moment to arrive: it says why.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let said = tail_text(&running.stderr);
            return Err(WorkersError::Runtime(if said.is_empty() {
                format!("workerd exited ({status})")
            } else {
                said
            }));
        }
        let mut still = Vec::new();
        for socket in pending {
            if tokio::net::UnixStream::connect(socket).await.is_err() {
                still.push(socket);
            }
        }
        pending = still;
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(WorkersError::Runtime(format!("workerd did not listen within {} s", timeout.as_secs())));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Asks workerd to stop (SIGTERM: objects close their databases), then makes sure it has.
async fn stop(running: &mut Running) {
    if let Some(pid) = running.child.id() {
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
    }
    if tokio::time::timeout(Duration::from_secs(10), running.child.wait()).await.is_err() {
        tracing::warn!("workerd did not stop within 10 s of SIGTERM; killing it");
        let _ = running.child.kill().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts `sleep 30` made to die with kura, from a thread that ends at once, either
    /// through the lasting thread or directly; answers how it exited 300 ms later, if it did.
    fn started_from_a_passing_thread(through_the_lasting_thread: bool) -> Option<std::process::ExitStatus> {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let handle = runtime.handle().clone();
        let mut child = std::thread::spawn(move || {
            handle.block_on(async {
                let mut command = Command::new("sleep");
                command.arg("30").kill_on_drop(true);
                die_with_kura(&mut command);
                match through_the_lasting_thread {
                    true => spawn_from_lasting_thread(command).await.unwrap(),
                    false => command.spawn().unwrap(),
                }
            })
        })
        .join()
        .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        runtime.block_on(async { child.try_wait() }).unwrap()
    }

    /// Linux's parent-death signal follows the thread that forked: a child started for a thread
    /// that then ends goes on living (that it dies with the process a test cannot show).
    #[test]
    fn a_child_outlives_the_thread_that_started_it() {
        let exited = started_from_a_passing_thread(true);
        assert!(exited.is_none(), "the child was killed with the thread that started it: {exited:?}");
    }

    /// The control: started directly from that thread, the child dies with it — so the signal is
    /// set, and the lasting thread is what keeps the child alive above.
    #[test]
    fn a_child_started_directly_dies_with_its_thread() {
        use std::os::unix::process::ExitStatusExt;
        let exited = started_from_a_passing_thread(false);
        assert_eq!(exited.and_then(|e| e.signal()), Some(libc::SIGKILL), "{exited:?}");
    }
}
