//! The Workers suite: one Worker (`workers_bench.js`) deployed to kura through the v4 API and
//! run in the workerd kura supervises, beside the same Worker under Miniflare (what
//! `wrangler dev` runs), both driven over HTTP at 16 clients: a constant answer (the Worker's
//! own floor), one D1 point SELECT, one R2 1 KiB GET, one Durable Object call, one 4 KiB static
//! asset (served before the Worker on both sides). Then, on kura, the constant with a real
//! `wrangler tail` attached, and how late Cron Trigger handlers start. Then the memory of each
//! side with the Worker idle.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value as Json, json};

use crate::load::{self, Stats};
use crate::report::{self, Row};
use crate::server::{ACCOUNT, Kura, TOKEN};
use crate::{Settings, peer};

const SCRIPT: &str = include_str!("workers_bench.js");
const PEER_SCRIPT: &str = include_str!("workers_peer.mjs");
const CLIENTS: usize = 16;
/// Rounds per workload and side.
const ROUNDS: usize = 3;

/// The workerd kura runs Workers in: `KURA_WORKERD`, else the one `scripts/test` installs.
pub(crate) fn workerd() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("KURA_WORKERD") {
        return Some(PathBuf::from(path));
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/compat/node_modules/workerd/bin/workerd");
    path.is_file().then_some(path)
}

/// Where a side serves the Worker.
#[derive(Clone)]
pub(crate) struct Target {
    http: reqwest::Client,
    base: String,
    host: Option<&'static str>,
}

impl Target {
    /// kura's Workers listener at `base`, reaching the Worker by `host`.
    pub(crate) fn new(http: reqwest::Client, base: &str, host: &'static str) -> Target {
        Target { http, base: base.to_owned(), host: Some(host) }
    }

    pub(crate) async fn get(&self, path: &str) -> anyhow::Result<String> {
        let mut request = self.http.get(format!("{}{path}", self.base));
        if let Some(host) = self.host {
            request = request.header("host", host);
        }
        let response = request.send().await?;
        let status = response.status();
        let body = response.text().await?;
        if !status.is_success() {
            bail!("GET {path}: {status} {body}");
        }
        Ok(body)
    }

    /// Waits up to 30 s for `path` to answer successfully (a node following a deploy, or a
    /// setting), failing with `what` if it never does.
    pub(crate) async fn wait_for(&self, path: &str, what: &str) -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while self.get(path).await.is_err() {
            anyhow::ensure!(std::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// `CLIENTS` clients on `path` for `duration`: the stats of the requests that succeeded,
    /// and how many failed (the peer drops connections under this load now and then; a
    /// failure on kura's side is a bug and stops the benchmark).
    pub(crate) async fn measure(&self, path: &'static str, duration: Duration) -> (Stats, u64) {
        let target = self.clone();
        let failures = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let failed = std::sync::Arc::clone(&failures);
        let stats = load::run(CLIENTS, duration, move |client, n| {
            let (target, failed) = (target.clone(), std::sync::Arc::clone(&failed));
            async move {
                let i = client as u64 * 100_003 + n;
                match target.get(&format!("{path}?i={i}")).await {
                    Ok(_) => 1,
                    Err(e) if target.host.is_some() => panic!("a benchmark request to kura failed: {e:?}"),
                    Err(_) => {
                        failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        0
                    }
                }
            }
        })
        .await;
        (stats, failures.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// The static asset both sides serve: 4 KiB of text.
fn asset() -> Vec<u8> {
    (0..4096).map(|i| b'a' + (i % 26) as u8).collect()
}

/// The metadata wrangler would send with the benchmark's Worker.
fn bench_metadata(database: &str, namespace: &str, assets_jwt: &str) -> Json {
    json!({
        "assets": {"jwt": assets_jwt, "config": {}},
        "main_module": "index.js",
        "compatibility_date": "2025-04-01",
        "bindings": [
            {"name": "DB", "type": "d1", "id": database},
            {"name": "FILES", "type": "r2_bucket", "bucket_name": "bench-files"},
            {"name": "CACHE", "type": "kv_namespace", "namespace_id": namespace},
            {"name": "Q", "type": "queue", "queue_name": "bench-q"},
            {"name": "ROOMS", "type": "durable_object_namespace", "class_name": "Room"},
        ],
        "migrations": {"new_tag": "v1", "steps": [{"new_sqlite_classes": ["Room"]}]},
    })
}

/// Deploys `script` as the Worker `bench` with `metadata`, through the account's v4 URL
/// `accounts`.
async fn put_worker(http: &reqwest::Client, accounts: &str, metadata: &Json, script: &str) -> anyhow::Result<()> {
    put_worker_named(http, accounts, "bench", metadata, script).await
}

async fn put_worker_named(
    http: &reqwest::Client,
    accounts: &str,
    name: &str,
    metadata: &Json,
    script: &str,
) -> anyhow::Result<()> {
    let (content_type, body) = module_upload(metadata, script);
    let deployed: Json = http
        .put(format!("{accounts}/workers/scripts/{name}"))
        .bearer_auth(TOKEN)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await?
        .json()
        .await?;
    anyhow::ensure!(deployed["success"] == true, "deploying the Worker: {deployed}");
    Ok(())
}

/// The multipart form of a one-module upload: `metadata`, then `script` as `index.js`.
fn module_upload(metadata: &Json, script: &str) -> (String, Vec<u8>) {
    let boundary = "kura-bench-boundary-0123456789";
    let mut body = Vec::new();
    body.extend(
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n{metadata}\r\n").as_bytes(),
    );
    body.extend(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"index.js\"; filename=\"index.js\"\r\n\
             Content-Type: application/javascript+module\r\n\r\n{script}\r\n--{boundary}--\r\n"
        )
        .as_bytes(),
    );
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// Creates the database `bench-select` with 1,000 rows in `kv` and deploys `script` as the
/// Worker `bench`, bound to it as `DB`, on the kura whose API is `api`.
pub(crate) async fn deploy_select_worker(api: &str, script: &str) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let accounts = format!("{api}/client/v4/accounts/{ACCOUNT}");
    let db: Json = http
        .post(format!("{accounts}/d1/database"))
        .bearer_auth(TOKEN)
        .json(&json!({"name": "bench-select"}))
        .send()
        .await?
        .json()
        .await?;
    let uuid = db["result"]["uuid"].as_str().context("creating the database")?.to_owned();
    let rows: Vec<String> = (0..1000).map(|i| format!("({i}, 'value {i}')")).collect();
    let sql = format!("CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO kv VALUES {};", rows.join(","));
    let filled: Json = http
        .post(format!("{accounts}/d1/database/{uuid}/query"))
        .bearer_auth(TOKEN)
        .json(&json!({ "sql": sql }))
        .send()
        .await?
        .json()
        .await?;
    anyhow::ensure!(filled["success"] == true, "filling the database: {filled}");
    let metadata = json!({
        "main_module": "index.js",
        "compatibility_date": "2025-04-01",
        "bindings": [{"name": "DB", "type": "d1", "id": uuid}],
    });
    put_worker(&http, &accounts, &metadata, script).await
}

/// Deploys `script` as the Worker `objects`, with its Durable Object class `Counter` bound as
/// `COUNTERS`, on the kura whose API is `api`.
pub(crate) async fn deploy_object_worker(api: &str, script: &str) -> anyhow::Result<()> {
    let accounts = format!("{api}/client/v4/accounts/{ACCOUNT}");
    let metadata = json!({
        "main_module": "index.js",
        "compatibility_date": "2025-04-01",
        "bindings": [{"name": "COUNTERS", "type": "durable_object_namespace", "class_name": "Counter"}],
        "migrations": {"new_tag": "v1", "steps": [{"new_sqlite_classes": ["Counter"]}]},
    });
    put_worker_named(&reqwest::Client::new(), &accounts, "objects", &metadata, script).await
}

/// Creates the database, bucket and KV namespace and deploys the Worker on kura's v4 API.
async fn deploy(api: &str) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let accounts = format!("{api}/client/v4/accounts/{ACCOUNT}");
    let call =
        |method: reqwest::Method, path: &str| http.request(method, format!("{accounts}{path}")).bearer_auth(TOKEN);
    let db: Json = call(reqwest::Method::POST, "/d1/database")
        .json(&json!({"name": "bench-workers"}))
        .send()
        .await?
        .json()
        .await?;
    let uuid = db["result"]["uuid"].as_str().context("creating the database")?.to_owned();
    let bucket: Json =
        call(reqwest::Method::POST, "/r2/buckets").json(&json!({"name": "bench-files"})).send().await?.json().await?;
    anyhow::ensure!(bucket["success"] == true, "creating the bucket: {bucket}");
    let namespace: Json = call(reqwest::Method::POST, "/storage/kv/namespaces")
        .json(&json!({"title": "bench-cache"}))
        .send()
        .await?
        .json()
        .await?;
    let namespace = namespace["result"]["id"].as_str().context("creating the KV namespace")?.to_owned();
    let queue: Json =
        call(reqwest::Method::POST, "/queues").json(&json!({"queue_name": "bench-q"})).send().await?.json().await?;
    let queue = queue["result"]["queue_id"].as_str().context("creating the queue")?.to_owned();
    // The asset, through wrangler's upload session.
    let asset = asset();
    let encoded = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &asset);
    let hash = kura_workers::assets::hash_of(encoded.as_bytes(), "txt");
    let session: Json = call(reqwest::Method::POST, "/workers/scripts/bench/assets-upload-session")
        .json(&json!({"manifest": {"/asset.txt": {"hash": hash, "size": asset.len()}}}))
        .send()
        .await?
        .json()
        .await?;
    let mut jwt = session["result"]["jwt"].as_str().context("starting the asset upload")?.to_owned();
    if session["result"]["buckets"].as_array().is_some_and(|b| !b.is_empty()) {
        let boundary = "kura-bench-asset-boundary";
        let form = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{hash}\"; filename=\"{hash}\"\r\n\
             Content-Type: text/plain\r\n\r\n{encoded}\r\n--{boundary}--\r\n"
        );
        let uploaded: Json = http
            .post(format!("{accounts}/workers/assets/upload?base64=true"))
            .bearer_auth(&jwt)
            .header("content-type", format!("multipart/form-data; boundary={boundary}"))
            .body(form)
            .send()
            .await?
            .json()
            .await?;
        jwt = uploaded["result"]["jwt"].as_str().context("uploading the asset")?.to_owned();
    }
    put_worker(&http, &accounts, &bench_metadata(&uuid, &namespace, &jwt), SCRIPT).await?;
    // The Worker consumes the queue as `[[queues.consumers]]` with max_batch_size = 100 and
    // max_batch_timeout = 1 registers it.
    let consumer: Json = call(reqwest::Method::POST, &format!("/queues/{queue}/consumers"))
        .json(&json!({"type": "worker", "script_name": "bench", "settings": {"batch_size": 100, "max_wait_time_ms": 1000}}))
        .send()
        .await?
        .json()
        .await?;
    anyhow::ensure!(consumer["success"] == true, "registering the consumer: {consumer}");
    Ok(())
}

/// Queues end to end: `batches` batches of 100 messages sent by `CLIENTS` clients through the
/// Worker's `sendBatch`, timed until the consumer has recorded all of them; answers messages
/// per second and the p50 and p99 of send-to-delivery.
async fn queue_throughput(target: &Target, run: &str, batches: usize) -> anyhow::Result<(f64, f64, f64)> {
    let started = std::time::Instant::now();
    let sends = (0..CLIENTS).map(|client| {
        let target = target.clone();
        let run = run.to_owned();
        async move {
            for _ in (client..batches).step_by(CLIENTS) {
                target.get(&format!("/q-send?n=100&run={run}")).await?;
            }
            anyhow::Ok(())
        }
    });
    for sent in futures_util::future::join_all(sends).await {
        sent?;
    }
    let want = batches * 100;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let stats: Json = serde_json::from_str(&target.get(&format!("/q-stats?run={run}")).await?)?;
        let delivered = stats["delivered"].as_u64().unwrap_or(0) as usize;
        if delivered >= want {
            let elapsed = started.elapsed().as_secs_f64();
            let mut delays: Vec<f64> =
                stats["delays"].as_array().into_iter().flatten().filter_map(Json::as_f64).collect();
            delays.sort_by(f64::total_cmp);
            let at = |q: f64| delays.get(((delays.len() - 1) as f64 * q).round() as usize).copied().unwrap_or(0.0);
            return Ok((want as f64 / elapsed, at(0.5), at(0.99)));
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "{delivered} of {want} messages delivered in 2 minutes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One message at a time, each after the last was delivered: the send-to-delivery delay a lone
/// message sees (its batch waits max_batch_timeout for company). Answers the p50 in ms.
async fn queue_lone_delay(target: &Target, run: &str, messages: usize) -> anyhow::Result<f64> {
    for k in 0..messages {
        target.get(&format!("/q-send?n=1&run={run}")).await?;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let stats: Json = serde_json::from_str(&target.get(&format!("/q-stats?run={run}")).await?)?;
            if stats["delivered"].as_u64().unwrap_or(0) as usize > k {
                break;
            }
            anyhow::ensure!(std::time::Instant::now() < deadline, "a lone message was not delivered in 30 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let stats: Json = serde_json::from_str(&target.get(&format!("/q-stats?run={run}")).await?)?;
    let mut delays: Vec<f64> = stats["delays"].as_array().into_iter().flatten().filter_map(Json::as_f64).collect();
    delays.sort_by(f64::total_cmp);
    Ok(delays.get(delays.len() / 2).copied().unwrap_or(0.0))
}

/// wrangler as `scripts/test` installs it.
fn wrangler() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/compat/node_modules/.bin/wrangler");
    path.is_file().then_some(path)
}

/// The constant Worker's throughput with one `wrangler tail --format json` attached (its
/// output read and thrown away), against `floor`, measured without.
fn tail_overhead(
    api: &str,
    target: &Target,
    runtime: &tokio::runtime::Runtime,
    duration: Duration,
    floor: Stats,
) -> anyhow::Result<String> {
    let wrangler = wrangler().context("no wrangler: run scripts/test once (it installs it into target/compat)")?;
    let home = tempfile::tempdir()?;
    let mut child = Command::new(wrangler)
        .args(["tail", "bench", "--format", "json"])
        .current_dir(home.path())
        .env("CLOUDFLARE_API_BASE_URL", format!("{api}/client/v4"))
        .env("CLOUDFLARE_API_TOKEN", TOKEN)
        .env("CLOUDFLARE_ACCOUNT_ID", ACCOUNT)
        .env("WRANGLER_SEND_METRICS", "false")
        .env("HOME", home.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting wrangler tail")?;
    let stdout = child.stdout.take().expect("piped");
    let (seen_tx, seen_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let mut bytes = 0usize;
        while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
            if bytes == 0 {
                let _ = seen_tx.send(());
            }
            bytes += line.len();
            line.clear();
        }
        bytes
    });
    // Attached once an event comes through.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        runtime.block_on(target.get("/const"))?;
        if seen_rx.recv_timeout(Duration::from_millis(200)).is_ok() {
            break;
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "the tail printed no event within a minute");
    }
    let cpu_before = cpu_seconds(child.id());
    let started = std::time::Instant::now();
    let mut rounds: Vec<Stats> = (0..ROUNDS).map(|_| runtime.block_on(target.measure("/const", duration)).0).collect();
    let wrangler_cores = (cpu_seconds(child.id()) - cpu_before) / started.elapsed().as_secs_f64();
    rounds.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
    let with_tail = rounds[rounds.len() / 2];
    // SAFETY: kill(2) on a child this process started and has not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let _ = child.wait();
    let printed = reader.join().unwrap_or(0);
    let ratio = with_tail.rate() / floor.rate().max(f64::MIN_POSITIVE);
    Ok(format!(
        "Worker answering a constant with one wrangler tail attached: {:.0}/s (p50 {:.2} ms, p99 {:.2} ms) = {ratio:.2}× without (target ≥ 0.90×, {}); the tail printed {:.1} MiB, and wrangler itself (Node, printing JSON) used {:.2} of this machine's {} cores meanwhile",
        with_tail.rate(),
        with_tail.p50.as_secs_f64() * 1e3,
        with_tail.p99.as_secs_f64() * 1e3,
        if ratio >= 0.9 { "✓" } else { "✗" },
        printed as f64 / 1024.0 / 1024.0,
        wrangler_cores,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    ))
}

/// CPU seconds a process and its descendants (wrangler runs as `node`) have used, from /proc.
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    cpu_ticks(pid) as f64 / per_second
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    // utime, stime, cutime, cstime: fields 14–17 of stat(5), 12–15 after the name.
    let own: u64 = fields.get(11..15).map_or(0, |f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum());
    own + children(pid).into_iter().map(cpu_ticks).sum::<u64>()
}

/// The processes whose parent is `pid` (from /proc).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let child = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let parent = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse::<u32>().ok()?;
            (parent == pid).then_some(child)
        })
        .collect()
}

/// Fires the Worker's `scheduled` handler `RUNS` times, each for the moment it is asked
/// (as kura's minute loop does when it wakes on the minute), and reports how late each
/// handler started after that time, as the handler itself measured it.
async fn cron_lateness(api: &str, target: &Target) -> anyhow::Result<String> {
    const RUNS: usize = 100;
    let http = reqwest::Client::new();
    let url = format!("{api}/client/v4/accounts/{ACCOUNT}/workers/scripts/bench/schedules/trigger");
    for _ in 0..RUNS {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64;
        let run: Json = http
            .post(&url)
            .bearer_auth(TOKEN)
            .json(&json!({"cron": "* * * * *", "scheduledTime": now}))
            .send()
            .await?
            .json()
            .await?;
        anyhow::ensure!(run["result"]["outcome"] == "ok", "a scheduled run failed: {run}");
    }
    let mut lateness: Vec<i64> = serde_json::from_str(&target.get("/lateness").await?)?;
    anyhow::ensure!(lateness.len() >= RUNS, "{} runs recorded of {RUNS}", lateness.len());
    lateness.sort_unstable();
    let at = |q: f64| lateness[((lateness.len() - 1) as f64 * q).round() as usize];
    let (p50, p99) = (at(0.5), at(0.99));
    Ok(format!(
        "cron lateness, scheduled time to the handler's start, {} runs: p50 {p50} ms (target ≤ 50 {}), p99 {p99} ms (target ≤ 500 {}), max {} ms",
        lateness.len(),
        if p50 <= 50 { "✓" } else { "✗" },
        if p99 <= 500 { "✓" } else { "✗" },
        lateness.last().copied().unwrap_or(0)
    ))
}

/// Miniflare serving the Worker; stopped when dropped.
struct MiniflarePeer {
    child: Child,
    url: String,
    pid: u32,
}

impl Drop for MiniflarePeer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn start_peer(persist: &Path) -> Result<MiniflarePeer, String> {
    let dir = peer::install()?;
    std::fs::write(dir.join("workers_peer.mjs"), PEER_SCRIPT).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("workers_bench.js"), SCRIPT).map_err(|e| e.to_string())?;
    let assets = persist.join("assets");
    std::fs::create_dir_all(&assets).map_err(|e| e.to_string())?;
    std::fs::write(assets.join("asset.txt"), asset()).map_err(|e| e.to_string())?;
    let mut child = Command::new("node")
        .arg(dir.join("workers_peer.mjs"))
        .arg(persist)
        .arg(dir.join("workers_bench.js"))
        .arg(&assets)
        .current_dir(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("node: {e}"))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line).map_err(|e| e.to_string())?;
    let ready: Json = serde_json::from_str(&line).map_err(|_| format!("the peer did not start: {line}"))?;
    let url = ready["url"].as_str().ok_or("the peer printed no URL")?.trim_end_matches('/').to_owned();
    let pid = ready["pid"].as_u64().unwrap_or(0) as u32;
    Ok(MiniflarePeer { child, url, pid })
}

/// Resident bytes of a process and its descendants but `except`'s (from /proc; 0 where it
/// cannot say).
fn tree_resident_bytes(pid: u32, except: u32) -> u64 {
    let resident = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            })
            .map_or(0, |kb| kb * 1024)
    };
    resident(pid)
        + children(pid)
            .into_iter()
            .filter(|child| *child != except)
            .map(|c| tree_resident_bytes(c, except))
            .sum::<u64>()
}

pub fn run(settings: &Settings) -> anyhow::Result<()> {
    let Some(workerd) = workerd() else {
        bail!(
            "no workerd: run scripts/test once (it installs wrangler's workerd into target/compat), or set KURA_WORKERD"
        );
    };
    let scratch = settings.scratch_dir()?;
    let duration = Duration::from_secs_f64(settings.seconds);
    let kura = Kura::start_with_workers(&scratch.path().join("kura"), &workerd).context("starting kura")?;
    let client_runtime = crate::load::client_runtime()?;
    let api = kura.base.split("/client/v4").next().unwrap_or_default().to_owned();
    let http = reqwest::Client::new();
    let kura_target =
        Target { http: http.clone(), base: kura.workers.clone().expect("Workers run"), host: Some("bench.localhost") };
    client_runtime.block_on(async {
        deploy(&api).await?;
        kura_target.get("/setup").await?;
        anyhow::Ok(())
    })?;
    let peer = if settings.no_peer {
        Err("skipped (--no-peer)".to_owned())
    } else {
        eprintln!("starting the peer (Miniflare serving the same Worker)…");
        start_peer(&scratch.path().join("peer"))
    };
    let peer_target = match &peer {
        Ok(p) => {
            let target = Target { http: http.clone(), base: p.url.clone(), host: None };
            client_runtime.block_on(target.get("/setup"))?;
            Some(target)
        }
        Err(_) => None,
    };

    // Idle memory first, before the load has warmed anything up.
    std::thread::sleep(Duration::from_secs(2));
    let peer_pid = peer.as_ref().map_or(0, |p| p.pid);
    // The peer is this process's child too: its tree is counted apart.
    let kura_memory = tree_resident_bytes(std::process::id(), peer_pid);
    let kura_alone = crate::memory::resident_bytes().0;
    let peer_memory = peer.as_ref().ok().map(|p| tree_resident_bytes(p.pid, 0));

    // `--only requests,queues,tail,cron` picks parts.
    let wanted = |part: &str| settings.only.is_empty() || settings.only.iter().any(|o| o == part);
    let floor = if wanted("requests") {
        let workloads = [
            ("/const", "Worker answering a constant"),
            ("/d1", "one D1 point SELECT"),
            ("/r2", "one R2 1 KiB GET"),
            ("/do", "one Durable Object call"),
            ("/asset.txt", "a static asset (4 KiB)"),
            ("/kv", "one KV 1 KiB get"),
            ("/kv-put", "one KV 1 KiB put"),
        ];
        // The machine is shared: each workload runs three rounds, kura and the peer alternating,
        // and each side's median round is reported.
        let median = |mut rounds: Vec<Stats>| {
            rounds.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
            rounds[rounds.len() / 2]
        };
        let mut measured = Vec::new();
        let mut peer_failures = 0;
        for (path, _) in workloads {
            eprintln!("measuring {path}…");
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                ours.push(client_runtime.block_on(kura_target.measure(path, duration)).0);
                if let Some(target) = &peer_target {
                    let (stats, failed) = client_runtime.block_on(target.measure(path, duration));
                    peer_failures += failed;
                    theirs.push(stats);
                }
            }
            measured.push((median(ours), (!theirs.is_empty()).then(|| median(theirs))));
        }
        let floor = measured[0].0;
        let targets = [None, Some(3.0), Some(3.0), Some(1.0), Some(3.0), Some(3.0), Some(3.0)];
        let rows: Vec<Row> = workloads
            .iter()
            .zip(&measured)
            .zip(targets)
            .map(|(((_, name), (ours, theirs)), times)| Row {
                workload: (*name).into(),
                clients: CLIENTS,
                unit: "requests",
                kura: *ours,
                peer: theirs.map(|t| t.rate()),
                limit: Some(floor),
                target: times.zip(*theirs).map(|(k, t)| k * t.rate()),
            })
            .collect();
        let note = match &peer {
            Ok(_) => format!(
                "Miniflare {} serving the same Worker over HTTP, {CLIENTS} clients; the median of {ROUNDS} alternating rounds per side",
                "4.20260730.0"
            ),
            Err(why) => format!("not measured: {why}"),
        };
        report::print(
            "Workers: HTTP requests to one deployed Worker through kura's Workers listener and workerd; \
             limit = the same Worker answering a constant (the Worker's own floor); target = 3× the peer (D1, R2, assets, KV; assets also ≥ 0.7× the limit, KV gets ≥ 0.5×), 1× (Durable Objects)",
            &rows,
            &note,
        );
        if peer_failures > 0 {
            println!(
                "the peer dropped {peer_failures} requests (connection resets under load); its figures count the rest"
            );
        }
        let of_floor = |row: &Row| row.kura.rate() / floor.rate().max(f64::MIN_POSITIVE);
        println!("static asset vs the Worker's floor: {:.2}× (target ≥ 0.70×)", of_floor(&rows[4]));
        println!("KV 1 KiB get vs the Worker's floor: {:.2}× (target ≥ 0.50×)", of_floor(&rows[5]));
        Some(floor)
    } else {
        None
    };

    // Queues end to end, kura and the peer alternating.
    println!();
    if wanted("queues") {
        // 10,000 messages: Miniflare's queue broker answers 500 to sends past about that many
        // in one run (30,000 fail), so the comparison is made where both serve.
        const QUEUE_BATCHES: usize = 100;
        let mut queue_rounds = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let run = format!("t{round}");
            queue_rounds.0.push(client_runtime.block_on(queue_throughput(&kura_target, &run, QUEUE_BATCHES))?);
            if let Some(target) = &peer_target {
                match client_runtime.block_on(queue_throughput(target, &run, QUEUE_BATCHES)) {
                    Ok(measured) => queue_rounds.1.push(measured),
                    Err(e) => println!("the peer's queue round {round} failed: {e:#}"),
                }
            }
        }
        let middle = |mut rounds: Vec<(f64, f64, f64)>| {
            rounds.sort_by(|a, b| a.0.total_cmp(&b.0));
            rounds.get(rounds.len() / 2).copied()
        };
        let (ours, theirs) = (middle(queue_rounds.0), middle(queue_rounds.1));
        if let Some((rate, p50, p99)) = ours {
            let versus = theirs.map_or("peer not measured".to_owned(), |(peer_rate, peer_p50, _)| {
                format!(
                    "peer {peer_rate:.0}/s (send to delivery p50 {peer_p50:.0} ms) = {:.2}× (target ≥ 3× {})",
                    rate / peer_rate,
                    if rate >= 3.0 * peer_rate { "✓" } else { "✗" }
                )
            });
            println!(
                "queue end to end, {} messages by {CLIENTS} clients through sendBatch(100) to an acknowledged consumer batch (max_batch_size 100, max_batch_timeout 1): {rate:.0} messages/s, send to delivery p50 {p50:.0} ms, p99 {p99:.0} ms; {versus}",
                QUEUE_BATCHES * 100
            );
        }
        let lone = client_runtime.block_on(queue_lone_delay(&kura_target, "lone", 10))?;
        let peer_lone = match &peer_target {
            Some(target) => client_runtime
                .block_on(queue_lone_delay(target, "lone", 10))
                .map_or("failed".into(), |d| format!("{d:.0} ms")),
            None => "not measured".into(),
        };
        println!("a lone message, send to delivery with max_batch_timeout 1: p50 {lone:.0} ms (peer {peer_lone})");
    }

    // The same constant Worker with one real `wrangler tail` attached.
    println!();
    if let Some(floor) = floor.filter(|_| wanted("tail")) {
        match tail_overhead(&api, &kura_target, &client_runtime, duration, floor) {
            Ok(line) => println!("{line}"),
            Err(e) => println!("with one wrangler tail attached: not measured ({e:#})"),
        }
    }

    // Cron Triggers: how late each run's handler starts after its scheduled time.
    if wanted("cron") {
        match client_runtime.block_on(cron_lateness(&api, &kura_target)) {
            Ok(line) => println!("{line}"),
            Err(e) => println!("cron lateness: not measured ({e:#})"),
        }
    }
    let mib = |b: u64| b as f64 / 1024.0 / 1024.0;
    println!();
    println!("memory with the Worker idle (resident, the process and its children):");
    println!(
        "  kura + workerd: {:.0} MiB (kura, in the benchmark's process with its load generator: {:.0} MiB; workerd and its tail workers: {:.0} MiB)",
        mib(kura_memory),
        mib(kura_alone),
        mib(kura_memory.saturating_sub(kura_alone))
    );
    match peer_memory {
        Some(bytes) => println!("  peer: Node + Miniflare + its workerd: {:.0} MiB", mib(bytes)),
        None => println!("  peer: not measured"),
    }
    drop(peer);
    kura.shutdown();
    Ok(())
}
