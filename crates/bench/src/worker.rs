//! kura from inside a Worker: the peer's own D1 workloads, in the peer's own workerd, with
//! `env.DB` being workerd's D1 binding (`cloudflare-internal:d1-api`) pointed at kura over
//! HTTP. Beside the peer's worker figures, this is the same code seeing two different D1s.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The workloads, written as the peer writes them, so both sides run the same code.
const SCRIPT: &str = r#"
async function timed(fn) { const s = Date.now(); await fn(); return Date.now() - s; }
export default {
  async fetch(req, env) {
    const u = new URL(req.url), n = Number(u.searchParams.get("n") ?? 1000), op = u.pathname.slice(1);
    const db = env.DB;
    const ops = {
      d1_insert_single: async () => { for (let i = 0; i < n; i++) await db.prepare("INSERT INTO kv (id, v) VALUES (?, ?)").bind(1e6 + i, "w" + i).run(); },
      d1_point_select:  async () => { for (let i = 0; i < n; i++) await db.prepare("SELECT * FROM kv WHERE id = ?").bind(i).first(); },
      d1_batch_100:     async () => { for (let k = 0; k < n / 100; k++) await db.batch(Array.from({ length: 100 }, (_, j) => db.prepare("INSERT INTO kv (id, v) VALUES (?, ?)").bind(2e6 + k * 100 + j, "b"))); },
    };
    if (!ops[op]) return new Response("unknown op", { status: 404 });
    return Response.json({ ms: await timed(ops[op]) });
  },
};"#;

/// The workerd that came with the peer's Miniflare, if it is installed.
pub fn workerd() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/peer/node_modules/workerd/bin/workerd");
    path.is_file().then_some(path)
}

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs each op `n` times inside a Worker bound to `database` on the kura at `api` (host:port);
/// answers (op, operations per second) in the order given.
pub async fn run(
    workerd: &Path,
    api: &str,
    token: &str,
    database: &str,
    ops: &[&str],
    n: u64,
) -> anyhow::Result<Vec<(String, f64)>> {
    let dir = tempfile::tempdir()?;
    let address: SocketAddr = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    std::fs::write(dir.path().join("worker.js"), SCRIPT)?;
    std::fs::write(
        dir.path().join("config.capnp"),
        format!(
            r#"using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [
    (name = "main", worker = .worker),
    (name = "kura", external = (address = "{api}", http = (injectRequestHeaders = [
      (name = "authorization", value = "Bearer {token}"), (name = "x-kura-d1-database", value = "{database}")]))),
  ],
  sockets = [(name = "http", address = "{address}", http = (), service = "main")],
);
const worker :Workerd.Worker = (
  modules = [(name = "worker.js", esModule = embed "worker.js")],
  compatibilityDate = "2025-04-01",
  bindings = [(name = "DB", wrapped = (moduleName = "cloudflare-internal:d1-api",
    innerBindings = [(name = "fetcher", service = "kura")]))],
);
"#
        ),
    )?;
    let _workerd = Process(
        Command::new(workerd)
            .args(["serve", "config.capnp"])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?,
    );
    let started = Instant::now();
    while TcpStream::connect(address).is_err() {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "workerd did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let http = reqwest::Client::new();
    let mut figures = Vec::new();
    for op in ops {
        let response = http.get(format!("http://{address}/{op}?n={n}")).send().await?;
        let status = response.status();
        let body = response.text().await?;
        anyhow::ensure!(status.is_success(), "{op} failed in the Worker: {body}");
        let answer: serde_json::Value = serde_json::from_str(&body)?;
        let ms = answer["ms"].as_f64().unwrap_or(0.0).max(1.0);
        figures.push((op.to_string(), n as f64 / ms * 1000.0));
    }
    Ok(figures)
}
