//! The threads that run databases' actors: a database with work borrows one, and an open
//! database with none holds no thread at all.
//!
//! A thread of its own for each open database cost about 85 KiB of resident memory per idle
//! Durable Object (its stack, its signal stack, the allocator's leftovers), half of what an idle
//! object held (docs/design.md). The pool starts a thread only when every thread it has is
//! busy, so a database with work never waits behind another's long query, as it never did with
//! threads of its own; a thread idle for [`KEEP_ALIVE`] ends.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long a thread waits for work before it ends.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// Threads alive past which a job run [`Pool::run_in_turn`] waits for one to be free instead of
/// starting another.
const IN_TURN_THREADS: usize = 8;

/// Something the pool runs to its end on one of its threads.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// Threads shared by every database of a registry. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    name: String,
}

#[derive(Default)]
struct State {
    /// Threads waiting for a job, the one that began waiting last at the end: it is handed the
    /// next job (its stack and caches are the warmest), and the ones at the front, not needed,
    /// end after [`KEEP_ALIVE`].
    idle: Vec<Arc<Waiting>>,
    /// Jobs waiting for a thread to finish its job ([`Pool::run_in_turn`]).
    backlog: VecDeque<Job>,
    /// Threads alive.
    threads: usize,
}

/// A waiting thread's hand: a job is put in it, then the thread unparked. One thread, one
/// wake-up, and no lock the woken thread contends for with the others.
struct Waiting {
    job: Mutex<Option<Job>>,
    thread: Thread,
}

impl Waiting {
    fn give(&self, job: Job) {
        *self.job.lock().unwrap_or_else(|p| p.into_inner()) = Some(job);
        self.thread.unpark();
    }

    fn take(&self) -> Option<Job> {
        self.job.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// The job given to this thread, or `None` once `until` has passed without one.
    fn wait_until(&self, until: Instant) -> Option<Job> {
        loop {
            if let Some(job) = self.take() {
                return Some(job);
            }
            match until.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => std::thread::park_timeout(left),
                _ => return self.take(),
            }
        }
    }

    /// The job on its way to this thread (it was taken off the idle list to be given one).
    fn wait_for_given(&self) -> Job {
        loop {
            if let Some(job) = self.take() {
                return job;
            }
            std::thread::park();
        }
    }
}

impl Pool {
    pub(crate) fn new(name: &str) -> Self {
        Pool { inner: Arc::new(Inner { state: Mutex::default(), name: name.to_owned() }) }
    }

    /// Runs `job` on a waiting thread, or on a new one if none waits. Fails only if the system
    /// will not start a thread while every thread is busy; the job is then not run.
    pub(crate) fn run(&self, job: Job) -> std::io::Result<()> {
        self.run_within(job, usize::MAX)
    }

    /// Runs `job` as [`Pool::run`] does, except that past a few threads it waits for one to
    /// finish its job rather than start another: for work that may wait and comes in bulk (a
    /// thousand files closed at shutdown would otherwise start a thousand threads at once).
    pub(crate) fn run_in_turn(&self, job: Job) -> std::io::Result<()> {
        self.run_within(job, IN_TURN_THREADS)
    }

    /// Runs `job` on a waiting thread; if none waits, on a new one while fewer than `threads`
    /// are alive, or else after one of them finishes its job (each looks at the backlog before
    /// it waits).
    fn run_within(&self, job: Job, threads: usize) -> std::io::Result<()> {
        let mut state = self.inner.lock();
        if let Some(waiting) = state.idle.pop() {
            drop(state);
            waiting.give(job);
            return Ok(());
        }
        if state.threads >= threads {
            state.backlog.push_back(job);
            return Ok(());
        }
        state.threads += 1;
        drop(state);
        let inner = Arc::clone(&self.inner);
        let started = std::thread::Builder::new().name(self.inner.name.clone()).spawn(move || inner.serve(job));
        if started.is_err() {
            self.inner.lock().threads -= 1;
        }
        started.map(drop)
    }

    /// Threads alive now.
    pub(crate) fn threads(&self) -> usize {
        self.inner.lock().threads
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A thread's life: `first`, then whatever jobs come until none has come for [`KEEP_ALIVE`].
    fn serve(&self, first: Job) {
        let me = Arc::new(Waiting { job: Mutex::new(None), thread: std::thread::current() });
        let mut job = first;
        loop {
            run_guarded(job);
            let mut state = self.lock();
            if let Some(next) = state.backlog.pop_front() {
                job = next;
                continue;
            }
            state.idle.push(Arc::clone(&me));
            drop(state);
            job = match me.wait_until(Instant::now() + KEEP_ALIVE) {
                Some(next) => next,
                None => {
                    let mut state = self.lock();
                    match state.idle.iter().position(|w| Arc::ptr_eq(w, &me)) {
                        Some(at) => {
                            state.idle.remove(at);
                            state.threads -= 1;
                            return;
                        }
                        // Taken off the list just now: its job is on its way.
                        None => {
                            drop(state);
                            me.wait_for_given()
                        }
                    }
                }
            };
        }
    }
}

/// Runs a job so that its panic ends the job, not the thread (jobs catch their own; this is
/// the last guard).
fn run_guarded(job: Job) {
    if std::panic::catch_unwind(AssertUnwindSafe(job)).is_err() {
        tracing::error!("a database job panicked");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    impl Pool {
        /// Waits until every thread waits for work.
        fn settle(&self) {
            while {
                let state = self.inner.lock();
                state.idle.len() < state.threads
            } {
                std::thread::yield_now();
            }
        }
    }

    #[test]
    fn threads_are_reused_and_a_busy_pool_grows() {
        let pool = Pool::new("test-pool");
        let (done, finished) = mpsc::channel();
        for i in 0..20 {
            let done = done.clone();
            pool.run(Box::new(move || done.send(i).unwrap())).unwrap();
            assert_eq!(finished.recv().unwrap(), i);
            pool.settle();
        }
        // Jobs one after another: each found the thread the last one left waiting.
        assert_eq!(pool.threads(), 1);
        // Three jobs that wait for each other run at once: the pool starts threads for them.
        let all_running = Arc::new(std::sync::Barrier::new(4));
        for _ in 0..3 {
            let all_running = Arc::clone(&all_running);
            pool.run(Box::new(move || {
                all_running.wait();
            }))
            .unwrap();
        }
        all_running.wait();
        assert_eq!(pool.threads(), 3);
        // A panic ends its job, not the pool.
        let before_panic = done.clone();
        pool.run(Box::new(move || {
            before_panic.send(99).unwrap();
            panic!("a job panics");
        }))
        .unwrap();
        assert_eq!(finished.recv().unwrap(), 99);
        pool.run(Box::new(move || done.send(100).unwrap())).unwrap();
        assert_eq!(finished.recv().unwrap(), 100);
    }

    #[test]
    fn jobs_in_turn_wait_for_a_free_thread_past_a_few() {
        let pool = Pool::new("test-pool");
        let release = Arc::new(std::sync::Barrier::new(IN_TURN_THREADS + 1));
        let (done, finished) = mpsc::channel();
        // Twice as many jobs as the threads they may start, the first ones holding their thread.
        for i in 0..2 * IN_TURN_THREADS {
            let (release, done) = (Arc::clone(&release), done.clone());
            pool.run_in_turn(Box::new(move || {
                if i < IN_TURN_THREADS {
                    release.wait();
                }
                done.send(i).unwrap();
            }))
            .unwrap();
        }
        assert_eq!(pool.threads(), IN_TURN_THREADS);
        assert!(finished.try_recv().is_err(), "the jobs in turn wait for a thread");
        release.wait();
        let mut ran: Vec<usize> = (0..2 * IN_TURN_THREADS).map(|_| finished.recv().unwrap()).collect();
        ran.sort_unstable();
        assert_eq!(ran, (0..2 * IN_TURN_THREADS).collect::<Vec<_>>());
        assert_eq!(pool.threads(), IN_TURN_THREADS, "no thread was started for the jobs that waited");
        // Every thread is free again, waiting for work.
        pool.settle();
        assert_eq!(pool.inner.lock().idle.len(), IN_TURN_THREADS);
    }
}
