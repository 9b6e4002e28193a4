//! Between S3's shapes and the engine's: timestamps, ETags, conditionals, checksums (declared,
//! sent, trailing), storage classes, metadata, list entries and paging arguments.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use kura_r2::{
    ByteRange, ChecksumAlgorithm, Conditional, DeclaredChecksum, EtagCondition, ExpectedDigests, ObjectInfo,
    TrailingChecksum,
};
use s3s::dto::*;
use s3s::{S3Request, S3Result};

use super::access::Caller;
use super::url::uri_encode;
use crate::error::s3::error;

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
        super::convert::with_checksums!(
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
                e_tag: Some(super::convert::etag(&$served.info.etag)),
                last_modified: Some(super::convert::timestamp($served.info.uploaded_ms)),
                // As S3 and R2 send them: the class only when it is not the standard one, the part
                // count only to a request that named a part.
                storage_class: (super::convert::storage_class_out(&$served.info.storage_class) != "STANDARD").then(
                    || StorageClass::from(super::convert::storage_class_out(&$served.info.storage_class).to_owned())
                ),
                parts_count: $served.info.parts.filter(|_| $served.part_asked).map(|n| n as i32),
                checksum_type: if $served.checksums {
                    super::convert::checksum_type_of(&$served.info.checksums)
                } else {
                    None
                },
            },
            |name| $served.checksum(name)
        )
    };
}
pub(super) use object_output;
pub(super) use with_checksums;

pub(super) fn caller<T>(req: &S3Request<T>) -> S3Result<&Caller> {
    req.extensions.get::<Caller>().ok_or_else(|| error(StatusCode::BAD_REQUEST, "InvalidArgument", "Authorization"))
}

pub(super) fn timestamp(ms: i64) -> Timestamp {
    Timestamp::from(SystemTime::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
}

pub(super) fn timestamp_ms(t: &Timestamp) -> i64 {
    let t: time::OffsetDateTime = t.clone().into();
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

pub(super) fn http_date(t: &Timestamp) -> Option<String> {
    let mut out = Vec::new();
    t.format(TimestampFormat::HttpDate, &mut out).ok()?;
    String::from_utf8(out).ok()
}

pub(super) fn parse_http_date(text: &str) -> Option<Timestamp> {
    Timestamp::parse(TimestampFormat::HttpDate, text).ok()
}

pub(super) fn etag(info_etag: &str) -> ETag {
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

pub(super) fn decode_base64(value: &str, what: &str) -> S3Result<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .map_err(|_| error(StatusCode::BAD_REQUEST, "InvalidDigest", format!("The {what} you specified is not valid.")))
}

pub(super) const CHECKSUM_HEADERS: [(&str, ChecksumAlgorithm); 5] = [
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

pub(super) fn storage_class_out(class: &str) -> &'static str {
    if class == "InfrequentAccess" { "STANDARD_IA" } else { "STANDARD" }
}

/// Custom metadata as stored: values RFC 2047-decoded, as R2 stores them.
pub(super) fn custom_metadata(metadata: Option<Metadata>) -> BTreeMap<String, String> {
    metadata.map(|m| m.into_iter().map(|(k, v)| (k, super::rfc2047::decode(&v))).collect()).unwrap_or_default()
}

/// Headers sent back on GET and HEAD.
pub(super) struct ObjectHeaders {
    pub(super) content_type: String,
    pub(super) cache_control: Option<String>,
    pub(super) content_disposition: Option<String>,
    pub(super) content_encoding: Option<String>,
    pub(super) content_language: Option<String>,
    pub(super) expires: Option<Timestamp>,
    pub(super) metadata: Option<Metadata>,
}

pub(super) fn object_headers(info: &ObjectInfo) -> ObjectHeaders {
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

pub(super) fn checksum_out(info: &ObjectInfo, name: &str) -> Option<String> {
    info.checksums.get(name).cloned()
}

/// Whether a stored checksum is of the whole object or (with a `-N` suffix) of its parts'.
pub(super) fn checksum_type_of(checksums: &BTreeMap<String, String>) -> Option<ChecksumType> {
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
pub(super) fn declared_checksum(
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
pub(super) fn checksum_type(declared: DeclaredChecksum) -> ChecksumType {
    ChecksumType::from_static(if declared.full_object { ChecksumType::FULL_OBJECT } else { ChecksumType::COMPOSITE })
}

/// The checksums a part or completed-part list names, as the engine takes them.
pub(super) fn named_part_checksums(number: u32, part: &CompletedPart) -> Vec<(u32, ChecksumAlgorithm, String)> {
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
pub(super) fn checksums_wanted(mode: Option<&ChecksumMode>, ranged: bool) -> bool {
    !ranged && mode.is_some_and(|m| m.as_str().eq_ignore_ascii_case("ENABLED"))
}

pub(super) fn max_keys(requested: Option<i32>) -> S3Result<usize> {
    match requested {
        None => Ok(1000),
        Some(n) if n < 0 => {
            Err(error(StatusCode::BAD_REQUEST, "InvalidMaxKeys", "MaxKeys params must be positive integer <= 1000."))
        }
        Some(n) => Ok((n as usize).min(1000)),
    }
}

pub(super) fn encoding(requested: Option<&EncodingType>) -> S3Result<bool> {
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

pub(super) fn parse_copy_range(text: &str) -> S3Result<ByteRange> {
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

/// The account, as S3 names an owner.
pub(super) fn owner(caller: &Caller) -> Owner {
    Owner { display_name: Some(caller.0.account_id.clone()), id: Some(caller.0.account_id.clone()) }
}

pub(super) fn list_entry(info: ObjectInfo, url: bool) -> Object {
    Object {
        key: Some(if url { uri_encode(&info.key) } else { info.key.clone() }),
        size: Some(info.size as i64),
        last_modified: Some(timestamp(info.uploaded_ms)),
        e_tag: Some(etag(&info.etag)),
        storage_class: Some(ObjectStorageClass::from(storage_class_out(&info.storage_class).to_owned())),
        ..Default::default()
    }
}
