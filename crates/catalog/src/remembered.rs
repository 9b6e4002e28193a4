//! Catalog rows lately read, kept as of one version of the file (see `Catalog::version`), for
//! the lookups every request makes: its token, and the D1 database or Durable Object namespace
//! it names. Reading one back is a SQLite read transaction on the one reader connection, which
//! costs more than a point SELECT's own work; one `pread` of the change mark says whether what
//! is remembered may still be used.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Entries remembered at most; past it the memory starts over.
const ENTRIES: usize = 1024;

/// How long a read is trusted even with no change marked: the bound on a change (a token's
/// revocation, a namespace's deletion) by a writer that could not mark it.
pub(crate) const TRUSTED_FOR: Duration = Duration::from_secs(1);

/// One kind of row, by a key its lookup derives, all read at one version of the catalog.
pub(crate) struct Remembered<V> {
    inner: Mutex<Inner<V>>,
}

struct Inner<V> {
    version: (u64, u64),
    entries: HashMap<String, (V, Instant)>,
}

impl<V: Clone> Remembered<V> {
    /// The row under `key` if it was read at `version` lately. A different version forgets
    /// everything read before it.
    pub(crate) fn get(&self, key: &str, version: (u64, u64)) -> Option<V> {
        let mut inner = self.lock();
        if inner.version != version {
            inner.entries.clear();
            inner.version = version;
            return None;
        }
        let (value, read_at) = inner.entries.get(key)?;
        (read_at.elapsed() < TRUSTED_FOR).then(|| value.clone())
    }

    /// Remembers a row read at `version` (the version read before the row, so a change made
    /// between the two is never filed under the version from before it).
    pub(crate) fn put(&self, key: String, version: (u64, u64), value: V) {
        let mut inner = self.lock();
        if inner.version != version {
            return;
        }
        if inner.entries.len() >= ENTRIES {
            inner.entries.clear();
        }
        inner.entries.insert(key, (value, Instant::now()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<V>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<V> Default for Remembered<V> {
    fn default() -> Self {
        Remembered { inner: Mutex::new(Inner { version: (0, 0), entries: HashMap::new() }) }
    }
}
