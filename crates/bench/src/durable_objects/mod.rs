//! The Durable Objects suite: requests spread over 1,000 objects (a small SQL write and a read
//! each), through the Rust runtime in-process (as a Worker calls its objects) and over HTTP;
//! the first request to an evicted object; resident memory per idle object and with 100,000
//! objects on disk (measured in child processes of this program, so nothing else is resident);
//! beside the physical limit (the same statements on one SQLite file per object, as durable)
//! and the peer (Miniflare's Durable Object RPC inside a Worker).

mod footprint;
mod http;
mod limit;

use footprint::measure_footprint;
pub use footprint::{footprint_child, footprint_limit_child};
use http::{HttpFigures, measure_http};
use limit::{LimitLoad, limit_open, limit_request};

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use kura::{BoxFuture, DurableObject, Runtime, RuntimeSettings, State, Value};

use crate::floor_server::FloorServer;
use crate::load::{self, Stats};
use crate::report::{self, Row, micros};
use crate::server::Kura;
use crate::{Settings, peer};

/// Objects the requests are spread over.
const OBJECTS: u64 = 1_000;
/// Concurrent clients.
const CLIENTS: usize = 16;
/// The workload's statements: one small write and one read, as one request.
const CREATE: &str = "CREATE TABLE IF NOT EXISTS member (user_id TEXT PRIMARY KEY)";
const WRITE: &str = "INSERT OR IGNORE INTO member (user_id) VALUES (?)";
const READ: &str = "SELECT count(*) FROM member";

/// The peer's `Room`, in Rust: its table is made by the constructor.
struct Room {
    state: State,
}

impl DurableObject for Room {
    type Env = ();

    async fn new(state: State, _env: ()) -> kura::Result<Self> {
        state.storage().exec(CREATE, vec![]).await?;
        Ok(Room { state })
    }
}

impl Room {
    /// Adds a member and answers how many there are.
    async fn add(&mut self, user: String) -> kura::Result<i64> {
        let storage = self.state.storage();
        storage.exec(WRITE, vec![Value::Text(user)]).await?;
        let count = storage.exec(READ, vec![]).await?;
        match count.rows.first().and_then(|r| r.first()) {
            Some(Value::Integer(n)) => Ok(*n),
            other => Err(kura::Error::msg(format!("count(*) answered {other:?}"))),
        }
    }
}

fn add(user: String) -> impl for<'a> FnOnce(&'a mut Room) -> BoxFuture<'a, kura::Result<i64>> + Send + 'static {
    move |room: &mut Room| -> BoxFuture<'_, kura::Result<i64>> { Box::pin(room.add(user)) }
}

/// The object a client's `n`th request goes to: spread evenly, different per client.
fn object_for(client: usize, n: u64) -> u64 {
    (client as u64 * 104_729 + n * 7_919) % OBJECTS
}

fn room_name(object: u64) -> String {
    format!("room:{object}")
}

fn tokio_runtime(name: &str) -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name(name).enable_all().build()?)
}

pub fn run(settings: &Settings, on_disk: u64) -> anyhow::Result<()> {
    let scratch = settings.scratch_dir()?;
    let duration = Duration::from_secs_f64(settings.seconds);
    let wanted = |name: &str| settings.only.is_empty() || settings.only.iter().any(|o| o == name);
    let rt = tokio_runtime("load")?;

    // The limit (one SQLite file per object, WAL, synchronous=FULL) runs in turns with each of
    // kura's loads: on this shared machine the disk's speed moves within minutes, and a limit
    // measured once, apart, moved kura's ratios with it.
    let limit_dir = scratch.path().join("limit");
    eprintln!("measuring kura's Rust runtime (in-process, {OBJECTS} objects) in turns with the limit…");
    let sdk_dir = scratch.path().join("sdk");
    let (sdk_16, sdk_1) = rt.block_on(measure_runtime(&sdk_dir, &limit_dir, duration, &wanted))?;
    eprintln!(
        "measuring the first request to an evicted object (a fresh runtime on the same files) in turns with the limit's…"
    );
    let cold = if wanted("cold") { rt.block_on(measure_cold(&sdk_dir, &limit_dir))? } else { BesideLimit::default() };

    let http = if wanted("http16") || wanted("http1") {
        eprintln!(
            "measuring kura over HTTP (batch endpoint) in turns with a server doing the limit's work, the limit and the HTTP floor…"
        );
        let kura = Kura::start(&scratch.path().join("kura"), true).context("starting kura")?;
        // The floor server opens its own files of the same objects, one connection each.
        let floor =
            FloorServer::objects(&scratch.path().join("object-floor"), OBJECTS, CLIENTS, limit_open, limit_request)?;
        let figures = rt.block_on(measure_http(&kura.api_host(), &floor.base, &limit_dir, duration, &wanted));
        drop(floor);
        kura.shutdown();
        figures?
    } else {
        HttpFigures::default()
    };
    let (http_16, http_1) = (http.batch_16, http.batch_1);

    let footprint = if wanted("memory") {
        eprintln!("measuring memory: {on_disk} objects written, then touched by a fresh process…");
        Some(measure_footprint(&scratch.path().join("footprint"), on_disk, &rt)?)
    } else {
        None
    };

    if !settings.only.is_empty() {
        // The CPU is shown for the loads whose work is all in this process (kura's HTTP server is
        // another process; the floor server shares this one with the clients).
        for (name, stats, in_process) in [
            ("sdk16", sdk_16.kura, true),
            ("limit16 (in turns with sdk16)", sdk_16.limit, true),
            ("sdk1", sdk_1.kura, true),
            ("limit1 (in turns with sdk1)", sdk_1.limit, true),
            ("cold", cold.kura, true),
            ("limitcold (in turns with cold)", cold.limit, true),
            ("http16", http_16, false),
            ("objectfloor16", http.object_floor_16, false),
            ("limit16 (in turns with http16)", http.limit_16, true),
            ("floor16 (in turns with http16)", http.floor_16, false),
            ("http1", http_1, false),
            ("objectfloor1", http.object_floor_1, false),
            ("limit1 (in turns with http1)", http.limit_1, true),
            ("floor1 (in turns with http1)", http.floor_1, false),
        ] {
            if stats.units > 0 {
                let cpu = stats.cpu_per_unit().filter(|_| in_process);
                let cpu = cpu.map(|c| {
                    let switches = stats.switches_per_unit().unwrap_or(0.0);
                    format!(", this process's CPU {:.1} µs and {switches:.1} context switches each", micros(c))
                });
                println!(
                    "{name}: {:.0}/s p50 {:?} p99 {:?}{}",
                    stats.rate(),
                    stats.p50,
                    stats.p99,
                    cpu.unwrap_or_default()
                );
            }
        }
        if let Some(f) = footprint {
            f.print();
        }
        return Ok(());
    }

    let (peer_figures, peer_note) = if settings.no_peer {
        (Vec::new(), "skipped (--no-peer)".to_owned())
    } else {
        eprintln!("running the peer (Miniflare)…");
        match peer::run(settings, &["do_rpc_add"], &scratch.path().join("peer")) {
            Ok(f) => (
                f,
                format!(
                    "Miniflare 4.20260730.0, Durable Object RPC room.add(u) inside a Worker over 50 rooms, one client, {} ops",
                    settings.peer_ops
                ),
            ),
            Err(why) => (Vec::new(), format!("not measured: {why}")),
        }
    };
    let peer_rate = peer::rate(&peer_figures, "do_rpc_add");
    let target = peer_rate.map(|p| p * 10.0);
    let row = |workload: &str, clients, kura, limit, target| Row {
        workload: workload.into(),
        clients,
        unit: "requests",
        kura,
        peer: peer_rate,
        limit: Some(limit),
        target,
    };
    let rows = vec![
        row("runtime: write + read", CLIENTS, sdk_16.kura, sdk_16.limit, target),
        row("runtime: write + read", 1, sdk_1.kura, sdk_1.limit, None),
        row("HTTP batch: write + read", CLIENTS, http_16, http.limit_16, target),
        row("HTTP batch: write + read", 1, http_1, http.limit_1, None),
        // What the endpoint could reach on these cores, measured whole: a server doing only the
        // limit's work behind HTTP, in turns with kura.
        row("HTTP batch vs a server doing the limit's work", CLIENTS, http_16, http.object_floor_16, None),
        row("HTTP batch vs a server doing the limit's work", 1, http_1, http.object_floor_1, None),
        // The same, summed: the limit's work plus one HTTP round trip of this server and client
        // (its /healthz), each request paying both.
        row(
            "HTTP batch vs limit + HTTP floor",
            CLIENTS,
            http_16,
            crate::d1::one_after_the_other(&http.floor_16, &http.limit_16),
            None,
        ),
        row(
            "HTTP batch vs limit + HTTP floor",
            1,
            http_1,
            crate::d1::one_after_the_other(&http.floor_1, &http.limit_1),
            None,
        ),
        row("first request, evicted object", 1, cold.kura, cold.limit, None),
    ];
    report::print(
        &format!(
            "Durable Objects: each request a small SQL write and a read on one of {OBJECTS} objects, committed durably \
             (WAL + synchronous=FULL); limit = the same statements on one rusqlite connection per object file, \
             run in one-second turns with each of kura's loads; target = 10× the peer"
        ),
        &rows,
        &peer_note,
    );
    // Where the CPU, not the disk, sets the pace, the runtime's ratio to the limit is the ratio
    // of their CPU per request; both run in this process, so its CPU time during their turns
    // is theirs (with the kernel's work done on their threads, not the disk's writeback).
    for (clients, beside) in [(CLIENTS, sdk_16), (1, sdk_1)] {
        if let (Some(kura), Some(limit)) = (beside.kura.cpu_per_unit(), beside.limit.cpu_per_unit()) {
            println!(
                "runtime at {clients} client(s), CPU per request in turns: kura {:.1} µs, the limit {:.1} µs ({:.2}×); \
                 context switches per request: kura {:.1}, the limit {:.1}",
                micros(kura),
                micros(limit),
                kura.as_secs_f64() / limit.as_secs_f64().max(f64::MIN_POSITIVE),
                beside.kura.switches_per_unit().unwrap_or(0.0),
                beside.limit.switches_per_unit().unwrap_or(0.0),
            );
        }
        // kura writes each commit twice (the WAL, then its history's copy, not synced per
        // commit): the flush ending each turn writes the copies back, inside kura's time.
        if let (Some(kura), Some(limit)) = (beside.kura.flushed_share(), beside.limit.flushed_share()) {
            println!(
                "runtime at {clients} client(s), the turns' closing flush of writes left to the kernel:                  {:.1}% of kura's time, {:.1}% of the limit's",
                kura * 100.0,
                limit * 100.0,
            );
        }
    }
    // The in-process limit has no HTTP to pay: what an endpoint can reach is bounded by the
    // server doing only the limit's work behind HTTP, measured in the same turns.
    for (clients, kura, floor, limit) in
        [(CLIENTS, http_16, http.object_floor_16, http.limit_16), (1, http_1, http.object_floor_1, http.limit_1)]
    {
        let (kura, floor, limit) = (kura.rate(), floor.rate(), limit.rate());
        if kura > 0.0 && floor > 0.0 && limit > 0.0 {
            let reached = kura / floor;
            let target = match clients {
                CLIENTS if reached >= 0.7 => " (target ≥ 0.7× ✓)",
                CLIENTS => " (target ≥ 0.7× ✗)",
                _ => "",
            };
            println!(
                "HTTP batch at {clients} client(s): a server doing only the limit's work behind HTTP reaches {:.2}× \
                 the in-process limit on these cores, the bound for any server; kura reaches {reached:.2}× that \
                 server{target} and {:.2}× the limit",
                floor / limit,
                kura / limit,
            );
        }
    }
    let (cold, limit_cold) = (cold.kura, cold.limit);
    let cold_ratio = cold.p50.as_secs_f64() / limit_cold.p50.as_secs_f64().max(f64::MIN_POSITIVE);
    println!(
        "first request to an evicted object: p50 {:.2} ms (target ≤ 2 ms {}), p99 {:.2} ms; limit (open the file, \
         the same request, in turns): p50 {:.2} ms; p50 {cold_ratio:.2}× the limit's (target ≤ 1.5× {})",
        ms(cold.p50),
        if cold.p50 <= Duration::from_millis(2) { "✓" } else { "✗" },
        ms(cold.p99),
        ms(limit_cold.p50),
        if cold_ratio <= 1.5 { "✓" } else { "✗" },
    );
    if let Some(f) = footprint {
        f.print();
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One of kura's loads and the limit, measured in turns.
#[derive(Default, Clone, Copy)]
struct BesideLimit {
    kura: Stats,
    limit: Stats,
}

/// Requests through the runtime at 16 clients and at 1, after one warm-up request per object,
/// each in turns with the limit (its files in `limit_dir`).
async fn measure_runtime(
    dir: &Path,
    limit_dir: &Path,
    duration: Duration,
    wanted: &dyn Fn(&str) -> bool,
) -> anyhow::Result<(BesideLimit, BesideLimit)> {
    let runtime = Runtime::open_with(dir, RuntimeSettings::default())?;
    let rooms = runtime.namespace::<Room>("ROOMS", "bench-Room", ())?;
    for object in 0..OBJECTS {
        rooms.get_by_name(&room_name(object)).call(add("seed".into())).await?;
    }
    let next = Arc::new(AtomicU64::new(0));
    let engine = runtime.engine().clone();
    let measure = async |clients| -> anyhow::Result<BesideLimit> {
        let limit = LimitLoad::open(limit_dir, clients)?;
        let [kura, limit] = load::alternately(duration, |which, slice| {
            let (rooms, next, limit, engine) = (rooms.clone(), Arc::clone(&next), Arc::clone(&limit), engine.clone());
            async move {
                if which == 1 {
                    return limit.take_turn(slice).await;
                }
                let served = load::run_timed(clients, slice, move |client, n| {
                    let (rooms, user) = (rooms.clone(), format!("u{}", next.fetch_add(1, Ordering::Relaxed)));
                    async move {
                        let count = rooms.get_by_name(&room_name(object_for(client, n))).call(add(user)).await;
                        assert!(count.expect("runtime request") > 0);
                        1
                    }
                })
                .await;
                // The history captures commits in batches, up to a second after their answer:
                // the turn ends with its commits captured, so their capture is not done in the
                // limit's turn.
                load::then_timed(served, engine.capture_histories()).await
            }
        })
        .await;
        Ok(BesideLimit { kura, limit })
    };
    let sixteen = if wanted("sdk16") { measure(CLIENTS).await? } else { BesideLimit::default() };
    let one = if wanted("sdk1") { measure(1).await? } else { BesideLimit::default() };
    runtime.shutdown().await;
    Ok((sixteen, one))
}

/// The first request to each object in a fresh runtime over the same files (nothing of it is
/// in memory and its file is closed, as after an eviction), each beside the limit's first
/// request to a file of its own in `limit_dir` (open it, the same request), in turns, the two
/// taking the lead in turn: `[kura, limit]`.
async fn measure_cold(dir: &Path, limit_dir: &Path) -> anyhow::Result<BesideLimit> {
    if !limit_dir.exists() {
        // Measured without the limit's loads (`--only cold`): the files they would have left.
        std::fs::create_dir_all(limit_dir)?;
        for object in 0..OBJECTS {
            limit_request(&limit_open(limit_dir, object)?, "seed")?;
        }
    }
    let runtime = Runtime::open_with(dir, RuntimeSettings::default())?;
    let rooms = runtime.namespace::<Room>("ROOMS", "bench-Room", ())?;
    let (mut kura, mut limit) = (Vec::new(), Vec::new());
    let (mut kura_time, mut limit_time) = (Duration::ZERO, Duration::ZERO);
    for object in 0..OBJECTS {
        for turn in 0..2 {
            let began = Instant::now();
            if (object as usize + turn).is_multiple_of(2) {
                rooms.get_by_name(&room_name(object)).call(add("cold".into())).await?;
                kura.push(began.elapsed());
                kura_time += began.elapsed();
            } else {
                let conn = crate::limit::connect(&limit_dir.join(format!("{object}.sqlite")))?;
                conn.pragma_update(None, "synchronous", "FULL")?;
                limit_request(&conn, "first")?;
                limit.push(began.elapsed());
                limit_time += began.elapsed();
                // Closed after the clock stops, as kura's object stays open: closing the last
                // connection checkpoints the WAL and syncs the file, which the request never pays.
                drop(conn);
            }
        }
    }
    runtime.shutdown().await;
    Ok(BesideLimit {
        kura: Stats::from_latencies(kura, OBJECTS, kura_time),
        limit: Stats::from_latencies(limit, OBJECTS, limit_time),
    })
}

/// Adds `user` to each of rooms 0..`objects` from 16 concurrent clients; a room answering
/// fewer than `least` members has lost data.
async fn add_to_all(rooms: &kura::Namespace<Room>, objects: u64, user: &'static str, least: i64) -> kura::Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let workers: Vec<tokio::task::JoinHandle<kura::Result<()>>> = (0..CLIENTS)
        .map(|_| {
            let (rooms, next) = (rooms.clone(), Arc::clone(&next));
            tokio::spawn(async move {
                loop {
                    let object = next.fetch_add(1, Ordering::Relaxed);
                    if object >= objects {
                        return Ok(());
                    }
                    let count = rooms.get_by_name(&room_name(object)).call(add(user.into())).await?;
                    if count < least {
                        return Err(kura::Error::msg(format!("room:{object} lost its data")));
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.map_err(kura::Error::msg)??;
    }
    Ok(())
}
