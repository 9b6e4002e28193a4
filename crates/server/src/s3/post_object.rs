//! POST on an object key: R2 stores the body as a PutObject (S3 would refuse the method). A
//! custom `s3s` route, so the signature is checked first like any request's.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use kura_catalog::Catalog;
use kura_r2::{PutOptions, R2};
use s3s::dto::StreamingBlob;
use s3s::route::S3Route;
use s3s::{Body, S3Request, S3Response, S3Result};

use super::access::authorize;
use super::convert::{conditional, digests, storage_class_in};
use super::service::KuraS3;
use super::url::percent_decode;
use super::virtual_bucket;
use crate::error::s3::{engine_error, error};

pub(crate) struct PostAsPut {
    pub s3: KuraS3,
    pub domains: Vec<String>,
}

/// Query parameters that make a POST something else (uploads, deletes, restores, selects).
const OTHER_POSTS: &[&str] = &["uploads", "uploadId", "delete", "restore", "select"];

impl PostAsPut {
    /// The bucket and key a request names, virtual-hosted or path-style.
    fn target(&self, uri: &Uri, headers: &HeaderMap) -> Option<(String, String)> {
        let path = percent_decode(uri.path(), false);
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        if let Some(Some(bucket)) = virtual_bucket(&self.domains, host) {
            let key = path.strip_prefix('/')?;
            return (!key.is_empty()).then(|| (bucket.to_owned(), key.to_owned()));
        }
        let (bucket, key) = path.strip_prefix('/')?.split_once('/')?;
        (!bucket.is_empty() && !key.is_empty()).then(|| (bucket.to_owned(), key.to_owned()))
    }
}

#[async_trait::async_trait]
impl S3Route for PostAsPut {
    fn is_match(&self, method: &Method, uri: &Uri, headers: &HeaderMap, _: &mut axum::http::Extensions) -> bool {
        if method != Method::POST {
            return false;
        }
        let query = uri.query().unwrap_or("");
        let other = query.split('&').any(|pair| OTHER_POSTS.contains(&pair.split('=').next().unwrap_or("")));
        let form = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("multipart/form-data"));
        !other && !form && self.target(uri, headers).is_some()
    }

    async fn check_access(&self, _req: &mut S3Request<Body>) -> S3Result<()> {
        // Checked in `call`, with the catalog, as every operation's access is.
        Ok(())
    }

    async fn call(&self, req: S3Request<Body>) -> S3Result<S3Response<Body>> {
        let Some(credentials) = &req.credentials else {
            return Err(error(StatusCode::BAD_REQUEST, "InvalidArgument", "Authorization"));
        };
        let (bucket_name, key) = self
            .target(&req.uri, &req.headers)
            .ok_or_else(|| error(StatusCode::NOT_FOUND, "RouteNotFound", "No route matches this url."))?;
        let catalog: &Arc<Catalog> = &self.s3.catalog;
        let caller = authorize(catalog, &credentials.access_key, "PutObject", Some(&bucket_name), &req.headers)?;
        let bucket = self.s3.bucket_for_write(&caller, &bucket_name, &req.headers).await?;
        let headers = &req.headers;
        let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let custom: BTreeMap<String, String> = headers
            .iter()
            .filter_map(|(name, value)| {
                let meta = name.as_str().strip_prefix("x-amz-meta-")?;
                Some((meta.to_owned(), super::rfc2047::decode(value.to_str().ok()?)))
            })
            .collect();
        let options = PutOptions {
            http: super::http_metadata(headers),
            custom,
            storage_class: storage_class_in(headers.get("x-amz-storage-class").and_then(|v| v.to_str().ok()))?,
            conditional: conditional(headers, ""),
            digests: digests(headers, req.trailing_headers.clone())?,
            size: text(header::CONTENT_LENGTH).and_then(|n| n.parse().ok()),
            max_size: None,
        };
        let r2: &Arc<R2> = &self.s3.r2;
        let info =
            r2.put_object(&bucket.id, &key, StreamingBlob::from(req.input), options).await.map_err(engine_error)?;
        let mut response = S3Response::new(Body::empty());
        if let Ok(etag) = info.http_etag().parse() {
            response.headers.insert(header::ETAG, etag);
        }
        Ok(response)
    }
}
