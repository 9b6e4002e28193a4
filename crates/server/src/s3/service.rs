//! The S3 service's state ([`KuraS3`]: the catalog, the engine, the client that reads copy
//! sources from other nodes) and what every operation starts with: the caller's bucket.

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use kura_catalog::{Catalog, R2Bucket};
use kura_r2::{R2, R2Error};
use s3s::S3Result;

use super::access::Caller;
use crate::error::s3::{bucket_error, catalog_error, engine_error, error};

#[derive(Clone)]
pub(crate) struct KuraS3 {
    pub catalog: Arc<Catalog>,
    pub r2: Arc<R2>,
    /// In a cluster, reads copy sources from the nodes that own them.
    pub(super) http: reqwest::Client,
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
}
