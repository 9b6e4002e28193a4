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

/// Names the node that served a database's request, for operators (and the cluster tests).
pub const SERVED_BY: &str = "x-kura-node";

/// How this node reaches the others.
#[derive(Debug, Clone)]
pub struct Forwarding {
    node: String,
    client: reqwest::Client,
}

impl Forwarding {
    /// Forwarding for the node named `node`.
    pub fn new(node: impl Into<String>) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(2))
            .tcp_nodelay(true)
            .build()
            .expect("an HTTP client builds");
        Forwarding { node: node.into(), client }
    }

    /// Sends `request` to the node whose API is at `url` and streams its answer back.
    async fn forward(&self, request: Request, owner: &str, url: &str) -> Response {
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
                ApiError::unavailable(format!("the database's owner, node {owner}, cannot be reached; retry shortly"))
                    .into_response()
            }
            // The request reached the owner: whether it took effect is unknown, as when a
            // client's own connection breaks.
            Err(e) => {
                tracing::warn!(owner, url, error = %e, "a database's owner failed while answering");
                ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    7500,
                    format!("the database's owner, node {owner}, failed while answering; the request may or may not have taken effect"),
                )
                .into_response()
            }
        }
    }
}

/// Headers that belong to one connection, not to the request.
fn without_hop_headers(headers: &HeaderMap) -> HeaderMap {
    let mut kept = headers.clone();
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
        Target::Database { account, id, binding } => {
            let resolved = match (account, is_uuid(id)) {
                (_, true) => Ok(id.to_owned()),
                (Some(account), false) => app.d1.get(account, id).map(|db| db.uuid).map_err(ApiError::from),
                // A name without an account: the handler resolves it (and fails cleanly if
                // this node does not own it).
                (None, false) => return next.run(request).await,
            };
            match resolved {
                Ok(uuid) => (uuid, binding),
                Err(e) => return refuse(e, binding),
            }
        }
    };
    match app.d1.claim(&uuid).await {
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
            forwarding.forward(request, &node, &url).await
        }
        Err(e) => refuse(ApiError::from(e), binding),
    }
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
