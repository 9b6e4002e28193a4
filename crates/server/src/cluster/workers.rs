//! A deployed Worker's D1 and R2 calls in a cluster. Every node's workerd runs every Worker, so
//! a Worker's `env.DB` or `env.BUCKET` call arrives on the binding socket of whichever node
//! served the request; it is served there when that node owns the database or bucket (taking
//! it over if no live node does), and otherwise sent to the owner's API listener under
//! [`WORKER_BINDINGS_PATH`], stamped as a node's request, where it is served as if the owner's
//! own workerd had sent it. The Worker sees the same answers and errors as on one node.

use std::convert::Infallible;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Uri};
use axum::middleware::Next;
use axum::response::Response;
use kura_workers::config::headers;

use super::{Placed, api::resolve_database, serve_placed};
use crate::error::{ApiError, Wire};
use crate::state::AppState;

/// Where a node takes in the binding calls another node's Workers make (on the API listener).
pub(crate) const WORKER_BINDINGS_PATH: &str = "/kura/worker-bindings";

/// The binding socket's placement: a D1 call goes to its database's owner, an R2 call to its
/// bucket's, a KV call to its namespace's, a queue producer's to its queue's, a Durable Object
/// stub's to the node serving its namespace; everything else (logs, assets) is served here.
pub(crate) async fn place_worker_binding(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let Some(forwarding) = app.forwarding.clone() else { return next.run(request).await };
    let (placed, shape) = match placed_by(&app, &request) {
        Ok(Some(placed)) => placed,
        Ok(None) => return next.run(request).await,
        Err((shape, e)) => return shape.refuse(e),
    };
    // Checked before anything leaves this node: only this node's workerd (or another node)
    // may send the owner a Worker's call.
    if let Err(e) = crate::binding::from_workerd(&app, request.headers()) {
        return shape.refuse(e);
    }
    serve_placed(&app, &forwarding, placed, shape, request, next, WORKER_BINDINGS_PATH).await
}

/// What a binding call is placed by, and the shape its refusals take; `None` for what is
/// served here whoever owns what (including a bucket nobody has, answered as R2 answers it).
fn placed_by(app: &AppState, request: &Request) -> Result<Option<(Placed, Wire)>, (Wire, ApiError)> {
    let header = |name| request.headers().get(name).and_then(|v| v.to_str().ok());
    if let Some(database) = header(headers::D1_DATABASE) {
        return match resolve_database(app, request, header(headers::ACCOUNT), database) {
            Ok(uuid) => Ok(Some((Placed::Database(uuid), Wire::D1Binding))),
            Err(e) => Err((Wire::D1Binding, e)),
        };
    }
    let account = header(headers::ACCOUNT).unwrap_or_default();
    if let Some(namespace) = header(headers::DO_NAMESPACE) {
        return match app.catalog.do_namespace(account, namespace) {
            Ok(found) => Ok(found.map(|namespace| (Placed::Namespace(namespace.id), Wire::StatusLine))),
            Err(e) => Err((Wire::StatusLine, ApiError::internal(&e))),
        };
    }
    if let Some(queue) = header(headers::QUEUE) {
        return match app.catalog.queue(account, queue) {
            Ok(found) => Ok(found.map(|queue| (Placed::Queue(queue.id), Wire::StatusLine))),
            Err(e) => Err((Wire::StatusLine, ApiError::internal(&e))),
        };
    }
    if let Some(namespace) = header(headers::KV_NAMESPACE) {
        return match app.catalog.kv_namespace(account, namespace) {
            Ok(found) => Ok(found.map(|namespace| (Placed::KvNamespace(namespace.id), Wire::StatusLine))),
            Err(e) => Err((Wire::StatusLine, ApiError::internal(&e))),
        };
    }
    let Some(bucket) = header(headers::R2_BUCKET) else { return Ok(None) };
    match app.catalog.r2_bucket(account, bucket) {
        Ok(found) => Ok(found.map(|bucket| (Placed::Bucket(bucket.id), Wire::R2Binding))),
        Err(e) => Err((Wire::R2Binding, ApiError::internal(&e))),
    }
}

/// `…/kura/worker-bindings/<path>` on the API listener: a binding call another node's Worker
/// made, served by `bindings` (the binding socket's routes, with their placement) as if this
/// node's workerd had sent it. Only a node's stamped request is taken.
pub(crate) async fn from_node<S>(app: AppState, bindings: S, mut request: Request) -> Response
where
    S: tower::Service<Request, Response = Response, Error = Infallible>,
{
    use tower::ServiceExt;
    let (Some(forwarding), Some(workers)) = (&app.forwarding, &app.workers) else {
        return Wire::V4.refuse(ApiError::no_route());
    };
    if !forwarding.is_forwarded(&request) {
        return Wire::V4.refuse(ApiError::forbidden());
    }
    let inner = request.uri().path_and_query().map_or("", |p| p.as_str()).strip_prefix(WORKER_BINDINGS_PATH);
    let Some(uri) = inner.filter(|p| p.starts_with('/')).and_then(|p| p.parse::<Uri>().ok()) else {
        return Wire::V4.refuse(ApiError::no_route());
    };
    *request.uri_mut() = uri;
    let Ok(secret) = HeaderValue::from_str(workers.secret()) else {
        return Wire::V4.refuse(ApiError::forbidden());
    };
    request.headers_mut().insert(headers::SECRET, secret);
    // Its stamp was for the path it came by: within this node it stays a node's request.
    request.extensions_mut().insert(crate::forward::FromNode);
    match bindings.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}
