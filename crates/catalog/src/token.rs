//! API tokens: secrets that authenticate API calls for one account, stored only as hashes, each
//! with a scope like Cloudflare's token permissions.

use std::fmt;
use std::str::FromStr;

use rusqlite::OptionalExtension;
use sha2::{Digest, Sha256};

use crate::{Catalog, Error, Result, now_iso, random_hex};

/// What a token may do, after Cloudflare's permission groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scope {
    /// Everything in the account.
    Admin,
    /// Read D1 databases: list, inspect, run statements that do not write.
    D1Read,
    /// Read and write D1 databases: create, delete, run any statement.
    D1Write,
    /// Read R2 buckets and objects (R2's "Object Read only").
    R2Read,
    /// Read and write R2 buckets and objects (R2's "Admin Read & Write").
    R2Write,
    /// Read Durable Object namespaces and their objects' storage (run read-only statements,
    /// list, export, fan-out queries).
    DoRead,
    /// Create namespaces and read and write Durable Objects' storage.
    DoWrite,
    /// Read KV namespaces and their keys and values (Cloudflare's "Workers KV Storage Read").
    KvRead,
    /// Create, rename and delete KV namespaces, write and delete keys ("Workers KV Storage Edit").
    KvWrite,
    /// Read queues and their backlogs (Cloudflare's "Queues Read").
    QueuesRead,
    /// Create, change and delete queues and consumers, send, pull and acknowledge messages
    /// ("Queues Edit").
    QueuesWrite,
}

impl Scope {
    /// Whether a token with this scope may read D1.
    pub fn can_read_d1(self) -> bool {
        matches!(self, Scope::Admin | Scope::D1Read | Scope::D1Write)
    }

    /// Whether a token with this scope may change D1 databases and their data.
    pub fn can_write_d1(self) -> bool {
        matches!(self, Scope::Admin | Scope::D1Write)
    }

    /// Whether a token with this scope may read R2 buckets and objects.
    pub fn can_read_r2(self) -> bool {
        matches!(self, Scope::Admin | Scope::R2Read | Scope::R2Write)
    }

    /// Whether a token with this scope may create, change and delete R2 buckets and objects.
    pub fn can_write_r2(self) -> bool {
        matches!(self, Scope::Admin | Scope::R2Write)
    }

    /// Whether a token with this scope may read Durable Objects.
    pub fn can_read_do(self) -> bool {
        matches!(self, Scope::Admin | Scope::DoRead | Scope::DoWrite)
    }

    /// Whether a token with this scope may change namespaces and Durable Objects' storage.
    pub fn can_write_do(self) -> bool {
        matches!(self, Scope::Admin | Scope::DoWrite)
    }

    /// Whether a token with this scope may read KV namespaces.
    pub fn can_read_kv(self) -> bool {
        matches!(self, Scope::Admin | Scope::KvRead | Scope::KvWrite)
    }

    /// Whether a token with this scope may change KV namespaces and their keys.
    pub fn can_write_kv(self) -> bool {
        matches!(self, Scope::Admin | Scope::KvWrite)
    }

    /// Whether a token with this scope may read queues.
    pub fn can_read_queues(self) -> bool {
        matches!(self, Scope::Admin | Scope::QueuesRead | Scope::QueuesWrite)
    }

    /// Whether a token with this scope may change queues and their messages.
    pub fn can_write_queues(self) -> bool {
        matches!(self, Scope::Admin | Scope::QueuesWrite)
    }

    /// Every scope, for help texts.
    pub const ALL: &'static [Scope] = &[
        Scope::Admin,
        Scope::D1Read,
        Scope::D1Write,
        Scope::R2Read,
        Scope::R2Write,
        Scope::DoRead,
        Scope::DoWrite,
        Scope::KvRead,
        Scope::KvWrite,
        Scope::QueuesRead,
        Scope::QueuesWrite,
    ];
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scope::Admin => "admin",
            Scope::D1Read => "d1:read",
            Scope::D1Write => "d1:write",
            Scope::R2Read => "r2:read",
            Scope::R2Write => "r2:write",
            Scope::DoRead => "do:read",
            Scope::DoWrite => "do:write",
            Scope::KvRead => "kv:read",
            Scope::KvWrite => "kv:write",
            Scope::QueuesRead => "queues:read",
            Scope::QueuesWrite => "queues:write",
        })
    }
}

impl FromStr for Scope {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "admin" => Ok(Scope::Admin),
            "d1:read" => Ok(Scope::D1Read),
            "d1:write" => Ok(Scope::D1Write),
            "r2:read" => Ok(Scope::R2Read),
            "r2:write" => Ok(Scope::R2Write),
            "do:read" => Ok(Scope::DoRead),
            "do:write" => Ok(Scope::DoWrite),
            "kv:read" => Ok(Scope::KvRead),
            "kv:write" => Ok(Scope::KvWrite),
            "queues:read" => Ok(Scope::QueuesRead),
            "queues:write" => Ok(Scope::QueuesWrite),
            other => Err(Error::Invalid(format!(
                "unknown scope '{other}': use admin, d1:read, d1:write, r2:read, r2:write, do:read, do:write, kv:read, \
                 kv:write, queues:read or queues:write"
            ))),
        }
    }
}

/// A token as the catalog keeps it (never the secret itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// 32 hex characters, shown in listings and used to revoke.
    pub id: String,
    /// The account the token acts for.
    pub account_id: String,
    /// A human name.
    pub name: String,
    /// What the token may do.
    pub scope: Scope,
    /// ISO 8601 creation time.
    pub created_at: String,
    /// ISO 8601 revocation time, if revoked.
    pub revoked_at: Option<String>,
    /// The R2 buckets it is limited to; `None` for all.
    pub buckets: Option<Vec<String>>,
}

/// Characters of generated secrets: URL- and header-safe, as Cloudflare's 40-character tokens.
const SECRET_ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn new_secret() -> String {
    let mut bytes = [0u8; 40];
    getrandom::fill(&mut bytes).expect("the operating system's random source failed");
    bytes.iter().map(|b| SECRET_ALPHABET[(b & 63) as usize] as char).collect()
}

fn hash(secret: &str) -> String {
    // Every API request hashes its token: `encode_to_slice` writes the digits in one pass,
    // where `hex::encode` pushes them one `char` at a time.
    let mut digits = [0u8; 64];
    hex::encode_to_slice(Sha256::digest(secret.as_bytes()), &mut digits).expect("64 digits for 32 bytes");
    String::from_utf8(digits.to_vec()).expect("hex digits are ASCII")
}

/// The secret access key of the S3 key R2 derives from a token: the SHA-256 (hex) of the
/// token's secret; its access key id is the token's id.
pub fn s3_secret_for(token_secret: &str) -> String {
    hash(token_secret)
}

/// Secrets are sent in an HTTP header: printable ASCII without spaces, long enough to guess badly.
fn check_secret(secret: &str) -> Result<()> {
    if secret.len() < 16 || secret.len() > 256 || !secret.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::Invalid("an API token must be 16 to 256 printable ASCII characters without spaces".into()));
    }
    Ok(())
}

fn token_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Token> {
    let scope: String = row.get(3)?;
    Ok(Token {
        id: row.get(0)?,
        account_id: row.get(1)?,
        name: row.get(2)?,
        scope: scope.parse().map_err(|e: Error| {
            rusqlite::Error::FromSqlConversionFailure(3, rusqlite::types::Type::Text, e.to_string().into())
        })?,
        created_at: row.get(4)?,
        revoked_at: row.get(5)?,
        buckets: crate::r2::decode_buckets(row.get(6)?),
    })
}

const TOKEN_COLUMNS: &str = "id, account_id, name, scope, created_at, revoked_at, buckets";

impl Catalog {
    /// Creates a token for an account and returns it with its secret, which is not stored and
    /// cannot be shown again. With `secret`, the token uses exactly that secret.
    pub fn create_token(
        &self,
        account_id: &str,
        name: &str,
        scope: Scope,
        secret: Option<&str>,
    ) -> Result<(Token, String)> {
        self.create_limited_token(account_id, name, scope, secret, None)
    }

    /// Creates a token as [`Catalog::create_token`] does, limited to `buckets` (R2, and the S3
    /// key derived from it) in the same transaction, so no crash leaves it unlimited.
    pub fn create_limited_token(
        &self,
        account_id: &str,
        name: &str,
        scope: Scope,
        secret: Option<&str>,
        buckets: Option<&[String]>,
    ) -> Result<(Token, String)> {
        if let Some(names) = buckets
            && (names.is_empty() || names.iter().any(|n| n.is_empty() || n.contains('\n')))
        {
            return Err(Error::Invalid("a bucket limit names one or more buckets".into()));
        }
        let secret = match secret {
            Some(s) => {
                check_secret(s)?;
                s.to_owned()
            }
            None => new_secret(),
        };
        let token = Token {
            id: random_hex(16),
            account_id: account_id.to_owned(),
            name: name.to_owned(),
            scope,
            created_at: now_iso(),
            revoked_at: None,
            buckets: buckets.map(<[String]>::to_vec),
        };
        self.write_checked(|tx| {
            let known: Option<String> = tx
                .query_row("SELECT id FROM accounts WHERE id = ?1", [account_id], |r| r.get(0))
                .optional()
                .map_err(|e| self.storage(e))?;
            if known.is_none() {
                return Err(Error::Invalid(format!("no account '{account_id}'")));
            }
            let taken: bool = tx
                .query_row("SELECT 1 FROM tokens WHERE secret_hash = ?1", [hash(&secret)], |_| Ok(true))
                .optional()
                .map_err(|e| self.storage(e))?
                .unwrap_or(false);
            if taken {
                return Err(Error::Conflict("that token secret is already in use".into()));
            }
            tx.execute(
                "INSERT INTO tokens (id, account_id, name, secret_hash, scope, created_at, buckets) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                (
                    &token.id,
                    &token.account_id,
                    &token.name,
                    hash(&secret),
                    token.scope.to_string(),
                    &token.created_at,
                    crate::r2::encode_buckets(buckets),
                ),
            )
            .map_err(|e| self.storage(e))?;
            Ok(())
        })?;
        Ok((token, secret))
    }

    /// Makes sure `secret` is an admin token of `account_id` (used for `KURA_API_TOKEN`).
    pub fn ensure_admin_token(&self, account_id: &str, secret: &str) -> Result<Token> {
        check_secret(secret)?;
        if let Some(token) = self.token_by_secret(secret)? {
            if token.account_id != account_id {
                return Err(Error::Conflict(format!(
                    "the configured API token belongs to account '{}', not '{account_id}'",
                    token.account_id
                )));
            }
            if token.revoked_at.is_some() || token.scope != Scope::Admin {
                self.write(|tx| {
                    tx.execute("UPDATE tokens SET revoked_at = NULL, scope = 'admin' WHERE id = ?1", [&token.id])
                })?;
                return Ok(Token { revoked_at: None, scope: Scope::Admin, ..token });
            }
            return Ok(token);
        }
        Ok(self.create_token(account_id, "configured admin token", Scope::Admin, Some(secret))?.0)
    }

    fn token_by_secret(&self, secret: &str) -> Result<Option<Token>> {
        self.token_by_hash(&hash(secret))
    }

    fn token_by_hash(&self, hashed: &str) -> Result<Option<Token>> {
        self.read_found(|c| {
            c.prepare_cached(&format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE secret_hash = ?1"))?
                .query_row([hashed], token_from_row)
                .optional()
        })
    }

    /// The live token whose secret this is, if any. A token found live is remembered while the
    /// catalog's version stays the same, so a revocation by any process or node is seen by the
    /// next request.
    pub fn authenticate(&self, secret: &str) -> Result<Option<Token>> {
        let hashed = hash(secret);
        self.remembered(&self.tokens_seen, hashed.clone(), || {
            Ok(self.token_by_hash(&hashed)?.filter(|t| t.revoked_at.is_none()))
        })
    }

    /// The tokens of an account, oldest first, revoked ones included.
    pub fn tokens(&self, account_id: &str) -> Result<Vec<Token>> {
        self.read(|c| {
            c.prepare_cached(&format!(
                "SELECT {TOKEN_COLUMNS} FROM tokens WHERE account_id = ?1 ORDER BY created_at, rowid"
            ))?
            .query_map([account_id], token_from_row)?
            .collect()
        })
    }

    /// Revokes a token of an account; false if the account has no such live token.
    pub fn revoke_token(&self, account_id: &str, token_id: &str) -> Result<bool> {
        let changed = self.write(|tx| {
            tx.execute(
                "UPDATE tokens SET revoked_at = ?3 WHERE id = ?1 AND account_id = ?2 AND revoked_at IS NULL",
                (token_id, account_id, now_iso()),
            )
        })?;
        Ok(changed == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_forty_safe_characters() {
        let s = new_secret();
        assert_eq!(s.len(), 40);
        assert!(s.bytes().all(|b| SECRET_ALPHABET.contains(&b)));
        assert_ne!(s, new_secret());
    }

    #[test]
    fn scopes_round_trip() {
        for scope in Scope::ALL {
            assert_eq!(scope.to_string().parse::<Scope>().unwrap(), *scope);
        }
        assert!("root".parse::<Scope>().is_err());
        assert!(Scope::D1Write.can_read_d1() && !Scope::D1Read.can_write_d1());
    }
}
