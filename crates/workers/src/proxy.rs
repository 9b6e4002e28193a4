//! The Workers listener (`--workers-listen`): each request is routed by its host —
//! `<script>.localhost`, `<script>.<workers domain>`, `<script>.<subdomain>.workers.dev`, or
//! any host when a single script is deployed — through the [`Gate`](crate::gate::Gate) to the
//! socket workerd serves that script on — unless the script's static assets answer it first.
//! Bodies stream both ways; WebSocket upgrades are joined end to end.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixStream;

use crate::Workers;
use crate::assets::serve::Decision;

/// Where deployed scripts are served, by name.
#[derive(Debug, Default, Clone)]
pub struct Routes {
    /// Script name → script id (the first account's, should two accounts use one name).
    pub by_name: HashMap<String, String>,
    /// Domains under which `<script>.<domain>` routes (`localhost` always).
    pub domains: Vec<String>,
}

impl Routes {
    /// The script a request for `host` goes to.
    pub fn route(&self, host: &str) -> Option<&str> {
        let host =
            host.rsplit_once(':').filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit())).map_or(host, |(h, _)| h);
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let label = host.split('.').next().unwrap_or("");
        let under = |domain: &str| {
            host.strip_suffix(domain).and_then(|h| h.strip_suffix('.')).is_some_and(|h| !h.contains('.'))
        };
        let named = under("localhost") || self.domains.iter().any(|d| under(d)) || host.ends_with(".workers.dev");
        if named && let Some(id) = self.by_name.get(label) {
            return Some(id);
        }
        if self.by_name.len() == 1 {
            return self.by_name.values().next().map(String::as_str);
        }
        None
    }
}

/// A connection to a script's socket.
pub struct UnixConnection(TokioIo<UnixStream>);

impl Connection for UnixConnection {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for UnixConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for UnixConnection {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// Connects to the socket a URI's host names: `http://<script id>/…`.
#[derive(Clone)]
pub struct UnixConnector {
    sockets: crate::runtime::Sockets,
}

impl tower::Service<Uri> for UnixConnector {
    type Response = UnixConnection;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<UnixConnection>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let path = uri.host().and_then(|h| self.sockets.read().unwrap_or_else(|p| p.into_inner()).get(h).cloned());
        Box::pin(async move {
            let path =
                path.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such Worker socket"))?;
            Ok(UnixConnection(TokioIo::new(UnixStream::connect(path).await?)))
        })
    }
}

/// The HTTP client the listener forwards with (a pool of connections per script).
pub type Upstream = Client<UnixConnector, Body>;

pub(crate) fn upstream(sockets: crate::runtime::Sockets) -> Upstream {
    Client::builder(TokioExecutor::new()).build(UnixConnector { sockets })
}

/// The listener's application.
pub fn app(workers: Workers) -> axum::Router {
    axum::Router::new().fallback(forward).with_state(workers)
}

/// Miniflare's `/cdn-cgi/handler/scheduled?cron=…&time=<ms>` (answers the outcome, `ok`, 200 or
/// 500) and wrangler's `/__scheduled?cron=…` (answers "Ran scheduled event"): the Worker's
/// `scheduled` handler run by URL. `None` for any other path, which goes to the Worker.
async fn run_scheduled_by_url(workers: &Workers, script_id: &str, uri: &Uri) -> Option<Response> {
    let miniflare = match uri.path() {
        "/cdn-cgi/handler/scheduled" => true,
        "/__scheduled" => false,
        _ => return None,
    };
    let query: HashMap<String, String> =
        url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes()).into_owned().collect();
    let cron = query.get("cron").cloned().unwrap_or_default();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let time = match query.get("time").map(|t| t.parse::<i64>()) {
        None => now,
        Some(Ok(time)) => time,
        Some(Err(_)) => return Some(plain(StatusCode::BAD_REQUEST, "time must be Unix milliseconds\n".to_owned())),
    };
    Some(match workers.fire(script_id, &cron, time).await {
        Ok(run) if !miniflare && run.outcome == "ok" => plain(StatusCode::OK, "Ran scheduled event".to_owned()),
        Ok(run) if run.outcome == "ok" => plain(StatusCode::OK, run.outcome),
        Ok(run) => plain(StatusCode::INTERNAL_SERVER_ERROR, run.outcome),
        Err(e) => plain(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
    })
}

fn plain(status: StatusCode, text: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}

async fn forward(State(workers): State<Workers>, mut request: Request) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let Some(script_id) = workers.route(&host) else {
        let names = workers.routes().by_name.keys().cloned().collect::<Vec<_>>();
        let message = if names.is_empty() {
            "No Worker is deployed on this kura. Deploy one with `wrangler deploy`.\n".to_owned()
        } else {
            let mut names = names;
            names.sort();
            format!("No Worker answers to the host '{host}'. Deployed: {} (use <name>.localhost).\n", names.join(", "))
        };
        return plain(StatusCode::NOT_FOUND, message);
    };
    if workers.test_scheduled()
        && let Some(answer) = run_scheduled_by_url(&workers, &script_id, request.uri()).await
    {
        return answer;
    }
    // Static assets first, unless the request is the Worker's (`run_worker_first`, or no file).
    if let Some(assets) = workers.served_assets(&script_id)
        && let Decision::Assets(response) = assets.route(request.method(), request.uri(), request.headers()).await
    {
        return response;
    }
    if workers.workerd().is_none() {
        let message = "workerd is not running here yet (it starts with the first deploy); try again.\n";
        return plain(StatusCode::SERVICE_UNAVAILABLE, message.to_owned());
    }
    let Some((pass, _socket)) = workers.runtime_enter(&script_id).await else {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "The Worker is restarting; try again.\n".to_owned());
    };
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let Ok(uri) = format!("http://{script_id}{path}").parse::<Uri>() else {
        return plain(StatusCode::BAD_REQUEST, "Malformed request target.\n".to_owned());
    };
    let client_upgrade = request.extensions_mut().remove::<hyper::upgrade::OnUpgrade>();
    // As on Cloudflare, the Worker learns who connected from `CF-Connecting-IP`, which a client
    // cannot set itself.
    let peer = request.extensions().get::<axum::extract::ConnectInfo<std::net::SocketAddr>>().map(|c| c.0.ip());
    match peer.and_then(|ip| HeaderValue::from_str(&ip.to_string()).ok()) {
        Some(ip) => request.headers_mut().insert("cf-connecting-ip", ip),
        None => request.headers_mut().remove("cf-connecting-ip"),
    };
    *request.uri_mut() = uri;
    if !request.headers().contains_key(header::HOST)
        && let Ok(value) = HeaderValue::from_str(&host)
    {
        request.headers_mut().insert(header::HOST, value);
    }
    let mut response = match workers.upstream().request(request).await {
        Ok(response) => response,
        Err(e) => {
            tracing::warn!(error = %e, "a request to a Worker failed on its way to workerd");
            return plain(StatusCode::BAD_GATEWAY, "The Worker could not be reached.\n".to_owned());
        }
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_upgrade) = client_upgrade
    {
        let server_upgrade = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            let _pass = pass;
            if let (Ok(client), Ok(server)) = (client_upgrade.await, server_upgrade.await) {
                let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(client), &mut TokioIo::new(server)).await;
            }
        });
        let (parts, _) = response.into_parts();
        return Response::from_parts(parts, Body::empty());
    }
    let (parts, body) = response.into_parts();
    // The response streams on after this handler returns: it holds the pass until it ends.
    let body = Body::new(PassBody { body, _pass: pass });
    Response::from_parts(parts, body)
}

/// A response body holding its request's pass through the gate until it has been sent.
pub(crate) struct PassBody {
    pub(crate) body: hyper::body::Incoming,
    pub(crate) _pass: crate::gate::Pass,
}

impl http_body::Body for PassBody {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_route_to_scripts() {
        let mut routes = Routes { domains: vec!["workers.example.com".into()], ..Default::default() };
        routes.by_name.insert("chat".into(), "id-chat".into());
        assert_eq!(routes.route("anything:8787"), Some("id-chat"), "a single script answers every host");
        routes.by_name.insert("photos".into(), "id-photos".into());
        assert_eq!(routes.route("chat.localhost:8787"), Some("id-chat"));
        assert_eq!(routes.route("PHOTOS.localhost"), Some("id-photos"));
        assert_eq!(routes.route("photos.workers.example.com"), Some("id-photos"));
        assert_eq!(routes.route("chat.kura.workers.dev"), Some("id-chat"));
        assert_eq!(routes.route("127.0.0.1:8787"), None);
        assert_eq!(routes.route("nope.localhost"), None);
        assert_eq!(routes.route("a.chat.localhost"), None);
    }
}
