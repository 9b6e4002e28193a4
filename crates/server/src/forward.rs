//! How a node reaches the others: the HTTP client it forwards requests with, the stamp that
//! proves a request came from a node of the cluster, and the stream guards (an owner that
//! stops answering fails the request instead of holding it forever). The cluster's placement
//! ([`crate::cluster`]) decides where a request goes; this module carries it there.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, Wire};

/// Marks a request another node sent on: it is served where it lands or refused, never sent
/// on again (ownership moving while it travelled). Its value is `<node> <unix seconds>
/// <proof>`, the proof an HMAC under the cluster's key of the node's name, that time, the
/// method and the path with its query: a client cannot pass for a node, and a stamp seen on the
/// wire vouches for nothing but that one request, for [`STAMP_WINDOW`].
pub(crate) const FORWARDED_BY: &str = "x-kura-forwarded-by";

/// How far a stamp's time may be from the receiving node's clock (the nodes' clocks must agree
/// within it: NTP's job).
const STAMP_WINDOW: u64 = 60;

/// How long a forwarded request may go without a byte from the owner: past a D1 query's own
/// limit (30 s) and a lease's TTL, so only a node that stopped answering reaches it.
pub const FORWARD_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Names the node that served a database's or bucket's request, for operators (and the
/// cluster tests).
pub const SERVED_BY: &str = "x-kura-node";

/// What `kura node status` shows of a node: its view of the cluster (implemented over the
/// coordinator and the placement by the binary that joins the cluster).
#[async_trait::async_trait]
pub trait ClusterStatus: Send + Sync {
    /// The members, and what this node owns with its shipping counts, as JSON.
    async fn status(&self) -> serde_json::Value;
    /// Gives everything up and takes nothing more; answers the status after.
    async fn drain(&self) -> serde_json::Value;
    /// The node's figures in Prometheus' text format (see [`crate::metrics::family`]).
    async fn metrics(&self) -> String;
    /// The API URL of the live member named `node`.
    async fn member_api(&self, node: &str) -> Option<String>;
    /// Every live member: its name and its API's URL.
    async fn members(&self) -> Vec<(String, String)>;
}

/// Where a node takes the events of a script's invocations another node ran, for the live tails
/// opened on it: `POST <TAIL_EVENTS_PATH>/<script id>` with a JSON array of events.
pub(crate) const TAIL_EVENTS_PATH: &str = "/kura/tail-events";

/// How this node reaches the others.
#[derive(Clone)]
pub struct Forwarding {
    node: String,
    client: reqwest::Client,
    status: std::sync::Arc<dyn ClusterStatus>,
    /// Shared by every node of the cluster: proves a forwarded request came from one.
    key: std::sync::Arc<[u8]>,
    /// Live tails' events being sent to other nodes now: bounded, so a node that stopped
    /// answering costs dropped events rather than a pile of waiting tasks.
    pushes: std::sync::Arc<tokio::sync::Semaphore>,
}

/// Live tails' events this node sends other nodes at once, at most.
const PUSHES_AT_ONCE: usize = 64;

/// How long a node's own request to another node (a tail's events, its listeners) may take.
const NODE_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The headers a stamp vouches for besides the method and path: those naming what a Worker's
/// binding call acts on (its account, database, bucket, namespace or queue), which the owner
/// trusts from a node.
const STAMPED_HEADERS: [&str; 6] = [
    kura_workers::config::headers::ACCOUNT,
    kura_workers::config::headers::D1_DATABASE,
    kura_workers::config::headers::R2_BUCKET,
    kura_workers::config::headers::KV_NAMESPACE,
    kura_workers::config::headers::QUEUE,
    kura_workers::config::headers::QUEUE_DELAY,
];

/// Marks a request this node took from another node and passed on within itself (a Worker's
/// binding call, its path rewritten): it counts as forwarded, its stamp having been checked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FromNode;

/// The proof a stamp carries (see [`FORWARDED_BY`]).
fn proof(key: &[u8], node: &str, seconds: u64, method: &str, path_and_query: &str, headers: &HeaderMap) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    for part in [node, &seconds.to_string(), method, path_and_query] {
        mac.update(part.as_bytes());
        mac.update(b"\n");
    }
    for name in STAMPED_HEADERS {
        mac.update(headers.get(name).map_or(&b""[..], |v| v.as_bytes()));
        mac.update(b"\n");
    }
    hex::encode(mac.finalize().into_bytes())
}

/// Whether a path (with or without its query) has a `.` or `..` segment, percent-encoded or not.
fn has_dot_segment(path_and_query: &str) -> bool {
    let path = path_and_query.split('?').next().unwrap_or_default();
    path.split('/').any(|segment| {
        let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
        decoded == "." || decoded == ".."
    })
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl std::fmt::Debug for Forwarding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarding").field("node", &self.node).finish_non_exhaustive()
    }
}

impl Forwarding {
    /// `response`, answered by this node, saying so.
    pub(crate) fn served_here(&self, mut response: Response) -> Response {
        if let Ok(node) = self.node.parse() {
            response.headers_mut().insert(HeaderName::from_static(SERVED_BY), node);
        }
        response
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// How the node reports itself.
    pub fn status(&self) -> &dyn ClusterStatus {
        &*self.status
    }

    /// Whether another node of the cluster sent this request on: its stamp checks out for this
    /// method, path and [`STAMPED_HEADERS`], and is recent (or it carries [`FromNode`]).
    pub(crate) fn is_forwarded(&self, request: &Request) -> bool {
        if request.extensions().get::<FromNode>().is_some() {
            return true;
        }
        let stamp = request.headers().get(FORWARDED_BY).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let mut parts = stamp.split(' ');
        let (Some(node), Some(seconds), Some(given), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return false;
        };
        let Ok(seconds) = seconds.parse::<u64>() else { return false };
        if unix_seconds().abs_diff(seconds) > STAMP_WINDOW {
            return false;
        }
        let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
        let expected = proof(&self.key, node, seconds, request.method().as_str(), path, request.headers());
        // Compared in constant time: the proof is a secret's function.
        expected.len() == given.len() && expected.bytes().zip(given.bytes()).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
    }

    /// The node that stamped a request [`Forwarding::is_forwarded`] accepted.
    pub(crate) fn stamped_by(request: &Request) -> Option<&str> {
        request.headers().get(FORWARDED_BY)?.to_str().ok()?.split(' ').next()
    }

    /// This node's stamp for a request of `method` to `path_and_query` with `headers` (see
    /// [`FORWARDED_BY`]).
    fn stamp(&self, method: &str, path_and_query: &str, headers: &HeaderMap) -> Option<axum::http::HeaderValue> {
        let seconds = unix_seconds();
        let proof = proof(&self.key, &self.node, seconds, method, path_and_query, headers);
        format!("{} {seconds} {proof}", self.node).parse().ok()
    }

    /// Forwarding for the node named `node`, which reports itself through `status`; `key`, the
    /// same on every node, authenticates requests nodes send each other.
    pub fn new(node: impl Into<String>, status: std::sync::Arc<dyn ClusterStatus>, key: &[u8]) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(2))
            .tcp_nodelay(true)
            .build()
            .expect("an HTTP client builds");
        let pushes = std::sync::Arc::new(tokio::sync::Semaphore::new(PUSHES_AT_ONCE));
        Forwarding { node: node.into(), client, status, key: key.into(), pushes }
    }

    /// POSTs `body` (JSON) to `path` on the node whose API is `api`, stamped as this node's
    /// request; answers whether the node took it.
    pub(crate) async fn post_to_node(&self, api: &str, path: &str, body: Vec<u8>) -> bool {
        let Ok(target) = reqwest::Url::parse(&format!("{api}{path}")) else { return false };
        let Some(stamp) = self.stamp("POST", target.path(), &HeaderMap::new()) else { return false };
        let sent = self
            .client
            .post(target)
            .header(FORWARDED_BY, stamp)
            .header(header::CONTENT_TYPE, "application/json")
            .timeout(NODE_REQUEST_TIMEOUT)
            .body(body)
            .send()
            .await;
        sent.is_ok_and(|answer| answer.status().is_success())
    }

    /// Sends the events of a script's invocations this node ran to the other nodes whose live
    /// tails listen to it (`listeners`, their API URLs), in the background.
    pub(crate) fn push_tail_events(&self, listeners: Vec<String>, script_id: &str, events: &[serde_json::Value]) {
        let Ok(body) = serde_json::to_vec(events) else { return };
        for api in listeners {
            let Ok(permit) = std::sync::Arc::clone(&self.pushes).try_acquire_owned() else {
                tracing::debug!(node = api, "too many tail events on their way to other nodes; dropping some");
                continue;
            };
            let (forwarding, body, path) = (self.clone(), body.clone(), format!("{TAIL_EVENTS_PATH}/{script_id}"));
            tokio::spawn(async move {
                if !forwarding.post_to_node(&api, &path, body).await {
                    tracing::debug!(node = api, "a tail's events did not reach the node listening");
                }
                drop(permit);
            });
        }
    }

    /// Sends a D1 export's or import's transfer to the node holding its file.
    pub(crate) async fn forward_transfer(&self, request: Request, node: &str) -> Response {
        match self.status.member_api(node).await {
            Some(url) => self.forward(request, node, &url, Wire::V4).await,
            None => Wire::V4.refuse(ApiError::new(
                StatusCode::NOT_FOUND,
                7404,
                format!("this transfer's node, {node}, is no longer a member; start the export or import again"),
            )),
        }
    }

    /// Sends `request` to the node `owner` at `url` and streams its answer back. An S3 request
    /// keeps its `Host` (the client signed it).
    pub(crate) async fn forward(&self, request: Request, owner: &str, url: &str, shape: Wire) -> Response {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let mut headers = without_hop_headers(&parts.headers);
        if shape != Wire::S3 {
            // The owner's answers may name this host (a D1 export's download URL).
            if let Some(host) = headers.remove(header::HOST)
                && !headers.contains_key("x-forwarded-host")
            {
                headers.insert(HeaderName::from_static("x-forwarded-host"), host);
            }
        }
        // The owner's own workerd secret stands in for a Worker's call: this node's stays here.
        headers.remove(kura_workers::config::headers::SECRET);
        // An HTTP client resolves `.` and `..` segments (`%2e` too): the owner would read
        // another path than the one placed, so such a path is not sent on.
        if has_dot_segment(path) {
            return shape.refuse(ApiError::bad_request(
                "a path with a '.' or '..' segment cannot be sent on to its owner in a cluster",
            ));
        }
        // Stamped for the request exactly as the owner will read it (the URL parser may encode
        // what the client's path left raw).
        let Ok(target) = reqwest::Url::parse(&format!("{url}{path}")) else {
            return shape.refuse(ApiError::bad_request("the request's path cannot be sent on to its owner"));
        };
        let sent_path = match target.query() {
            Some(query) => format!("{}?{query}", target.path()),
            None => target.path().to_owned(),
        };
        let Some(stamp) = self.stamp(parts.method.as_str(), &sent_path, &headers) else {
            return shape.refuse(ApiError::internal_text(&"a node name that is not a header value"));
        };
        headers.insert(HeaderName::from_static(FORWARDED_BY), stamp);
        if let Some(id) = parts.extensions.get::<crate::observe::RequestId>()
            && let Ok(value) = id.0.parse()
        {
            headers.insert(HeaderName::from_static(crate::observe::REQUEST_ID), value);
        }
        // A paused owner accepts connections into its backlog and never answers: once the body
        // is all sent, its answer must begin within the timeout, and then never stall for as
        // long (an upload itself takes as long as the client takes).
        let (sent_tx, sent_rx) = tokio::sync::oneshot::channel::<()>();
        let body = reqwest::Body::wrap_stream(until_end(body.into_data_stream(), sent_tx));
        let request = self.client.request(parts.method, target).headers(headers).body(body).send();
        let answered = tokio::select! {
            answered = request => answered.map_err(Some),
            () = async {
                let _ = sent_rx.await;
                tokio::time::sleep(FORWARD_READ_TIMEOUT).await;
            } => Err(None),
        };
        match answered {
            Ok(answer) => {
                let mut response = Response::builder().status(answer.status());
                if let Some(out) = response.headers_mut() {
                    *out = without_hop_headers(answer.headers());
                }
                let stream = idle_timeout(answer.bytes_stream(), FORWARD_READ_TIMEOUT);
                response.body(Body::from_stream(stream)).unwrap_or_else(|e| ApiError::internal(&e).into_response())
            }
            Err(Some(e)) if e.is_connect() => {
                tracing::warn!(owner, url, error = %e, "could not reach an owner");
                shape
                    .refuse(ApiError::unavailable(format!("its owner, node {owner}, cannot be reached; retry shortly")))
            }
            // The request reached the owner: whether it took effect is unknown, as when a
            // client's own connection breaks.
            Err(e) => {
                let error = e.map_or_else(|| "no answer within the timeout".to_owned(), |e| e.to_string());
                tracing::warn!(owner, url, error, "an owner failed while answering");
                shape.refuse(ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    7500,
                    format!(
                        "its owner, node {owner}, failed while answering; the request may or may not have taken effect"
                    ),
                ))
            }
        }
    }
}

/// `stream`, telling `ended` once it has ended (or failed).
fn until_end<S, T, E>(
    stream: S,
    ended: tokio::sync::oneshot::Sender<()>,
) -> impl futures_util::Stream<Item = Result<T, E>>
where
    S: futures_util::Stream<Item = Result<T, E>>,
{
    futures_util::stream::unfold((Box::pin(stream), Some(ended)), |(mut stream, mut ended)| async move {
        use futures_util::StreamExt;
        match stream.next().await {
            Some(Ok(item)) => Some((Ok(item), (stream, ended))),
            Some(Err(e)) => {
                ended.take().map(|e| e.send(()));
                Some((Err(e), (stream, None)))
            }
            None => {
                ended.take().map(|e| e.send(()));
                None
            }
        }
    })
}

/// `stream`'s bytes, failing once it has sent nothing for `limit` (an answer from a node that
/// stopped answering).
pub fn idle_timeout<S>(
    stream: S,
    limit: std::time::Duration,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static
where
    S: futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send + 'static,
{
    futures_util::stream::unfold(Some(Box::pin(stream)), move |stream| async move {
        use futures_util::StreamExt;
        let mut stream = stream?;
        match tokio::time::timeout(limit, stream.next()).await {
            Ok(Some(Ok(chunk))) => Some((Ok(chunk), Some(stream))),
            Ok(Some(Err(e))) => Some((Err(std::io::Error::other(e)), None)),
            Ok(None) => None,
            Err(_) => {
                Some((Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the node stopped answering")), None))
            }
        }
    })
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
        // The entry node has answered it already; the owner reads the body as it streams.
        header::EXPECT,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ] {
        kept.remove(name);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::has_dot_segment;

    #[test]
    fn dot_segments_are_found_however_written() {
        for path in ["/a/../b", "/a/./b", "/a/%2E%2e/b", "/a/%2e", "/..", "/a/..?x=1"] {
            assert!(has_dot_segment(path), "{path}");
        }
        for path in ["/a/b", "/a/..b", "/a/b..", "/a/.b", "/a/b?x=/../", "/"] {
            assert!(!has_dot_segment(path), "{path}");
        }
    }
}
