//! workerd's R2 binding protocol (workerd's `src/workerd/api/r2*.c++`), what a deployed Worker's
//! `env.BUCKET` sends: `GET /` with the request in `cf-r2-request` for head, get and list;
//! `PUT /` with `cf-r2-metadata-size` bytes of JSON before the payload for put, delete and
//! multipart. Replies carry their JSON first (`cf-r2-metadata-size`) and the object's bytes
//! after it; failures carry `cf-r2-error` with R2's v4 code, which workerd turns into the
//! exception (or the `null`) a Worker sees.

mod reply;
mod wire;

use reply::{BindingError, METADATA_SIZE_HEADER, head_json, metadata_reply};
use wire::{
    BindingRequest, MAX_METADATA, OnlyIfJson, REQUEST_HEADER, RangeJson, byte_range, conditional, expected_digests,
    http_metadata, parse_request, refuse_ssec,
};

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures_util::{StreamExt, TryStreamExt};
use serde_json::{Value as Json, json};

use kura_r2::{ExpectedDigests, GetOptions, ListOptions, PartOptions, PutOptions, R2Error};
use kura_workers::config::headers;

use crate::auth::{Caller, Need};
use crate::error::ApiError;
use crate::state::AppState;

/// Objects up to this size are read whole and sent in one piece with their metadata.
const SMALL_OBJECT: u64 = 64 * 1024;

/// The bucket (its storage id) named in the path of a request on the API listener, if the
/// request's bearer token reaches it and may do `need`.
fn bucket_for_token(app: &AppState, headers: &HeaderMap, name: &str, need: Need) -> Result<String, BindingError> {
    let refused = |e: ApiError| BindingError::new(e.status(), e.code(), e.message());
    let caller = Caller::from_headers(headers, app).map_err(refused)?;
    let account = caller.token.account_id.clone();
    caller.require(&account, need).map_err(refused)?;
    match crate::resources::find_bucket(app, &caller, &account, name) {
        Ok(bucket) => Ok(bucket.id),
        Err(e) => Err(refused(e)),
    }
}

/// The bucket the binding's configuration names (its storage id).
fn bucket_of(app: &AppState, headers: &HeaderMap) -> Result<String, BindingError> {
    let account = super::worker_account(app, headers).map_err(|e| BindingError::new(e.status(), 10001, e.message()))?;
    let name = headers.get(headers::R2_BUCKET).and_then(|v| v.to_str().ok()).unwrap_or("");
    match app.catalog.r2_bucket(&account, name) {
        Ok(Some(bucket)) => Ok(bucket.id),
        Ok(None) => Err(BindingError::from(R2Error::NoSuchBucket)),
        Err(e) => Err(BindingError::new(StatusCode::INTERNAL_SERVER_ERROR, 10001, e.to_string())),
    }
}

/// `GET /` on the Workers' socket: head, get and list.
pub async fn read(State(app): State<AppState>, headers: HeaderMap) -> Response {
    match bucket_of(&app, &headers) {
        Ok(bucket) => read_from(&app, &bucket, &headers).await,
        Err(e) => e.into_response(),
    }
}

/// `GET /binding/r2/{bucket}` on the API listener, for a token that may read the bucket.
pub async fn read_at(State(app): State<AppState>, headers: HeaderMap, Path(name): Path<String>) -> Response {
    match bucket_for_token(&app, &headers, &name, Need::R2Read) {
        Ok(bucket) => read_from(&app, &bucket, &headers).await,
        Err(e) => e.into_response(),
    }
}

async fn read_from(app: &AppState, bucket: &str, headers: &HeaderMap) -> Response {
    let outcome = async {
        let request = headers
            .get(REQUEST_HEADER)
            .ok_or_else(|| BindingError::invalid(format!("the {REQUEST_HEADER} header is missing")))?;
        match parse_request(request.as_bytes())? {
            BindingRequest::Head { object } => head(app, bucket, &object).await,
            BindingRequest::Get { object, range, range_header, only_if } => {
                get(app, bucket, &object, range, range_header, only_if).await
            }
            BindingRequest::List { limit, prefix, cursor, delimiter, start_after, include } => {
                list(app, bucket, limit, prefix, cursor, delimiter, start_after, include).await
            }
            _ => Err(BindingError::new(StatusCode::BAD_REQUEST, 10001, "that method is sent with PUT")),
        }
    };
    outcome.await.unwrap_or_else(IntoResponse::into_response)
}

/// `PUT /` on the Workers' socket: put, delete and multipart.
pub async fn write(State(app): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    match bucket_of(&app, &headers) {
        Ok(bucket) => write_to(&app, &bucket, &headers, body).await,
        Err(e) => e.into_response(),
    }
}

/// `PUT /binding/r2/{bucket}` on the API listener, for a token that may change the bucket.
pub async fn write_at(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Response {
    match bucket_for_token(&app, &headers, &name, Need::R2Write) {
        Ok(bucket) => write_to(&app, &bucket, &headers, body).await,
        Err(e) => e.into_response(),
    }
}

async fn write_to(app: &AppState, bucket: &str, headers: &HeaderMap, body: Body) -> Response {
    let outcome = async {
        let size: usize = headers
            .get(METADATA_SIZE_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .filter(|n| *n <= MAX_METADATA)
            .ok_or_else(|| BindingError::invalid("Metadata missing or invalid"))?;
        let total: Option<u64> =
            headers.get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        let (metadata, payload) = split_body(body, size).await?;
        let payload_size = total.map(|t| t.saturating_sub(size as u64));
        match parse_request(&metadata)? {
            BindingRequest::Put {
                object,
                custom_fields,
                http_fields,
                only_if,
                md5,
                sha1,
                sha256,
                sha384,
                sha512,
                storage_class,
                ssec,
            } => {
                refuse_ssec(&ssec)?;
                let digests = expected_digests(md5, [sha1, sha256, sha384, sha512])?;
                let options = PutOptions {
                    http: http_metadata(http_fields),
                    custom: custom_fields.into_iter().map(|f| (f.k, f.v)).collect(),
                    storage_class,
                    conditional: conditional(only_if),
                    digests,
                    size: payload_size,
                    max_size: None,
                };
                let mut payload = payload;
                match app.r2.put_object(bucket, &object, payload.by_ref(), options).await {
                    Ok(info) => Ok(axum::Json(head_json(&info, None, true, true)).into_response()),
                    Err(e) => Err(refused(payload, e).await),
                }
            }
            BindingRequest::Delete { object, objects } => {
                let keys = objects.unwrap_or_default().into_iter().chain(object).collect();
                app.r2.delete_objects(bucket, keys).await?;
                Ok(StatusCode::OK.into_response())
            }
            BindingRequest::CreateMultipartUpload { object, custom_fields, http_fields, storage_class, ssec } => {
                refuse_ssec(&ssec)?;
                let custom: BTreeMap<String, String> = custom_fields.into_iter().map(|f| (f.k, f.v)).collect();
                let id = app
                    .r2
                    .create_multipart_upload(
                        bucket,
                        &object,
                        http_metadata(http_fields),
                        custom,
                        storage_class.as_deref(),
                        None,
                    )
                    .await?;
                Ok(axum::Json(json!({"uploadId": id})).into_response())
            }
            BindingRequest::UploadPart { object, upload_id, part_number, ssec } => {
                refuse_ssec(&ssec)?;
                let options = PartOptions { size: payload_size, digests: ExpectedDigests::default() };
                let mut payload = payload;
                match app.r2.upload_part(bucket, &object, &upload_id, part_number, payload.by_ref(), options).await {
                    Ok(part) => Ok(axum::Json(json!({"etag": part.etag})).into_response()),
                    Err(e) => Err(refused(payload, e).await),
                }
            }
            BindingRequest::CompleteMultipartUpload { object, upload_id, parts } => {
                let parts = parts.into_iter().map(|p| (p.part, p.etag)).collect();
                let info = match app
                    .r2
                    .complete_multipart_upload(bucket, &object, &upload_id, parts, Default::default())
                    .await
                {
                    Ok(info) => info,
                    // workerd asserts on "not found" here; R2 says the upload does not exist.
                    Err(R2Error::NoSuchKey) => return Err(R2Error::NoSuchUpload.into()),
                    Err(e) => return Err(e.into()),
                };
                Ok(axum::Json(head_json(&info, None, true, true)).into_response())
            }
            BindingRequest::AbortMultipartUpload { object, upload_id } => {
                match app.r2.abort_multipart_upload(bucket, &object, &upload_id).await {
                    Ok(()) | Err(R2Error::NoSuchUpload) => Ok(StatusCode::OK.into_response()),
                    Err(e) => Err(e.into()),
                }
            }
            _ => Err(BindingError::new(StatusCode::BAD_REQUEST, 10001, "that method is sent with GET")),
        }
    };
    outcome.await.unwrap_or_else(IntoResponse::into_response)
}

type Payload = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, axum::Error>> + Send>>;

/// The first `size` bytes of the body (the request's JSON), and the rest as a stream.
async fn split_body(body: Body, size: usize) -> Result<(Bytes, Payload), BindingError> {
    let mut stream = body.into_data_stream();
    let mut head = BytesMut::new();
    while head.len() < size {
        match stream.try_next().await {
            Ok(Some(chunk)) => head.extend_from_slice(&chunk),
            Ok(None) => return Err(BindingError::invalid("Metadata missing or invalid")),
            Err(e) => return Err(BindingError::new(StatusCode::BAD_REQUEST, 10013, e.to_string())),
        }
    }
    let rest = head.split_off(size).freeze();
    let first = futures_util::stream::iter((!rest.is_empty()).then_some(Ok(rest)));
    Ok((head.freeze(), Box::pin(first.chain(stream))))
}

/// A write refused (perhaps before its payload was read): what is left of the payload is read
/// first, so workerd's connection stays whole and the Worker sees R2's error rather than a
/// lost connection.
async fn refused(payload: Payload, e: R2Error) -> BindingError {
    drain(payload).await;
    e.into()
}

/// Reads what is left of a payload, up to a bound; past it the connection is closed instead.
async fn drain(mut payload: Payload) {
    let mut left: usize = 16 * 1024 * 1024;
    while let Ok(Some(chunk)) = payload.try_next().await {
        left = left.saturating_sub(chunk.len());
        if left == 0 {
            break;
        }
    }
}

async fn head(app: &AppState, bucket: &str, key: &str) -> Result<Response, BindingError> {
    let info = app.r2.head_object(bucket, key).await?.ok_or(R2Error::NoSuchKey)?;
    Ok(metadata_reply(StatusCode::OK, &head_json(&info, Some((0, info.size)), true, true), Body::empty(), 0))
}

async fn get(
    app: &AppState,
    bucket: &str,
    key: &str,
    range: Option<RangeJson>,
    range_header: Option<String>,
    only_if: Option<OnlyIfJson>,
) -> Result<Response, BindingError> {
    let range = byte_range(range, range_header)?;
    let options = GetOptions { range, conditional: conditional(only_if), part_number: None };
    match app.r2.get_object(bucket, key, options).await {
        Ok(object) => {
            let served = object.range.unwrap_or((0, object.info.size));
            let metadata = head_json(&object.info, Some(served), true, true);
            let length = object.length();
            if length <= SMALL_OBJECT {
                // One buffer, one write: the JSON and a small object's bytes together.
                let mut all = BytesMut::from(metadata.to_string().as_bytes());
                let json_len = all.len();
                let mut body = object.body;
                while let Some(chunk) = body.next().await {
                    let chunk = chunk.map_err(|e| BindingError::from(R2Error::Storage(e.to_string())))?;
                    all.extend_from_slice(&chunk);
                }
                let mut response = (StatusCode::OK, Body::from(all.freeze())).into_response();
                response.headers_mut().insert(METADATA_SIZE_HEADER, HeaderValue::from(json_len));
                return Ok(response);
            }
            Ok(metadata_reply(StatusCode::OK, &metadata, Body::from_stream(object.body), length))
        }
        Err(e @ (R2Error::PreconditionFailed | R2Error::NotModified)) => {
            // The Worker still gets the object, without its body.
            let mut failure = BindingError::from(e);
            failure.status = StatusCode::PRECONDITION_FAILED;
            failure.code = 10031;
            if let Some(info) = app.r2.head_object(bucket, key).await? {
                failure.object = Some(head_json(&info, Some((0, info.size)), true, true));
            }
            Err(failure)
        }
        Err(e) => Err(e.into()),
    }
}

#[allow(clippy::too_many_arguments)]
async fn list(
    app: &AppState,
    bucket: &str,
    limit: Option<u32>,
    prefix: Option<String>,
    cursor: Option<String>,
    delimiter: Option<String>,
    start_after: Option<String>,
    include: Option<Vec<u32>>,
) -> Result<Response, BindingError> {
    let include = include.unwrap_or_default();
    let limit = match limit {
        None => 1000,
        Some(n) if (1..=1000).contains(&n) => n as usize,
        Some(_) => {
            return Err(BindingError::new(
                StatusCode::BAD_REQUEST,
                10022,
                "MaxKeys params must be positive integer <= 1000.",
            ));
        }
    };
    // With metadata to send, pages are smaller, as R2's are.
    let limit = if include.is_empty() { limit } else { limit.min(100) };
    let options = ListOptions {
        prefix: prefix.unwrap_or_default(),
        delimiter: delimiter.filter(|d| !d.is_empty()),
        start_after,
        cursor: cursor.filter(|c| !c.is_empty()),
        limit,
    };
    let listing = app.r2.list(bucket, options).await?;
    let (http, custom) = (include.contains(&0), include.contains(&1));
    let objects: Vec<Json> = listing
        .objects
        .iter()
        .map(|info| {
            let mut entry = head_json(info, None, true, true);
            // Not asked for: present but empty, as under wrangler dev.
            if !http {
                entry["httpFields"] = json!({});
            }
            if !custom {
                entry["customFields"] = json!([]);
            }
            entry
        })
        .collect();
    let mut out = json!({"objects": objects, "truncated": listing.truncated, "delimitedPrefixes": listing.prefixes});
    if listing.truncated
        && let Some(cursor) = listing.cursor
    {
        out["cursor"] = json!(cursor);
    }
    Ok(metadata_reply(StatusCode::OK, &out, Body::empty(), 0))
}

#[cfg(test)]
mod tests {
    use super::reply::http_date_ms;
    use super::wire::parse_range_header;
    use super::*;
    use kura_r2::{ByteRange, EtagCondition};

    #[test]
    fn wire_requests_parse() {
        let get: BindingRequest = serde_json::from_str(
            r#"{"version":1,"method":"get","object":"k","range":{"offset":"6","length":"5"},"onlyIf":{"etagDoesNotMatch":[{"type":"wildcard"}],"uploadedAfter":"1445412480000","secondsGranularity":true}}"#,
        )
        .unwrap();
        let BindingRequest::Get { range, only_if, .. } = get else { panic!() };
        assert_eq!(byte_range(range, None).ok().flatten(), Some(ByteRange::From { start: 6, end: Some(10) }));
        let c = conditional(only_if);
        assert_eq!(c.if_none_match, Some(vec![EtagCondition::Any]));
        assert_eq!((c.if_modified_since_ms, c.seconds_granularity), (Some(1445412480000), true));
        let put: BindingRequest = serde_json::from_str(
            r#"{"version":1,"method":"put","object":"a/b.txt","customFields":[{"k":"k","v":"v"}],"httpFields":{"contentType":"text/plain","cacheExpiry":"1700000000000"},"md5":"XrY7u+Ae7tCTyyK7j1rNww==","storageClass":"Standard"}"#,
        )
        .unwrap();
        let BindingRequest::Put { http_fields, md5, .. } = put else { panic!() };
        let http = http_metadata(http_fields);
        assert_eq!(http.expires.as_deref(), Some("Tue, 14 Nov 2023 22:13:20 GMT"));
        // And back, as replies carry it.
        assert_eq!(http.expires.as_deref().and_then(http_date_ms), Some(1_700_000_000_000));
        assert!(expected_digests(md5, [None, None, None, None]).unwrap().md5.is_some());
        assert!(parse_request(br#"{"method":"nope"}"#).is_err());
    }

    #[test]
    fn range_headers() {
        assert_eq!(parse_range_header("bytes=0-1").ok().flatten(), Some(ByteRange::From { start: 0, end: Some(1) }));
        assert_eq!(parse_range_header("bytes=-3").ok().flatten(), Some(ByteRange::Suffix(3)));
        assert_eq!(parse_range_header("bytes=0-1,3-4").ok().flatten(), None);
        assert!(parse_range_header("pages=1").is_err());
        // An offset and a length whose sum passes 2^64 read to the end, as a length past the end does.
        let huge = wire::RangeJson { offset: Some(u64::MAX - 1), length: Some(u64::MAX), suffix: None };
        assert_eq!(
            wire::byte_range(Some(huge), None).ok().flatten(),
            Some(ByteRange::From { start: u64::MAX - 1, end: Some(u64::MAX) })
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(crate::fuzz_cases()))]

        /// Any `Range` header is a range, the whole object, or InvalidRange: never a panic.
        #[test]
        fn any_range_header_parses_or_is_refused(text in "(bytes=)?[0-9 ,-]{0,30}|.{0,40}") {
            if let Ok(Some(ByteRange::From { start, end: Some(end) })) = parse_range_header(&text) {
                proptest::prop_assert!(text.contains(&start.to_string()) && text.contains(&end.to_string()));
            }
        }

        /// Any bytes as a binding request: parsed or refused with the protocol's error.
        #[test]
        fn any_request_parses_or_is_refused(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = parse_request(&bytes);
        }

        /// Requests shaped like workerd's, with arbitrary field values, parse or are refused.
        #[test]
        fn shaped_requests_parse_or_are_refused(
            method in "(get|head|put|delete|list|createMultipartUpload|uploadPart|completeMultipartUpload|abortMultipartUpload|[a-z]{1,8})",
            object in ".{0,20}",
            offset in "(-?[0-9]{0,25}|\"[0-9a-z-]{0,25}\"|null|true|\\[\\])",
            length in "(-?[0-9]{0,25}|\"[0-9a-z-]{0,25}\"|null)",
        ) {
            let text = format!(
                r#"{{"version":1,"method":"{method}","object":{},"range":{{"offset":{offset},"length":{length}}},"partNumber":{offset},"parts":[{{"part":{length},"etag":"e"}}],"limit":{length}}}"#,
                serde_json::to_string(&object).unwrap(),
            );
            if let Ok(BindingRequest::Get { range, .. }) = parse_request(text.as_bytes()) {
                let _ = byte_range(range, None);
            }
        }
    }
}
