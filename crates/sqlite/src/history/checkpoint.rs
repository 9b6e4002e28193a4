//! Checkpoints and closing: the log synced before SQLite moves the WAL into the database file
//! (so no committed transaction is missing from history), snapshots when due, segments rolled
//! and pruned past the retention.

use super::snapshot::SnapshotWriter;
use super::snapshot::copy_pages;
use super::wal::wal_counts;
use super::*;
use crate::error::{Error, Result};

/// Frames a WAL may hold at a clean close and be left as it is. An emptied WAL costs the next
/// open's first write one more sync (the new WAL's header); a WAL left full costs the next open
/// reading every frame back, about 8 µs each here against 150–200 µs for the sync.
pub(super) const EMPTY_WAL_PAST_FRAMES: i32 = 24;

impl History {
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
    pub(super) fn snapshot_if_due(&mut self, conn: &rusqlite::Connection) -> Result<()> {
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
    pub(super) fn checkpoint_fully(&mut self, conn: &rusqlite::Connection) -> Result<()> {
        self.open.sync().map_err(io_error("syncing the log"))?;
        let (log, done) = wal_counts(conn, rusqlite::ffi::SQLITE_CHECKPOINT_PASSIVE)?;
        // Fully checkpointed, SQLite restarts the log (new salts) at the next write.
        self.wal_may_restart = true;
        if log != done {
            return Err(Error::sql(rusqlite::ffi::SQLITE_BUSY, "the checkpoint could not finish"));
        }
        Ok(())
    }

    pub(super) fn db_pages(&self, conn: &rusqlite::Connection) -> Result<u32> {
        conn.query_row("PRAGMA page_count", [], |r| r.get::<_, i64>(0)).map(|n| n as u32).map_err(Error::internal)
    }

    /// Snapshots the database (every change checkpointed, so it is the state at `seq`). The
    /// pages are read through the connection: a second descriptor on the file, once closed,
    /// would release the locks SQLite holds on it.
    pub(super) fn snapshot(&mut self, conn: &rusqlite::Connection, seq: u64, db_pages: u32) -> Result<()> {
        let mut writer = SnapshotWriter::create(&self.dir, seq).map_err(io_error("writing a snapshot"))?;
        copy_pages(conn, &mut writer, self.page_size)?;
        writer
            .finish(seq, self.last_time_ms.max(now_ms()), self.page_size, db_pages)
            .map_err(io_error("writing a snapshot"))?;
        self.snapshot_taken(seq);
        Ok(())
    }

    /// Notes a snapshot now on disk at `seq`.
    pub(super) fn snapshot_taken(&mut self, seq: u64) {
        self.snapshots.push(seq);
        self.snapshots.sort_unstable();
        self.snapshots.dedup();
        self.log_bytes_since_snapshot = 0;
        self.last_snapshot_ms = now_ms();
    }

    /// Seals the open segment, then starts the next (so a crash leaves at most one open).
    pub(super) fn roll(&mut self) -> Result<()> {
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

    /// Deletes snapshots and sealed segments no restorable bookmark needs.
    pub(super) fn prune(&mut self) -> Result<()> {
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
}
