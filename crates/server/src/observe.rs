//! Every request, seen once on its way through: a request id (answered in `x-kura-request-id`,
//! and on the S3 listener in `x-amz-request-id` and error bodies' `RequestId`), one tracing span
//! carrying it, and its count and latency by surface and status for `/metrics`.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use kura_sqlite::{Histogram, HistogramSnapshot};
use tracing::Instrument;

/// The header every answer names its request by.
pub const REQUEST_ID: &str = "x-kura-request-id";

/// Seconds a request may take, from a cached read to a large upload.
const SECONDS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

/// What a request reaches, for its metrics and span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Surface {
    /// Cloudflare's v4 API.
    V4,
    /// D1's binding protocol (workerd's `env.DB`, kura-bindings' `d1()`).
    D1Binding,
    /// R2's binding protocol from outside clients (kura-bindings' `r2()`, the console).
    R2Binding,
    /// The web console's files.
    Console,
    /// D1 export downloads and import uploads.
    Transfer,
    /// S3.
    S3,
    /// Deployed Workers' own requests (the Workers listener).
    Workers,
    /// Workers' binding calls into kura (D1, R2, Durable Objects over the bindings socket).
    WorkerBindings,
    /// Anything else (`/healthz`, `/metrics`, unknown paths).
    Other,
}

impl Surface {
    const ALL: [Surface; 9] = [
        Surface::V4,
        Surface::D1Binding,
        Surface::R2Binding,
        Surface::Console,
        Surface::Transfer,
        Surface::S3,
        Surface::Workers,
        Surface::WorkerBindings,
        Surface::Other,
    ];

    /// Its name in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Surface::V4 => "v4",
            Surface::D1Binding => "d1_binding",
            Surface::R2Binding => "r2_binding",
            Surface::Console => "console",
            Surface::Transfer => "transfer",
            Surface::S3 => "s3",
            Surface::Workers => "workers",
            Surface::WorkerBindings => "worker_bindings",
            Surface::Other => "other",
        }
    }

    /// The API listener's surface of `path`.
    fn of_api(path: &str) -> Surface {
        if path.starts_with("/client/v4/") {
            Surface::V4
        } else if path.starts_with("/binding/r2/") {
            Surface::R2Binding
        } else if path == "/query" || path == "/execute" || path.starts_with("/binding/") {
            Surface::D1Binding
        } else if path == "/console" || path.starts_with("/console/") {
            Surface::Console
        } else if path.starts_with("/d1-transfers/") {
            Surface::Transfer
        } else {
            Surface::Other
        }
    }

    fn index(self) -> usize {
        Surface::ALL.iter().position(|s| *s == self).expect("every surface is listed")
    }
}

/// A request's id: 16 random bytes in hex, put in the request's extensions by [`observe_api`]
/// and [`observe_one`].
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

impl RequestId {
    /// Unique, not secret: eight random bytes drawn once per process, then a counter (a call
    /// to the system's random source per request cost more than the rest of the id).
    fn new() -> Self {
        static PREFIX: std::sync::OnceLock<[u8; 8]> = std::sync::OnceLock::new();
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let prefix = PREFIX.get_or_init(|| {
            let mut bytes = [0u8; 8];
            getrandom::fill(&mut bytes).expect("the operating system's random source failed");
            bytes
        });
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(prefix);
        bytes[8..].copy_from_slice(&COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed).to_be_bytes());
        // One pass into a buffer: `hex::encode_upper` pushes the digits one `char` at a time.
        let mut digits = [0u8; 32];
        hex::encode_to_slice(bytes, &mut digits).expect("32 digits for 16 bytes");
        digits.make_ascii_uppercase();
        RequestId(String::from_utf8(digits.to_vec()).expect("hex digits are ASCII"))
    }
}

/// Requests answered, by surface and status, and their latencies by surface.
pub struct HttpFigures {
    answered: Mutex<BTreeMap<(Surface, u16), u64>>,
    latencies: Vec<Histogram>,
}

impl Default for HttpFigures {
    fn default() -> Self {
        HttpFigures {
            answered: Mutex::default(),
            latencies: Surface::ALL.iter().map(|_| Histogram::new(SECONDS)).collect(),
        }
    }
}

impl HttpFigures {
    fn record(&self, surface: Surface, status: u16, seconds: f64) {
        *self.answered.lock().unwrap_or_else(|p| p.into_inner()).entry((surface, status)).or_default() += 1;
        self.latencies[surface.index()].observe(seconds);
    }

    /// Requests answered so far, by surface and status.
    pub fn answered(&self) -> Vec<(Surface, u16, u64)> {
        self.answered.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|((s, c), n)| (*s, *c, *n)).collect()
    }

    /// Latencies by surface (those that saw requests).
    pub fn latencies(&self) -> Vec<(Surface, HistogramSnapshot)> {
        Surface::ALL.iter().map(|s| (*s, self.latencies[s.index()].snapshot())).filter(|(_, h)| h.count > 0).collect()
    }
}

/// Observes a request to the API listener around `inner`, which answers it (the listener's
/// one middleware, `api_edge` in the crate root, passes the rest of its work).
pub async fn observe_api<F: Future<Output = Response>>(
    figures: &HttpFigures,
    request: Request,
    inner: impl FnOnce(Request) -> F,
) -> Response {
    let surface = Surface::of_api(request.uri().path());
    observe_surface(figures, surface, request, inner).await
}

/// The middleware of a listener that serves one surface (S3's, where the id is S3's request id
/// too; the Workers listener; the bindings socket).
pub async fn observe_one(
    State((figures, surface)): State<(std::sync::Arc<HttpFigures>, Surface)>,
    request: Request,
    next: Next,
) -> Response {
    observe_surface(&figures, surface, request, |request| next.run(request)).await
}

/// Observes a request to a listener that serves one surface around `inner`, which answers it:
/// its id (kept from another node, else new), its span, its log line and its figures.
pub async fn observe_surface<F: Future<Output = Response>>(
    figures: &HttpFigures,
    surface: Surface,
    mut request: Request,
    inner: impl FnOnce(Request) -> F,
) -> Response {
    // A request another node sent on keeps its id, so one id follows it through the cluster.
    let id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() == 32 && v.bytes().all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b)))
        .map(|v| RequestId(v.to_owned()))
        .unwrap_or_else(RequestId::new);
    request.extensions_mut().insert(id.clone());
    // The span carries the id and the surface only: a subscriber formats a span's fields as it
    // opens, escaping each character. The span with the method and the path was 6.4% of a D1
    // INSERT's instructions under `kura serve`, and without them it costs 3% less; they go in
    // the line that answers the request, which a warning logged inside it shares the id with.
    let span = tracing::info_span!("request", request_id = %id.0, surface = surface.name());
    // Cheap clones: the URI shares the request's bytes.
    let (method, uri) = (request.method().clone(), request.uri().clone());
    let started = Instant::now();
    let mut response = inner(request).instrument(span.clone()).await;
    let took = started.elapsed();
    let status = response.status();
    span.in_scope(|| {
        if status.is_server_error() {
            tracing::warn!(%method, path = uri.path(), status = status.as_u16(), latency_ms = took.as_secs_f64() * 1e3, "answered");
        } else {
            tracing::debug!(%method, path = uri.path(), status = status.as_u16(), latency_ms = took.as_secs_f64() * 1e3, "answered");
        }
    });
    figures.record(surface, status.as_u16(), took.as_secs_f64());
    if let Ok(value) = HeaderValue::from_str(&id.0) {
        let headers = response.headers_mut();
        headers.insert(HeaderName::from_static(REQUEST_ID), value.clone());
        if surface == Surface::S3 {
            headers.insert(HeaderName::from_static("x-amz-request-id"), value);
        }
    }
    response
}
