//! The D1 suite: kura's `/query` endpoint over HTTP (server and load generator on runtimes of
//! their own, as two processes would be), then the limit, then the peer, then the peer's own
//! Worker code with its D1 binding pointed at kura.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value as Json, json};

use crate::load::{self, Stats};
use crate::report::{self, Row, micros};
use crate::{Settings, limit, peer, worker};

use crate::floor_server::FloorServer;
use crate::server::{Kura, TOKEN};
pub(crate) const ROWS: i64 = 10_000;

/// An HTTP client for one database's `/query`.
#[derive(Clone)]
pub(crate) struct Client {
    pub(crate) http: reqwest::Client,
    query: Arc<str>,
    /// The database's id.
    pub(crate) uuid: Arc<str>,
    /// Whether the server keeps the database's history ([`Client::capture_history`]).
    history: bool,
}

impl Client {
    /// Sends a request and checks it succeeded, without parsing the answer.
    async fn send(&self, body: String) {
        crate::server::post_ok(&self.http, &self.query, body).await;
    }

    /// Has the server capture what the database's history owes
    /// ([`crate::server::capture_by_bookmark`]); nothing for a server that keeps no history.
    async fn capture_history(&self) {
        if let Some(database) = self.query.strip_suffix("/query").filter(|_| self.history) {
            crate::server::capture_by_bookmark(&self.http, &format!("{database}/time_travel/bookmark")).await;
        }
    }

    /// A client for a server that keeps no history, with this one's connections.
    fn elsewhere(&self, url: &str) -> Client {
        Client { http: self.http.clone(), query: url.into(), uuid: "".into(), history: false }
    }

    async fn post(&self, body: &Json) -> Json {
        let response = self.http.post(&*self.query).bearer_auth(TOKEN).json(body).send().await.expect("request");
        let json: Json = response.json().await.expect("JSON response");
        assert_eq!(json["success"], true, "benchmark request failed: {json}");
        json
    }
}

/// The floor of a one-client durable write over HTTP: one round trip on this server (its
/// `/healthz` at one client) followed by one durable commit (the limit's INSERT), back to back.
fn round_trip_and_fsync(round_trip: &Stats, commit: &Stats) -> Stats {
    one_after_the_other(round_trip, commit)
}

/// The floor of work whose every unit pays two measured costs, one after the other: each
/// unit takes the time per unit of both.
pub(crate) fn one_after_the_other(first: &Stats, second: &Stats) -> Stats {
    let each = first.elapsed.div_f64(first.units.max(1) as f64) + second.elapsed.div_f64(second.units.max(1) as f64);
    let elapsed = Duration::from_secs(1);
    Stats {
        units: (elapsed.as_secs_f64() / each.as_secs_f64().max(1e-9)) as u64,
        elapsed,
        p50: first.p50 + second.p50,
        p99: first.p99 + second.p99,
        cpu: None,
        switches: None,
        flushed: None,
    }
}

pub fn run(settings: &Settings) -> anyhow::Result<()> {
    let scratch = settings.scratch_dir()?;
    let duration = Duration::from_secs_f64(settings.seconds);
    let kura = Kura::start(&scratch.path().join("kura"), true).context("starting kura")?;
    let commit_floor =
        FloorServer::commit(&scratch.path().join("commit-floor")).context("starting the commit floor")?;
    let client_runtime = crate::load::client_runtime()?;
    let wanted = |name: &str| settings.only.is_empty() || settings.only.iter().any(|o| o == name);
    // First, as the disk's one-client INSERT takes its figure for kura's own time from it.
    let in_memory = match wanted("insert1mem") || wanted("insert1") {
        true => measure_in_memory(&client_runtime, duration)?,
        false => None,
    };
    let own_time = in_memory.as_ref().map(OwnTime::work);
    let figures =
        client_runtime.block_on(measure_kura(&kura.base, &commit_floor.base, own_time, duration, &settings.only))?;
    drop(commit_floor);
    kura.shutdown();
    let log_cost = if settings.only.is_empty() {
        eprintln!("measuring Time Travel's log: the same server with capture on and off, alternating…");
        let with = Kura::start(&scratch.path().join("log-on"), true)?;
        let without = Kura::start(&scratch.path().join("log-off"), false)?;
        let costs = client_runtime.block_on(measure_log_cost(&with.base, &without.base, duration))?;
        with.shutdown();
        without.shutdown();
        Some(costs)
    } else {
        None
    };
    if !settings.only.is_empty() {
        // CPU per request (the whole process's, the client's included) is steadier than the
        // rate on this machine: the difference between two loads in turns is the server's.
        let line = |name: &str, stats: &Stats| {
            let cpu = stats.cpu_per_unit().map_or(String::new(), |c| format!(" cpu/op {:.1} µs", micros(c)));
            println!("{name}: {:.0}/s p50 {:?} p99 {:?}{cpu}", stats.rate(), stats.p50, stats.p99);
        };
        for (name, stats) in figures.measured() {
            line(name, &stats);
        }
        if let Some(work) = own_time
            && figures.commit_floor_after_work_1.units > 0
        {
            line(&format!("commitfloor1 after {:.0} µs of work", micros(work)), &figures.commit_floor_after_work_1);
        }
        if let Some(own) = in_memory {
            println!("{}", own.describe());
        }
        return Ok(());
    }

    eprintln!("measuring the physical limit…");
    let limit_dir = scratch.path().join("limit");
    std::fs::create_dir_all(&limit_dir)?;
    let conn = limit::open(&limit_dir, ROWS)?;
    let limit_select = limit::point_select(&conn, ROWS, duration)?;
    let limit_insert = limit::insert(&conn, 1_000_000, duration)?;
    let limit_batch = limit::batch(&conn, 10_000_000, duration)?;
    let mut after_pauses = Vec::new();
    for pause_us in COMMIT_PAUSES_US {
        let stats = limit::insert_after_pause(&conn, Duration::from_micros(pause_us), duration / 4)?;
        after_pauses.push((pause_us, stats));
    }
    drop(conn);

    let (peer_figures, peer_note) = if settings.no_peer {
        (Vec::new(), "skipped (--no-peer)".to_owned())
    } else {
        eprintln!("running the peer (Miniflare)…");
        match peer::run(
            settings,
            &["d1_point_select", "d1_insert_single", "d1_batch_100"],
            &scratch.path().join("peer"),
        ) {
            Ok(f) => (
                f,
                format!(
                    "Miniflare {} inside a Worker, {} ops per workload, one client",
                    "4.20260730.0", settings.peer_ops
                ),
            ),
            Err(why) => (Vec::new(), format!("not measured: {why}")),
        }
    };
    let peer_rate = |op: &str| peer::rate(&peer_figures, op);
    let peer_batch_rows = peer_rate("d1_batch_100");

    let rows = vec![
        Row {
            workload: "HTTP floor: GET /healthz".into(),
            clients: 16,
            unit: "requests",
            kura: figures.floor_16,
            peer: None,
            limit: None,
            target: None,
        },
        Row {
            workload: "HTTP floor: GET /healthz".into(),
            clients: 1,
            unit: "requests",
            kura: figures.floor_1,
            peer: None,
            limit: None,
            target: None,
        },
        Row {
            workload: "point SELECT".into(),
            clients: 16,
            unit: "queries",
            kura: figures.select_16,
            peer: peer_rate("d1_point_select"),
            limit: Some(limit_select),
            target: Some(20_000.0),
        },
        Row {
            workload: "point SELECT".into(),
            clients: 1,
            unit: "queries",
            kura: figures.select_1,
            peer: peer_rate("d1_point_select"),
            limit: Some(limit_select),
            target: None,
        },
        Row {
            workload: "point SELECT vs HTTP floor (>= 0.70x)".into(),
            clients: 16,
            unit: "queries",
            kura: figures.select_16,
            peer: None,
            limit: Some(figures.floor_16),
            target: None,
        },
        Row {
            workload: "point SELECT vs HTTP floor".into(),
            clients: 1,
            unit: "queries",
            kura: figures.select_1,
            peer: None,
            limit: Some(figures.floor_1),
            target: None,
        },
        Row {
            workload: "INSERT, durable".into(),
            clients: 1,
            unit: "rows",
            kura: figures.insert_1,
            peer: peer_rate("d1_insert_single"),
            limit: Some(limit_insert),
            target: Some(2_500.0),
        },
        Row {
            // The target's floor was once the sum below; measured whole it is lower
            // (docs/performance.md, "How the figures are taken").
            workload: "INSERT vs a server that commits once per request (>= 0.80x; was vs the sum)".into(),
            clients: 1,
            unit: "rows",
            kura: figures.insert_1,
            peer: None,
            limit: Some(figures.commit_floor_1),
            target: None,
        },
        Row {
            workload: match own_time {
                Some(work) => format!(
                    "INSERT vs the commit floor after {:.0} µs of work per request (kura's own time, on tmpfs)",
                    micros(work)
                ),
                None => "INSERT vs the commit floor after kura's own time: not measured (no /dev/shm)".into(),
            },
            clients: 1,
            unit: "rows",
            kura: figures.insert_1,
            peer: None,
            limit: own_time.map(|_| figures.commit_floor_after_work_1),
            target: None,
        },
        Row {
            workload: "INSERT vs 1 round trip + 1 fsync, measured apart".into(),
            clients: 1,
            unit: "rows",
            kura: figures.insert_1,
            peer: None,
            limit: Some(round_trip_and_fsync(&figures.floor_1, &limit_insert)),
            target: None,
        },
        Row {
            workload: "INSERT, durable".into(),
            clients: 16,
            unit: "rows",
            kura: figures.insert_16,
            peer: peer_rate("d1_insert_single"),
            limit: Some(limit_insert),
            target: Some(10_000.0),
        },
        Row {
            workload: "100-INSERT batch".into(),
            clients: 1,
            unit: "rows",
            kura: figures.batch_1,
            peer: peer_batch_rows,
            limit: Some(limit_batch),
            target: Some(150_000.0),
        },
        Row {
            workload: "100-INSERT batch".into(),
            clients: 4,
            unit: "rows",
            kura: figures.batch_4,
            peer: peer_batch_rows,
            limit: Some(limit_batch),
            target: Some(150_000.0),
        },
    ];
    report::print(
        "D1 over HTTP (/query), WAL + synchronous=FULL; limit = one in-process rusqlite connection, same statements, same durability",
        &rows,
        &peer_note,
    );
    // Why the one-client INSERT's ratio swings from run to run: on this disk a commit after a
    // pause can cost many times one made right after the last, and the pause between two of a
    // one-client server's commits is its own time per request plus the client's.
    let commits: Vec<String> = after_pauses
        .iter()
        .map(|(pause, c)| format!("after {pause} µs {:.0} µs (p90 {:.0} µs)", micros(c.mean), micros(c.p90)))
        .collect();
    println!(
        "the limit's single-row commits, each after a pause of the CPU kept busy, mean: {}; \
         kura's one-client INSERT p50 is {:.0} µs beyond the commit floor's",
        commits.join(", "),
        micros(figures.insert_1.p50) - micros(figures.commit_floor_1.p50),
    );
    match in_memory {
        Some(own) => {
            let work = own.work();
            println!("{}", own.describe());
            let (floor, after_work) = (figures.commit_floor_1, figures.commit_floor_after_work_1);
            println!(
                "what this disk makes of that time: the commit floor doing {:.1} µs of work before each commit \
                 served {:.0}/s against its {:.0}/s without ({:.2}×), in turns with kura; kura {:.2}× of it",
                micros(work),
                after_work.rate(),
                floor.rate(),
                after_work.rate() / floor.rate().max(1e-9),
                figures.insert_1.rate() / after_work.rate().max(1e-9),
            );
        }
        None => println!("kura's own time, apart from the disk: not measured (no /dev/shm)"),
    }
    if !peer_figures.is_empty() {
        match worker::workerd() {
            Some(workerd) => {
                eprintln!("running the peer's workloads in a Worker bound to kura…");
                let kura = Kura::start(&scratch.path().join("worker"), true)?;
                let ops = ["d1_point_select", "d1_insert_single", "d1_batch_100"];
                let measured = client_runtime.block_on(async {
                    let client = create_database(&kura.base, "worker").await?;
                    client.post(&json!({ "sql": KV_TABLE })).await;
                    worker::run(&workerd, &kura.api_host(), TOKEN, "worker", &ops, settings.peer_ops).await
                });
                kura.shutdown();
                println!();
                println!(
                    "Inside a Worker: the peer's code in the peer's workerd; env.DB is workerd's own D1 binding, \
                     to kura over HTTP (kura) or to Miniflare's simulator (peer); one client, {} ops",
                    settings.peer_ops
                );
                match measured {
                    Ok(figures) => {
                        println!("{:<20} {:>10} {:>10} {:>9}", "workload", "kura/s", "peer/s", "vs peer");
                        for (op, rate) in figures {
                            let peer = peer_rate(&op);
                            let ratio = peer.map_or("–".to_owned(), |p| format!("{:.2}×", rate / p));
                            // Every op counts rows: a batch of 100 is 100.
                            println!(
                                "{:<20} {:>10.0} {:>10} {:>9}",
                                if op == "d1_batch_100" { "d1_batch_100 (rows)" } else { op.as_str() },
                                rate,
                                peer.map_or("–".to_owned(), |p| format!("{p:.0}")),
                                ratio
                            );
                        }
                    }
                    Err(e) => println!("not measured: {e}"),
                }
            }
            None => println!("\nInside a Worker: not measured (the peer's workerd is not installed)"),
        }
    }
    if let Some(costs) = log_cost {
        println!();
        println!("Time Travel's log on durable INSERTs: the same server with capture on and off, measured alternately");
        for (clients, with, without) in costs {
            println!(
                "  {clients:>2} client(s): {with:.0}/s with the log, {without:.0}/s without: the log costs {:+.1}%",
                (without / with - 1.0) * 100.0
            );
        }
    }
    Ok(())
}

#[derive(Default)]
struct KuraFigures {
    floor_1: Stats,
    floor_16: Stats,
    select_16: Stats,
    select_1: Stats,
    insert_1: Stats,
    /// One client's single-row writes to [`FloorServer::commit`], in turns with `insert_1`.
    commit_floor_1: Stats,
    /// The same, each after kura's own time per request of work (`/commit/{µs}`), in the same turns.
    commit_floor_after_work_1: Stats,
    insert_16: Stats,
    batch_1: Stats,
    batch_4: Stats,
}

impl KuraFigures {
    fn measured(&self) -> Vec<(&'static str, Stats)> {
        [
            ("floor1", self.floor_1),
            ("floor16", self.floor_16),
            ("select16", self.select_16),
            ("select1", self.select_1),
            ("insert1", self.insert_1),
            ("commitfloor1", self.commit_floor_1),
            ("insert16", self.insert_16),
            ("batch1", self.batch_1),
            ("batch4", self.batch_4),
        ]
        .into_iter()
        .filter(|(_, s)| s.units > 0)
        .collect()
    }
}

/// INSERT throughput with the log and without, at 1 and 16 clients. The machine is noisy, so the
/// two servers take turns in one-second slices and the slices are summed.
async fn measure_log_cost(with: &str, without: &str, duration: Duration) -> anyhow::Result<Vec<(usize, f64, f64)>> {
    let clients = [prepare(with).await?, Client { history: false, ..prepare(without).await? }];
    let slices = duration.as_secs().max(2) as usize;
    let next_id = Arc::new(AtomicI64::new(1_000_000));
    let mut out = Vec::new();
    for threads in [1usize, 16] {
        let mut totals = [(0u64, Duration::ZERO); 2];
        for _ in 0..slices {
            for (i, client) in clients.iter().enumerate() {
                let stats = insert_load(client, &next_id, threads, Duration::from_secs(1)).await;
                totals[i].0 += stats.units;
                totals[i].1 += stats.elapsed;
            }
        }
        let rate = |(units, elapsed): (u64, Duration)| units as f64 / elapsed.as_secs_f64();
        out.push((threads, rate(totals[0]), rate(totals[1])));
    }
    Ok(out)
}

/// kura's one-client INSERT beside the commit floor's with both on tmpfs, where a commit
/// flushes nothing: what is left of the difference is kura's own time per request.
struct OwnTime {
    kura: Rate,
    floor: Rate,
    /// The difference per request in each one-second round of turns.
    rounds: Vec<Duration>,
}

/// Requests over wall time, summed over rounds.
#[derive(Default)]
struct Rate {
    units: u64,
    elapsed: Duration,
}

impl Rate {
    fn add(&mut self, stats: &Stats) {
        self.units += stats.units;
        self.elapsed += stats.elapsed;
    }

    fn per_second(&self) -> f64 {
        self.units as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

impl OwnTime {
    /// The median round's difference: a second in which the machine's neighbours took a core
    /// from one of the two moves the sum far more than the median.
    fn median(&self) -> Duration {
        let mut rounds = self.rounds.clone();
        rounds.sort_unstable();
        rounds.get(rounds.len() / 2).copied().unwrap_or_default()
    }

    /// The work the commit floor does per request to stand for kura's own time: the median,
    /// in whole microseconds, as its `/commit/{µs}` takes it.
    fn work(&self) -> Duration {
        Duration::from_micros(micros(self.median()).round() as u64)
    }

    fn describe(&self) -> String {
        let rounds: Vec<String> = self.rounds.iter().map(|d| format!("{:.1}", micros(*d))).collect();
        format!(
            "kura's own time, apart from the disk (both on tmpfs, where a commit flushes nothing, in turns): \
             kura's one-client INSERT {:.0}/s against the commit floor's {:.0}/s ({:.2}×); per request, \
             {:.1} µs more in the median one-second round (rounds: {} µs)",
            self.kura.per_second(),
            self.floor.per_second(),
            self.kura.per_second() / self.floor.per_second().max(1e-9),
            micros(self.median()),
            rounds.join(", "),
        )
    }
}

/// The one-client INSERT in turns with the commit floor as `measure_kura` takes it, both
/// servers on tmpfs (`/dev/shm`): kura's own time per request, which on a disk whose flush
/// slows after a pause decides how much the disk adds (`None` without `/dev/shm`).
fn measure_in_memory(client_runtime: &tokio::runtime::Runtime, duration: Duration) -> anyhow::Result<Option<OwnTime>> {
    let Ok(memory) = tempfile::tempdir_in("/dev/shm") else { return Ok(None) };
    eprintln!("measuring the one-client INSERT with the commit floor on tmpfs, in turns…");
    let kura = Kura::start(&memory.path().join("kura"), true).context("starting kura on tmpfs")?;
    let floor_server =
        FloorServer::commit(&memory.path().join("commit-floor")).context("starting the commit floor on tmpfs")?;
    let measured = client_runtime.block_on(async {
        let client = prepare(&kura.base).await?;
        let next_id = Arc::new(AtomicI64::new(1_000_000));
        let floor = client.elsewhere(&format!("{}/commit", floor_server.base));
        let mut own = OwnTime { kura: Rate::default(), floor: Rate::default(), rounds: Vec::new() };
        for round in 0..duration.as_secs().max(1) {
            // Each goes first in every other round, as in longer turns.
            let second = Duration::from_secs(1);
            let [kura, floor] = match round % 2 {
                0 => one_client_inserts_in_turns([&client, &floor], &next_id, second).await,
                _ => {
                    let [floor, kura] = one_client_inserts_in_turns([&floor, &client], &next_id, second).await;
                    [kura, floor]
                }
            };
            own.kura.add(&kura);
            own.floor.add(&floor);
            own.rounds.push(own_time_per_request(&kura, &floor));
        }
        anyhow::Ok(own)
    })?;
    drop(floor_server);
    kura.shutdown();
    Ok(Some(measured))
}

/// What kura spends per request beyond the commit floor, from the two measured in turns; at most
/// a millisecond, so a round in which one of them did nothing cannot make the pause endless.
fn own_time_per_request(kura: &Stats, floor: &Stats) -> Duration {
    let per_request = |s: &Stats| 1.0 / s.rate().max(1e-9);
    Duration::from_secs_f64((per_request(kura) - per_request(floor)).clamp(0.0, 1e-3))
}

/// One client's single-row INSERTs to each of `servers` in turns: the ratios are the figures
/// that count.
async fn one_client_inserts_in_turns<const N: usize>(
    servers: [&Client; N],
    next_id: &Arc<AtomicI64>,
    duration: Duration,
) -> [Stats; N] {
    load::alternately(duration, |i, slice| insert_load_timed(servers[i], next_id, 1, slice)).await
}

/// Single-row durable INSERTs from `clients` concurrent clients.
async fn insert_load(client: &Client, next_id: &Arc<AtomicI64>, clients: usize, duration: Duration) -> Stats {
    let (latencies, units, elapsed) = insert_load_timed(client, next_id, clients, duration).await;
    Stats::from_latencies(latencies, units, elapsed)
}

/// [`insert_load`], answering [`load::run_timed`]'s figures.
async fn insert_load_timed(
    client: &Client,
    next_id: &Arc<AtomicI64>,
    clients: usize,
    duration: Duration,
) -> (Vec<Duration>, u64, Duration) {
    let (sender, next_id) = (client.clone(), Arc::clone(next_id));
    let inserted = load::run_timed(clients, duration, move |_, _| {
        let (client, id) = (sender.clone(), next_id.fetch_add(1, Ordering::Relaxed));
        async move {
            client.send(format!(r#"{{"sql":"INSERT INTO kv (id, v) VALUES (?, ?)","params":[{id},"w"]}}"#)).await;
            1
        }
    })
    .await;
    load::then_timed(inserted, client.capture_history()).await
}

/// The pauses before a commit at which the limit's commit is measured (see `run`).
const COMMIT_PAUSES_US: [u64; 4] = [0, 25, 50, 100];

const KV_TABLE: &str = "CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT, version INTEGER NOT NULL DEFAULT 0)";

/// Creates a database on a server; answers a client for its `/query`.
async fn create_database(base: &str, name: &str) -> anyhow::Result<Client> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build()?;
    let created: Json = http.post(base).bearer_auth(TOKEN).json(&json!({ "name": name })).send().await?.json().await?;
    let Some(uuid) = created["result"]["uuid"].as_str() else { bail!("cannot create the database: {created}") };
    Ok(Client { http, query: format!("{base}/{uuid}/query").into(), uuid: uuid.into(), history: true })
}

/// Creates the benchmark's database on a server and fills it with `ROWS` rows.
pub(crate) async fn prepare(base: &str) -> anyhow::Result<Client> {
    let client = create_database(base, "bench").await?;
    client.post(&json!({ "sql": KV_TABLE })).await;
    for chunk in 0..ROWS / 100 {
        let batch: Vec<Json> = (0..100)
            .map(|j| json!({ "sql": "INSERT INTO kv (id, v) VALUES (?, ?)", "params": [chunk * 100 + j, format!("value-{}", chunk * 100 + j)] }))
            .collect();
        client.post(&json!({ "batch": batch })).await;
    }
    Ok(client)
}

/// kura's workloads; the one-client INSERT in turns with the commit floor at `commit_floor`
/// (its base address), as is and, when kura's own time was measured, after that much work per
/// request.
async fn measure_kura(
    base: &str,
    commit_floor: &str,
    own_time: Option<Duration>,
    duration: Duration,
    only: &[String],
) -> anyhow::Result<KuraFigures> {
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    let mut figures = KuraFigures::default();
    let client = prepare(base).await?;

    eprintln!("measuring kura…");
    let health = base.split("/client/v4").next().unwrap_or_default().to_owned() + "/healthz";
    let select = |clients, slice| {
        let client = client.clone();
        load::run_timed(clients, slice, move |c, n| {
            let client = client.clone();
            async move {
                let id = ((c as i64 * 104_729 + n as i64 * 7919) % ROWS).abs();
                client.send(format!(r#"{{"sql":"SELECT * FROM kv WHERE id = ?","params":[{id}]}}"#)).await;
                1
            }
        })
    };
    let floor = |clients, slice| load::http_floor_timed(&client.http, &health, clients, slice);
    // A point SELECT and the same server's floor, in turns: their ratio is the target's.
    for (clients, select_name, floor_name) in [(16, "select16", "floor16"), (1, "select1", "floor1")] {
        let (kura, floor) = if wanted(select_name) {
            let [kura, floor] = load::alternately(duration, |i, slice| {
                let (select, floor) = (select(clients, slice), floor(clients, slice));
                async move { if i == 0 { select.await } else { floor.await } }
            })
            .await;
            (kura, floor)
        } else if wanted(floor_name) {
            let [floor] = load::alternately(duration, |_, slice| floor(clients, slice)).await;
            (Stats::default(), floor)
        } else {
            continue;
        };
        if clients == 16 {
            (figures.select_16, figures.floor_16) = (kura, floor);
        } else {
            (figures.select_1, figures.floor_1) = (kura, floor);
        }
    }

    let next_id = Arc::new(AtomicI64::new(1_000_000));
    let insert = |clients| insert_load(&client, &next_id, clients, duration);
    if wanted("insert1") {
        let floor = client.elsewhere(&format!("{commit_floor}/commit"));
        match own_time {
            Some(work) => {
                let after_work = client.elsewhere(&format!("{commit_floor}/commit/{}", work.as_micros()));
                [figures.insert_1, figures.commit_floor_1, figures.commit_floor_after_work_1] =
                    one_client_inserts_in_turns([&client, &floor, &after_work], &next_id, duration).await;
            }
            None => {
                [figures.insert_1, figures.commit_floor_1] =
                    one_client_inserts_in_turns([&client, &floor], &next_id, duration).await;
            }
        }
    }
    if wanted("insert16") {
        figures.insert_16 = insert(16).await;
    }

    let batch = |clients| {
        let (client, next_id) = (client.clone(), Arc::clone(&next_id));
        load::run(clients, duration, move |_, _| {
            let (client, first) = (client.clone(), next_id.fetch_add(100, Ordering::Relaxed));
            async move {
                let statements: Vec<String> = (0..100)
                    .map(|j| {
                        format!(r#"{{"sql":"INSERT INTO kv (id, v) VALUES (?, ?)","params":[{},"b"]}}"#, first + j)
                    })
                    .collect();
                client.send(format!(r#"{{"batch":[{}]}}"#, statements.join(","))).await;
                100
            }
        })
    };
    if wanted("batch1") {
        figures.batch_1 = batch(1).await;
    }
    if wanted("batch4") {
        figures.batch_4 = batch(4).await;
    }
    Ok(figures)
}
