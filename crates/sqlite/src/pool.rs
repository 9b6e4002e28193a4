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
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How long a thread waits for work before it ends.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// Something the pool runs to its end on one of its threads.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// Threads shared by every database of a registry. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    work: Condvar,
    name: String,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// Threads waiting for a job.
    idle: usize,
    /// Waiting threads already woken for a job, not yet awake: each takes one job or finds it
    /// taken by a thread that finished first.
    woken: usize,
    /// Threads alive.
    threads: usize,
}

impl Pool {
    pub(crate) fn new(name: &str) -> Self {
        Pool { inner: Arc::new(Inner { state: Mutex::default(), work: Condvar::new(), name: name.to_owned() }) }
    }

    /// Runs `job` on a waiting thread, or on a new one if none waits. Fails only if the system
    /// will not start a thread while every thread is busy; the job is then not run.
    pub(crate) fn run(&self, job: Job) -> std::io::Result<()> {
        let mut state = self.inner.lock();
        if state.idle > state.woken {
            state.woken += 1;
            state.jobs.push_back(job);
            self.inner.work.notify_one();
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
        run_guarded(first);
        let mut state = self.lock();
        loop {
            if let Some(job) = state.jobs.pop_front() {
                drop(state);
                run_guarded(job);
                state = self.lock();
                continue;
            }
            state.idle += 1;
            let (guard, waited) = self.work.wait_timeout(state, KEEP_ALIVE).unwrap_or_else(|p| p.into_inner());
            state = guard;
            state.idle -= 1;
            if state.woken > 0 {
                state.woken -= 1;
                continue;
            }
            if waited.timed_out() && state.jobs.is_empty() {
                state.threads -= 1;
                return;
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
                state.idle < state.threads
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
}
