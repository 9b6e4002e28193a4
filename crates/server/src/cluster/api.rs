//! The API listener's placement: v4 routes and binding endpoints that touch a D1 database, an
//! R2 bucket or a Durable Object namespace go to its owner; the catalog's routes are served by
//! any node. What a route touches is declared where the route is ([`crate::routing`]).

use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use super::{Placed, serve_placed};
use crate::error::{ApiError, Wire};
use crate::routing::{RouteTable, Touches};
use crate::state::AppState;

/// What a request reaches, as far as placement goes.
enum Target<'a> {
    /// One D1 database, by id or name (`account` known for names from the v4 path).
    Database { account: Option<&'a str>, id: &'a str, wire: Wire },
    /// One R2 bucket of the account, by name.
    Bucket { account: &'a str, name: &'a str },
    /// One R2 bucket of the token's account, by name, for the R2 binding.
    BindingBucket { name: &'a str },
    /// One Durable Object namespace of the account, by id or name.
    Namespace { account: &'a str, namespace: &'a str },
    /// One KV namespace of the account, by id.
    KvNamespace { account: &'a str, namespace: &'a str },
    /// One queue of the account, by id.
    Queue { account: &'a str, queue: &'a str },
    /// A D1 export's download or import's upload, held by the node its token names.
    Transfer { node: &'a str },
    /// Something a cluster does not serve yet.
    NotClustered(&'static str),
    /// The catalog or nothing node-specific: any node serves it.
    Anywhere,
}

/// What `path` reaches, by the route table the router was built from.
fn classify<'a>(table: &'a RouteTable, path: &'a str, headers: &'a HeaderMap) -> Target<'a> {
    let Some(found) = table.find(path) else { return Target::Anywhere };
    let param = |name| found.param(name).unwrap_or_default();
    match found.touches {
        Touches::Anywhere => Target::Anywhere,
        Touches::Database(wire) => Target::Database { account: found.param("account_id"), id: param("database"), wire },
        Touches::DatabaseByHeader => match headers.get(crate::binding::DATABASE_HEADER).and_then(|v| v.to_str().ok()) {
            Some(id) => Target::Database { account: None, id, wire: Wire::D1Binding },
            None => Target::Anywhere,
        },
        Touches::Bucket => Target::Bucket { account: param("account_id"), name: param("bucket") },
        Touches::BindingBucket => Target::BindingBucket { name: param("bucket") },
        // A namespace's details (its object count), objects, queries and fan-outs go to the node
        // serving it; the list of namespaces is the catalog's.
        Touches::Namespace => Target::Namespace { account: param("account_id"), namespace: param("namespace") },
        Touches::KvNamespace => Target::KvNamespace { account: param("account_id"), namespace: param("namespace") },
        Touches::Queue => Target::Queue { account: param("account_id"), queue: param("queue") },
        Touches::Transfer => match param("token").split_once(crate::transfer::NODE_SEPARATOR) {
            Some((node, _)) => Target::Transfer { node },
            None => Target::Anywhere,
        },
        Touches::NotClustered(what) => Target::NotClustered(what),
    }
}

/// The API listener's placement: places each request (see the module's documentation) by
/// what its route touches in `table`.
pub async fn place(app: AppState, table: &RouteTable, request: Request, next: Next) -> Response {
    let Some(forwarding) = app.forwarding.clone() else { return next.run(request).await };
    let (placed, shape) = match classify(table, request.uri().path(), request.headers()) {
        Target::Anywhere => return next.run(request).await,
        Target::Transfer { node } if node == forwarding.node() => return next.run(request).await,
        Target::Transfer { node } => {
            let node = node.to_owned();
            return forwarding.forward_transfer(request, &node).await;
        }
        Target::NotClustered(what) => {
            return Wire::V4.refuse(ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                7500,
                format!("{what} is not served by a kura cluster yet; run it on a single node"),
            ));
        }
        Target::Database { account, id, wire: shape } => match resolve_database(&app, &request, account, id) {
            Ok(uuid) => (Placed::Database(uuid), shape),
            Err(e) => return shape.refuse(e),
        },
        Target::Namespace { account, namespace } => match app.catalog.do_namespace(account, namespace) {
            Ok(Some(found)) => (Placed::Namespace(found.id), Wire::V4),
            // Unknown here (yet): answered here. A namespace made on another node a moment ago
            // may be found by the handler; its engine then claims it before serving, as the
            // placement would have.
            Ok(None) => return forwarding.served_here(next.run(request).await),
            Err(e) => return Wire::V4.refuse(ApiError::internal(&e)),
        },
        Target::KvNamespace { account, namespace } => match app.catalog.kv_namespace(account, namespace) {
            Ok(Some(found)) => (Placed::KvNamespace(found.id), Wire::V4),
            // An unknown namespace is nobody's: answered here (as not found).
            Ok(None) => return forwarding.served_here(next.run(request).await),
            Err(e) => return Wire::V4.refuse(ApiError::internal(&e)),
        },
        Target::Queue { account, queue } => match app.catalog.queue(account, queue) {
            Ok(Some(found)) => (Placed::Queue(found.id), Wire::V4),
            // An unknown queue is nobody's: answered here (as not found).
            Ok(None) => return forwarding.served_here(next.run(request).await),
            Err(e) => return Wire::V4.refuse(ApiError::internal(&e)),
        },
        Target::Bucket { account, name } => match app.catalog.r2_bucket(account, name) {
            Ok(Some(bucket)) => (Placed::Bucket(bucket.id), Wire::V4),
            // An unknown bucket is nobody's: answered here (as not found).
            Ok(None) => return forwarding.served_here(next.run(request).await),
            Err(e) => return Wire::V4.refuse(ApiError::internal(&e)),
        },
        Target::BindingBucket { name } => {
            let account = match crate::auth::Caller::from_headers(request.headers(), &app) {
                Ok(caller) => caller.token.account_id,
                Err(e) => return Wire::R2Binding.refuse(e),
            };
            match app.catalog.r2_bucket(&account, name) {
                Ok(Some(bucket)) => (Placed::Bucket(bucket.id), Wire::R2Binding),
                Ok(None) => return forwarding.served_here(next.run(request).await),
                Err(e) => return Wire::R2Binding.refuse(ApiError::internal(&e)),
            }
        }
    };
    serve_placed(&app, &forwarding, placed, shape, request, next, "").await
}

/// The id of the database a request names (by id, or by name within the path's account or
/// the token's), once the catalog knows it: nothing is claimed for a database that does not
/// exist.
pub(super) fn resolve_database(
    app: &AppState,
    request: &Request,
    account: Option<&str>,
    id: &str,
) -> Result<String, ApiError> {
    let account = match account {
        Some(account) => account.to_owned(),
        None if is_uuid(id) => String::new(),
        None => crate::auth::Caller::from_headers(request.headers(), app)?.token.account_id,
    };
    let found = match is_uuid(id) {
        true => app.d1.get_by_uuid(&id.to_ascii_lowercase())?,
        false => app.d1.catalog().d1_database(&account, id)?.map(std::sync::Arc::new),
    };
    found
        .map(|db| db.uuid.clone())
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, 7404, format!("The database {id} could not be found")))
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}
