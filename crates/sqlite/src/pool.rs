//! The threads that run databases' actors: a database with work borrows one, and an open
//! database with none holds no thread at all.
//!
//! A thread of its own for each open database cost about 85 KiB of resident memory per idle
//! Durable Object (its stack, its signal stack, the allocator's leftovers), half of what an idle
//! object held (docs/performance.md, "An idle Durable Object's memory"). The pool starts a thread only when every thread it has is
//! busy, so a database with work never waits behind another's long query, as it never did with
//! threads of its own; a thread idle for [`KEEP_ALIVE`] ends.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Jobs waiting for a thread, each numbered (so one whose thread could not start can be
    /// taken back). A thread finishing its job takes the next before it waits, so a job often
    /// runs before the thread woken for it is awake.
    jobs: VecDeque<(u64, Job)>,
    /// Jobs run in turn ([`Pool::run_in_turn`]), numbered alike, taken after `jobs`.
    backlog: VecDeque<(u64, Job)>,
    numbered: u64,
    /// Threads waiting for work, the one that began waiting last at the end: it is woken next
    /// (its stack and caches are the warmest), and the ones at the front, not needed, end after
    /// [`KEEP_ALIVE`].
    idle: Vec<Arc<Waiting>>,
    /// Threads alive.
    threads: usize,
}

/// A waiting thread: woken on its own (one unpark), so no thread contends with the others for
/// a shared condition variable's lock.
struct Waiting {
    /// Set, under the pool's lock, when the thread is taken off the idle list to be woken.
    woken: AtomicBool,
    thread: Thread,
}

impl Pool {
    pub(crate) fn new(name: &str) -> Self {
        Pool { inner: Arc::new(Inner { state: Mutex::default(), name: name.to_owned() }) }
    }

    /// Runs `job` on a waiting thread, or on a new one if none waits. Fails only if the system
    /// will not start a thread while every thread is busy; the job is then not run.
    pub(crate) fn run(&self, job: Job) -> std::io::Result<()> {
        let mut state = self.inner.lock();
        let number = state.number();
        state.jobs.push_back((number, job));
        if self.inner.wake_one(state) {
            return Ok(());
        }
        self.start_for(number, false)
    }

    /// Runs `job` as [`Pool::run`] does, except that past a few threads it waits for one to
    /// finish its job rather than start another: for work that may wait and comes in bulk (a
    /// thousand files closed at shutdown would otherwise start a thousand threads at once).
    /// Fails only if no thread is alive and none will start; the job is then not run.
    pub(crate) fn run_in_turn(&self, job: Job) -> std::io::Result<()> {
        let mut state = self.inner.lock();
        let number = state.number();
        state.backlog.push_back((number, job));
        let busy = state.threads;
        if self.inner.wake_one(state) || busy >= IN_TURN_THREADS {
            // Past the few threads, a busy one takes it when its job ends.
            return Ok(());
        }
        self.start_for(number, true)
    }

    /// Starts a thread for the job `number`, just queued. If none starts, the job is taken back
    /// (and the start's error returned) unless a thread already took it, or `may_wait` and a
    /// thread alive will take it when its job ends.
    fn start_for(&self, number: u64, may_wait: bool) -> std::io::Result<()> {
        let started = self.start();
        if started.is_err() {
            let mut state = self.inner.lock();
            if !(may_wait && state.threads > 0) && state.take_back(number) {
                return started;
            }
        }
        Ok(())
    }

    /// Starts a thread, counted from now.
    fn start(&self) -> std::io::Result<()> {
        self.inner.lock().threads += 1;
        let inner = Arc::clone(&self.inner);
        let started = std::thread::Builder::new().name(self.inner.name.clone()).spawn(move || inner.serve());
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

impl State {
    fn number(&mut self) -> u64 {
        self.numbered += 1;
        self.numbered
    }

    /// Takes the job `number` out of the queues; false if a thread took it already.
    fn take_back(&mut self, number: u64) -> bool {
        for queue in [&mut self.jobs, &mut self.backlog] {
            if let Some(at) = queue.iter().position(|(n, _)| *n == number) {
                queue.remove(at);
                return true;
            }
        }
        false
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the thread that began waiting last, if one waits (the lock released first).
    fn wake_one(&self, mut state: MutexGuard<'_, State>) -> bool {
        let Some(waiting) = state.idle.pop() else { return false };
        waiting.woken.store(true, Ordering::Release);
        drop(state);
        waiting.thread.unpark();
        true
    }

    /// A thread's life: whatever jobs there are, then waiting for more, until none has come for
    /// [`KEEP_ALIVE`].
    fn serve(&self) {
        let me = Arc::new(Waiting { woken: AtomicBool::new(false), thread: std::thread::current() });
        loop {
            let mut state = self.lock();
            if let Some((_, job)) = state.jobs.pop_front().or_else(|| state.backlog.pop_front()) {
                drop(state);
                run_guarded(job);
                continue;
            }
            me.woken.store(false, Ordering::Relaxed);
            state.idle.push(Arc::clone(&me));
            drop(state);
            let until = Instant::now() + KEEP_ALIVE;
            while !me.woken.load(Ordering::Acquire) {
                match until.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => std::thread::park_timeout(left),
                    _ => {
                        let mut state = self.lock();
                        // Not woken by now (the flag is set under this lock): it ends.
                        if !me.woken.load(Ordering::Acquire) {
                            state.idle.retain(|w| !Arc::ptr_eq(w, &me));
                            state.threads -= 1;
                            return;
                        }
                    }
                }
            }
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
        // Every thread is free again, waiting for work; jobs in turn wake them.
        pool.settle();
        assert_eq!(pool.inner.lock().idle.len(), IN_TURN_THREADS);
        for i in 0..2 * IN_TURN_THREADS {
            let done = done.clone();
            pool.run_in_turn(Box::new(move || done.send(i).unwrap())).unwrap();
        }
        let waited = Duration::from_secs(10);
        let mut ran: Vec<usize> =
            (0..2 * IN_TURN_THREADS).map(|_| finished.recv_timeout(waited).expect("every job runs")).collect();
        ran.sort_unstable();
        assert_eq!(ran, (0..2 * IN_TURN_THREADS).collect::<Vec<_>>());
        assert_eq!(pool.threads(), IN_TURN_THREADS);
    }
}
