//! workerd's R2 binding protocol (workerd's `src/workerd/api/r2*.c++`), what a deployed Worker's
//! `env.BUCKET` sends: `GET /` with the request in `cf-r2-request` for head, get and list;
//! `PUT /` with `cf-r2-metadata-size` bytes of JSON before the payload for put, delete and
//! multipart. Replies carry their JSON first (`cf-r2-metadata-size`) and the object's bytes
//! after it; failures carry `cf-r2-error` with R2's v4 code, which workerd turns into the
//! exception (or the `null`) a Worker sees.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use futures_util::{StreamExt, TryStreamExt};
use serde::{Deserialize, Deserializer};
use serde_json::{Value as Json, json};

use kura_r2::{
    ByteRange, ChecksumAlgorithm, Conditional, EtagCondition, ExpectedDigests, GetOptions, HttpMetadata, ListOptions,
    ObjectInfo, PartOptions, PutOptions, R2Error,
};
use kura_workers::config::headers;

use crate::auth::{Caller, Need};
use crate::error::{self, ApiError};
use crate::state::AppState;

const REQUEST_HEADER: &str = "cf-r2-request";
const METADATA_SIZE_HEADER: &str = "cf-r2-metadata-size";

/// Largest request JSON accepted (workerd's own bound on replies).
const MAX_METADATA: usize = 1 << 20;

/// Objects up to this size are read whole and sent in one piece with their metadata.
const SMALL_OBJECT: u64 = 64 * 1024;

/// A failure as the binding carries it.
#[derive(Debug)]
struct BindingError {
    status: StatusCode,
    code: u32,
    message: String,
    /// For a failed `get` precondition: the object, which the Worker still receives.
    object: Option<Json>,
}

impl BindingError {
    fn new(status: StatusCode, code: u32, message: impl Into<String>) -> Self {
        BindingError { status, code, message: message.into(), object: None }
    }

    fn invalid(message: impl Into<String>) -> Self {
        BindingError::new(StatusCode::BAD_REQUEST, 10029, message)
    }
}

impl From<R2Error> for BindingError {
    fn from(e: R2Error) -> Self {
        let (status, code, message) = error::binding::r2_binding_failure(&e);
        BindingError::new(status, code, message)
    }
}

impl IntoResponse for BindingError {
    fn into_response(self) -> Response {
        let mut response = match self.object {
            Some(object) => metadata_reply(self.status, &object, Body::empty(), 0),
            None => self.status.into_response(),
        };
        error::binding::mark_r2_error(&mut response, self.code, &self.message);
        response
    }
}

/// A reply whose body is `metadata` (JSON) and then `rest`, `rest_len` bytes long: sent with
/// its length, not chunked.
fn metadata_reply(status: StatusCode, metadata: &Json, rest: Body, rest_len: u64) -> Response {
    let text = Bytes::from(metadata.to_string());
    let length = text.len();
    let body = if rest_len == 0 {
        Body::from(text)
    } else {
        let stream =
            futures_util::stream::once(async move { Ok::<_, axum::Error>(text) }).chain(rest.into_data_stream());
        Body::new(SizedBody { stream: Box::pin(stream), remaining: length as u64 + rest_len })
    };
    let mut response = (status, body).into_response();
    response.headers_mut().insert(METADATA_SIZE_HEADER, HeaderValue::from(length));
    response
}

/// A streamed body whose length is known, so it goes out with `Content-Length`.
struct SizedBody {
    stream: std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, axum::Error>> + Send>>,
    remaining: u64,
}

impl http_body::Body for SizedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        match self.stream.as_mut().poll_next(cx) {
            std::task::Poll::Ready(Some(Ok(chunk))) => {
                self.remaining = self.remaining.saturating_sub(chunk.len() as u64);
                std::task::Poll::Ready(Some(Ok(http_body::Frame::data(chunk))))
            }
            std::task::Poll::Ready(Some(Err(e))) => std::task::Poll::Ready(Some(Err(e))),
            std::task::Poll::Ready(None) => std::task::Poll::Ready(None),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.remaining)
    }
}

/// capnp's JSON writes 64-bit integers as strings; accept either.
fn u64_lenient<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Number(u64),
        Text(String),
    }
    match Option::<Either>::deserialize(d)? {
        None => Ok(None),
        Some(Either::Number(n)) => Ok(Some(n)),
        Some(Either::Text(t)) => t.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RangeJson {
    #[serde(default, deserialize_with = "u64_lenient")]
    offset: Option<u64>,
    #[serde(default, deserialize_with = "u64_lenient")]
    length: Option<u64>,
    #[serde(default, deserialize_with = "u64_lenient")]
    suffix: Option<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EtagJson {
    #[serde(default)]
    value: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct OnlyIfJson {
    #[serde(default)]
    etag_matches: Option<Vec<EtagJson>>,
    #[serde(default)]
    etag_does_not_match: Option<Vec<EtagJson>>,
    #[serde(default, deserialize_with = "u64_lenient")]
    uploaded_before: Option<u64>,
    #[serde(default, deserialize_with = "u64_lenient")]
    uploaded_after: Option<u64>,
    #[serde(default)]
    seconds_granularity: bool,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct HttpFieldsJson {
    content_type: Option<String>,
    content_language: Option<String>,
    content_disposition: Option<String>,
    content_encoding: Option<String>,
    cache_control: Option<String>,
    #[serde(default, deserialize_with = "u64_lenient")]
    cache_expiry: Option<u64>,
}

#[derive(Deserialize)]
struct FieldJson {
    k: String,
    v: String,
}

#[derive(Deserialize)]
struct PartJson {
    etag: String,
    part: u32,
}

#[derive(Deserialize)]
#[serde(tag = "method", rename_all = "camelCase")]
// One request per call: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
enum BindingRequest {
    Head {
        object: String,
    },
    #[serde(rename_all = "camelCase")]
    Get {
        object: String,
        #[serde(default)]
        range: Option<RangeJson>,
        #[serde(default)]
        range_header: Option<String>,
        #[serde(default)]
        only_if: Option<OnlyIfJson>,
    },
    #[serde(rename_all = "camelCase")]
    List {
        #[serde(default)]
        limit: Option<u32>,
        #[serde(default)]
        prefix: Option<String>,
        #[serde(default)]
        cursor: Option<String>,
        #[serde(default)]
        delimiter: Option<String>,
        #[serde(default)]
        start_after: Option<String>,
        #[serde(default)]
        include: Option<Vec<u32>>,
    },
    #[serde(rename_all = "camelCase")]
    Put {
        object: String,
        #[serde(default)]
        custom_fields: Vec<FieldJson>,
        #[serde(default)]
        http_fields: Option<HttpFieldsJson>,
        #[serde(default)]
        only_if: Option<OnlyIfJson>,
        #[serde(default)]
        md5: Option<String>,
        #[serde(default)]
        sha1: Option<String>,
        #[serde(default)]
        sha256: Option<String>,
        #[serde(default)]
        sha384: Option<String>,
        #[serde(default)]
        sha512: Option<String>,
        #[serde(default)]
        storage_class: Option<String>,
        #[serde(default)]
        ssec: Option<Json>,
    },
    Delete {
        #[serde(default)]
        object: Option<String>,
        #[serde(default)]
        objects: Option<Vec<String>>,
    },
    #[serde(rename_all = "camelCase")]
    CreateMultipartUpload {
        object: String,
        #[serde(default)]
        custom_fields: Vec<FieldJson>,
        #[serde(default)]
        http_fields: Option<HttpFieldsJson>,
        #[serde(default)]
        storage_class: Option<String>,
        #[serde(default)]
        ssec: Option<Json>,
    },
    #[serde(rename_all = "camelCase")]
    UploadPart {
        object: String,
        upload_id: String,
        part_number: u32,
        #[serde(default)]
        ssec: Option<Json>,
    },
    #[serde(rename_all = "camelCase")]
    CompleteMultipartUpload {
        object: String,
        upload_id: String,
        parts: Vec<PartJson>,
    },
    #[serde(rename_all = "camelCase")]
    AbortMultipartUpload {
        object: String,
        upload_id: String,
    },
}

fn parse_request(bytes: &[u8]) -> Result<BindingRequest, BindingError> {
    serde_json::from_slice(bytes).map_err(|e| {
        // Miniflare answers 500 (workerd never sends one); from outside clients it is their mistake.
        BindingError::new(StatusCode::BAD_REQUEST, 10001, format!("the binding request is malformed: {e}"))
    })
}

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

fn refuse_ssec(ssec: &Option<Json>) -> Result<(), BindingError> {
    match ssec {
        None => Ok(()),
        Some(_) => Err(BindingError::new(StatusCode::NOT_IMPLEMENTED, 10001, "kura does not support SSE-C keys")),
    }
}

fn expected_digests(md5: Option<String>, others: [Option<String>; 4]) -> Result<ExpectedDigests, BindingError> {
    let mut digests = ExpectedDigests::default();
    if let Some(md5) = md5 {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(md5.trim())
            .ok()
            .and_then(|b| <[u8; 16]>::try_from(b).ok())
            .ok_or_else(|| BindingError::invalid("the MD5 checksum is malformed"))?;
        digests.md5 = Some(bytes);
    }
    let algorithms =
        [ChecksumAlgorithm::Sha1, ChecksumAlgorithm::Sha256, ChecksumAlgorithm::Sha384, ChecksumAlgorithm::Sha512];
    for (algorithm, value) in algorithms.into_iter().zip(others) {
        if let Some(value) = value {
            let bytes = hex::decode(value.trim()).map_err(|_| {
                BindingError::invalid(format!("the {} checksum is malformed", algorithm.display_name()))
            })?;
            digests.checksums.push((algorithm, bytes));
        }
    }
    Ok(digests)
}

const HTTP_DATE: &str = "%a, %d %b %Y %H:%M:%S GMT";

fn http_metadata(fields: Option<HttpFieldsJson>) -> HttpMetadata {
    let fields = fields.unwrap_or_default();
    HttpMetadata {
        content_type: fields.content_type,
        content_language: fields.content_language,
        content_disposition: fields.content_disposition,
        content_encoding: fields.content_encoding,
        cache_control: fields.cache_control,
        expires: fields
            .cache_expiry
            .and_then(|ms| jiff::Timestamp::from_millisecond(ms as i64).ok())
            .map(|t| t.strftime(HTTP_DATE).to_string()),
    }
}

fn conditional(only_if: Option<OnlyIfJson>) -> Conditional {
    let Some(only_if) = only_if else { return Conditional::default() };
    let tags = |list: Option<Vec<EtagJson>>| {
        list.map(|list| {
            list.into_iter()
                .map(|e| match e.kind.as_str() {
                    "wildcard" => EtagCondition::Any,
                    kind => EtagCondition::Tag { value: e.value, weak: kind == "weak" },
                })
                .collect()
        })
    };
    Conditional {
        if_match: tags(only_if.etag_matches),
        if_none_match: tags(only_if.etag_does_not_match),
        if_modified_since_ms: only_if.uploaded_after.map(|ms| ms as i64),
        if_unmodified_since_ms: only_if.uploaded_before.map(|ms| ms as i64),
        seconds_granularity: only_if.seconds_granularity,
    }
}

/// The HeadResponse workerd builds an `R2Object` from (checksums in hex under `"0"`…`"4"`).
/// An HTTP date (`Expires`, as kept) in Unix milliseconds.
fn http_date_ms(text: &str) -> Option<i64> {
    jiff::fmt::rfc2822::DateTimeParser::new().parse_timestamp(text).ok().map(|t| t.as_millisecond())
}

fn head_json(info: &ObjectInfo, range: Option<(u64, u64)>, http: bool, custom: bool) -> Json {
    let mut out = json!({
        "name": info.key,
        "version": info.version,
        "size": info.size,
        "etag": info.etag,
        "uploaded": info.uploaded_ms,
        "storageClass": info.storage_class,
    });
    if http {
        let h = &info.http;
        let mut fields = serde_json::Map::new();
        for (name, value) in [
            ("contentType", &h.content_type),
            ("contentLanguage", &h.content_language),
            ("contentDisposition", &h.content_disposition),
            ("contentEncoding", &h.content_encoding),
            ("cacheControl", &h.cache_control),
        ] {
            if let Some(value) = value {
                fields.insert(name.into(), json!(value));
            }
        }
        if let Some(expiry) = h.expires.as_deref().and_then(http_date_ms) {
            fields.insert("cacheExpiry".into(), json!(expiry));
        }
        out["httpFields"] = Json::Object(fields);
    }
    if custom {
        out["customFields"] = info.custom.iter().map(|(k, v)| json!({"k": k, "v": v})).collect();
    }
    if let Some((offset, length)) = range {
        out["range"] = json!({"offset": offset, "length": length});
    }
    let mut checksums = serde_json::Map::new();
    for (index, name) in ["md5", "sha1", "sha256", "sha384", "sha512"].iter().enumerate() {
        let Some(value) = info.checksums.get(*name) else { continue };
        let hex = if *name == "md5" {
            value.clone()
        } else {
            match base64::engine::general_purpose::STANDARD.decode(value) {
                Ok(bytes) => hex::encode(bytes),
                Err(_) => continue,
            }
        };
        checksums.insert(index.to_string(), json!(hex));
    }
    out["checksums"] = Json::Object(checksums);
    out
}

async fn head(app: &AppState, bucket: &str, key: &str) -> Result<Response, BindingError> {
    let info = app.r2.head_object(bucket, key).await?.ok_or(R2Error::NoSuchKey)?;
    Ok(metadata_reply(StatusCode::OK, &head_json(&info, Some((0, info.size)), true, true), Body::empty(), 0))
}

/// A `Range` header's single range (several ranges read the whole object, as R2 does).
fn parse_range_header(text: &str) -> Result<Option<ByteRange>, BindingError> {
    let Some(spec) = text.trim().strip_prefix("bytes=") else {
        return Err(R2Error::InvalidRange.into());
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let (start, end) = spec.split_once('-').ok_or(R2Error::InvalidRange)?;
    let number = |t: &str| t.trim().parse::<u64>().map_err(|_| BindingError::from(R2Error::InvalidRange));
    Ok(Some(match (start.trim(), end.trim()) {
        ("", suffix) => ByteRange::Suffix(number(suffix)?),
        (start, "") => ByteRange::From { start: number(start)?, end: None },
        (start, end) => ByteRange::From { start: number(start)?, end: Some(number(end)?) },
    }))
}

fn byte_range(range: Option<RangeJson>, header: Option<String>) -> Result<Option<ByteRange>, BindingError> {
    if let Some(header) = header {
        return parse_range_header(&header);
    }
    let Some(range) = range else { return Ok(None) };
    Ok(match (range.offset, range.length, range.suffix) {
        (_, _, Some(suffix)) => Some(ByteRange::Suffix(suffix)),
        (_, Some(0), None) => return Err(R2Error::InvalidRange.into()),
        (offset, Some(length), None) => {
            let start = offset.unwrap_or(0);
            Some(ByteRange::From { start, end: Some(start + length - 1) })
        }
        (Some(offset), None, None) => Some(ByteRange::From { start: offset, end: None }),
        (None, None, None) => None,
    })
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
    use super::*;

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
