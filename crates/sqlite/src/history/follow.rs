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

use super::snapshot::SnapshotWriter;
use super::{Bookmark, History, HistorySettings, Restored, copy_pages, io_error, now_ms, read_wal_salt, wal_counts};
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
}

/// The log is synced at least this often (and before every checkpoint kura runs).
const SYNC_EVERY: Duration = Duration::from_secs(1);

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
    let open_error = |e: rusqlite::Error| Error::Open { path: path.to_owned(), message: e.to_string() };
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

    /// Starts following (captures what is new); false if the database has no file yet.
    pub fn attach(&mut self) -> Result<bool> {
        if self.attached.is_some() {
            return Ok(true);
        }
        if !self.db_path.exists() {
            return Ok(false);
        }
        std::fs::create_dir_all(&self.log_dir).map_err(io_error("creating the log directory"))?;
        let restore_interrupted = super::finish_interrupted_restore_in(&self.db_path, &self.log_dir)?;
        let pins = [open_pin(&self.db_path)?, open_pin(&self.db_path)?];
        let history = History::open_in(
            &self.identity,
            &self.db_path,
            &self.log_dir,
            &pins[1],
            self.settings.clone(),
            restore_interrupted,
            true,
        )?;
        begin_read(&pins[0])?;
        let mut attached = Attached { history, pins, pinned: 0, synced: std::time::Instant::now() };
        // Between opening and pinning, new commits may have come: capture them too.
        attached.capture()?;
        self.attached = Some(attached);
        Ok(true)
    }

    /// Captures what was committed since the last capture (attaching first if needed).
    pub fn capture(&mut self) -> Result<()> {
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

    /// Whether another process has the database open (it holds the shared lock SQLite's
    /// unix VFS takes on the WAL index for as long as a connection is open).
    pub fn writer_present(&self) -> bool {
        open_elsewhere(&self.db_path).is_some()
    }

    /// Captures the rest and lets go of the WAL (the writer has closed the database).
    pub fn detach(&mut self) -> Result<()> {
        if self.attached.is_some() {
            self.capture()?;
            if let Some(attached) = self.attached.as_mut() {
                attached.history.sync()?;
            }
        }
        self.attached = None;
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
    /// file is replaced under it otherwise.
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
        history.restore(target, &self.db_path)
    }
}

impl Attached {
    fn capture(&mut self) -> Result<()> {
        let free = &self.pins[1 - self.pinned];
        self.history.follow_capture(free)?;
        let checkpoint = self.history.wants_checkpoint(wal_counts(free, -1)?.0.max(0) as u32);
        // The WAL holds every commit durably; the log is synced before kura lets frames be
        // checkpointed, and every second, so a crash of kura costs at most that much of the
        // history's detail (the next attach finds the WAL moved on and takes a new base).
        if checkpoint || self.synced.elapsed() >= SYNC_EVERY {
            self.history.sync()?;
            self.synced = std::time::Instant::now();
        }
        if checkpoint {
            // Frames up to the pinned reader's snapshot, all in the synced log already.
            wal_counts(free, rusqlite::ffi::SQLITE_CHECKPOINT_PASSIVE)?;
        }
        begin_read(free)?;
        end_read(&self.pins[self.pinned])?;
        self.pinned = 1 - self.pinned;
        Ok(())
    }
}

impl History {
    /// Follow mode's start: a first snapshot, or a check that the WAL continues from the last
    /// capture (else a new base), then what the WAL holds beyond it.
    pub(super) fn follow_begin(&mut self, conn: &Connection, fresh: bool) -> Result<()> {
        if fresh || self.snapshots.is_empty() {
            let (salt, frame, _) = self.consistent_snapshot(conn, self.last_seq)?;
            self.wal_salt = salt;
            self.wal_frame = frame;
        } else if !self.wal_continues(conn)? {
            self.follow_rebase(conn)?;
        }
        self.follow_capture(conn)
    }

    /// Whether the WAL as it is now continues from the last capture: the same incarnation
    /// (salt) at or past the frame captured, or any WAL after a restore or a first snapshot
    /// of a database that had none.
    fn wal_continues(&mut self, conn: &Connection) -> Result<bool> {
        let salt = read_wal_salt(&self.wal_path)?;
        let frames = wal_counts(conn, -1)?.0.max(0) as u32;
        Ok(self.wal_salt == 0 || (salt == self.wal_salt && frames >= self.wal_frame))
    }

    /// Appends every transaction committed since the last capture (`conn` outside any
    /// transaction).
    pub(super) fn follow_capture(&mut self, conn: &Connection) -> Result<()> {
        let frames = wal_counts(conn, -1)?.0.max(0) as u32;
        // The other process may have restarted or replaced the WAL since: read it afresh.
        self.wal = None;
        self.wal_header = None;
        self.wal_may_restart = true;
        let salt = read_wal_salt(&self.wal_path)?;
        if salt == self.wal_salt && salt != 0 && frames < self.wal_frame {
            return self.follow_rebase(conn);
        }
        self.writing(|h| h.capture_at(frames, None))
    }

    /// Records the database as it is now as a new entry with its own snapshot.
    pub(super) fn follow_rebase(&mut self, conn: &Connection) -> Result<()> {
        tracing::warn!(log = %self.dir.display(), "the WAL does not continue from the last capture; history continues from a new snapshot");
        let seq = self.last_seq + 1;
        let (salt, frame, db_pages) = self.consistent_snapshot(conn, seq)?;
        self.append_restore_entry(seq, db_pages)?;
        self.wal_salt = salt;
        self.wal_frame = frame;
        Ok(())
    }

    /// A snapshot at `seq` of the database through one read, and the WAL position that read
    /// saw: the committed frame count before and after it must agree (else another commit came
    /// in between, and it is taken again).
    fn consistent_snapshot(&mut self, conn: &Connection, seq: u64) -> Result<(u64, u32, u32)> {
        for attempt in 0.. {
            let before = (read_wal_salt(&self.wal_path)?, wal_counts(conn, -1)?.0.max(0) as u32);
            let mut writer = SnapshotWriter::create(&self.dir, seq).map_err(io_error("writing a snapshot"))?;
            let db_pages = copy_pages(conn, &mut writer, self.page_size)?;
            let after = (read_wal_salt(&self.wal_path)?, wal_counts(conn, -1)?.0.max(0) as u32);
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
