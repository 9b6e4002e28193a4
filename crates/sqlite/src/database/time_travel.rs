//! Time Travel on a database: capturing each commit into its history, checkpointing only what
//! the history holds, bookmarks, and restore.

use std::sync::atomic::Ordering;

use super::{Database, connect};
use crate::error::{Error, Result};
use crate::history::{Bookmark, Restored};

impl Database {
    /// After a commit: capture its frames into the history, and checkpoint when the WAL has
    /// grown. The commit is durable in the WAL already; if capturing or checkpointing fails,
    /// the connection is marked for reopening, and reopening recovers the log and captures
    /// from the WAL what it lacks.
    ///
    /// With a shipper, the log is then shipped; if that fails, the commit is not acknowledged
    /// (the error is returned) and the connection is marked for reopening.
    pub(super) fn after_commit(&mut self) -> Result<()> {
        let Some(history) = self.history.as_mut() else { return Ok(()) };
        let frames = self.wal_frames.load(Ordering::Relaxed);
        if let Err(e) = history.capture(frames) {
            tracing::error!(path = %self.path.display(), error = %e, "capturing a commit into the history failed");
            self.poisoned = true;
            return self.ship_required();
        }
        if history.wants_checkpoint(frames) {
            let conn = &self.conn;
            if let Err(e) = self.authorizer.internal(|| history.checkpoint(conn)) {
                tracing::error!(path = %self.path.display(), error = %e, "checkpoint failed");
                self.poisoned = true;
            }
            self.measure_history();
        }
        self.ship()
    }

    /// Whether a small commit now would stay light: no checkpoint of the WAL after it (with a
    /// history, one is due at a number of WAL frames; this leaves room for a request's worth).
    pub(crate) fn commit_stays_light(&self) -> bool {
        /// Frames a request may add without being expected to reach the checkpoint.
        const ROOM: u32 = 256;
        match &self.history {
            Some(history) => !history.wants_checkpoint(self.wal_frames.load(Ordering::Relaxed).saturating_add(ROOM)),
            None => true,
        }
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
        let shipped = history.view().and_then(|view| {
            shipper.ship(&view).map_err(|e| match e.is_superseded() {
                true => Error::Superseded { message: e.to_string() },
                false => {
                    Error::Io { context: "shipping the history".into(), source: std::io::Error::other(e.to_string()) }
                }
            })
        });
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
        let conn = &self.conn;
        let outcome = match self.history.as_mut() {
            Some(history) => self.authorizer.internal(|| {
                history.capture(self.wal_frames.load(Ordering::Relaxed))?;
                history.checkpoint(conn)
            }),
            None => self
                .authorizer
                .internal(|| conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)"))
                .map_err(Error::internal),
        };
        if outcome.is_err() {
            self.poisoned = true;
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

    /// The bookmark of the current state.
    pub fn bookmark(&self) -> Result<Bookmark> {
        Ok(self.history.as_ref().ok_or_else(|| self.no_history())?.current())
    }

    /// The bookmark of the last commit at or before `time_ms` (Unix milliseconds).
    pub fn bookmark_for_time(&self, time_ms: i64) -> Result<Bookmark> {
        self.history.as_ref().ok_or_else(|| self.no_history())?.bookmark_for_time(time_ms)
    }

    /// The newest commits and restores still in the Time Travel window, newest first: at most
    /// `limit`, before the bookmark `before` when given.
    pub fn timeline(&self, limit: usize, before: Option<&Bookmark>) -> Result<Vec<crate::Moment>> {
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
        self.history.as_ref().ok_or_else(|| self.no_history())?.check(bookmark)?;
        self.rollback();
        let history = self.history.as_mut().ok_or(Error::NoHistory)?;
        // Close the file (finalizing every statement first); the history swaps it.
        self.statements.clear();
        self.page_one = None;
        let closed =
            std::mem::replace(&mut self.conn, rusqlite::Connection::open_in_memory().map_err(Error::internal)?);
        drop(closed);
        let outcome = history.restore(bookmark, &self.path);
        // Whatever happened, serve the file as it now is; if that fails, or the history can
        // take no more, nothing more runs on this connection.
        self.poisoned = history.is_broken();
        match connect(&self.options, &self.authorizer, &self.deadline, self.epoch, &self.wal_frames) {
            Ok((conn, _)) => self.conn = conn,
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
