//! The S3 listener's placement: a request naming a bucket (path-style or virtual-hosted) goes
//! to the owner of that bucket, found through the account of the key the request is signed
//! with. Anything else — ListBuckets, a bucket that does not exist, an unknown key — is
//! answered here, where the catalog every node shares decides it.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;

use super::{Placed, serve_placed};
use crate::error::{ApiError, Wire};
use crate::state::AppState;

/// The S3 listener's middleware: places each request (see the module's documentation).
pub async fn place_s3(
    State((app, domains)): State<(AppState, Arc<Vec<String>>)>,
    request: Request,
    next: Next,
) -> Response {
    let Some(forwarding) = app.forwarding.clone() else { return next.run(request).await };
    let (Some(name), Some(access_key)) = (bucket_name(&request, &domains), access_key(&request)) else {
        return next.run(request).await;
    };
    let account = match app.catalog.s3_credential(&access_key) {
        Ok(Some(credential)) => credential.account_id,
        Ok(None) => return next.run(request).await,
        Err(e) => return Wire::S3.refuse(ApiError::internal(&e)),
    };
    let bucket = match app.catalog.r2_bucket(&account, &name) {
        Ok(Some(bucket)) => bucket,
        Ok(None) => return next.run(request).await,
        Err(e) => return Wire::S3.refuse(ApiError::internal(&e)),
    };
    serve_placed(&app, &forwarding, Placed::Bucket(bucket.id), Wire::S3, request, next, "").await
}

/// The bucket a request addresses: by its host under one of `domains`, else the first segment
/// of its path.
fn bucket_name(request: &Request, domains: &[String]) -> Option<String> {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()))
        .unwrap_or_default()
        .to_ascii_lowercase();
    if let Some(addressed) = crate::s3::virtual_bucket(domains, &host) {
        return addressed.map(str::to_owned);
    }
    let first = request.uri().path().trim_start_matches('/').split('/').next()?;
    (!first.is_empty()).then(|| first.to_owned())
}

/// The access key a request is signed with: SigV4's `Credential=` in the Authorization header,
/// or `X-Amz-Credential` in a presigned URL.
fn access_key(request: &Request) -> Option<String> {
    if let Some(authorization) = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let credential = authorization.split("Credential=").nth(1)?;
        return credential.split('/').next().map(str::to_owned).filter(|k| !k.is_empty());
    }
    let pairs = crate::s3::query_pairs(request.uri().query()?, false);
    let (_, credential) = pairs.iter().find(|(name, _)| name.eq_ignore_ascii_case("X-Amz-Credential"))?;
    credential.split('/').next().map(str::to_owned).filter(|k| !k.is_empty())
}
