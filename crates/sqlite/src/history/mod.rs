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
//! undone. See docs/design.md for the on-disk formats.

mod bookmark;
mod follow;
mod record;
mod segment;
mod ship;
mod snapshot;
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
pub(crate) use segment::remove_if_present;
use segment::{Entry, OpenSegment, Sealed, sync_dir};
pub use ship::{LogShipper, LogView, SegmentView, ShipError, segment_file_name, snapshot_file_name};
use snapshot::SnapshotWriter;
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

/// A past state, ready to be rebuilt: a snapshot and the records after it.
#[derive(Debug, Clone)]
struct RestorePlan {
    snapshot: PathBuf,
    /// Records to apply in order: (segment file, offset, seq).
    records: Vec<(PathBuf, u64, u64)>,
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

/// Bytes of zeros kept written past a WAL's last frame (see [`History::write_wal_ahead`]):
/// 32 frames of 4 KiB pages, 16 small commits; refilled when half is left.
const WAL_WRITTEN_AHEAD: u64 = 128 * 1024;

/// Frames a WAL holds before anything is written ahead of it (a few small commits).
const WAL_WRITTEN_AHEAD_PAST: u32 = 16;

/// Frames a WAL may hold at a clean close and be left as it is. An emptied WAL costs the next
/// open's first write one more sync (the new WAL's header); a WAL left full costs the next open
/// reading every frame back, about 8 µs each here against 150–200 µs for the sync.
const EMPTY_WAL_PAST_FRAMES: i32 = 24;

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn io_error(context: &str) -> impl Fn(io::Error) -> Error + '_ {
    move |source| Error::Io { context: context.to_owned(), source }
}

fn damaged(what: String) -> Error {
    Error::HistoryDamaged { message: what }
}

fn read_error(e: ReadError, context: &str) -> Error {
    match e {
        ReadError::Io(source) => Error::Io { context: context.to_owned(), source },
        ReadError::Truncated => damaged(format!("{context}: a record is cut short")),
        ReadError::Corrupt(why) => damaged(format!("{context}: {why}")),
    }
}

/// The log directory of a database file.
pub(crate) fn log_dir(db_path: &Path) -> PathBuf {
    db_path.with_file_name("log")
}

fn wal_path(db_path: &Path) -> PathBuf {
    let mut name = db_path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// Names a restore's position from before its entry is written until the swapped database
/// file is durable.
const RESTORE_MARKER: &str = "restore.pending";

/// Names the position a new base must take, from before damage is cut out of the log until
/// that base's entry is durable.
const REBASE_MARKER: &str = "rebase.pending";

/// The scratch file a restore builds its image in, beside the database file.
fn restore_image_path(db_path: &Path) -> PathBuf {
    db_path.with_extension("restore.tmp")
}

/// Writes a marker naming a position, durably.
fn write_marker(dir: &Path, name: &str, seq: u64) -> io::Result<()> {
    let mut file = File::create(dir.join(name))?;
    io::Write::write_all(&mut file, format!("{seq:016x}\n").as_bytes())?;
    file.sync_all()?;
    sync_dir(dir)
}

/// A marker's position: `None` without the marker, `Some(None)` if a crash tore its writing
/// (which happens before anything it guards).
fn read_marker(dir: &Path, name: &str) -> Result<Option<Option<u64>>> {
    match std::fs::read_to_string(dir.join(name)) {
        Ok(text) => Ok(Some(u64::from_str_radix(text.trim(), 16).ok())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error("reading a marker")(e)),
    }
}

/// Removes a marker, durably.
fn remove_marker(dir: &Path, name: &str) -> io::Result<()> {
    std::fs::remove_file(dir.join(name))?;
    sync_dir(dir)
}

/// Before SQLite opens the file: finishes a restore a crash interrupted after its entry was
/// written (installing the snapshot it recorded), or forgets one interrupted before; and
/// removes a half-built image. Answers whether a restore was interrupted.
pub(crate) fn finish_interrupted_restore(db_path: &Path) -> Result<bool> {
    finish_interrupted_restore_in(db_path, &log_dir(db_path))
}

/// As [`finish_interrupted_restore`], for a history kept in `dir`.
fn finish_interrupted_restore_in(db_path: &Path, dir: &Path) -> Result<bool> {
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

/// Replaces the database file with a snapshot's image and drops the WAL.
fn install_image(db_path: &Path, snapshot_path: &Path) -> Result<()> {
    let (tmp, out) = create_image(db_path)?;
    let header = snapshot::copy_image(snapshot_path, &out).map_err(|e| read_error(e, "reading the snapshot"))?;
    out.set_len(header.db_pages as u64 * header.page_size as u64).map_err(io_error("sizing the restored image"))?;
    out.sync_all().map_err(io_error("syncing the restored image"))?;
    swap_in(db_path, &tmp)
}

/// A new, empty file beside the database, where an image of it is built before it is swapped in.
fn create_image(db_path: &Path) -> Result<(PathBuf, File)> {
    let tmp = restore_image_path(db_path);
    let out = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(io_error("creating the database image"))?;
    Ok((tmp, out))
}

/// Builds the state a plan names beside the database (see [`build`]); the file is removed if
/// that fails. Returns it with its size in pages.
fn build_image(db_path: &Path, plan: &RestorePlan, page_size: u32) -> Result<(PathBuf, File, u32)> {
    let (tmp, out) = create_image(db_path)?;
    match build(plan, &out, page_size) {
        Ok(db_pages) => Ok((tmp, out, db_pages)),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Renames `tmp` over the database file and removes its WAL, durably.
fn swap_in(db_path: &Path, tmp: &Path) -> Result<()> {
    std::fs::rename(tmp, db_path).map_err(io_error("replacing the database file"))?;
    for leftover in [wal_path(db_path), db_path.with_extension("sqlite-shm")] {
        remove_if_present(&leftover).map_err(io_error("removing the old WAL"))?;
    }
    sync_dir(db_path.parent().unwrap_or(Path::new("."))).map_err(io_error("syncing the database directory"))
}

/// Every open segment's path and first seq, oldest first. There is one, except after a crash
/// in an older version that started a segment before sealing the previous one.
fn open_segments(dir: &Path) -> io::Result<Vec<(PathBuf, u64)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for entry in entries {
        let path = entry?.path();
        if let Some(first) = open_segment_first(&path) {
            found.push((path, first));
        }
    }
    found.sort_by_key(|(_, first)| *first);
    Ok(found)
}

/// The first seq of the open segment at `path` (`<first in hex>.open`), if it is one.
fn open_segment_first(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    u64::from_str_radix(name.strip_suffix(".open")?, 16).ok()
}

/// Where the bytes cut from a damaged segment are kept.
fn damaged_copy_path(segment: &Path, offset: u64) -> PathBuf {
    let mut name = segment.as_os_str().to_owned();
    name.push(format!(".{offset:x}.damaged"));
    PathBuf::from(name)
}

/// Whether the bytes after an open segment's last valid record are an append a crash tore
/// (which the WAL can rebuild) rather than damage to records already made durable.
fn tail_is_torn(tail: &segment::BadTail, wal: &WalState, restore_interrupted: bool) -> bool {
    match tail.header {
        Some(header) if header.kind != Kind::Restore => wal.holds(&header),
        // A restore's entry is written while its marker exists and is the last thing written:
        // torn, the restore never happened. Without the marker, it was durable: damage.
        Some(header) => restore_interrupted && (tail.truncated || tail.offset + header.record_len() >= tail.file_len),
        None => tail.all_zero || tail.file_len - tail.offset < HEADER_LEN as u64,
    }
}

/// The salt in the WAL's header; 0 when there is no WAL or it has no header yet.
fn read_wal_salt(wal_path: &Path) -> Result<u64> {
    match File::open(wal_path) {
        Ok(file) => Ok(wal::read_header(&file).map_err(io_error("reading the WAL"))?.map_or(0, |h| h.salt)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(io_error("opening the WAL")(e)),
    }
}

/// The WAL as SQLite sees it now: its salt (0 if it has no header) and valid frames.
#[derive(Debug, Clone, Copy)]
struct WalState {
    salt: u64,
    frames: u32,
}

impl WalState {
    /// Whether the WAL still holds the transaction a record captured, so capturing again
    /// rebuilds the record exactly.
    fn holds(&self, record: &Header) -> bool {
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
    fn open_in(
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
    fn find_last_position(&mut self, last_open: Option<Entry>) -> Result<()> {
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

    /// Appends a record for every transaction committed to the WAL since the last capture, up
    /// to frame `frames` (the count the WAL hook reported after the commit); the first are
    /// stamped with `answered_at` (commits answered before their capture), the rest now.
    /// Returns how many it appended.
    pub(crate) fn capture(&mut self, frames: u32, answered_at: &[i64]) -> Result<u64> {
        self.writing(|h| h.capture_at(frames, answered_at, None))
    }

    /// Captures as [`History::capture`] does; records past `answered_at` are stamped
    /// `time_ms` if given, else now.
    fn capture_at(&mut self, frames: u32, answered_at: &[i64], time_ms: Option<i64>) -> Result<u64> {
        // The header changes only when SQLite restarts the log: at the first write after one
        // of our checkpoints. Until a capture has seen such a write, read it afresh.
        if self.wal_header.is_none() || self.wal_may_restart {
            let Some(file) = self.wal_file()? else { return Ok(0) };
            self.wal_header = wal::read_header(file).map_err(io_error("reading the WAL"))?;
        }
        let Some(header) = self.wal_header else { return Ok(0) };
        let after = if header.salt == self.wal_salt && frames >= self.wal_frame { self.wal_frame } else { 0 };
        if frames <= after {
            return Ok(0);
        }
        let wal_opened = "the WAL was opened to read its header";
        let file = self.wal.as_ref().expect(wal_opened);
        let frames_read = wal::Frames::read(file, &header, after, frames).map_err(io_error("reading the WAL"))?;
        // The commits' records go to the log in runs written with one system call each (one
        // write of many pages costs less than many writes of a few: docs/design.md, "Captured
        // in batches"); a record larger than one run's buffer goes alone.
        let transactions = frames_read.transactions();
        let (mut appended, mut page, mut records) = (0, Vec::new(), Vec::new());
        while appended < transactions.len() {
            let file = self.wal.as_ref().expect(wal_opened);
            records.clear();
            let (mut seq, mut last_time_ms, mut bytes) = (self.last_seq, self.last_time_ms, 0);
            for (i, txn) in transactions.iter().enumerate().skip(appended) {
                let stamp = answered_at.get(i).copied().or(time_ms);
                let time_ms = stamp.unwrap_or_else(now_ms).max(last_time_ms);
                let record = Header {
                    kind: Kind::Commit,
                    seq: seq + 1,
                    time_ms,
                    page_size: header.page_size,
                    db_pages: txn.db_pages,
                    wal_salt: header.salt,
                    wal_frame: txn.last_frame,
                    n_pages: txn.pages.len() as u32,
                    packed_len: 0,
                };
                // A run fits one write, and ends where the segment is full, as one record alone
                // would.
                let room = record::WHOLE_RECORD.min(self.settings.segment_bytes.saturating_sub(self.open.len));
                if !records.is_empty() && bytes + record.record_len() > room {
                    break;
                }
                (seq, last_time_ms, bytes) = (record.seq, time_ms, bytes + record.record_len());
                records.push(record);
            }
            let run = &transactions[appended..appended + records.len()];
            let mut write_pages = |i: usize, w: &mut record::RecordWriter<'_, dyn Write + '_>| {
                for &(pgno, frame) in &run[i].pages {
                    w.page(pgno, frames_read.page(file, frame, &mut page)?)?;
                }
                Ok(())
            };
            match records.as_slice() {
                [alone] if alone.record_len() > record::WHOLE_RECORD => self.open.append(alone, |w| write_pages(0, w)),
                together => self.open.append_together(together, write_pages).map(|_| ()),
            }
            .map_err(io_error("appending to the log"))?;
            self.last_seq = seq;
            self.last_time_ms = last_time_ms;
            self.wal_salt = header.salt;
            self.wal_frame = run.last().expect("a run holds a record").last_frame;
            self.log_bytes_since_snapshot += bytes;
            self.wal_may_restart = false;
            appended += records.len();
            if self.open.len >= self.settings.segment_bytes {
                self.roll()?;
            }
        }
        let appended = appended as u64;
        if appended > 0 {
            self.write_wal_ahead(header.page_size, frames);
        }
        if self.open.opened.elapsed() >= self.settings.segment_age {
            self.roll()?;
        }
        Ok(appended)
    }

    /// Whether the WAL's frames up to `frames` that the log lacks fill the one read a capture
    /// makes of them (past it, a capture reads frame by frame).
    pub(crate) fn uncaptured_fill_a_read(&self, frames: u32) -> bool {
        let stride = wal::FRAME_HEADER_LEN + self.page_size as u64;
        frames.saturating_sub(self.wal_frame) as u64 * stride >= wal::BUFFERED_BYTES
    }

    /// Keeps the WAL written ahead of frame `frames` (see [`History::write_wal_ahead`]) after a
    /// commit whose capture waits: a batch's commits would otherwise outgrow what the last
    /// capture wrote ahead.
    pub(crate) fn keep_wal_written_ahead(&mut self, frames: u32) {
        self.write_wal_ahead(self.page_size, frames);
    }

    /// Keeps zeros written past the WAL's last frame (`frames` frames of `page_size` bytes), so
    /// commits to a growing WAL overwrite blocks already allocated: a commit that extends the
    /// file also makes its `fdatasync` write and wait for the file's new metadata, and commits
    /// ran 1.5× as fast into a WAL written ahead (docs/design.md). SQLite reads a WAL only up
    /// to its first frame whose salt and checksum fail, as zeros do. Best effort: a write
    /// refused (a full disk) only leaves the WAL to grow as it would have. A WAL of fewer than
    /// [`WAL_WRITTEN_AHEAD_PAST`] frames is left alone: the first request to an object just
    /// opened does not pay for room its next requests may never use.
    fn write_wal_ahead(&mut self, page_size: u32, frames: u32) {
        if self.following || frames < WAL_WRITTEN_AHEAD_PAST {
            return;
        }
        let end = wal::end_of_frames(page_size, frames);
        if self.wal_len >= end + WAL_WRITTEN_AHEAD / 2 {
            return;
        }
        let Some(file) = self.wal.as_ref() else { return };
        let Ok(len) = file.metadata().map(|m| m.len()) else { return };
        self.wal_len = len;
        if len >= end + WAL_WRITTEN_AHEAD / 2 {
            return;
        }
        let to = end + WAL_WRITTEN_AHEAD;
        // From one buffer of zeros for the whole process: a fresh one, zeroed for every refill,
        // cost as much CPU as the write.
        static ZEROS: [u8; WAL_WRITTEN_AHEAD as usize] = [0; WAL_WRITTEN_AHEAD as usize];
        let mut at = len;
        while at < to {
            let chunk = (to - at).min(WAL_WRITTEN_AHEAD) as usize;
            if file.write_all_at(&ZEROS[..chunk], at).is_err() {
                return;
            }
            at += chunk as u64;
            self.wal_len = at;
        }
    }

    /// Captures what the WAL holds beyond the log (after a crash, or on first open). Those
    /// commits happened before the WAL was last modified, which is the best time they can have.
    fn catch_up(&mut self, conn: &rusqlite::Connection) -> Result<()> {
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
    fn skip_checkpointed_wal(&mut self, conn: &rusqlite::Connection) -> Result<()> {
        let (frames, _) = wal_counts(conn, -1)?;
        self.wal_salt = self.current_wal_salt()?;
        self.wal_frame = frames.max(0) as u32;
        Ok(())
    }

    /// The salt of the WAL file as it is now (0 when there is none).
    fn current_wal_salt(&mut self) -> Result<u64> {
        self.wal = None;
        self.wal_header = None;
        self.wal_may_restart = true;
        let Some(file) = self.wal_file()? else { return Ok(0) };
        Ok(wal::read_header(file).map_err(io_error("reading the WAL"))?.map_or(0, |h| h.salt))
    }

    /// Records the database as it is now as a new entry with its own snapshot.
    fn rebase(&mut self, conn: &rusqlite::Connection) -> Result<()> {
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

    /// Appends (and syncs) the entry saying the state at `seq` is the snapshot at `seq`.
    fn append_restore_entry(&mut self, seq: u64, db_pages: u32) -> Result<()> {
        self.append_restore_entry_at(seq, db_pages, 0, 0)
    }

    /// As [`History::append_restore_entry`], for a state that is the WAL read up to a position.
    fn append_restore_entry_at(&mut self, seq: u64, db_pages: u32, wal_salt: u64, wal_frame: u32) -> Result<()> {
        let time_ms = now_ms().max(self.last_time_ms);
        let entry = Header {
            kind: Kind::Restore,
            seq,
            time_ms,
            page_size: self.page_size,
            db_pages,
            wal_salt,
            wal_frame,
            n_pages: 0,
            packed_len: 0,
        };
        self.open.append(&entry, |_| Ok(())).map_err(io_error("appending to the log"))?;
        self.sync()?;
        self.last_seq = seq;
        self.last_time_ms = time_ms;
        Ok(())
    }

    /// Whether the WAL has grown enough to checkpoint.
    pub(crate) fn wants_checkpoint(&self, frames: u32) -> bool {
        frames >= self.settings.checkpoint_frames
    }

    /// Makes the log durable, then checkpoints the WAL into the database file; takes a snapshot
    /// and prunes what retention no longer needs when it is time.
    /// A failed snapshot or prune is only logged: the log is whole without them, and the next
    /// checkpoint tries again.
    pub(crate) fn checkpoint(&mut self, conn: &rusqlite::Connection) -> Result<()> {
        self.writing(|h| h.checkpoint_fully(conn))?;
        if let Err(e) = self.snapshot_if_due(conn) {
            tracing::warn!(log = %self.dir.display(), error = %e, "taking a snapshot or pruning failed; retrying at the next checkpoint");
        }
        Ok(())
    }

    /// Takes a snapshot (the WAL just checkpointed) when one is due, then prunes.
    fn snapshot_if_due(&mut self, conn: &rusqlite::Connection) -> Result<()> {
        let db_pages = self.db_pages(conn)?;
        let db_bytes = db_pages as u64 * self.page_size as u64;
        let snapshot_due = self.log_bytes_since_snapshot >= self.settings.snapshot_log_bytes.max(db_bytes)
            || (self.log_bytes_since_snapshot > 0
                && now_ms() - self.last_snapshot_ms >= self.settings.snapshot_age.as_millis() as i64);
        if snapshot_due && self.snapshots.last() != Some(&self.last_seq) {
            self.snapshot(conn, self.last_seq, db_pages)?;
            self.prune()?;
        }
        Ok(())
    }

    /// For a clean close, after [`History::checkpoint`]: spares the next open reading back
    /// what this one leaves. The open segment is noted as checked
    /// ([`OpenSegment::note_checked`]). A WAL of more than a few frames, every one of them in
    /// the database file and in the log, is emptied: otherwise the next open reads every frame
    /// back (SQLite rebuilds its WAL index from the whole file), a cost that grows with the
    /// writes before the close. The first write after it starts a new WAL, with new salts,
    /// which [`History::capture_at`] reads from its start. Only the database's owner closes
    /// this way (a follower never empties a WAL another process writes).
    pub(crate) fn close(&mut self, conn: &rusqlite::Connection) -> Result<()> {
        debug_assert!(!self.following, "a follower's history is not closed by its database");
        self.usable()?;
        self.open.note_checked().map_err(io_error("noting the log checked"))?;
        let frames = wal_counts(conn, -1)?.0;
        if frames <= EMPTY_WAL_PAST_FRAMES {
            // What `write_wal_ahead` wrote past the frames goes: a closed database keeps no
            // room to grow.
            if let (Some(file), Some(header)) = (self.wal.as_ref(), self.wal_header) {
                let end = wal::end_of_frames(header.page_size, frames.max(0) as u32);
                if file.metadata().is_ok_and(|m| m.len() > end) {
                    file.set_len(end).map_err(io_error("trimming the WAL"))?;
                    self.wal_len = end;
                }
            }
            return Ok(());
        }
        wal_counts(conn, rusqlite::ffi::SQLITE_CHECKPOINT_TRUNCATE)?;
        self.wal = None;
        self.wal_header = None;
        self.wal_may_restart = true;
        Ok(())
    }

    /// Syncs the log, then checkpoints every frame into the database file.
    fn checkpoint_fully(&mut self, conn: &rusqlite::Connection) -> Result<()> {
        self.open.sync().map_err(io_error("syncing the log"))?;
        let (log, done) = wal_counts(conn, rusqlite::ffi::SQLITE_CHECKPOINT_PASSIVE)?;
        // Fully checkpointed, SQLite restarts the log (new salts) at the next write.
        self.wal_may_restart = true;
        if log != done {
            return Err(Error::sql(rusqlite::ffi::SQLITE_BUSY, "the checkpoint could not finish"));
        }
        Ok(())
    }

    fn db_pages(&self, conn: &rusqlite::Connection) -> Result<u32> {
        conn.query_row("PRAGMA page_count", [], |r| r.get::<_, i64>(0)).map(|n| n as u32).map_err(Error::internal)
    }

    /// Snapshots the database (every change checkpointed, so it is the state at `seq`). The
    /// pages are read through the connection: a second descriptor on the file, once closed,
    /// would release the locks SQLite holds on it.
    fn snapshot(&mut self, conn: &rusqlite::Connection, seq: u64, db_pages: u32) -> Result<()> {
        let mut writer = SnapshotWriter::create(&self.dir, seq).map_err(io_error("writing a snapshot"))?;
        copy_pages(conn, &mut writer, self.page_size)?;
        writer
            .finish(seq, self.last_time_ms.max(now_ms()), self.page_size, db_pages)
            .map_err(io_error("writing a snapshot"))?;
        self.snapshot_taken(seq);
        Ok(())
    }

    /// Notes a snapshot now on disk at `seq`.
    fn snapshot_taken(&mut self, seq: u64) {
        self.snapshots.push(seq);
        self.snapshots.sort_unstable();
        self.snapshots.dedup();
        self.log_bytes_since_snapshot = 0;
        self.last_snapshot_ms = now_ms();
    }

    /// Seals the open segment, then starts the next (so a crash leaves at most one open).
    fn roll(&mut self) -> Result<()> {
        if let Some(sealed) = self.open.seal(&self.dir).map_err(io_error("sealing a log segment"))? {
            self.sealed.push(sealed);
        }
        self.open = OpenSegment::create(&self.dir, self.last_seq + 1).map_err(io_error("creating a log segment"))?;
        Ok(())
    }

    /// Makes every captured record durable.
    pub(crate) fn sync(&mut self) -> Result<()> {
        self.writing(|h| h.open.sync().map_err(io_error("syncing the log")))
    }

    /// Every entry after position `after` up to `upto` and perhaps a few either side, oldest
    /// first: the sealed segments' headers are read from disk, only those of segments that hold
    /// a position in that range.
    fn entries_between(&self, after: u64, upto: u64) -> Result<Vec<(PathBuf, Entry)>> {
        let mut all = Vec::new();
        for s in self.sealed.iter().filter(|s| s.last_seq > after && s.first_seq <= upto) {
            let entries = s.entries().map_err(|e| read_error(e, &format!("reading {}", s.path.display())))?;
            all.extend(entries.into_iter().map(|e| (s.path.clone(), e)));
        }
        all.extend(self.open.entries.iter().map(|e| (self.open.path.clone(), *e)));
        Ok(all)
    }

    /// The oldest position still restorable: the last entry at or before the start of the
    /// retention window (or the first there is).
    fn oldest_restorable(&self) -> Result<u64> {
        let window_start = now_ms() - self.settings.retention.as_millis() as i64;
        Ok(self.position_at(window_start)?.map_or_else(|| self.snapshots.first().copied().unwrap_or(0), |(seq, _)| seq))
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

    /// Checks that `bookmark` names a restorable point of this database.
    pub(crate) fn check(&self, bookmark: &Bookmark) -> Result<()> {
        if !bookmark.belongs_to(&self.id) || bookmark.seq > self.last_seq {
            return Err(Error::InvalidBookmark { message: format!("unknown bookmark {bookmark}") });
        }
        if bookmark.seq < self.oldest_restorable()? {
            return Err(Error::InvalidBookmark {
                message: format!(
                    "bookmark {bookmark} is older than the {}-day Time Travel window",
                    self.settings.retention.as_secs() / 86_400
                ),
            });
        }
        Ok(())
    }

    /// The snapshot and records that rebuild the state at `target`. Segments wholly before the
    /// snapshot or after the target are not read: a long history's restore reads only what it
    /// applies, and damage in a segment it does not pass through does not stop it.
    fn plan(&self, target: u64) -> Result<RestorePlan> {
        let base = base_snapshot(&self.snapshots, target)?;
        plan(&self.dir, &self.snapshots, self.entries_between(base, target)?, target)
    }

    /// Restores the state at `target`: rebuilds it, records it in history as a new entry, and
    /// swaps it in for the database file at `db_path`, which the caller has closed. Returns the
    /// new bookmark and the one before (the undo point).
    pub(crate) fn restore(&mut self, target: &Bookmark, db_path: &Path) -> Result<Restored> {
        self.usable()?;
        self.check(target)?;
        let previous = self.current();
        let plan = self.plan(target.seq)?;
        self.sync()?;
        let (tmp, out, db_pages) = build_image(db_path, &plan, self.page_size)?;
        self.writing(|h| h.install_restored(db_path, &tmp, out, db_pages))?;
        Ok(Restored { bookmark: self.current(), previous })
    }

    /// Records the rebuilt image as a new position in history, then swaps it in. The history
    /// takes it first (snapshot, marker, entry): a crash before the entry forgets the restore,
    /// and one after it is finished on the next open ([`finish_interrupted_restore`]).
    fn install_restored(&mut self, db_path: &Path, image_path: &Path, image: File, db_pages: u32) -> Result<()> {
        let seq = self.last_seq + 1;
        snapshot::write_from_file(&self.dir, &image, seq, now_ms().max(self.last_time_ms), self.page_size, db_pages)
            .map_err(io_error("writing a snapshot"))?;
        drop(image);
        self.snapshots.push(seq);
        self.log_bytes_since_snapshot = 0;
        self.last_snapshot_ms = now_ms();
        write_marker(&self.dir, RESTORE_MARKER, seq).map_err(io_error("writing the restore marker"))?;
        self.append_restore_entry(seq, db_pages)?;
        self.wal_salt = 0;
        self.wal_frame = 0;
        self.wal = None;
        self.wal_header = None;
        self.wal_may_restart = true;
        swap_in(db_path, image_path)?;
        // Durably gone before any write reaches the new file, or reopening would undo them.
        remove_marker(&self.dir, RESTORE_MARKER).map_err(io_error("removing the restore marker"))
    }

    /// Deletes snapshots and sealed segments no restorable bookmark needs.
    fn prune(&mut self) -> Result<()> {
        let oldest = self.oldest_restorable()?;
        let Some(base) = self.snapshots.iter().rev().find(|&&s| s <= oldest).copied() else { return Ok(()) };
        // The lists lose each file as it goes, so a failure part-way leaves them true.
        let mut outcome = Ok(());
        while let Some(&seq) = self.snapshots.first().filter(|&&s| s < base) {
            if let Err(e) = std::fs::remove_file(snapshot::path_for(&self.dir, seq)) {
                outcome = Err(io_error("removing an old snapshot")(e));
                break;
            }
            self.snapshots.remove(0);
        }
        while outcome.is_ok()
            && let Some(segment) = self.sealed.first().filter(|s| s.last_seq <= base)
        {
            if let Err(e) = std::fs::remove_file(&segment.path) {
                outcome = Err(io_error("removing an old log segment")(e));
                break;
            }
            self.sealed.remove(0);
        }
        sync_dir(&self.dir).map_err(io_error("syncing the log directory"))?;
        outcome
    }

    /// Bytes the history occupies on disk.
    pub(crate) fn disk_bytes(&self) -> u64 {
        std::fs::read_dir(&self.dir)
            .map(|entries| entries.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0)
    }
}

/// The snapshot and records that rebuild the state at `target`, from the snapshots and the
/// entries (in order) of a log in `dir`.
fn plan(dir: &Path, snapshots: &[u64], entries: Vec<(PathBuf, Entry)>, target: u64) -> Result<RestorePlan> {
    let base = base_snapshot(snapshots, target)?;
    let mut records = Vec::new();
    let mut expected = base + 1;
    for (path, e) in entries {
        if e.seq <= base || e.seq > target {
            continue;
        }
        if e.seq != expected || e.kind != Kind::Commit {
            return Err(damaged(format!(
                "the log has no usable record for position {expected} (found {} at {})",
                e.seq,
                path.display()
            )));
        }
        records.push((path, e.offset, e.seq));
        expected += 1;
    }
    if expected != target + 1 {
        return Err(damaged(format!("the log is missing positions {expected} to {target}")));
    }
    Ok(RestorePlan { snapshot: snapshot::path_for(dir, base), records })
}

/// The snapshot a restore to `target` starts from: the last at or before it.
fn base_snapshot(snapshots: &[u64], target: u64) -> Result<u64> {
    snapshots
        .iter()
        .rev()
        .find(|&&s| s <= target)
        .copied()
        .ok_or_else(|| damaged(format!("no snapshot at or before position {target}")))
}

/// Rebuilds the state a plan names into `out`, checking every byte read; returns its size in
/// pages.
fn build(plan: &RestorePlan, out: &File, page_size: u32) -> Result<u32> {
    let header = snapshot::copy_image(&plan.snapshot, out)
        .map_err(|e| read_error(e, &format!("reading {}", plan.snapshot.display())))?;
    let mut db_pages = header.db_pages;
    let mut segment: Option<(&Path, File, u64)> = None;
    let mut bufs = record::ApplyBuffers::default();
    // The positions of a packed record share its offset: it is read and unpacked once for all.
    for same_record in plan.records.chunk_by(|a, b| (&a.0, a.1) == (&b.0, b.1)) {
        let (path, offset, first) = &same_record[0];
        let last = same_record[same_record.len() - 1].2;
        if segment.as_ref().is_none_or(|(p, _, _)| p != path) {
            let file = File::open(path).map_err(io_error("opening a log segment"))?;
            let len = file.metadata().map_err(io_error("reading a log segment"))?.len();
            segment = Some((path, file, len));
        }
        let (_, file, len) = segment.as_ref().expect("just opened");
        let page_size = page_size as u64;
        let record = record::apply_at(file, *offset, *len, &mut bufs, *first..=last, |pgno, data| {
            out.write_all_at(data, (pgno as u64 - 1) * page_size)
        })
        .map_err(|e| read_error(e, &format!("record {first} in {}", path.display())))?;
        // `apply_at` refuses positions the record does not hold, so this is position `last`.
        db_pages = record.db_pages;
    }
    out.set_len(db_pages as u64 * page_size as u64).map_err(io_error("sizing the restored image"))?;
    out.sync_all().map_err(io_error("syncing the restored image"))?;
    Ok(db_pages)
}

/// Builds the database file at `db_path`, which must not exist yet, from the history log
/// beside it — snapshots and segments as another node left them, or as they were fetched
/// from shared storage — at the log's newest position, which it returns (`None` when the log
/// holds no snapshot to start from). Opening the database afterwards finds it as after a
/// clean close: the same bookmarks restore, and new commits continue the positions.
pub fn materialize(db_path: &Path) -> Result<Option<u64>> {
    if db_path.exists() {
        return Err(Error::Io {
            context: format!("materializing {}", db_path.display()),
            source: io::Error::from(io::ErrorKind::AlreadyExists),
        });
    }
    let dir = log_dir(db_path);
    let (mut segments, mut snapshots) = (Vec::new(), Vec::new());
    let listing = match std::fs::read_dir(&dir) {
        Ok(listing) => listing,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error("reading the log directory")(e)),
    };
    let mut sealed = Vec::new();
    for entry in listing {
        let path = entry.map_err(io_error("reading the log directory"))?.path();
        if let Some(s) = Sealed::from_path(&path) {
            sealed.push(s);
        } else if let Some(seq) = snapshot::seq_of(&path) {
            snapshots.push(seq);
        }
    }
    snapshots.sort_unstable();
    let Some(&newest_snapshot) = snapshots.last() else { return Ok(None) };
    // As a restore does (`History::plan`): segments wholly before the snapshot are not read.
    segments.extend(sealed.into_iter().filter(|s| s.last_seq > newest_snapshot).map(|s| (s.first_seq, s.path)));
    segments
        .extend(open_segments(&dir).map_err(io_error("reading the log directory"))?.into_iter().map(|(p, f)| (f, p)));
    segments.sort();
    let mut entries = Vec::new();
    for (_, path) in &segments {
        let found = segment::entries_of(path).map_err(|e| read_error(e, &format!("reading {}", path.display())))?;
        entries.extend(found.into_iter().map(|e| (path.clone(), e)));
    }
    let target = entries.last().map_or(newest_snapshot, |(_, e)| e.seq.max(newest_snapshot));
    let plan = plan(&dir, &snapshots, entries, target)?;
    let page_size = snapshot::read_header(&plan.snapshot)
        .map_err(|e| read_error(e, &format!("reading {}", plan.snapshot.display())))?
        .page_size;
    let (tmp, out, _) = build_image(db_path, &plan, page_size)?;
    drop(out);
    swap_in(db_path, &tmp)?;
    Ok(Some(target))
}

/// Runs a checkpoint in `mode` and returns (frames in the WAL, frames checkpointed).
fn wal_counts(conn: &rusqlite::Connection, mode: i32) -> Result<(i32, i32)> {
    let (mut log, mut done) = (0, 0);
    let rc =
        unsafe { rusqlite::ffi::sqlite3_wal_checkpoint_v2(conn.handle(), std::ptr::null(), mode, &mut log, &mut done) };
    if rc != rusqlite::ffi::SQLITE_OK {
        return Err(unsafe { Error::from_connection(conn.handle(), rc, false) });
    }
    Ok((log, done))
}

/// Streams every page of the database, in order, into a snapshot; answers how many.
#[cfg(kura_dbpage)]
fn copy_pages(conn: &rusqlite::Connection, writer: &mut SnapshotWriter, page_size: u32) -> Result<u32> {
    let _ = page_size;
    let mut count = 0;
    let mut pages = conn.prepare("SELECT data FROM sqlite_dbpage('main')").map_err(Error::internal)?;
    let mut rows = pages.query([]).map_err(Error::internal)?;
    while let Some(row) = rows.next().map_err(Error::internal)? {
        count += 1;
        let data = row.get_ref(0).and_then(|v| Ok(v.as_blob()?)).map_err(Error::internal)?;
        writer.write(data).map_err(io_error("writing a snapshot"))?;
    }
    Ok(count)
}

/// Streams every page of the database into a snapshot, reading the file itself: without
/// `sqlite_dbpage` there is no other way, at the cost that closing the descriptor releases
/// SQLite's POSIX locks on the file (the data directory's own lock still keeps other kura
/// processes out).
#[cfg(not(kura_dbpage))]
fn copy_pages(conn: &rusqlite::Connection, writer: &mut SnapshotWriter, page_size: u32) -> Result<u32> {
    let path = conn.path().map(PathBuf::from).ok_or_else(|| Error::Io {
        context: "taking a snapshot".into(),
        source: io::Error::other("the database has no file"),
    })?;
    let image = File::open(&path).map_err(io_error("opening the database file"))?;
    let len = image.metadata().map_err(io_error("reading the database file"))?.len();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < len {
        let n = buf.len().min((len - at) as usize);
        image.read_exact_at(&mut buf[..n], at).map_err(io_error("reading the database file"))?;
        writer.write(&buf[..n]).map_err(io_error("writing a snapshot"))?;
        at += n as u64;
    }
    Ok((len / page_size.max(1) as u64) as u32)
}
