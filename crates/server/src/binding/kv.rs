//! workerd's KV binding: `env.NS.get/getWithMetadata/put/delete/list` arrive as HTTP requests
//! on the Workers' socket, told apart by the namespace header workerd adds — `GET /<key>`,
//! `PUT /<key>` (metadata in `CF-KV-Metadata`), `DELETE /<key>`, `GET /?prefix&key_count_limit
//! &cursor`, `POST /bulk/get` — each key one percent-encoded path segment. Failures carry their
//! message in the status line, which is what workerd shows the Worker.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::TryStreamExt;
use serde::Deserialize;
use serde_json::{Value as Json, json};

use kura_kv::{KvError, ListOptions, PutOptions, ValueType};
use kura_workers::config::headers;

use crate::error::binding::{kv_error, status_line_failure};
use crate::extract::read_body;
use crate::state::AppState;

/// The header a value's metadata travels in, both ways.
const METADATA_HEADER: &str = "cf-kv-metadata";

/// A request carrying [`headers::KV_NAMESPACE`] is a KV binding's, whatever its path; any
/// other goes on to the routes.
pub async fn serve(
    State(app): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(namespace) = request.headers().get(headers::KV_NAMESPACE).and_then(|v| v.to_str().ok()).map(str::to_owned)
    else {
        return next.run(request).await;
    };
    let account = match super::worker_account(&app, request.headers()) {
        Ok(account) => account,
        Err(e) => return e.into_response(),
    };
    match app.catalog.kv_namespace(&account, &namespace) {
        Ok(Some(_)) => {}
        Ok(None) => return kv_error(&KvError::NamespaceNotFound),
        Err(e) => return crate::error::ApiError::from(e).into_response(),
    }
    answer(&app, &namespace, request).await.unwrap_or_else(|e| kv_error(&e))
}

async fn answer(app: &AppState, namespace: &str, request: axum::extract::Request) -> Result<Response, KvError> {
    let query = Query::parse(request.uri().query().unwrap_or(""));
    let path = request.uri().path().to_owned();
    match (request.method().clone(), path.as_str()) {
        (Method::GET, "/") => list(app, namespace, &query).await,
        (Method::POST, "/bulk/get") => bulk_get(app, namespace, request.into_body()).await,
        (method, path) => {
            let segment = path.strip_prefix('/').unwrap_or(path);
            let key = match query.get("urlencoded") == Some("true") {
                true => percent_encoding::percent_decode_str(segment)
                    .decode_utf8()
                    .map_err(|_| KvError::UndecodableKey)?
                    .into_owned(),
                false => segment.to_owned(),
            };
            match method {
                Method::GET => get(app, namespace, &key, &query).await,
                Method::PUT => put(app, namespace, &key, &query, request).await,
                Method::DELETE => {
                    app.kv.delete(namespace, vec![key]).await?;
                    Ok(StatusCode::OK.into_response())
                }
                _ => Ok(status_line_failure(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")),
            }
        }
    }
}

/// The query string's parameters, decoded.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(text: &str) -> Query {
        Query(crate::s3::url::query_pairs(text, true))
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

async fn get(app: &AppState, namespace: &str, key: &str, query: &Query) -> Result<Response, KvError> {
    if let Some(ttl) = query.get("cache_ttl") {
        kura_kv::check_cache_ttl(ttl)?;
    }
    let Some(value) = app.kv.get(namespace, key).await? else {
        return Ok(StatusCode::NOT_FOUND.into_response());
    };
    let mut response = Response::new(Body::from_stream(value.body));
    let headers = response.headers_mut();
    headers.insert(axum::http::header::CONTENT_LENGTH, HeaderValue::from(value.entry.size));
    if let Some(metadata) = &value.entry.metadata
        && let Ok(header) = HeaderValue::from_str(&ascii_json(metadata))
    {
        headers.insert(METADATA_HEADER, header);
    }
    if let Some(at) = value.entry.expiration {
        headers.insert("cf-expiration", HeaderValue::from(at));
    }
    Ok(response)
}

async fn put(
    app: &AppState,
    namespace: &str,
    key: &str,
    query: &Query,
    request: axum::extract::Request,
) -> Result<Response, KvError> {
    let size = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|n| n.parse().ok());
    let options = app
        .kv
        .expiration(query.get("expiration"), query.get("expiration_ttl"))
        .and_then(|expiration| Ok(PutOptions { expiration, metadata: metadata_header(request.headers())?, size }));
    let mut body = request.into_body().into_data_stream().map_err(|e| std::io::Error::other(e.to_string()));
    let written = match options {
        Ok(options) => app.kv.put(namespace, key, &mut body, options).await.map(drop),
        Err(e) => Err(e),
    };
    if let Err(e) = written {
        crate::extract::discard_rest(&mut body, kura_kv::MAX_VALUE_BYTES).await;
        return Err(e);
    }
    Ok(StatusCode::OK.into_response())
}

/// `CF-KV-Metadata` as workerd sends it: JSON, possibly with raw UTF-8 in its strings.
fn metadata_header(headers: &HeaderMap) -> Result<Option<String>, KvError> {
    let Some(value) = headers.get(METADATA_HEADER) else { return Ok(None) };
    let text = String::from_utf8(value.as_bytes().to_vec())
        .map_err(|_| KvError::MetadataNotJson("the metadata is not UTF-8".into()))?;
    Ok(Some(text))
}

/// JSON text with every non-ASCII character escaped (`\uXXXX`), so it fits in a header. Only
/// strings hold such characters in JSON, and there the escape means the same character.
fn ascii_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

async fn list(app: &AppState, namespace: &str, query: &Query) -> Result<Response, KvError> {
    let limit = query.get("key_count_limit").map(kura_kv::parse_list_limit).transpose()?;
    let options = ListOptions {
        prefix: query.get("prefix").unwrap_or_default().to_owned(),
        limit: limit.unwrap_or(kura_kv::MAX_LIST_LIMIT),
        cursor: query.get("cursor").filter(|c| !c.is_empty()).map(str::to_owned),
    };
    let page = app.kv.list(namespace, options).await?;
    // workerd parses a string `metadata` as JSON: each is sent as its JSON text.
    let keys: Vec<Json> = page
        .keys
        .iter()
        .map(|entry| {
            let mut key = json!({"name": entry.key});
            if let Some(at) = entry.expiration {
                key["expiration"] = json!(at);
            }
            if let Some(metadata) = &entry.metadata {
                key["metadata"] = json!(metadata);
            }
            key
        })
        .collect();
    let mut body = json!({"keys": keys, "list_complete": page.list_complete});
    if let Some(cursor) = page.cursor {
        body["cursor"] = json!(cursor);
    }
    Ok(axum::Json(body).into_response())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BulkGet {
    keys: Vec<String>,
    #[serde(default, rename = "type")]
    as_type: Option<String>,
    #[serde(default)]
    with_metadata: bool,
    #[serde(default)]
    cache_ttl: Option<String>,
}

async fn bulk_get(app: &AppState, namespace: &str, body: Body) -> Result<Response, KvError> {
    let bytes = match read_body(body).await {
        Ok(bytes) => bytes,
        Err(e) => return Ok(status_line_failure(e.status(), e.message())),
    };
    let asked: BulkGet = match serde_json::from_slice(&bytes) {
        Ok(asked) => asked,
        Err(e) => return Ok(status_line_failure(StatusCode::BAD_REQUEST, &format!("The request is malformed: {e}"))),
    };
    if let Some(ttl) = &asked.cache_ttl {
        kura_kv::check_cache_ttl(ttl)?;
    }
    let as_type = asked.as_type.as_deref().map(ValueType::parse).transpose()?.unwrap_or_default();
    let found = app.kv.get_many(namespace, asked.keys, as_type).await?;
    let values = crate::render::kv_bulk_values(found, asked.with_metadata, false);
    Ok(axum::Json(Json::Object(values)).into_response())
}

#[cfg(test)]
mod tests {
    #[test]
    fn metadata_is_escaped_to_ascii_for_its_header() {
        let text = r#"{"someUnicodeMeta":"🤓","e":"é"}"#;
        let escaped = super::ascii_json(text);
        assert_eq!(escaped, r#"{"someUnicodeMeta":"\ud83e\udd13","e":"\u00e9"}"#);
        let a: serde_json::Value = serde_json::from_str(text).unwrap();
        let b: serde_json::Value = serde_json::from_str(&escaped).unwrap();
        assert_eq!(a, b);
    }
}
