//! The Workers suite: one Worker (`workers_bench.js`) deployed to kura through the v4 API and
//! run in the workerd kura supervises, beside the same Worker under Miniflare (what
//! `wrangler dev` runs), both driven over HTTP at 16 clients: a constant answer (the Worker's
//! own floor), one D1 point SELECT, one R2 1 KiB GET, one Durable Object call. Then the memory
//! of each side with the Worker idle.

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
fn workerd() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("KURA_WORKERD") {
        return Some(PathBuf::from(path));
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/compat/node_modules/workerd/bin/workerd");
    path.is_file().then_some(path)
}

/// Where a side serves the Worker.
#[derive(Clone)]
struct Target {
    http: reqwest::Client,
    base: String,
    host: Option<&'static str>,
}

impl Target {
    async fn get(&self, path: &str) -> anyhow::Result<String> {
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

    /// `CLIENTS` clients on `path` for `duration`: the stats of the requests that succeeded,
    /// and how many failed (the peer drops connections under this load now and then; a
    /// failure on kura's side is a bug and stops the benchmark).
    async fn measure(&self, path: &'static str, duration: Duration) -> (Stats, u64) {
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

/// The multipart upload wrangler would send for the benchmark's Worker.
fn upload_form(database: &str) -> (String, Vec<u8>) {
    let boundary = "kura-bench-boundary-0123456789";
    let metadata = json!({
        "main_module": "index.js",
        "compatibility_date": "2025-04-01",
        "bindings": [
            {"name": "DB", "type": "d1", "id": database},
            {"name": "FILES", "type": "r2_bucket", "bucket_name": "bench-files"},
            {"name": "ROOMS", "type": "durable_object_namespace", "class_name": "Room"},
        ],
        "migrations": {"new_tag": "v1", "steps": [{"new_sqlite_classes": ["Room"]}]},
    });
    let mut body = Vec::new();
    body.extend(
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n{metadata}\r\n").as_bytes(),
    );
    body.extend(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"index.js\"; filename=\"index.js\"\r\n\
             Content-Type: application/javascript+module\r\n\r\n{SCRIPT}\r\n--{boundary}--\r\n"
        )
        .as_bytes(),
    );
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// Creates the database and bucket and deploys the Worker on kura's v4 API.
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
    let (content_type, body) = upload_form(&uuid);
    let deployed: Json = call(reqwest::Method::PUT, "/workers/scripts/bench")
        .header("content-type", content_type)
        .body(body)
        .send()
        .await?
        .json()
        .await?;
    anyhow::ensure!(deployed["success"] == true, "deploying the Worker: {deployed}");
    Ok(())
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
    let mut child = Command::new("node")
        .arg(dir.join("workers_peer.mjs"))
        .arg(persist)
        .arg(dir.join("workers_bench.js"))
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
    let mut total = resident(pid);
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let parent = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if parent == Some(pid) && child != except {
            total += tree_resident_bytes(child, except);
        }
    }
    total
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

    let workloads = [
        ("/const", "Worker answering a constant"),
        ("/d1", "one D1 point SELECT"),
        ("/r2", "one R2 1 KiB GET"),
        ("/do", "one Durable Object call"),
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
    let targets = [None, Some(3.0), Some(3.0), Some(1.0)];
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
         limit = the same Worker answering a constant (the Worker's own floor); target = 3× the peer (D1, R2), 1× (Durable Objects)",
        &rows,
        &note,
    );
    if peer_failures > 0 {
        println!(
            "the peer dropped {peer_failures} requests (connection resets under load); its figures count the rest"
        );
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
