//! What the R2 binding sends: the request JSON workerd writes (in `cf-r2-request`, or before
//! a put's payload), and its fields read into the engine's options (conditionals, ranges, HTTP
//! metadata, checksums).

use axum::http::StatusCode;
use base64::Engine as _;
use kura_r2::{ByteRange, ChecksumAlgorithm, Conditional, EtagCondition, ExpectedDigests, HttpMetadata, R2Error};
use serde::{Deserialize, Deserializer};
use serde_json::Value as Json;

use super::reply::{BindingError, HTTP_DATE};

pub(super) const REQUEST_HEADER: &str = "cf-r2-request";

/// Largest request JSON accepted (workerd's own bound on replies).
pub(super) const MAX_METADATA: usize = 1 << 20;

/// capnp's JSON writes 64-bit integers as strings; accept either.
pub(super) fn u64_lenient<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
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
pub(super) struct RangeJson {
    #[serde(default, deserialize_with = "u64_lenient")]
    pub(super) offset: Option<u64>,
    #[serde(default, deserialize_with = "u64_lenient")]
    pub(super) length: Option<u64>,
    #[serde(default, deserialize_with = "u64_lenient")]
    pub(super) suffix: Option<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct EtagJson {
    #[serde(default)]
    pub(super) value: String,
    #[serde(rename = "type")]
    pub(super) kind: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct OnlyIfJson {
    #[serde(default)]
    pub(super) etag_matches: Option<Vec<EtagJson>>,
    #[serde(default)]
    pub(super) etag_does_not_match: Option<Vec<EtagJson>>,
    #[serde(default, deserialize_with = "u64_lenient")]
    pub(super) uploaded_before: Option<u64>,
    #[serde(default, deserialize_with = "u64_lenient")]
    pub(super) uploaded_after: Option<u64>,
    #[serde(default)]
    pub(super) seconds_granularity: bool,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct HttpFieldsJson {
    pub(super) content_type: Option<String>,
    pub(super) content_language: Option<String>,
    pub(super) content_disposition: Option<String>,
    pub(super) content_encoding: Option<String>,
    pub(super) cache_control: Option<String>,
    #[serde(default, deserialize_with = "u64_lenient")]
    pub(super) cache_expiry: Option<u64>,
}

#[derive(Deserialize)]
pub(super) struct FieldJson {
    pub(super) k: String,
    pub(super) v: String,
}

#[derive(Deserialize)]
pub(super) struct PartJson {
    pub(super) etag: String,
    pub(super) part: u32,
}

#[derive(Deserialize)]
#[serde(tag = "method", rename_all = "camelCase")]
// One request per call: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum BindingRequest {
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

pub(super) fn parse_request(bytes: &[u8]) -> Result<BindingRequest, BindingError> {
    serde_json::from_slice(bytes).map_err(|e| {
        // Miniflare answers 500 (workerd never sends one); from outside clients it is their mistake.
        BindingError::new(StatusCode::BAD_REQUEST, 10001, format!("the binding request is malformed: {e}"))
    })
}

pub(super) fn refuse_ssec(ssec: &Option<Json>) -> Result<(), BindingError> {
    match ssec {
        None => Ok(()),
        Some(_) => Err(BindingError::new(StatusCode::NOT_IMPLEMENTED, 10001, "kura does not support SSE-C keys")),
    }
}

pub(super) fn expected_digests(
    md5: Option<String>,
    others: [Option<String>; 4],
) -> Result<ExpectedDigests, BindingError> {
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

pub(super) fn http_metadata(fields: Option<HttpFieldsJson>) -> HttpMetadata {
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

pub(super) fn conditional(only_if: Option<OnlyIfJson>) -> Conditional {
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

/// A `Range` header's single range (several ranges read the whole object, as R2 does).
pub(super) fn parse_range_header(text: &str) -> Result<Option<ByteRange>, BindingError> {
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

pub(super) fn byte_range(range: Option<RangeJson>, header: Option<String>) -> Result<Option<ByteRange>, BindingError> {
    if let Some(header) = header {
        return parse_range_header(&header);
    }
    let Some(range) = range else { return Ok(None) };
    Ok(match (range.offset, range.length, range.suffix) {
        (_, _, Some(suffix)) => Some(ByteRange::Suffix(suffix)),
        (_, Some(0), None) => return Err(R2Error::InvalidRange.into()),
        (offset, Some(length), None) => {
            let start = offset.unwrap_or(0);
            // A length past the end of any object reads to its end (found by the API fuzz test: an
            // offset and a length near 2^64 overflowed).
            Some(ByteRange::From { start, end: Some(start.saturating_add(length - 1)) })
        }
        (Some(offset), None, None) => Some(ByteRange::From { start: offset, end: None }),
        (None, None, None) => None,
    })
}
