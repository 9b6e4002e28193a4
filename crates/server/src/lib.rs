//! kura's HTTP server: Cloudflare's v4 REST API (D1) under `/client/v4`, the binding protocol
//! (what workerd's `env.DB` speaks), `/healthz`, and the S3 listener, over the engines of one
//! data directory.
//!
//! - [`Node`]: an opened, locked data directory with its catalog and engines.
//! - [`serve`]: runs the API and S3 listeners until a shutdown future resolves.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use kura_server::{Node, NodeSettings, serve};
//! let node = Node::open(std::path::Path::new(".kura"), NodeSettings::default())?;
//! let api = tokio::net::TcpListener::bind("127.0.0.1:8780").await?;
//! let s3 = tokio::net::TcpListener::bind("127.0.0.1:8781").await?;
//! serve(node, api, s3, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

// The modules in their layers, lowest first: each uses only the layers below it (checked by
// `tests/layers.rs`; ARCHITECTURE.md draws the map).
mod alarms;
pub mod buckets;
mod expect_continue;
pub mod metrics;
pub mod observe;
pub mod render;
mod stall;
mod tail_stream;
pub mod transfer;

mod error;
mod extract;
mod forward;
mod state;

pub mod auth;
mod resources;
mod routing;

mod binding;
mod console;
mod rest;
mod s3;

pub mod cluster;
mod node;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request};
use axum::response::Response;
use axum::routing::get;
use kura_catalog::Catalog;
use kura_d1::D1;
use tokio::net::TcpListener;
use tower::Layer;

use routing::{RouteTable, Routes, Touches};

pub use forward::{ClusterStatus, Forwarding, SERVED_BY};
pub use node::{Bootstrap, CredentialsConfig, Node, NodeError, NodeSettings, bootstrap, lock_directory};
pub use resources::engine_namespace;
pub use state::{AppState, MAX_BODY_BYTES, Shared};

/// Cases each property test of an outside parser runs: a bounded number in `scripts/test`, more
/// with `KURA_FUZZ_CASES` (the long mode).
#[cfg(test)]
pub(crate) fn fuzz_cases() -> u32 {
    kura_testkit::count("KURA_FUZZ_CASES", 2_000)
}

/// The listeners a server serves on.
pub struct Listeners {
    /// The Cloudflare v4 API (and the binding protocol for outside clients).
    pub api: TcpListener,
    /// S3.
    pub s3: TcpListener,
    /// Deployed Workers, routed by host; `None` runs no Workers.
    pub workers: Option<TcpListener>,
}

/// A listener's application as [`serve_tcp`] takes it: a router, or a router inside the
/// middleware common to all its requests.
pub trait Application:
    tower::Service<Request, Response = Response, Error = Infallible, Future: Send + 'static> + Clone + Send + 'static
{
}

impl<S> Application for S where
    S: tower::Service<Request, Response = Response, Error = Infallible, Future: Send + 'static>
        + Clone
        + Send
        + 'static
{
}

/// The API listener's whole application: `/healthz` and `/client/v4/…`.
///
/// The middleware wraps the router rather than being layered onto it: `Router::layer` wraps
/// each route's handler, and every request then pays for each layer a boxed clone of the
/// services below it and a boxed future (a fifth of the allocations of a one-row D1 INSERT).
pub fn app(state: AppState) -> impl Application {
    // In a cluster, the binding calls other nodes' Workers send this node's way.
    let bindings = worker_bindings(state.clone());
    let from_node = axum::routing::any(move |axum::extract::State(app): axum::extract::State<AppState>, request| {
        cluster::from_node(app, bindings.clone(), request)
    });
    let (routes, table) = Routes::default()
        .route("/healthz", Touches::Anywhere, get(|| async { "ok" }))
        .route("/metrics", Touches::Anywhere, get(metrics::metrics))
        .route("/d1-transfers/{token}", Touches::Transfer, get(transfer::download).put(transfer::upload))
        .route("/workers-tails/{tail}", Touches::Anywhere, get(tail_stream::stream))
        .merge(rest::routes())
        .merge(binding::routes())
        .merge(cluster::routes())
        .route(&format!("{}/{{*path}}", cluster::WORKER_BINDINGS_PATH), Touches::Anywhere, from_node.clone())
        .route(&format!("{}/", cluster::WORKER_BINDINGS_PATH), Touches::Anywhere, from_node)
        .with_router(|router| router.merge(console::routes()))
        .split();
    let routes = routes.with_state(state.clone());
    let edge = axum::middleware::from_fn_with_state((state, Arc::new(table)), api_edge);
    DefaultBodyLimit::max(MAX_BODY_BYTES).layer(edge.layer(routes))
}

/// The routes of the Workers' binding socket ([`binding::worker_routes`]); in a cluster, inside
/// their placement ([`cluster::place_worker_binding`]). A node of its own spares its hot path
/// the layer.
fn worker_bindings(state: AppState) -> impl Application + Sync {
    let routes = binding::worker_routes(state.clone()).with_state(state.clone());
    let routes = match state.forwarding.is_some() {
        true => axum::Router::new()
            .fallback_service(axum::middleware::from_fn_with_state(state, cluster::place_worker_binding).layer(routes)),
        false => routes,
    };
    DefaultBodyLimit::max(MAX_BODY_BYTES).layer(routes)
}

/// The API listener's work common to every request, as one middleware (each axum `from_fn`
/// layer boxes the request's future and clones the services below it, per request; three cost
/// 13% of the server threads' time on a Durable Object batch): the request's id, span and
/// figures ([`observe::observe_api`]) around the cluster's placement ([`cluster::place`]),
/// and the answer [`finished`].
async fn api_edge(
    axum::extract::State((state, table)): axum::extract::State<(AppState, Arc<RouteTable>)>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let figures = Arc::clone(&state.http);
    let head = request.method() == axum::http::Method::HEAD;
    let request = without_trailing_slash(request);
    observe::observe_api(&figures, request, |request| async move {
        finished(head, cluster::place(state, &table, request, next).await)
    })
    .await
}

/// A v4 path with a trailing slash (`…/namespaces/`) names what it names without one, as
/// Cloudflare's API answers it. Other paths (`/console/`) are left as they are, and so is an
/// R2 object's, whose key may end in a slash.
fn without_trailing_slash(mut request: axum::extract::Request) -> axum::extract::Request {
    let uri = request.uri();
    let path = uri.path();
    if !path.starts_with("/client/v4/") || !path.ends_with('/') {
        return request;
    }
    if let Some((_, bucket_path)) = path.split_once("/r2/buckets/")
        && bucket_path.contains("/objects/")
    {
        return request;
    }
    let trimmed = path.trim_end_matches('/');
    let rewritten = match uri.query() {
        Some(query) => format!("{trimmed}?{query}"),
        None => trimmed.to_owned(),
    };
    if let Ok(path_and_query) = rewritten.parse::<axum::http::uri::PathAndQuery>() {
        let mut parts = uri.clone().into_parts();
        parts.path_and_query = Some(path_and_query);
        if let Ok(uri) = axum::http::Uri::from_parts(parts) {
            *request.uri_mut() = uri;
        }
    }
    request
}

/// Serves the API and S3 listeners until `shutdown` resolves, then drains requests in flight
/// and closes every database.
pub async fn serve(
    node: Node,
    api: TcpListener,
    s3: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_all(node, Listeners { api, s3, workers: None }, kura_workers::WorkersSettings::default(), shutdown).await
}

/// Serves every listener until `shutdown` resolves; with a Workers listener, also runs the
/// deployed Workers in workerd, their bindings served on a socket of their own.
pub async fn serve_all(
    node: Node,
    listeners: Listeners,
    workers_settings: kura_workers::WorkersSettings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let node_name = node.forwarding().map(|f| f.node().to_owned());
    let transfers = Arc::new(transfer::Transfers::open(&node.dir().join("transfers"), node_name.as_deref())?);
    let workers = match &listeners.workers {
        Some(_) => Some(
            kura_workers::Workers::open(
                node.dir().join("workers"),
                node.dir().join("do"),
                Arc::clone(node.catalog()),
                workers_settings,
            )
            .map_err(std::io::Error::other)?,
        ),
        None => None,
    };
    if let Some(workers) = &workers
        && node.forwarding().is_some()
    {
        node.durable_objects().set_hosted_let_go(workerd_lets_go(workers.clone()));
    }
    let state = AppState(Arc::new(Shared {
        catalog: Arc::clone(node.catalog()),
        d1: Arc::clone(node.d1()),
        transfers,
        r2: Arc::clone(node.r2()),
        kv: node.kv().clone(),
        queues: node.queues().clone(),
        durable_objects: node.durable_objects().clone(),
        workers: workers.clone(),
        forwarding: node.forwarding().cloned(),
        http: Arc::default(),
        s3_address: listeners.s3.local_addr().ok(),
    }));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let usage_flusher = tokio::spawn(flush_usage_periodically(Arc::clone(&state.d1), stopped(stop_rx.clone())));
    let api_server = serve_tcp(listeners.api, app(state.clone()), stopped(stop_rx.clone()));
    let sweeper = tokio::spawn(sweep_r2_periodically(
        Arc::clone(&state.catalog),
        Arc::clone(&state.r2),
        stopped(stop_rx.clone()),
    ));
    let kv_sweeper = tokio::spawn(sweep_kv_and_queues_periodically(
        Arc::clone(&state.catalog),
        state.kv.clone(),
        state.queues.clone(),
        stopped(stop_rx.clone()),
    ));
    let alarms =
        tokio::spawn(alarms::run(Arc::clone(&state.catalog), state.durable_objects.clone(), stopped(stop_rx.clone())));
    let domains = node.s3_domains();
    let s3_routes = s3::routes(Arc::clone(&state.catalog), Arc::clone(&state.r2), &domains);
    let domains = Arc::new(domains.iter().map(|d| d.to_ascii_lowercase()).collect::<Vec<_>>());
    let s3_app = axum::middleware::from_fn_with_state((state.clone(), domains), s3_edge).layer(s3_routes);
    let observed =
        |surface| axum::middleware::from_fn_with_state((Arc::clone(&state.http), surface), observe::observe_one);
    let s3_server = serve_tcp(listeners.s3, s3_app, stopped(stop_rx.clone()));
    let mut workers_servers = Vec::new();
    if let (Some(workers), Some(listener)) = (&workers, listeners.workers) {
        let socket = workers.bindings_socket().to_owned();
        let _ = std::fs::remove_file(&socket);
        let bindings = tokio::net::UnixListener::bind(&socket)?;
        // Wrapped whole, as the API's edge is (see [`app`]): the Workers' binding calls are a
        // hot path too.
        let binding_app = observed(observe::Surface::WorkerBindings).layer(worker_bindings(state.clone()));
        workers_servers.push(tokio::spawn(
            axum::serve(bindings, tower::make::Shared::new(binding_app))
                .with_graceful_shutdown(stopped(stop_rx.clone()))
                .into_future(),
        ));
        let proxy = serve_tcp(
            listener,
            observed(observe::Surface::Workers).layer(kura_workers::proxy::app(workers.clone())),
            stopped(stop_rx.clone()),
        );
        workers_servers.push(tokio::spawn(proxy));
        if let Err(e) = workers.start().await {
            tracing::error!(error = %e, "the deployed Workers could not be started");
        }
        let schedules = workers.clone().run_schedules(stopped(stop_rx.clone()));
        workers_servers.push(tokio::spawn(async move {
            schedules.await;
            Ok(())
        }));
        if workers.is_clustered() {
            let following = workers.clone().follow_catalog(stopped(stop_rx.clone()));
            let sharing = cluster::share_tails(state.clone(), stopped(stop_rx.clone()));
            workers_servers.push(tokio::spawn(async move {
                tokio::join!(following, sharing);
                Ok(())
            }));
        }
        let deliveries = workers.clone().run_queue_consumers(state.queues.clone(), stopped(stop_rx.clone()));
        workers_servers.push(tokio::spawn(async move {
            deliveries.await;
            Ok(())
        }));
    }
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let (api_result, s3_result) = tokio::join!(api_server, s3_server);
    for server in workers_servers {
        let _ = server.await;
    }
    if let Some(workers) = &workers {
        workers.shutdown().await;
    }
    let _ = usage_flusher.await;
    let _ = sweeper.await;
    let _ = kv_sweeper.await;
    let _ = alarms.await;
    state.d1.shutdown().await;
    state.durable_objects.shutdown().await;
    state.r2.shutdown().await;
    state.kv.storage().shutdown().await;
    state.queues.shutdown().await;
    drop(node);
    api_result.and(s3_result)
}

/// The S3 listener's work common to every request, as one middleware (see [`api_edge`]): the
/// request's id (S3's request id too), span and figures around the cluster's placement, and
/// the answer [`finished`].
async fn s3_edge(
    axum::extract::State((state, domains)): axum::extract::State<(AppState, Arc<Vec<String>>)>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let figures = Arc::clone(&state.http);
    let head = request.method() == axum::http::Method::HEAD;
    observe::observe_surface(&figures, observe::Surface::S3, request, |request| async move {
        finished(head, cluster::place_s3(axum::extract::State((state, domains)), request, next).await)
    })
    .await
}

/// An answer as the edge sends it. Overload (429) and unavailability (503) answers tell a
/// client when to come back, so an overloaded server sheds load instead of being asked again
/// at once: `Retry-After: 1` on a 429 or 503 that does not say when to retry. An answer to a
/// HEAD request carries no body, whether the router made it (which empties it too) or the
/// edge did (a cluster's refusal): HTTP/2 would send the body.
fn finished(head: bool, mut response: axum::response::Response) -> axum::response::Response {
    use axum::http::{HeaderValue, StatusCode, header};
    if matches!(response.status(), StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE) {
        response.headers_mut().entry(header::RETRY_AFTER).or_insert(HeaderValue::from_static("1"));
    }
    if head {
        *response.body_mut() = axum::body::Body::empty();
    }
    response
}

/// How long a client may take to send a request's headers (on a new connection, or between
/// requests on a kept-alive one): a client that trickles them holds a connection no longer.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(20);
pub use stall::BODY_IDLE_TIMEOUT;

/// Serves `app` on a TCP listener until `stop` resolves, then lets the requests in flight
/// finish. Unlike `axum::serve`, it bounds how long a client may take to send its headers,
/// and how long a request's body may stall ([`BODY_IDLE_TIMEOUT`]).
pub async fn serve_tcp(
    listener: TcpListener,
    app: impl Application,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, or a connection reset before it was accepted: wait a
                // moment rather than spin, and go on.
                tracing::warn!(error = %e, "could not accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Responses go out as soon as they are written: API calls are small request/response pairs.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let service = hyper_util::service::TowerToHyperService::new(expect_continue::Served { app: app.clone(), peer });
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Sweeps every bucket at start-up (orphan blobs left by a crash, the files of buckets whose
/// deletion was cut short) and then hourly (expired multipart uploads, blobs whose removal
/// failed).
async fn sweep_r2_periodically(catalog: Arc<Catalog>, r2: Arc<kura_r2::R2>, stop: impl Future<Output = ()>) {
    tokio::pin!(stop);
    loop {
        // The directories first, then the catalog: a bucket created in between is not taken
        // for the leftover of a deleted one.
        let dirs = r2.bucket_dirs();
        let buckets = {
            let catalog = Arc::clone(&catalog);
            tokio::task::spawn_blocking(move || catalog.all_r2_buckets()).await
        };
        match buckets {
            Ok(Ok(buckets)) => {
                if let Ok(dirs) = dirs {
                    let known = buckets.iter().map(|b| b.id.clone()).collect();
                    if let Err(e) = r2.remove_unknown_buckets(dirs, &known).await {
                        tracing::warn!(error = %e, "could not remove the storage of deleted buckets");
                    }
                }
                // In a cluster, each bucket is swept by its owner.
                for bucket in buckets.into_iter().filter(|b| r2.owns(&b.id)) {
                    if let Err(e) = r2.sweep(&bucket.id).await {
                        tracing::warn!(bucket = bucket.name, error = %e, "could not sweep a bucket");
                    }
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "could not list buckets to sweep"),
            Err(e) => tracing::warn!(error = %e, "the sweep task failed"),
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
        }
    }
}

/// Removes KV's expired keys at start-up and every five minutes; once an hour (and at start),
/// also the storage of deleted namespaces and queues and the orphan blobs a crash left.
async fn sweep_kv_and_queues_periodically(
    catalog: Arc<Catalog>,
    kv: kura_kv::Kv,
    queue_engine: kura_queues::Queues,
    stop: impl Future<Output = ()>,
) {
    const ROUNDS_PER_SWEEP: u32 = 12;
    tokio::pin!(stop);
    for round in 0u32.. {
        let storage = kv.storage();
        let dirs = storage.bucket_dirs();
        let queue_dirs = queue_engine.queue_dirs();
        let namespaces = {
            let catalog = Arc::clone(&catalog);
            tokio::task::spawn_blocking(move || catalog.all_kv_namespaces()).await
        };
        match namespaces {
            Ok(Ok(namespaces)) => {
                let full = round % ROUNDS_PER_SWEEP == 0;
                if full && let Ok(dirs) = dirs {
                    let known = namespaces.iter().map(|n| n.id.clone()).collect();
                    if let Err(e) = storage.remove_unknown_buckets(dirs, &known).await {
                        tracing::warn!(error = %e, "could not remove the storage of deleted KV namespaces");
                    }
                }
                if full && let Ok(queues) = catalog.all_queues() {
                    let known = queues.into_iter().map(|q| q.id).collect();
                    let removed = queue_engine.remove_unknown(queue_dirs, &known).await;
                    if removed > 0 {
                        tracing::info!(removed, "removed the files of deleted queues");
                    }
                }
                // In a cluster, each namespace is swept by its owner.
                for namespace in namespaces.into_iter().filter(|n| storage.owns(&n.id)) {
                    if full && let Err(e) = storage.sweep(&namespace.id).await {
                        tracing::warn!(namespace = namespace.id, error = %e, "could not sweep a KV namespace");
                    }
                    match kv.remove_expired(&namespace.id).await {
                        Ok(0) => {}
                        Ok(n) => tracing::debug!(namespace = namespace.id, removed = n, "removed expired KV keys"),
                        Err(e) => {
                            tracing::warn!(namespace = namespace.id, error = %e, "could not remove expired KV keys")
                        }
                    }
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "could not list KV namespaces to sweep"),
            Err(e) => tracing::warn!(error = %e, "the KV sweep task failed"),
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(Duration::from_secs(300)) => {}
        }
    }
}

/// What makes workerd close every object file it has open: a restart (requests wait at the
/// gate meanwhile), one at a time however often it is asked for while one is under way.
fn workerd_lets_go(workers: kura_workers::Workers) -> Arc<dyn Fn() + Send + Sync> {
    use std::sync::atomic::{AtomicU8, Ordering};
    // 0: idle; 1: restarting; 2: restarting, and asked again since it began (what was asked
    // for then, such as alarms written to workerd's schedule, may have been read too early).
    let state = Arc::new(AtomicU8::new(0));
    let swap =
        |state: &AtomicU8, from, to| state.compare_exchange(from, to, Ordering::SeqCst, Ordering::SeqCst).is_ok();
    Arc::new(move || {
        loop {
            if swap(&state, 0, 1) {
                break;
            }
            if swap(&state, 1, 2) || state.load(Ordering::SeqCst) == 2 {
                return;
            }
        }
        let (workers, state) = (workers.clone(), Arc::clone(&state));
        tokio::spawn(async move {
            loop {
                tracing::info!("restarting workerd: it must close an object's file or read its alarm schedule again");
                if let Err(e) = workers.with_workerd_stopped(async {}).await {
                    tracing::warn!(error = %e, "could not restart workerd");
                }
                // Idle again, unless asked again meanwhile: then once more.
                if swap(&state, 1, 0) {
                    return;
                }
                state.store(1, Ordering::SeqCst);
            }
        });
    })
}

async fn flush_usage_periodically(d1: Arc<D1>, stop: impl Future<Output = ()>) {
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(Duration::from_secs(30)) => {
                let d1 = Arc::clone(&d1);
                let flushed = tokio::task::spawn_blocking(move || d1.flush_usage()).await;
                if let Ok(Err(e)) = flushed {
                    tracing::warn!(error = %e, "could not save D1 usage counters");
                }
            }
        }
    }
}
