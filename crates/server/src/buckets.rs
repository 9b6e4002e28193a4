//! Creating and deleting R2 buckets: the catalog names them, the engine stores them. One place
//! for both surfaces (S3 and the v4 API), so they order the two steps the same way.

use kura_catalog::{Catalog, R2Bucket};
use kura_r2::{R2, R2Error};

/// Why a bucket could not be created or deleted.
#[derive(Debug, thiserror::Error)]
pub enum BucketError {
    /// The name breaks R2's rule.
    #[error("{0}")]
    InvalidName(String),
    /// The account already has a bucket of that name.
    #[error("The bucket you tried to create already exists, and you own it.")]
    Exists,
    /// The account has no bucket of that name.
    #[error("The specified bucket does not exist.")]
    NotFound,
    /// The catalog failed.
    #[error(transparent)]
    Catalog(kura_catalog::Error),
    /// The engine failed or refused (a bucket that is not empty).
    #[error(transparent)]
    Engine(#[from] R2Error),
}

impl From<kura_catalog::Error> for BucketError {
    fn from(e: kura_catalog::Error) -> Self {
        match e {
            kura_catalog::Error::Invalid(m) => BucketError::InvalidName(m),
            kura_catalog::Error::Duplicate { .. } => BucketError::Exists,
            other => BucketError::Catalog(other),
        }
    }
}

/// Registers the bucket, then creates its storage; a failed storage step unregisters it.
pub async fn create(
    catalog: &Catalog,
    r2: &R2,
    account_id: &str,
    name: &str,
    location: Option<&str>,
    storage_class: Option<&str>,
) -> Result<R2Bucket, BucketError> {
    let bucket = catalog.create_r2_bucket(account_id, name, location, storage_class)?;
    if let Err(e) = r2.create_bucket(&bucket.id).await {
        let _ = catalog.delete_r2_bucket(account_id, name);
        return Err(e.into());
    }
    Ok(bucket)
}

/// Deletes an empty bucket: its storage is marked deleted in one step with the check that it
/// is empty (no write gets in after), the catalog forgets it, then its files go.
pub async fn delete(catalog: &Catalog, r2: &R2, account_id: &str, name: &str) -> Result<(), BucketError> {
    let bucket = catalog.r2_bucket(account_id, name)?.ok_or(BucketError::NotFound)?;
    r2.mark_deleted(&bucket.id).await?;
    if let Err(e) = catalog.delete_r2_bucket(account_id, name) {
        let _ = r2.unmark_deleted(&bucket.id).await;
        return Err(e.into());
    }
    // Should this fail, the files are left for the start-up sweep, which removes the storage of
    // buckets the catalog no longer names.
    if let Err(e) = r2.delete_bucket_contents(&bucket.id).await {
        tracing::warn!(bucket = name, error = %e, "could not remove a deleted bucket's files");
    }
    Ok(())
}
