//! Bookmarks: names for points in a database's history, in D1's shape
//! (`xxxxxxxx-xxxxxxxx-xxxxxxxx-<32 hex>`, fixed-width lowercase hex).
//!
//! The first two groups are the history position (`seq`, high and low 32 bits), so bookmarks
//! sort as strings exactly as they sort in time, across restores too (restores take new
//! positions). The third is the commit time in Unix seconds, for people reading them. The last
//! is a fingerprint of the database's identity and the position, so a bookmark of another
//! database, or a made-up one, is recognised as unknown.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

/// A point in a database's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bookmark {
    /// The history position.
    pub seq: u64,
    /// Commit time, Unix seconds.
    pub time_s: u32,
    /// Identity of the database and of the entry at `seq`.
    pub fingerprint: u128,
}

impl Bookmark {
    /// The bookmark of the entry at `seq` in database `database`, committed at `time_ms`.
    pub(crate) fn new(database: &str, seq: u64, time_ms: i64) -> Bookmark {
        Bookmark {
            seq,
            time_s: (time_ms.max(0) / 1000).min(u32::MAX as i64) as u32,
            fingerprint: fingerprint(database, seq),
        }
    }

    /// Whether this bookmark was made for database `database`.
    pub fn belongs_to(&self, database: &str) -> bool {
        self.fingerprint == fingerprint(database, self.seq)
    }
}

fn fingerprint(database: &str, seq: u64) -> u128 {
    let mut hash = Sha256::new();
    hash.update(database.as_bytes());
    hash.update([0]);
    hash.update(seq.to_le_bytes());
    u128::from_be_bytes(hash.finalize()[..16].try_into().expect("16 bytes"))
}

impl fmt::Display for Bookmark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}-{:08x}-{:08x}-{:032x}", self.seq >> 32, self.seq & 0xffff_ffff, self.time_s, self.fingerprint)
    }
}

/// A string that is not a bookmark.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed bookmark '{0}': expected four groups of lowercase hex digits, 8-8-8-32 wide")]
pub struct MalformedBookmark(pub String);

impl FromStr for Bookmark {
    type Err = MalformedBookmark;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || MalformedBookmark(s.chars().take(80).collect());
        let groups: Vec<&str> = s.split('-').collect();
        let widths = [8, 8, 8, 32];
        if groups.len() != 4
            || groups
                .iter()
                .zip(widths)
                .any(|(g, w)| g.len() != w || !g.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        {
            return Err(bad());
        }
        let hex32 = |g: &str| u32::from_str_radix(g, 16).map_err(|_| bad());
        Ok(Bookmark {
            seq: (hex32(groups[0])? as u64) << 32 | hex32(groups[1])? as u64,
            time_s: hex32(groups[2])?,
            fingerprint: u128::from_str_radix(groups[3], 16).map_err(|_| bad())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_fixed_width_and_parses_back() {
        let b = Bookmark::new("db", 0x1_0000_0005, 1_700_000_000_123);
        let text = b.to_string();
        assert_eq!(text.len(), 8 + 1 + 8 + 1 + 8 + 1 + 32);
        assert!(text.starts_with("00000001-00000005-6553f100-"), "{text}");
        assert_eq!(text.parse::<Bookmark>().unwrap(), b);
    }

    #[test]
    fn string_order_is_history_order() {
        let mut previous = Bookmark::new("db", 0, 0).to_string();
        for seq in [1u64, 9, 10, 255, 256, 0xffff_ffff, 0x1_0000_0000, u64::MAX] {
            // Later entries may even carry earlier clocks: the position decides.
            let next = Bookmark::new("db", seq, 1_000).to_string();
            assert!(next > previous, "{next} <= {previous}");
            previous = next;
        }
    }

    #[test]
    fn fingerprints_tell_databases_apart() {
        let b = Bookmark::new("a", 1, 0);
        assert!(b.belongs_to("a"));
        assert!(!b.belongs_to("b"));
        assert!(!Bookmark { seq: 2, ..b }.belongs_to("a"));
    }

    #[test]
    fn rejects_anything_else() {
        for bad in [
            "",
            "00000001-00000005-6553f100",
            "00000001-00000005-6553f100-0000000000000000000000000000000g",
            "00000001-00000005-6553F100-00000000000000000000000000000000",
            "1-5-6553f100-00000000000000000000000000000000",
            "00000001-00000005-6553f100-00000000000000000000000000000000-",
        ] {
            assert!(bad.parse::<Bookmark>().is_err(), "{bad:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
            kura_testkit::count("KURA_FUZZ_CASES", 2_000)
        ))]

        /// Any text parses to a bookmark or an error, never a panic; what parses prints back
        /// as itself (ignoring case).
        #[test]
        fn any_text_parses_or_is_refused(text in "[0-9a-fA-F-]{0,70}|.{0,80}") {
            if let Ok(b) = text.parse::<Bookmark>() {
                proptest::prop_assert_eq!(b.to_string(), text.to_ascii_lowercase());
            }
        }

        /// Every bookmark round-trips, and one database's bookmarks never parse as another's.
        #[test]
        fn every_bookmark_round_trips(seq in proptest::prelude::any::<u64>(), time in 0i64..(1i64 << 47), db in "[a-z0-9-]{1,40}") {
            let b = Bookmark::new(&db, seq, time);
            proptest::prop_assert_eq!(b.to_string().parse::<Bookmark>().unwrap(), b);
            proptest::prop_assert!(b.belongs_to(&db));
            let other = format!("{}x", db);
            proptest::prop_assert!(!b.belongs_to(&other));
        }
    }
}
