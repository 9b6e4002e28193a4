//! In a cluster, the front door of both listeners: a request for a D1 database, an R2 bucket or
//! a Durable Object namespace is served here when this node owns it (taking it over if no live node does) and sent on to
//! its owner otherwise, so a client sees one service whichever node it reaches. Surfaces a
//! cluster does not serve yet are refused plainly rather than served from one node's disk.
//!
//! - [`api`]: the API listener's placement (v4 D1, R2 and Durable Object routes, the D1 and R2
//!   binding endpoints), by what each route touches ([`crate::routing`]).
//! - [`s3`]: the S3 listener's placement, by the bucket a request names and the key it is
//!   signed with; forwarded requests keep their `Host`, so the owner checks the client's own
//!   signature.
//! - [`workers`]: the placement of the D1, R2, KV and queue calls deployed Workers make on the
//!   binding socket, sent to the owner's API listener under [`WORKER_BINDINGS_PATH`].
//! - [`tails`]: live tails that hear every node's invocations.

mod api;
mod s3;
mod tails;
mod workers;

pub use api::place;
pub use s3::place_s3;
pub(crate) use tails::share as share_tails;
pub(crate) use workers::{WORKER_BINDINGS_PATH, from_node, place_worker_binding};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{get, post};
use kura_sqlite::PlacementError;

use crate::auth::Caller;
use crate::error::{ApiError, Wire, ok};
use crate::extract::V4Path;
use crate::forward::{FORWARDED_BY, Forwarding};
use crate::routing::{Routes, Touches};
use crate::state::AppState;

/// The file a request is placed by: one D1 database, one R2 bucket, one Durable Object
/// namespace, one KV namespace or one queue, by its id.
enum Placed {
    Database(String),
    Bucket(String),
    Namespace(String),
    KvNamespace(String),
    Queue(String),
}

/// Why a request was not served here.
enum Unplaced {
    /// Where it is served, or why nowhere now.
    Placement(PlacementError),
    /// Refused before placement (a bad id, a failing catalog).
    Refused(ApiError),
}

impl Placed {
    fn what(&self) -> &'static str {
        match self {
            Placed::Database(_) => "database",
            Placed::Bucket(_) => "bucket",
            Placed::Namespace(_) => "namespace",
            Placed::KvNamespace(_) => "KV namespace",
            Placed::Queue(_) => "queue",
        }
    }

    async fn claim(&self, app: &AppState) -> Result<(), Unplaced> {
        match self {
            Placed::Database(uuid) => app.d1.claim(uuid).await.map_err(|e| match e {
                kura_d1::Error::Placement(e) => Unplaced::Placement(e),
                other => Unplaced::Refused(ApiError::from(other)),
            }),
            Placed::Bucket(id) => app.r2.claim(id).await.map_err(Unplaced::Placement),
            Placed::Namespace(id) => app.durable_objects.claim_namespace(id).await.map_err(Unplaced::Placement),
            Placed::KvNamespace(id) => app.kv.storage().claim(id).await.map_err(Unplaced::Placement),
            // A queue taken over here has its push deliveries' leases released by this node's
            // delivery loop ([`kura_queues::Queues::took_over`]).
            Placed::Queue(id) => app.queues.claim(id).await.map_err(Unplaced::Placement),
        }
    }

    fn forget_owner(&self, app: &AppState) {
        match self {
            Placed::Database(uuid) => app.d1.forget_owner(uuid),
            Placed::Bucket(id) => app.r2.forget_owner(id),
            Placed::Namespace(id) => app.durable_objects.forget_namespace_owner(id),
            Placed::KvNamespace(id) => app.kv.storage().forget_owner(id),
            Placed::Queue(id) => app.queues.forget_owner(id),
        }
    }
}

/// Serves `request` here if this node owns what it is placed by, or sends it to the owner
/// (to `via` under the owner's URL: its API, or for the binding socket's requests the path
/// that takes them in).
async fn serve_placed(
    app: &AppState,
    forwarding: &Forwarding,
    placed: Placed,
    shape: Wire,
    request: Request,
    next: Next,
    via: &'static str,
) -> Response {
    let forwarded = forwarding.is_forwarded(&request);
    let mut claimed = placed.claim(app).await;
    if matches!(claimed, Err(Unplaced::Placement(PlacementError::Elsewhere { .. }))) && forwarded {
        // Sent here to be served: the owner this node remembers may be the sender (a draining
        // node, or one that stepped down); ask the coordinator again.
        placed.forget_owner(app);
        claimed = placed.claim(app).await;
    }
    match claimed {
        Ok(()) => forwarding.served_here(next.run(request).await),
        Err(Unplaced::Placement(PlacementError::Elsewhere { node, url, s3 })) => {
            if forwarded {
                let from = request.headers().get(FORWARDED_BY);
                tracing::info!(
                    ?from,
                    owner = node,
                    "a forwarded request reached a node that no longer owns its target"
                );
                let what = placed.what();
                return shape.refuse(ApiError::unavailable(format!("the {what}'s ownership is moving; retry shortly")));
            }
            if let Placed::Database(uuid) = &placed
                && shape == Wire::D1Binding
                && let Some(at_least) = accepts_a_copy(request.headers())
            {
                // A Sessions read: this node's copy may serve it, which only the handler knows
                // once it has read the statements; it sends the read on if not.
                let owner = ReadToOwner {
                    uuid: uuid.clone(),
                    node,
                    url,
                    via,
                    method: request.method().clone(),
                    uri: request.uri().clone(),
                    request_id: request.extensions().get::<crate::observe::RequestId>().cloned(),
                };
                let to_owner = crate::binding::ToOwner { at_least, owner: std::sync::Arc::new(owner) };
                let mut request = request;
                request.extensions_mut().insert(to_owner);
                return next.run(request).await;
            }
            let target = format!("{}{via}", if shape == Wire::S3 { s3 } else { url });
            send_to_owner(app, forwarding, &placed, &node, &target, request, shape).await
        }
        Err(Unplaced::Placement(e)) => shape.refuse(ApiError::unavailable(format!("the {} is {e}", placed.what()))),
        Err(Unplaced::Refused(e)) => shape.refuse(e),
    }
}

/// Sends `request` to the owner `node` at `target`; an owner that does not answer as one is
/// looked up again next time.
async fn send_to_owner(
    app: &AppState,
    forwarding: &Forwarding,
    placed: &Placed,
    node: &str,
    target: &str,
    request: Request,
    shape: Wire,
) -> Response {
    let response = forwarding.forward(request, node, target, shape).await;
    if matches!(response.status(), StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY) {
        // The owner is gone or no longer owns it: look again next time.
        placed.forget_owner(app);
    }
    response
}

/// The state a D1 binding call's session accepts a copy at: any state (`None`) for
/// `first-unconstrained`, its bookmark's or a later one for a bookmark. `None` for what the primary
/// must answer (`first-primary`, no session, or a token that is not one, which the owner refuses).
fn accepts_a_copy(headers: &axum::http::HeaderMap) -> Option<Option<kura_d1::Bookmark>> {
    match headers.get(crate::binding::SESSION_HEADER)?.to_str().ok()? {
        "first-unconstrained" => Some(None),
        token => token.parse::<kura_d1::Bookmark>().ok().map(Some),
    }
}

/// Where a D1 Sessions read placed here goes if no copy here can serve it: the database, its
/// owner, and what of the request the handler does not hand over.
struct ReadToOwner {
    uuid: String,
    node: String,
    /// The owner's API, and the path under it the read is sent to.
    url: String,
    via: &'static str,
    method: axum::http::Method,
    uri: axum::http::Uri,
    request_id: Option<crate::observe::RequestId>,
}

impl crate::binding::SendToOwner for ReadToOwner {
    fn send<'a>(
        &'a self,
        app: &'a AppState,
        headers: axum::http::HeaderMap,
        body: bytes::Bytes,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send + 'a>> {
        let mut request = Request::new(axum::body::Body::from(body));
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = headers;
        if let Some(id) = self.request_id.clone() {
            request.extensions_mut().insert(id);
        }
        Box::pin(async move {
            let Some(forwarding) = &app.forwarding else {
                return Wire::D1Binding
                    .refuse(ApiError::internal_text(&"a read placed by a cluster on a node outside one"));
            };
            let placed = Placed::Database(self.uuid.clone());
            let target = format!("{}{}", self.url, self.via);
            send_to_owner(app, forwarding, &placed, &self.node, &target, request, Wire::D1Binding).await
        })
    }
}

/// The cluster's own v4 routes: a node's view of the cluster, and draining it.
pub(crate) fn routes() -> Routes {
    Routes::default()
        .route("/client/v4/accounts/{account_id}/kura/cluster", Touches::Anywhere, get(status))
        .route("/client/v4/accounts/{account_id}/kura/cluster/drain", Touches::Anywhere, post(drain))
        .merge(tails::routes())
        .with_router(|router| router.method_not_allowed_fallback(|| async { ApiError::method_not_allowed() }))
}

/// `GET /accounts/{account_id}/kura/cluster`: this node's view of the cluster, for an admin
/// token of the account (`kura node status`).
async fn status(
    State(app): State<AppState>,
    caller: Caller,
    V4Path(account_id): V4Path<String>,
) -> Result<Response, ApiError> {
    let mut status = cluster_for(&app, &caller, &account_id)?.status().status().await;
    if let Some(workers) = &app.workers {
        let running: Vec<serde_json::Value> = workers
            .running()
            .into_iter()
            .filter(|(account, _, _)| *account == account_id)
            .map(|(_, script, version)| serde_json::json!({ "script": script, "version_id": version }))
            .collect();
        // The namespaces of deployed classes whose objects this node's workerd runs.
        let namespaces = app.catalog.list_do_namespaces(&account_id).map_err(|e| ApiError::internal(&e))?;
        let object_namespaces: Vec<serde_json::Value> = namespaces
            .iter()
            .filter(|n| n.hosted_by_workerd() && app.durable_objects.serves_namespace(&n.id))
            .map(|n| serde_json::json!({ "id": n.id, "script": n.script, "class": n.class_name }))
            .collect();
        // No node holds the schedules: each minute of each is claimed in the shared catalog by
        // the first node to reach it.
        let schedules: Vec<serde_json::Value> = app
            .catalog
            .deployed_worker_schedules()
            .map_err(|e| ApiError::internal(&e))?
            .into_iter()
            .filter_map(|s| {
                let script = app.catalog.worker_script_by_id(&s.script_id).ok().flatten()?;
                (script.account_id == account_id).then(
                    || serde_json::json!({ "script": script.name, "cron": s.cron, "last_minute": s.fired_minute }),
                )
            })
            .collect();
        status["workers"] = serde_json::json!({
            "running": running,
            "cron_runs": workers.cron_runs(),
            "schedules": schedules,
            "object_namespaces": object_namespaces,
        });
    }
    Ok(ok(status))
}

/// `POST /accounts/{account_id}/kura/cluster/drain`: this node gives every database up and
/// takes none from now on (`kura node drain`), for an admin token of the account.
async fn drain(
    State(app): State<AppState>,
    caller: Caller,
    V4Path(account_id): V4Path<String>,
) -> Result<Response, ApiError> {
    Ok(ok(cluster_for(&app, &caller, &account_id)?.status().drain().await))
}

/// The node's cluster side, for an admin token of `account_id` with no bucket limit.
fn cluster_for<'a>(app: &'a AppState, caller: &Caller, account_id: &str) -> Result<&'a Forwarding, ApiError> {
    caller.require_unlimited_admin(account_id)?;
    app.forwarding
        .as_ref()
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, 7404, "this kura node runs alone, not in a cluster"))
}
