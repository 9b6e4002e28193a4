//! The S3 operations R2 implements, over the R2 engine: buckets, objects, listing, copies and
//! multipart uploads.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use base64::Engine as _;
use kura_catalog::{Catalog, R2Bucket};
use kura_r2::{
    ByteRange, ChecksumAlgorithm, Conditional, DeclaredChecksum, EtagCondition, ExpectedDigests, GetOptions,
    HttpMetadata, ListOptions, MetadataDirective, ObjectBody, ObjectInfo, PartOptions, PutOptions, R2, R2Error,
    TrailingChecksum,
};
use s3s::dto::*;
use s3s::{S3, S3Error, S3Request, S3Response, S3Result};

use super::access::Caller;
use super::url::uri_encode;
use crate::error::s3::{bucket_error, catalog_error, engine_error, error};

#[derive(Clone)]
pub(crate) struct KuraS3 {
    pub catalog: Arc<Catalog>,
    pub r2: Arc<R2>,
    /// In a cluster, reads copy sources from the nodes that own them.
    http: reqwest::Client,
}

fn caller<T>(req: &S3Request<T>) -> S3Result<&Caller> {
    req.extensions.get::<Caller>().ok_or_else(|| error(StatusCode::BAD_REQUEST, "InvalidArgument", "Authorization"))
}

fn timestamp(ms: i64) -> Timestamp {
    Timestamp::from(SystemTime::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
}

fn timestamp_ms(t: &Timestamp) -> i64 {
    let t: time::OffsetDateTime = t.clone().into();
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

fn http_date(t: &Timestamp) -> Option<String> {
    let mut out = Vec::new();
    t.format(TimestampFormat::HttpDate, &mut out).ok()?;
    String::from_utf8(out).ok()
}

fn parse_http_date(text: &str) -> Option<Timestamp> {
    Timestamp::parse(TimestampFormat::HttpDate, text).ok()
}

fn etag(info_etag: &str) -> ETag {
    ETag::Strong(info_etag.to_owned())
}

/// Conditionals from the raw headers (lists of ETags are allowed, unlike `s3s`'s single one).
pub(super) fn conditional(headers: &HeaderMap, prefix: &str) -> Conditional {
    let text = |name: &str| headers.get(format!("{prefix}{name}")).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let date = |name: &str| text(name).and_then(|t| parse_http_date(&t)).map(|t| timestamp_ms(&t));
    Conditional {
        if_match: text("if-match").map(|t| EtagCondition::parse_list(&t)),
        if_none_match: text("if-none-match").map(|t| EtagCondition::parse_list(&t)),
        if_modified_since_ms: date("if-modified-since"),
        if_unmodified_since_ms: date("if-unmodified-since"),
        seconds_granularity: true,
    }
}

fn decode_base64(value: &str, what: &str) -> S3Result<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .map_err(|_| error(StatusCode::BAD_REQUEST, "InvalidDigest", format!("The {what} you specified is not valid.")))
}

const CHECKSUM_HEADERS: [(&str, ChecksumAlgorithm); 5] = [
    ("x-amz-checksum-crc32", ChecksumAlgorithm::Crc32),
    ("x-amz-checksum-crc32c", ChecksumAlgorithm::Crc32c),
    ("x-amz-checksum-crc64nvme", ChecksumAlgorithm::Crc64Nvme),
    ("x-amz-checksum-sha1", ChecksumAlgorithm::Sha1),
    ("x-amz-checksum-sha256", ChecksumAlgorithm::Sha256),
];

/// Content-MD5, `x-amz-checksum-*` headers and a checksum trailer, as the engine checks them.
pub(super) fn digests(headers: &HeaderMap, trailers: Option<s3s::TrailingHeaders>) -> S3Result<ExpectedDigests> {
    let mut out = ExpectedDigests::default();
    if let Some(md5) = headers.get("content-md5").and_then(|v| v.to_str().ok()) {
        let bytes = decode_base64(md5, "checksum or Content-MD5")?;
        out.md5 = Some(bytes.try_into().map_err(|_| {
            error(StatusCode::BAD_REQUEST, "InvalidDigest", "The checksum or Content-MD5 you specified is not valid.")
        })?);
    }
    for (name, algorithm) in CHECKSUM_HEADERS {
        if let Some(value) = headers.get(name).and_then(|v| v.to_str().ok()) {
            out.checksums.push((algorithm, decode_base64(value, "checksum")?));
        }
    }
    let trailer = headers.get("x-amz-trailer").and_then(|v| v.to_str().ok()).map(str::to_ascii_lowercase);
    if let (Some(trailer), Some(trailers)) = (trailer, trailers)
        && let Some((name, algorithm)) = CHECKSUM_HEADERS.iter().find(|(n, _)| *n == trailer.trim())
    {
        let name = *name;
        out.trailing = Some(TrailingChecksum {
            algorithm: *algorithm,
            value: Arc::new(move || {
                trailers
                    .read(|h| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned))
                    .flatten()
                    .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v.trim()).ok())
            }),
        });
    }
    Ok(out)
}

pub(super) fn storage_class_in(class: Option<&str>) -> S3Result<Option<String>> {
    match class {
        None => Ok(None),
        Some("STANDARD") => Ok(Some("Standard".into())),
        Some("STANDARD_IA") => Ok(Some("InfrequentAccess".into())),
        Some(_) => {
            Err(error(StatusCode::BAD_REQUEST, "InvalidStorageClass", "The storage class specified is not valid."))
        }
    }
}

fn storage_class_out(class: &str) -> &'static str {
    if class == "InfrequentAccess" { "STANDARD_IA" } else { "STANDARD" }
}

/// Custom metadata as stored: values RFC 2047-decoded, as R2 stores them.
fn custom_metadata(metadata: Option<Metadata>) -> BTreeMap<String, String> {
    metadata.map(|m| m.into_iter().map(|(k, v)| (k, super::rfc2047::decode(&v))).collect()).unwrap_or_default()
}

/// Headers sent back on GET and HEAD.
struct ObjectHeaders {
    content_type: String,
    cache_control: Option<String>,
    content_disposition: Option<String>,
    content_encoding: Option<String>,
    content_language: Option<String>,
    expires: Option<Timestamp>,
    metadata: Option<Metadata>,
}

fn object_headers(info: &ObjectInfo) -> ObjectHeaders {
    ObjectHeaders {
        content_type: info.http.content_type.clone().unwrap_or_else(|| "application/octet-stream".into()),
        cache_control: info.http.cache_control.clone(),
        content_disposition: info.http.content_disposition.clone(),
        content_encoding: info.http.content_encoding.clone(),
        content_language: info.http.content_language.clone(),
        expires: info.http.expires.as_deref().and_then(parse_http_date),
        metadata: (!info.custom.is_empty())
            .then(|| info.custom.iter().map(|(k, v)| (k.clone(), super::rfc2047::encode(v))).collect()),
    }
}

fn checksum_out(info: &ObjectInfo, name: &str) -> Option<String> {
    info.checksums.get(name).cloned()
}

/// Whether a stored checksum is of the whole object or (with a `-N` suffix) of its parts'.
fn checksum_type_of(checksums: &BTreeMap<String, String>) -> Option<ChecksumType> {
    let value = checksums.iter().find(|(name, _)| *name != "md5")?.1;
    Some(ChecksumType::from_static(if value.contains('-') {
        ChecksumType::COMPOSITE
    } else {
        ChecksumType::FULL_OBJECT
    }))
}

/// A multipart upload's declared checksum (`x-amz-checksum-algorithm`, `x-amz-checksum-type`):
/// CRCs of the whole object (CRC-64/NVME's default) or checksums of the parts' checksums (the
/// others' default); a combination S3 does not offer is refused as S3 refuses it.
fn declared_checksum(
    algorithm: Option<&s3s::dto::ChecksumAlgorithm>,
    kind: Option<&ChecksumType>,
) -> S3Result<Option<DeclaredChecksum>> {
    let invalid = |message: String| error(StatusCode::BAD_REQUEST, "InvalidRequest", message);
    let Some(algorithm) = algorithm else {
        return match kind {
            Some(_) => Err(invalid(
                "The x-amz-checksum-type header can only be used with the x-amz-checksum-algorithm header.".into(),
            )),
            None => Ok(None),
        };
    };
    let Some(ours) = ChecksumAlgorithm::from_name(&algorithm.as_str().to_ascii_lowercase()) else {
        return Err(invalid("Checksum algorithm provided is unsupported.".into()));
    };
    let full_object = match kind.map(ChecksumType::as_str) {
        None => None,
        Some(ChecksumType::FULL_OBJECT) => Some(true),
        Some(ChecksumType::COMPOSITE) => Some(false),
        Some(other) => return Err(invalid(format!("Value for x-amz-checksum-type header is invalid: {other}."))),
    };
    match DeclaredChecksum::new(ours, full_object) {
        Some(declared) => Ok(Some(declared)),
        None => Err(invalid(format!(
            "The {} checksum type cannot be used with the {} checksum algorithm.",
            kind.map_or("", ChecksumType::as_str),
            algorithm.as_str().to_ascii_lowercase()
        ))),
    }
}

/// S3's name for the kind of a declared checksum.
fn checksum_type(declared: DeclaredChecksum) -> ChecksumType {
    ChecksumType::from_static(if declared.full_object { ChecksumType::FULL_OBJECT } else { ChecksumType::COMPOSITE })
}

/// The checksums a part or completed-part list names, as the engine takes them.
fn named_part_checksums(number: u32, part: &CompletedPart) -> Vec<(u32, ChecksumAlgorithm, String)> {
    [
        (ChecksumAlgorithm::Crc32, &part.checksum_crc32),
        (ChecksumAlgorithm::Crc32c, &part.checksum_crc32c),
        (ChecksumAlgorithm::Crc64Nvme, &part.checksum_crc64nvme),
        (ChecksumAlgorithm::Sha1, &part.checksum_sha1),
        (ChecksumAlgorithm::Sha256, &part.checksum_sha256),
    ]
    .into_iter()
    .filter_map(|(algorithm, value)| value.clone().map(|v| (number, algorithm, v)))
    .collect()
}

/// Reads send stored checksums only when asked (`x-amz-checksum-mode: ENABLED`) and only for the
/// whole object: a client checks them against the bytes it receives.
fn checksums_wanted(mode: Option<&ChecksumMode>, ranged: bool) -> bool {
    !ranged && mode.is_some_and(|m| m.as_str().eq_ignore_ascii_case("ENABLED"))
}

fn max_keys(requested: Option<i32>) -> S3Result<usize> {
    match requested {
        None => Ok(1000),
        Some(n) if n < 0 => {
            Err(error(StatusCode::BAD_REQUEST, "InvalidMaxKeys", "MaxKeys params must be positive integer <= 1000."))
        }
        Some(n) => Ok((n as usize).min(1000)),
    }
}

fn encoding(requested: Option<&EncodingType>) -> S3Result<bool> {
    match requested.map(|e| e.as_str()) {
        None => Ok(false),
        Some("url") => Ok(true),
        Some(other) => Err(error(
            StatusCode::NOT_IMPLEMENTED,
            "NotImplemented",
            format!("Unrecognized encoding-type \"{other}\" not implemented"),
        )),
    }
}

fn parse_copy_range(text: &str) -> S3Result<ByteRange> {
    let invalid =
        || error(StatusCode::BAD_REQUEST, "InvalidArgument", format!("Invalid x-amz-copy-source-range: {text}"));
    let spec = text.strip_prefix("bytes=").ok_or_else(invalid)?;
    let (a, b) = spec.split_once('-').ok_or_else(invalid)?;
    let start: u64 = a.parse().map_err(|_| invalid())?;
    let end: u64 = b.parse().map_err(|_| invalid())?;
    if end < start {
        return Err(error(StatusCode::BAD_REQUEST, "InvalidArgument", "x-amz-copy-source-range must be positive."));
    }
    Ok(ByteRange::From { start, end: Some(end) })
}

impl KuraS3 {
    pub(crate) fn new(catalog: Arc<Catalog>, r2: Arc<R2>) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(2))
            .tcp_nodelay(true)
            .build()
            .expect("an HTTP client builds");
        KuraS3 { catalog, r2, http }
    }

    /// A copy's source: read here when this node serves its bucket, else from the node that
    /// does (in a cluster).
    async fn read_source(
        &self,
        caller: &Caller,
        bucket: &R2Bucket,
        key: &str,
        options: GetOptions,
    ) -> S3Result<ObjectBody> {
        match self.r2.claim(&bucket.id).await {
            Ok(()) => self.r2.get_object(&bucket.id, key, options).await.map_err(engine_error),
            Err(kura_sqlite::PlacementError::Elsewhere { s3, .. }) => {
                super::remote::read(&self.http, &s3, &caller.0, &bucket.name, key, options).await.map_err(engine_error)
            }
            Err(e) => Err(engine_error(e.into())),
        }
    }

    pub(super) fn bucket(&self, caller: &Caller, name: &str) -> S3Result<R2Bucket> {
        if !caller.0.reaches(name) {
            return Err(error(StatusCode::FORBIDDEN, "AccessDenied", "Access Denied"));
        }
        self.catalog
            .r2_bucket(&caller.0.account_id, name)
            .map_err(catalog_error)?
            .ok_or_else(|| engine_error(R2Error::NoSuchBucket))
    }

    /// The caller's bucket `name`; with R2's `cf-create-bucket-if-missing: true`, created first
    /// when it does not exist (PutObject and CreateMultipartUpload).
    pub(super) async fn bucket_for_write(
        &self,
        caller: &Caller,
        name: &str,
        headers: &HeaderMap,
    ) -> S3Result<R2Bucket> {
        let create = headers
            .get("cf-create-bucket-if-missing")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        match self.bucket(caller, name) {
            Err(e) if create && e.code().as_str() == "NoSuchBucket" => {
                match crate::buckets::create(&self.catalog, &self.r2, &caller.0.account_id, name, None, None).await {
                    Ok(bucket) => Ok(bucket),
                    // Created meanwhile by another request: use it.
                    Err(crate::buckets::BucketError::Exists) => self.bucket(caller, name),
                    Err(e) => Err(bucket_error(e)),
                }
            }
            other => other,
        }
    }

    fn copy_source(&self, caller: &Caller, source: &CopySource) -> S3Result<(R2Bucket, String)> {
        match source {
            CopySource::Bucket { bucket, key, .. } => Ok((self.bucket(caller, bucket)?, key.to_string())),
            _ => Err(error(StatusCode::NOT_IMPLEMENTED, "NotImplemented", "Access point copy sources not implemented")),
        }
    }
}

/// What a GET or HEAD asks for beyond the key.
struct Read<'a> {
    range: Option<Range>,
    part_number: Option<i32>,
    checksum_mode: Option<&'a ChecksumMode>,
}

/// An object being read, with the headers GET and HEAD answer alike.
struct Served {
    body: kura_r2::ByteStream,
    length: u64,
    content_range: Option<String>,
    headers: ObjectHeaders,
    info: ObjectInfo,
    checksums: bool,
    /// Whether the request named a part (`partNumber`): only then is the part count sent.
    part_asked: bool,
}

impl Served {
    fn checksum(&self, name: &str) -> Option<String> {
        if self.checksums { checksum_out(&self.info, name) } else { None }
    }
}

/// An S3 output struct with the five `x-amz-checksum-*` fields S3 has taken from `$sum` (a
/// name such as `"sha256"` to its base64 value), the others as given.
macro_rules! with_checksums {
    ($output:ident { $($field:ident: $value:expr),* $(,)? }, $sum:expr) => {{
        let sum = $sum;
        // Some outputs have no other fields (ListParts' Part).
        #[allow(clippy::needless_update)]
        let output = $output {
            $($field: $value,)*
            checksum_crc32: sum("crc32"),
            checksum_crc32c: sum("crc32c"),
            checksum_crc64nvme: sum("crc64nvme"),
            checksum_sha1: sum("sha1"),
            checksum_sha256: sum("sha256"),
            ..Default::default()
        };
        output
    }};
}

/// GetObjectOutput and HeadObjectOutput carry the same object headers.
macro_rules! object_output {
    ($output:ident, $served:ident) => {
        with_checksums!(
            $output {
                accept_ranges: Some("bytes".into()),
                content_length: Some($served.length as i64),
                content_range: $served.content_range.clone(),
                content_type: Some($served.headers.content_type.clone()),
                cache_control: $served.headers.cache_control.clone(),
                content_disposition: $served.headers.content_disposition.clone(),
                content_encoding: $served.headers.content_encoding.clone(),
                content_language: $served.headers.content_language.clone(),
                expires: $served.headers.expires.clone(),
                metadata: $served.headers.metadata.clone(),
                e_tag: Some(etag(&$served.info.etag)),
                last_modified: Some(timestamp($served.info.uploaded_ms)),
                // As S3 and R2 send them: the class only when it is not the standard one, the part
                // count only to a request that named a part.
                storage_class: (storage_class_out(&$served.info.storage_class) != "STANDARD")
                    .then(|| StorageClass::from(storage_class_out(&$served.info.storage_class).to_owned())),
                parts_count: $served.info.parts.filter(|_| $served.part_asked).map(|n| n as i32),
                checksum_type: if $served.checksums { checksum_type_of(&$served.info.checksums) } else { None },
            },
            |name| $served.checksum(name)
        )
    };
}

/// What the three listings (V1, V2, versions) ask for.
struct ListRequest<'a> {
    bucket: &'a str,
    encoding_type: Option<&'a EncodingType>,
    max_keys: Option<i32>,
    options: ListOptions,
}

/// One page, and whether its names go out URL-encoded.
struct Listed {
    bucket: R2Bucket,
    listing: kura_r2::Listing,
    url: bool,
}

impl Listed {
    fn encode(&self, text: String) -> String {
        if self.url { uri_encode(&text) } else { text }
    }

    /// The V1 marker (and versions' key marker) of the next page: the greater of the last key
    /// and the last common prefix, when the page was truncated.
    fn next_marker(&self) -> Option<String> {
        if !self.listing.truncated {
            return None;
        }
        let last_key = self.listing.objects.last().map(|o| o.key.clone());
        last_key.into_iter().chain(self.listing.prefixes.last().cloned()).max().map(|m| self.encode(m))
    }

    fn common_prefixes(&self) -> Option<CommonPrefixList> {
        Some(self.listing.prefixes.iter().map(|p| CommonPrefix { prefix: Some(self.encode(p.clone())) }).collect())
    }
}

impl KuraS3 {
    /// One page of a listing, after the caller's reach, `encoding-type` and `max-keys` checks.
    async fn list_page(&self, caller: &Caller, mut request: ListRequest<'_>) -> S3Result<Listed> {
        let bucket = self.bucket(caller, request.bucket)?;
        let url = encoding(request.encoding_type)?;
        request.options.limit = max_keys(request.max_keys)?;
        let listing = self.r2.list(&bucket.id, request.options).await.map_err(engine_error)?;
        Ok(Listed { bucket, listing, url })
    }

    /// A 304, with the validators and caching headers of the object as it is now (RFC 9110
    /// 15.4.5), as R2 sends them.
    async fn not_modified(&self, bucket: &R2Bucket, key: &str) -> S3Error {
        let mut refusal = engine_error(R2Error::NotModified);
        if let Ok(Some(info)) = self.r2.head_object(&bucket.id, key).await {
            let mut headers = HeaderMap::new();
            let mut set = |name: header::HeaderName, value: Option<String>| {
                if let Some(value) = value.and_then(|v| HeaderValue::from_str(&v).ok()) {
                    headers.insert(name, value);
                }
            };
            set(header::ETAG, Some(format!("\"{}\"", info.etag)));
            set(header::LAST_MODIFIED, http_date(&timestamp(info.uploaded_ms)));
            set(header::ACCEPT_RANGES, Some("bytes".into()));
            set(header::CACHE_CONTROL, info.http.cache_control.clone());
            set(header::EXPIRES, info.http.expires.clone());
            refusal.set_headers(headers);
        }
        refusal
    }

    /// Reads an object for GET or HEAD: preconditions, a range or a part, and its headers.
    async fn read(
        &self,
        caller: &Caller,
        bucket: &str,
        key: &str,
        headers: &HeaderMap,
        read: Read<'_>,
    ) -> S3Result<(Served, Option<StatusCode>)> {
        let bucket = self.bucket(caller, bucket)?;
        let range = read.range.map(|r| match r {
            Range::Int { first, last } => ByteRange::From { start: first, end: last },
            Range::Suffix { length } => ByteRange::Suffix(length),
        });
        let options = GetOptions {
            range,
            conditional: conditional(headers, ""),
            part_number: read.part_number.map(|n| n.max(0) as u32),
        };
        let object = match self.r2.get_object(&bucket.id, key, options).await {
            Ok(object) => object,
            Err(R2Error::NotModified) => return Err(self.not_modified(&bucket, key).await),
            Err(e) => return Err(engine_error(e)),
        };
        let content_range = object
            .range
            .map(|(offset, length)| format!("bytes {}-{}/{}", offset, offset + length - 1, object.info.size));
        let status = object.range.is_some().then_some(StatusCode::PARTIAL_CONTENT);
        let served = Served {
            length: object.length(),
            content_range,
            headers: object_headers(&object.info),
            checksums: checksums_wanted(read.checksum_mode, object.range.is_some()),
            part_asked: read.part_number.is_some(),
            info: object.info,
            body: object.body,
        };
        Ok((served, status))
    }
}

#[async_trait::async_trait]
impl S3 for KuraS3 {
    async fn list_buckets(&self, req: S3Request<ListBucketsInput>) -> S3Result<S3Response<ListBucketsOutput>> {
        let caller = caller(&req)?;
        let buckets = self.catalog.list_r2_buckets(&caller.0.account_id).map_err(catalog_error)?;
        let prefix = req.input.prefix.clone().unwrap_or_default();
        // Pages as AWS pages them: `max-buckets` (1 to 1,000; all when absent) and a
        // continuation token, which is the last name of the previous page.
        let after = req.input.continuation_token.clone().filter(|t| !t.is_empty());
        let max = match req.input.max_buckets {
            None => usize::MAX,
            Some(n) if (1..=1000).contains(&n) => n as usize,
            Some(_) => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    "InvalidArgument",
                    "max-buckets must be between 1 and 1000",
                ));
            }
        };
        let mut buckets: Vec<R2Bucket> = buckets
            .into_iter()
            .filter(|b| caller.0.reaches(&b.name) && b.name.starts_with(&prefix))
            .filter(|b| after.as_ref().is_none_or(|a| b.name.as_str() > a.as_str()))
            .collect();
        let next = (buckets.len() > max).then(|| buckets[max - 1].name.clone());
        buckets.truncate(max);
        let buckets = buckets
            .into_iter()
            .map(|b| Bucket {
                name: Some(b.name),
                creation_date: b.created_at.parse::<jiff::Timestamp>().ok().map(|t| timestamp(t.as_millisecond())),
                bucket_region: Some("auto".into()),
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            owner: Some(owner(caller)),
            prefix: req.input.prefix,
            continuation_token: next,
        }))
    }

    async fn create_bucket(&self, req: S3Request<CreateBucketInput>) -> S3Result<S3Response<CreateBucketOutput>> {
        let caller = caller(&req)?;
        let name = &req.input.bucket;
        let location = req
            .input
            .create_bucket_configuration
            .as_ref()
            .and_then(|c| c.location_constraint.as_ref())
            .map(|l| l.as_str().to_ascii_lowercase())
            .filter(|l| !matches!(l.as_str(), "" | "auto" | "us-east-1"));
        crate::buckets::create(&self.catalog, &self.r2, &caller.0.account_id, name, location.as_deref(), None)
            .await
            .map_err(bucket_error)?;
        Ok(S3Response::new(CreateBucketOutput { location: Some(format!("/{name}")) }))
    }

    async fn delete_bucket(&self, req: S3Request<DeleteBucketInput>) -> S3Result<S3Response<DeleteBucketOutput>> {
        let caller = caller(&req)?;
        let bucket = self.bucket(caller, &req.input.bucket)?;
        crate::buckets::delete(&self.catalog, &self.r2, &caller.0.account_id, &bucket.name)
            .await
            .map_err(bucket_error)?;
        Ok(S3Response::new(DeleteBucketOutput {}))
    }

    async fn head_bucket(&self, req: S3Request<HeadBucketInput>) -> S3Result<S3Response<HeadBucketOutput>> {
        let caller = caller(&req)?;
        self.bucket(caller, &req.input.bucket)?;
        Ok(S3Response::new(HeadBucketOutput { bucket_region: Some("auto".into()), ..Default::default() }))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        let caller = caller(&req)?;
        let bucket = self.bucket(caller, &req.input.bucket)?;
        let location = bucket.location.map(|l| l.to_ascii_uppercase()).unwrap_or_else(|| "auto".into());
        Ok(S3Response::new(GetBucketLocationOutput {
            location_constraint: Some(BucketLocationConstraint::from(location)),
        }))
    }

    async fn get_bucket_encryption(
        &self,
        req: S3Request<GetBucketEncryptionInput>,
    ) -> S3Result<S3Response<GetBucketEncryptionOutput>> {
        // R2 encrypts everything at rest and says so; kura answers the same for compatibility
        // (its data directory is as encrypted as the disk under it).
        self.bucket(caller(&req)?, &req.input.bucket)?;
        let rule = ServerSideEncryptionRule {
            apply_server_side_encryption_by_default: Some(ServerSideEncryptionByDefault {
                sse_algorithm: ServerSideEncryption::from_static(ServerSideEncryption::AES256),
                kms_master_key_id: None,
            }),
            bucket_key_enabled: Some(true),
        };
        Ok(S3Response::new(GetBucketEncryptionOutput {
            server_side_encryption_configuration: Some(ServerSideEncryptionConfiguration { rules: vec![rule] }),
        }))
    }

    async fn get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        self.bucket(caller(&req)?, &req.input.bucket)?;
        Ok(S3Response::new(GetBucketVersioningOutput::default()))
    }

    async fn get_bucket_tagging(
        &self,
        req: S3Request<GetBucketTaggingInput>,
    ) -> S3Result<S3Response<GetBucketTaggingOutput>> {
        self.bucket(caller(&req)?, &req.input.bucket)?;
        Err(error(StatusCode::NOT_FOUND, "NoSuchTagSet", "The TagSet does not exist."))
    }

    async fn get_object_lock_configuration(
        &self,
        req: S3Request<GetObjectLockConfigurationInput>,
    ) -> S3Result<S3Response<GetObjectLockConfigurationOutput>> {
        self.bucket(caller(&req)?, &req.input.bucket)?;
        Err(error(
            StatusCode::NOT_FOUND,
            "ObjectLockConfigurationNotFoundError",
            "Object Lock configuration does not exist for this bucket.",
        ))
    }

    async fn get_bucket_replication(
        &self,
        req: S3Request<GetBucketReplicationInput>,
    ) -> S3Result<S3Response<GetBucketReplicationOutput>> {
        self.bucket(caller(&req)?, &req.input.bucket)?;
        Err(error(
            StatusCode::NOT_FOUND,
            "ReplicationConfigurationNotFoundError",
            "The replication configuration was not found.",
        ))
    }

    async fn get_bucket_cors(&self, req: S3Request<GetBucketCorsInput>) -> S3Result<S3Response<GetBucketCorsOutput>> {
        // Setting CORS rules is not served yet, so no bucket has any.
        self.bucket(caller(&req)?, &req.input.bucket)?;
        Err(error(StatusCode::NOT_FOUND, "NoSuchCORSConfiguration", "The CORS configuration does not exist"))
    }

    async fn get_bucket_lifecycle_configuration(
        &self,
        req: S3Request<GetBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<GetBucketLifecycleConfigurationOutput>> {
        // Setting lifecycle rules is not served yet, so no bucket has any.
        self.bucket(caller(&req)?, &req.input.bucket)?;
        Err(error(StatusCode::NOT_FOUND, "NoSuchLifecycleConfiguration", "The lifecycle configuration does not exist."))
    }

    async fn put_object(&self, req: S3Request<PutObjectInput>) -> S3Result<S3Response<PutObjectOutput>> {
        let caller = caller(&req)?;
        let bucket = self.bucket_for_write(caller, &req.input.bucket, &req.headers).await?;
        let digests = digests(&req.headers, req.trailing_headers.clone())?;
        let conditional = conditional(&req.headers, "");
        let input = req.input;
        let options = PutOptions {
            http: HttpMetadata {
                content_type: input.content_type.clone(),
                content_language: input.content_language.clone(),
                content_disposition: input.content_disposition.clone(),
                content_encoding: input.content_encoding.clone().filter(|e| e != "aws-chunked"),
                cache_control: input.cache_control.clone(),
                expires: input.expires.as_ref().and_then(http_date),
            },
            custom: custom_metadata(input.metadata),
            storage_class: storage_class_in(input.storage_class.as_ref().map(|s| s.as_str()))?,
            conditional,
            digests,
            size: input.content_length.map(|n| n as u64),
        };
        let body = input.body.unwrap_or_else(|| {
            StreamingBlob::wrap(futures_util::stream::empty::<Result<bytes::Bytes, std::io::Error>>())
        });
        let info = self.r2.put_object(&bucket.id, &input.key, body, options).await.map_err(engine_error)?;
        Ok(S3Response::new(with_checksums!(PutObjectOutput { e_tag: Some(etag(&info.etag)) }, |name| checksum_out(
            &info, name
        ))))
    }

    async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let caller = caller(&req)?;
        let input = &req.input;
        let read =
            Read { range: input.range, part_number: input.part_number, checksum_mode: input.checksum_mode.as_ref() };
        let (object, status) = self.read(caller, &input.bucket, &input.key, &req.headers, read).await?;
        let mut output = object_output!(GetObjectOutput, object);
        output.body = Some(StreamingBlob::wrap(object.body));
        let mut response = S3Response::new(output);
        response.status = status;
        Ok(response)
    }

    async fn head_object(&self, req: S3Request<HeadObjectInput>) -> S3Result<S3Response<HeadObjectOutput>> {
        let caller = caller(&req)?;
        let input = &req.input;
        let read =
            Read { range: input.range, part_number: input.part_number, checksum_mode: input.checksum_mode.as_ref() };
        // A read whose body is dropped unread: the same checks, ranges and headers as GET.
        let (object, status) = self.read(caller, &input.bucket, &input.key, &req.headers, read).await?;
        let mut response = S3Response::new(object_output!(HeadObjectOutput, object));
        response.status = status;
        Ok(response)
    }

    async fn delete_object(&self, req: S3Request<DeleteObjectInput>) -> S3Result<S3Response<DeleteObjectOutput>> {
        let caller = caller(&req)?;
        let bucket = self.bucket(caller, &req.input.bucket)?;
        self.r2.delete_object(&bucket.id, &req.input.key).await.map_err(engine_error)?;
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    async fn delete_objects(&self, req: S3Request<DeleteObjectsInput>) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let caller = caller(&req)?;
        let bucket = self.bucket(caller, &req.input.bucket)?;
        let objects = &req.input.delete.objects;
        if objects.is_empty() || objects.len() > 1000 {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "MalformedXML",
                "The XML you provided was not well formed or did not validate against our published schema.",
            ));
        }
        // R2 keeps one version of each key, listed as version "null"; naming that one (as
        // version-aware tools do) is the same as naming none.
        let (current, versioned): (Vec<&ObjectIdentifier>, Vec<&ObjectIdentifier>) =
            objects.iter().partition(|o| o.version_id.as_deref().is_none_or(|v| v == "null"));
        let keys: Vec<String> = current.iter().map(|o| o.key.clone()).collect();
        self.r2.delete_objects(&bucket.id, keys.clone()).await.map_err(engine_error)?;
        let deleted = current
            .iter()
            .map(|o| DeletedObject { key: Some(o.key.clone()), version_id: o.version_id.clone(), ..Default::default() })
            .collect();
        let errors: Vec<Error> = versioned
            .iter()
            .map(|o| Error {
                code: Some("NoSuchVersion".into()),
                key: Some(o.key.clone()),
                message: Some("The specified version does not exist.".into()),
                version_id: o.version_id.clone(),
            })
            .collect();
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: (!errors.is_empty()).then_some(errors),
            ..Default::default()
        }))
    }

    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let caller = caller(&req)?;
        let input = &req.input;
        let listed = self
            .list_page(
                caller,
                ListRequest {
                    bucket: &input.bucket,
                    encoding_type: input.encoding_type.as_ref(),
                    max_keys: input.max_keys,
                    options: ListOptions {
                        prefix: input.prefix.clone().unwrap_or_default(),
                        delimiter: input.delimiter.clone(),
                        start_after: input.key_marker.clone().filter(|m| !m.is_empty()),
                        ..Default::default()
                    },
                },
            )
            .await?;
        let next_key_marker = listed.next_marker();
        let versions = listed
            .listing
            .objects
            .iter()
            .map(|o| ObjectVersion {
                key: Some(listed.encode(o.key.clone())),
                version_id: Some("null".into()),
                is_latest: Some(true),
                e_tag: Some(etag(&o.etag)),
                size: Some(o.size as i64),
                last_modified: Some(timestamp(o.uploaded_ms)),
                storage_class: Some(ObjectVersionStorageClass::from(storage_class_out(&o.storage_class).to_owned())),
                ..Default::default()
            })
            .collect();
        let input = req.input;
        Ok(S3Response::new(ListObjectVersionsOutput {
            prefix: Some(listed.encode(input.prefix.unwrap_or_default())),
            delimiter: input.delimiter.filter(|d| !d.is_empty()).map(|d| listed.encode(d)),
            key_marker: input.key_marker.map(|m| listed.encode(m)),
            version_id_marker: input.version_id_marker,
            next_version_id_marker: next_key_marker.as_ref().map(|_| "null".to_owned()),
            next_key_marker,
            max_keys: Some(input.max_keys.unwrap_or(1000)),
            is_truncated: Some(listed.listing.truncated),
            versions: Some(versions),
            common_prefixes: listed.common_prefixes(),
            encoding_type: input.encoding_type,
            name: Some(listed.bucket.name),
            ..Default::default()
        }))
    }

    async fn list_objects_v2(&self, req: S3Request<ListObjectsV2Input>) -> S3Result<S3Response<ListObjectsV2Output>> {
        let caller = caller(&req)?;
        let input = &req.input;
        let listed = self
            .list_page(
                caller,
                ListRequest {
                    bucket: &input.bucket,
                    encoding_type: input.encoding_type.as_ref(),
                    max_keys: input.max_keys,
                    options: ListOptions {
                        prefix: input.prefix.clone().unwrap_or_default(),
                        delimiter: input.delimiter.clone(),
                        start_after: input.start_after.clone(),
                        cursor: input.continuation_token.clone().filter(|t| !t.is_empty()),
                        ..Default::default()
                    },
                },
            )
            .await?;
        let key_count = (listed.listing.objects.len() + listed.listing.prefixes.len()) as i32;
        let fetch_owner = input.fetch_owner == Some(true);
        let contents = listed
            .listing
            .objects
            .iter()
            .map(|o| {
                let mut entry = list_entry(o.clone(), listed.url);
                if fetch_owner {
                    entry.owner = Some(owner(caller));
                }
                entry
            })
            .collect();
        let input = req.input;
        Ok(S3Response::new(ListObjectsV2Output {
            prefix: Some(listed.encode(input.prefix.unwrap_or_default())),
            delimiter: input.delimiter.filter(|d| !d.is_empty()).map(|d| listed.encode(d)),
            start_after: input.start_after.map(|a| listed.encode(a)),
            continuation_token: input.continuation_token,
            // A page of no keys has nothing to continue from (R2 sends no token there).
            next_continuation_token: listed.listing.cursor.clone().filter(|_| input.max_keys != Some(0)),
            max_keys: Some(input.max_keys.unwrap_or(1000)),
            key_count: Some(key_count),
            is_truncated: Some(listed.listing.truncated),
            contents: Some(contents),
            common_prefixes: listed.common_prefixes(),
            encoding_type: input.encoding_type,
            name: Some(listed.bucket.name),
            ..Default::default()
        }))
    }

    async fn list_objects(&self, req: S3Request<ListObjectsInput>) -> S3Result<S3Response<ListObjectsOutput>> {
        let caller = caller(&req)?;
        let input = &req.input;
        let listed = self
            .list_page(
                caller,
                ListRequest {
                    bucket: &input.bucket,
                    encoding_type: input.encoding_type.as_ref(),
                    max_keys: input.max_keys,
                    options: ListOptions {
                        prefix: input.prefix.clone().unwrap_or_default(),
                        delimiter: input.delimiter.clone(),
                        start_after: input.marker.clone().filter(|m| !m.is_empty()),
                        ..Default::default()
                    },
                },
            )
            .await?;
        let next_marker = listed.next_marker();
        let contents = listed.listing.objects.iter().map(|o| list_entry(o.clone(), listed.url)).collect();
        let input = req.input;
        Ok(S3Response::new(ListObjectsOutput {
            // botocore decodes V1's Marker, NextMarker, Delimiter and keys, not its Prefix: left as sent.
            prefix: Some(input.prefix.unwrap_or_default()),
            delimiter: input.delimiter.filter(|d| !d.is_empty()).map(|d| listed.encode(d)),
            marker: Some(listed.encode(input.marker.unwrap_or_default())),
            next_marker,
            max_keys: Some(input.max_keys.unwrap_or(1000)),
            is_truncated: Some(listed.listing.truncated),
            contents: Some(contents),
            common_prefixes: listed.common_prefixes(),
            encoding_type: input.encoding_type,
            name: Some(listed.bucket.name),
            ..Default::default()
        }))
    }

    async fn copy_object(&self, req: S3Request<CopyObjectInput>) -> S3Result<S3Response<CopyObjectOutput>> {
        let caller = &caller(&req)?.clone();
        let bucket = self.bucket(caller, &req.input.bucket)?;
        let (source_bucket, source_key) = self.copy_source(caller, &req.input.copy_source)?;
        let source_conditional = conditional(&req.headers, "x-amz-copy-source-");
        let destination_conditional = conditional(&req.headers, "cf-copy-destination-");
        let input = req.input;
        let directive = match input.metadata_directive.as_ref().map(|d| d.as_str()) {
            None | Some("COPY") => MetadataDirective::Copy,
            Some("REPLACE") => MetadataDirective::Replace {
                http: HttpMetadata {
                    content_type: input.content_type.clone(),
                    content_language: input.content_language.clone(),
                    content_disposition: input.content_disposition.clone(),
                    content_encoding: input.content_encoding.clone(),
                    cache_control: input.cache_control.clone(),
                    expires: input.expires.as_ref().and_then(http_date),
                },
                custom: custom_metadata(input.metadata.clone()),
            },
            Some(other) => {
                return Err(error(StatusCode::BAD_REQUEST, "InvalidArgument", format!("metadata directive {other}.")));
            }
        };
        let options = PutOptions {
            storage_class: storage_class_in(input.storage_class.as_ref().map(|s| s.as_str()))?,
            conditional: destination_conditional,
            ..Default::default()
        };
        let source = self
            .read_source(
                caller,
                &source_bucket,
                &source_key,
                GetOptions { conditional: source_conditional, ..Default::default() },
            )
            .await?;
        let info = self.r2.copy_from(source, &bucket.id, &input.key, directive, options).await.map_err(engine_error)?;
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(etag(&info.etag)),
                last_modified: Some(timestamp(info.uploaded_ms)),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let caller = caller(&req)?;
        let bucket = self.bucket_for_write(caller, &req.input.bucket, &req.headers).await?;
        let input = req.input;
        let http = HttpMetadata {
            content_type: input.content_type.clone(),
            content_language: input.content_language.clone(),
            content_disposition: input.content_disposition.clone(),
            content_encoding: input.content_encoding.clone(),
            cache_control: input.cache_control.clone(),
            expires: input.expires.as_ref().and_then(http_date),
        };
        let class = storage_class_in(input.storage_class.as_ref().map(|s| s.as_str()))?;
        let checksum = declared_checksum(input.checksum_algorithm.as_ref(), input.checksum_type.as_ref())?;
        let upload_id = self
            .r2
            .create_multipart_upload(
                &bucket.id,
                &input.key,
                http,
                custom_metadata(input.metadata),
                class.as_deref(),
                checksum,
            )
            .await
            .map_err(engine_error)?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(bucket.name),
            key: Some(input.key),
            upload_id: Some(upload_id),
            checksum_algorithm: input.checksum_algorithm,
            checksum_type: checksum.map(checksum_type),
            ..Default::default()
        }))
    }

    async fn upload_part(&self, req: S3Request<UploadPartInput>) -> S3Result<S3Response<UploadPartOutput>> {
        let caller = caller(&req)?;
        let bucket = self.bucket(caller, &req.input.bucket)?;
        let digests = digests(&req.headers, req.trailing_headers.clone())?;
        let input = req.input;
        let number = u32::try_from(input.part_number).unwrap_or(0);
        let body = input.body.unwrap_or_else(|| {
            StreamingBlob::wrap(futures_util::stream::empty::<Result<bytes::Bytes, std::io::Error>>())
        });
        let part = self
            .r2
            .upload_part(
                &bucket.id,
                &input.key,
                &input.upload_id,
                number,
                body,
                PartOptions { size: input.content_length.map(|n| n as u64), digests },
            )
            .await
            .map_err(engine_error)?;
        Ok(S3Response::new(with_checksums!(UploadPartOutput { e_tag: Some(etag(&part.etag)) }, |name: &str| part
            .checksums
            .get(name)
            .cloned())))
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let caller = &caller(&req)?.clone();
        let bucket = self.bucket(caller, &req.input.bucket)?;
        let (source_bucket, source_key) = self.copy_source(caller, &req.input.copy_source)?;
        let input = req.input;
        let range = input.copy_source_range.as_deref().map(parse_copy_range).transpose()?;
        let source =
            self.read_source(caller, &source_bucket, &source_key, GetOptions { range, ..Default::default() }).await?;
        let size = source.length();
        let number = u32::try_from(input.part_number).unwrap_or(0);
        let part = self
            .r2
            .upload_part(
                &bucket.id,
                &input.key,
                &input.upload_id,
                number,
                source.body,
                PartOptions { size: Some(size), ..Default::default() },
            )
            .await
            .map_err(engine_error)?;
        Ok(S3Response::new(UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(etag(&part.etag)),
                last_modified: Some(timestamp(part.uploaded_ms)),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let caller = caller(&req)?;
        let bucket = self.bucket(caller, &req.input.bucket)?;
        let host = req.headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or("localhost").to_owned();
        let conditional = conditional(&req.headers, "");
        let input = req.input;
        let malformed = || {
            error(
                StatusCode::BAD_REQUEST,
                "MalformedXML",
                "The XML you provided was not well formed or did not validate against our published schema.",
            )
        };
        let parts = input.multipart_upload.and_then(|m| m.parts).unwrap_or_default();
        if parts.is_empty() {
            return Err(malformed());
        }
        let mut requested = Vec::with_capacity(parts.len());
        let mut part_checksums = Vec::new();
        for part in parts {
            let (Some(number), Some(tag)) = (part.part_number, part.e_tag.as_ref()) else { return Err(malformed()) };
            if !(1..=10_000).contains(&number) {
                return Err(engine_error(R2Error::InvalidPart));
            }
            requested.push((number as u32, tag.value().to_owned()));
            part_checksums.extend(named_part_checksums(number as u32, &part));
        }
        let info = self
            .r2
            .complete_multipart_upload(
                &bucket.id,
                &input.key,
                &input.upload_id,
                requested,
                kura_r2::CompleteOptions { conditional, part_checksums },
            )
            .await
            .map_err(engine_error)?;
        Ok(S3Response::new(with_checksums!(
            CompleteMultipartUploadOutput {
                bucket: Some(bucket.name.clone()),
                key: Some(input.key.clone()),
                e_tag: Some(etag(&info.etag)),
                location: Some(format!("http://{host}/{}/{}", bucket.name, uri_encode(&input.key).replace("%2F", "/"))),
                checksum_type: checksum_type_of(&info.checksums),
            },
            |name| checksum_out(&info, name)
        )))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let caller = caller(&req)?;
        let bucket = self.bucket(caller, &req.input.bucket)?;
        self.r2.abort_multipart_upload(&bucket.id, &req.input.key, &req.input.upload_id).await.map_err(engine_error)?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    async fn list_parts(&self, req: S3Request<ListPartsInput>) -> S3Result<S3Response<ListPartsOutput>> {
        let caller = caller(&req)?;
        let bucket = self.bucket(caller, &req.input.bucket)?;
        let input = req.input;
        let marker = input.part_number_marker.map_or(0, |m| m.max(0) as u32);
        let max = input.max_parts.map_or(1000, |m| m.clamp(0, 1000) as usize);
        let listing =
            self.r2.list_parts(&bucket.id, &input.key, &input.upload_id, marker, max).await.map_err(engine_error)?;
        let next = listing.parts.last().map(|p| p.number as i32);
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(bucket.name),
            key: Some(listing.key),
            upload_id: Some(input.upload_id),
            part_number_marker: Some(marker as i32),
            next_part_number_marker: if listing.truncated { next } else { None },
            max_parts: Some(max as i32),
            is_truncated: Some(listing.truncated),
            storage_class: Some(StorageClass::from(storage_class_out(&listing.storage_class).to_owned())),
            parts: Some(
                listing
                    .parts
                    .into_iter()
                    .map(|p| {
                        with_checksums!(
                            Part {
                                part_number: Some(p.number as i32),
                                e_tag: Some(etag(&p.etag)),
                                size: Some(p.size as i64),
                                last_modified: Some(timestamp(p.uploaded_ms)),
                            },
                            |name: &str| p.checksums.get(name).cloned()
                        )
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let caller = caller(&req)?;
        let bucket = self.bucket(caller, &req.input.bucket)?;
        let input = req.input;
        let max = input.max_uploads.map_or(1000, |m| m.clamp(0, 1000) as usize);
        let (uploads, truncated) = self
            .r2
            .list_multipart_uploads(
                &bucket.id,
                input.prefix.as_deref().unwrap_or(""),
                input.key_marker.clone(),
                input.upload_id_marker.clone(),
                max,
            )
            .await
            .map_err(engine_error)?;
        let last = uploads.last().map(|u| (u.key.clone(), u.upload_id.clone()));
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(bucket.name),
            prefix: input.prefix,
            key_marker: input.key_marker,
            upload_id_marker: input.upload_id_marker,
            next_key_marker: last.as_ref().filter(|_| truncated).map(|l| l.0.clone()),
            next_upload_id_marker: last.filter(|_| truncated).map(|l| l.1),
            max_uploads: Some(max as i32),
            is_truncated: Some(truncated),
            uploads: Some(
                uploads
                    .into_iter()
                    .map(|u| MultipartUpload {
                        key: Some(u.key),
                        upload_id: Some(u.upload_id),
                        initiated: Some(timestamp(u.initiated_ms)),
                        storage_class: Some(StorageClass::from(storage_class_out(&u.storage_class).to_owned())),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
    }
}

/// The account, as S3 names an owner.
fn owner(caller: &Caller) -> Owner {
    Owner { display_name: Some(caller.0.account_id.clone()), id: Some(caller.0.account_id.clone()) }
}

fn list_entry(info: ObjectInfo, url: bool) -> Object {
    Object {
        key: Some(if url { uri_encode(&info.key) } else { info.key.clone() }),
        size: Some(info.size as i64),
        last_modified: Some(timestamp(info.uploaded_ms)),
        e_tag: Some(etag(&info.etag)),
        storage_class: Some(ObjectStorageClass::from(storage_class_out(&info.storage_class).to_owned())),
        ..Default::default()
    }
}
