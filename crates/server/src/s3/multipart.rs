//! S3's multipart uploads: create, upload a part (or copy one), complete, abort, and list
//! parts and uploads.

use axum::http::StatusCode;
use kura_r2::{GetOptions, HttpMetadata, PartOptions, R2Error};
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result};

use super::convert::{
    caller, checksum_out, checksum_type, checksum_type_of, conditional, custom_metadata, declared_checksum, digests,
    etag, http_date, named_part_checksums, parse_copy_range, storage_class_in, storage_class_out, timestamp,
    with_checksums,
};
use super::service::KuraS3;
use super::url::uri_encode;
use crate::error::s3::{engine_error, error};

pub(super) async fn create_multipart_upload(
    kura: &KuraS3,
    req: S3Request<CreateMultipartUploadInput>,
) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
    let caller = caller(&req)?;
    let bucket = kura.bucket_for_write(caller, &req.input.bucket, &req.headers).await?;
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
    let upload_id = kura
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

pub(super) async fn upload_part(
    kura: &KuraS3,
    req: S3Request<UploadPartInput>,
) -> S3Result<S3Response<UploadPartOutput>> {
    let caller = caller(&req)?;
    let bucket = kura.bucket(caller, &req.input.bucket)?;
    let digests = digests(&req.headers, req.trailing_headers.clone())?;
    let input = req.input;
    let number = u32::try_from(input.part_number).unwrap_or(0);
    let body = input
        .body
        .unwrap_or_else(|| StreamingBlob::wrap(futures_util::stream::empty::<Result<bytes::Bytes, std::io::Error>>()));
    let part = kura
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

pub(super) async fn upload_part_copy(
    kura: &KuraS3,
    req: S3Request<UploadPartCopyInput>,
) -> S3Result<S3Response<UploadPartCopyOutput>> {
    let caller = &caller(&req)?.clone();
    let bucket = kura.bucket(caller, &req.input.bucket)?;
    let (source_bucket, source_key) = kura.copy_source(caller, &req.input.copy_source)?;
    let input = req.input;
    let range = input.copy_source_range.as_deref().map(parse_copy_range).transpose()?;
    let source =
        kura.read_source(caller, &source_bucket, &source_key, GetOptions { range, ..Default::default() }).await?;
    let size = source.length();
    let number = u32::try_from(input.part_number).unwrap_or(0);
    let part = kura
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

pub(super) async fn complete_multipart_upload(
    kura: &KuraS3,
    req: S3Request<CompleteMultipartUploadInput>,
) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
    let caller = caller(&req)?;
    let bucket = kura.bucket(caller, &req.input.bucket)?;
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
    let info = kura
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

pub(super) async fn abort_multipart_upload(
    kura: &KuraS3,
    req: S3Request<AbortMultipartUploadInput>,
) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
    let caller = caller(&req)?;
    let bucket = kura.bucket(caller, &req.input.bucket)?;
    kura.r2.abort_multipart_upload(&bucket.id, &req.input.key, &req.input.upload_id).await.map_err(engine_error)?;
    Ok(S3Response::new(AbortMultipartUploadOutput::default()))
}

pub(super) async fn list_parts(kura: &KuraS3, req: S3Request<ListPartsInput>) -> S3Result<S3Response<ListPartsOutput>> {
    let caller = caller(&req)?;
    let bucket = kura.bucket(caller, &req.input.bucket)?;
    let input = req.input;
    let marker = input.part_number_marker.map_or(0, |m| m.max(0) as u32);
    let max = input.max_parts.map_or(1000, |m| m.clamp(0, 1000) as usize);
    let listing =
        kura.r2.list_parts(&bucket.id, &input.key, &input.upload_id, marker, max).await.map_err(engine_error)?;
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

pub(super) async fn list_multipart_uploads(
    kura: &KuraS3,
    req: S3Request<ListMultipartUploadsInput>,
) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
    let caller = caller(&req)?;
    let bucket = kura.bucket(caller, &req.input.bucket)?;
    let input = req.input;
    let max = input.max_uploads.map_or(1000, |m| m.clamp(0, 1000) as usize);
    let (uploads, truncated) = kura
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
