//! The Node suite: point SELECTs through kura-bindings' `D1Database` (`packages/kura-bindings`,
//! driven by its `bench/point-select.mjs` in a Node process) beside the same requests sent by
//! hand from Node with undici (the floor any Node client stands on) and by kura-bench's own
//! client, to the same endpoint, in alternate rounds; then the limit, and Miniflare's D1 from
//! Node (the peer's `node` vantage).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::load::{self, Stats};
use crate::report::{self, Row};
use crate::server::{Kura, TOKEN};
use crate::{Settings, d1, limit, peer};

/// Alternate rounds of each client, so drift on this shared machine falls on both.
const ROUNDS: usize = 3;

fn package() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packages/kura-bindings")
}

/// Builds the package if its `dist` is missing (as `scripts/test` does).
fn build_package() -> anyhow::Result<()> {
    let dir = package();
    if dir.join("dist/index.js").is_file() {
        return Ok(());
    }
    eprintln!("building packages/kura-bindings (npm ci, npm run build)…");
    for args in [&["ci", "--no-audit", "--no-fund", "--loglevel=error"][..], &["run", "build"][..]] {
        let status = Command::new("npm").args(args).current_dir(&dir).status().context("npm")?;
        if !status.success() {
            bail!("npm {} failed in {}", args.join(" "), dir.display());
        }
    }
    Ok(())
}

/// One run of the Node client (`raw`: the same requests by hand, without it).
fn node_client(api: &str, database: &str, clients: usize, duration: Duration, raw: bool) -> anyhow::Result<Stats> {
    let output = Command::new("node")
        .arg("bench/point-select.mjs")
        .env("MODE", if raw { "raw" } else { "client" })
        .current_dir(package())
        .env("KURA_URL", api)
        .env("KURA_API_TOKEN", TOKEN)
        .env("DATABASE", database)
        .env("SECONDS", duration.as_secs_f64().to_string())
        .env("CONCURRENCY", clients.to_string())
        .env("ROWS", d1::ROWS.to_string())
        .output()
        .context("node")?;
    if !output.status.success() {
        bail!("the Node client failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let line: serde_json::Value = serde_json::from_slice(&output.stdout).context("the Node client's figures")?;
    let number = |k: &str| line[k].as_f64().unwrap_or(0.0);
    Ok(Stats {
        units: number("queries") as u64,
        elapsed: Duration::from_secs_f64(number("seconds")),
        p50: Duration::from_secs_f64(number("p50_ms") / 1e3),
        p99: Duration::from_secs_f64(number("p99_ms") / 1e3),
        cpu: None,
        switches: None,
        flushed: None,
    })
}

/// kura-bench's own client on the binding endpoint, with the request the Node client sends.
async fn rust_client(client: &d1::Client, url: &str, clients: usize, duration: Duration) -> Stats {
    let (http, url) = (client.http.clone(), url.to_owned());
    load::run(clients, duration, move |c, n| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let id = ((c as i64 * 104_729 + n as i64 * 7919) % d1::ROWS).abs();
            let body = format!(r#"{{"sql":"SELECT * FROM kv WHERE id = ?","params":[{id}]}}"#);
            crate::server::post_ok(&http, &url, body).await;
            1
        }
    })
    .await
}

/// The sum of several runs, as one.
fn combined(runs: &[Stats]) -> Stats {
    let mut all = Stats::default();
    for run in runs {
        all.units += run.units;
        all.elapsed += run.elapsed;
        all.p50 = all.p50.max(run.p50);
        all.p99 = all.p99.max(run.p99);
    }
    all
}

pub fn run(settings: &Settings) -> anyhow::Result<()> {
    build_package()?;
    let scratch = settings.scratch_dir()?;
    let duration = Duration::from_secs_f64(settings.seconds);
    let kura = Kura::start(&scratch.path().join("kura"), true).context("starting kura")?;
    let client_runtime = crate::load::client_runtime()?;
    let client = client_runtime.block_on(d1::prepare(&kura.base))?;
    let api = format!("http://{}", kura.api_host());
    let binding = format!("{api}/binding/d1/{}/query?resultsFormat=ROWS_AND_COLUMNS", client.uuid);

    eprintln!("measuring the Node client, Node by hand and kura-bench's client, alternately ({ROUNDS} rounds)…");
    let mut measured = Vec::new();
    for clients in [16, 1] {
        let (mut node, mut raw, mut rust) = (Vec::new(), Vec::new(), Vec::new());
        for round in 1..=ROUNDS {
            rust.push(client_runtime.block_on(rust_client(&client, &binding, clients, duration)));
            raw.push(node_client(&api, &client.uuid, clients, duration, true)?);
            node.push(node_client(&api, &client.uuid, clients, duration, false)?);
            let rate = |runs: &Vec<Stats>| runs.last().map_or(0.0, Stats::rate);
            eprintln!(
                "  {clients:>2} concurrent, round {round}: D1Database {:.0}/s, by hand {:.0}/s, kura-bench {:.0}/s",
                rate(&node),
                rate(&raw),
                rate(&rust)
            );
        }
        measured.push((clients, combined(&node), combined(&raw), combined(&rust)));
    }
    kura.shutdown();

    eprintln!("measuring the physical limit…");
    let limit_dir = scratch.path().join("limit");
    std::fs::create_dir_all(&limit_dir)?;
    let conn = limit::open(&limit_dir, d1::ROWS)?;
    let limit_select = limit::point_select(&conn, d1::ROWS, duration)?;
    drop(conn);

    let (peer_rate, peer_note) = if settings.no_peer {
        (None, "skipped (--no-peer)".to_owned())
    } else {
        eprintln!("running the peer (Miniflare; its Node figures need its whole script)…");
        match peer::run(settings, &[], &scratch.path().join("peer")) {
            Ok(figures) => (
                peer::rate_from(&figures, "d1_point_select", "node"),
                format!(
                    "Miniflare's D1 from Node (mf.getD1Database(), its binding proxy), one client, {} ops",
                    settings.peer_ops
                ),
            ),
            Err(why) => (None, format!("not measured: {why}")),
        }
    };

    let mut rows = Vec::new();
    for (clients, node, raw, rust) in &measured {
        for (workload, stats) in
            [("Node, D1Database", node), ("Node, undici by hand", raw), ("kura-bench (Rust)", rust)]
        {
            rows.push(Row {
                workload: format!("point SELECT, {workload}"),
                clients: *clients,
                unit: "queries",
                kura: *stats,
                peer: peer_rate,
                limit: Some(limit_select),
                target: None,
            });
        }
    }
    report::print(
        "Node bindings: DB.prepare('SELECT * FROM kv WHERE id = ?').bind(id).first() from one Node process, \
         beside kura-bench sending the same request to the same /binding/d1 endpoint; limit = in-process rusqlite",
        &rows,
        &peer_note,
    );
    println!();
    for (clients, node, raw, rust) in &measured {
        let ratio = node.rate() / rust.rate();
        let verdict = if *clients == 16 {
            if ratio >= 0.8 { " (target ≥ 0.8× ✓)" } else { " (target ≥ 0.8× ✗)" }
        } else {
            ""
        };
        println!(
            "Node client ÷ kura-bench client, {clients:>2} concurrent: {ratio:.2}×{verdict}; \
             ÷ the same requests by hand from Node: {:.2}×",
            node.rate() / raw.rate()
        );
    }
    Ok(())
}
