//! The load generator: N concurrent clients looping over one operation for a fixed time, with
//! every latency recorded.

use std::future::Future;
use std::time::{Duration, Instant};

/// What a workload achieved.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    /// Units of work completed (rows, for batches; equal to `ops` otherwise).
    pub units: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Median latency.
    pub p50: Duration,
    /// 99th-percentile latency.
    pub p99: Duration,
    /// CPU time this process spent while the load ran (all its threads; not other processes'),
    /// where it was measured ([`alternately`]).
    pub cpu: Option<Duration>,
    /// Context switches this process's threads made while the load ran (voluntary and not),
    /// where it was measured ([`alternately`]).
    pub switches: Option<u64>,
    /// Of the wall time, how long the flush at the end of each turn took: writing back what
    /// the load left for the kernel to write later ([`alternately`]).
    pub flushed: Option<Duration>,
}

impl Stats {
    /// Units per second.
    pub fn rate(&self) -> f64 {
        self.units as f64 / self.elapsed.as_secs_f64()
    }

    /// Stats from a set of latencies over a wall time.
    pub fn from_latencies(mut latencies: Vec<Duration>, units: u64, elapsed: Duration) -> Stats {
        latencies.sort_unstable();
        let at = |q: f64| {
            latencies.get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1))).copied()
        };
        let (p50, p99) = (at(0.50).unwrap_or_default(), at(0.99).unwrap_or_default());
        Stats { units, elapsed, p50, p99, cpu: None, switches: None, flushed: None }
    }

    /// This process's CPU time per unit, where it was measured.
    pub fn cpu_per_unit(&self) -> Option<Duration> {
        self.cpu.map(|cpu| cpu.div_f64(self.units.max(1) as f64))
    }

    /// The share of the wall time spent flushing at the end of turns, where it was measured.
    pub fn flushed_share(&self) -> Option<f64> {
        self.flushed.map(|f| f.as_secs_f64() / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE))
    }

    /// This process's context switches per unit, where they were counted.
    pub fn switches_per_unit(&self) -> Option<f64> {
        self.switches.map(|n| n as f64 / self.units.max(1) as f64)
    }
}

/// The runtime the load clients run on: two threads, as many as the machine's cores, so the
/// clients and the server share them alike in every suite.
pub fn client_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("load").enable_all().build()
}

/// Runs `clients` tasks for `duration`; each calls `op(client, n)` in a loop and reports how
/// many units it did.
pub async fn run<F, Fut>(clients: usize, duration: Duration, op: F) -> Stats
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = u64> + Send,
{
    let (latencies, units, elapsed) = run_timed(clients, duration, op).await;
    Stats::from_latencies(latencies, units, elapsed)
}

/// Runs a load as [`run`] does; answers every unit's latency, the units and the wall time.
pub async fn run_timed<F, Fut>(clients: usize, duration: Duration, op: F) -> (Vec<Duration>, u64, Duration)
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = u64> + Send,
{
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for client in 0..clients {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(65_536);
            let mut units = 0;
            let mut n = 0;
            while Instant::now() < deadline {
                let began = Instant::now();
                units += op(client, n).await;
                latencies.push(began.elapsed());
                n += 1;
            }
            (latencies, units)
        }));
    }
    let mut all = Vec::new();
    let mut units = 0;
    for t in tasks {
        let (latencies, u) = t.await.expect("client task");
        all.extend(latencies);
        units += u;
    }
    (all, units, start.elapsed())
}

/// A load's figures ([`run_timed`]'s) with `after` run once they are in and its time added:
/// the work a load leaves behind (kura's deferred history captures) done and paid for in its
/// own turn.
pub async fn then_timed(
    (latencies, units, elapsed): (Vec<Duration>, u64, Duration),
    after: impl Future<Output = ()>,
) -> (Vec<Duration>, u64, Duration) {
    let began = Instant::now();
    after.await;
    (latencies, units, elapsed + began.elapsed())
}

/// The HTTP floor: `clients` clients of `http` fetching `url` (a server's `/healthz`: no auth,
/// no storage) back to back for `duration`: what HTTP alone costs on this server and client.
/// Answers [`run_timed`]'s figures, to be taken in turns with the load it is set beside.
pub async fn http_floor_timed(
    http: &reqwest::Client,
    url: &str,
    clients: usize,
    duration: Duration,
) -> (Vec<Duration>, u64, Duration) {
    let (http, url) = (http.clone(), url.to_owned());
    run_timed(clients, duration, move |_, _| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let answer = http.get(&url).send().await.expect("healthz");
            assert!(answer.status().is_success(), "healthz answered {}", answer.status());
            let _ = answer.bytes().await;
            1
        }
    })
    .await
}

/// Loads measured in turns of (at most) one second until each has run about `duration`: on a
/// noisy machine all meet the same moments, so their ratios hold where any alone would wander.
/// The order rotates from round to round, so none always goes first (with more than two loads,
/// each still mostly follows the same one: the flush below keeps its leftover writes its own).
/// `load(i, slice)` runs load `i` (below `N`) for `slice` and answers [`run_timed`]'s figures;
/// each load's figures carry the CPU time this process spent during its turns.
///
/// Each turn ends with every file's dirty pages written to the disk, timed as part of the turn:
/// a load that leaves writes for the kernel to flush later (kura's history appends are not
/// synced per commit) pays for them in its own turn instead of slowing the next load's.
pub async fn alternately<const N: usize, F, Fut>(duration: Duration, load: F) -> [Stats; N]
where
    F: Fn(usize, Duration) -> Fut,
    Fut: Future<Output = (Vec<Duration>, u64, Duration)>,
{
    #[derive(Default)]
    struct Total {
        latencies: Vec<Duration>,
        units: u64,
        elapsed: Duration,
        cpu: Duration,
        switches: u64,
        flushed: Duration,
    }
    let slice = duration.min(Duration::from_secs(1));
    let rounds = (duration.as_secs_f64() / slice.as_secs_f64().max(1e-3)).round().max(1.0) as usize;
    let mut totals: [Total; N] = std::array::from_fn(|_| Total::default());
    for round in 0..rounds {
        for turn in 0..N {
            let i = (round + turn) % N;
            let before = process_usage();
            let (latencies, units, elapsed) = load(i, slice).await;
            let flushed = Instant::now();
            flush_to_disk();
            let flushed = flushed.elapsed();
            let elapsed = elapsed + flushed;
            let total = &mut totals[i];
            let after = process_usage();
            total.cpu += after.cpu.saturating_sub(before.cpu);
            total.switches += after.switches.saturating_sub(before.switches);
            total.latencies.extend(latencies);
            total.units += units;
            total.elapsed += elapsed;
            total.flushed += flushed;
        }
    }
    totals.map(|t| Stats {
        cpu: Some(t.cpu),
        switches: Some(t.switches),
        flushed: Some(t.flushed),
        ..Stats::from_latencies(t.latencies, t.units, t.elapsed)
    })
}

/// Writes every filesystem's dirty pages to the disk and waits for them (`sync(2)`).
fn flush_to_disk() {
    // SAFETY: `sync` takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// What this process has used so far, all its threads.
struct Usage {
    /// CPU time, user and system.
    cpu: Duration,
    /// Context switches, voluntary (a wait: a lock, a wake-up, an fsync) and not.
    switches: u64,
}

fn process_usage() -> Usage {
    // SAFETY: `getrusage` fills the struct it is given; an all-zero `rusage` is a valid value.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec.max(0) as u64, (t.tv_usec.clamp(0, 999_999) as u32) * 1_000);
    Usage {
        cpu: time(usage.ru_utime) + time(usage.ru_stime),
        switches: (usage.ru_nvcsw.max(0) + usage.ru_nivcsw.max(0)) as u64,
    }
}
