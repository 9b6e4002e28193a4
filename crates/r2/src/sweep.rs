//! Sweeping: what a crash or a failed removal leaves behind (orphan blobs, the files of a
//! bucket whose deletion was cut short, expired multipart uploads) is found and removed.

use std::collections::HashSet;

use crate::error::{R2Error, Result};

use crate::options::SweepReport;
use crate::{R2, meta, now_ms, valid_bucket_id};

impl R2 {
    /// Aborts expired uploads and removes blobs no row points at (left by a crash between a
    /// blob's sync and its row's commit, or by a failed removal).
    pub async fn sweep(&self, bucket: &str) -> Result<SweepReport> {
        let expiry = self.settings.upload_expiry.as_millis() as i64;
        // A shared store's blobs are listed before the rows are read (see `Blobs::orphans`).
        let listed = self.blobs.list_shared(bucket).await.map_err(|e| R2Error::storage("listing blobs", e))?;
        let expired_uploads = self
            .commit(bucket, None, move |tx| {
                meta::ensure_schema(tx)?;
                let expired: Vec<String> = tx
                    .prepare_cached("SELECT upload_id FROM uploads WHERE state = 0 AND created <= ?1")?
                    .query_map([now_ms() - expiry], |r| r.get(0))?
                    .collect::<rusqlite::Result<_>>()?;
                let mut removed = Vec::new();
                for id in &expired {
                    meta::set_upload_state(tx, id, meta::ABORTED)?;
                    removed.extend(meta::remove_parts(tx, id)?);
                }
                // Finished uploads are remembered a while for their error messages, then forgotten.
                tx.execute("DELETE FROM uploads WHERE state != 0 AND created <= ?1", [now_ms() - 2 * expiry])?;
                Ok((expired.len(), removed))
            })
            .await?;
        let (blobs, bucket_id) = (self.blobs.clone(), bucket.to_owned());
        let swept = self
            .on_bucket(bucket, move |conn| {
                let referenced = meta::referenced_blobs(conn)?;
                match blobs.is_shared() {
                    true => Ok(Err(blobs.orphans(listed, &referenced))),
                    false => Ok(Ok(blobs
                        .sweep(&bucket_id, &referenced)
                        .map_err(|e| R2Error::storage("sweeping blobs", e))?)),
                }
            })
            .await?;
        let orphans = match swept {
            Ok(removed) => removed,
            Err(orphans) => {
                self.blobs.remove_shared(bucket, &orphans).await.map_err(|e| R2Error::storage("sweeping blobs", e))?;
                orphans.len()
            }
        };
        if orphans > 0 {
            tracing::info!(bucket, orphans, "removed orphan blobs");
        }
        Ok(SweepReport { orphans, expired_uploads })
    }

    /// Removes the storage of buckets `known` does not name (left when a deletion was cut short).
    /// List the directories before reading the catalog, so that a bucket created meanwhile is
    /// not among them: call with the directories from [`R2::bucket_dirs`], then the catalog's ids.
    /// In a cluster, only this node's copy goes: the bucket was deleted by its owner, who
    /// removed what the store held.
    pub async fn remove_unknown_buckets(&self, dirs: Vec<String>, known: &HashSet<String>) -> Result<usize> {
        let mut removed = 0;
        for dir in dirs.into_iter().filter(|d| valid_bucket_id(d) && !known.contains(d)) {
            tracing::info!(bucket = dir, "removing the storage of a deleted bucket");
            match self.settings.shared {
                Some(_) => {
                    self.registry.retire(&dir).await;
                    self.blobs.remove_bucket(&dir).map_err(|e| R2Error::storage("removing a bucket", e))?;
                }
                None => self.delete_bucket_contents(&dir).await?,
            }
            removed += 1;
        }
        Ok(removed)
    }

    /// The bucket directories on disk.
    pub fn bucket_dirs(&self) -> Result<Vec<String>> {
        self.blobs.bucket_dirs().map_err(|e| R2Error::storage("listing buckets", e))
    }
}
