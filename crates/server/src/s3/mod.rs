//! The S3 listener: R2's S3 API over the R2 engine. `s3s` routes requests, parses and writes
//! the XML, checks SigV4 (headers, presigned URLs, aws-chunked bodies); this module puts R2's
//! own behaviour around it: credentials derived from API tokens, R2's auth error shapes, the
//! presigned-URL expiry cap, and the operations themselves ([`ops`]).

mod access;
mod bucket;
mod convert;
mod length;
mod list;
mod multipart;
mod object;
mod ops;
mod post_object;
mod preflight;
mod remote;
mod rfc2047;
mod service;
mod signature_debug;
pub(crate) mod url;

pub(crate) use url::query_pairs;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::Response;
use kura_catalog::Catalog;
use kura_r2::R2;
use s3s::service::{S3Service, S3ServiceBuilder};

use crate::error::s3 as xml;

/// The S3 listener's routes. With `domains`, a request to `<bucket>.<domain>` addresses the
/// bucket virtual-hosted style (as `<bucket>.<account>.r2.cloudflarestorage.com` does on R2);
/// every other host is path-style.
pub fn routes(catalog: Arc<Catalog>, r2: Arc<R2>, domains: &[String]) -> Router {
    let kura = service::KuraS3::new(Arc::clone(&catalog), Arc::clone(&r2));
    let mut builder = S3ServiceBuilder::new(kura.clone());
    builder.set_auth(access::CatalogAuth { catalog: Arc::clone(&catalog) });
    builder.set_route(post_object::PostAsPut {
        s3: kura,
        domains: domains.iter().map(|d| d.to_ascii_lowercase()).collect(),
    });
    builder.set_access(access::Scopes { catalog });
    if !domains.is_empty() {
        builder.set_host(VirtualHosts { domains: domains.iter().map(|d| d.to_ascii_lowercase()).collect() });
    }
    let service = Arc::new(builder.build());
    Router::new().fallback(handle).with_state(service)
}

/// Virtual-hosted addressing under the configured domains (ports ignored); path-style elsewhere.
struct VirtualHosts {
    domains: Vec<String>,
}

/// The HTTP metadata a write's headers carry (`aws-chunked`, a transfer detail, is not kept
/// as the object's Content-Encoding).
pub(crate) fn http_metadata(headers: &axum::http::HeaderMap) -> kura_r2::HttpMetadata {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    kura_r2::HttpMetadata {
        content_type: text(header::CONTENT_TYPE),
        content_language: text(header::CONTENT_LANGUAGE),
        content_disposition: text(header::CONTENT_DISPOSITION),
        content_encoding: text(header::CONTENT_ENCODING).filter(|e| e != "aws-chunked"),
        cache_control: text(header::CACHE_CONTROL),
        expires: text(header::EXPIRES),
    }
}

/// How `host` addresses the listener under `domains` (lowercase, without ports): `Some(Some(b))`
/// for bucket `b` virtual-hosted, `Some(None)` for a domain itself, `None` for any other host.
pub(crate) fn virtual_bucket<'a>(domains: &[String], host: &'a str) -> Option<Option<&'a str>> {
    let name =
        host.rsplit_once(':').filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit())).map_or(host, |(h, _)| h);
    domains.iter().find_map(|domain| {
        if name.eq_ignore_ascii_case(domain) {
            return Some(None);
        }
        let bucket = name.strip_suffix(domain.as_str())?.strip_suffix('.')?;
        (!bucket.is_empty()).then_some(Some(bucket))
    })
}

impl s3s::host::S3Host for VirtualHosts {
    fn parse_host_header<'a>(&'a self, host: &'a str) -> s3s::S3Result<s3s::host::VirtualHost<'a>> {
        Ok(match virtual_bucket(&self.domains, host) {
            Some(Some(bucket)) => s3s::host::VirtualHost::new(host).with_bucket(bucket.to_owned()),
            _ => s3s::host::VirtualHost::new(host),
        })
    }
}

/// [`answer`], its error bodies naming the request's id as S3 does (`RequestId`, the same as
/// the `x-amz-request-id` header).
async fn handle(State(service): State<Arc<S3Service>>, request: Request) -> Response {
    let id = request.extensions().get::<crate::observe::RequestId>().cloned();
    let response = answer(service, request).await;
    match id {
        Some(id) if response.status().is_client_error() || response.status().is_server_error() => {
            with_request_id(response, &id.0).await
        }
        _ => response,
    }
}

/// Adds `<RequestId>` to an XML error body that lacks one.
async fn with_request_id(response: Response, id: &str) -> Response {
    use http_body_util::BodyExt;
    let (parts, body) = response.into_parts();
    let Ok(collected) = http_body_util::Limited::new(body, 64 * 1024).collect().await else {
        return xml::xml_error(parts.status, "InternalError", "We encountered an internal error. Please try again.");
    };
    let text = String::from_utf8_lossy(&collected.to_bytes()).into_owned();
    let text = match text.rfind("</Error>") {
        Some(at) if !text.contains("<RequestId>") => {
            format!("{}<RequestId>{id}</RequestId>{}", &text[..at], &text[at..])
        }
        _ => text,
    };
    let mut parts = parts;
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(text))
}

/// R2's checks that come before `s3s` sees the request, then `s3s`, then R2's shaping of what
/// it answered.
async fn answer(service: Arc<S3Service>, request: Request) -> Response {
    if let Some(refusal) = preflight::refuse(&request) {
        return refusal;
    }
    let is_head = request.method() == Method::HEAD;
    let (request, _reading) = match length::with_length(request).await {
        Ok(sized) => sized,
        Err(refusal) => return refusal,
    };
    let signed = signature_debug::Signed::keep(request.method(), request.uri(), request.headers());
    let (parts, body) = request.into_parts();
    let request = s3s::HttpRequest::from_parts(parts, s3s::Body::http_body_unsync(body));
    match service.call(request).await {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            if parts.status == StatusCode::NOT_MODIFIED || (is_head && !parts.status.is_success()) {
                // 304s and failed HEADs carry headers only.
                let mut parts = parts;
                parts.headers.remove(header::CONTENT_LENGTH);
                parts.headers.remove(header::CONTENT_TYPE);
                return Response::from_parts(parts, Body::empty());
            }
            if parts.status.is_client_error() || parts.status.is_server_error() {
                return reshape_error(parts, body, &signed).await;
            }
            Response::from_parts(parts, Body::new(body))
        }
        Err(e) => {
            tracing::error!(error = ?e, "the S3 service failed");
            xml::xml_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "We encountered an internal error. Please try again.",
            )
        }
    }
}

/// Rewrites the errors `s3s` raises itself (signature checks) into R2's codes and texts.
async fn reshape_error(
    parts: axum::http::response::Parts,
    body: s3s::Body,
    signed: &signature_debug::Signed,
) -> Response {
    use http_body_util::BodyExt;
    let Ok(collected) = http_body_util::Limited::new(body, 64 * 1024).collect().await else {
        return xml::xml_error(parts.status, "InternalError", "We encountered an internal error. Please try again.");
    };
    let bytes = collected.to_bytes();
    let text = String::from_utf8_lossy(&bytes);
    let field = |name: &str| {
        let open = format!("<{name}>");
        let close = format!("</{name}>");
        let start = text.find(&open)? + open.len();
        let end = text[start..].find(&close)? + start;
        Some(text[start..end].to_owned())
    };
    let code = field("Code").unwrap_or_default();
    let message = field("Message").unwrap_or_default();
    let (status, code, message) = match code.as_str() {
        "SignatureDoesNotMatch" => {
            let message = "The request signature we calculated does not match the signature you provided. Check your secret access key and signing method.";
            return match signed.details() {
                Some(details) => xml::xml_error_with(
                    StatusCode::FORBIDDEN,
                    "SignatureDoesNotMatch",
                    message,
                    &[
                        ("StringToSign", details.string_to_sign.clone()),
                        ("StringToSignBytes", signature_debug::bytes(&details.string_to_sign)),
                        ("CanonicalRequest", details.canonical_request.clone()),
                        ("CanonicalRequestBytes", signature_debug::bytes(&details.canonical_request)),
                        ("SignatureProvided", details.signature_provided),
                    ],
                ),
                None => xml::xml_error(StatusCode::FORBIDDEN, "SignatureDoesNotMatch", message),
            };
        }
        "AccessDenied" if message.contains("expired") => {
            (StatusCode::FORBIDDEN, "ExpiredRequest", "Request has expired".to_owned())
        }
        // s3s says "<Op> is not implemented yet"; R2 says "<Op> not implemented".
        "NotImplemented" if message.ends_with(" is not implemented yet") => (
            StatusCode::NOT_IMPLEMENTED,
            "NotImplemented",
            format!("{} not implemented", message.trim_end_matches(" is not implemented yet")),
        ),
        // s3s refuses a Range it cannot parse; R2 says why in its own words.
        "InvalidArgument" if message.starts_with("invalid header: range:") => {
            let inverted = message
                .replace("&quot;", "\"")
                .split('"')
                .nth(1)
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.split_once('-'))
                .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
                .is_some_and(|(start, end)| end < start);
            let text = if inverted {
                "range must be positive."
            } else {
                "range must be in format 'bytes=start-end', 'bytes=start-' or 'bytes=-suffix'.'"
            };
            (StatusCode::BAD_REQUEST, "InvalidArgument", text.to_owned())
        }
        // s3s reads the body of an XML operation whole before the operation runs; when that
        // read fails (malformed aws-chunked framing, a body that ended early or stalled) it
        // answers a bare InternalError. The fault is the request's.
        "InternalError" if message.is_empty() => {
            tracing::warn!("a request body could not be read whole");
            (
                StatusCode::BAD_REQUEST,
                "IncompleteBody",
                "The request body could not be read: it ended early or its framing is malformed.".to_owned(),
            )
        }
        "RequestTimeTooSkewed" => (
            StatusCode::FORBIDDEN,
            "RequestTimeTooSkewed",
            "The difference between the request time and the server's time is too large.".to_owned(),
        ),
        _ => return Response::from_parts(parts, Body::from(bytes)),
    };
    let mut response = xml::xml_error(status, code, &message);
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_LENGTH && name != header::CONTENT_TYPE {
            response.headers_mut().insert(name.clone(), value.clone());
        }
    }
    response
}
