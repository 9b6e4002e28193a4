//! `GET /metrics`, in Prometheus' text format, read from the figures each part keeps with
//! atomics as it works:
//!
//! - requests answered by surface and status, and their latencies ([`crate::observe`]);
//! - per engine (`d1`, `r2` for buckets' metadata, `kv` for KV namespaces' metadata, `do` for
//!   objects and namespaces' indexes):
//!   commits, failed commits, requests per group commit, commit time (fsync, history capture,
//!   shipping), files open now;
//! - per D1 database: commits and history bytes since the process started;
//! - R2's object bytes in and out; KV's value bytes in and out; per queue, its backlog, the
//!   messages in flight and waiting out a delay, and its oldest message's age; Durable Objects
//!   open and alarm deliveries;
//! - the process's open files and resident memory;
//! - on a cluster node, what its ownerships do ([`crate::cluster::ClusterStatus::metrics`]).
//!
//! The endpoint asks for no token, as `/healthz` does: keep the API port off untrusted networks.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use kura_sqlite::{HistogramSnapshot, Stats};

use crate::state::AppState;

/// Prometheus' text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `GET /metrics`.
pub async fn metrics(State(app): State<AppState>) -> impl IntoResponse {
    let mut out = String::new();
    family(&mut out, "kura_up", "gauge", "Whether the server answers.", &[(String::new(), 1.0)]);
    http(&mut out, &app.http);
    engines(&mut out, &app);
    queues(&mut out, &app).await;
    if let Some(workers) = &app.workers {
        let running = workers.running().len() as f64;
        family(
            &mut out,
            "kura_workers_running",
            "gauge",
            "Workers this node's workerd runs now.",
            &[(String::new(), running)],
        );
        family(
            &mut out,
            "kura_workers_cron_runs_total",
            "counter",
            "Cron Trigger runs this node claimed and started (in a cluster, each minute's run is one node's).",
            &[(String::new(), workers.cron_runs() as f64)],
        );
        if app.forwarding.is_some() {
            // In a cluster: the namespaces of deployed classes whose objects this node runs.
            let served = app.catalog.all_do_namespaces().map_or(0, |all| {
                all.iter().filter(|n| n.hosted_by_workerd() && app.durable_objects.serves_namespace(&n.id)).count()
            });
            family(
                &mut out,
                "kura_workers_object_namespaces",
                "gauge",
                "JavaScript Durable Object namespaces whose objects this node's workerd runs (in a cluster).",
                &[(String::new(), served as f64)],
            );
        }
    }
    process(&mut out);
    if let Some(forwarding) = &app.forwarding {
        out.push_str(&forwarding.status().metrics().await);
    }
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], out)
}

/// Writes one metric family: its help, its type and its samples (`labels` already formatted,
/// `{kind="d1"}`, or empty).
pub fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in samples {
        let _ = writeln!(out, "{name}{labels} {value}");
    }
}

/// Writes one histogram family: per labelled series, its cumulative buckets, sum and count.
fn histogram(out: &mut String, name: &str, help: &str, series: &[(Vec<(&str, String)>, HistogramSnapshot)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (labels, snapshot) in series {
        let base: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
        for (bound, count) in &snapshot.buckets {
            let le = if bound.is_infinite() { "+Inf".to_owned() } else { bound.to_string() };
            let all = base.iter().cloned().chain([format!("le=\"{le}\"")]).collect::<Vec<_>>().join(",");
            let _ = writeln!(out, "{name}_bucket{{{all}}} {count}");
        }
        let plain = if base.is_empty() { String::new() } else { format!("{{{}}}", base.join(",")) };
        let _ = writeln!(out, "{name}_sum{plain} {}", snapshot.sum);
        let _ = writeln!(out, "{name}_count{plain} {}", snapshot.count);
    }
}

/// A label value as the text format quotes it.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
    format!("{{{}}}", inner.join(","))
}

/// Most queues whose backlogs one scrape reads (each is a read of the queue's file).
const MAX_QUEUES_SCRAPED: usize = 1000;

/// Each queue's backlog, by its id.
async fn queues(out: &mut String, app: &AppState) {
    let Ok(queues) = app.catalog.all_queues() else { return };
    let now = app.queues.now_ms();
    let mut rows = Vec::new();
    // In a cluster, each queue's figures are its owner's.
    for queue in queues.into_iter().filter(|q| app.queues.owns(&q.id)).take(MAX_QUEUES_SCRAPED) {
        if let Ok(backlog) = app.queues.backlog(&queue.id).await {
            // By id, as D1's databases: the endpoint is open, and names are the account's own.
            rows.push((labels(&[("queue", &queue.id)]), backlog));
        }
    }
    let series = |value: &dyn Fn(&kura_queues::Backlog) -> f64| -> Vec<(String, f64)> {
        rows.iter().map(|(labels, backlog)| (labels.clone(), value(backlog))).collect()
    };
    family(
        out,
        "kura_queue_backlog_messages",
        "gauge",
        "Messages not yet acknowledged, per queue.",
        &series(&|b| b.count as f64),
    );
    family(out, "kura_queue_backlog_bytes", "gauge", "Their bodies' bytes, per queue.", &series(&|b| b.bytes as f64));
    family(
        out,
        "kura_queue_in_flight_messages",
        "gauge",
        "Messages leased to a consumer now, per queue.",
        &series(&|b| b.in_flight as f64),
    );
    family(
        out,
        "kura_queue_delayed_messages",
        "gauge",
        "Messages waiting out a delay (a send's or a retry's), per queue.",
        &series(&|b| b.delayed as f64),
    );
    family(
        out,
        "kura_queue_oldest_message_age_seconds",
        "gauge",
        "Seconds since the oldest unacknowledged message was sent (0 when there is none), per queue.",
        &series(&|b| b.oldest_ms.map_or(0.0, |sent| (now - sent).max(0) as f64 / 1000.0)),
    );
}

fn http(out: &mut String, figures: &crate::observe::HttpFigures) {
    let answered: Vec<(String, f64)> = figures
        .answered()
        .into_iter()
        .map(|(surface, code, n)| (labels(&[("surface", surface.name()), ("code", &code.to_string())]), n as f64))
        .collect();
    family(out, "kura_http_requests_total", "counter", "Requests answered, by surface and status.", &answered);
    let latencies: Vec<_> =
        figures.latencies().into_iter().map(|(surface, h)| (vec![("surface", surface.name().to_owned())], h)).collect();
    histogram(
        out,
        "kura_http_request_duration_seconds",
        "Seconds from a request's arrival to its answer's headers.",
        &latencies,
    );
}

fn engines(out: &mut String, app: &AppState) {
    let engines: [(&str, &Stats, usize); 5] = [
        ("d1", app.d1.stats(), app.d1.open_databases()),
        ("r2", app.r2.stats(), app.r2.open_buckets()),
        ("kv", app.kv.storage().stats(), app.kv.storage().open_buckets()),
        ("queues", app.queues.stats(), app.queues.open_queues()),
        ("do", app.durable_objects.stats(), app.durable_objects.open_objects()),
    ];
    let per_engine = |value: &dyn Fn(&Stats, usize) -> f64| -> Vec<(String, f64)> {
        engines.iter().map(|(name, stats, open)| (labels(&[("engine", name)]), value(stats, *open))).collect()
    };
    family(
        out,
        "kura_sqlite_commits_total",
        "counter",
        "Transactions committed (each with its fsync), by engine: D1 databases, R2 buckets' metadata, KV namespaces, queues, Durable Objects.",
        &per_engine(&|s, _| s.commits.load(Ordering::Relaxed) as f64),
    );
    family(
        out,
        "kura_sqlite_failed_commits_total",
        "counter",
        "Commits that failed (their requests got an error).",
        &per_engine(&|s, _| s.failed_commits.load(Ordering::Relaxed) as f64),
    );
    family(
        out,
        "kura_sqlite_open_files",
        "gauge",
        "SQLite files open now (one actor each).",
        &per_engine(&|_, open| open as f64),
    );
    let series = |snapshot: &dyn Fn(&Stats) -> HistogramSnapshot| -> Vec<_> {
        engines.iter().map(|(name, stats, _)| (vec![("engine", (*name).to_owned())], snapshot(stats))).collect()
    };
    histogram(
        out,
        "kura_sqlite_group_commit_requests",
        "Requests that shared one group commit (and its fsync).",
        &series(&|s| s.group_sizes.snapshot()),
    );
    histogram(
        out,
        "kura_sqlite_commit_duration_seconds",
        "Seconds a commit took: COMMIT's fsync, its capture into the history and, in a cluster, its shipment.",
        &series(&|s| s.commit_seconds.snapshot()),
    );
    let databases = app.d1.stats().databases();
    let commits: Vec<(String, f64)> =
        databases.iter().map(|(uuid, commits, _)| (labels(&[("database", uuid)]), *commits as f64)).collect();
    family(
        out,
        "kura_d1_database_commits_total",
        "counter",
        "Commits per D1 database since the server started.",
        &commits,
    );
    let history: Vec<(String, f64)> =
        databases.iter().map(|(uuid, _, bytes)| (labels(&[("database", uuid)]), *bytes as f64)).collect();
    family(
        out,
        "kura_d1_database_history_bytes",
        "gauge",
        "Bytes of a D1 database's Time Travel log and snapshots, as measured at its last open or checkpoint.",
        &history,
    );
    let (received, sent) = app.r2.bytes_moved();
    family(
        out,
        "kura_r2_received_bytes_total",
        "counter",
        "Object bytes written (PUTs, parts, copies).",
        &[(String::new(), received as f64)],
    );
    family(
        out,
        "kura_r2_sent_bytes_total",
        "counter",
        "Object bytes read (GETs, copy sources).",
        &[(String::new(), sent as f64)],
    );
    let (received, sent) = app.kv.storage().bytes_moved();
    family(
        out,
        "kura_kv_received_bytes_total",
        "counter",
        "KV value bytes written.",
        &[(String::new(), received as f64)],
    );
    family(out, "kura_kv_sent_bytes_total", "counter", "KV value bytes read.", &[(String::new(), sent as f64)]);
    let alarms = app.durable_objects.alarm_figures();
    family(
        out,
        "kura_do_alarm_deliveries_total",
        "counter",
        "Alarm deliveries, by outcome (a failed one is retried, up to six times).",
        &[
            (labels(&[("outcome", "delivered")]), alarms.delivered.load(Ordering::Relaxed) as f64),
            (labels(&[("outcome", "failed")]), alarms.failed.load(Ordering::Relaxed) as f64),
        ],
    );
    family(
        out,
        "kura_do_alarms_given_up_total",
        "counter",
        "Alarms whose last retry failed.",
        &[(String::new(), alarms.given_up.load(Ordering::Relaxed) as f64)],
    );
}

/// The process's open files and resident memory, from `/proc` (Linux).
fn process(out: &mut String) {
    if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
        family(out, "process_open_fds", "gauge", "Open file descriptors.", &[(String::new(), entries.count() as f64)]);
    }
    // VmRSS is in kB.
    let resident = std::fs::read_to_string("/proc/self/status").ok().and_then(|status| {
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse::<f64>().ok()
    });
    if let Some(kib) = resident {
        family(out, "process_resident_memory_bytes", "gauge", "Resident memory.", &[(String::new(), kib * 1024.0)]);
    }
}
