//! The binding protocols: what a Workers runtime's bindings (workerd's `env.DB`) send to the
//! service behind them, served over HTTP so a workerd, or any client, can point a binding at
//! kura. Requests authenticate with the same bearer tokens as the v4 API.

mod d1;

use axum::Router;
use axum::routing::post;

use crate::AppState;

/// The binding routes, on the API listener.
pub fn routes() -> Router<AppState> {
    Router::new()
        // workerd's D1 shim posts to `http://d1/query` and `/execute`; the database is named by a
        // header the service's configuration injects.
        .route("/query", post(d1::query))
        .route("/execute", post(d1::query))
        // The same, with the database in the path, for clients that choose their URLs.
        .route("/binding/d1/{database}/query", post(d1::query_at))
        .route("/binding/d1/{database}/execute", post(d1::query_at))
}
