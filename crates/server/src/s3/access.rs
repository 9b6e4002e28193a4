//! Who may do what over S3: secret keys come from the catalog (derived from API tokens as R2
//! derives them, or pinned by configuration); each operation needs R2 read or write scope and
//! a key that reaches the bucket.

use std::sync::Arc;

use axum::http::StatusCode;
use kura_catalog::{Catalog, S3Credential};
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::path::S3Path;
use s3s::{S3Error, S3ErrorCode, S3Result};

/// The authenticated key of a request, for the operations to read.
#[derive(Debug, Clone)]
pub(crate) struct Caller(pub S3Credential);

pub(crate) fn error(status: StatusCode, code: &str, message: impl Into<String>) -> S3Error {
    let mut e =
        S3Error::with_message(code.parse::<S3ErrorCode>().unwrap_or(S3ErrorCode::InternalError), message.into());
    e.set_status_code(status);
    e
}

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
        let credential =
            self.catalog.s3_credential(&credentials.access_key).map_err(internal)?.ok_or_else(unauthorized)?;
        let operation = cx.s3_op().name();
        let allowed = if is_read(operation) { credential.scope.can_read_r2() } else { credential.scope.can_write_r2() };
        let reaches = match cx.s3_path() {
            S3Path::Root => credential.buckets.is_none() || operation == "ListBuckets",
            S3Path::Bucket { bucket } | S3Path::Object { bucket, .. } => credential.reaches(bucket),
        };
        if !allowed || !reaches {
            return Err(error(StatusCode::FORBIDDEN, "AccessDenied", "Access Denied"));
        }
        cx.extensions_mut().insert(Caller(credential));
        Ok(())
    }
}
