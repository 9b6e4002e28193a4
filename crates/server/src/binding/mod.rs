//! The binding protocols: what a Workers runtime's bindings send to the service behind them.
//!
//! - On the API listener, for any client (a hand-configured workerd, a script, the Node
//!   bindings in `packages/kura-bindings`): D1's and R2's bindings, authenticated with the v4
//!   API's bearer tokens ([`routes`]).
//! - On the Workers' own socket, for the workerd kura supervises ([`worker_routes`]): D1, R2,
//!   KV, queue producers, Durable Object announcements, logs and `env.ASSETS`. workerd adds to every request the headers its
//!   configuration names — this run's secret, the account, the database or bucket — and the
//!   Worker's code can neither see nor change them.

mod d1;
mod kv;
mod objects;
mod queues;
mod r2;
mod workers;

use axum::Router;
use axum::http::HeaderMap;
use axum::routing::{get, post};

use crate::error::{ApiError, Wire};
use crate::routing::{Routes, Touches};
use crate::state::AppState;
use kura_workers::config::headers;

pub(crate) use d1::{DATABASE_HEADER, SESSION_HEADER, SendToOwner, ToOwner};

/// The binding routes, on the API listener.
pub(crate) fn routes() -> Routes {
    let in_path = Touches::Database(Wire::D1Binding);
    Routes::default()
        // workerd's D1 shim posts to `http://d1/query` and `/execute`; the database is named by a
        // header the service's configuration injects.
        .route("/query", Touches::DatabaseByHeader, post(d1::query))
        .route("/execute", Touches::DatabaseByHeader, post(d1::query))
        // The same, with the database in the path, for clients that choose their URLs.
        .route("/binding/d1/{database}/query", in_path, post(d1::query_at))
        .route("/binding/d1/{database}/execute", in_path, post(d1::query_at))
        // R2's, with the bucket in the path: the requests and replies of a Worker's `env.BUCKET`.
        .route(
            "/binding/r2/{bucket}",
            Touches::BindingBucket,
            get(r2::read_at).put(r2::write_at).layer(axum::extract::DefaultBodyLimit::disable()),
        )
}

/// The routes of the Workers' binding socket.
pub(crate) fn worker_routes(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/query", post(d1::query_from_worker))
        .route("/execute", post(d1::query_from_worker))
        // R2 bodies stream to and from the blob store; their limit is R2's.
        .route("/", get(r2::read).put(r2::write).layer(axum::extract::DefaultBodyLimit::disable()))
        .route("/objects", post(workers::announce))
        .route("/objects/call", post(objects::call))
        .route("/logs", post(workers::logs))
        // `env.ASSETS.fetch()`, KV's and queues' requests ask for any path: each is told apart
        // by its header, not its route.
        .layer(axum::middleware::from_fn_with_state(state.clone(), workers::assets))
        .layer(axum::middleware::from_fn_with_state(state.clone(), kv::serve))
        .layer(axum::middleware::from_fn_with_state(state, queues::serve))
}

/// The Workers layer, for a request on its socket that carries this run's secret.
pub(crate) fn from_workerd<'a>(app: &'a AppState, request: &HeaderMap) -> Result<&'a kura_workers::Workers, ApiError> {
    let Some(workers) = &app.workers else { return Err(ApiError::forbidden()) };
    let sent = request.get(headers::SECRET).map(|v| v.as_bytes()).unwrap_or_default();
    if !constant_time_eq(sent, workers.secret().as_bytes()) {
        return Err(ApiError::forbidden());
    }
    Ok(workers)
}

/// The account a request on the Workers' socket acts for, once its secret checks out.
pub(crate) fn worker_account(app: &AppState, request: &HeaderMap) -> Result<String, ApiError> {
    from_workerd(app, request)?;
    request
        .get(headers::ACCOUNT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| ApiError::bad_request(format!("the {} header names no account", headers::ACCOUNT)))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
