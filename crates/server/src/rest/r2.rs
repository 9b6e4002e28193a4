//! R2's v4 endpoints, as wrangler's `r2 bucket` and `r2 object --remote` commands call them:
//! buckets (list, create, get, delete) and single objects (PUT, GET, DELETE) by key.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use futures_util::TryStreamExt;
use serde::Deserialize;
use serde_json::json;

use kura_catalog::R2Bucket;
use kura_r2::{GetOptions, ListOptions, PutOptions};

use crate::auth::{Caller, Need};
use crate::error::{ApiError, ResultInfo, ok, ok_paged};
use crate::extract::parse_json;
use crate::extract::{V4Path, V4Query, read_body};
use crate::render::{bucket_json, r2_object_json};
use crate::resources::{find_bucket, require_reach};
use crate::state::AppState;

const LOCATION_HINTS: &[&str] = &["apac", "eeur", "enam", "weur", "wnam", "oc"];

/// `GET /accounts/{account_id}/r2/buckets`
pub async fn list(
    State(app): State<AppState>,
    caller: Caller,
    V4Path(account_id): V4Path<String>,
    V4Query(query): V4Query,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::R2Read)?;
    let per_page = match query.get("per_page") {
        Some(n) => n
            .parse::<usize>()
            .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, 10040, "per_page must be a number"))?,
        None => 1000,
    }
    .clamp(1, 1000);
    let contains = query.get("name_contains").cloned().unwrap_or_default();
    let after = query.get("cursor").or_else(|| query.get("start_after")).cloned().unwrap_or_default();
    let credential = app.catalog.s3_credential(&caller.token.id).map_err(|e| ApiError::internal(&e))?;
    let descending = query.get("direction").is_some_and(|d| d == "desc");
    let mut buckets: Vec<R2Bucket> = app
        .catalog
        .list_r2_buckets(&account_id)
        .map_err(|e| ApiError::internal(&e))?
        .into_iter()
        .filter(|b| b.name.contains(&contains))
        .filter(|b| after.is_empty() || if descending { b.name < after } else { b.name > after })
        .filter(|b| credential.as_ref().is_some_and(|c| c.reaches(&b.name)))
        .collect();
    if descending {
        buckets.reverse();
    }
    let more = buckets.len() > per_page;
    buckets.truncate(per_page);
    let cursor = if more { buckets.last().map(|b| b.name.clone()) } else { None };
    let info = ResultInfo {
        cursor: Some(cursor.unwrap_or_default()),
        per_page: Some(per_page as u64),
        ..ResultInfo::default()
    };
    Ok(ok_paged(json!({ "buckets": buckets.iter().map(bucket_json).collect::<Vec<_>>() }), info))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateBody {
    name: String,
    location_hint: Option<String>,
    storage_class: Option<String>,
}

/// `POST /accounts/{account_id}/r2/buckets`
pub async fn create(
    State(app): State<AppState>,
    caller: Caller,
    V4Path(account_id): V4Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::R2Write)?;
    let bytes = read_body(body).await?;
    let body: CreateBody = parse_json(&bytes)
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, 10040, "The JSON you provided was not well formed."))?;
    // A bucket-limited token makes only buckets its limit names, as over S3.
    require_reach(&app, &caller, &body.name)?;
    let location = body.location_hint.map(|l| l.to_ascii_lowercase());
    if let Some(l) = &location
        && !LOCATION_HINTS.contains(&l.as_str())
    {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            10029,
            format!("Invalid location hint '{l}': use one of {}", LOCATION_HINTS.join(", ")),
        ));
    }
    let bucket = crate::buckets::create(
        &app.catalog,
        &app.r2,
        &account_id,
        &body.name,
        location.as_deref(),
        body.storage_class.as_deref(),
    )
    .await?;
    Ok(ok(bucket_json(&bucket)))
}

/// `GET /accounts/{account_id}/r2/buckets/{bucket}`
pub async fn details(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::R2Read)?;
    let bucket = find_bucket(&app, &caller, &account_id, &name)?;
    Ok(ok(bucket_json(&bucket)))
}

/// `DELETE /accounts/{account_id}/r2/buckets/{bucket}`
pub async fn delete(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::R2Write)?;
    find_bucket(&app, &caller, &account_id, &name)?;
    crate::buckets::delete(&app.catalog, &app.r2, &account_id, &name).await?;
    Ok(ok(json!({})))
}

fn header_text(headers: &HeaderMap, name: header::HeaderName) -> Option<String> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// `PUT /accounts/{account_id}/r2/buckets/{bucket}/objects/{key}`: the body is the object.
pub async fn put_object(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name, key)): V4Path<(String, String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::R2Write)?;
    let bucket = find_bucket(&app, &caller, &account_id, &name)?;
    let size = header_text(&headers, header::CONTENT_LENGTH).and_then(|n| n.parse().ok());
    let options = PutOptions {
        http: crate::s3::http_metadata(&headers),
        storage_class: headers.get("cf-r2-storage-class").and_then(|v| v.to_str().ok()).map(str::to_owned),
        size,
        ..Default::default()
    };
    let stream = body.into_data_stream().map_err(|e| std::io::Error::other(e.to_string()));
    let info = app.r2.put_object(&bucket.id, &key, stream, options).await?;
    Ok(ok(r2_object_json(&info)))
}

/// `GET /accounts/{account_id}/r2/buckets/{bucket}/objects/{key}`: the object's bytes.
pub async fn get_object(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name, key)): V4Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::R2Read)?;
    let bucket = find_bucket(&app, &caller, &account_id, &name)?;
    let object = app.r2.get_object(&bucket.id, &key, GetOptions::default()).await?;
    let info = &object.info;
    let mut response = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_LENGTH, info.size)
        .header(header::ETAG, info.http_etag())
        .header(header::CONTENT_TYPE, info.http.content_type.as_deref().unwrap_or("application/octet-stream"));
    for (name, value) in [
        (header::CONTENT_LANGUAGE, &info.http.content_language),
        (header::CONTENT_DISPOSITION, &info.http.content_disposition),
        (header::CONTENT_ENCODING, &info.http.content_encoding),
        (header::CACHE_CONTROL, &info.http.cache_control),
        (header::EXPIRES, &info.http.expires),
    ] {
        if let Some(value) = value {
            response = response.header(name, value);
        }
    }
    response.body(Body::from_stream(object.body)).map_err(|e| ApiError::internal(&e))
}

/// `DELETE /accounts/{account_id}/r2/buckets/{bucket}/objects/{key}`
pub async fn delete_object(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name, key)): V4Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::R2Write)?;
    let bucket = find_bucket(&app, &caller, &account_id, &name)?;
    app.r2.delete_object(&bucket.id, &key).await?;
    Ok(ok(json!({})))
}

/// `GET /accounts/{account_id}/r2/buckets/{bucket}/objects`: one page of keys (`prefix`,
/// `delimiter`, `cursor`, `per_page` up to 1,000), as Cloudflare's dashboard lists them.
pub async fn list_objects(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
    V4Query(query): V4Query,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::R2Read)?;
    let bucket = find_bucket(&app, &caller, &account_id, &name)?;
    let per_page = match query.get("per_page") {
        Some(n) => n.parse::<usize>().map_err(|_| {
            ApiError::new(StatusCode::BAD_REQUEST, 10022, "MaxKeys params must be positive integer <= 1000.")
        })?,
        None => 1000,
    };
    if !(1..=1000).contains(&per_page) {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, 10022, "MaxKeys params must be positive integer <= 1000."));
    }
    let options = ListOptions {
        prefix: query.get("prefix").cloned().unwrap_or_default(),
        delimiter: query.get("delimiter").cloned(),
        start_after: query.get("start_after").cloned(),
        cursor: query.get("cursor").cloned().filter(|c| !c.is_empty()),
        limit: per_page,
    };
    let listing = app.r2.list(&bucket.id, options).await?;
    let info = ResultInfo {
        cursor: Some(listing.cursor.unwrap_or_default()),
        is_truncated: Some(listing.truncated),
        delimited: Some(listing.prefixes),
        per_page: Some(per_page as u64),
        ..ResultInfo::default()
    };
    Ok(ok_paged(listing.objects.iter().map(r2_object_json).collect::<Vec<_>>(), info))
}
