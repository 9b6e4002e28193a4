//! An offline check of a database's history, as `kura check` runs it on a stopped server's data
//! directory: every snapshot's image and every record's bytes against their checksums, the
//! positions without gaps, and every restore's snapshot present. Reads only.

use std::fs::File;
use std::path::Path;

use super::record::{self, Kind, ReadError};
use super::segment::open_segments;
use super::segment::{self, Sealed};
use super::{log_dir, snapshot};

/// What a history holds, once checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogCheck {
    /// Snapshot files, each image checked.
    pub snapshots: usize,
    /// Segment files, sealed and open.
    pub segments: usize,
    /// Records, each checked.
    pub records: u64,
    /// Bytes in the log directory.
    pub bytes: u64,
    /// The newest position the log can rebuild.
    pub last_seq: Option<u64>,
    /// Bytes after the open segment's last whole record: what a crash left of a record being
    /// appended. Harmless (the record's transaction is still in the WAL, from which the history
    /// captures it again when it opens), and cut off then.
    pub torn_tail_bytes: u64,
}

/// Damage found in a history.
#[derive(Debug, thiserror::Error)]
pub enum LogDamage {
    /// A checksum fails, a position is missing, or a file is not what its name says.
    #[error("{0}")]
    Damaged(String),
    /// The log could not be read.
    #[error("reading {context}: {source}")]
    Io {
        /// What was being read.
        context: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

fn read_damage(path: &Path) -> impl Fn(ReadError) -> LogDamage + '_ {
    move |e| match e {
        ReadError::Io(source) => LogDamage::Io { context: path.display().to_string(), source },
        ReadError::Truncated => LogDamage::Damaged(format!("{}: a record is cut short", path.display())),
        ReadError::Corrupt(why) => LogDamage::Damaged(format!("{}: {why}", path.display())),
    }
}

/// Checks the history beside the database file `db_path` (its `log` directory); `Ok(None)`
/// when it has none.
pub fn verify(db_path: &Path) -> Result<Option<LogCheck>, LogDamage> {
    let dir = log_dir(db_path);
    let io = |context: &str| {
        let context = format!("{context} {}", dir.display());
        move |source| LogDamage::Io { context: context.clone(), source }
    };
    let listing = match std::fs::read_dir(&dir) {
        Ok(listing) => listing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("listing")(e)),
    };
    let mut check = LogCheck::default();
    let (mut sealed, mut snapshots) = (Vec::new(), Vec::new());
    for entry in listing {
        let path = entry.map_err(io("listing"))?.path();
        check.bytes += path.metadata().map(|m| m.len()).unwrap_or(0);
        if let Some(s) = Sealed::from_path(&path) {
            sealed.push(s);
        } else if let Some(seq) = snapshot::seq_of(&path) {
            snapshots.push(seq);
        }
    }
    sealed.sort_by_key(|s| s.first_seq);
    snapshots.sort_unstable();
    for &seq in &snapshots {
        let path = snapshot::path_for(&dir, seq);
        let header = snapshot::verify(&path).map_err(read_damage(&path))?;
        if header.seq != seq {
            return Err(LogDamage::Damaged(format!("{} names position {}", path.display(), header.seq)));
        }
    }
    check.snapshots = snapshots.len();

    // Every record of every segment, in order: (seq, kind).
    let mut positions: Vec<(u64, Kind)> = Vec::new();
    for s in &sealed {
        let found = records(&s.path, false)?;
        let (first, last) = (found.records.first().map(|r| r.0), found.records.last().map(|r| r.0));
        if first != Some(s.first_seq) || last != Some(s.last_seq) {
            return Err(LogDamage::Damaged(format!(
                "{} holds positions {first:?} to {last:?}, not what its name says",
                s.path.display()
            )));
        }
        positions.extend(found.records);
    }
    let open = open_segments(&dir).map_err(io("listing"))?;
    for (i, (path, first_seq)) in open.iter().enumerate() {
        // Only the newest open segment is being appended to; an older one was cut short by a
        // crash before it could be sealed and holds only whole records.
        let newest = i + 1 == open.len();
        let found = records(path, newest)?;
        if found.records.first().is_some_and(|r| r.0 != *first_seq) {
            return Err(LogDamage::Damaged(format!("{} does not start at its position", path.display())));
        }
        check.torn_tail_bytes += found.torn_tail_bytes;
        positions.extend(found.records);
    }
    check.segments = sealed.len() + open.len();
    check.records = positions.len() as u64;
    for pair in positions.windows(2) {
        // After damage is cut out of a log, the history starts again from a new base: a
        // restore entry (with its snapshot, checked below) a few positions on.
        let rebased = pair[1].1 == Kind::Restore && pair[1].0 > pair[0].0;
        if pair[1].0 != pair[0].0 + 1 && !rebased {
            return Err(LogDamage::Damaged(format!(
                "{}: the log jumps from position {} to {}",
                dir.display(),
                pair[0].0,
                pair[1].0
            )));
        }
    }
    // Snapshots older than the retention window go, while the segments that hold their restore
    // entries may stay: only restores from the oldest snapshot on can still be rebuilt.
    let oldest_snapshot = snapshots.first().copied().unwrap_or(0);
    for (seq, kind) in &positions {
        if *kind == Kind::Restore && *seq >= oldest_snapshot && snapshots.binary_search(seq).is_err() {
            return Err(LogDamage::Damaged(format!("{}: restore {seq} has no snapshot", dir.display())));
        }
    }
    // The newest state must be rebuildable: a snapshot at or after the position before the
    // first record still in the log.
    let newest_snapshot = snapshots.last().copied();
    match (positions.first(), newest_snapshot) {
        (_, None) if !positions.is_empty() => {
            return Err(LogDamage::Damaged(format!("{}: records but no snapshot to start from", dir.display())));
        }
        (Some(&(first, _)), Some(snap)) if snap + 1 < first => {
            return Err(LogDamage::Damaged(format!(
                "{}: positions {} to {} are neither in a snapshot nor in the log",
                dir.display(),
                snap + 1,
                first - 1
            )));
        }
        _ => {}
    }
    check.last_seq = positions.last().map(|p| p.0).max(newest_snapshot);
    Ok(Some(check))
}

struct Records {
    records: Vec<(u64, Kind)>,
    torn_tail_bytes: u64,
}

/// Every record of a segment, each checked against its checksum; with `tail_may_tear`, bad
/// bytes after the last whole record (and after what a clean close noted) are counted, not
/// refused.
fn records(path: &Path, tail_may_tear: bool) -> Result<Records, LogDamage> {
    let damage = read_damage(path);
    let file = File::open(path).map_err(|e| damage(e.into()))?;
    let len = file.metadata().map_err(|e| damage(e.into()))?.len();
    if len < segment::SEGMENT_HEADER_LEN && tail_may_tear {
        return Ok(Records { records: Vec::new(), torn_tail_bytes: len });
    }
    segment::check_magic(&file, path).map_err(&damage)?;
    // What a clean close synced and noted cannot be torn by a later crash.
    let may_tear_from = match tail_may_tear {
        true => segment::checked_len(path, &file, len).unwrap_or(segment::SEGMENT_HEADER_LEN),
        false => u64::MAX,
    };
    let mut found = Vec::new();
    let mut offset = segment::SEGMENT_HEADER_LEN;
    record::walk(&file, len, |records| {
        loop {
            match records.verify_at(offset) {
                Ok(Some(header)) => {
                    // A packed record's index must agree with it, as opening the log requires.
                    if header.kind == Kind::Commits {
                        records.packed_headers_at(offset, &header).map_err(&damage)?;
                    }
                    found.extend((header.first_seq()..=header.seq).map(|seq| (seq, header.last_kind())));
                    offset += header.record_len();
                }
                Ok(None) => return Ok(Records { records: found, torn_tail_bytes: 0 }),
                Err(ReadError::Io(e)) => return Err(damage(ReadError::Io(e))),
                // A crash tears only the last record being appended: a whole, valid record after the
                // bad one means the bad one was damaged where it lay.
                Err(e) if offset >= may_tear_from => {
                    let next = record::header_at(&file, offset, len).ok().map(|h| offset + h.record_len());
                    if next.is_some_and(|next| matches!(records.verify_at(next), Ok(Some(_)))) {
                        return Err(damage(e));
                    }
                    return Ok(Records { records: found, torn_tail_bytes: len - offset });
                }
                Err(e) => return Err(damage(e)),
            }
        }
    })
}
