//! In a cluster, the API listener's front door: a request for a D1 database is served here when
//! this node owns the database (taking it over if no live node does) and sent on to its owner
//! otherwise, so a client sees one service whichever node it reaches. Surfaces a cluster does
//! not serve yet are refused plainly rather than served from one node's disk.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::TryStreamExt;
use kura_d1::PlacementError;

use crate::AppState;
use crate::rest::ApiError;

/// Marks a request another node sent on: it is served where it lands or refused, never sent
/// on again (ownership moving while it travelled).
const FORWARDED_BY: &str = "x-kura-forwarded-by";

/// How long a forwarded request may go without a byte from the owner: past a D1 query's own
/// limit (30 s) and a lease's TTL, so only a node that stopped answering reaches it.
const FORWARD_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Names the node that served a database's request, for operators (and the cluster tests).
pub const SERVED_BY: &str = "x-kura-node";

/// What `kura node status` shows of a node: its view of the cluster (implemented over the
/// coordinator and the placement by the binary that joins the cluster).
#[async_trait::async_trait]
pub trait ClusterStatus: Send + Sync {
    /// The members, and what this node owns with its shipping counts, as JSON.
    async fn status(&self) -> serde_json::Value;
    /// Gives everything up and takes nothing more; answers the status after.
    async fn drain(&self) -> serde_json::Value;
}

/// How this node reaches the others.
#[derive(Clone)]
pub struct Forwarding {
    node: String,
    client: reqwest::Client,
    status: std::sync::Arc<dyn ClusterStatus>,
}

impl std::fmt::Debug for Forwarding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarding").field("node", &self.node).finish_non_exhaustive()
    }
}

impl Forwarding {
    /// Forwarding for the node named `node`, which reports itself through `status`.
    pub fn new(node: impl Into<String>, status: std::sync::Arc<dyn ClusterStatus>) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(2))
            // A paused owner accepts connections into its backlog and never answers.
            .read_timeout(FORWARD_READ_TIMEOUT)
            .tcp_nodelay(true)
            .build()
            .expect("an HTTP client builds");
        Forwarding { node: node.into(), client, status }
    }

    /// Sends `request` to the node whose API is at `url` and streams its answer back.
    async fn forward(&self, request: Request, owner: &str, url: &str, binding: bool) -> Response {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let mut headers = without_hop_headers(&parts.headers);
        headers.remove(header::HOST);
        headers.insert(HeaderName::from_static(FORWARDED_BY), self.node.parse().expect("node ids are header-safe"));
        let body = reqwest::Body::wrap_stream(body.into_data_stream());
        let sent = self.client.request(parts.method, format!("{url}{path}")).headers(headers).body(body).send().await;
        match sent {
            Ok(answer) => {
                let mut response = Response::builder().status(answer.status());
                if let Some(out) = response.headers_mut() {
                    *out = without_hop_headers(answer.headers());
                }
                let stream = answer.bytes_stream().map_err(std::io::Error::other);
                response.body(Body::from_stream(stream)).unwrap_or_else(|e| ApiError::internal(&e).into_response())
            }
            Err(e) if e.is_connect() => {
                tracing::warn!(owner, url, error = %e, "could not reach a database's owner");
                refuse(
                    ApiError::unavailable(format!(
                        "the database's owner, node {owner}, cannot be reached; retry shortly"
                    )),
                    binding,
                )
            }
            // The request reached the owner: whether it took effect is unknown, as when a
            // client's own connection breaks.
            Err(e) => {
                tracing::warn!(owner, url, error = %e, "a database's owner failed while answering");
                refuse(
                    ApiError::new(
                        StatusCode::BAD_GATEWAY,
                        7500,
                        format!(
                            "the database's owner, node {owner}, failed while answering; the request may or may not have taken effect"
                        ),
                    ),
                    binding,
                )
            }
        }
    }
}

/// `GET /accounts/{account_id}/kura/cluster`: this node's view of the cluster, for an admin
/// token of the account (`kura node status`).
pub async fn status(
    State(app): State<AppState>,
    caller: crate::auth::Caller,
    crate::rest::extract::V4Path(account_id): crate::rest::extract::V4Path<String>,
) -> Result<Response, ApiError> {
    Ok(crate::rest::ok(cluster_for(&app, &caller, &account_id)?.status.status().await))
}

/// `POST /accounts/{account_id}/kura/cluster/drain`: this node gives every database up and
/// takes none from now on (`kura node drain`), for an admin token of the account.
pub async fn drain(
    State(app): State<AppState>,
    caller: crate::auth::Caller,
    crate::rest::extract::V4Path(account_id): crate::rest::extract::V4Path<String>,
) -> Result<Response, ApiError> {
    Ok(crate::rest::ok(cluster_for(&app, &caller, &account_id)?.status.drain().await))
}

/// The node's cluster side, for an admin token of `account_id`.
fn cluster_for<'a>(
    app: &'a AppState,
    caller: &crate::auth::Caller,
    account_id: &str,
) -> Result<&'a Forwarding, ApiError> {
    if caller.token.account_id != account_id || caller.scope() != kura_catalog::Scope::Admin {
        return Err(ApiError::forbidden());
    }
    app.forwarding
        .as_ref()
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, 7404, "this kura node runs alone, not in a cluster"))
}

/// Headers that belong to one connection, not to the request.
fn without_hop_headers(headers: &HeaderMap) -> HeaderMap {
    let mut kept = headers.clone();
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        kept.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::TE,
        header::TRAILER,
        header::PROXY_AUTHORIZATION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ] {
        kept.remove(name);
    }
    kept
}

/// What a request reaches, as far as placement goes.
enum Target<'a> {
    /// One D1 database, by id or name (`account` known for names from the v4 path).
    Database { account: Option<&'a str>, id: &'a str, binding: bool },
    /// Something a cluster does not serve yet.
    NotClustered(&'static str),
    /// The catalog or nothing node-specific: any node serves it.
    Anywhere,
}

fn classify<'a>(path: &'a str, headers: &'a HeaderMap) -> Target<'a> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["client", "v4", "accounts", account, "d1", "database", id, rest @ ..] => match rest {
            ["export"] | ["import"] => Target::NotClustered("D1 export and import"),
            _ => Target::Database { account: Some(account), id, binding: false },
        },
        ["client", "v4", "accounts", _, "r2", ..] => Target::NotClustered("R2"),
        ["client", "v4", "accounts", _, "durable_objects", ..] => Target::NotClustered("Durable Objects"),
        ["client", "v4", "accounts", _, "workers", ..] => Target::NotClustered("Workers"),
        ["d1-transfers", ..] => Target::NotClustered("D1 export and import"),
        ["binding", "d1", id, _] => Target::Database { account: None, id, binding: true },
        ["query"] | ["execute"] => match headers.get(crate::binding::DATABASE_HEADER).and_then(|v| v.to_str().ok()) {
            Some(id) => Target::Database { account: None, id, binding: true },
            None => Target::Anywhere,
        },
        _ => Target::Anywhere,
    }
}

/// The middleware: places each request (see the module's documentation).
pub async fn place(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let Some(forwarding) = app.forwarding.clone() else { return next.run(request).await };
    let (uuid, binding) = match classify(request.uri().path(), request.headers()) {
        Target::Anywhere => return next.run(request).await,
        Target::NotClustered(what) => {
            return ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                7500,
                format!("{what} is not served by a kura cluster yet; run it on a single node"),
            )
            .into_response();
        }
        Target::Database { account, id, binding } => match resolve(&app, &request, account, id) {
            Ok(uuid) => (uuid, binding),
            Err(e) => return refuse(e, binding),
        },
    };
    let mut claimed = app.d1.claim(&uuid).await;
    if matches!(claimed, Err(kura_d1::Error::Placement(PlacementError::Elsewhere { .. })))
        && request.headers().contains_key(FORWARDED_BY)
    {
        // Sent here to be served: the owner this node remembers may be the sender (a draining
        // node, or one that stepped down); ask the coordinator again.
        app.d1.forget_owner(&uuid);
        claimed = app.d1.claim(&uuid).await;
    }
    match claimed {
        Ok(()) => {
            let mut response = next.run(request).await;
            if let Ok(node) = forwarding.node.parse() {
                response.headers_mut().insert(HeaderName::from_static(SERVED_BY), node);
            }
            response
        }
        Err(kura_d1::Error::Placement(PlacementError::Elsewhere { node, url })) => {
            if let Some(from) = request.headers().get(FORWARDED_BY) {
                tracing::info!(
                    ?from,
                    owner = node,
                    "a forwarded request reached a node that no longer owns its database"
                );
                return refuse(ApiError::unavailable("the database's ownership is moving; retry shortly"), binding);
            }
            let response = forwarding.forward(request, &node, &url, binding).await;
            if matches!(response.status(), StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY) {
                // The owner is gone or no longer owns it: look again next time.
                app.d1.forget_owner(&uuid);
            }
            response
        }
        Err(e) => refuse(ApiError::from(e), binding),
    }
}

/// The id of the database a request names (by id, or by name within the path's account or
/// the token's), once the catalog knows it: nothing is claimed for a database that does not
/// exist.
fn resolve(app: &AppState, request: &Request, account: Option<&str>, id: &str) -> Result<String, ApiError> {
    let account = match account {
        Some(account) => account.to_owned(),
        None if is_uuid(id) => String::new(),
        None => crate::auth::Caller::from_headers(request.headers(), app)?.token.account_id,
    };
    let found = match is_uuid(id) {
        true => app.d1.catalog().d1_database_by_uuid(&id.to_ascii_lowercase())?,
        false => app.d1.catalog().d1_database(&account, id)?,
    };
    found
        .map(|db| db.uuid)
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, 7404, format!("The database {id} could not be found")))
}

/// An error in the shape the caller reads: the binding's `{success, error}` or the v4 envelope.
fn refuse(error: ApiError, binding: bool) -> Response {
    if binding {
        let body = serde_json::json!({ "success": false, "error": error.message() });
        (error.status(), axum::Json(body)).into_response()
    } else {
        error.into_response()
    }
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// The S3 listener of a cluster node, until R2 is served by the cluster: every request is
/// answered with S3's `NotImplemented`, rather than served from one node's disk.
pub fn s3_not_clustered() -> axum::Router {
    axum::Router::new().fallback(|| async {
        let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>NotImplemented</Code>\
                    <Message>R2 is not served by a kura cluster yet; run it on a single node</Message></Error>";
        (StatusCode::NOT_IMPLEMENTED, [(header::CONTENT_TYPE, "application/xml")], body)
    })
}
