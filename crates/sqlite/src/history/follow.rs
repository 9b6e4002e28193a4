//! The history of a database another process writes (a Durable Object workerd runs), kept as
//! Litestream keeps an application's: kura reads the committed WAL frames and appends them to
//! the same log as an owner would.
//!
//! Two connections (opened read-write for SQLite's counters, but `query_only`, and never
//! checkpointing on close) take turns holding a read transaction, so kura always pins the WAL:
//! SQLite restarts a WAL from its beginning only when no reader holds a snapshot of it, so no
//! frame can be overwritten before kura has captured it. Each [`Follower::capture`] counts the
//! committed frames (SQLite's own count, `SQLITE_CHECKPOINT_NOOP`), appends the new commits,
//! syncs the log (every second, before a checkpoint, and before a bookmark is handed out),
//! checkpoints (PASSIVE, only frames already in the log, only past `checkpoint_frames`) so the
//! WAL does not grow without end, then moves the pin forward: the free connection begins its
//! read before the other ends its.
//!
//! When kura cannot show that the WAL continues from its last capture (it was not attached
//! while the writer wrote and checkpointed), history continues from a new snapshot of the
//! database as it is, taken through one read at a known WAL position: every state is still
//! restorable, the commits in between are not each a bookmark. Restores need the writer gone.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::marker::RESTORE_MARKER;
use super::recover::finish_interrupted_restore_in;
use super::snapshot::SnapshotWriter;
use super::snapshot::copy_pages;
use super::wal::{read_wal_salt, wal_counts};
use super::{Bookmark, History, HistorySettings, LogShipper, Restored, io_error, now_ms};
use crate::error::{Error, Result};

/// A database another process writes, and its history.
pub struct Follower {
    identity: String,
    db_path: PathBuf,
    log_dir: PathBuf,
    settings: HistorySettings,
    attached: Option<Attached>,
}

struct Attached {
    history: History,
    /// Two connections; `pins[pinned]` holds a read transaction, the other none.
    pins: [Connection; 2],
    pinned: usize,
    /// When the log was last synced.
    synced: std::time::Instant,
    /// The database file's inode when attached: another means the writer replaced the file.
    inode: u64,
    /// The last checkpoint left frames the WAL still holds: another pass can let it start over.
    behind: bool,
}

/// The log is synced at least this often (and before every checkpoint kura runs).
const SYNC_EVERY: Duration = Duration::from_secs(1);

/// Names, in the log directory, the WAL position a follower let go at with every frame
/// checkpointed: the WAL's next incarnation then begins right after it.
const DETACHED_MARKER: &str = "detached";

/// The process that has the WAL database at `db` open, if another one has: every connection
/// holds a shared lock on the WAL index's "DMS" byte (after the eight WAL locks at 120) for as
/// long as it is open, and POSIX reports other processes' locks only.
pub fn open_elsewhere(db: &Path) -> Option<i32> {
    let shm = PathBuf::from(format!("{}-shm", db.display()));
    let file = std::fs::File::open(&shm).ok()?;
    let mut lock = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 128,
        l_len: 1,
        l_pid: 0,
    };
    // SAFETY: a valid descriptor and an initialised flock; F_GETLK only reads.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut lock) };
    (rc == 0 && lock.l_type != libc::F_UNLCK as libc::c_short).then_some(lock.l_pid)
}

fn open_pin(path: &Path) -> Result<Connection> {
    let open_error = |e: rusqlite::Error| Error::open(path, "", e);
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(open_error)?;
    // kura writes nothing: not through SQL, not by checkpointing the other process's WAL on
    // close (only PASSIVE checkpoints of frames already in the log, see `capture`).
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true).map_err(open_error)?;
    conn.pragma_update(None, "query_only", true).map_err(open_error)?;
    conn.busy_timeout(Duration::from_secs(5)).map_err(open_error)?;
    Ok(conn)
}

fn begin_read(conn: &Connection) -> Result<()> {
    conn.execute_batch("BEGIN; SELECT count(*) FROM sqlite_schema;").map_err(Error::internal)
}

fn end_read(conn: &Connection) -> Result<()> {
    conn.execute_batch("COMMIT").map_err(Error::internal)
}

fn inode(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Whether the file is a WAL-mode database (bytes 18 and 19 of its header are 2): a follower
/// pinning a database still in rollback mode would hold a lock its writer's switch to WAL
/// waits for.
fn is_wal_database(path: &Path) -> bool {
    use std::io::Read;
    let mut header = [0u8; 100];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut header)).is_ok() && header[18] == 2 && header[19] == 2
}

/// Two pins on the database, the first holding a read. Both have read once: a connection
/// opens the WAL only then, and counts no frames before.
fn pin(path: &Path) -> Result<[Connection; 2]> {
    let pins = [open_pin(path)?, open_pin(path)?];
    pins[1].query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(())).map_err(Error::internal)?;
    begin_read(&pins[0])?;
    Ok(pins)
}

impl Follower {
    /// The history of the database at `db_path`, kept in `log_dir`, bookmarks carrying
    /// `identity`. Nothing is opened until [`Follower::attach`].
    pub fn new(identity: &str, db_path: &Path, log_dir: &Path, settings: HistorySettings) -> Follower {
        Follower {
            identity: identity.to_owned(),
            db_path: db_path.to_owned(),
            log_dir: log_dir.to_owned(),
            settings,
            attached: None,
        }
    }

    /// The database file followed.
    pub fn db_path(&self) -> &Path {
        &self.db_path
    }

    /// Whether the follower holds the WAL now.
    pub fn is_attached(&self) -> bool {
        self.attached.is_some()
    }

    /// Whether the last checkpoint left WAL frames behind, so another capture, even with
    /// nothing new, lets the WAL start over.
    pub fn behind(&self) -> bool {
        self.attached.as_ref().is_some_and(|a| a.behind)
    }

    /// Starts following (captures what is new); false if there is no WAL-mode database to
    /// follow yet, or a restore of it must first be finished without its writer.
    pub fn attach(&mut self) -> Result<bool> {
        if self.attached.is_some() {
            return Ok(true);
        }
        if !is_wal_database(&self.db_path) {
            return Ok(false);
        }
        std::fs::create_dir_all(&self.log_dir).map_err(io_error("creating the log directory"))?;
        if self.log_dir.join(RESTORE_MARKER).exists() && self.writer_present() {
            // A restore a crash interrupted replaces the file: not while its writer has it.
            tracing::warn!(db = %self.db_path.display(), "an interrupted restore waits for the database's writer to close it");
            return Ok(false);
        }
        let restore_interrupted = finish_interrupted_restore_in(&self.db_path, &self.log_dir)?;
        let inode = inode(&self.db_path).unwrap_or(0);
        // Pinned before the history looks at the WAL, so nothing it counts can go meanwhile.
        let pins = pin(&self.db_path)?;
        let history = History::open_in(
            &self.identity,
            &self.db_path,
            &self.log_dir,
            &pins[1],
            self.settings.clone(),
            restore_interrupted,
            true,
        )?;
        let mut attached =
            Attached { history, pins, pinned: 0, synced: std::time::Instant::now(), inode, behind: false };
        attached.capture()?;
        self.attached = Some(attached);
        Ok(true)
    }

    /// Captures what was committed since the last capture (attaching first if needed).
    pub fn capture(&mut self) -> Result<()> {
        if let Some(attached) = &self.attached
            && inode(&self.db_path) != Some(attached.inode)
        {
            // The writer replaced the file (deleteAll): follow the new one, from a new base.
            tracing::info!(db = %self.db_path.display(), "the database file was replaced; following the new one");
            self.attached = None;
        }
        if !self.attach()? {
            return Ok(());
        }
        let attached = self.attached.as_mut().expect("attached");
        let outcome = attached.capture();
        if outcome.is_err() {
            // Reattaching recovers the log as after a crash.
            self.attached = None;
        }
        outcome
    }

    /// Ships what the log holds that `shipper` has not shipped yet (nothing when not
    /// attached: there is nothing captured since). Ownership replaced is
    /// [`Error::Superseded`].
    pub fn ship(&mut self, shipper: &dyn LogShipper) -> Result<()> {
        let Some(attached) = self.attached.as_mut() else { return Ok(()) };
        super::ship::ship_log(shipper, &attached.history.view()?)
    }

    /// Runs `read` on the database as last captured (the pinned read), or answers `None` when
    /// not attached.
    pub fn read_captured<T>(&self, read: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Option<Result<T>> {
        let attached = self.attached.as_ref()?;
        Some(read(&attached.pins[attached.pinned]).map_err(Error::internal))
    }

    /// The directory the history log is kept in.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    /// Whether another process has the database open (it holds the shared lock SQLite's
    /// unix VFS takes on the WAL index for as long as a connection is open).
    pub fn writer_present(&self) -> bool {
        open_elsewhere(&self.db_path).is_some()
    }

    /// Captures the rest and lets go of the WAL (the writer has closed the database). With
    /// every frame checkpointed, the position is noted, so the WAL's next incarnation is known
    /// to follow it.
    pub fn detach(&mut self) -> Result<()> {
        if self.attached.is_some() {
            self.capture()?;
        }
        if let Some(mut attached) = self.attached.take() {
            attached.history.sync()?;
            let free = &attached.pins[1 - attached.pinned];
            let (log, done) = wal_counts(free, rusqlite::ffi::SQLITE_CHECKPOINT_PASSIVE).unwrap_or((-1, 0));
            let history = &attached.history;
            if log >= 0 && log == done && log as u32 == history.wal_frame && !self.writer_present() {
                let text = format!("{:016x} {:08x}\n", history.wal_salt, history.wal_frame);
                let marker = self.log_dir.join(DETACHED_MARKER);
                std::fs::write(&marker, text)
                    .and_then(|()| std::fs::File::open(&marker)?.sync_all())
                    .map_err(io_error("writing the detach marker"))?;
            }
        }
        Ok(())
    }

    fn history(&mut self) -> Result<&mut History> {
        if !self.attach()? {
            return Err(Error::InvalidBookmark { message: "the object has stored nothing yet".into() });
        }
        Ok(&mut self.attached.as_mut().expect("attached").history)
    }

    /// The bookmark of the last captured state.
    pub fn bookmark(&mut self) -> Result<Bookmark> {
        self.capture()?;
        // A bookmark handed out is durable.
        let history = self.history()?;
        history.sync()?;
        Ok(history.current())
    }

    /// The bookmark of the last commit at or before `time_ms`.
    pub fn bookmark_for_time(&mut self, time_ms: i64) -> Result<Bookmark> {
        self.capture()?;
        let history = self.history()?;
        history.sync()?;
        history.bookmark_for_time(time_ms)
    }

    /// Restores the database to `target`. The writer must be gone (its process stopped): the
    /// file is replaced under it otherwise. The restored file is pinned again before this
    /// returns, so whatever the writer commits next is captured.
    pub fn restore(&mut self, target: &Bookmark) -> Result<Restored> {
        if self.writer_present() {
            return Err(Error::sql(
                rusqlite::ffi::SQLITE_BUSY,
                "the database is open in another process; stop it first",
            ));
        }
        self.capture()?;
        let attached = self
            .attached
            .take()
            .ok_or_else(|| Error::InvalidBookmark { message: format!("unknown bookmark {target}") })?;
        // The connections close before the file is replaced.
        let Attached { mut history, pins, .. } = attached;
        drop(pins);
        let restored = history.restore(target, &self.db_path)?;
        let _ = std::fs::remove_file(self.log_dir.join(DETACHED_MARKER));
        let pins = pin(&self.db_path)?;
        let inode = inode(&self.db_path).unwrap_or(0);
        self.attached =
            Some(Attached { history, pins, pinned: 0, synced: std::time::Instant::now(), inode, behind: false });
        Ok(restored)
    }
}

impl Attached {
    fn capture(&mut self) -> Result<()> {
        let free = &self.pins[1 - self.pinned];
        self.history.follow_capture(free)?;
        let frames = wal_counts(free, -1)?.0.max(0) as u32;
        let checkpoint = self.history.wants_checkpoint(frames) || (self.behind && frames > 0);
        // The WAL holds every commit durably; the log is synced before kura lets frames be
        // checkpointed, and every second, so a crash of kura costs at most that much of the
        // history's detail (the next attach finds the WAL moved on and takes a new base).
        if checkpoint || self.synced.elapsed() >= SYNC_EVERY {
            self.history.sync()?;
            self.synced = std::time::Instant::now();
        }
        if checkpoint {
            // Frames up to the pinned reader's snapshot, all in the synced log already. Busy
            // (another checkpoint runs) is no failure: the next capture tries again.
            self.behind = match wal_counts(free, rusqlite::ffi::SQLITE_CHECKPOINT_PASSIVE) {
                Ok((log, done)) => done < log,
                Err(_) => true,
            };
        }
        // The new pin before the old one goes; if it cannot be had, the old one stays.
        if let Err(e) = begin_read(free) {
            tracing::debug!(error = %e, "could not move the pin on a followed database; it stays where it was");
            return Ok(());
        }
        end_read(&self.pins[self.pinned])?;
        self.pinned = 1 - self.pinned;
        Ok(())
    }
}

impl History {
    /// Follow mode's start: a first base, or a check that the WAL continues from the last
    /// capture (else a new base), then what the WAL holds beyond it.
    pub(super) fn follow_begin(&mut self, conn: &Connection, fresh: bool) -> Result<()> {
        let detached = std::fs::read_to_string(self.dir.join(DETACHED_MARKER)).ok().and_then(|text| {
            let mut parts = text.split_whitespace();
            Some((u64::from_str_radix(parts.next()?, 16).ok()?, u32::from_str_radix(parts.next()?, 16).ok()?))
        });
        let _ = std::fs::remove_file(self.dir.join(DETACHED_MARKER));
        if fresh || self.snapshots.is_empty() || !self.wal_continues(conn, detached)? {
            self.follow_rebase(conn)?;
        }
        self.follow_capture(conn)
    }

    /// The WAL's salt and committed frame count, read so that both belong to one state of it
    /// (SQLite publishes a restart's count before it rewrites the header).
    fn wal_position(&mut self, conn: &Connection) -> Result<(u64, u32)> {
        loop {
            let salt = read_wal_salt(&self.wal_path)?;
            let frames = wal_counts(conn, -1)?.0.max(0) as u32;
            if read_wal_salt(&self.wal_path)? == salt {
                return Ok((salt, frames));
            }
        }
    }

    /// Whether the WAL as it is now continues from the last capture: the same incarnation at or
    /// past the frame captured; no WAL yet, when none was captured; or the incarnation right
    /// after (salt-1 one higher) one let go of with every frame captured and checkpointed.
    fn wal_continues(&mut self, conn: &Connection, detached: Option<(u64, u32)>) -> Result<bool> {
        let (salt, frames) = self.wal_position(conn)?;
        let next_incarnation = (salt >> 32) as u32 == ((self.wal_salt >> 32) as u32).wrapping_add(1);
        Ok(match (self.wal_salt, salt) {
            (0, 0) => true,
            (0, _) => false,
            (ours, now) if ours == now => frames >= self.wal_frame,
            _ => next_incarnation && detached == Some((self.wal_salt, self.wal_frame)),
        })
    }

    /// Appends every transaction committed since the last capture (`conn` outside any
    /// transaction, the WAL pinned by another connection).
    pub(super) fn follow_capture(&mut self, conn: &Connection) -> Result<()> {
        // The other process may have restarted the WAL since: read it afresh.
        self.wal = None;
        self.wal_header = None;
        self.wal_may_restart = true;
        let (salt, frames) = self.wal_position(conn)?;
        if salt == self.wal_salt && frames < self.wal_frame {
            // A restart caught half-published; while pinned it cannot be a break.
            return Ok(());
        }
        self.writing(|h| h.capture_at(frames, &[], None)).map(drop)
    }

    /// Records the database as it is now as a new entry with its own snapshot and the WAL
    /// position it was read at.
    pub(super) fn follow_rebase(&mut self, conn: &Connection) -> Result<()> {
        if self.last_seq > 0 {
            tracing::warn!(log = %self.dir.display(), "the WAL does not continue from the last capture; history continues from a new snapshot");
        }
        let seq = self.last_seq + 1;
        let (salt, frame, db_pages) = self.consistent_snapshot(conn, seq)?;
        self.append_restore_entry_at(seq, db_pages, salt, frame)?;
        self.wal_salt = salt;
        self.wal_frame = frame;
        Ok(())
    }

    /// A snapshot at `seq` of the database through one read, and the WAL position that read
    /// saw: the committed frame count before and after it must agree (else another commit came
    /// in between, and it is taken again).
    fn consistent_snapshot(&mut self, conn: &Connection, seq: u64) -> Result<(u64, u32, u32)> {
        for attempt in 0.. {
            let before = self.wal_position(conn)?;
            let mut writer = SnapshotWriter::create(&self.dir, seq).map_err(io_error("writing a snapshot"))?;
            let db_pages = copy_pages(conn, &mut writer, self.page_size)?;
            let after = self.wal_position(conn)?;
            if before != after {
                writer.abandon();
                if attempt == 1000 {
                    return Err(Error::sql(
                        rusqlite::ffi::SQLITE_BUSY,
                        "the database never paused long enough to snapshot",
                    ));
                }
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            writer
                .finish(seq, self.last_time_ms.max(now_ms()), self.page_size, db_pages)
                .map_err(io_error("writing a snapshot"))?;
            self.snapshot_taken(seq);
            return Ok((before.0, before.1, db_pages));
        }
        unreachable!("the loop returns")
    }
}
