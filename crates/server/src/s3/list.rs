//! S3's listings of a bucket's objects: ListObjects, ListObjectsV2 and ListObjectVersions,
//! paged with markers, continuation tokens, delimiters and URL encoding.

use kura_catalog::R2Bucket;
use kura_r2::ListOptions;
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result};

use super::access::Caller;
use super::convert::{caller, encoding, etag, list_entry, max_keys, owner, storage_class_out, timestamp};
use super::service::KuraS3;
use super::url::uri_encode;
use crate::error::s3::engine_error;

/// What the three listings (V1, V2, versions) ask for.
pub(super) struct ListRequest<'a> {
    pub(super) bucket: &'a str,
    pub(super) encoding_type: Option<&'a EncodingType>,
    pub(super) max_keys: Option<i32>,
    pub(super) options: ListOptions,
}

/// One page, and whether its names go out URL-encoded.
pub(super) struct Listed {
    pub(super) bucket: R2Bucket,
    pub(super) listing: kura_r2::Listing,
    pub(super) url: bool,
}

impl Listed {
    pub(super) fn encode(&self, text: String) -> String {
        if self.url { uri_encode(&text) } else { text }
    }

    /// The V1 marker (and versions' key marker) of the next page: the greater of the last key
    /// and the last common prefix, when the page was truncated.
    pub(super) fn next_marker(&self) -> Option<String> {
        if !self.listing.truncated {
            return None;
        }
        let last_key = self.listing.objects.last().map(|o| o.key.clone());
        last_key.into_iter().chain(self.listing.prefixes.last().cloned()).max().map(|m| self.encode(m))
    }

    pub(super) fn common_prefixes(&self) -> Option<CommonPrefixList> {
        Some(self.listing.prefixes.iter().map(|p| CommonPrefix { prefix: Some(self.encode(p.clone())) }).collect())
    }
}

impl KuraS3 {
    /// One page of a listing, after the caller's reach, `encoding-type` and `max-keys` checks.
    pub(super) async fn list_page(&self, caller: &Caller, mut request: ListRequest<'_>) -> S3Result<Listed> {
        let bucket = self.bucket(caller, request.bucket)?;
        let url = encoding(request.encoding_type)?;
        request.options.limit = max_keys(request.max_keys)?;
        let listing = self.r2.list(&bucket.id, request.options).await.map_err(engine_error)?;
        Ok(Listed { bucket, listing, url })
    }
}

pub(super) async fn list_object_versions(
    kura: &KuraS3,
    req: S3Request<ListObjectVersionsInput>,
) -> S3Result<S3Response<ListObjectVersionsOutput>> {
    let caller = caller(&req)?;
    let input = &req.input;
    let listed = kura
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

pub(super) async fn list_objects_v2(
    kura: &KuraS3,
    req: S3Request<ListObjectsV2Input>,
) -> S3Result<S3Response<ListObjectsV2Output>> {
    let caller = caller(&req)?;
    let input = &req.input;
    let listed = kura
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

pub(super) async fn list_objects(
    kura: &KuraS3,
    req: S3Request<ListObjectsInput>,
) -> S3Result<S3Response<ListObjectsOutput>> {
    let caller = caller(&req)?;
    let input = &req.input;
    let listed = kura
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
