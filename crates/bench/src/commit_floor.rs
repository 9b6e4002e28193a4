//! The floor of a one-client durable write over HTTP, measured rather than summed: a server that
//! does nothing but answer each POST after one durable commit of one row (the limit's INSERT on
//! an in-process connection, WAL and `synchronous=FULL`), served as kura serves (`serve_tcp`, a
//! runtime of two workers, the commit on the worker that took the request, as kura's lone write
//! runs) and loaded by the same client with the same body.
//!
//! The round trip and the commit measured apart and added ([`crate::d1`]) miss what they cost
//! together on this machine: while a request waits for its `fdatasync`, both vCPUs may go idle,
//! and the wake-ups that follow (the worker's, then the client's) come late often enough to
//! set the mean. Every server that answers after a durable commit pays that, so this figure is
//! the floor kura is measured against; the sum is printed beside it.

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use rusqlite::Connection;

/// The running server; stops when dropped.
pub struct CommitFloor {
    /// Where to POST.
    pub url: String,
    runtime: Option<tokio::runtime::Runtime>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// The handler's connection, and the next row's id.
struct Committer {
    conn: Mutex<Connection>,
    next_id: AtomicI64,
}

impl CommitFloor {
    /// Starts the server on a database in `dir`, shaped as the limit's.
    pub fn start(dir: &Path) -> anyhow::Result<CommitFloor> {
        std::fs::create_dir_all(dir)?;
        let conn = crate::limit::open(dir, 0)?;
        let committer = Arc::new(Committer { conn: Mutex::new(conn), next_id: AtomicI64::new(1) });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("commit-floor")
            .enable_all()
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let url = runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let url = format!("http://{}/commit", listener.local_addr()?);
            let app = axum::Router::new().route("/commit", axum::routing::post(commit)).with_state(committer);
            tokio::spawn(async move {
                let _ = kura_server::serve_tcp(listener, app, async {
                    let _ = stopped.await;
                })
                .await;
            });
            anyhow::Ok(url)
        })?;
        Ok(CommitFloor { url, runtime: Some(runtime), stop: Some(stop) })
    }
}

impl Drop for CommitFloor {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// One durable single-row commit, then a D1-shaped success.
async fn commit(State(committer): State<Arc<Committer>>, _body: bytes::Bytes) -> impl IntoResponse {
    let id = committer.next_id.fetch_add(1, Ordering::Relaxed);
    let conn = committer.conn.lock().unwrap_or_else(|p| p.into_inner());
    let inserted =
        conn.prepare_cached("INSERT INTO kv (id, v) VALUES (?1, ?2)").and_then(|mut insert| insert.execute((id, "w")));
    match inserted {
        Ok(_) => (StatusCode::OK, [("content-type", "application/json")], r#"{"success":true}"#),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, [("content-type", "application/json")], r#"{"success":false}"#),
    }
}
