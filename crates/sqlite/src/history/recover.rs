//! Opening a history: finishing a restore a crash interrupted, recovering the log (a torn tail
//! record dropped, damage cut out and kept aside), and capturing from the WAL whatever the log
//! lacks.

use std::path::{Path, PathBuf};

use super::marker::REBASE_MARKER;
use super::marker::RESTORE_MARKER;
use super::marker::read_marker;
use super::marker::remove_marker;
use super::marker::write_marker;
use super::record::{Header, Kind};
use super::restore::install_image;
use super::restore::restore_image_path;
use super::segment::open_segment_first;
use super::segment::open_segments;
use super::segment::{self, Entry, OpenSegment, Sealed};
use super::wal::read_wal_salt;
use super::wal::wal_counts;
use super::*;
use crate::error::{Error, Result};

/// Before SQLite opens the file: finishes a restore a crash interrupted after its entry was
/// written (installing the snapshot it recorded), or forgets one interrupted before; and
/// removes a half-built image. Answers whether a restore was interrupted.
pub(crate) fn finish_interrupted_restore(db_path: &Path) -> Result<bool> {
    finish_interrupted_restore_in(db_path, &log_dir(db_path))
}

/// As [`finish_interrupted_restore`], for a history kept in `dir`.
pub(super) fn finish_interrupted_restore_in(db_path: &Path, dir: &Path) -> Result<bool> {
    if remove_if_present(&restore_image_path(db_path)).map_err(io_error("removing an unfinished restore image"))? {
        tracing::warn!(db = %db_path.display(), "removed an unfinished restore image");
    }
    let dir = dir.to_owned();
    let Some(marker) = read_marker(&dir, RESTORE_MARKER)? else { return Ok(false) };
    let open = open_segments(&dir).map_err(io_error("reading the history"))?.pop();
    let last = match open {
        Some((path, _)) => segment::last_valid_entry(&path).map_err(|e| read_error(e, "reading the log"))?,
        None => None,
    };
    match (marker, last) {
        (Some(seq), Some(last)) if last.kind == Kind::Restore && last.seq == seq => {
            tracing::warn!(db = %db_path.display(), seq, "finishing a restore interrupted by a crash");
            install_image(db_path, &snapshot::path_for(&dir, seq))?;
        }
        // The restore's entry was never written: it did not happen (its snapshot, newer than
        // every entry, is removed when the history opens).
        _ => tracing::warn!(db = %db_path.display(), "forgetting a restore interrupted by a crash"),
    }
    remove_marker(&dir, RESTORE_MARKER).map_err(io_error("removing the restore marker"))?;
    Ok(true)
}

/// Where the bytes cut from a damaged segment are kept.
pub(super) fn damaged_copy_path(segment: &Path, offset: u64) -> PathBuf {
    let mut name = segment.as_os_str().to_owned();
    name.push(format!(".{offset:x}.damaged"));
    PathBuf::from(name)
}

/// Whether the bytes after an open segment's last valid record are an append a crash tore
/// (which the WAL can rebuild) rather than damage to records already made durable.
pub(super) fn tail_is_torn(tail: &segment::BadTail, wal: &WalState, restore_interrupted: bool) -> bool {
    match tail.header {
        Some(header) if header.kind != Kind::Restore => wal.holds(&header),
        // A restore's entry is written while its marker exists and is the last thing written:
        // torn, the restore never happened. Without the marker, it was durable: damage.
        Some(header) => restore_interrupted && (tail.truncated || tail.offset + header.record_len() >= tail.file_len),
        None => tail.all_zero || tail.file_len - tail.offset < HEADER_LEN as u64,
    }
}

/// The WAL as SQLite sees it now: its salt (0 if it has no header) and valid frames.
#[derive(Debug, Clone, Copy)]
pub(super) struct WalState {
    salt: u64,
    frames: u32,
}

impl WalState {
    /// Whether the WAL still holds the transaction a record captured, so capturing again
    /// rebuilds the record exactly.
    pub(super) fn holds(&self, record: &Header) -> bool {
        record.kind != Kind::Restore && record.wal_salt == self.salt && record.wal_frame <= self.frames
    }
}

impl History {
    /// Opens the history of the database at `db_path` (already open on `conn`): recovers the
    /// log, starts it with a snapshot if it is new, and captures whatever the WAL holds that
    /// the log does not.
    pub(crate) fn open(
        id: &str,
        db_path: &Path,
        conn: &rusqlite::Connection,
        settings: HistorySettings,
        restore_interrupted: bool,
    ) -> Result<History> {
        History::open_in(id, db_path, &log_dir(db_path), conn, settings, restore_interrupted, false)
    }

    /// As [`History::open`], with the log in `dir`; `following` for a database another process
    /// writes (see [`Follower`]).
    pub(super) fn open_in(
        id: &str,
        db_path: &Path,
        dir: &Path,
        conn: &rusqlite::Connection,
        settings: HistorySettings,
        restore_interrupted: bool,
        following: bool,
    ) -> Result<History> {
        let dir = dir.to_owned();
        let fresh = !dir.exists();
        std::fs::create_dir_all(&dir).map_err(io_error("creating the log directory"))?;
        let page_size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0)).map_err(Error::internal)?;
        let (mut sealed, mut snapshots, mut opens) = (Vec::new(), Vec::new(), Vec::new());
        // One listing finds everything (opening an evicted object lists it once, not twice).
        for entry in std::fs::read_dir(&dir).map_err(io_error("reading the log directory"))? {
            let path = entry.map_err(io_error("reading the log directory"))?.path();
            if path.extension().is_some_and(|e| e == "tmp") {
                let _ = std::fs::remove_file(&path);
            } else if let Some(s) = Sealed::from_path(&path) {
                sealed.push(s);
            } else if let Some(seq) = snapshot::seq_of(&path) {
                snapshots.push(seq);
            } else if let Some(first) = open_segment_first(&path) {
                opens.push((path, first));
            }
        }
        opens.sort_by_key(|(_, first)| *first);
        let newest = opens.pop();
        for (path, first) in opens {
            // Left by an older version's crash between starting a segment and sealing the last.
            let mut r = OpenSegment::recover(&path, first).map_err(|e| read_error(e, "recovering the log"))?;
            if let Some(tail) = r.tail {
                r.segment
                    .cut_tail(&tail, Some(&damaged_copy_path(&path, tail.offset)))
                    .map_err(io_error("recovering the log"))?;
            }
            sealed.extend(r.segment.seal(&dir).map_err(io_error("sealing a log segment"))?);
        }
        sealed.sort_by_key(|s| s.first_seq);
        snapshots.sort_unstable();
        let wal = WalState {
            salt: read_wal_salt(&wal_path(db_path))?,
            frames: wal_counts(conn, -1)?.0.max(0) as u32, // SQLITE_CHECKPOINT_NOOP: count, change nothing
        };
        let (open, tail) = match newest {
            Some((path, first)) => {
                let r = OpenSegment::recover(&path, first).map_err(|e| read_error(e, "recovering the log"))?;
                (r.segment, r.tail)
            }
            None => {
                let last_sealed = sealed.last().map_or(0, |s| s.last_seq);
                let first = last_sealed.max(snapshots.last().copied().unwrap_or(0)) + 1;
                (OpenSegment::create(&dir, first).map_err(io_error("creating a log segment"))?, None)
            }
        };
        let last_entry = open.entries.last().copied();
        let mut history = History {
            id: id.to_owned(),
            wal_path: wal_path(db_path),
            dir,
            settings,
            page_size: page_size as u32,
            sealed,
            open,
            snapshots,
            last_seq: 0,
            last_time_ms: 0,
            wal_salt: 0,
            wal_frame: 0,
            wal: None,
            wal_len: 0,
            wal_header: None,
            wal_may_restart: true,
            log_bytes_since_snapshot: 0,
            last_snapshot_ms: now_ms(),
            broken: false,
            following,
        };
        history.find_last_position(last_entry)?;
        // A new base an earlier recovery decided on but did not finish.
        let mut rebase_to = read_marker(&history.dir, REBASE_MARKER)?.flatten();
        if let Some(tail) = tail {
            let segment = history.open.path.clone();
            if tail_is_torn(&tail, &wal, restore_interrupted) {
                // Never synced, so never checkpointed: the WAL still holds it all, and
                // catching up below writes it again, at the same positions.
                tracing::warn!(segment = %segment.display(), bytes = tail.file_len - tail.offset, "dropping the log's torn tail");
                history.open.cut_tail(&tail, None).map_err(io_error("recovering the log"))?;
            } else {
                // Positions the damaged bytes held (each takes at least an index entry of a
                // packed record), and those of records that never reached the file (each came
                // from at least one frame of the WAL), are never handed out again: the new base
                // comes after all.
                let lost = (tail.file_len - tail.offset) / record::MIN_BYTES_PER_POSITION + 1 + wal.frames as u64;
                let base = history.last_seq + lost + 1;
                write_marker(&history.dir, REBASE_MARKER, base).map_err(io_error("writing the rebase marker"))?;
                let keep = damaged_copy_path(&segment, tail.offset);
                tracing::error!(segment = %segment.display(), damage = %tail.why, kept = %keep.display(), "the log is damaged; history continues from a new snapshot");
                history.open.cut_tail(&tail, Some(&keep)).map_err(io_error("recovering the log"))?;
                rebase_to = Some(rebase_to.map_or(base, |b| b.max(base)));
            }
        }
        match rebase_to {
            Some(base) => {
                // What the damaged records held cannot be rebuilt: later bookmarks restore from
                // a new base, the database as it is (the WAL checkpointed into it).
                if history.last_seq < base {
                    history.last_seq = base - 1;
                    history.rebase(conn)?;
                }
                remove_marker(&history.dir, REBASE_MARKER).map_err(io_error("removing the rebase marker"))?;
            }
            None if following => history.follow_begin(conn, fresh)?,
            None => {
                if fresh || history.snapshots.is_empty() {
                    // The history starts with the database as it is now.
                    history.checkpoint_fully(conn)?;
                    let db_pages = history.db_pages(conn)?;
                    history.snapshot(conn, history.last_seq, db_pages)?;
                    history.skip_checkpointed_wal(conn)?;
                }
                history.catch_up(conn)?;
            }
        }
        Ok(history)
    }

    /// Sets the last position and the WAL cursor from the newest entry anywhere. Snapshots newer
    /// than every entry were left by a restore that a crash interrupted before its entry was
    /// written: the restore did not happen, so they go.
    pub(super) fn find_last_position(&mut self, last_open: Option<Entry>) -> Result<()> {
        let last = match last_open {
            Some(e) => Some(e),
            None => match self.sealed.last() {
                Some(s) => s.entries().map_err(|e| read_error(e, "reading a sealed segment"))?.last().copied(),
                None => None,
            },
        };
        match last {
            Some(e) => {
                for orphan in self.snapshots.iter().filter(|&&s| s > e.seq) {
                    std::fs::remove_file(snapshot::path_for(&self.dir, *orphan))
                        .map_err(io_error("removing a snapshot"))?;
                }
                self.snapshots.retain(|&s| s <= e.seq);
                self.last_seq = e.seq;
                self.last_time_ms = e.time_ms;
                // A commit's WAL position, or a restore's: none after an owner's restore (the WAL
                // is gone), a follower's new base where that snapshot was read.
                self.wal_salt = e.wal_salt;
                self.wal_frame = e.wal_frame;
            }
            None => {
                if let Some(&seq) = self.snapshots.last() {
                    let header = snapshot::read_header(&snapshot::path_for(&self.dir, seq))
                        .map_err(|e| read_error(e, "reading a snapshot"))?;
                    self.last_seq = seq;
                    self.last_time_ms = header.time_ms;
                }
            }
        }
        Ok(())
    }

    /// Captures what the WAL holds beyond the log (after a crash, or on first open). Those
    /// commits happened before the WAL was last modified, which is the best time they can have.
    pub(super) fn catch_up(&mut self, conn: &rusqlite::Connection) -> Result<()> {
        let (frames, _) = wal_counts(conn, -1)?; // SQLITE_CHECKPOINT_NOOP: count, change nothing
        let modified_ms = std::fs::metadata(&self.wal_path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as i64);
        let time_ms = modified_ms.map(|t| t.min(now_ms()));
        self.capture_at(frames.max(0) as u32, &[], time_ms).map(drop)
    }

    /// Treats everything now in the WAL as captured (it is all in the database file and in a
    /// snapshot already).
    pub(super) fn skip_checkpointed_wal(&mut self, conn: &rusqlite::Connection) -> Result<()> {
        let (frames, _) = wal_counts(conn, -1)?;
        self.wal_salt = self.current_wal_salt()?;
        self.wal_frame = frames.max(0) as u32;
        Ok(())
    }

    /// Records the database as it is now as a new entry with its own snapshot.
    pub(super) fn rebase(&mut self, conn: &rusqlite::Connection) -> Result<()> {
        if self.following {
            return self.follow_rebase(conn);
        }
        self.checkpoint_fully(conn)?;
        let db_pages = self.db_pages(conn)?;
        let seq = self.last_seq + 1;
        self.snapshot(conn, seq, db_pages)?;
        self.append_restore_entry(seq, db_pages)?;
        self.skip_checkpointed_wal(conn)
    }
}
