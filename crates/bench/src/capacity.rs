//! Capacity: what a `kura serve` process (the release binary) holds for what it keeps open —
//! resident memory and file descriptors per idle kept-alive connection, per idle open D1
//! database and per bucket touched — and that both stay bounded after 10,000 databases and
//! 10,000 buckets are touched. Each figure is printed beside its limit measured in the same
//! run by a process of this benchmark: kura's own HTTP serving loop with one route and nothing
//! else, and plain SQLite connections with kura's settings.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::server::{ACCOUNT, TOKEN};

/// What /proc says of a process: resident bytes and open descriptors.
#[derive(Clone, Copy, Debug)]
struct Footprint {
    rss: u64,
    fds: u64,
}

fn footprint(pid: u32) -> Footprint {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    Footprint { rss, fds }
}

fn kib(bytes: f64) -> String {
    format!("{:.1} KiB", bytes / 1024.0)
}

/// Opens `n` kept-alive connections to `addr`, each after one `GET /healthz`, and returns them.
async fn hold_connections(addr: &str, n: usize) -> anyhow::Result<Vec<tokio::net::TcpStream>> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream.write_all(b"GET /healthz HTTP/1.1\r\nhost: bench\r\n\r\n").await?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        // The answer is small: its headers and a short body arrive together.
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            let read = stream.read(&mut buf).await?;
            anyhow::ensure!(read > 0, "the server closed a connection");
            answer.extend_from_slice(&buf[..read]);
        }
        anyhow::ensure!(answer.starts_with(b"HTTP/1.1 200"), "GET /healthz: {}", String::from_utf8_lossy(&answer));
        held.push(stream);
    }
    Ok(held)
}

/// Settles the server, then reads its footprint.
async fn settled(pid: u32) -> Footprint {
    tokio::time::sleep(Duration::from_millis(500)).await;
    footprint(pid)
}

/// Resident bytes and descriptors per connection held on `addr` (the server `pid`).
async fn per_connection(pid: u32, addr: &str, n: usize) -> anyhow::Result<(f64, f64, Footprint)> {
    let before = settled(pid).await;
    let held = hold_connections(addr, n).await?;
    let during = settled(pid).await;
    drop(held);
    let after = settled(pid).await;
    let per = |a: u64, b: u64| (a as f64 - b as f64) / n as f64;
    Ok((
        per(during.rss, before.rss),
        per(during.fds, before.fds),
        Footprint { rss: after.rss, fds: after.fds - before.fds },
    ))
}

pub fn run(connections: usize, databases: usize, buckets: usize) -> anyhow::Result<()> {
    let rt = crate::load::client_runtime()?;
    println!("capacity: {connections} idle connections, {databases} D1 databases and {buckets} buckets touched");

    // Connections: kura, then the floor (kura's serving loop with one route).
    let kura = crate::child::start(&["--d1-max-restores", "10"], &[])?;
    let kura_addr = kura.api.trim_start_matches("http://").split('/').next().unwrap_or_default().to_owned();
    let (kura_rss, kura_fds, kura_after) = rt.block_on(per_connection(kura.pid(), &kura_addr, connections))?;
    let floor = HttpFloor::start()?;
    let (floor_rss, floor_fds, _) = rt.block_on(per_connection(floor.pid(), &floor.addr, connections))?;
    drop(floor);
    println!();
    println!("{:<44} {:>14} {:>14} {:>9}", "per idle kept-alive connection", "kura", "limit", "vs limit");
    println!(
        "{:<44} {:>14} {:>14} {:>8.2}×",
        "resident memory",
        kib(kura_rss),
        kib(floor_rss),
        kura_rss / floor_rss.max(1.0)
    );
    println!(
        "{:<44} {:>14.2} {:>14.2} {:>8.2}×",
        "file descriptors",
        kura_fds,
        floor_fds,
        kura_fds / floor_fds.max(0.01)
    );
    println!(
        "  limit: kura_server::serve_tcp with one route and nothing else, in a process of its own; after closing all {connections}: {} descriptors more than before",
        kura_after.fds
    );

    // Databases and buckets: touched one after another, 16 at a time.
    let http = reqwest::Client::builder().pool_max_idle_per_host(32).build()?;
    let account = format!("{}/accounts/{ACCOUNT}", kura.api);
    let start = rt.block_on(settled(kura.pid()));
    let max_open = kura_sqlite::RegistrySettings::default().max_open;
    let touch_database = |i: usize| {
        let (http, account) = (http.clone(), account.clone());
        async move {
            let created = call(&http, &format!("{account}/d1/database"), json!({ "name": format!("db-{i}") })).await?;
            let uuid = created["uuid"].as_str().context("no uuid")?.to_owned();
            let sql = "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'touched')";
            call(&http, &format!("{account}/d1/database/{uuid}/query"), json!({ "sql": sql })).await?;
            anyhow::Ok(())
        }
    };
    let (open_fp, all_fp, rate) = rt.block_on(touch_all(kura.pid(), databases, max_open, touch_database))?;
    let floor = rt.block_on(async { sqlite_floor(max_open) })?;
    let per_db = (open_fp.rss as f64 - start.rss as f64) / max_open.min(databases) as f64;
    println!();
    println!("{:<44} {:>14} {:>14} {:>9}", "per idle open D1 database", "kura", "limit", "vs limit");
    println!("{:<44} {:>14} {:>14} {:>8.2}×", "resident memory", kib(per_db), kib(floor.0), per_db / floor.0.max(1.0));
    println!(
        "{:<44} {:>14.2} {:>14.2} {:>8.2}×",
        "file descriptors",
        open_fp.fds.saturating_sub(start.fds) as f64 / max_open.min(databases) as f64,
        floor.1,
        open_fp.fds.saturating_sub(start.fds) as f64 / max_open.min(databases) as f64 / floor.1.max(0.01)
    );
    println!(
        "  limit: rusqlite connections with kura's settings (WAL, synchronous=FULL), a table and a row each, in this process"
    );
    println!(
        "  after {databases} databases touched ({rate:.0}/s, each created and written): {:.1} MiB resident, {} descriptors (at {} open: {:.1} MiB, {}); at most {max_open} stay open",
        all_fp.rss as f64 / 1048576.0,
        all_fp.fds,
        max_open.min(databases),
        open_fp.rss as f64 / 1048576.0,
        open_fp.fds
    );

    let before_buckets = rt.block_on(settled(kura.pid()));
    let touch_bucket = |i: usize| {
        let (http, account) = (http.clone(), account.clone());
        async move {
            let bucket = format!("bucket-{i}");
            call(&http, &format!("{account}/r2/buckets"), json!({ "name": bucket })).await?;
            let put = http
                .put(format!("{account}/r2/buckets/{bucket}/objects/touched"))
                .bearer_auth(TOKEN)
                .body(vec![7u8; 100])
                .send()
                .await?;
            anyhow::ensure!(put.status().is_success(), "PUT into {bucket}: {}", put.status());
            anyhow::Ok(())
        }
    };
    let open_buckets = kura_r2::R2Settings::default().registry.max_open;
    let (open_b, all_b, rate_b) = rt.block_on(touch_all(kura.pid(), buckets, open_buckets, touch_bucket))?;
    let per_bucket = (open_b.rss as f64 - before_buckets.rss as f64) / open_buckets.min(buckets) as f64;
    println!();
    println!(
        "per bucket touched (its metadata open): {} resident, {:.2} descriptors; after {buckets} buckets ({rate_b:.0}/s, each created and written): {:.1} MiB resident, {} descriptors",
        kib(per_bucket),
        (open_b.fds.saturating_sub(before_buckets.fds)) as f64 / open_buckets.min(buckets) as f64,
        all_b.rss as f64 / 1048576.0,
        all_b.fds
    );
    Ok(())
}

async fn call(http: &reqwest::Client, url: &str, body: serde_json::Value) -> anyhow::Result<serde_json::Value> {
    let answer: serde_json::Value = http.post(url).bearer_auth(TOKEN).json(&body).send().await?.json().await?;
    anyhow::ensure!(answer["success"] == true, "{url}: {answer}");
    Ok(answer["result"].clone())
}

/// Touches `0..n` with 16 at a time; the footprint once `open` are touched, once all are, and
/// touches per second.
async fn touch_all<F, Fut>(pid: u32, n: usize, open: usize, touch: F) -> anyhow::Result<(Footprint, Footprint, f64)>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    use futures_util::StreamExt;
    let touch_range = |range: std::ops::Range<usize>| {
        futures_util::stream::iter(range).map(&touch).buffer_unordered(16).collect::<Vec<_>>()
    };
    let first = open.min(n);
    touch_range(0..first).await.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let at_open = settled(pid).await;
    let started = Instant::now();
    touch_range(first..n).await.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let rate = (n - first) as f64 / started.elapsed().as_secs_f64().max(1e-9);
    Ok((at_open, settled(pid).await, rate))
}

/// Resident bytes and descriptors per plain SQLite connection holding a table and a row, with
/// kura's settings.
fn sqlite_floor(n: usize) -> anyhow::Result<(f64, f64)> {
    kura_sqlite::configure_process();
    let dir = tempfile::tempdir()?;
    let pid = std::process::id();
    let before = footprint(pid);
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let conn = rusqlite::Connection::open(dir.path().join(format!("{i}.sqlite")))?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
             CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'touched');",
        )?;
        held.push(conn);
    }
    let during = footprint(pid);
    Ok(((during.rss as f64 - before.rss as f64) / n as f64, (during.fds as f64 - before.fds as f64) / n as f64))
}

/// The floor for connections: a child process of this benchmark serving one route through
/// kura's own serving loop.
struct HttpFloor {
    child: std::process::Child,
    addr: String,
}

impl HttpFloor {
    fn start() -> anyhow::Result<HttpFloor> {
        use std::io::BufRead;
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .arg("http-floor")
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
        let addr = line.trim().strip_prefix("listening ").context("the floor server did not start")?.to_owned();
        Ok(HttpFloor { child, addr })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for HttpFloor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The floor process's side: `GET /healthz` through `kura_server::serve_tcp` on a runtime like
/// kura's, until killed.
pub fn http_floor_child() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("listening {}", listener.local_addr()?);
        let app = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        kura_server::serve_tcp(listener, app, std::future::pending()).await?;
        anyhow::Ok(())
    })
}
