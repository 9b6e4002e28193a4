//! The web console under `/console/`: static files compiled into the binary (`console/` beside
//! this crate), served gzip-compressed to browsers that accept it, plus the one fact the browser
//! cannot know on its own (where the S3 listener is). The console holds no state on the server:
//! it signs in with an API token kept in the browser's session and speaks the v4 API and the R2
//! binding protocol like any other client.

use std::sync::OnceLock;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use serde_json::json;

use crate::state::AppState;

/// One file of the console.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const ASSETS: &[Asset] = &[
    Asset {
        name: "index.html",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("../console/index.html"),
    },
    Asset { name: "app.css", content_type: "text/css; charset=utf-8", body: include_bytes!("../console/app.css") },
    Asset { name: "app.js", content_type: "text/javascript; charset=utf-8", body: include_bytes!("../console/app.js") },
    Asset { name: "ui.js", content_type: "text/javascript; charset=utf-8", body: include_bytes!("../console/ui.js") },
    Asset { name: "api.js", content_type: "text/javascript; charset=utf-8", body: include_bytes!("../console/api.js") },
    Asset { name: "d1.js", content_type: "text/javascript; charset=utf-8", body: include_bytes!("../console/d1.js") },
    Asset { name: "r2.js", content_type: "text/javascript; charset=utf-8", body: include_bytes!("../console/r2.js") },
    Asset { name: "do.js", content_type: "text/javascript; charset=utf-8", body: include_bytes!("../console/do.js") },
    Asset { name: "kv.js", content_type: "text/javascript; charset=utf-8", body: include_bytes!("../console/kv.js") },
    Asset {
        name: "queues.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../console/queues.js"),
    },
    Asset {
        name: "workers.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../console/workers.js"),
    },
    Asset {
        name: "tokens.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../console/tokens.js"),
    },
    Asset { name: "favicon.svg", content_type: "image/svg+xml", body: include_bytes!("../console/favicon.svg") },
];

/// Scripts, styles and requests from this origin only: no inline script can run, so text that
/// slipped into markup still could not execute.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data: blob:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/console", get(|| async { Redirect::permanent("/console/") }))
        .route("/console/", get(|headers: HeaderMap| async move { asset("index.html", &headers) }))
        .route("/console/config.json", get(config))
        .route(
            "/console/{file}",
            get(|Path(file): Path<String>, headers: HeaderMap| async move { asset(&file, &headers) }),
        )
}

/// The files gzip-compressed, once, the first time any is asked for.
fn compressed() -> &'static [Vec<u8>] {
    static COMPRESSED: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    COMPRESSED.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                use std::io::Write;
                let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
                // Writing to a Vec cannot fail.
                encoder.write_all(a.body).and_then(|()| encoder.finish()).unwrap_or_default()
            })
            .collect()
    })
}

fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT_ENCODING).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(
        |coding| {
            let mut parts = coding.split(';');
            let name = parts.next().unwrap_or("").trim();
            let refused =
                parts.any(|p| matches!(p.trim().replace(' ', "").as_str(), "q=0" | "q=0.0" | "q=0.00" | "q=0.000"));
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        },
    )
}

fn asset(name: &str, headers: &HeaderMap) -> Response {
    let Some(index) = ASSETS.iter().position(|a| a.name == name) else {
        return (StatusCode::NOT_FOUND, "no such console file").into_response();
    };
    let asset = &ASSETS[index];
    let mut response = if accepts_gzip(headers) {
        let mut r = compressed()[index].clone().into_response();
        r.headers_mut().insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        r
    } else {
        asset.body.into_response()
    };
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    // The files change only with the binary; revalidating each load keeps an upgrade visible.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

/// `GET /console/config.json`: where the S3 listener is (its host is left out when it listens
/// on every address: the browser then uses the host it reached the console by).
async fn config(State(app): State<AppState>) -> Response {
    let s3 = app.s3_address.map(|address| {
        // As a URL writes it: an IPv6 address in brackets.
        let host = (!address.ip().is_unspecified()).then(|| match address {
            std::net::SocketAddr::V4(v4) => v4.ip().to_string(),
            std::net::SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
        });
        json!({ "host": host, "port": address.port() })
    });
    let body = json!({ "version": env!("CARGO_PKG_VERSION"), "s3": s3, "workers": app.workers.is_some() });
    let mut response = axum::Json(body).into_response();
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_is_sent_only_when_accepted() {
        let with = |value: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::ACCEPT_ENCODING, HeaderValue::from_str(value).unwrap());
            accepts_gzip(&h)
        };
        assert!(with("gzip, deflate, br"));
        assert!(with("br;q=1.0, gzip;q=0.8"));
        assert!(with("*"));
        assert!(!with("br"));
        assert!(!with("gzip;q=0"));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[test]
    fn every_asset_compresses_and_the_first_load_fits_its_budget() {
        let total: usize = compressed().iter().map(Vec::len).sum();
        assert!(compressed().iter().all(|c| !c.is_empty()));
        // The issue's budget for the first page load (HTML, JS, CSS) is 300 KiB compressed.
        assert!(total < 300 * 1024, "the console is {total} bytes compressed");
    }
}
