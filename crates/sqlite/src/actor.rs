//! The actor that owns one database file: it takes commands from a bounded queue and runs the
//! requests it finds queued together in one transaction (group commit), one fsync for all, on a
//! thread it borrows from the pool while it has work.
//!
//! Each request runs in a savepoint of its own, so a failing request is undone alone; the
//! others are answered only after the shared COMMIT is on disk. If the COMMIT fails, or SQLite
//! rolls the whole transaction back because of one request, the others, not yet acknowledged,
//! are run again one by one, each in its own transaction.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::TrySendError;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError, Weak};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::database::{Database, DatabaseOptions, Grouped, Inline};
use crate::error::{Error, Result};
use crate::history::Bookmark;
use crate::pool::Pool;
use crate::request::{Request, StatementResult};

/// A request's answer: its results, and the database's bookmark once they were durable (for
/// D1's sessions; `None` without a history).
#[derive(Debug)]
pub struct Executed {
    /// One result per statement, as the request's mode says.
    pub results: Vec<StatementResult>,
    /// The bookmark of a state that includes the request's writes.
    pub bookmark: Option<Bookmark>,
}

/// Work for an actor.
pub(crate) enum Command {
    /// Run a request; answer when it is durable (or failed).
    Execute { request: Request, reply: oneshot::Sender<Result<Executed>> },
    /// Run a closure with the database to itself, outside any transaction.
    Exclusive(Box<dyn FnOnce(&mut Database) + Send>),
    /// Run kura's own writes inside the group's transaction; answer once they are durable.
    Work(Box<dyn GroupedWork>),
}

/// When an actor with work gets its thread.
#[derive(Clone, Copy)]
pub(crate) enum Start {
    /// At once: a thread that waits, or a new one.
    Now,
    /// When the pool has one free, past a few threads ([`Pool::run_in_turn`]).
    InTurn,
}

/// Writes of kura's own (R2's metadata, say) committed with a group: run in a savepoint of the
/// group's transaction, then told whether the COMMIT made them durable. `run` may be called
/// again (alone) if the group has to be replayed.
pub(crate) trait GroupedWork: Send {
    /// Does the work on the connection, authorizer off; false if it failed (it is undone).
    fn run(&mut self, conn: &rusqlite::Connection) -> bool;
    /// The outcome: `Ok` once what `run` last did is durable (or it failed and was undone),
    /// `Err` if the commit failed.
    fn finish(self: Box<Self>, committed: Result<()>);
}

/// The actor's open database, behind a lock the actor holds while it works. Between its
/// commands, a caller that finds the lock free runs its request on its own thread instead of
/// waking the actor and being woken back — two thread hand-offs that cost more than a point
/// SELECT, and a third of a one-client durable INSERT: a read ([`Lender::try_read`]) within a
/// budget, a write ([`Lender::try_write`]) alone in its transaction, committed as the actor
/// would. Whatever finds the database busy goes through the queue, where group commit serves it.
pub(crate) struct Lender {
    db: Mutex<Option<Database>>,
    /// Writers (the actor, or a caller writing) holding or waiting for the lock: a reader that
    /// finds it taken waits only when another reader holds it (microseconds), never behind a
    /// commit.
    writers: AtomicUsize,
}

/// A writer's claim on the lock, counted in [`Lender::writers`] while it lives.
struct WriterLock<'a> {
    guard: MutexGuard<'a, Option<Database>>,
    writers: &'a AtomicUsize,
}

impl Drop for WriterLock<'_> {
    fn drop(&mut self) {
        self.writers.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Lender {
    fn new() -> Self {
        Lender { db: Mutex::new(None), writers: AtomicUsize::new(0) }
    }

    /// The lock, for the actor (waiting for it).
    fn lock_for_actor(&self) -> WriterLock<'_> {
        self.writers.fetch_add(1, Ordering::SeqCst);
        WriterLock { guard: self.lock(), writers: &self.writers }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Database>> {
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether no writer holds or wants the lock.
    pub(crate) fn may_write(&self) -> bool {
        self.writers.load(Ordering::SeqCst) == 0
    }

    /// Runs `request` here if the database is open, idle and the request only reads.
    pub(crate) fn try_read(&self, request: &Request, budget: Duration) -> Tried {
        let mut guard = match self.db.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock) if !self.may_write() => return Tried::NotRun,
            Err(TryLockError::WouldBlock) => self.lock(),
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
        };
        let Some(db) = guard.as_mut() else { return Tried::NotRun };
        match beside_the_actor(db, |db| db.execute_read(request, budget)) {
            Err(reopen) => reopen,
            Ok(Inline::Done(results)) => {
                Tried::Answered(Ok(Executed { results, bookmark: db.bookmark().ok() }), Afterwards::Nothing)
            }
            Ok(Inline::Failed(e)) => Tried::Answered(Err(e), Afterwards::Nothing),
            Ok(Inline::Declined) => Tried::NotRun,
            Ok(Inline::TooLong) => Tried::TooLong,
        }
    }

    /// Runs `request` here, alone in a transaction it commits, if the database is open and
    /// idle, its commits need no shipping and its WAL is not overdue a checkpoint. Blocks on
    /// the commit's fsync. The commit is answered before the history captures it: the caller
    /// has [`Lender::capture_due`] run once the answer is out if the capture is due (see
    /// [`Afterwards::Capture`]), and a checkpoint that commit
    /// made due is the actor's (it may take a while, on the actor's thread).
    pub(crate) fn try_write(&self, request: &Request) -> Tried {
        let Some(mut held) = self.try_lock_as_writer() else { return Tried::NotRun };
        let Some(db) = held.guard.as_mut() else { return Tried::NotRun };
        if db.is_poisoned() || db.in_transaction() || db.options().shipper.is_some() || db.checkpoint_overdue() {
            return Tried::NotRun;
        }
        let outcome = match beside_the_actor(db, |db| db.execute_alone_answered_first(request)) {
            Ok(outcome) => outcome,
            Err(reopen) => return reopen,
        };
        if outcome.is_ok()
            && let Some((stats, _)) = &db.options().stats
        {
            stats.group_sizes.observe(1.0);
        }
        let bookmark = if db.is_poisoned() { None } else { db.bookmark().ok() };
        let afterwards = match () {
            () if db.is_poisoned() => Afterwards::Reopen,
            () if db.capture_due() => Afterwards::Capture,
            () => Afterwards::Nothing,
        };
        Tried::Answered(outcome.map(|results| Executed { results, bookmark }), afterwards)
    }

    /// The lock, taken now as a writer (readers that find it taken go to the queue rather
    /// than wait), or `None` if it is held.
    fn try_lock_as_writer(&self) -> Option<WriterLock<'_>> {
        self.writers.fetch_add(1, Ordering::SeqCst);
        match self.db.try_lock() {
            Ok(guard) => Some(WriterLock { guard, writers: &self.writers }),
            Err(TryLockError::Poisoned(p)) => Some(WriterLock { guard: p.into_inner(), writers: &self.writers }),
            Err(TryLockError::WouldBlock) => {
                self.writers.fetch_sub(1, Ordering::SeqCst);
                None
            }
        }
    }

    /// Captures into the history the commits answered before their capture if that is due
    /// ([`Database::capture_due`]), here if the database is idle: as a writer, since a capture
    /// writes the log and may take as long as the commits' pages take to copy. A closed
    /// database captured them as it closed.
    pub(crate) fn capture_due(&self) -> Captured {
        self.capture_if(Database::capture_due)
    }

    /// Captures as [`Lender::capture_due`] does, whether due or not: every commit owed.
    pub(crate) fn capture_owed(&self) -> Captured {
        self.capture_if(Database::owes_capture)
    }

    fn capture_if(&self, wanted: impl FnOnce(&Database) -> bool) -> Captured {
        let Some(mut held) = self.try_lock_as_writer() else { return Captured::Busy };
        let Some(db) = held.guard.as_mut() else { return Captured::Done };
        if !wanted(db) {
            return Captured::Done;
        }
        match beside_the_actor(db, |db| db.capture_owed()) {
            Ok(Ok(())) if db.checkpoint_due() => Captured::CheckpointDue,
            Ok(Ok(())) => Captured::Done,
            Ok(Err(_)) | Err(_) => Captured::Reopen,
        }
    }
}

/// What [`Lender::capture_due`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Captured {
    /// The history holds every commit (or the database is closed).
    Done,
    /// The database was busy: the actor must see to it.
    Busy,
    /// Captured, and the WAL has grown to its checkpoint: the actor must see to that.
    CheckpointDue,
    /// The capture failed: the file must be reopened, which captures from the WAL.
    Reopen,
}

/// What a database needs once a request tried on its caller's thread is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Afterwards {
    Nothing,
    /// The file must be reopened (a commit failed on the disk, or the request panicked): the
    /// actor is told through its queue.
    Reopen,
    /// The commits owed to the history are due their capture ([`Lender::capture_due`]).
    Capture,
}

/// What became of a request tried on its caller's thread.
pub(crate) enum Tried {
    /// It ran; with its answer, what the database needs once the answer is out.
    Answered(Result<Executed>, Afterwards),
    /// It did not run (the database was busy or closed, the request writes or may change the
    /// connection's state): the caller may try it otherwise.
    NotRun,
    /// It ran past a read's budget and was interrupted: only the actor may run it.
    TooLong,
}

/// Runs `f` on a caller's thread as the actor would run it inside its own guard: a panic
/// leaves the connection in no known state (a transaction open, flags set), so it is marked
/// for reopening and nothing more runs on it.
fn beside_the_actor<T>(db: &mut Database, f: impl FnOnce(&mut Database) -> T) -> std::result::Result<T, Tried> {
    match std::panic::catch_unwind(AssertUnwindSafe(|| f(&mut *db))) {
        Ok(outcome) => Ok(outcome),
        Err(_) => {
            tracing::error!(path = %db.path().display(), "a request panicked beside the actor; reopening the database");
            db.mark_for_reopening();
            Err(Tried::Answered(Err(Error::Reopening), Afterwards::Reopen))
        }
    }
}

/// Who the actor is, as the registry knows it.
pub(crate) struct Identity {
    pub key: String,
    pub generation: u64,
    pub registry: Weak<dyn Owner>,
    pub done: Arc<DoneSignal>,
}

/// What holds the actors (the registry), as an actor tells it about its own end. Rare calls:
/// once per actor at most.
pub(crate) trait Owner: Send + Sync {
    /// An actor told to close that could get no thread: the owner's own thread closes it.
    fn close_later(&self, actor: Arc<Actor>);
    /// An actor that must reopen its file steps aside: new commands go to a successor.
    fn step_aside(&self, key: &str, generation: u64);
    /// An actor let go of its file: a successor may open it.
    fn forget(&self, key: &str, generation: u64, done: &Arc<DoneSignal>);
}

/// Set once when an actor has closed its file.
pub(crate) struct DoneSignal {
    done: Mutex<bool>,
    changed: Condvar,
}

impl DoneSignal {
    pub(crate) fn new() -> Self {
        DoneSignal { done: Mutex::new(false), changed: Condvar::new() }
    }

    pub(crate) fn set(&self) {
        *self.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.changed.notify_all();
    }

    pub(crate) fn wait(&self) {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        while !*done {
            done = self.changed.wait(done).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// What waits in the open group transaction for its COMMIT.
enum Pending {
    /// A request that succeeded.
    Request { request: Request, reply: oneshot::Sender<Result<Executed>>, results: Vec<StatementResult> },
    /// Work that succeeded.
    Work(Box<dyn GroupedWork>),
}

impl Pending {
    fn footprint(&self) -> usize {
        match self {
            Pending::Request { results, .. } => footprint(results),
            Pending::Work(_) => 0,
        }
    }
}

/// Results a group may hold in memory before it commits early.
const MAX_GROUP_RESULT_BYTES: usize = 64 * 1000 * 1000;

fn footprint(results: &[StatementResult]) -> usize {
    results.iter().flat_map(|r| &r.rows).flatten().map(|v| v.footprint()).sum()
}

/// One database's owner: its queue of commands, and its open file, lent to callers between
/// commands. It holds no thread: while it has commands it runs on one of the pool's, and it
/// gives the thread back when its queue is empty (see [`crate::pool`]).
pub(crate) struct Actor {
    identity: Identity,
    /// Most commands taken together (one group commit).
    max_group: usize,
    /// Most commands that may wait in the queue.
    depth: usize,
    lender: Lender,
    mailbox: Mutex<Mailbox>,
    pool: Pool,
}

struct Mailbox {
    commands: VecDeque<Command>,
    /// On a pool thread, or about to be: whoever set it runs the queue until it is empty.
    scheduled: bool,
    /// Told to close its file once its queue is empty (idle, evicted, closed, shut down).
    closing: bool,
    /// It takes no more commands: its file is closed, or could not be opened.
    stopped: bool,
    /// How to open the file, until the first turn does.
    opening: Option<Opening>,
}

struct Opening {
    /// The actor that had the file before: it must have let go first.
    previous_owner: Option<Arc<DoneSignal>>,
    options: DatabaseOptions,
}

impl Actor {
    pub(crate) fn new(
        identity: Identity,
        previous_owner: Option<Arc<DoneSignal>>,
        options: DatabaseOptions,
        max_group: usize,
        depth: usize,
        pool: Pool,
    ) -> Arc<Self> {
        Arc::new(Actor {
            identity,
            max_group: max_group.max(1),
            depth: depth.max(1),
            lender: Lender::new(),
            mailbox: Mutex::new(Mailbox {
                commands: VecDeque::new(),
                scheduled: false,
                closing: false,
                stopped: false,
                opening: Some(Opening { previous_owner, options }),
            }),
            pool,
        })
    }

    /// The open database, for requests run on their callers' threads.
    pub(crate) fn lender(&self) -> &Lender {
        &self.lender
    }

    fn mailbox(&self) -> MutexGuard<'_, Mailbox> {
        self.mailbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `command`, unless `depth` commands wait already (`Full`) or the actor has
    /// stopped (`Disconnected`); either way the command comes back.
    pub(crate) fn post(self: &Arc<Self>, command: Command) -> std::result::Result<(), TrySendError<Command>> {
        let mut mailbox = self.mailbox();
        if mailbox.stopped {
            return Err(TrySendError::Disconnected(command));
        }
        if mailbox.commands.len() >= self.depth {
            return Err(TrySendError::Full(command));
        }
        mailbox.commands.push_back(command);
        self.schedule(mailbox, Start::Now);
        Ok(())
    }

    /// Has the actor close its file once the commands already queued have run. The registry
    /// calls it after taking the actor out of its map, so nothing more is posted.
    pub(crate) fn close(self: &Arc<Self>, start: Start) {
        let mut mailbox = self.mailbox();
        mailbox.closing = true;
        if !mailbox.stopped {
            self.schedule(mailbox, start);
        }
    }

    /// Closes the file on this thread, as [`Actor::close`] has a pool thread do, unless the
    /// actor is on a thread already (which then closes it). For the registry's closing of idle
    /// databases: a thousand closed at once would otherwise start as many threads, each for
    /// one checkpoint.
    pub(crate) fn close_here(self: &Arc<Self>) {
        let mut mailbox = self.mailbox();
        mailbox.closing = true;
        if mailbox.stopped || mailbox.scheduled {
            return;
        }
        mailbox.scheduled = true;
        drop(mailbox);
        Arc::clone(self).turn();
    }

    /// Whether it is on a thread (or about to be).
    pub(crate) fn is_busy(&self) -> bool {
        self.mailbox().scheduled
    }

    fn schedule(self: &Arc<Self>, mut mailbox: MutexGuard<'_, Mailbox>, start: Start) {
        if mailbox.scheduled {
            return;
        }
        mailbox.scheduled = true;
        drop(mailbox);
        let actor = Arc::clone(self);
        let turn = Box::new(move || actor.turn());
        let started = match start {
            Start::Now => self.pool.run(turn),
            Start::InTurn => self.pool.run_in_turn(turn),
        };
        if let Err(source) = started {
            tracing::error!(key = %self.identity.key, error = %source, "cannot start a database thread");
            let (queued, closing) = {
                let mut mailbox = self.mailbox();
                mailbox.scheduled = false;
                (std::mem::take(&mut mailbox.commands), mailbox.closing)
            };
            let error = Error::Io { context: "cannot start a database thread".into(), source };
            refuse_all(queued, &error);
            if closing && let Some(shared) = self.identity.registry.upgrade() {
                // Its file must still close (a successor waits for it): the registry's own
                // thread closes it at its next round.
                shared.close_later(Arc::clone(self));
            }
        }
    }

    /// A pool thread's work for the actor: open the file the first time, then run the queue
    /// until it is empty, then close the file if the actor was told to.
    fn turn(self: Arc<Self>) {
        if std::panic::catch_unwind(AssertUnwindSafe(|| self.serve())).is_err() {
            // Nothing more runs on the connection, not even the checkpoint of a clean close.
            tracing::error!(key = %self.identity.key, "database actor panicked; closing the database");
            self.stop(Ending::Abandoned);
        }
    }

    fn serve(&self) {
        let opening = self.mailbox().opening.take();
        if let Some(Opening { previous_owner, options }) = opening {
            if let Some(previous) = previous_owner {
                previous.wait();
            }
            match Database::open(&options) {
                Ok(db) => *self.lender.lock() = Some(db),
                Err(e) => {
                    tracing::warn!(key = %self.identity.key, error = %e, "cannot open database");
                    return self.stop(Ending::Refusing(e));
                }
            }
        }
        loop {
            let commands: Vec<Command> = {
                let mut mailbox = self.mailbox();
                if mailbox.commands.is_empty() {
                    if mailbox.closing {
                        drop(mailbox);
                        return self.stop(Ending::Clean);
                    }
                    mailbox.scheduled = false;
                    return;
                }
                let taken = mailbox.commands.len().min(self.max_group);
                mailbox.commands.drain(..taken).collect()
            };
            let mut held = self.lender.lock_for_actor();
            let Some(db) = held.guard.as_mut() else {
                drop(held);
                return self.stop(Ending::Abandoned);
            };
            let mut committer = Committer { db };
            let processed = std::panic::catch_unwind(AssertUnwindSafe(|| {
                committer.process(commands);
                // The round's answers are out; its commits' capture may follow (not on a
                // connection marked for reopening, which is closed below instead).
                committer.db.settle_if_due();
            }));
            if processed.is_err() {
                drop(held);
                tracing::error!(key = %self.identity.key, "database actor panicked; closing the database");
                return self.stop(Ending::Abandoned);
            }
            if committer.db.is_poisoned() {
                drop(held);
                // After an I/O error at commit the page cache may not match the disk: close, and
                // let the next request reopen the file (SQLite recovers from the WAL on open). No
                // new command reaches this connection; the queued ones did not run and are told so
                // (not left to find their answer dropped).
                tracing::error!(key = %self.identity.key, "a commit failed with an I/O error; reopening the database");
                if let Some(shared) = self.identity.registry.upgrade() {
                    shared.step_aside(&self.identity.key, self.identity.generation);
                }
                return self.stop(Ending::Refusing(Error::Reopening));
            }
        }
    }

    /// Ends the actor: it takes no more commands, answers the queued ones, closes its file and
    /// tells the registry.
    fn stop(&self, ending: Ending) {
        let queued = {
            let mut mailbox = self.mailbox();
            mailbox.stopped = true;
            mailbox.scheduled = false;
            mailbox.opening = None;
            std::mem::take(&mut mailbox.commands)
        };
        match &ending {
            Ending::Refusing(error) => refuse_all(queued, error),
            // Dropped unanswered: their callers learn the database closed.
            Ending::Clean | Ending::Abandoned => drop(queued),
        }
        // From here no caller borrows the connection: it is closed on this thread.
        let db = self.lender.lock().take();
        if let (false, Some(mut db)) = (matches!(ending, Ending::Abandoned), db) {
            db.rollback();
            if !db.is_poisoned() {
                db.close_cleanly();
            }
        }
        // Only now, with the file let go, may a successor open it.
        if let Some(shared) = self.identity.registry.upgrade() {
            shared.forget(&self.identity.key, self.identity.generation, &self.identity.done);
        }
        self.identity.done.set();
    }
}

/// How an actor ends.
enum Ending {
    /// Idle or told to close: the file is checkpointed and closed.
    Clean,
    /// The file could not be opened, or must be reopened: the queued commands get this error.
    Refusing(Error),
    /// A panic left the connection in no known state: it is closed without a checkpoint.
    Abandoned,
}

/// Answers every queued command with the error that stopped the actor.
fn refuse_all(queued: VecDeque<Command>, error: &Error) {
    for command in queued {
        match command {
            Command::Execute { reply, .. } => {
                let _ = reply.send(Err(copy_error(error)));
            }
            other => refuse(other),
        }
    }
}

/// Answers a command without running it: the database is closing.
fn refuse(command: Command) {
    match command {
        Command::Execute { reply, .. } => {
            let _ = reply.send(Err(Error::Reopening));
        }
        Command::Work(work) => work.finish(Err(Error::Reopening)),
        Command::Exclusive(_) => {}
    }
}

/// The same error again, for answering several requests with it.
fn copy_error(error: &Error) -> Error {
    match error {
        Error::Open { path, message, disk_full } => {
            Error::Open { path: path.clone(), message: message.clone(), disk_full: *disk_full }
        }
        Error::Sql { message, code, extended } => {
            Error::Sql { message: message.clone(), code: *code, extended: *extended }
        }
        // A failed commit's requests learn whether it may still take effect.
        Error::Superseded { message } => Error::Superseded { message: message.clone() },
        Error::Io { context, source } => {
            Error::Io { context: context.clone(), source: std::io::Error::new(source.kind(), source.to_string()) }
        }
        Error::Reopening => Error::Reopening,
        _ => Error::Closed,
    }
}

/// Runs an actor's commands on its database, grouping requests into shared commits.
struct Committer<'a> {
    db: &'a mut Database,
}

impl Committer<'_> {
    fn process(&mut self, commands: Vec<Command>) {
        let mut group = Vec::new();
        for command in commands {
            if self.db.is_poisoned() {
                // A failed commit, capture or restore: the rest are answered, not run.
                self.replay(&mut group);
                refuse(command);
                continue;
            }
            match command {
                Command::Execute { request, reply } => {
                    if reply.is_closed() {
                        continue; // the caller gave up before anything ran; nothing to answer
                    }
                    if request.needs_own_transaction() {
                        self.flush(&mut group);
                        let outcome = self.db.execute_alone_answered_first(&request).map(|r| self.executed(r));
                        let _ = reply.send(outcome);
                    } else {
                        self.run_grouped(request, reply, &mut group);
                    }
                }
                Command::Exclusive(f) => {
                    self.flush(&mut group);
                    f(self.db);
                }
                Command::Work(work) => self.run_grouped_work(work, &mut group),
            }
        }
        self.flush(&mut group);
    }

    fn run_grouped_work(&mut self, mut work: Box<dyn GroupedWork>, group: &mut Vec<Pending>) {
        if !self.db.in_transaction()
            && let Err(e) = self.db.begin()
        {
            work.finish(Err(e));
            return;
        }
        match self.db.work_in_savepoint(|conn| work.run(conn)) {
            Ok(true) => group.push(Pending::Work(work)),
            Ok(false) => work.finish(Ok(())),
            Err(()) => {
                group.push(Pending::Work(work));
                self.replay(group);
            }
        }
    }

    /// Runs work in a transaction of its own and commits it (when its group could not).
    fn work_alone(&mut self, mut work: Box<dyn GroupedWork>) {
        if self.db.is_poisoned() {
            work.finish(Err(Error::Reopening));
            return;
        }
        if let Err(e) = self.db.begin() {
            work.finish(Err(e));
            return;
        }
        if self.db.with_internal(|conn| work.run(conn)) {
            let committed = self.db.commit_answered_first();
            work.finish(committed);
        } else {
            self.db.rollback();
            work.finish(Ok(()));
        }
    }

    fn run_grouped(&mut self, request: Request, reply: oneshot::Sender<Result<Executed>>, group: &mut Vec<Pending>) {
        if !self.db.in_transaction()
            && let Err(e) = self.db.begin()
        {
            let _ = reply.send(Err(e));
            return;
        }
        match self.db.execute_in_savepoint(&request) {
            Grouped::Done(results) => {
                group.push(Pending::Request { request, reply, results });
                if group.iter().map(Pending::footprint).sum::<usize>() > MAX_GROUP_RESULT_BYTES {
                    self.flush(group);
                }
            }
            Grouped::Failed(e) => {
                let _ = reply.send(Err(e));
            }
            Grouped::RunAlone => {
                self.flush(group);
                let outcome = self.db.execute_alone_answered_first(&request).map(|r| self.executed(r));
                let _ = reply.send(outcome);
            }
            Grouped::Lost(Some(e)) => {
                // The request failed and took the transaction with it (ON CONFLICT ROLLBACK, a
                // full disk…): the group's earlier requests, never acknowledged, run again.
                let _ = reply.send(Err(e));
                self.replay(group);
            }
            Grouped::Lost(None) => {
                group.push(Pending::Request { request, reply, results: Vec::new() });
                self.replay(group);
            }
        }
    }

    /// Commits the group and answers its requests.
    fn flush(&mut self, group: &mut Vec<Pending>) {
        if group.is_empty() {
            self.db.rollback();
            return;
        }
        if !self.db.in_transaction() {
            self.replay(group);
            return;
        }
        match self.db.commit_answered_first() {
            Ok(()) => {
                if let Some((stats, _)) = &self.db.options().stats {
                    stats.group_sizes.observe(group.len() as f64);
                }
                let bookmark = self.current_bookmark();
                for pending in group.drain(..) {
                    match pending {
                        Pending::Request { reply, results, .. } => {
                            let _ = reply.send(Ok(Executed { results, bookmark }));
                        }
                        Pending::Work(work) => work.finish(Ok(())),
                    }
                }
            }
            Err(e) if group.len() == 1 || self.db.is_poisoned() => {
                // Alone, a request would fail the same way; after an I/O error, nothing more
                // runs on this connection.
                for pending in group.drain(..) {
                    match pending {
                        Pending::Request { reply, .. } => {
                            let _ = reply.send(Err(copy_error(&e)));
                        }
                        Pending::Work(work) => work.finish(Err(copy_error(&e))),
                    }
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, requests = group.len(), "group commit failed; running requests one by one");
                self.replay(group);
            }
        }
    }

    /// A request's results with the bookmark as it stands (call after its commit).
    fn executed(&self, results: Vec<StatementResult>) -> Executed {
        Executed { results, bookmark: self.current_bookmark() }
    }

    /// The bookmark of the state just committed; none if the history could not take the
    /// commit (it gets its position when the file is reopened).
    fn current_bookmark(&self) -> Option<Bookmark> {
        if self.db.is_poisoned() { None } else { self.db.bookmark().ok() }
    }

    /// Runs each request again in a transaction of its own.
    fn replay(&mut self, group: &mut Vec<Pending>) {
        self.db.rollback();
        for pending in group.drain(..) {
            match pending {
                Pending::Request { request, reply, .. } => {
                    let outcome = if self.db.is_poisoned() {
                        Err(Error::Reopening)
                    } else {
                        self.db.execute_alone_answered_first(&request).map(|r| self.executed(r))
                    };
                    let _ = reply.send(outcome);
                }
                Pending::Work(work) => self.work_alone(work),
            }
        }
    }
}
