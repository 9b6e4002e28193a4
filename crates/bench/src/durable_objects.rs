//! The Durable Objects suite: requests spread over 1,000 objects (a small SQL write and a read
//! each), through the Rust runtime in-process (as a Worker calls its objects) and over HTTP;
//! the first request to an evicted object; resident memory per idle object and with 100,000
//! objects on disk (measured in child processes of this program, so nothing else is resident);
//! beside the physical limit (the same statements on one SQLite file per object, as durable)
//! and the peer (Miniflare's Durable Object RPC inside a Worker).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::StreamExt;
use kura::{BoxFuture, DurableObject, Runtime, RuntimeSettings, State, Value};
use kura_sqlite::COMPACT_CACHE_KIB;
use serde_json::{Value as Json, json};

use crate::floor_server::FloorServer;
use crate::load::{self, Stats};
use crate::report::{self, Row, micros};
use crate::server::{ACCOUNT, Kura, TOKEN};
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

/// What the batch endpoint (an INSERT and a count as one request) measured at 16 clients and at
/// 1, and, in turns with it, the same server's HTTP floor, a server doing only the limit's work
/// ([`FloorServer::objects`]) and the limit.
#[derive(Default)]
struct HttpFigures {
    batch_16: Stats,
    batch_1: Stats,
    floor_16: Stats,
    floor_1: Stats,
    object_floor_16: Stats,
    object_floor_1: Stats,
    limit_16: Stats,
    limit_1: Stats,
}

async fn measure_http(
    api: &str,
    floor: &str,
    limit_dir: &Path,
    duration: Duration,
    wanted: &dyn Fn(&str) -> bool,
) -> anyhow::Result<HttpFigures> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build()?;
    let namespaces = format!("http://{api}/client/v4/accounts/{ACCOUNT}/workers/durable_objects/namespaces");
    let created: Json = http
        .post(&namespaces)
        .bearer_auth(TOKEN)
        .json(&json!({ "name": "ROOMS", "class": "Room", "script": "bench" }))
        .send()
        .await?
        .json()
        .await?;
    let Some(id) = created["result"]["id"].as_str() else { bail!("cannot create the namespace: {created}") };
    let objects: Arc<str> = format!("{namespaces}/{id}/objects").into();
    let batch_url = {
        let objects = Arc::clone(&objects);
        move |object: u64| format!("{objects}/{}/batch", room_name(object))
    };
    // Each of kura's turns ends with every object's captures done
    // ([`crate::server::capture_by_bookmark`]). A request per object costs more than the
    // captures alone: the conservative side.
    let capture_all = {
        let http = http.clone();
        move || {
            let (http, objects) = (http.clone(), Arc::clone(&objects));
            async move {
                futures_util::stream::iter(0..OBJECTS)
                    .for_each_concurrent(CLIENTS, |object| {
                        let url = format!("{objects}/{}/bookmark", room_name(object));
                        let http = http.clone();
                        async move { crate::server::capture_by_bookmark(&http, &url).await }
                    })
                    .await;
            }
        }
    };
    let batch_body = |statements: &[(&str, Option<String>)]| {
        let operations: Vec<Json> = statements
            .iter()
            .map(|(sql, param)| json!({ "op": "sql", "sql": sql, "params": param.iter().collect::<Vec<_>>() }))
            .collect();
        json!({ "operations": operations }).to_string()
    };
    let send = {
        let http = http.clone();
        move |(url, body): (String, String)| {
            let http = http.clone();
            async move { crate::server::post_ok(&http, &url, body).await }
        }
    };
    let created_at = Instant::now();
    for object in 0..OBJECTS {
        send((batch_url(object), batch_body(&[(CREATE, None), (WRITE, Some("seed".into()))]))).await;
    }
    eprintln!("{OBJECTS} objects created over HTTP in {:.1} s; the load begins", created_at.elapsed().as_secs_f64());
    let next = Arc::new(AtomicU64::new(0));
    // Load 0 is kura's batch endpoint; load 1 the floor server, sent the same bodies; load 2
    // the limit; load 3 the same server's `/healthz` (the HTTP floor).
    let health = format!("http://{api}/healthz");
    let load = |which: usize, clients, slice, limit: &Arc<LimitLoad>| {
        let (send, batch_url, next, limit) = (send.clone(), batch_url.clone(), Arc::clone(&next), Arc::clone(limit));
        let capture_all = (which == 0).then(|| capture_all.clone());
        let floor_objects = (which == 1).then(|| format!("{floor}/objects"));
        let (http, health) = (http.clone(), health.clone());
        async move {
            match which {
                2 => return limit.take_turn(slice).await,
                3 => return load::http_floor_timed(&http, &health, clients, slice).await,
                _ => {}
            }
            let served = load::run_timed(clients, slice, move |client, n| {
                let user = format!("u{}", next.fetch_add(1, Ordering::Relaxed));
                let object = object_for(client, n);
                let body = batch_body(&[(WRITE, Some(user)), (READ, None)]);
                let url = match &floor_objects {
                    None => batch_url(object),
                    Some(floor_objects) => format!("{floor_objects}/{object}"),
                };
                let send = send.clone();
                async move {
                    send((url, body)).await;
                    1
                }
            })
            .await;
            load::then_timed(served, async {
                if let Some(capture_all) = capture_all {
                    capture_all().await;
                }
            })
            .await
        }
    };
    let in_turns = async |clients| -> anyhow::Result<[Stats; 4]> {
        let limit = LimitLoad::open(limit_dir, clients)?;
        Ok(load::alternately(duration, |which, slice| load(which, clients, slice, &limit)).await)
    };
    let [batch_16, object_floor_16, limit_16, floor_16] =
        if wanted("http16") { in_turns(CLIENTS).await? } else { Default::default() };
    let [batch_1, object_floor_1, limit_1, floor_1] =
        if wanted("http1") { in_turns(1).await? } else { Default::default() };
    Ok(HttpFigures { batch_16, batch_1, floor_16, floor_1, object_floor_16, object_floor_1, limit_16, limit_1 })
}

/// One object file for the limit, as kura keeps it: WAL, `synchronous=FULL`.
fn limit_open(dir: &Path, object: u64) -> anyhow::Result<rusqlite::Connection> {
    let conn = crate::limit::connect(&dir.join(format!("{object}.sqlite")))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(CREATE)?;
    Ok(conn)
}

/// One request on the limit's side: the same statements in one durable transaction.
fn limit_request(conn: &rusqlite::Connection, user: &str) -> anyhow::Result<()> {
    conn.execute_batch("BEGIN")?;
    conn.prepare_cached(WRITE)?.execute([user])?;
    let count: i64 = conn.prepare_cached(READ)?.query_row([], |r| r.get(0))?;
    anyhow::ensure!(count > 0);
    conn.execute_batch("COMMIT")?;
    Ok(())
}

/// A turn's end, and where its thread answers the latencies of the requests it ran.
type LimitTurn = (Instant, std::sync::mpsc::Sender<anyhow::Result<Vec<Duration>>>);

/// The physical limit, run in turns with kura: `clients` threads, each owning its share of the
/// object files with a connection open on each, running the workload's requests back to back
/// whenever it is given a turn. The files are opened once, so a turn measures requests only.
struct LimitLoad {
    turns: Vec<std::sync::mpsc::Sender<LimitTurn>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl LimitLoad {
    /// Opens (creating) the files in `dir` and waits until every thread has its connections.
    fn open(dir: &Path, clients: usize) -> anyhow::Result<Arc<LimitLoad>> {
        // Every load's users are new to the files (which later loads open again): a user
        // already there would make its INSERT OR IGNORE write nothing, and its commit no fsync.
        static LOADS: AtomicU64 = AtomicU64::new(0);
        let generation = LOADS.fetch_add(1, Ordering::Relaxed);
        std::fs::create_dir_all(dir)?;
        let (opened, all_opened) = std::sync::mpsc::channel();
        let mut load = LimitLoad { turns: Vec::new(), threads: Vec::new() };
        for client in 0..clients {
            let (turns, turn) = std::sync::mpsc::channel::<LimitTurn>();
            let (dir, opened) = (dir.to_owned(), opened.clone());
            load.turns.push(turns);
            load.threads.push(std::thread::spawn(move || {
                let mine: Vec<u64> = (0..OBJECTS).filter(|o| *o as usize % clients == client).collect();
                let conns = match mine.iter().map(|o| limit_open(&dir, *o)).collect::<anyhow::Result<Vec<_>>>() {
                    Ok(conns) => conns,
                    Err(e) => return drop(opened.send(Err(e))),
                };
                let _ = opened.send(Ok(()));
                let mut n = 0usize;
                while let Ok((deadline, answer)) = turn.recv() {
                    let mut latencies = Vec::new();
                    let ran = (|| {
                        while Instant::now() < deadline {
                            let began = Instant::now();
                            limit_request(&conns[(n * 7_919) % conns.len()], &format!("l{generation}-{client}-{n}"))?;
                            latencies.push(began.elapsed());
                            n += 1;
                        }
                        Ok(())
                    })();
                    let _ = answer.send(ran.map(|()| latencies));
                }
            }));
        }
        // Only the threads hold senders now: one that dies before it reports ends the wait.
        drop(opened);
        for _ in 0..clients {
            all_opened.recv().context("a limit thread ended while opening its files")??;
        }
        Ok(Arc::new(load))
    }

    /// Every thread's requests for `slice`, as [`load::run_timed`] answers a load's.
    fn turn(&self, slice: Duration) -> anyhow::Result<(Vec<Duration>, u64, Duration)> {
        let started = Instant::now();
        let (answer, answers) = std::sync::mpsc::channel();
        for turns in &self.turns {
            turns.send((started + slice, answer.clone())).context("a limit thread ended")?;
        }
        drop(answer);
        let mut all = Vec::new();
        for _ in 0..self.turns.len() {
            all.extend(answers.recv().context("a limit thread ended during its turn")??);
        }
        let units = all.len() as u64;
        Ok((all, units, started.elapsed()))
    }

    /// A turn run from async code, on a blocking thread.
    async fn take_turn(self: &Arc<Self>, slice: Duration) -> (Vec<Duration>, u64, Duration) {
        let load = Arc::clone(self);
        tokio::task::spawn_blocking(move || load.turn(slice)).await.expect("limit turn").expect("limit requests")
    }
}

impl Drop for LimitLoad {
    fn drop(&mut self) {
        self.turns.clear();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// What the memory measurement found.
pub struct Footprint {
    objects: u64,
    write_rate: f64,
    disk_bytes: u64,
    report: Json,
    /// Resident bytes per open file with nothing but a bare SQLite connection on it.
    limit_per_file: f64,
}

impl Footprint {
    fn print(&self) {
        let r = &self.report;
        let mib = |k: &str| r[k].as_f64().unwrap_or(0.0) / 1024.0 / 1024.0;
        let idle = r["idle_objects"].as_u64().unwrap_or(1).max(1);
        let per_idle =
            (r["idle_rss"].as_f64().unwrap_or(0.0) - r["baseline_rss"].as_f64().unwrap_or(0.0)) / idle as f64;
        println!();
        println!(
            "Memory (a fresh process; resident set from /proc): {} objects on disk, written at {:.0} objects/s, \
             {:.1} KiB of disk each",
            self.objects,
            self.write_rate,
            self.disk_bytes as f64 / self.objects.max(1) as f64 / 1024.0
        );
        println!("  runtime open, nothing touched:              {:>8.1} MiB", mib("baseline_rss"));
        println!(
            "  {idle} objects touched, idle in memory:      {:>8.1} MiB  → {:.1} KiB per idle object (instance + open file)",
            mib("idle_rss"),
            per_idle / 1024.0
        );
        println!(
            "  limit: {idle} bare SQLite connections, one per file, configured as kura's (WAL, exclusive, no lookaside, \
             {COMPACT_CACHE_KIB} KiB cache, no bulk page reservation), after the same request: {:.1} KiB per open file → kura {:.2}× the limit",
            self.limit_per_file / 1024.0,
            per_idle / self.limit_per_file.max(1.0)
        );
        println!(
            "  all {} touched once, {:.0} first requests/s: {:>8.1} MiB now, {:.1} MiB at peak; {} instances and {} files \
             open (caps {} and {})",
            self.objects,
            r["touch_rate"].as_f64().unwrap_or(0.0),
            mib("all_rss"),
            mib("peak_rss"),
            r["instances"],
            r["open_files"],
            r["max_instances"],
            r["max_open"],
        );
        let instances = r["instances"].as_u64().unwrap_or(1).max(1);
        println!(
            "  files idle {}s and closed ({} open), instances kept:  {:>8.1} MiB  → {:.1} KiB per known object (instance only)",
            FILE_IDLE.as_secs() * 3,
            r["closed_files"],
            mib("closed_rss"),
            (r["closed_rss"].as_f64().unwrap_or(0.0) - r["baseline_rss"].as_f64().unwrap_or(0.0))
                / instances as f64
                / 1024.0
        );
    }
}

/// Writes `objects` objects (the 1,000 of the workload's first, one row each) with the engine,
/// then measures a fresh process touching them.
fn measure_footprint(dir: &Path, objects: u64, rt: &tokio::runtime::Runtime) -> anyhow::Result<Footprint> {
    let started = Instant::now();
    rt.block_on(async {
        let runtime = Runtime::open_with(dir, RuntimeSettings::default())?;
        let rooms = runtime.namespace::<Room>("ROOMS", "bench-Room", ())?;
        add_to_all(&rooms, objects, "seed", 1).await?;
        runtime.shutdown().await;
        anyhow::Ok(())
    })?;
    let write_rate = objects as f64 / started.elapsed().as_secs_f64();
    let disk_bytes = disk_usage(dir);
    let output = Command::new(std::env::current_exe()?)
        .arg("do-footprint")
        .arg(dir)
        .arg(objects.to_string())
        .output()
        .context("running the footprint process")?;
    if !output.status.success() {
        bail!("the footprint process failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let report: Json = serde_json::from_slice(&output.stdout).context("the footprint process's answer")?;
    let limit_dir = dir.with_extension("limit");
    std::fs::create_dir_all(&limit_dir)?;
    for object in 0..OBJECTS {
        limit_request(&limit_open_compact(&limit_dir, object)?, "seed")?;
    }
    let output = Command::new(std::env::current_exe()?)
        .arg("do-footprint-limit")
        .arg(&limit_dir)
        .output()
        .context("running the footprint limit's process")?;
    if !output.status.success() {
        bail!("the footprint limit's process failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let limit: Json = serde_json::from_slice(&output.stdout).context("the footprint limit's answer")?;
    let limit_per_file = limit["per_file"].as_f64().unwrap_or(0.0);
    Ok(Footprint { objects, write_rate, disk_bytes, report, limit_per_file })
}

/// The memory limit's side: in a fresh process, a bare connection on each of the [`OBJECTS`]
/// files written before, configured as kura configures an object's (and the process as kura
/// configures its own), each after the workload's
/// request; prints the resident bytes per open file.
pub fn footprint_limit_child(dir: &Path) -> anyhow::Result<()> {
    // As kura's process is configured: no page-cache pages reserved up front per connection.
    kura_sqlite::configure_process();
    let baseline_rss = crate::memory::resident_bytes().0;
    let mut conns = Vec::new();
    for object in 0..OBJECTS {
        let conn = limit_open_compact(dir, object)?;
        limit_request(&conn, "idle")?;
        conns.push(conn);
    }
    let open_rss = crate::memory::resident_bytes().0;
    let per_file = open_rss.saturating_sub(baseline_rss) as f64 / OBJECTS as f64;
    println!("{}", json!({ "baseline_rss": baseline_rss, "open_rss": open_rss, "per_file": per_file }));
    drop(conns);
    Ok(())
}

/// A limit connection configured as kura configures an object's: WAL, exclusive locking, no
/// lookaside, the compact cache.
fn limit_open_compact(dir: &Path, object: u64) -> anyhow::Result<rusqlite::Connection> {
    let conn = crate::limit::connect(&dir.join(format!("{object}.sqlite")))?;
    conn.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
    kura_sqlite::make_compact(&conn)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(CREATE)?;
    Ok(conn)
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

/// Bytes of disk the files under `dir` take.
fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut pending = vec![dir.to_owned()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => pending.push(entry.path()),
                Ok(m) => total += m.blocks() * 512,
                Err(_) => {}
            }
        }
    }
    total
}

/// How long an idle object's file stays open in the memory measurement.
const FILE_IDLE: Duration = Duration::from_secs(2);

/// The child process's side: open a runtime on `dir`, touch the first 1,000 objects and keep
/// them idle, then touch all `objects`; print what was resident at each step as JSON.
pub fn footprint_child(dir: PathBuf, objects: u64) -> anyhow::Result<()> {
    let rt = tokio_runtime("footprint")?;
    let mut settings = RuntimeSettings::default();
    // Files close after 30 s idle by default; sooner here, so the run need not wait for it.
    settings.engine.registry.idle_timeout = FILE_IDLE;
    let report = rt.block_on(async {
        let runtime = Runtime::open_with(&dir, settings.clone())?;
        let rooms = runtime.namespace::<Room>("ROOMS", "bench-Room", ())?;
        let baseline_rss = crate::memory::resident_bytes().0;
        let idle_objects = OBJECTS.min(objects);
        for object in 0..idle_objects {
            rooms.get_by_name(&room_name(object)).call(add("idle".into())).await?;
        }
        let idle_rss = crate::memory::resident_bytes().0;
        let started = Instant::now();
        // Every object still answers with its data: the seed row, the idle one and this one.
        add_to_all(&rooms, objects, "again", 2).await?;
        let touch_rate = objects as f64 / started.elapsed().as_secs_f64();
        let (all_rss, _) = crate::memory::resident_bytes();
        let open_files = runtime.engine().open_objects();
        // Idle objects close their files; their instances stay (up to the cap).
        tokio::time::sleep(FILE_IDLE * 3).await;
        // SAFETY: malloc_trim only returns free memory to the system.
        unsafe { libc::malloc_trim(0) };
        let (closed_rss, peak_rss) = crate::memory::resident_bytes();
        let report = json!({
            "baseline_rss": baseline_rss,
            "idle_objects": idle_objects,
            "idle_rss": idle_rss,
            "all_rss": all_rss,
            "closed_rss": closed_rss,
            "closed_files": runtime.engine().open_objects(),
            "peak_rss": peak_rss,
            "touch_rate": touch_rate,
            "instances": rooms.instances(),
            "open_files": open_files,
            "max_instances": settings.max_instances,
            "max_open": settings.engine.registry.max_open,
        });
        runtime.shutdown().await;
        anyhow::Ok(report)
    })?;
    println!("{report}");
    Ok(())
}
