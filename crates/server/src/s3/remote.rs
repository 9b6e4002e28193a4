//! In a cluster, the source of a copy whose bucket another node owns: read through that node's
//! S3 listener as a GET signed with the caller's own key, so the owner decides access as it
//! does for any read; the copy's conditions are then checked here on what was read.

use kura_catalog::S3Credential;
use kura_r2::{ByteRange, GetOptions, HttpMetadata, ObjectBody, ObjectInfo, R2Error};

use super::url::uri_encode;

/// Reads `key` of the bucket `bucket` from the S3 listener at `endpoint` (its owner), as
/// `credential`, with `options`' range or part; its preconditions are checked on the answer.
pub(super) async fn read(
    http: &reqwest::Client,
    endpoint: &str,
    credential: &S3Credential,
    bucket: &str,
    key: &str,
    options: GetOptions,
) -> Result<ObjectBody, R2Error> {
    let failed = |e: &dyn std::fmt::Display| R2Error::storage_text("reading a copy's source from its owner", e);
    let path: Vec<String> = key.split('/').map(uri_encode).collect();
    let mut url = format!("{}/{}/{}", endpoint.trim_end_matches('/'), uri_encode(bucket), path.join("/"));
    if let Some(part) = options.part_number {
        url.push_str(&format!("?partNumber={part}"));
    }
    let range = options.range.map(|r| match r {
        ByteRange::From { start, end: Some(end) } => format!("bytes={start}-{end}"),
        ByteRange::From { start, end: None } => format!("bytes={start}-"),
        ByteRange::Suffix(n) => format!("bytes=-{n}"),
    });
    let host = kura_client::sigv4::host_of(&url).to_owned();
    let mut headers = vec![("host", host.as_str())];
    if let Some(range) = &range {
        headers.push(("range", range.as_str()));
    }
    let signed = kura_client::sigv4::signed_headers(
        "GET",
        &url,
        &headers,
        &credential.access_key_id,
        &credential.secret_access_key,
    )
    .map_err(|e| failed(&e))?;
    let mut request = http.get(&url);
    for (name, value) in signed {
        request = request.header(name, value);
    }
    if let Some(range) = range {
        request = request.header("range", range);
    }
    let limit = crate::forward::FORWARD_READ_TIMEOUT;
    let answer = tokio::time::timeout(limit, request.send())
        .await
        .map_err(|_| R2Error::Unavailable("the source bucket's owner did not answer; retry shortly".into()))?
        .map_err(|e| failed(&e))?;
    let status = answer.status();
    if !status.is_success() {
        let text = answer.text().await.unwrap_or_default();
        return Err(refusal(status.as_u16(), &text));
    }
    let info = object_info(key, answer.headers()).ok_or_else(|| failed(&"its answer lacks an object's headers"))?;
    options.conditional.check_read(Some(&info))?;
    let range = answer.headers().get("content-range").and_then(|v| v.to_str().ok()).and_then(content_range);
    let body = crate::forward::idle_timeout(answer.bytes_stream(), limit);
    Ok(ObjectBody { info, range, body: kura_r2::byte_stream(body) })
}

/// The engine's error for the owner's refusal (an S3 XML error body, or a bare status).
fn refusal(status: u16, body: &str) -> R2Error {
    let code = body.split("<Code>").nth(1).and_then(|rest| rest.split("</Code>").next()).unwrap_or_default();
    match (status, code) {
        (304, _) => R2Error::NotModified,
        (_, "NoSuchKey") => R2Error::NoSuchKey,
        (_, "NoSuchBucket") => R2Error::NoSuchBucket,
        (412, _) => R2Error::PreconditionFailed,
        (416, _) => R2Error::InvalidRange,
        (503, _) => R2Error::Unavailable("the source bucket's owner is busy or moving; retry shortly".into()),
        _ => R2Error::storage_text("reading a copy's source from its owner", format!("{status} {code}")),
    }
}

/// The object an answer's headers describe.
fn object_info(key: &str, headers: &reqwest::header::HeaderMap) -> Option<ObjectInfo> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let etag = text("etag")?.trim_matches('"').to_owned();
    let size = match text("content-range").as_deref().and_then(|r| r.rsplit('/').next()?.parse().ok()) {
        Some(total) => total,
        None => text("content-length")?.parse().ok()?,
    };
    let uploaded_ms = text("last-modified")
        .and_then(|t| jiff::fmt::rfc2822::parse(&t).ok())
        .map_or(0, |t| t.timestamp().as_millisecond());
    let custom = headers
        .iter()
        .filter_map(|(name, value)| {
            let name = name.as_str().strip_prefix("x-amz-meta-")?;
            Some((name.to_owned(), super::rfc2047::decode(value.to_str().ok()?)))
        })
        .collect();
    let storage_class = match text("x-amz-storage-class").as_deref() {
        Some("STANDARD_IA") => "InfrequentAccess",
        _ => "Standard",
    };
    Some(ObjectInfo {
        key: key.to_owned(),
        version: String::new(),
        size,
        etag,
        uploaded_ms,
        http: HttpMetadata {
            content_type: text("content-type"),
            content_language: text("content-language"),
            content_disposition: text("content-disposition"),
            content_encoding: text("content-encoding"),
            cache_control: text("cache-control"),
            expires: text("expires"),
        },
        custom,
        checksums: Default::default(),
        storage_class: storage_class.to_owned(),
        parts: None,
    })
}

/// `(offset, length)` from a `Content-Range: bytes a-b/total`.
fn content_range(value: &str) -> Option<(u64, u64)> {
    let (span, _) = value.strip_prefix("bytes ")?.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
    Some((a, b.checked_sub(a)? + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_and_refusals_read_as_the_engine_says_them() {
        assert_eq!(content_range("bytes 5-9/100"), Some((5, 5)));
        assert_eq!(content_range("bytes 9-5/100"), None);
        assert!(matches!(refusal(404, "<Error><Code>NoSuchKey</Code></Error>"), R2Error::NoSuchKey));
        assert!(matches!(refusal(404, "<Error><Code>NoSuchBucket</Code></Error>"), R2Error::NoSuchBucket));
        assert!(matches!(refusal(304, ""), R2Error::NotModified));
        assert!(matches!(refusal(500, "x"), R2Error::Storage(_)));
    }
}
