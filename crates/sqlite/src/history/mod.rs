//! Time Travel's history: an append-only, checksummed log of every committed transaction, plus
//! snapshots, from which any past state can be rebuilt.
//!
//! After each commit the database's owner hands the new WAL frames to [`History::capture`],
//! which appends one record per transaction (its final page images) to the open segment. The
//! record is written but not synced: the WAL itself is durable, and SQLite never checkpoints on
//! its own (the WAL hook disables it). The owner checkpoints through [`History::checkpoint`],
//! which first syncs the log, so no committed transaction can be missing from history. After a
//! crash, [`History::open`] drops a torn tail record and captures from the WAL whatever the log
//! lacks; after a clean close ([`History::close`]) it reads back only what the close did not
//! check.
//!
//! Every entry has a `seq` that only grows, across restores too. A restore rebuilds the image
//! at a past `seq` (a snapshot, then records), records it as a new snapshot and a restore entry
//! at a new `seq`, and replaces the database file. Nothing is erased, so every restore can be
//! undone. The on-disk formats are specified where they are written: records in `record.rs`,
//! segments in `segment.rs`, snapshots in `snapshot.rs`; docs/design/history-and-restore.md
//! explains the whole.
//!
//! The history's work is cut by when it happens: [`recover`] on open, [`capture`] after each
//! commit, [`checkpoint`] when the WAL is moved into the database and on close, [`restore`] when
//! a past state is asked for.

mod bookmark;
mod capture;
mod checkpoint;
mod follow;
mod marker;
pub(crate) mod record;
mod recover;
mod restore;
pub(crate) mod segment;
mod ship;
pub(crate) mod snapshot;
mod verify;
mod wal;

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use bookmark::{Bookmark, MalformedBookmark};
pub use follow::{Follower, open_elsewhere};
use record::{HEADER_LEN, Header, Kind, ReadError};
pub(crate) use recover::finish_interrupted_restore;
pub use restore::{materialize, materialize_in};
pub(crate) use segment::remove_if_present;
use segment::{Entry, OpenSegment, Sealed, sync_dir};
pub(crate) use ship::ship_log;
pub use ship::{LogShipper, LogView, SegmentView, ShipError, segment_file_name, snapshot_file_name};
pub use verify::{LogCheck, LogDamage, verify};

use crate::error::{Error, Result};

/// How a database's history is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistorySettings {
    /// How far back bookmarks stay restorable (D1: 30 days).
    pub retention: Duration,
    /// A segment is sealed once it holds this many bytes…
    pub segment_bytes: u64,
    /// …or has been open this long.
    pub segment_age: Duration,
    /// WAL frames after which the owner checkpoints.
    pub checkpoint_frames: u32,
    /// A snapshot is taken at a checkpoint once the log since the last one exceeds both this and
    /// the database's size (so restores replay at most about one database's worth of log)…
    pub snapshot_log_bytes: u64,
    /// …or once the last one is this old and there were commits since.
    pub snapshot_age: Duration,
}

impl HistorySettings {
    /// A history kept only to ship it to a cluster's store (a bucket's metadata, a Durable
    /// Object namespace's index): a day of it locally, nothing restorable promised.
    pub fn shipped_only() -> Self {
        HistorySettings { retention: Duration::from_secs(24 * 3600), ..HistorySettings::default() }
    }
}

impl Default for HistorySettings {
    fn default() -> Self {
        HistorySettings {
            retention: Duration::from_secs(30 * 24 * 3600),
            segment_bytes: 64 * 1024 * 1024,
            segment_age: Duration::from_secs(3600),
            checkpoint_frames: 1000,
            snapshot_log_bytes: 64 * 1024 * 1024,
            snapshot_age: Duration::from_secs(24 * 3600),
        }
    }
}

/// What a restore did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// The bookmark of the restored state (a new entry in history).
    pub bookmark: Bookmark,
    /// The bookmark just before the restore: restoring it undoes this one.
    pub previous: Bookmark,
}

/// One entry of a history's timeline: a commit, or a restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moment {
    /// The state right after it.
    pub bookmark: Bookmark,
    /// When it was committed (Unix milliseconds).
    pub time_ms: i64,
    /// Whether it was a restore rather than a commit.
    pub restore: bool,
}

/// The history of one database file.
pub(crate) struct History {
    id: String,
    dir: PathBuf,
    wal_path: PathBuf,
    settings: HistorySettings,
    page_size: u32,
    sealed: Vec<Sealed>,
    open: OpenSegment,
    /// Snapshot positions, ascending.
    snapshots: Vec<u64>,
    last_seq: u64,
    last_time_ms: i64,
    /// The WAL incarnation and frame captured up to.
    wal_salt: u64,
    wal_frame: u32,
    wal: Option<File>,
    /// The WAL file's length as last known (0: not known), for [`History::write_wal_ahead`].
    wal_len: u64,
    /// The WAL's header as last read.
    wal_header: Option<wal::WalHeader>,
    /// Whether SQLite may restart the log at the next write (after a checkpoint, or on open).
    wal_may_restart: bool,
    log_bytes_since_snapshot: u64,
    last_snapshot_ms: i64,
    /// A write to the log failed part-way: nothing more may be appended (the database is
    /// reopened, and opening recovers the log).
    broken: bool,
    /// The history of a database another process writes ([`Follower`]): it never checkpoints
    /// or writes the database; snapshots are taken through one read at a known WAL position.
    following: bool,
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn io_error(context: &str) -> impl Fn(io::Error) -> Error + '_ {
    move |source| Error::Io { context: context.to_owned(), source }
}

pub(crate) fn damaged(what: String) -> Error {
    Error::HistoryDamaged { message: what }
}

pub(crate) fn read_error(e: ReadError, context: &str) -> Error {
    match e {
        ReadError::Io(source) => Error::Io { context: context.to_owned(), source },
        ReadError::Truncated => damaged(format!("{context}: a record is cut short")),
        ReadError::Corrupt(why) => damaged(format!("{context}: {why}")),
    }
}

/// The directory a database file's history log is kept in (beside the file).
pub fn log_dir(db_path: &Path) -> PathBuf {
    db_path.with_file_name("log")
}

fn wal_path(db_path: &Path) -> PathBuf {
    let mut name = db_path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

impl History {
    /// The bookmark of the current state.
    pub(crate) fn current(&self) -> Bookmark {
        Bookmark::new(&self.id, self.last_seq, self.last_time_ms)
    }

    /// The bookmark the state after `owed` more commits will have once they are captured, the
    /// last of them at `time_ms`: positions are taken one per commit, in commit order, so it
    /// is known before the capture.
    pub(crate) fn current_after(&self, owed: u64, time_ms: i64) -> Bookmark {
        Bookmark::new(&self.id, self.last_seq + owed, time_ms.max(self.last_time_ms))
    }

    fn wal_file(&mut self) -> Result<Option<&File>> {
        if self.wal.is_none() {
            self.wal_len = 0;
            // Writable for `write_wal_ahead`, unless another process owns the WAL.
            match OpenOptions::new().read(true).write(!self.following).open(&self.wal_path) {
                Ok(f) => self.wal = Some(f),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(io_error("opening the WAL")(e)),
            }
        }
        Ok(self.wal.as_ref())
    }

    /// Refuses to go on after a failed write to the log.
    fn usable(&self) -> Result<()> {
        if self.broken {
            return Err(Error::Io {
                context: "the history".into(),
                source: io::Error::other("an earlier write to the log failed; the database must be reopened"),
            });
        }
        Ok(())
    }

    /// Whether a write to the log failed, so the database must be reopened.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// Runs a step that writes to the log; if it fails, the log is left alone from then on.
    fn writing<T>(&mut self, step: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.usable()?;
        let outcome = step(self);
        self.broken |= outcome.is_err();
        outcome
    }

    /// The last entry (seq, time) at or before `time_ms`; a snapshot taken at the start of the
    /// history counts as an entry.
    fn position_at(&self, time_ms: i64) -> Result<Option<(u64, i64)>> {
        let mut best = None;
        if let Some(&first) = self.snapshots.first() {
            let header = snapshot::read_header(&snapshot::path_for(&self.dir, first))
                .map_err(|e| read_error(e, "reading a snapshot"))?;
            if header.time_ms <= time_ms {
                best = Some((first, header.time_ms));
            }
        }
        for s in &self.sealed {
            if s.first_ms > time_ms {
                return Ok(best);
            }
            if s.last_ms <= time_ms {
                best = Some((s.last_seq, s.last_ms));
                continue;
            }
            let entries = s.entries().map_err(|e| read_error(e, &format!("reading {}", s.path.display())))?;
            for e in entries.iter().take_while(|e| e.time_ms <= time_ms) {
                best = Some((e.seq, e.time_ms));
            }
            return Ok(best);
        }
        for e in self.open.entries.iter().take_while(|e| e.time_ms <= time_ms) {
            best = Some((e.seq, e.time_ms));
        }
        Ok(best)
    }

    /// The bookmark of the last commit at or before `time_ms`.
    pub(crate) fn bookmark_for_time(&self, time_ms: i64) -> Result<Bookmark> {
        if time_ms > now_ms() + 1000 {
            return Err(Error::InvalidBookmark { message: "the timestamp is in the future".into() });
        }
        let window_start = now_ms() - self.settings.retention.as_millis() as i64;
        if time_ms < window_start {
            return Err(Error::InvalidBookmark {
                message: format!(
                    "the timestamp is older than the {}-day Time Travel window",
                    self.settings.retention.as_secs() / 86_400
                ),
            });
        }
        match self.position_at(time_ms)? {
            Some((seq, t)) => Ok(Bookmark::new(&self.id, seq, t)),
            None => Err(Error::InvalidBookmark { message: "the database did not exist at that time".into() }),
        }
    }

    /// The newest entries, newest first: at most `limit`, before position `before` when given,
    /// and none older than the oldest restorable one (the last at or before the start of the
    /// retention window, which is still the state of that moment).
    pub(crate) fn timeline(&self, limit: usize, before: Option<u64>) -> Result<Vec<Moment>> {
        let window_start = now_ms() - self.settings.retention.as_millis() as i64;
        let before = before.unwrap_or(u64::MAX);
        let mut moments = Vec::new();
        // Whether to go on to older entries.
        let mut take = |entries: &mut dyn Iterator<Item = &Entry>| {
            for e in entries.filter(|e| e.seq < before) {
                if moments.len() == limit {
                    return false;
                }
                moments.push(Moment {
                    bookmark: Bookmark::new(&self.id, e.seq, e.time_ms),
                    time_ms: e.time_ms,
                    restore: e.kind == Kind::Restore,
                });
                if e.time_ms <= window_start {
                    return false;
                }
            }
            moments.len() < limit
        };
        if !take(&mut self.open.entries.iter().rev()) {
            return Ok(moments);
        }
        for s in self.sealed.iter().rev().filter(|s| s.first_seq < before) {
            let entries = s.entries().map_err(|e| read_error(e, &format!("reading {}", s.path.display())))?;
            if !take(&mut entries.iter().rev()) {
                break;
            }
        }
        Ok(moments)
    }

    /// Bytes the history occupies on disk.
    pub(crate) fn disk_bytes(&self) -> u64 {
        std::fs::read_dir(&self.dir)
            .map(|entries| entries.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0)
    }
}
