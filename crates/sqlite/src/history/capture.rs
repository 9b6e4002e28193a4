//! Capture: after each commit, the new WAL frames become one record per transaction in the
//! open segment, written but not synced (the WAL itself is durable until the next checkpoint).

use super::record::{self, Header, Kind};
use super::*;
use crate::error::Result;

/// Bytes of zeros kept written past a WAL's last frame (see [`History::write_wal_ahead`]):
/// 32 frames of 4 KiB pages, 16 small commits; refilled when half is left.
pub(super) const WAL_WRITTEN_AHEAD: u64 = 128 * 1024;

/// Frames a WAL holds before anything is written ahead of it (a few small commits).
pub(super) const WAL_WRITTEN_AHEAD_PAST: u32 = 16;

impl History {
    /// Appends a record for every transaction committed to the WAL since the last capture, up
    /// to frame `frames` (the count the WAL hook reported after the commit); the first are
    /// stamped with `answered_at` (commits answered before their capture), the rest now.
    /// Returns how many it appended.
    pub(crate) fn capture(&mut self, frames: u32, answered_at: &[i64]) -> Result<u64> {
        self.writing(|h| h.capture_at(frames, answered_at, None))
    }

    /// Captures as [`History::capture`] does; records past `answered_at` are stamped
    /// `time_ms` if given, else now.
    pub(super) fn capture_at(&mut self, frames: u32, answered_at: &[i64], time_ms: Option<i64>) -> Result<u64> {
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
        // write of many pages costs less than many writes of a few: docs/performance.md, "Time
        // Travel's capture"); a record larger than one run's buffer goes alone.
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
    /// ran 1.5× as fast into a WAL written ahead (docs/performance.md, "The WAL written
    /// ahead"). SQLite reads a WAL only up to its first frame whose salt and checksum fail, as
    /// zeros do. Best effort: a write
    /// refused (a full disk) only leaves the WAL to grow as it would have. A WAL of fewer than
    /// [`WAL_WRITTEN_AHEAD_PAST`] frames is left alone: the first request to an object just
    /// opened does not pay for room its next requests may never use.
    pub(super) fn write_wal_ahead(&mut self, page_size: u32, frames: u32) {
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

    /// The salt of the WAL file as it is now (0 when there is none).
    pub(super) fn current_wal_salt(&mut self) -> Result<u64> {
        self.wal = None;
        self.wal_header = None;
        self.wal_may_restart = true;
        let Some(file) = self.wal_file()? else { return Ok(0) };
        Ok(wal::read_header(file).map_err(io_error("reading the WAL"))?.map_or(0, |h| h.salt))
    }
}
