//! The registry of R2 buckets (which account owns which bucket, under which storage id) and the
//! S3 credentials that reach them.
//!
//! S3 credentials are derived from API tokens exactly as R2 derives them: the access key id is
//! the token's id and the secret access key is the SHA-256 (hex) of the token's secret, which is
//! what the catalog stores. Pairs pinned by configuration (`KURA_S3_ACCESS_KEY_ID`) live in a
//! table of their own.

use rusqlite::OptionalExtension;

use crate::{Catalog, Error, Result, Scope, now_iso, random_hex};

/// An R2 bucket as the catalog records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct R2Bucket {
    /// The storage id: 32 hex characters naming the bucket's directory. Never derived from the
    /// name, so a deleted and recreated bucket never sees its predecessor's files.
    pub id: String,
    /// The owning account.
    pub account_id: String,
    /// The name, unique within the account.
    pub name: String,
    /// ISO 8601 creation time.
    pub created_at: String,
    /// The location hint given at creation (`enam`, `weur`, …), kept for the API's sake.
    pub location: Option<String>,
    /// The default storage class: `Standard` or `InfrequentAccess`.
    pub storage_class: String,
}

/// An S3 access key: who it acts for, its secret, and what it may reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Credential {
    /// The access key id.
    pub access_key_id: String,
    /// The account it acts for.
    pub account_id: String,
    /// The secret access key that signs requests.
    pub secret_access_key: String,
    /// What it may do.
    pub scope: Scope,
    /// The buckets it may reach; `None` for all of the account's buckets.
    pub buckets: Option<Vec<String>>,
}

impl S3Credential {
    /// Whether this key may reach the bucket `name` at all.
    pub fn reaches(&self, name: &str) -> bool {
        self.buckets.as_ref().is_none_or(|names| names.iter().any(|n| n == name))
    }
}

/// R2's bucket name rule: 3 to 63 of `a-z`, `0-9` and `-`, starting and ending with a letter or
/// digit.
pub fn is_valid_bucket_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (3..=63).contains(&bytes.len())
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

const BUCKET_COLUMNS: &str = "id, account_id, name, created_at, location, storage_class";

fn bucket_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<R2Bucket> {
    Ok(R2Bucket {
        id: row.get(0)?,
        account_id: row.get(1)?,
        name: row.get(2)?,
        created_at: row.get(3)?,
        location: row.get(4)?,
        storage_class: row.get(5)?,
    })
}

/// Bucket lists are kept as newline-separated names (bucket names hold no newline).
pub(crate) fn encode_buckets(buckets: Option<&[String]>) -> Option<String> {
    buckets.map(|names| names.join("\n"))
}

pub(crate) fn decode_buckets(text: Option<String>) -> Option<Vec<String>> {
    text.map(|t| t.split('\n').filter(|n| !n.is_empty()).map(str::to_owned).collect())
}

impl Catalog {
    /// Registers a new bucket for an account.
    pub fn create_r2_bucket(
        &self,
        account_id: &str,
        name: &str,
        location: Option<&str>,
        storage_class: Option<&str>,
    ) -> Result<R2Bucket> {
        if !is_valid_bucket_name(name) {
            return Err(Error::Invalid(format!(
                "invalid bucket name '{name}': use 3 to 63 lowercase letters, digits or '-', \
                 starting and ending with a letter or digit"
            )));
        }
        let storage_class = storage_class.unwrap_or("Standard");
        if !matches!(storage_class, "Standard" | "InfrequentAccess") {
            return Err(Error::Invalid(format!(
                "invalid storage class '{storage_class}': use Standard or InfrequentAccess"
            )));
        }
        let bucket = R2Bucket {
            id: random_hex(16),
            account_id: account_id.to_owned(),
            name: name.to_owned(),
            created_at: now_iso(),
            location: location.map(str::to_ascii_lowercase),
            storage_class: storage_class.to_owned(),
        };
        self.write_checked(|tx| {
            let storage = |e| self.storage(e);
            let taken = tx
                .query_row("SELECT 1 FROM r2_buckets WHERE account_id = ?1 AND name = ?2", [account_id, name], |_| {
                    Ok(())
                })
                .optional()
                .map_err(storage)?;
            if taken.is_some() {
                return Err(Error::Duplicate { kind: "bucket" });
            }
            tx.execute(
                &format!("INSERT INTO r2_buckets ({BUCKET_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"),
                (
                    &bucket.id,
                    &bucket.account_id,
                    &bucket.name,
                    &bucket.created_at,
                    &bucket.location,
                    &bucket.storage_class,
                ),
            )
            .map_err(storage)?;
            Ok(())
        })?;
        Ok(bucket)
    }

    /// The account's bucket with this name.
    pub fn r2_bucket(&self, account_id: &str, name: &str) -> Result<Option<R2Bucket>> {
        self.read_found(|c| {
            c.prepare_cached(&format!("SELECT {BUCKET_COLUMNS} FROM r2_buckets WHERE account_id = ?1 AND name = ?2"))?
                .query_row([account_id, name], bucket_from_row)
                .optional()
        })
    }

    /// The account's buckets in name order.
    pub fn list_r2_buckets(&self, account_id: &str) -> Result<Vec<R2Bucket>> {
        self.read_current(|c| {
            c.prepare_cached(&format!("SELECT {BUCKET_COLUMNS} FROM r2_buckets WHERE account_id = ?1 ORDER BY name"))?
                .query_map([account_id], bucket_from_row)?
                .collect()
        })
    }

    /// Every bucket of every account (for start-up sweeps).
    pub fn all_r2_buckets(&self) -> Result<Vec<R2Bucket>> {
        self.read(|c| {
            c.prepare_cached(&format!("SELECT {BUCKET_COLUMNS} FROM r2_buckets ORDER BY id"))?
                .query_map([], bucket_from_row)?
                .collect()
        })
    }

    /// Forgets a bucket; false if the account had no bucket of that name.
    pub fn delete_r2_bucket(&self, account_id: &str, name: &str) -> Result<bool> {
        let changed = self
            .write(|tx| tx.execute("DELETE FROM r2_buckets WHERE account_id = ?1 AND name = ?2", [account_id, name]))?;
        Ok(changed == 1)
    }

    /// Limits a token (and so the S3 key derived from it) to the named buckets, or lifts the
    /// limit with `None`; false if the account has no such token.
    pub fn set_token_buckets(&self, account_id: &str, token_id: &str, buckets: Option<&[String]>) -> Result<bool> {
        let changed = self.write(|tx| {
            tx.execute(
                "UPDATE tokens SET buckets = ?3 WHERE id = ?1 AND account_id = ?2",
                (token_id, account_id, encode_buckets(buckets)),
            )
        })?;
        Ok(changed == 1)
    }

    /// Makes `access_key_id`/`secret` a read-write S3 key for all of an account's buckets (used
    /// for `KURA_S3_ACCESS_KEY_ID` and `KURA_S3_SECRET_ACCESS_KEY`).
    pub fn ensure_s3_key(&self, account_id: &str, access_key_id: &str, secret: &str) -> Result<()> {
        let printable = |s: &str| !s.is_empty() && s.len() <= 256 && s.bytes().all(|b| b.is_ascii_graphic());
        if !printable(access_key_id) || !printable(secret) {
            return Err(Error::Invalid(
                "an S3 access key id and secret must be 1 to 256 printable ASCII characters without spaces".into(),
            ));
        }
        self.write_checked(|tx| {
            let storage = |e| self.storage(e);
            let owner: Option<String> = tx
                .query_row("SELECT account_id FROM s3_keys WHERE access_key_id = ?1", [access_key_id], |r| r.get(0))
                .optional()
                .map_err(storage)?;
            if let Some(owner) = owner.filter(|o| o != account_id) {
                return Err(Error::Conflict(format!(
                    "the configured S3 access key belongs to account '{owner}', not '{account_id}'"
                )));
            }
            tx.execute(
                "INSERT INTO s3_keys (access_key_id, account_id, secret, scope, created_at) VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (access_key_id) DO UPDATE SET secret = excluded.secret, scope = excluded.scope, buckets = NULL",
                (access_key_id, account_id, secret, Scope::R2Write.to_string(), now_iso()),
            )
            .map_err(storage)?;
            Ok(())
        })
    }

    /// The S3 key with this id, if it is live and may reach R2 at all: a pinned key, or else the
    /// key derived from an API token.
    pub fn s3_credential(&self, access_key_id: &str) -> Result<Option<S3Credential>> {
        let found = self.read_found(|c| {
            let pinned = c
                .prepare_cached("SELECT account_id, secret, scope, buckets FROM s3_keys WHERE access_key_id = ?1")?
                .query_row([access_key_id], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get(3)?))
                })
                .optional()?;
            if pinned.is_some() {
                return Ok(pinned);
            }
            c.prepare_cached(
                "SELECT account_id, secret_hash, scope, buckets FROM tokens WHERE id = ?1 AND revoked_at IS NULL",
            )?
            .query_row([access_key_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .optional()
        })?;
        let Some((account_id, secret_access_key, scope, buckets)) = found else { return Ok(None) };
        let scope: Scope = scope.parse()?;
        if !scope.can_read_r2() {
            return Ok(None);
        }
        Ok(Some(S3Credential {
            access_key_id: access_key_id.to_owned(),
            account_id,
            secret_access_key,
            scope,
            buckets: decode_buckets(buckets),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names_follow_r2() {
        for good in ["abc", "my-bucket-1", "0a0", &"a".repeat(63)] {
            assert!(is_valid_bucket_name(good), "{good}");
        }
        for bad in ["ab", "-ab", "ab-", "Abc", "a.b", "a_b", &"a".repeat(64), "ab\u{e9}"] {
            assert!(!is_valid_bucket_name(bad), "{bad}");
        }
    }
}
