//! `GET /metrics`, in Prometheus' text format: that the server is up and, on a cluster node,
//! what its ownerships do — files owned, objects written to the store, shipments, takeovers,
//! the shipping lag of `--durability async` — as the node's [`ClusterStatus`] reports them.
//!
//! [`ClusterStatus`]: crate::cluster::ClusterStatus

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use crate::AppState;

/// Prometheus' text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `GET /metrics`.
pub async fn metrics(State(app): State<AppState>) -> impl IntoResponse {
    let mut text = String::from("# HELP kura_up Whether the server answers.\n# TYPE kura_up gauge\nkura_up 1\n");
    if let Some(forwarding) = &app.forwarding {
        text.push_str(&forwarding.status().metrics().await);
    }
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], text)
}

/// Writes one metric family: its help, its type and its samples (`labels` already formatted,
/// `{kind="d1"}`, or empty).
pub fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, f64)]) {
    use std::fmt::Write;
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in samples {
        let _ = writeln!(out, "{name}{labels} {value}");
    }
}
