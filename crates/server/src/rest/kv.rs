//! Workers KV's v4 endpoints, as wrangler's `kv namespace`, `kv key --remote` and
//! `kv bulk --remote` commands and Cloudflare's SDKs call them: namespaces (create, list,
//! rename, delete), single keys (values with their metadata and expiry, as raw bytes or as
//! wrangler's multipart form), listings by prefix with a cursor, and bulk writes, deletes and
//! reads.

use axum::body::Body;
use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use base64::Engine as _;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use serde::Deserialize;
use serde_json::{Value as Json, json};

use kura_catalog::{KvNamespace, KvOrder};
use kura_kv::{KvError, ListOptions, PutOptions, ValueType};

use crate::auth::{Caller, Need};
use crate::error::{ApiError, ResultInfo, ok, ok_paged};
use crate::extract::{V4Path, V4Query, parse_json, query_number, read_body};
use crate::render::{kv_bulk_values, kv_key_json, kv_metadata_json, kv_namespace_json};
use crate::resources::find_kv_namespace;
use crate::state::AppState;

/// Most entries in one bulk write or delete (Cloudflare's API limit).
const MAX_BULK_KEYS: usize = 10_000;

/// The account's namespace `id`, for a caller that may do `need` there.
fn reach(app: &AppState, caller: &Caller, account_id: &str, id: &str, need: Need) -> Result<KvNamespace, ApiError> {
    caller.require(account_id, need)?;
    find_kv_namespace(app, account_id, id)
}

fn catalog_error(e: kura_catalog::Error) -> ApiError {
    match e {
        kura_catalog::Error::Duplicate { .. } => {
            ApiError::new(StatusCode::BAD_REQUEST, 10014, "a namespace with this account ID and title already exists")
        }
        kura_catalog::Error::Invalid(m) => ApiError::new(StatusCode::BAD_REQUEST, 10019, m),
        kura_catalog::Error::LimitReached { .. } => {
            ApiError::new(StatusCode::BAD_REQUEST, 10018, "too many namespaces in this account")
        }
        other => other.into(),
    }
}

#[derive(Deserialize)]
struct TitleBody {
    title: String,
}

/// `GET /accounts/{a}/storage/kv/namespaces`: `page` (from 1), `per_page` (up to 1,000),
/// `order` (`id` or `title`), `direction`.
pub async fn list_namespaces(
    State(app): State<AppState>,
    caller: Caller,
    V4Path(account_id): V4Path<String>,
    V4Query(query): V4Query,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::KvRead)?;
    let page = query_number(&query, "page")?.unwrap_or(1).max(1);
    let per_page = query_number(&query, "per_page")?.unwrap_or(20).clamp(5, 1000);
    let order = match query.get("order").map(String::as_str) {
        None | Some("id") => KvOrder::Id,
        Some("title") => KvOrder::Title,
        Some(other) => return Err(ApiError::bad_request(format!("invalid order '{other}': use id or title"))),
    };
    let descending = query.get("direction").is_some_and(|d| d == "desc");
    let (namespaces, total) =
        app.catalog.list_kv_namespaces(&account_id, order, descending, page, per_page).map_err(catalog_error)?;
    let info = ResultInfo::numbered(page, per_page, namespaces.len() as u64, total);
    Ok(ok_paged(namespaces.iter().map(kv_namespace_json).collect::<Vec<_>>(), info))
}

/// `POST /accounts/{a}/storage/kv/namespaces` with `{"title": …}`.
pub async fn create_namespace(
    State(app): State<AppState>,
    caller: Caller,
    V4Path(account_id): V4Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::KvWrite)?;
    let body: TitleBody = parse_json(&read_body(body).await?)?;
    let namespace = app.catalog.create_kv_namespace(&account_id, &body.title).map_err(catalog_error)?;
    if let Err(e) = app.kv.create_namespace(&namespace.id).await {
        let _ = app.catalog.delete_kv_namespace(&account_id, &namespace.id);
        return Err(e.into());
    }
    Ok(ok(kv_namespace_json(&namespace)))
}

/// `GET /accounts/{a}/storage/kv/namespaces/{namespace}`
pub async fn namespace(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    Ok(ok(kv_namespace_json(&reach(&app, &caller, &account_id, &id, Need::KvRead)?)))
}

/// `PUT /accounts/{a}/storage/kv/namespaces/{namespace}` with `{"title": …}`: answers the
/// renamed namespace (wrangler prints its title).
pub async fn rename_namespace(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    reach(&app, &caller, &account_id, &id, Need::KvWrite)?;
    let body: TitleBody = parse_json(&read_body(body).await?)?;
    let renamed = app.catalog.rename_kv_namespace(&account_id, &id, &body.title).map_err(catalog_error)?;
    Ok(ok(kv_namespace_json(&renamed.ok_or(KvError::NamespaceNotFound)?)))
}

/// `DELETE /accounts/{a}/storage/kv/namespaces/{namespace}`: the catalog forgets it, then its
/// storage goes (what a failure leaves, the start-up sweep removes).
pub async fn delete_namespace(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let namespace = reach(&app, &caller, &account_id, &id, Need::KvWrite)?;
    if !app.catalog.delete_kv_namespace(&account_id, &namespace.id)? {
        return Err(KvError::NamespaceNotFound.into());
    }
    if let Err(e) = app.kv.delete_namespace(&namespace.id).await {
        tracing::warn!(namespace = namespace.id, error = %e, "could not remove a deleted KV namespace's storage");
    }
    Ok(ok(Json::Null))
}

/// `GET /accounts/{a}/storage/kv/namespaces/{namespace}/keys`: `prefix`, `limit` (10 to
/// 1,000), `cursor`; `result_info.cursor` is empty on the last page.
pub async fn list_keys(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
    V4Query(query): V4Query,
) -> Result<Response, ApiError> {
    let namespace = reach(&app, &caller, &account_id, &id, Need::KvRead)?;
    let limit = match query.get("limit").filter(|l| !l.is_empty()) {
        Some(text) => match text.parse::<usize>() {
            // The API's own floor, above the binding's.
            Ok(n) if (10..=kura_kv::MAX_LIST_LIMIT).contains(&n) => n,
            _ => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    10028,
                    format!("Invalid limit of {text}: specify an integer from 10 to 1000"),
                ));
            }
        },
        None => kura_kv::MAX_LIST_LIMIT,
    };
    let options = ListOptions {
        prefix: query.get("prefix").cloned().unwrap_or_default(),
        limit,
        cursor: query.get("cursor").cloned().filter(|c| !c.is_empty()),
    };
    let page = app.kv.list(&namespace.id, options).await?;
    let info = ResultInfo {
        count: Some(page.keys.len() as u64),
        cursor: Some(page.cursor.unwrap_or_default()),
        ..ResultInfo::default()
    };
    Ok(ok_paged(page.keys.iter().map(kv_key_json).collect::<Vec<_>>(), info))
}

fn key_not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, 10009, "get: 'key not found'")
}

/// `GET /accounts/{a}/storage/kv/namespaces/{namespace}/values/{key}`: the value's bytes, as
/// they were written (wrangler's `kv key get` prints them as they come).
pub async fn get_value(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id, key)): V4Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let namespace = reach(&app, &caller, &account_id, &id, Need::KvRead)?;
    let value = app.kv.get(&namespace.id, &key).await?.ok_or_else(key_not_found)?;
    let mut response = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, value.entry.size);
    if let Some(at) = value.entry.expiration {
        response = response.header("expiration", at);
    }
    response.body(Body::from_stream(value.body)).map_err(|e| ApiError::internal(&e))
}

/// `GET /accounts/{a}/storage/kv/namespaces/{namespace}/metadata/{key}`: the key's metadata
/// (`null` when it has none).
pub async fn get_metadata(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id, key)): V4Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let namespace = reach(&app, &caller, &account_id, &id, Need::KvRead)?;
    let entry = app.kv.head(&namespace.id, &key).await?.ok_or_else(key_not_found)?;
    Ok(ok(kv_metadata_json(&entry)))
}

/// `PUT /accounts/{a}/storage/kv/namespaces/{namespace}/values/{key}` with `expiration` or
/// `expiration_ttl` in the query: the body is the value, or a multipart form with `value`
/// and `metadata` (wrangler's `kv key put --metadata`).
pub async fn put_value(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id, key)): V4Path<(String, String, String)>,
    V4Query(query): V4Query,
    request: Request,
) -> Result<Response, ApiError> {
    let namespace = reach(&app, &caller, &account_id, &id, Need::KvWrite)?;
    let checked = kura_kv::check_key(&key).and_then(|()| {
        app.kv.expiration(
            query.get("expiration").map(String::as_str).filter(|e| !e.is_empty()),
            query.get("expiration_ttl").map(String::as_str).filter(|e| !e.is_empty()),
        )
    });
    let expiration = match checked {
        Ok(expiration) => expiration,
        Err(e) => {
            crate::extract::discard_rest(&mut request.into_body().into_data_stream(), kura_kv::MAX_VALUE_BYTES).await;
            return Err(e.into());
        }
    };
    let multipart = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.trim_start().to_ascii_lowercase().starts_with("multipart/form-data"));
    if multipart {
        let form = Multipart::from_request(request, &app)
            .await
            .map_err(|e| ApiError::bad_request(format!("The request is malformed: {}", e.body_text())))?;
        let (value, metadata) = read_value_form(form).await?;
        let options = PutOptions { expiration, metadata, size: Some(value.len() as u64) };
        app.kv.put(&namespace.id, &key, futures_util::stream::iter([Ok::<_, std::io::Error>(value)]), options).await?;
    } else {
        let size = content_length(request.headers());
        let mut body = request.into_body().into_data_stream().map_err(|e| std::io::Error::other(e.to_string()));
        let options = PutOptions { expiration, metadata: None, size };
        if let Err(e) = app.kv.put(&namespace.id, &key, &mut body, options).await {
            crate::extract::discard_rest(&mut body, kura_kv::MAX_VALUE_BYTES).await;
            return Err(e.into());
        }
    }
    Ok(ok(json!({})))
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|n| n.parse().ok())
}

/// The `value` and `metadata` fields of a value's multipart form.
async fn read_value_form(mut form: Multipart) -> Result<(Bytes, Option<String>), ApiError> {
    let malformed = |e: axum::extract::multipart::MultipartError| {
        ApiError::bad_request(format!("The request is malformed: {}", e.body_text()))
    };
    let (mut value, mut metadata) = (None, None);
    while let Some(field) = form.next_field().await.map_err(malformed)? {
        match field.name() {
            Some("value") => value = Some(field.bytes().await.map_err(malformed)?),
            Some("metadata") => metadata = Some(field.text().await.map_err(malformed)?),
            _ => {}
        }
    }
    let value = value.ok_or_else(|| ApiError::bad_request("The request is malformed: the form has no value"))?;
    Ok((value, metadata.filter(|m| !m.is_empty())))
}

/// `DELETE /accounts/{a}/storage/kv/namespaces/{namespace}/values/{key}`
pub async fn delete_value(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id, key)): V4Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let namespace = reach(&app, &caller, &account_id, &id, Need::KvWrite)?;
    app.kv.delete(&namespace.id, vec![key]).await?;
    Ok(ok(json!({})))
}

/// One entry of a bulk write.
#[derive(Deserialize)]
struct BulkEntry {
    key: String,
    value: String,
    #[serde(default)]
    expiration: Option<Json>,
    #[serde(default)]
    expiration_ttl: Option<Json>,
    #[serde(default)]
    metadata: Option<Json>,
    #[serde(default)]
    base64: bool,
}

fn number_text(value: &Option<Json>) -> Option<String> {
    match value {
        None | Some(Json::Null) => None,
        Some(Json::String(s)) => Some(s.clone()),
        Some(other) => Some(other.to_string()),
    }
}

/// `PUT /accounts/{a}/storage/kv/namespaces/{namespace}/bulk`: up to 10,000 entries
/// `{key, value, expiration?, expiration_ttl?, metadata?, base64?}`. Every entry is checked
/// before any is written, so bad input writes nothing.
pub async fn bulk_put(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    let namespace = reach(&app, &caller, &account_id, &id, Need::KvWrite)?;
    let entries: Vec<BulkEntry> = parse_json(&read_body(body).await?)?;
    if entries.len() > MAX_BULK_KEYS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            10024,
            format!("at most {MAX_BULK_KEYS} entries may be written at once"),
        ));
    }
    let mut writes = Vec::with_capacity(entries.len());
    for entry in entries {
        kura_kv::check_key(&entry.key)?;
        let value = match entry.base64 {
            true => base64::engine::general_purpose::STANDARD.decode(entry.value.as_bytes()).map_err(|_| {
                ApiError::new(StatusCode::BAD_REQUEST, 10012, format!("the value of '{}' is not base64", entry.key))
            })?,
            false => entry.value.into_bytes(),
        };
        if value.len() as u64 > kura_kv::MAX_VALUE_BYTES {
            return Err(KvError::ValueTooLarge(Some(value.len() as u64)).into());
        }
        let metadata = entry.metadata.filter(|m| !m.is_null()).map(|m| m.to_string());
        if let Some(metadata) = &metadata {
            kura_kv::check_metadata(metadata)?;
        }
        let expiration = app
            .kv
            .expiration(number_text(&entry.expiration).as_deref(), number_text(&entry.expiration_ttl).as_deref())?;
        let size = Some(value.len() as u64);
        writes.push((entry.key, Bytes::from(value), PutOptions { expiration, metadata, size }));
    }
    let total = writes.len();
    // Written side by side, so the engine's group commit makes a few syncs of them.
    let failed: Vec<String> = futures_util::stream::iter(writes)
        .map(|(key, value, options)| {
            let (kv, namespace) = (app.kv.clone(), namespace.id.clone());
            async move {
                let body = futures_util::stream::iter([Ok::<_, std::io::Error>(value)]);
                match kv.put(&namespace, &key, body, options).await {
                    Ok(_) => None,
                    Err(e) => {
                        tracing::warn!(key, error = %e, "a bulk write's entry failed");
                        Some(key)
                    }
                }
            }
        })
        .buffer_unordered(32)
        .filter_map(std::future::ready)
        .collect()
        .await;
    Ok(ok(json!({"successful_key_count": total - failed.len(), "unsuccessful_keys": failed})))
}

/// The keys of a bulk delete or read: strings, or `{name}` objects.
fn key_names(values: Vec<Json>) -> Result<Vec<String>, ApiError> {
    values
        .into_iter()
        .map(|v| match v {
            Json::String(s) => Ok(s),
            Json::Object(mut o) => match o.remove("name") {
                Some(Json::String(s)) => Ok(s),
                _ => Err(ApiError::bad_request("The request is malformed: a key must be a string or {\"name\": …}")),
            },
            _ => Err(ApiError::bad_request("The request is malformed: a key must be a string or {\"name\": …}")),
        })
        .collect()
}

/// `DELETE /accounts/{a}/storage/kv/namespaces/{namespace}/bulk` (and `POST …/bulk/delete`):
/// a JSON array of up to 10,000 keys.
pub async fn bulk_delete(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    let namespace = reach(&app, &caller, &account_id, &id, Need::KvWrite)?;
    let keys = key_names(parse_json(&read_body(body).await?)?)?;
    if keys.len() > MAX_BULK_KEYS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            10024,
            format!("at most {MAX_BULK_KEYS} keys may be deleted at once"),
        ));
    }
    let count = keys.len();
    app.kv.delete(&namespace.id, keys).await?;
    Ok(ok(json!({"successful_key_count": count, "unsuccessful_keys": []})))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BulkGetBody {
    keys: Vec<Json>,
    #[serde(default, rename = "type")]
    as_type: Option<String>,
    #[serde(default)]
    with_metadata: bool,
}

/// `POST /accounts/{a}/storage/kv/namespaces/{namespace}/bulk/get`: up to 100 keys, as text
/// or JSON, with their metadata when asked; a missing key's value is `null`.
pub async fn bulk_get(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    let namespace = reach(&app, &caller, &account_id, &id, Need::KvRead)?;
    let body: BulkGetBody = parse_json(&read_body(body).await?)?;
    let as_type = body.as_type.as_deref().map(ValueType::parse).transpose()?.unwrap_or_default();
    let found = app.kv.get_many(&namespace.id, key_names(body.keys)?, as_type).await?;
    Ok(ok(json!({"values": kv_bulk_values(found, body.with_metadata, true)})))
}
