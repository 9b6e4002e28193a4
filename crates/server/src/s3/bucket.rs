//! S3's bucket operations as R2 answers them: list, create, delete, head, and the bucket
//! settings R2 reports (location, encryption, versioning, tagging, lock, replication, CORS,
//! lifecycle).

use axum::http::StatusCode;
use kura_catalog::R2Bucket;
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result};

use super::convert::{caller, owner, timestamp};
use super::service::KuraS3;
use crate::error::s3::{bucket_error, catalog_error, error};

pub(super) async fn list_buckets(
    kura: &KuraS3,
    req: S3Request<ListBucketsInput>,
) -> S3Result<S3Response<ListBucketsOutput>> {
    let caller = caller(&req)?;
    let buckets = kura.catalog.list_r2_buckets(&caller.0.account_id).map_err(catalog_error)?;
    let prefix = req.input.prefix.clone().unwrap_or_default();
    // Pages as AWS pages them: `max-buckets` (1 to 1,000; all when absent) and a
    // continuation token, which is the last name of the previous page.
    let after = req.input.continuation_token.clone().filter(|t| !t.is_empty());
    let max = match req.input.max_buckets {
        None => usize::MAX,
        Some(n) if (1..=1000).contains(&n) => n as usize,
        Some(_) => {
            return Err(error(StatusCode::BAD_REQUEST, "InvalidArgument", "max-buckets must be between 1 and 1000"));
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

pub(super) async fn create_bucket(
    kura: &KuraS3,
    req: S3Request<CreateBucketInput>,
) -> S3Result<S3Response<CreateBucketOutput>> {
    let caller = caller(&req)?;
    let name = &req.input.bucket;
    let location = req
        .input
        .create_bucket_configuration
        .as_ref()
        .and_then(|c| c.location_constraint.as_ref())
        .map(|l| l.as_str().to_ascii_lowercase())
        .filter(|l| !matches!(l.as_str(), "" | "auto" | "us-east-1"));
    crate::buckets::create(&kura.catalog, &kura.r2, &caller.0.account_id, name, location.as_deref(), None)
        .await
        .map_err(bucket_error)?;
    Ok(S3Response::new(CreateBucketOutput { location: Some(format!("/{name}")) }))
}

pub(super) async fn delete_bucket(
    kura: &KuraS3,
    req: S3Request<DeleteBucketInput>,
) -> S3Result<S3Response<DeleteBucketOutput>> {
    let caller = caller(&req)?;
    let bucket = kura.bucket(caller, &req.input.bucket)?;
    crate::buckets::delete(&kura.catalog, &kura.r2, &caller.0.account_id, &bucket.name).await.map_err(bucket_error)?;
    Ok(S3Response::new(DeleteBucketOutput {}))
}

pub(super) async fn head_bucket(
    kura: &KuraS3,
    req: S3Request<HeadBucketInput>,
) -> S3Result<S3Response<HeadBucketOutput>> {
    let caller = caller(&req)?;
    kura.bucket(caller, &req.input.bucket)?;
    Ok(S3Response::new(HeadBucketOutput { bucket_region: Some("auto".into()), ..Default::default() }))
}

pub(super) async fn get_bucket_location(
    kura: &KuraS3,
    req: S3Request<GetBucketLocationInput>,
) -> S3Result<S3Response<GetBucketLocationOutput>> {
    let caller = caller(&req)?;
    let bucket = kura.bucket(caller, &req.input.bucket)?;
    let location = bucket.location.map(|l| l.to_ascii_uppercase()).unwrap_or_else(|| "auto".into());
    Ok(S3Response::new(GetBucketLocationOutput { location_constraint: Some(BucketLocationConstraint::from(location)) }))
}

pub(super) async fn get_bucket_encryption(
    kura: &KuraS3,
    req: S3Request<GetBucketEncryptionInput>,
) -> S3Result<S3Response<GetBucketEncryptionOutput>> {
    // R2 encrypts everything at rest and says so; kura answers the same for compatibility
    // (its data directory is as encrypted as the disk under it).
    kura.bucket(caller(&req)?, &req.input.bucket)?;
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

pub(super) async fn get_bucket_versioning(
    kura: &KuraS3,
    req: S3Request<GetBucketVersioningInput>,
) -> S3Result<S3Response<GetBucketVersioningOutput>> {
    kura.bucket(caller(&req)?, &req.input.bucket)?;
    Ok(S3Response::new(GetBucketVersioningOutput::default()))
}

pub(super) async fn get_bucket_tagging(
    kura: &KuraS3,
    req: S3Request<GetBucketTaggingInput>,
) -> S3Result<S3Response<GetBucketTaggingOutput>> {
    kura.bucket(caller(&req)?, &req.input.bucket)?;
    Err(error(StatusCode::NOT_FOUND, "NoSuchTagSet", "The TagSet does not exist."))
}

pub(super) async fn get_object_lock_configuration(
    kura: &KuraS3,
    req: S3Request<GetObjectLockConfigurationInput>,
) -> S3Result<S3Response<GetObjectLockConfigurationOutput>> {
    kura.bucket(caller(&req)?, &req.input.bucket)?;
    Err(error(
        StatusCode::NOT_FOUND,
        "ObjectLockConfigurationNotFoundError",
        "Object Lock configuration does not exist for this bucket.",
    ))
}

pub(super) async fn get_bucket_replication(
    kura: &KuraS3,
    req: S3Request<GetBucketReplicationInput>,
) -> S3Result<S3Response<GetBucketReplicationOutput>> {
    kura.bucket(caller(&req)?, &req.input.bucket)?;
    Err(error(
        StatusCode::NOT_FOUND,
        "ReplicationConfigurationNotFoundError",
        "The replication configuration was not found.",
    ))
}

pub(super) async fn get_bucket_cors(
    kura: &KuraS3,
    req: S3Request<GetBucketCorsInput>,
) -> S3Result<S3Response<GetBucketCorsOutput>> {
    // Setting CORS rules is not served yet, so no bucket has any.
    kura.bucket(caller(&req)?, &req.input.bucket)?;
    Err(error(StatusCode::NOT_FOUND, "NoSuchCORSConfiguration", "The CORS configuration does not exist"))
}

pub(super) async fn get_bucket_lifecycle_configuration(
    kura: &KuraS3,
    req: S3Request<GetBucketLifecycleConfigurationInput>,
) -> S3Result<S3Response<GetBucketLifecycleConfigurationOutput>> {
    // Setting lifecycle rules is not served yet, so no bucket has any.
    kura.bucket(caller(&req)?, &req.input.bucket)?;
    Err(error(StatusCode::NOT_FOUND, "NoSuchLifecycleConfiguration", "The lifecycle configuration does not exist."))
}
