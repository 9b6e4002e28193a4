//! Who may do what over S3: secret keys come from the catalog (derived from API tokens as R2
//! derives them, or pinned by configuration); each operation needs R2 read or write scope and
//! a key that reaches the bucket.

use std::sync::Arc;

use axum::http::StatusCode;
use kura_catalog::{Catalog, S3Credential};
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::path::S3Path;
use s3s::{S3Error, S3Result};

use crate::error::s3::error;

/// The authenticated key of a request, for the operations to read.
#[derive(Debug, Clone)]
pub(crate) struct Caller(pub S3Credential);

fn unauthorized() -> S3Error {
    error(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
}

fn internal(e: impl std::fmt::Display) -> S3Error {
    tracing::error!(error = %e, "catalog failure during S3 auth");
    error(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "We encountered an internal error. Please try again.")
}

/// Looks secret keys up in the catalog; an unknown key is R2's 401 Unauthorized.
pub(crate) struct CatalogAuth {
    pub catalog: Arc<Catalog>,
}

#[async_trait::async_trait]
impl S3Auth for CatalogAuth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match self.catalog.s3_credential(access_key).map_err(internal)? {
            Some(credential) => Ok(SecretKey::from(credential.secret_access_key)),
            None => Err(unauthorized()),
        }
    }
}

/// Operations that only read.
fn is_read(operation: &str) -> bool {
    operation.starts_with("Get") || operation.starts_with("Head") || operation.starts_with("List")
}

/// Headers R2 refuses (501) on writes, because it does not implement what they ask for.
const WRITE_HEADERS_NOT_IMPLEMENTED: &[&str] = &[
    "x-amz-tagging",
    "x-amz-grant-full-control",
    "x-amz-grant-read",
    "x-amz-grant-read-acp",
    "x-amz-grant-write",
    "x-amz-grant-write-acp",
    "x-amz-website-redirect-location",
    "x-amz-object-lock-mode",
    "x-amz-object-lock-retain-until-date",
    "x-amz-object-lock-legal-hold",
    "x-amz-server-side-encryption-aws-kms-key-id",
    "x-amz-server-side-encryption-context",
    "x-amz-server-side-encryption-bucket-key-enabled",
];

/// Canned ACLs R2 accepts and ignores.
const CANNED_ACLS: &[&str] = &[
    "private",
    "public-read",
    "public-read-write",
    "authenticated-read",
    "aws-exec-read",
    "bucket-owner-read",
    "bucket-owner-full-control",
];

fn not_implemented_header(name: &str, value: &str) -> S3Error {
    error(
        StatusCode::NOT_IMPLEMENTED,
        "NotImplemented",
        format!("Header '{name}' with value '{value}' not implemented"),
    )
}

/// R2's header screening for an authenticated request: what it does not implement is refused
/// with 501 rather than silently ignored; canned ACLs and SSE-S3 (always on) are accepted.
fn screen_headers(operation: &str, headers: &axum::http::HeaderMap) -> S3Result<()> {
    let value = |name: &str| headers.get(name).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let writes = matches!(operation, "PutObject" | "CopyObject" | "CreateMultipartUpload");
    if writes {
        for name in WRITE_HEADERS_NOT_IMPLEMENTED {
            if let Some(v) = value(name) {
                return Err(not_implemented_header(name, &v));
            }
        }
        if let Some(acl) = value("x-amz-acl")
            && !CANNED_ACLS.contains(&acl.as_str())
        {
            return Err(not_implemented_header("x-amz-acl", &acl));
        }
    }
    if operation == "CopyObject" {
        for name in ["x-amz-source-expected-bucket-owner", "x-amz-tagging-directive", "x-amz-checksum-algorithm"] {
            if let Some(v) = value(name) {
                return Err(not_implemented_header(name, &v));
            }
        }
    }
    if (writes || operation == "UploadPart")
        && let Some(sse) = value("x-amz-server-side-encryption")
        && (operation == "UploadPart" || sse != "AES256")
    {
        return Err(not_implemented_header("x-amz-server-side-encryption", &sse));
    }
    if matches!(operation, "DeleteObject" | "DeleteObjects") {
        for name in ["x-amz-mfa", "x-amz-bypass-governance-retention"] {
            // Version-aware cleanup tools send `bypass-governance-retention: true`; with no
            // object lock there is nothing to bypass, so only other values are refused.
            match value(name) {
                Some(v) if name.ends_with("retention") && v.eq_ignore_ascii_case("true") => {}
                Some(v) => return Err(not_implemented_header(name, &v)),
                None => {}
            }
        }
    }
    if let Some(v) = value("x-amz-expected-bucket-owner") {
        return Err(not_implemented_header("x-amz-expected-bucket-owner", &v));
    }
    Ok(())
}

/// Who `access_key` is, if it may do `operation` on `bucket` (`None`: the account root) with
/// these headers.
pub(crate) fn authorize(
    catalog: &Catalog,
    access_key: &str,
    operation: &str,
    bucket: Option<&str>,
    headers: &axum::http::HeaderMap,
) -> S3Result<Caller> {
    let credential = catalog.s3_credential(access_key).map_err(internal)?.ok_or_else(unauthorized)?;
    let allowed = if is_read(operation) { credential.scope.can_read_r2() } else { credential.scope.can_write_r2() };
    let reaches = match bucket {
        None => credential.buckets.is_none() || operation == "ListBuckets",
        Some(bucket) => credential.reaches(bucket),
    };
    if !allowed || !reaches {
        return Err(error(StatusCode::FORBIDDEN, "AccessDenied", "Access Denied"));
    }
    screen_headers(operation, headers)?;
    Ok(Caller(credential))
}

/// Checks scope and bucket reach, and leaves the [`Caller`] for the operation.
pub(crate) struct Scopes {
    pub catalog: Arc<Catalog>,
}

#[async_trait::async_trait]
impl S3Access for Scopes {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let Some(credentials) = cx.credentials() else {
            return Err(error(StatusCode::BAD_REQUEST, "InvalidArgument", "Authorization"));
        };
        let bucket = match cx.s3_path() {
            S3Path::Root => None,
            S3Path::Bucket { bucket } | S3Path::Object { bucket, .. } => Some(bucket.to_string()),
        };
        let caller =
            authorize(&self.catalog, &credentials.access_key, cx.s3_op().name(), bucket.as_deref(), cx.headers())?;
        cx.extensions_mut().insert(caller);
        Ok(())
    }
}
