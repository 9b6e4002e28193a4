//! Listing a bucket in UTF-8 byte order with a prefix, a delimiter that folds keys into common
//! prefixes, a start-after key and an opaque cursor.

use base64::Engine as _;
use rusqlite::Connection;

use crate::error::{R2Error, Result};
use crate::meta::{OBJECT_COLUMNS, object_from_row};
use crate::object::ObjectInfo;

/// Most entries (objects plus common prefixes) in one page.
pub const MAX_LIST_LIMIT: usize = 1000;

/// What to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListOptions {
    /// Only keys that start with this.
    pub prefix: String,
    /// Fold keys that hold this after the prefix into one common prefix each.
    pub delimiter: Option<String>,
    /// Only keys after this one.
    pub start_after: Option<String>,
    /// Resume after a previous page ([`Listing::cursor`]).
    pub cursor: Option<String>,
    /// Most entries (objects plus common prefixes), 0 to 1,000.
    pub limit: usize,
}

/// One page of a listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// The objects, in key order.
    pub objects: Vec<ObjectInfo>,
    /// The common prefixes, each ending with the delimiter, in order.
    pub prefixes: Vec<String>,
    /// Whether more entries follow.
    pub truncated: bool,
    /// Where the next page starts, when truncated.
    pub cursor: Option<String>,
}

/// A lower bound on keys.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Bound {
    key: Vec<u8>,
    inclusive: bool,
}

impl Bound {
    fn later(self, other: Bound) -> Bound {
        match self.key.cmp(&other.key) {
            std::cmp::Ordering::Less => other,
            std::cmp::Ordering::Greater => self,
            std::cmp::Ordering::Equal => Bound { key: self.key, inclusive: self.inclusive && other.inclusive },
        }
    }

    fn encode(&self) -> String {
        let mut bytes = Vec::with_capacity(self.key.len() + 1);
        bytes.push(if self.inclusive { b'i' } else { b'x' });
        bytes.extend_from_slice(&self.key);
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    fn decode(cursor: &str) -> Result<Bound> {
        let bad = || R2Error::InvalidArgument("The continuation token provided is incorrect".into());
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?;
        match bytes.split_first() {
            Some((b'i', key)) => Ok(Bound { key: key.to_vec(), inclusive: true }),
            Some((b'x', key)) => Ok(Bound { key: key.to_vec(), inclusive: false }),
            _ => Err(bad()),
        }
    }
}

/// The smallest byte string after every string that starts with `prefix`.
fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut out = prefix.to_vec();
    while let Some(last) = out.pop() {
        if last < 0xff {
            out.push(last + 1);
            return Some(out);
        }
    }
    None
}

/// Lists one page. Runs on the bucket's actor.
pub(crate) fn list(conn: &Connection, options: &ListOptions) -> Result<Listing> {
    let limit = options.limit.min(MAX_LIST_LIMIT);
    let prefix = options.prefix.as_bytes();
    let delimiter = options.delimiter.as_deref().filter(|d| !d.is_empty());
    let mut lower = Bound { key: prefix.to_vec(), inclusive: true };
    // A common prefix at or before the start-after key was listed on an earlier page (a V1
    // marker is the last key or common prefix returned): it is not listed again.
    let after = options.start_after.as_deref().map(str::as_bytes);
    if let Some(after) = &options.start_after {
        lower = lower.later(Bound { key: after.as_bytes().to_vec(), inclusive: false });
    }
    if let Some(cursor) = &options.cursor {
        lower = lower.later(Bound::decode(cursor)?);
    }
    let mut listing = Listing::default();
    let mut entries = 0usize;
    let mut last: Option<Bound> = None;
    let mut stmt_inclusive =
        conn.prepare_cached(&format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE key >= ?1 ORDER BY key LIMIT ?2"))?;
    let mut stmt_exclusive =
        conn.prepare_cached(&format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE key > ?1 ORDER BY key LIMIT ?2"))?;
    'scan: loop {
        let batch = (limit - entries + 1).min(MAX_LIST_LIMIT + 1) as i64;
        let stmt = if lower.inclusive { &mut stmt_inclusive } else { &mut stmt_exclusive };
        let rows: Vec<_> =
            stmt.query_map(rusqlite::params![lower.key, batch], object_from_row)?.collect::<rusqlite::Result<_>>()?;
        if rows.is_empty() {
            break;
        }
        let exhausted = (rows.len() as i64) < batch;
        for row in rows {
            let key = row.info.key.as_bytes();
            if !key.starts_with(prefix) {
                break 'scan;
            }
            let folded = delimiter.and_then(|d| {
                let rest = &row.info.key[prefix.len()..];
                rest.find(d).map(|at| row.info.key[..prefix.len() + at + d.len()].to_owned())
            });
            if let (Some(common), Some(after)) = (&folded, after)
                && common.as_bytes() <= after
            {
                match successor(common.as_bytes()) {
                    Some(next) => {
                        lower = Bound { key: next, inclusive: true };
                        continue 'scan;
                    }
                    None => break 'scan,
                }
            }
            if entries == limit {
                listing.truncated = true;
                break 'scan;
            }
            entries += 1;
            match folded {
                None => {
                    let info = row.info;
                    lower = Bound { key: info.key.as_bytes().to_vec(), inclusive: false };
                    last = Some(lower.clone());
                    listing.objects.push(info);
                }
                Some(common) => {
                    let Some(next) = successor(common.as_bytes()) else {
                        listing.prefixes.push(common);
                        break 'scan;
                    };
                    lower = Bound { key: next, inclusive: true };
                    last = Some(lower.clone());
                    listing.prefixes.push(common);
                    // Everything under this prefix is folded: resume the scan past it.
                    continue 'scan;
                }
            }
        }
        if exhausted {
            break;
        }
    }
    if listing.truncated {
        listing.cursor = Some(match last {
            Some(bound) => bound.encode(),
            // A limit of 0: nothing returned, so the next page starts where this one did.
            None => lower.encode(),
        });
    }
    Ok(listing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn successor_skips_every_extension() {
        assert_eq!(successor(b"a/"), Some(b"a0".to_vec()));
        assert_eq!(successor(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(successor(b"\xff"), None);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
            kura_testkit::count("KURA_FUZZ_CASES", 2_000)
        ))]

        /// A continuation token from outside decodes to a bound or is refused with S3's
        /// message, never a panic; what decodes encodes back to itself.
        #[test]
        fn any_cursor_decodes_or_is_refused(cursor in "[A-Za-z0-9_-]{0,40}|\\PC{0,40}") {
            match Bound::decode(&cursor) {
                Ok(bound) => proptest::prop_assert_eq!(bound.encode(), cursor),
                Err(e) => proptest::prop_assert!(e.to_string().contains("continuation token")),
            }
        }

        /// Every key's bound survives the round trip, and the listing it starts never panics on
        /// any prefix, delimiter or start-after.
        #[test]
        fn cursors_round_trip_and_list_anywhere(
            key in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            inclusive in proptest::prelude::any::<bool>(),
            prefix in "\\PC{0,6}",
            delimiter in proptest::option::of("\\PC{0,2}"),
            start_after in proptest::option::of("\\PC{0,6}"),
            limit in 0usize..5,
        ) {
            let bound = Bound { key, inclusive };
            let cursor = bound.encode();
            proptest::prop_assert_eq!(Bound::decode(&cursor).unwrap(), bound);
            let conn = fixture();
            let options = ListOptions { prefix, delimiter, start_after, cursor: Some(cursor), limit };
            proptest::prop_assert!(list(&conn, &options).is_ok());
        }
    }

    /// A bucket's metadata with a few keys, for listings to walk.
    fn fixture() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        crate::meta::ensure_schema(&conn).unwrap();
        for key in ["a", "a/b", "a/b/c", "b\u{ff}", "ключ/1", "\u{10ffff}"] {
            conn.execute(
                "INSERT INTO objects (key, version, size, etag, uploaded, inline, http_metadata, custom, checksums, storage_class)
                 VALUES (?1, 'v', 0, 'e', 0, x'', '{}', '{}', '{}', 'Standard')",
                [key.as_bytes()],
            )
            .unwrap();
        }
        conn
    }

    #[test]
    fn cursors_round_trip() {
        let b = Bound { key: "ключ/".as_bytes().to_vec(), inclusive: true };
        assert_eq!(Bound::decode(&b.encode()).unwrap(), b);
        assert!(Bound::decode("!!").is_err());
    }
}
