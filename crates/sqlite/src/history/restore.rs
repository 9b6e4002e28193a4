//! Restore: a plan (the newest snapshot at or before the target and the records after it), the
//! image built from it beside the database, and the swap that installs it, recorded first so a
//! crash at any step finishes or forgets it on the next open ([`super::recover`]).

use std::fs::File;
use std::path::{Path, PathBuf};

use super::marker::RESTORE_MARKER;
use super::marker::remove_marker;
use super::marker::write_marker;
use super::segment::Entry;
use super::segment::open_segments;
use super::*;
use crate::error::{Error, Result};

/// A past state, ready to be rebuilt: a snapshot and the records after it.
#[derive(Debug, Clone)]
pub(super) struct RestorePlan {
    snapshot: PathBuf,
    /// Records to apply in order: (segment file, offset, seq).
    records: Vec<(PathBuf, u64, u64)>,
}

/// The scratch file a restore builds its image in, beside the database file.
pub(super) fn restore_image_path(db_path: &Path) -> PathBuf {
    db_path.with_extension("restore.tmp")
}

/// Replaces the database file with a snapshot's image and drops the WAL.
pub(super) fn install_image(db_path: &Path, snapshot_path: &Path) -> Result<()> {
    let (tmp, out) = create_image(db_path)?;
    let header = snapshot::copy_image(snapshot_path, &out).map_err(|e| read_error(e, "reading the snapshot"))?;
    out.set_len(header.db_pages as u64 * header.page_size as u64).map_err(io_error("sizing the restored image"))?;
    out.sync_all().map_err(io_error("syncing the restored image"))?;
    swap_in(db_path, &tmp)
}

/// A new, empty file beside the database, where an image of it is built before it is swapped in.
pub(super) fn create_image(db_path: &Path) -> Result<(PathBuf, File)> {
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
pub(super) fn build_image(db_path: &Path, plan: &RestorePlan, page_size: u32) -> Result<(PathBuf, File, u32)> {
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
pub(super) fn swap_in(db_path: &Path, tmp: &Path) -> Result<()> {
    std::fs::rename(tmp, db_path).map_err(io_error("replacing the database file"))?;
    for leftover in [wal_path(db_path), db_path.with_extension("sqlite-shm")] {
        remove_if_present(&leftover).map_err(io_error("removing the old WAL"))?;
    }
    sync_dir(db_path.parent().unwrap_or(Path::new("."))).map_err(io_error("syncing the database directory"))
}

/// The snapshot and records that rebuild the state at `target`, from the snapshots and the
/// entries (in order) of a log in `dir`.
pub(super) fn plan(dir: &Path, snapshots: &[u64], entries: Vec<(PathBuf, Entry)>, target: u64) -> Result<RestorePlan> {
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
pub(super) fn base_snapshot(snapshots: &[u64], target: u64) -> Result<u64> {
    snapshots
        .iter()
        .rev()
        .find(|&&s| s <= target)
        .copied()
        .ok_or_else(|| damaged(format!("no snapshot at or before position {target}")))
}

/// Rebuilds the state a plan names into `out`, checking every byte read; returns its size in
/// pages.
pub(super) fn build(plan: &RestorePlan, out: &File, page_size: u32) -> Result<u32> {
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
    materialize_in(db_path, &log_dir(db_path))
}

/// [`materialize`] from the history log in `dir` (a followed database's log is kept apart
/// from its file, see [`crate::Follower`]).
pub fn materialize_in(db_path: &Path, dir: &Path) -> Result<Option<u64>> {
    if db_path.exists() {
        return Err(Error::Io {
            context: format!("materializing {}", db_path.display()),
            source: io::Error::from(io::ErrorKind::AlreadyExists),
        });
    }
    let (mut segments, mut snapshots) = (Vec::new(), Vec::new());
    let listing = match std::fs::read_dir(dir) {
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
        .extend(open_segments(dir).map_err(io_error("reading the log directory"))?.into_iter().map(|(p, f)| (f, p)));
    segments.sort();
    let mut entries = Vec::new();
    for (_, path) in &segments {
        let found = segment::entries_of(path).map_err(|e| read_error(e, &format!("reading {}", path.display())))?;
        entries.extend(found.into_iter().map(|e| (path.clone(), e)));
    }
    let target = entries.last().map_or(newest_snapshot, |(_, e)| e.seq.max(newest_snapshot));
    let plan = plan(dir, &snapshots, entries, target)?;
    let page_size = snapshot::read_header(&plan.snapshot)
        .map_err(|e| read_error(e, &format!("reading {}", plan.snapshot.display())))?
        .page_size;
    let (tmp, out, _) = build_image(db_path, &plan, page_size)?;
    drop(out);
    swap_in(db_path, &tmp)?;
    Ok(Some(target))
}

impl History {
    /// Appends (and syncs) the entry saying the state at `seq` is the snapshot at `seq`.
    pub(super) fn append_restore_entry(&mut self, seq: u64, db_pages: u32) -> Result<()> {
        self.append_restore_entry_at(seq, db_pages, 0, 0)
    }

    /// As [`History::append_restore_entry`], for a state that is the WAL read up to a position.
    pub(super) fn append_restore_entry_at(
        &mut self,
        seq: u64,
        db_pages: u32,
        wal_salt: u64,
        wal_frame: u32,
    ) -> Result<()> {
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

    /// Every entry after position `after` up to `upto` and perhaps a few either side, oldest
    /// first: the sealed segments' headers are read from disk, only those of segments that hold
    /// a position in that range.
    pub(super) fn entries_between(&self, after: u64, upto: u64) -> Result<Vec<(PathBuf, Entry)>> {
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
    pub(super) fn oldest_restorable(&self) -> Result<u64> {
        let window_start = now_ms() - self.settings.retention.as_millis() as i64;
        Ok(self.position_at(window_start)?.map_or_else(|| self.snapshots.first().copied().unwrap_or(0), |(seq, _)| seq))
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
    pub(super) fn plan(&self, target: u64) -> Result<RestorePlan> {
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
    pub(super) fn install_restored(
        &mut self,
        db_path: &Path,
        image_path: &Path,
        image: File,
        db_pages: u32,
    ) -> Result<()> {
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
}
