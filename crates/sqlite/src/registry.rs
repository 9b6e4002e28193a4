//! The registry of open databases: it starts an actor on first use, routes commands to it,
//! closes actors that sit idle, and caps how many are open at once.
//!
//! Every send happens under the registry's lock, and an actor is told to close only under the
//! same lock, after it is taken out of the map, so no command is ever sent to an actor that has
//! stopped listening. A new actor for a file waits until the previous one has closed it, so
//! there is never more than one owner of a file.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::TrySendError;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::actor::{Actor, Afterwards, Captured, Command, DoneSignal, Executed, Identity, Owner, Start, Tried};
use crate::database::{CAPTURE_DELAY, Database, DatabaseOptions};
use crate::error::{Error, Result};
use crate::pool::Pool;
use crate::request::{Request, StatementResult};

/// How the registry runs its actors.
#[derive(Debug, Clone)]
pub struct RegistrySettings {
    /// Most databases open at once; the least recently used is closed to make room.
    pub max_open: usize,
    /// Requests that may wait in one database's queue before it answers "overloaded".
    pub queue_depth: usize,
    /// How long an actor waits for work before it closes its database.
    pub idle_timeout: Duration,
    /// Most requests committed together.
    pub max_group: usize,
}

impl Default for RegistrySettings {
    fn default() -> Self {
        RegistrySettings { max_open: 256, queue_depth: 512, idle_timeout: Duration::from_secs(60), max_group: 128 }
    }
}

/// How long a read may run on its caller's thread (an async runtime's worker) before it is
/// interrupted and sent to the database's actor instead: a point SELECT takes microseconds,
/// and a worker must not be held for long.
const INLINE_READ_BUDGET: Duration = Duration::from_millis(1);

/// Maps a database key to the options its file opens with (`None`: no such database).
pub type Opener = dyn Fn(&str) -> Option<DatabaseOptions> + Send + Sync;

struct Entry {
    actor: Arc<Actor>,
    generation: u64,
    last_used: Instant,
    done: Arc<DoneSignal>,
}

#[derive(Default)]
struct State {
    actors: HashMap<String, Entry>,
    /// Databases closed for good (deleted): requests for them are refused, never reopen them.
    retired: HashSet<String>,
    /// Actors that were told to close and may still hold their file.
    closing: HashMap<String, Arc<DoneSignal>>,
    next_generation: u64,
    shut_down: bool,
}

pub(crate) struct Shared {
    state: Mutex<State>,
    /// Requests on their way through [`Registry::execute_with_bookmark`].
    in_flight: AtomicUsize,
    /// When (microseconds after `epoch`) a request last arrived while another was on its way.
    crowded_at: AtomicU64,
    epoch: Instant,
    opener: Box<Opener>,
    settings: RegistrySettings,
    stats: Arc<crate::stats::Stats>,
    /// The threads the actors run on while they have work.
    pool: Pool,
    /// Set when the registry is gone, for the thread that closes idle databases.
    reaper: Arc<ReaperStop>,
    /// Actors told to close that could get no thread to do it, oldest first: the thread that
    /// closes idle databases closes them.
    unclosed: Mutex<Vec<Arc<Actor>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.reaper.stop();
        // A registry dropped without a shutdown still has its files closed cleanly (checkpointed)
        // by the pool's threads, as it did when each actor had its own.
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, entry) in state.actors.drain() {
            entry.actor.close(Start::InTurn);
        }
    }
}

/// The open databases of one engine. Cheap to clone; clones share the actors.
#[derive(Clone)]
pub struct Registry {
    shared: Arc<Shared>,
}

impl Registry {
    /// A registry whose databases open with the options `opener` gives for their key.
    pub fn new(
        settings: RegistrySettings,
        opener: impl Fn(&str) -> Option<DatabaseOptions> + Send + Sync + 'static,
    ) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            in_flight: AtomicUsize::new(0),
            crowded_at: AtomicU64::new(0),
            epoch: Instant::now(),
            opener: Box::new(opener),
            settings,
            stats: Arc::default(),
            pool: Pool::new("kura-db"),
            reaper: Arc::new(ReaperStop::default()),
            unclosed: Mutex::default(),
        });
        start_reaper(&shared);
        Registry { shared }
    }

    /// Runs a request on the database `key` (in a group commit when it can); answers once the
    /// outcome is durable.
    pub async fn execute(&self, key: &str, request: Request) -> Result<Vec<StatementResult>> {
        self.execute_with_bookmark(key, request).await.map(|e| e.results)
    }

    /// Runs a request as [`Registry::execute`] does, and answers with the bookmark of a state
    /// that includes it as well.
    pub async fn execute_with_bookmark(&self, key: &str, request: Request) -> Result<Executed> {
        let arrived = InFlight::arriving(&self.shared);
        if let Some(actor) = self.shared.lent(key) {
            let lender = actor.lender();
            let tried = match request.plainly_writes() {
                true => Tried::NotRun,
                false => lender.try_read(&request, INLINE_READ_BUDGET),
            };
            // A write runs on the caller's thread only while the registry serves one request
            // at a time: alone, the hand-offs to and from the actor are a third of its time;
            // with company, the actor's group commit (one fsync for all, and each database's
            // on its own thread) serves everyone sooner, and a commit on a caller's thread
            // would hold up the requests arriving behind it. It holds the caller's async worker
            // for one commit (the runtime's other workers take its other work meanwhile);
            // `block_in_place` would free the worker, but its hand-off costs a tenth of the
            // write. A read past its budget goes to the actor whatever the company.
            let tried = match tried {
                Tried::NotRun if arrived.alone() && lender.may_write() => lender.try_write(&request),
                other => other,
            };
            if let Tried::Answered(outcome, afterwards) = tried {
                match afterwards {
                    Afterwards::Nothing => {}
                    Afterwards::Reopen => self.shared.reopen(key),
                    // A task spawned here runs on this worker once the request's task yields,
                    // which is after its answer is written: the capture leaves the answer's
                    // path and fills the wait for the client's next request.
                    Afterwards::Capture => match tokio::runtime::Handle::try_current() {
                        Ok(runtime) => {
                            let (shared, key) = (Arc::clone(&self.shared), key.to_owned());
                            runtime.spawn(async move { shared.capture_due(&key, &actor) });
                        }
                        Err(_) => self.shared.capture_due(key, &actor),
                    },
                }
                return outcome;
            }
        }
        let (reply, answer) = oneshot::channel();
        self.shared.send(key, Command::Execute { request, reply })?;
        answer.await.unwrap_or(Err(Error::Closed))
    }

    /// Runs kura's own writes `f` (authorizer off) on the database `key` inside a group commit,
    /// shared with other requests queued with it, and answers once they are durable. `f` runs
    /// in a savepoint: if it returns an error, what it did is undone and the error returned. It
    /// may run twice (the second time alone) if its group has to be replayed.
    pub async fn write_grouped<T, E, F>(&self, key: &str, f: F) -> Result<Result<T, E>>
    where
        T: Send + 'static,
        E: Send + 'static,
        F: FnMut(&rusqlite::Connection) -> std::result::Result<T, E> + Send + 'static,
    {
        struct Work<T, E, F> {
            f: F,
            output: Option<std::result::Result<T, E>>,
            reply: oneshot::Sender<Result<std::result::Result<T, E>>>,
        }
        impl<T, E, F> crate::actor::GroupedWork for Work<T, E, F>
        where
            T: Send,
            E: Send,
            F: FnMut(&rusqlite::Connection) -> std::result::Result<T, E> + Send,
        {
            fn run(&mut self, conn: &rusqlite::Connection) -> bool {
                let output = (self.f)(conn);
                let ok = output.is_ok();
                self.output = Some(output);
                ok
            }
            fn finish(self: Box<Self>, committed: Result<()>) {
                let answer = match (committed, self.output) {
                    (Err(e), _) => Err(e),
                    (Ok(()), Some(output)) => Ok(output),
                    (Ok(()), None) => Err(Error::Closed),
                };
                let _ = self.reply.send(answer);
            }
        }
        let (reply, answer) = oneshot::channel();
        self.shared.send(key, Command::Work(Box::new(Work { f, output: None, reply })))?;
        answer.await.unwrap_or(Err(Error::Closed))
    }

    /// Runs `f` on the database `key` with the file to itself, between transactions.
    pub async fn with_database<T, F>(&self, key: &str, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Database) -> T + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let command = Command::Exclusive(Box::new(move |db: &mut Database| {
            let _ = reply.send(f(db));
        }));
        self.shared.send(key, command)?;
        answer.await.map_err(|_| Error::Closed)
    }

    /// Captures into every open database's history the commits it owes (those answered and
    /// not yet captured, [`Database::capture_due`]), and waits: afterwards the logs of the
    /// databases open and not closing hold every commit answered before the call (one closing
    /// captures as it closes; one whose queue is full, with its next commit). Owed commits are
    /// otherwise captured within about a second; this is for a caller that must not leave that
    /// work to later (a benchmark's turn, a copy of the data directory taken while serving). Idle
    /// databases capture in place, on one blocking thread per core (a thousand objects' captures
    /// are a fraction of a second of copying); a busy one through its actor.
    pub async fn capture_histories(&self) {
        let actors = self.shared.open_actors();
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let chunk = actors.len().div_ceil(threads).max(1);
        let mut capturing = Vec::new();
        for part in actors.chunks(chunk) {
            let part = part.to_vec();
            capturing.push(tokio::task::spawn_blocking(move || {
                part.into_iter()
                    .map(|(key, actor)| {
                        let captured = actor.lender().capture_owed();
                        (key, actor, captured)
                    })
                    .filter(|(_, _, captured)| *captured != Captured::Done)
                    .collect::<Vec<_>>()
            }));
        }
        let mut left = Vec::new();
        for part in capturing {
            match part.await {
                Ok(part) => left.extend(part),
                // Whatever it did not capture, the idle thread captures within a second.
                Err(e) => tracing::error!(error = %e, "capturing a share of the open databases failed"),
            }
        }
        let mut answers = Vec::new();
        for (key, actor, captured) in left {
            if captured == Captured::Reopen {
                self.shared.reopen(&key);
                continue;
            }
            let (reply, answer) = oneshot::channel();
            let command = Command::Exclusive(Box::new(move |db: &mut Database| {
                db.settle_history();
                let _ = reply.send(());
            }));
            if actor.post(command).is_ok() {
                answers.push(answer);
            }
        }
        for answer in answers {
            let _ = answer.await;
        }
    }

    /// Closes the database `key` and waits until its file is released. Requests already queued
    /// still run; a later request opens it again.
    pub async fn close(&self, key: &str) {
        let signal = {
            let mut state = self.shared.lock();
            match state.actors.remove(key) {
                Some(entry) => Some(close_entry(&mut state, key, entry, Start::Now)),
                None => state.closing.get(key).cloned(),
            }
        };
        if let Some(signal) = signal {
            wait_async(signal).await;
        }
    }

    /// Closes the database `key` for good, as [`Registry::close`] does, and refuses every later
    /// request for it (so a request already on its way cannot reopen a file being deleted).
    pub async fn retire(&self, key: &str) {
        self.shared.lock().retired.insert(key.to_owned());
        self.shared.stats.forget(key);
        self.close(key).await;
    }

    /// Closes every database and waits for all of them; later requests are refused.
    pub async fn shutdown(&self) {
        let signals: Vec<Arc<DoneSignal>> = {
            let mut state = self.shared.lock();
            state.shut_down = true;
            let open: Vec<_> = state.actors.drain().collect();
            // In turn: nothing can wait for these closes (later requests are refused, and an
            // open database never waits for another open one), so they may wait for threads.
            for (key, entry) in open {
                close_entry(&mut state, &key, entry, Start::InTurn);
            }
            state.closing.values().cloned().collect::<Vec<_>>()
        };
        for signal in signals {
            wait_async(signal).await;
        }
    }

    /// Whether the database `key` is open now (it may close the moment after).
    pub fn is_open(&self, key: &str) -> bool {
        self.shared.lock().actors.contains_key(key)
    }

    /// How many databases are open now.
    pub fn open_count(&self) -> usize {
        self.shared.lock().actors.len()
    }

    /// How many threads the registry's databases run on now (busy, or waiting a while for
    /// work): an open database with nothing to do holds none.
    pub fn threads(&self) -> usize {
        self.shared.pool.threads()
    }

    /// What the registry's databases did since it started.
    pub fn stats(&self) -> &crate::stats::Stats {
        &self.shared.stats
    }
}

/// How long after two requests were last on their way at once the registry still counts as
/// serving several clients.
const CROWDED_FOR: Duration = Duration::from_millis(50);

/// A request counted among the registry's requests on their way while it lives.
struct InFlight<'a> {
    shared: &'a Shared,
    /// Whether it arrived with no other request on its way and none lately.
    alone: bool,
}

impl<'a> InFlight<'a> {
    fn arriving(shared: &'a Shared) -> Self {
        let now = shared.epoch.elapsed().as_micros() as u64;
        let alone = if shared.in_flight.fetch_add(1, Ordering::SeqCst) > 0 {
            shared.crowded_at.store(now, Ordering::Relaxed);
            false
        } else {
            now.saturating_sub(shared.crowded_at.load(Ordering::Relaxed)) > CROWDED_FOR.as_micros() as u64
        };
        InFlight { shared, alone }
    }

    fn alone(&self) -> bool {
        self.alone
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn wait_async(signal: Arc<DoneSignal>) {
    // Actors close quickly; waiting on a blocking thread keeps the runtime free meanwhile.
    let _ = tokio::task::spawn_blocking(move || signal.wait()).await;
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Has the actor of `key` hand its file to a successor that reopens it: an empty command
    /// has it see that the file must be reopened.
    fn reopen(self: &Arc<Self>, key: &str) {
        let _ = self.send(key, Command::Exclusive(Box::new(|_| {})));
    }

    /// Captures what the database `key` owes its history if that is due
    /// ([`Lender::capture_due`]): here if it is idle, else through its actor (a failure there
    /// has the actor reopen the file); a checkpoint the capture finds due is left to the
    /// actor's thread as well. An actor that has stopped captured everything as it closed,
    /// and one whose queue is full captures with its next commit: neither is sent anything.
    fn capture_due(self: &Arc<Self>, key: &str, actor: &Arc<Actor>) {
        match actor.lender().capture_due() {
            Captured::Done => {}
            Captured::Reopen => self.reopen(key),
            Captured::Busy | Captured::CheckpointDue => {
                let _ = actor.post(Command::Exclusive(Box::new(Database::settle_history)));
            }
        }
    }

    /// Captures the commits owed to the history of every idle database whose capture is due
    /// (the oldest answered long enough ago, [`Database::capture_due`]): an idle database has
    /// no commit of its own to notice it. A busy one sees to it after its next commit, or as
    /// it closes.
    fn capture_idle(self: &Arc<Self>) {
        for (key, actor) in self.open_actors() {
            if !actor.is_busy() {
                self.capture_due(&key, &actor);
            }
        }
    }

    /// The databases open now, each with its actor.
    fn open_actors(&self) -> Vec<(String, Arc<Actor>)> {
        self.lock().actors.iter().map(|(key, entry)| (key.clone(), Arc::clone(&entry.actor))).collect()
    }

    /// The open actor of `key`, to try a request on its database (marked used, as a send is).
    fn lent(&self, key: &str) -> Option<Arc<Actor>> {
        let mut state = self.lock();
        let entry = state.actors.get_mut(key)?;
        entry.last_used = Instant::now();
        Some(Arc::clone(&entry.actor))
    }

    fn send(self: &Arc<Self>, key: &str, command: Command) -> Result<()> {
        let mut state = self.lock();
        if state.shut_down || state.retired.contains(key) {
            return Err(Error::Closed);
        }
        let mut command = command;
        for _attempt in 0..2 {
            if !state.actors.contains_key(key) {
                self.spawn(&mut state, key)?;
            }
            let entry = state.actors.get_mut(key).expect("actor just ensured");
            entry.last_used = Instant::now();
            match entry.actor.post(command) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Full(_)) => return Err(Error::Overloaded),
                Err(TrySendError::Disconnected(returned)) => {
                    // The actor stopped without retiring (it panicked): start a new one.
                    command = returned;
                    if let Some(entry) = state.actors.remove(key) {
                        state.closing.insert(key.to_owned(), entry.done);
                    }
                }
            }
        }
        Err(Error::Closed)
    }

    fn spawn(self: &Arc<Self>, state: &mut State, key: &str) -> Result<()> {
        let mut options = (self.opener)(key).ok_or(Error::Closed)?;
        options.stats = Some((Arc::clone(&self.stats), self.stats.database(key)));
        if state.actors.len() >= self.settings.max_open.max(1) {
            evict_least_recently_used(state);
        }
        let generation = state.next_generation;
        state.next_generation += 1;
        let done = Arc::new(DoneSignal::new());
        let previous_owner = state.closing.get(key).cloned();
        let identity = Identity {
            key: key.to_owned(),
            generation,
            registry: Arc::downgrade(self) as std::sync::Weak<dyn Owner>,
            done: Arc::clone(&done),
        };
        let actor = Actor::new(
            identity,
            previous_owner,
            options,
            self.settings.max_group,
            self.settings.queue_depth,
            self.pool.clone(),
        );
        state.actors.insert(key.to_owned(), Entry { actor, generation, last_used: Instant::now(), done });
        Ok(())
    }

    /// Closes the databases nobody used for the idle timeout and that have no work, one after
    /// another on the calling thread. Each leaves the map only just before it closes, so a
    /// request for one still waiting its turn is served by it (and keeps it open), not made to
    /// wait for the others' checkpoints.
    fn close_idle(&self) {
        let unclosed = std::mem::take(&mut *self.unclosed.lock().unwrap_or_else(|p| p.into_inner()));
        for actor in unclosed {
            actor.close_here();
        }
        let idle_enough =
            |entry: &Entry| entry.last_used.elapsed() >= self.settings.idle_timeout && !entry.actor.is_busy();
        let candidates: Vec<String> =
            self.lock().actors.iter().filter(|(_, e)| idle_enough(e)).map(|(key, _)| key.clone()).collect();
        for key in candidates {
            let actor = {
                let mut state = self.lock();
                // Used (or closed) since the survey: it stays.
                if !state.actors.get(&key).is_some_and(&idle_enough) {
                    continue;
                }
                let entry = state.actors.remove(&key).expect("entry just seen");
                // Taken out of the map under the lock: nothing more is posted to it. A request
                // for the same file meanwhile starts a successor, which waits.
                state.closing.insert(key, Arc::clone(&entry.done));
                entry.actor
            };
            actor.close_here();
        }
    }
}

impl Owner for Shared {
    /// Keeps an actor whose close could get no thread, for [`Shared::close_idle`].
    fn close_later(&self, actor: Arc<Actor>) {
        self.unclosed.lock().unwrap_or_else(|p| p.into_inner()).push(actor);
    }

    /// Called by an actor that must reopen its file (a write failed on the disk): new commands
    /// go to a successor, which waits for this actor to let go of the file first.
    fn step_aside(&self, key: &str, generation: u64) {
        let mut state = self.lock();
        if state.actors.get(key).is_some_and(|e| e.generation == generation) {
            let entry = state.actors.remove(key).expect("entry just seen");
            state.closing.insert(key.to_owned(), entry.done);
        }
    }

    /// Called as an actor ends: drops whatever the registry still holds for it.
    fn forget(&self, key: &str, generation: u64, done: &Arc<DoneSignal>) {
        let mut state = self.lock();
        if state.actors.get(key).is_some_and(|e| e.generation == generation) {
            state.actors.remove(key);
        }
        if state.closing.get(key).is_some_and(|d| Arc::ptr_eq(d, done)) {
            state.closing.remove(key);
        }
    }
}

fn evict_least_recently_used(state: &mut State) {
    let oldest = state.actors.iter().min_by_key(|(_, e)| e.last_used).map(|(k, _)| k.clone());
    if let Some(key) = oldest {
        let entry = state.actors.remove(&key).expect("entry just found");
        close_entry(state, &key, entry, Start::Now);
    }
}

/// Has an actor just taken out of the map run what is queued and close its file; a successor
/// for the same file waits for the signal returned.
fn close_entry(state: &mut State, key: &str, entry: Entry, start: Start) -> Arc<DoneSignal> {
    entry.actor.close(start);
    state.closing.insert(key.to_owned(), Arc::clone(&entry.done));
    entry.done
}

/// Tells the thread that closes idle databases that its registry is gone.
#[derive(Default)]
struct ReaperStop {
    stopped: Mutex<bool>,
    changed: Condvar,
}

impl ReaperStop {
    fn stop(&self) {
        *self.stopped.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.changed.notify_all();
    }

    /// Waits `period`; false if the registry went away meanwhile.
    fn wait(&self, period: Duration) -> bool {
        let stopped = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        let (stopped, _) =
            self.changed.wait_timeout_while(stopped, period, |stopped| !*stopped).unwrap_or_else(|p| p.into_inner());
        !*stopped
    }
}

/// Starts the thread that closes the registry's idle databases, a few times per idle timeout,
/// and captures what their histories are owed, twice per [`CAPTURE_DELAY`] (an idle
/// database has no thread of its own to notice either).
fn start_reaper(shared: &Arc<Shared>) {
    let registry = Arc::downgrade(shared);
    let stop = Arc::clone(&shared.reaper);
    let period = (shared.settings.idle_timeout / 4)
        .clamp(Duration::from_millis(10), Duration::from_secs(5))
        .min(CAPTURE_DELAY / 2);
    let started = std::thread::Builder::new().name("kura-db-idle".into()).spawn(move || {
        while stop.wait(period) {
            let Some(shared) = registry.upgrade() else { return };
            shared.close_idle();
            shared.capture_idle();
        }
    });
    if let Err(e) = started {
        // Databases then close only when evicted or at shutdown; nothing is lost.
        tracing::error!(error = %e, "cannot start the thread that closes idle databases");
    }
}
