//! Floors measured whole rather than summed: servers that do nothing but a request's storage
//! work (the limit's, on in-process connections, WAL and `synchronous=FULL`) behind HTTP, served
//! as kura serves (`serve_tcp` on a tokio runtime) and loaded by the same client with the same
//! bodies, in turns with kura.
//!
//! A round trip and a commit measured apart and added miss what they cost together on this
//! machine: while a request waits for its `fdatasync`, both vCPUs may go idle, and the wake-ups
//! that follow (the worker's, then the client's) come late often enough to set the mean. Every
//! server that answers after a durable commit pays that, so these are the floors kura is
//! measured against; the sums are printed beside them.

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use rusqlite::Connection;

/// A running floor server; stops when dropped.
pub struct FloorServer {
    /// Its address, `http://host:port`.
    pub base: String,
    runtime: Option<tokio::runtime::Runtime>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl FloorServer {
    /// D1's floor: `POST /commit` answers after one durable single-row INSERT (the limit's),
    /// run on the worker that took the request, as kura runs a lone write. Two workers, as
    /// kura's runtime has. `POST /commit/{µs}` first keeps the CPU busy that long: a server
    /// with that much work of its own per request, in the same place on the same disk.
    pub fn commit(dir: &Path) -> anyhow::Result<FloorServer> {
        std::fs::create_dir_all(dir)?;
        let committer =
            Arc::new(Committer { conn: Mutex::new(crate::limit::open(dir, 0)?), next_id: AtomicI64::new(1) });
        let app = axum::Router::new()
            .route("/commit", axum::routing::post(commit))
            .route("/commit/{work_us}", axum::routing::post(commit_after_work))
            .with_state(committer);
        FloorServer::serve("commit-floor", 2, app)
    }

    /// Durable Objects' floor: `POST /objects/{n}` answers after the limit's request (a write
    /// and a read, one durable transaction) on object `n`'s own file and connection, `objects`
    /// of them open. Each request blocks the worker that took it for its commit, and there are
    /// `workers` workers: a thread per request in flight, with no hand-off between threads.
    /// Of the shapes tried, this one set the higher floor: two workers handing each request to
    /// `spawn_blocking`, as kura hands it to its pool, served 7–10% fewer. Each object is
    /// seeded with one request first, as kura's are before its load.
    pub fn objects(
        dir: &Path,
        objects: u64,
        workers: usize,
        open: impl Fn(&Path, u64) -> anyhow::Result<Connection>,
        request: fn(&Connection, &str) -> anyhow::Result<()>,
    ) -> anyhow::Result<FloorServer> {
        std::fs::create_dir_all(dir)?;
        let conns = (0..objects)
            .map(|o| {
                let conn = open(dir, o)?;
                request(&conn, "seed")?;
                Ok(Mutex::new(conn))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let state = Arc::new(Objects { conns, request, next_user: AtomicI64::new(0) });
        let app = axum::Router::new().route("/objects/{object}", axum::routing::post(object)).with_state(state);
        FloorServer::serve("object-floor", workers, app)
    }

    fn serve(name: &str, workers: usize, app: axum::Router) -> anyhow::Result<FloorServer> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .thread_name(name)
            .enable_all()
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let base = runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let base = format!("http://{}", listener.local_addr()?);
            tokio::spawn(async move {
                let _ = kura_server::serve_tcp(listener, app, async {
                    let _ = stopped.await;
                })
                .await;
            });
            anyhow::Ok(base)
        })?;
        Ok(FloorServer { base, runtime: Some(runtime), stop: Some(stop) })
    }
}

impl Drop for FloorServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Waits for the workers to drop the server's tasks, and so its connections, whose
        // closing checkpoints: left to run on, those writes would fall into the next figure.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(std::time::Duration::from_secs(30));
        }
    }
}

/// A JSON answer: success, or failure with a 500.
fn answer(succeeded: bool) -> impl IntoResponse {
    let json = [("content-type", "application/json")];
    match succeeded {
        true => (StatusCode::OK, json, r#"{"success":true}"#),
        false => (StatusCode::INTERNAL_SERVER_ERROR, json, r#"{"success":false}"#),
    }
}

/// The commit floor's connection, and the next row's id.
struct Committer {
    conn: Mutex<Connection>,
    next_id: AtomicI64,
}

async fn commit(State(committer): State<Arc<Committer>>, _body: bytes::Bytes) -> impl IntoResponse {
    committer.insert()
}

/// [`commit`] after `work_us` µs of CPU kept busy ([`crate::limit::busy_for`]).
async fn commit_after_work(
    State(committer): State<Arc<Committer>>,
    UrlPath(work_us): UrlPath<u64>,
    _body: bytes::Bytes,
) -> impl IntoResponse {
    crate::limit::busy_for(std::time::Duration::from_micros(work_us));
    committer.insert()
}

impl Committer {
    fn insert(&self) -> impl IntoResponse + use<> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let inserted = conn
            .prepare_cached("INSERT INTO kv (id, v) VALUES (?1, ?2)")
            .and_then(|mut insert| insert.execute((id, "w")));
        answer(inserted.is_ok())
    }
}

/// The object floor's connections, one per object, and its request.
struct Objects {
    conns: Vec<Mutex<Connection>>,
    request: fn(&Connection, &str) -> anyhow::Result<()>,
    next_user: AtomicI64,
}

async fn object(
    State(objects): State<Arc<Objects>>,
    UrlPath(object): UrlPath<usize>,
    _body: bytes::Bytes,
) -> impl IntoResponse {
    let Some(conn) = objects.conns.get(object) else { return answer(false) };
    let user = format!("f{}", objects.next_user.fetch_add(1, Ordering::Relaxed));
    let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
    answer((objects.request)(&conn, &user).is_ok())
}
