//! kura's KV engine: Workers KV namespaces — keys holding values with JSON metadata and an
//! optional expiry, under Cloudflare's limits — stored on the R2 engine, one bucket per
//! namespace.
//!
//! - Storage is R2's: each namespace is a bucket of its own under `<data>/kv/`, so a value is
//!   written blob first and row last (small ones inline in the row), its metadata file has one
//!   owner, and every acknowledged write is durable. A key's expiry and metadata travel in the
//!   object's custom metadata.
//! - Reads see every acknowledged write: Workers KV is eventually consistent (a write may take
//!   60 seconds to show elsewhere); here it shows at once, which no program written for
//!   Cloudflare can tell from a lucky read.
//! - Expired keys are never returned. Whoever meets one (a read, a listing, [`Kv::remove_expired`])
//!   removes it, but only if it still holds the version that expired, so a fresh write of the
//!   same key is never taken for it.
//! - Keys list in UTF-8 byte order; a cursor is the last key returned, so keys written between
//!   pages are still seen.

#![deny(missing_docs)]

mod error;

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use futures_util::{Stream, TryStreamExt};
use kura_r2::{ByteStream, GetOptions, ObjectInfo, R2, R2Error, R2Settings};

pub use crate::error::{KvError, Result};

/// Longest key, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 512;
/// Largest value, in bytes.
pub const MAX_VALUE_BYTES: u64 = 25 * 1024 * 1024;
/// Longest metadata, in bytes of its JSON.
pub const MAX_METADATA_BYTES: usize = 1024;
/// Shortest time to live, in seconds.
pub const MIN_EXPIRATION_TTL: i64 = 60;
/// Shortest `cacheTtl`, in seconds.
pub const MIN_CACHE_TTL: i64 = 30;
/// Most keys in one page of a listing.
pub const MAX_LIST_LIMIT: usize = 1000;
/// Most entries one listing looks at: past it, a page full of expired keys ends short, with a
/// cursor (as Cloudflare's pages may).
const MAX_LIST_SCAN: usize = 10_000;

/// Most keys in one bulk read.
pub const MAX_BULK_GET_KEYS: usize = 100;

/// The custom metadata fields of the object that stores an entry.
const EXPIRATION_FIELD: &str = "kv-expiration";
const METADATA_FIELD: &str = "kv-metadata";

/// The time in seconds since the Unix epoch, as this engine sees it.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// One key's entry, without its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: String,
    /// When it expires, in seconds since the Unix epoch.
    pub expiration: Option<i64>,
    /// Its metadata, as JSON text.
    pub metadata: Option<String>,
    /// The value's size in bytes.
    pub size: u64,
    /// The stored version (new on every write): what an expiry removal checks.
    version: String,
}

impl Entry {
    fn from_object(info: ObjectInfo) -> Entry {
        let expiration = info.custom.get(EXPIRATION_FIELD).and_then(|e| e.parse().ok());
        let metadata = info.custom.get(METADATA_FIELD).cloned();
        Entry { key: info.key, expiration, metadata, size: info.size, version: info.version }
    }

    fn expired(&self, now: i64) -> bool {
        self.expiration.is_some_and(|at| at <= now)
    }
}

/// A value being read: its entry and its bytes.
pub struct Value {
    /// The entry.
    pub entry: Entry,
    /// The bytes.
    pub body: ByteStream,
}

impl Value {
    /// The whole value in memory.
    pub async fn bytes(self) -> Result<Bytes> {
        let chunks: Vec<Bytes> = self.body.try_collect().await.map_err(|e| R2Error::storage("reading a value", e))?;
        Ok(chunks.concat().into())
    }
}

/// What a write stores besides the value.
#[derive(Debug, Clone, Default)]
pub struct PutOptions {
    /// When the key expires (see [`Kv::expiration`]).
    pub expiration: Option<i64>,
    /// Metadata, as JSON text (see [`check_metadata`]).
    pub metadata: Option<String>,
    /// The value's length, when the client declared it.
    pub size: Option<u64>,
}

/// What to list.
#[derive(Debug, Clone)]
pub struct ListOptions {
    /// Only keys that start with this.
    pub prefix: String,
    /// Most keys, 1 to 1,000.
    pub limit: usize,
    /// Resume after a previous page ([`KeyPage::cursor`]).
    pub cursor: Option<String>,
}

impl Default for ListOptions {
    fn default() -> Self {
        ListOptions { prefix: String::new(), limit: MAX_LIST_LIMIT, cursor: None }
    }
}

/// One page of keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPage {
    /// The keys, in UTF-8 byte order.
    pub keys: Vec<Entry>,
    /// Whether this is the last page.
    pub list_complete: bool,
    /// Where the next page starts, when this is not the last.
    pub cursor: Option<String>,
}

/// How a bulk read returns values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ValueType {
    /// As text.
    #[default]
    Text,
    /// Parsed as JSON.
    Json,
}

impl ValueType {
    /// Parses a bulk read's `type`.
    pub fn parse(text: &str) -> Result<ValueType> {
        match text {
            "text" => Ok(ValueType::Text),
            "json" => Ok(ValueType::Json),
            other => Err(KvError::InvalidType(other.to_owned())),
        }
    }
}

/// One key of a bulk read: its value (as text or JSON) and entry, or `None` if it holds none.
pub type BulkValue = (String, Option<(serde_json::Value, Entry)>);

/// Checks a key against KV's rules.
pub fn check_key(key: &str) -> Result<()> {
    match key {
        "" => Err(KvError::EmptyKey),
        "." | ".." => Err(KvError::IllegalKey(key.to_owned())),
        _ if key.len() > MAX_KEY_BYTES => Err(KvError::KeyTooLong(key.len())),
        _ => Ok(()),
    }
}

/// Checks metadata — JSON, at most 1,024 bytes written compactly (as `JSON.stringify` writes
/// it, which is what workerd sends) — and answers that compact form, which is what is kept.
pub fn check_metadata(json: &str) -> Result<String> {
    let parsed: serde_json::Value = serde_json::from_str(json).map_err(|e| KvError::MetadataNotJson(e.to_string()))?;
    let compact = parsed.to_string();
    if compact.len() > MAX_METADATA_BYTES {
        return Err(KvError::MetadataTooLarge(compact.len()));
    }
    Ok(compact)
}

/// Checks a `cacheTtl` (accepted and otherwise ignored: every read here is current).
pub fn check_cache_ttl(text: &str) -> Result<()> {
    match text.parse::<f64>() {
        Ok(ttl) if ttl >= MIN_CACHE_TTL as f64 => Ok(()),
        _ => Err(KvError::InvalidCacheTtl(text.to_owned())),
    }
}

/// Parses a list limit: 1 to 1,000.
pub fn parse_list_limit(text: &str) -> Result<usize> {
    match text.trim().parse::<i64>() {
        Ok(n) if n > MAX_LIST_LIMIT as i64 => Err(KvError::LimitTooLarge(text.to_owned())),
        Ok(n) if n >= 1 => Ok(n as usize),
        _ => Err(KvError::LimitTooSmall(text.to_owned())),
    }
}

fn encode_cursor(key: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key)
}

fn decode_cursor(cursor: &str) -> Result<String> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor.trim_end_matches('='))
        .map_err(|_| KvError::InvalidCursor)?;
    String::from_utf8(bytes).map_err(|_| KvError::InvalidCursor)
}

fn system_clock() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// The KV engine of one data directory.
#[derive(Clone)]
pub struct Kv {
    r2: Arc<R2>,
    clock: Clock,
}

impl Kv {
    /// Opens the engine over `root` (created if missing).
    pub fn open(root: std::path::PathBuf, settings: R2Settings) -> Result<Kv> {
        Ok(Kv { r2: Arc::new(R2::open(root, settings)?), clock: Arc::new(system_clock) })
    }

    /// The same engine, telling time by `clock` (tests move it to see keys expire).
    pub fn with_clock(self, clock: Clock) -> Kv {
        Kv { clock, ..self }
    }

    /// The storage underneath (sweeps, figures, shutdown).
    pub fn storage(&self) -> &R2 {
        &self.r2
    }

    /// Now, in seconds since the Unix epoch.
    pub fn now(&self) -> i64 {
        (self.clock)()
    }

    /// The absolute expiry a write asks for with an absolute `expiration` and/or a relative
    /// `expiration_ttl` (which wins when both are given), each as the client sent it.
    pub fn expiration(&self, expiration: Option<&str>, expiration_ttl: Option<&str>) -> Result<Option<i64>> {
        let now = self.now();
        if let Some(text) = expiration_ttl {
            return match text.trim().parse::<i64>() {
                Ok(ttl) if ttl < 1 => Err(KvError::ExpirationTtlNotPositive(text.to_owned())),
                Ok(ttl) if ttl < MIN_EXPIRATION_TTL => Err(KvError::ExpirationTtlTooShort(text.to_owned())),
                Ok(ttl) => Ok(Some(now.saturating_add(ttl))),
                Err(_) => Err(KvError::ExpirationTtlNotPositive(text.to_owned())),
            };
        }
        let Some(text) = expiration else { return Ok(None) };
        match text.trim().parse::<i64>() {
            Ok(at) if at <= now => Err(KvError::ExpirationPast(text.to_owned())),
            Ok(at) if at < now + MIN_EXPIRATION_TTL => Err(KvError::ExpirationTooSoon(text.to_owned())),
            Ok(at) => Ok(Some(at)),
            Err(_) => Err(KvError::ExpirationPast(text.to_owned())),
        }
    }

    /// Creates a namespace's storage.
    pub async fn create_namespace(&self, namespace: &str) -> Result<()> {
        Ok(self.r2.create_bucket(namespace).await?)
    }

    /// Removes a namespace's storage, whatever it holds (once the catalog has forgotten it).
    pub async fn delete_namespace(&self, namespace: &str) -> Result<()> {
        Ok(self.r2.delete_bucket_contents(namespace).await?)
    }

    /// Stores a value under `key`, replacing what it held.
    pub async fn put<S, E>(&self, namespace: &str, key: &str, value: S, options: PutOptions) -> Result<Entry>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Send,
        E: std::fmt::Display,
    {
        check_key(key)?;
        let metadata = options.metadata.as_deref().map(check_metadata).transpose()?;
        if let Some(size) = options.size.filter(|n| *n > MAX_VALUE_BYTES) {
            return Err(KvError::ValueTooLarge(Some(size)));
        }
        let mut custom = BTreeMap::new();
        if let Some(at) = options.expiration {
            custom.insert(EXPIRATION_FIELD.to_owned(), at.to_string());
        }
        if let Some(metadata) = metadata {
            custom.insert(METADATA_FIELD.to_owned(), metadata);
        }
        let put =
            kura_r2::PutOptions { custom, size: options.size, max_size: Some(MAX_VALUE_BYTES), ..Default::default() };
        let info = self.r2.put_object(namespace, key, value, put).await.map_err(|e| match e {
            R2Error::EntityTooLarge => KvError::ValueTooLarge(options.size),
            other => other.into(),
        })?;
        Ok(Entry::from_object(info))
    }

    /// Reads a key's value, or `None` if it holds none (or it expired).
    pub async fn get(&self, namespace: &str, key: &str) -> Result<Option<Value>> {
        check_key(key)?;
        let read = match self.r2.get_object(namespace, key, GetOptions::default()).await {
            Ok(read) => read,
            Err(R2Error::NoSuchKey) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let entry = Entry::from_object(read.info);
        if entry.expired(self.now()) {
            self.remove_later(namespace, vec![entry]);
            return Ok(None);
        }
        Ok(Some(Value { entry, body: read.body }))
    }

    /// A key's entry without its value, or `None`.
    pub async fn head(&self, namespace: &str, key: &str) -> Result<Option<Entry>> {
        check_key(key)?;
        let now = self.now();
        Ok(self.r2.head_object(namespace, key).await?.map(Entry::from_object).filter(|e| !e.expired(now)))
    }

    /// Reads up to 100 keys at once, each as text or JSON, in the order asked; the values may
    /// add up to 25 MiB.
    pub async fn get_many(&self, namespace: &str, keys: Vec<String>, as_type: ValueType) -> Result<Vec<BulkValue>> {
        if keys.is_empty() {
            return Err(KvError::NoKeys);
        }
        if keys.len() > MAX_BULK_GET_KEYS {
            return Err(KvError::TooManyKeys);
        }
        for key in &keys {
            check_key(key)?;
        }
        let mut total = 0u64;
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let Some(value) = self.get(namespace, &key).await? else {
                out.push((key, None));
                continue;
            };
            total += value.entry.size;
            if total > MAX_VALUE_BYTES {
                return Err(KvError::BulkTooLarge);
            }
            let entry = value.entry.clone();
            let bytes = value.bytes().await?;
            let parsed = match as_type {
                ValueType::Text => serde_json::Value::String(String::from_utf8_lossy(&bytes).into_owned()),
                ValueType::Json => serde_json::from_slice(&bytes).map_err(|_| KvError::NotJson)?,
            };
            out.push((key, Some((parsed, entry))));
        }
        Ok(out)
    }

    /// Deletes keys (up to 1,000 at once, in one transaction); missing keys are not errors.
    pub async fn delete(&self, namespace: &str, keys: Vec<String>) -> Result<()> {
        for key in &keys {
            check_key(key)?;
        }
        for chunk in keys.chunks(1000) {
            self.r2.delete_objects(namespace, chunk.to_vec()).await?;
        }
        Ok(())
    }

    /// One page of keys.
    pub async fn list(&self, namespace: &str, options: ListOptions) -> Result<KeyPage> {
        if options.prefix.len() > MAX_KEY_BYTES {
            return Err(KvError::KeyTooLong(options.prefix.len()));
        }
        if !(1..=MAX_LIST_LIMIT).contains(&options.limit) {
            return Err(KvError::LimitTooLarge(options.limit.to_string()));
        }
        let mut after = options.cursor.as_deref().map(decode_cursor).transpose()?;
        let now = self.now();
        let (mut keys, mut expired) = (Vec::new(), Vec::new());
        let mut scanned = 0;
        loop {
            let page = self
                .r2
                .list(
                    namespace,
                    kura_r2::ListOptions {
                        prefix: options.prefix.clone(),
                        start_after: after.clone(),
                        limit: options.limit,
                        ..Default::default()
                    },
                )
                .await?;
            let listed = page.objects.len();
            scanned += listed;
            for (i, object) in page.objects.into_iter().enumerate() {
                let entry = Entry::from_object(object);
                after = Some(entry.key.clone());
                if entry.expired(now) {
                    expired.push(entry);
                } else {
                    keys.push(entry);
                }
                if keys.len() == options.limit {
                    let more = page.truncated || i + 1 < listed;
                    self.remove_later(namespace, expired);
                    let cursor = more.then(|| encode_cursor(after.as_deref().unwrap_or_default()));
                    return Ok(KeyPage { keys, list_complete: !more, cursor });
                }
            }
            if !page.truncated {
                self.remove_later(namespace, expired);
                return Ok(KeyPage { keys, list_complete: true, cursor: None });
            }
            if scanned >= MAX_LIST_SCAN {
                self.remove_later(namespace, expired);
                let cursor = after.as_deref().map(encode_cursor);
                return Ok(KeyPage { keys, list_complete: false, cursor });
            }
        }
    }

    /// Removes a namespace's expired keys; says how many went.
    pub async fn remove_expired(&self, namespace: &str) -> Result<usize> {
        let (mut removed, mut after) = (0, None);
        loop {
            let options = kura_r2::ListOptions { start_after: after.take(), limit: 1000, ..Default::default() };
            let page = self.r2.list(namespace, options).await?;
            after = page.objects.last().map(|o| o.key.clone());
            let now = self.now();
            let expired: Vec<(String, String)> = page
                .objects
                .into_iter()
                .map(Entry::from_object)
                .filter(|e| e.expired(now))
                .map(|e| (e.key, e.version))
                .collect();
            if !expired.is_empty() {
                removed += self.r2.delete_versions(namespace, expired).await?;
            }
            if !page.truncated || after.is_none() {
                return Ok(removed);
            }
        }
    }

    /// Removes expired entries met by a read, after it has answered.
    fn remove_later(&self, namespace: &str, expired: Vec<Entry>) {
        if expired.is_empty() {
            return;
        }
        let (r2, namespace) = (Arc::clone(&self.r2), namespace.to_owned());
        let versions: Vec<(String, String)> = expired.into_iter().map(|e| (e.key, e.version)).collect();
        tokio::spawn(async move {
            for chunk in versions.chunks(1000) {
                if let Err(e) = r2.delete_versions(&namespace, chunk.to_vec()).await {
                    tracing::debug!(namespace, error = %e, "could not remove expired keys (the sweep will)");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests;
