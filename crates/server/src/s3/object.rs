//! S3's object operations: put, get and head (with ranges, parts, conditionals and
//! checksums), delete, multi-delete and copy (from another node's bucket in a cluster).

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use kura_catalog::R2Bucket;
use kura_r2::{ByteRange, GetOptions, HttpMetadata, MetadataDirective, ObjectBody, ObjectInfo, PutOptions, R2Error};
use s3s::dto::*;
use s3s::{S3Error, S3Request, S3Response, S3Result};

use super::access::Caller;
use super::convert::{
    ObjectHeaders, caller, checksum_out, checksums_wanted, conditional, custom_metadata, digests, etag, http_date,
    object_headers, object_output, storage_class_in, timestamp, with_checksums,
};
use super::service::KuraS3;
use crate::error::s3::{engine_error, error};

/// What a GET or HEAD asks for beyond the key.
pub(super) struct Read<'a> {
    pub(super) range: Option<Range>,
    pub(super) part_number: Option<i32>,
    pub(super) checksum_mode: Option<&'a ChecksumMode>,
}

/// An object being read, with the headers GET and HEAD answer alike.
pub(super) struct Served {
    pub(super) body: kura_r2::ByteStream,
    pub(super) length: u64,
    pub(super) content_range: Option<String>,
    pub(super) headers: ObjectHeaders,
    pub(super) info: ObjectInfo,
    pub(super) checksums: bool,
    /// Whether the request named a part (`partNumber`): only then is the part count sent.
    pub(super) part_asked: bool,
}

impl Served {
    pub(super) fn checksum(&self, name: &str) -> Option<String> {
        if self.checksums { checksum_out(&self.info, name) } else { None }
    }
}

impl KuraS3 {
    /// A copy's source: read here when this node serves its bucket, else from the node that
    /// does (in a cluster).
    pub(super) async fn read_source(
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

    pub(super) fn copy_source(&self, caller: &Caller, source: &CopySource) -> S3Result<(R2Bucket, String)> {
        match source {
            CopySource::Bucket { bucket, key, .. } => Ok((self.bucket(caller, bucket)?, key.to_string())),
            _ => Err(error(StatusCode::NOT_IMPLEMENTED, "NotImplemented", "Access point copy sources not implemented")),
        }
    }

    /// A 304, with the validators and caching headers of the object as it is now (RFC 9110
    /// 15.4.5), as R2 sends them.
    pub(super) async fn not_modified(&self, bucket: &R2Bucket, key: &str) -> S3Error {
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
    pub(super) async fn read(
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

pub(super) async fn put_object(kura: &KuraS3, req: S3Request<PutObjectInput>) -> S3Result<S3Response<PutObjectOutput>> {
    let caller = caller(&req)?;
    let bucket = kura.bucket_for_write(caller, &req.input.bucket, &req.headers).await?;
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
        max_size: None,
    };
    let body = input
        .body
        .unwrap_or_else(|| StreamingBlob::wrap(futures_util::stream::empty::<Result<bytes::Bytes, std::io::Error>>()));
    let info = kura.r2.put_object(&bucket.id, &input.key, body, options).await.map_err(engine_error)?;
    Ok(S3Response::new(with_checksums!(PutObjectOutput { e_tag: Some(etag(&info.etag)) }, |name| checksum_out(
        &info, name
    ))))
}

pub(super) async fn get_object(kura: &KuraS3, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
    let caller = caller(&req)?;
    let input = &req.input;
    let read = Read { range: input.range, part_number: input.part_number, checksum_mode: input.checksum_mode.as_ref() };
    let (object, status) = kura.read(caller, &input.bucket, &input.key, &req.headers, read).await?;
    let mut output = object_output!(GetObjectOutput, object);
    output.body = Some(StreamingBlob::wrap(object.body));
    let mut response = S3Response::new(output);
    response.status = status;
    Ok(response)
}

pub(super) async fn head_object(
    kura: &KuraS3,
    req: S3Request<HeadObjectInput>,
) -> S3Result<S3Response<HeadObjectOutput>> {
    let caller = caller(&req)?;
    let input = &req.input;
    let read = Read { range: input.range, part_number: input.part_number, checksum_mode: input.checksum_mode.as_ref() };
    // A read whose body is dropped unread: the same checks, ranges and headers as GET.
    let (object, status) = kura.read(caller, &input.bucket, &input.key, &req.headers, read).await?;
    let mut response = S3Response::new(object_output!(HeadObjectOutput, object));
    response.status = status;
    Ok(response)
}

pub(super) async fn delete_object(
    kura: &KuraS3,
    req: S3Request<DeleteObjectInput>,
) -> S3Result<S3Response<DeleteObjectOutput>> {
    let caller = caller(&req)?;
    let bucket = kura.bucket(caller, &req.input.bucket)?;
    kura.r2.delete_object(&bucket.id, &req.input.key).await.map_err(engine_error)?;
    Ok(S3Response::new(DeleteObjectOutput::default()))
}

pub(super) async fn delete_objects(
    kura: &KuraS3,
    req: S3Request<DeleteObjectsInput>,
) -> S3Result<S3Response<DeleteObjectsOutput>> {
    let caller = caller(&req)?;
    let bucket = kura.bucket(caller, &req.input.bucket)?;
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
    kura.r2.delete_objects(&bucket.id, keys.clone()).await.map_err(engine_error)?;
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

pub(super) async fn copy_object(
    kura: &KuraS3,
    req: S3Request<CopyObjectInput>,
) -> S3Result<S3Response<CopyObjectOutput>> {
    let caller = &caller(&req)?.clone();
    let bucket = kura.bucket(caller, &req.input.bucket)?;
    let (source_bucket, source_key) = kura.copy_source(caller, &req.input.copy_source)?;
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
    let source = kura
        .read_source(
            caller,
            &source_bucket,
            &source_key,
            GetOptions { conditional: source_conditional, ..Default::default() },
        )
        .await?;
    let info = kura.r2.copy_from(source, &bucket.id, &input.key, directive, options).await.map_err(engine_error)?;
    Ok(S3Response::new(CopyObjectOutput {
        copy_object_result: Some(CopyObjectResult {
            e_tag: Some(etag(&info.etag)),
            last_modified: Some(timestamp(info.uploaded_ms)),
            ..Default::default()
        }),
        ..Default::default()
    }))
}
