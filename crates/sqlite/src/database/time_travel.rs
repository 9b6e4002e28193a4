//! Time Travel on a database: capturing commits into its history (before a commit's answer
//! when the log is shipped, else in batches after), checkpointing only what the history
//! holds, bookmarks, and restore.

use std::sync::atomic::Ordering;

use super::Database;
use super::open::{connect, free_bytes};
use crate::error::{Error, Result};
use crate::history::{Bookmark, History, Restored, now_ms};

/// How often a database serving read-only because its history could not grow tries the
/// history again, before a transaction begins.
const HISTORY_RETRY_IN_PLACE: std::time::Duration = std::time::Duration::from_millis(250);

/// Owed commits captured together: one read of their WAL frames and one append for them all
/// rather than one of each per commit, which was a fifth of a Durable Object write's CPU
/// (docs/performance.md, "Time Travel's capture").
pub(crate) const CAPTURE_BATCH: u64 = 32;

/// How long a commit may stay owed to the history before it is captured. A crash loses the
/// answer times of the commits still owed; the next open stamps them with the WAL's last
/// modification, so a point-in-time restore may place them up to this much late.
pub(crate) const CAPTURE_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

impl Database {
    /// After a commit: capture its frames into the history, and checkpoint when the WAL has
    /// grown. The commit is durable in the WAL already; if capturing or checkpointing fails,
    /// the connection is marked for reopening, and reopening recovers the log and captures
    /// from the WAL what it lacks.
    ///
    /// With a shipper, the log is then shipped; if that fails, the commit is not acknowledged
    /// (the error is returned) and the connection is marked for reopening.
    ///
    /// Without a shipper nothing waits on the log, so the commit is owed to it
    /// ([`Database::after_commit_answered_first`]) and captured with others once
    /// [`Database::capture_due`] says so, after the answers are out: whoever runs the database
    /// calls [`Database::settle_if_due`] then (the actor, after each round of its commands).
    pub(super) fn after_commit(&mut self) -> Result<()> {
        if self.history.is_none() {
            return Ok(());
        }
        if self.options.shipper.is_none() {
            self.after_commit_answered_first();
            return Ok(());
        }
        if self.capture_or_reopen().is_err() {
            return self.ship_required();
        }
        self.checkpoint_if_due();
        self.ship()
    }

    /// While the history cannot grow (the database serving read-only since it opened), tries
    /// it again on this connection before a transaction begins: at once if its filesystem has
    /// more room than when it last failed, else at most every [`HISTORY_RETRY_IN_PLACE`]. Once
    /// there is room, the history opens (capturing what the WAL holds beyond its log) and the
    /// transaction about to begin may write, so the first write after space is freed is not
    /// refused.
    pub(super) fn retry_full_history(&mut self) {
        let Some(since) = self.capture.history_full_since else { return };
        let Some(settings) = self.options.history.clone() else { return };
        if self.in_transaction() {
            return;
        }
        let free = free_bytes(&self.path);
        let more_room = matches!((free, self.capture.history_full_free), (Some(now), Some(then)) if now > then);
        if since.elapsed() < HISTORY_RETRY_IN_PLACE && !more_room {
            return;
        }
        let (identity, path, conn) = (&self.options.identity, &self.path, &self.conn);
        let opened =
            self.authorizer.internal(|| History::open(identity, path, conn, settings, false)).and_then(|history| {
                self.authorizer.internal(|| conn.pragma_update(None, "query_only", false)).map_err(Error::internal)?;
                Ok(history)
            });
        match opened {
            Ok(history) => {
                tracing::info!(path = %self.path.display(), "the history can grow again; writes resume");
                self.history = Some(history);
                self.capture.history_full_since = None;
                self.capture.history_full_free = None;
                self.capture.captured_commits = self.capture.wal.commits.load(Ordering::Relaxed);
                self.capture.owed_times.clear();
                self.capture.oldest_owed = None;
                self.measure_history();
            }
            Err(e) => {
                tracing::debug!(path = %self.path.display(), error = %e, "the history still cannot grow");
                self.capture.history_full_since = Some(std::time::Instant::now());
                self.capture.history_full_free = free;
            }
        }
    }

    /// Whether the WAL has grown to the history's checkpoint mark since its last checkpoint.
    pub(crate) fn checkpoint_due(&self) -> bool {
        self.wal_past_checkpoint_mark_by(0)
    }

    /// Whether the WAL, written since its last checkpoint (the hook's frame count is the
    /// WAL's only once a commit follows one), holds `frames` more than the history's mark.
    fn wal_past_checkpoint_mark_by(&self, frames: u32) -> bool {
        let (in_wal, commits) =
            (self.capture.wal.frames.load(Ordering::Relaxed), self.capture.wal.commits.load(Ordering::Relaxed));
        commits > self.capture.checkpointed_at_commits
            && self.history.as_ref().is_some_and(|history| history.wants_checkpoint(in_wal.saturating_sub(frames)))
    }

    /// Checkpoints the WAL once it has grown to the mark, every frame of it captured already;
    /// a failure marks the connection for reopening.
    fn checkpoint_if_due(&mut self) {
        if !self.checkpoint_due() || self.owes_capture() {
            return;
        }
        let conn = &self.conn;
        if let Some(history) = self.history.as_mut() {
            match self.authorizer.internal(|| history.checkpoint(conn)) {
                Ok(()) => self.capture.checkpointed_at_commits = self.capture.wal.commits.load(Ordering::Relaxed),
                Err(e) => {
                    tracing::error!(path = %self.path.display(), error = %e, "checkpoint failed");
                    self.poisoned = true;
                }
            }
        }
        self.measure_history();
    }

    /// Once the answers of a round of commands are out: captures the commits owed to the
    /// history if that is due, then checkpoints if that is due. A capture of 32 commits, or a
    /// checkpoint, on the path of the commit that made it due put the whole cost on one answer:
    /// with 16 clients over a thousand objects, that tail cost more throughput than its CPU.
    pub fn settle_if_due(&mut self) {
        if !self.poisoned && (self.capture_due() || self.checkpoint_due()) {
            self.settle_history();
        }
    }

    /// Captures the commits owed to the history, then checkpoints if that is due: after a
    /// commit that made the capture due, or for a caller that could not see to it.
    pub(crate) fn settle_history(&mut self) {
        if self.capture_owed().is_ok() {
            self.checkpoint_if_due();
        }
    }

    /// After a commit that needs no shipping (a checkpoint it makes due follows its capture):
    /// it is owed to the history, stamped with this moment. Its position is known already
    /// ([`Database::bookmark`]); it is captured with others once [`Database::capture_due`]
    /// says so, or by whatever reads the history first. The commit is durable in the WAL,
    /// which is checkpointed only after a capture; after a crash, the next open captures it
    /// from the WAL at the same position.
    pub(super) fn after_commit_answered_first(&mut self) {
        let owed = self.owed_commits();
        if owed > self.capture.owed_times.len() as u64 {
            let now = now_ms();
            self.capture.owed_times.resize(owed as usize, now);
        }
        if self.capture.oldest_owed.is_none() && owed > 0 {
            self.capture.oldest_owed = Some(std::time::Instant::now());
        }
        let frames = self.capture.wal.frames.load(Ordering::Relaxed);
        if let Some(history) = self.history.as_mut() {
            history.keep_wal_written_ahead(frames);
        }
    }

    /// Commits answered before their capture.
    fn owed_commits(&self) -> u64 {
        self.capture.wal.commits.load(Ordering::Relaxed) - self.capture.captured_commits
    }

    /// Whether commits were answered before their capture and are still owed to the history.
    pub(crate) fn owes_capture(&self) -> bool {
        self.history.is_some() && self.owed_commits() > 0
    }

    /// Whether the commits owed to the history should be captured now: enough of them to read
    /// and write in one go ([`CAPTURE_BATCH`], or frames enough to fill the one read a capture
    /// makes), the oldest answered [`CAPTURE_DELAY`] ago, or the WAL due a checkpoint (which
    /// waits for them). Until then they are durable in the WAL, and their answer times are kept
    /// here for their records.
    pub(crate) fn capture_due(&self) -> bool {
        let frames = self.capture.wal.frames.load(Ordering::Relaxed);
        self.owes_capture()
            && (self.owed_commits() >= CAPTURE_BATCH
                || self.history.as_ref().is_some_and(|history| history.uncaptured_fill_a_read(frames))
                || self.capture.oldest_owed.is_some_and(|answered| answered.elapsed() >= CAPTURE_DELAY)
                || self.checkpoint_due())
    }

    /// Captures the commits answered before their capture. A failure marks the connection for
    /// reopening, which captures them from the WAL.
    pub(crate) fn capture_owed(&mut self) -> Result<()> {
        if !self.owes_capture() {
            return Ok(());
        }
        self.capture_or_reopen()
    }

    /// Captures every commit the history lacks; a failure marks the connection for reopening,
    /// which recovers the log and captures from the WAL what it lacks.
    fn capture_or_reopen(&mut self) -> Result<()> {
        let captured = self.capture();
        if let Err(e) = &captured {
            tracing::error!(path = %self.path.display(), error = %e, "capturing a commit into the history failed");
            self.poisoned = true;
        }
        captured
    }

    /// Captures every commit the history lacks: those answered first (stamped when they were
    /// answered), then the last one.
    fn capture(&mut self) -> Result<()> {
        let Some(history) = self.history.as_mut() else { return Ok(()) };
        let commits = self.capture.wal.commits.load(Ordering::Relaxed);
        let appended = history.capture(self.capture.wal.frames.load(Ordering::Relaxed), &self.capture.owed_times)?;
        let owed = commits - self.capture.captured_commits;
        if appended != owed {
            // Bookmarks answered before the capture counted one position per commit; this
            // would mean one named another state. Never seen: loud, and fatal under test.
            tracing::error!(path = %self.path.display(), appended, owed, "the history captured another number of commits than the WAL hook counted");
            debug_assert_eq!(appended, owed, "commits captured against commits counted");
        }
        self.capture.captured_commits = commits;
        self.capture.owed_times.clear();
        self.capture.oldest_owed = None;
        Ok(())
    }

    /// Whether the WAL has grown well past the history's checkpoint mark. A lone write answered
    /// first may cross the mark (the actor checkpoints once its capture is done); past this,
    /// writes go to the actor, which checkpoints after its next commit.
    pub(crate) fn checkpoint_overdue(&self) -> bool {
        /// Frames past the mark that writes may add before the actor's checkpoint.
        const ROOM: u32 = 256;
        self.wal_past_checkpoint_mark_by(ROOM)
    }

    /// With a shipper, a commit the history could not take cannot be shipped: it fails.
    fn ship_required(&self) -> Result<()> {
        match &self.options.shipper {
            Some(_) => Err(Error::Io {
                context: "shipping the history".into(),
                source: std::io::Error::other("the commit could not be captured into the history"),
            }),
            None => Ok(()),
        }
    }

    /// Ships what the log holds that the shipper has not shipped; a failure marks the
    /// connection for reopening.
    pub(super) fn ship(&mut self) -> Result<()> {
        let (Some(shipper), Some(history)) = (&self.options.shipper, self.history.as_mut()) else { return Ok(()) };
        let shipped = history.view().and_then(|view| crate::history::ship_log(shipper.as_ref(), &view));
        if let Err(e) = &shipped {
            tracing::error!(path = %self.path.display(), error = %e, "shipping the history failed");
            self.poisoned = true;
        }
        shipped
    }

    /// Makes the history durable and checkpoints the WAL into the database file (taking a
    /// snapshot when one is due). Without a history, a plain checkpoint. A failure marks the
    /// connection for reopening.
    pub fn checkpoint(&mut self) -> Result<()> {
        let captured = self.capture();
        let conn = &self.conn;
        let outcome = match self.history.as_mut() {
            Some(history) => captured.and_then(|()| self.authorizer.internal(|| history.checkpoint(conn))),
            None => self
                .authorizer
                .internal(|| conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)"))
                .map_err(Error::internal),
        };
        match outcome {
            Ok(()) => self.capture.checkpointed_at_commits = self.capture.wal.commits.load(Ordering::Relaxed),
            Err(_) => self.poisoned = true,
        }
        outcome?;
        self.ship()
    }

    /// Captures, syncs the history and checkpoints, then leaves the history ready to reopen
    /// quickly, for a clean close; failures are only logged, since reopening recovers from the
    /// WAL.
    pub fn close_cleanly(&mut self) {
        if let Err(e) = self.checkpoint() {
            tracing::warn!(path = %self.path.display(), error = %e, "checkpoint on close failed");
            return;
        }
        let conn = &self.conn;
        if let Some(history) = self.history.as_mut()
            && let Err(e) = self.authorizer.internal(|| history.close(conn))
        {
            tracing::warn!(path = %self.path.display(), error = %e, "leaving the history ready to reopen failed");
        }
    }

    /// The bookmark of the current state (commits answered before their capture included).
    pub fn bookmark(&self) -> Result<Bookmark> {
        let history = self.history.as_ref().ok_or_else(|| self.no_history())?;
        Ok(match self.owed_commits() {
            0 => history.current(),
            owed => history.current_after(owed, self.capture.owed_times.last().copied().unwrap_or(0)),
        })
    }

    /// The bookmark of the last commit at or before `time_ms` (Unix milliseconds).
    pub fn bookmark_for_time(&mut self, time_ms: i64) -> Result<Bookmark> {
        self.capture_owed()?;
        self.history.as_ref().ok_or_else(|| self.no_history())?.bookmark_for_time(time_ms)
    }

    /// The newest commits and restores still in the Time Travel window, newest first: at most
    /// `limit`, before the bookmark `before` when given.
    pub fn timeline(&mut self, limit: usize, before: Option<&Bookmark>) -> Result<Vec<crate::Moment>> {
        self.capture_owed()?;
        let history = self.history.as_ref().ok_or_else(|| self.no_history())?;
        if let Some(b) = before {
            history.check(b)?;
        }
        history.timeline(limit, before.map(|b| b.seq))
    }

    /// Bytes the history occupies on disk (log and snapshots).
    pub fn history_bytes(&self) -> u64 {
        self.history.as_ref().map_or(0, |h| h.disk_bytes())
    }

    /// Restores the database to `bookmark`: the state there is rebuilt from the history (every
    /// byte checked), becomes a new entry in it, and replaces the file. Call between
    /// transactions. Returns the new bookmark and the previous one (the undo point).
    pub fn restore(&mut self, bookmark: &Bookmark) -> Result<Restored> {
        // A commit answered before its capture is in the WAL only, which the restore replaces.
        self.capture_owed()?;
        self.history.as_ref().ok_or_else(|| self.no_history())?.check(bookmark)?;
        self.rollback();
        // Close the file (finalizing every statement first); the history swaps it.
        self.finalize_statements();
        let history = self.history.as_mut().ok_or(Error::NoHistory)?;
        let closed =
            std::mem::replace(&mut self.conn, rusqlite::Connection::open_in_memory().map_err(Error::internal)?);
        drop(closed);
        // Released before the reopen below takes it again, on the same file if the restore
        // failed before swapping it.
        self.file_lock = None;
        let outcome = history.restore(bookmark, &self.path);
        // Whatever happened, serve the file as it now is; if that fails, or the history can
        // take no more, nothing more runs on this connection.
        self.poisoned = history.is_broken();
        match connect(&self.options, &self.authorizer, &self.deadline, self.epoch, &self.capture.wal) {
            Ok(connected) => {
                self.conn = connected.conn;
                self.file_lock = connected.file_lock;
            }
            Err(e) => {
                self.poisoned = true;
                return Err(e);
            }
        }
        self.size = None;
        self.indexes.clear();
        let restored = outcome?;
        self.ship()?;
        Ok(restored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::database::DatabaseOptions;
    use crate::history::HistorySettings;
    use crate::request::{Request, Statement, Value};

    fn open(dir: &std::path::Path) -> Database {
        let options =
            DatabaseOptions::new(dir.join("db.sqlite")).create(true).history(HistorySettings::default(), "db");
        Database::open(&options).unwrap()
    }

    fn request(sql: &str) -> Request {
        Request::new(vec![Statement::new(sql)])
    }

    fn ids(db: &mut Database) -> Vec<i64> {
        let rows = db.execute_alone(&request("SELECT id FROM t ORDER BY id")).unwrap().pop().unwrap().rows;
        rows.iter().map(|r| if let Value::Integer(i) = r[0] { i } else { -1 }).collect()
    }

    /// Lone writes answered before their capture: each answer's bookmark is the position its
    /// commit takes once captured, with the time it was answered, and whatever reads the
    /// history (a restore here, which replaces the WAL they are in) captures them first.
    #[test]
    fn commits_answered_before_their_capture_are_named_by_their_answers() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = open(dir.path());
        db.execute_alone(&request("CREATE TABLE t (id INTEGER PRIMARY KEY)")).unwrap();
        let before = db.bookmark().unwrap();
        let mut answered = Vec::new();
        for id in 1..=3 {
            db.execute_alone_answered_first(&request(&format!("INSERT INTO t VALUES ({id})"))).unwrap();
            answered.push(db.bookmark().unwrap());
        }
        // A write that changes nothing commits nothing, and takes no position.
        db.execute_alone_answered_first(&request("DELETE FROM t WHERE id = 99")).unwrap();
        assert_eq!(db.bookmark().unwrap(), answered[2]);
        assert!(db.owes_capture());
        assert_eq!(answered.iter().map(|b| b.seq).collect::<Vec<_>>(), [1, 2, 3].map(|n| before.seq + n));

        let timeline = db.timeline(10, None).unwrap();
        assert!(!db.owes_capture(), "reading the timeline captured what was owed");
        let listed: Vec<Bookmark> = timeline.iter().take(3).map(|m| m.bookmark).collect();
        assert_eq!(listed, answered.iter().rev().copied().collect::<Vec<_>>(), "same positions and times");
        assert_eq!(db.bookmark().unwrap(), answered[2]);

        db.execute_alone_answered_first(&request("INSERT INTO t VALUES (4)")).unwrap();
        db.restore(&answered[1]).unwrap();
        assert_eq!(ids(&mut db), [1, 2]);
        let undo = db.timeline(1, None).unwrap()[0].bookmark;
        assert_eq!(undo.seq, answered[2].seq + 2, "the fourth commit was captured before the restore");
    }

    /// Lone writes answered first may cross the history's checkpoint mark: the one that does
    /// leaves the checkpoint due (settled after its capture), and only a WAL well past the
    /// mark is overdue (writes then go where the checkpoint follows the commit).
    #[test]
    fn a_lone_write_past_the_checkpoint_mark_leaves_the_checkpoint_due() {
        let dir = tempfile::tempdir().unwrap();
        let settings = HistorySettings { checkpoint_frames: 4, ..HistorySettings::default() };
        let mut db =
            Database::open(&DatabaseOptions::new(dir.path().join("db.sqlite")).create(true).history(settings, "db"))
                .unwrap();
        db.execute_alone(&request("CREATE TABLE t (id INTEGER PRIMARY KEY)")).unwrap();
        let mut id = 0;
        let mut insert = |db: &mut Database| {
            id += 1;
            db.execute_alone_answered_first(&request(&format!("INSERT INTO t VALUES ({id})"))).unwrap();
        };
        for _ in 0..10 {
            if db.checkpoint_due() {
                break;
            }
            insert(&mut db);
        }
        assert!(db.checkpoint_due(), "four frames reached");
        assert!(!db.checkpoint_overdue(), "just past the mark");
        let answered = db.bookmark().unwrap();
        db.settle_history();
        assert!(!db.owes_capture() && !db.checkpoint_due(), "captured, then checkpointed");
        assert_eq!(db.bookmark().unwrap(), answered);
        insert(&mut db);
        assert!(!db.checkpoint_due(), "the WAL restarted after the checkpoint");

        for _ in 0..400 {
            if db.checkpoint_overdue() {
                break;
            }
            insert(&mut db);
        }
        assert!(db.checkpoint_overdue(), "a WAL far past its mark");
        db.execute_alone_answered_first(&request("INSERT INTO t VALUES (1000)")).unwrap();
        assert!(db.checkpoint_overdue(), "answered first: the capture and the checkpoint follow the answer");
        db.settle_if_due();
        assert!(!db.checkpoint_due() && !db.checkpoint_overdue(), "captured, then checkpointed once answered");
        assert_eq!(ids(&mut db).len(), id + 1);
    }

    /// A commit answered before its capture, then the process gone before the capture: the
    /// next open captures it from the WAL at the position its answer named.
    #[test]
    fn a_commit_answered_before_a_crash_keeps_its_position() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = open(dir.path());
        db.execute_alone(&request("CREATE TABLE t (id INTEGER PRIMARY KEY)")).unwrap();
        db.execute_alone(&request("INSERT INTO t VALUES (1)")).unwrap();
        let first = db.bookmark().unwrap();
        db.execute_alone_answered_first(&request("INSERT INTO t VALUES (2)")).unwrap();
        let answered = db.bookmark().unwrap();
        assert!(db.owes_capture());
        drop(db); // no clean close: the log lacks the commit, the WAL holds it

        let mut db = open(dir.path());
        assert_eq!(db.bookmark().unwrap().seq, answered.seq);
        assert!(!db.owes_capture());
        assert_eq!(ids(&mut db), [1, 2]);
        db.restore(&first).unwrap();
        assert_eq!(ids(&mut db), [1]);
        db.restore(&answered).unwrap();
        assert_eq!(ids(&mut db), [1, 2]);
    }
}
