//! A read replica: a copy of a database another node owns, materialized from the log it ships
//! and kept current by applying each record shipped after, one SQLite transaction per record
//! (its pages written through `sqlite_dbpage`, the file cut where the commit cut it), so the
//! replica's readers see every commit whole or not at all, as the owner's did.
//!
//! The copy has one connection, as an owner has: it applies records and serves reads in turn,
//! in SQLite's exclusive locking mode with its WAL index on the heap, so a read takes no file
//! lock and its page cache survives the records applied between reads. Separate reader
//! connections took and dropped WAL read locks through `fcntl` on every read and threw their
//! page cache away whenever the copy moved: a read cost 2.6× the owner's (docs/performance.md).
//!
//! The copy follows one segment at a time: shipped bytes that continue it are appended and their
//! whole records applied in order; a segment that starts right after the last position applied
//! takes over. Anything else — a gap, a restore, a log the owner cut, a record that fails its
//! checksum — breaks continuity, and the caller builds a new copy from the store.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use rusqlite::config::DbConfig;

use crate::actor::Executed;
use crate::database::{Database, DatabaseOptions, Inline};
use crate::error::{Error, Result};
use crate::history::record::{self, ApplyBuffers, Kind, ReadError};
use crate::history::segment::{self, SEGMENT_HEADER_LEN, Sealed};
use crate::history::{Bookmark, damaged, log_dir, read_error, snapshot};
use crate::request::Request;

/// A database's copy on a node that does not own it, and where in its history it is.
pub struct Replica {
    identity: String,
    dir: PathBuf,
    /// The segment followed. Taken after `copy` by whoever holds both, and held only while
    /// records are appended and applied, so asking what the copy lacks never waits for a read.
    applier: Mutex<Applier>,
    /// The copy's one connection: records are applied and reads served on it in turn.
    copy: parking_lot::Mutex<Database>,
    /// The applier holding the copy or waiting for it, and reads holding it off the async
    /// workers: a read on an async worker that finds either goes off the worker at once, and
    /// otherwise waits for the copy at most its budget.
    applying: AtomicUsize,
    long_reads: AtomicUsize,
    request_timeout: std::time::Duration,
    position: AtomicU64,
    /// The bookmark of `position`, made when the copy moves there.
    bookmark: Mutex<Bookmark>,
    /// Why continuity broke, once it did.
    broken: Mutex<Option<String>>,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica").field("identity", &self.identity).field("position", &self.position()).finish()
    }
}

/// The copy's writing side: the segment it follows, and what applying its records needs.
struct Applier {
    log: PathBuf,
    following: Option<Following>,
    /// The copy's size in pages after the last record applied.
    db_pages: u32,
    page_size: u32,
    bufs: ApplyBuffers,
}

/// The segment being followed: its first position, its file, how many bytes it holds, and up
/// to where its records are applied (the rest is a record still arriving).
struct Following {
    first_seq: u64,
    path: PathBuf,
    file: File,
    len: u64,
    applied: u64,
}

/// Whether shipped bytes continue the copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Continuity {
    /// They were applied (or the copy had them already).
    Continues,
    /// They do not follow from the copy; it must be built again from the store.
    Broken(String),
}

fn io_error(context: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { context: context.to_owned(), source }
}

impl Replica {
    /// Opens the copy materialized at `db_path` from a log fetched from the store (which it
    /// then follows); the directory holding it is the copy's and is removed when the copy is
    /// dropped. `options` are its reads' (limits, timeout).
    pub fn open(identity: &str, db_path: &Path, options: DatabaseOptions) -> Result<Replica> {
        let dir = db_path.parent().unwrap_or(Path::new(".")).to_owned();
        let log = log_dir(db_path);
        let (mut snapshots, mut segments) = (Vec::new(), Vec::new());
        for entry in std::fs::read_dir(&log).map_err(io_error("reading the replica's log"))? {
            let path = entry.map_err(io_error("reading the replica's log"))?.path();
            if let Some(seq) = snapshot::seq_of(&path) {
                snapshots.push((seq, path));
            } else if let Some(first) = segment::open_segment_first(&path) {
                segments.push((first, path));
            } else if let Some(sealed) = Sealed::from_path(&path) {
                segments.push((sealed.first_seq, path));
            }
        }
        snapshots.sort();
        segments.sort();
        let Some((snapshot_seq, snapshot_path)) = snapshots.last().cloned() else {
            return Err(damaged("a replica's log holds no snapshot".to_owned()));
        };
        let snapshot = snapshot::read_header(&snapshot_path)
            .map_err(|e| read_error(e, &format!("reading {}", snapshot_path.display())))?;
        let (mut position, mut time_ms) = (snapshot_seq, snapshot.time_ms);
        // The newest record is in the newest segment that holds one (a new segment may have none).
        let mut walked = Vec::new();
        for (first_seq, path) in segments.iter().rev() {
            let file = OpenOptions::new().read(true).write(true).open(path).map_err(io_error("opening a segment"))?;
            let len = file.metadata().map_err(io_error("reading a segment's length"))?.len();
            let (applied, last) = whole_records(&file, len);
            let found = last.is_some();
            walked.push((*first_seq, path.clone(), file, len, applied, last));
            if found {
                break;
            }
        }
        let newest_record = walked.iter().find_map(|w| w.5);
        if let Some(last) = newest_record.filter(|last| last.seq >= position) {
            (position, time_ms) = (last.seq, last.time_ms);
        }
        // The newest segment is followed if it ends at the copy's position or starts right after.
        let following = walked.into_iter().next().and_then(|(first_seq, path, file, len, applied, last)| {
            let continues = match last {
                Some(last) => last.seq == position,
                None => first_seq == position + 1,
            };
            continues.then_some(Following { first_seq, path, file, len, applied })
        });
        // Only the segment followed is read again: the rest of the fetched log goes.
        for (_, path) in snapshots.iter().chain(&segments) {
            if following.as_ref().is_none_or(|f| f.path != *path) {
                segment::remove_if_present(path).map_err(io_error("removing what the replica no longer needs"))?;
            }
        }
        let request_timeout = options.request_timeout;
        let mut options = options.read_only(false).create(false);
        options.path = db_path.to_owned();
        options.history = None;
        options.shipper = None;
        let mut copy = Database::open(&options)?;
        let open_error = |e: rusqlite::Error| Error::open(db_path, "", e);
        copy.with_internal(|conn| {
            // A copy is built again after a crash, never recovered: nothing of it needs syncing,
            // and closing it need not checkpoint what is about to be removed.
            conn.pragma_update(None, "synchronous", "OFF")?;
            conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
            // The copy holds whatever its owner does, whatever this node's limits say.
            conn.pragma_update(None, "max_page_count", i64::from(u32::MAX - 1))
        })
        .map_err(open_error)?;
        // A read finds the file's size in the WAL's last commit, or with none there asks the
        // file system (`fstat`), every time: page 1, written back as it is, puts a commit there.
        // From then on the copy reads only, but while records are applied.
        let written_back = Self::applying(&mut copy, |conn| {
            conn.execute_batch(
                "BEGIN IMMEDIATE; \
                 INSERT INTO sqlite_dbpage(pgno, data) SELECT pgno, data FROM sqlite_dbpage WHERE pgno = 1; \
                 COMMIT",
            )
            .map(|()| Continuity::Continues)
            .map_err(Error::internal)
        })?;
        if let Continuity::Broken(why) = written_back {
            return Err(Error::open(db_path, "", std::io::Error::other(why)));
        }
        let (db_pages, page_size) = copy
            .with_internal(|conn| {
                let db_pages: u32 = conn.pragma_query_value(None, "page_count", |r| r.get(0))?;
                let page_size: u32 = conn.pragma_query_value(None, "page_size", |r| r.get(0))?;
                Ok((db_pages, page_size))
            })
            .map_err(open_error)?;
        Ok(Replica {
            identity: identity.to_owned(),
            dir,
            applier: Mutex::new(Applier { log, following, db_pages, page_size, bufs: ApplyBuffers::default() }),
            copy: parking_lot::Mutex::new(copy),
            applying: AtomicUsize::new(0),
            long_reads: AtomicUsize::new(0),
            request_timeout,
            position: AtomicU64::new(position),
            bookmark: Mutex::new(Bookmark::new(identity, position, time_ms)),
            broken: Mutex::default(),
        })
    }

    /// The history position the copy is at.
    pub fn position(&self) -> u64 {
        self.position.load(Ordering::Acquire)
    }

    /// The bookmark of the copy's state.
    pub fn bookmark(&self) -> Bookmark {
        *self.bookmark.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether shipped bytes `[offset, offset + len)` of the segment whose first position is
    /// `segment` hold anything the copy lacks (bytes it holds already need not be fetched).
    pub fn lacks(&self, segment: u64, offset: u64, len: u64) -> bool {
        let applier = self.applier.lock().unwrap_or_else(|e| e.into_inner());
        match &applier.following {
            Some(f) if segment < f.first_seq => false,
            Some(f) if segment == f.first_seq => offset + len > f.len || (len == 0 && offset < f.len),
            // A later segment starting at a position the copy holds: see `append`.
            Some(_) => true,
            None => segment > self.position(),
        }
    }

    /// Why the copy stopped following its owner's log, if it did: it then applies nothing more,
    /// and must not be served.
    pub fn broken(&self) -> Option<String> {
        self.broken.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Applies shipped bytes of the segment whose first position is `segment`, from `offset`:
    /// appended to the copy's segment, and every whole record they complete applied in order.
    /// Once continuity broke it stays broken: what was appended may no longer be the owner's.
    pub fn append(&self, segment: u64, offset: u64, bytes: &[u8]) -> Result<Continuity> {
        if let Some(why) = self.broken() {
            return Ok(Continuity::Broken(why));
        }
        let _breaks = BrokenIfPanicking(&self.broken);
        let appended = self.append_following(segment, offset, bytes).and_then(|continuity| match continuity {
            Continuity::Continues => self.apply_pending_records(),
            broken => Ok(broken),
        });
        if let Ok(Continuity::Broken(why)) = &appended {
            *self.broken.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
        }
        appended
    }

    /// Appends shipped bytes to the followed segment (not touching the copy: bytes it holds
    /// already never wait for a read); the caller then applies whole records.
    fn append_following(&self, segment: u64, offset: u64, bytes: &[u8]) -> Result<Continuity> {
        let mut applier = self.applier.lock().unwrap_or_else(|e| e.into_inner());
        let position = self.position();
        let end = offset + bytes.len() as u64;
        match &mut applier.following {
            Some(f) if segment < f.first_seq => return Ok(Continuity::Continues),
            Some(f) if segment == f.first_seq => {
                if offset > f.len {
                    return Ok(Continuity::Broken(format!("segment {segment} has a gap at {}..{offset}", f.len)));
                }
                if bytes.is_empty() && offset < f.len {
                    return Ok(Continuity::Broken(format!("the owner cut segment {segment} at {offset}")));
                }
                if end <= f.len {
                    return Ok(Continuity::Continues);
                }
                let fresh = &bytes[(f.len - offset) as usize..];
                f.file.write_all_at(fresh, f.len).map_err(io_error("appending to the replica's log"))?;
                f.len = end;
            }
            Some(f) if segment <= position => {
                return Ok(Continuity::Broken(format!(
                    "segment {segment} starts at a position the copy holds (it follows segment {}): the owner's log diverged",
                    f.first_seq
                )));
            }
            _ if segment <= position => return Ok(Continuity::Continues),
            _ if segment > position + 1 || offset != 0 => {
                return Ok(Continuity::Broken(format!(
                    "segment {segment} (from byte {offset}) does not follow position {position}"
                )));
            }
            _ => {
                let path = applier.log.join(segment::open_name(segment));
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&path)
                    .map_err(io_error("starting a segment of the replica's log"))?;
                file.write_all_at(bytes, 0).map_err(io_error("appending to the replica's log"))?;
                if let Some(previous) = applier.following.take() {
                    segment::remove_if_present(&previous.path).map_err(io_error("removing a followed segment"))?;
                }
                applier.following = Some(Following { first_seq: segment, path, file, len: end, applied: 0 });
            }
        }
        Ok(Continuity::Continues)
    }

    /// Applies the followed segment's whole records not applied yet, on the copy.
    fn apply_pending_records(&self) -> Result<Continuity> {
        let _applying = Counted::new(&self.applying);
        let mut copy = self.copy.lock();
        let mut applier = self.applier.lock().unwrap_or_else(|e| e.into_inner());
        let applied = Self::applying(&mut copy, |conn| self.apply_pending(conn, &mut applier));
        // The size a read measured holds only until the copy moves.
        copy.forget_size();
        applied
    }

    /// Runs `apply` on the copy's connection with what keeps it read-only between records
    /// lifted: `query_only` (a read never writes the copy, whatever slips past the checks
    /// before it) and defensive mode (which makes `sqlite_dbpage` read-only). Whatever `apply`
    /// did, no transaction is left open and the copy reads only again, or it is built again.
    fn applying(
        copy: &mut Database,
        apply: impl FnOnce(&rusqlite::Connection) -> Result<Continuity>,
    ) -> Result<Continuity> {
        copy.with_internal(|conn| {
            let read_only = |on: bool| -> rusqlite::Result<()> {
                conn.pragma_update(None, "query_only", on)?;
                conn.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, on).map(drop)
            };
            let applied = match read_only(false) {
                Ok(()) => apply(conn),
                Err(e) => Ok(Continuity::Broken(format!("the copy could not be made writable: {e}"))),
            };
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            match read_only(true) {
                Ok(()) if conn.is_autocommit() => applied,
                Ok(()) => Ok(Continuity::Broken("a transaction on the copy could not be ended".to_owned())),
                Err(e) => Ok(Continuity::Broken(format!("the copy could not be made read-only again: {e}"))),
            }
        })
    }

    /// Applies the followed segment's whole records not applied yet.
    fn apply_pending(&self, conn: &rusqlite::Connection, applier: &mut Applier) -> Result<Continuity> {
        let Applier { following, db_pages, page_size, bufs, .. } = applier;
        let Some(f) = following.as_mut() else { return Ok(Continuity::Continues) };
        if f.applied < SEGMENT_HEADER_LEN {
            match segment::check_magic(&f.file, &f.path) {
                Ok(()) => f.applied = SEGMENT_HEADER_LEN,
                Err(ReadError::Truncated) => return Ok(Continuity::Continues),
                Err(e) => return Ok(Continuity::Broken(format!("segment {}: {e:?}", f.first_seq))),
            }
        }
        loop {
            let header = match record::header_at(&f.file, f.applied, f.len) {
                Ok(header) => header,
                // The rest of the record is still on its way.
                Err(ReadError::Truncated) => return Ok(Continuity::Continues),
                Err(e) => return Ok(Continuity::Broken(format!("segment {} at {}: {e:?}", f.first_seq, f.applied))),
            };
            let position = self.position();
            if header.kind == Kind::Restore {
                return Ok(Continuity::Broken(format!("the owner restored the database at position {}", header.seq)));
            }
            if header.first_seq() != position + 1 {
                return Ok(Continuity::Broken(format!(
                    "record {} does not follow position {position}",
                    header.first_seq()
                )));
            }
            if header.page_size != *page_size {
                return Ok(Continuity::Broken(format!("the page size became {}", header.page_size)));
            }
            conn.execute_batch("BEGIN IMMEDIATE").map_err(Error::internal)?;
            let mut highest = 0;
            let applied = {
                let mut write = conn.prepare_cached(WRITE_PAGE).map_err(Error::internal)?;
                // Page 1 goes last: it holds the schema's version, and a statement run once that
                // changed would read the schema again, from pages not all written yet.
                let mut page_one = None;
                let applied =
                    record::apply_at(&f.file, f.applied, f.len, bufs, header.first_seq()..=header.seq, |pgno, data| {
                        highest = highest.max(pgno);
                        if pgno == 1 {
                            page_one = Some(data.to_vec());
                            return Ok(());
                        }
                        write.execute(rusqlite::params![pgno, data]).map(drop).map_err(std::io::Error::other)
                    });
                match (applied, page_one) {
                    (Ok(last), Some(page)) => {
                        write.execute(rusqlite::params![1, page]).map(|_| Ok(last)).map_err(Error::internal)
                    }
                    (other, _) => Ok(other),
                }
            };
            let last = match applied {
                Ok(Ok(last)) => last,
                Ok(Err(e)) => {
                    let _ = conn.execute_batch("ROLLBACK");
                    return Ok(Continuity::Broken(format!("record {}: {e:?}", header.seq)));
                }
                Err(e) => {
                    let _ = conn.execute_batch("ROLLBACK");
                    return Err(e);
                }
            };
            if let Err(e) = conn.execute_batch("COMMIT") {
                let _ = conn.execute_batch("ROLLBACK");
                return Err(Error::internal(e));
            }
            // `sqlite_dbpage` writes a page's bytes under the b-tree's parse of it, which the
            // page cache keeps: the cache is emptied, so every page is read and parsed afresh.
            conn.release_memory().map_err(Error::internal)?;
            // The file ends where the commit left it. SQLite cuts it only when that is a
            // transaction's last write, and page 1 must be the last above: the cut commits alone.
            // Until it does, the pages past the end are ones the database does not use.
            if (*db_pages).max(highest) > last.db_pages {
                let cut = conn.execute_batch("BEGIN IMMEDIATE").and_then(|()| {
                    conn.prepare_cached(WRITE_PAGE)?
                        .execute(rusqlite::params![last.db_pages + 1, rusqlite::types::Null])?;
                    conn.execute_batch("COMMIT")
                });
                if let Err(e) = cut {
                    let _ = conn.execute_batch("ROLLBACK");
                    return Ok(Continuity::Broken(format!("cutting the copy to {} pages: {e}", last.db_pages)));
                }
                conn.release_memory().map_err(Error::internal)?;
            }
            *db_pages = last.db_pages;
            f.applied += header.record_len();
            *self.bookmark.lock().unwrap_or_else(|e| e.into_inner()) =
                Bookmark::new(&self.identity, last.seq, last.time_ms);
            self.position.store(last.seq, Ordering::Release);
        }
    }

    /// Runs a request that only reads on the copy as it is now, in one read transaction, if it
    /// finishes within `budget` (the request timeout if none): its answer carries the bookmark
    /// of a state no newer than the one it read. Nothing of a request that does not finish, or
    /// that must go to the owner (it would write, or may change the connection's state), remains.
    pub fn read(&self, request: &Request, budget: Option<std::time::Duration>) -> Result<ReplicaRead> {
        // On an async worker (with a budget), a read behind the applier or a long read is tried
        // again off the worker, and waits for another read like it at most its budget.
        let (mut copy, _long) = match budget {
            Some(_) if self.applying.load(Ordering::SeqCst) > 0 || self.long_reads.load(Ordering::SeqCst) > 0 => {
                return Ok(ReplicaRead::TooLong);
            }
            Some(wait) => match self.copy.try_lock_for(wait) {
                Some(copy) => (copy, None),
                None => return Ok(ReplicaRead::TooLong),
            },
            None => {
                let copy = self.copy.lock();
                (copy, Some(Counted::new(&self.long_reads)))
            }
        };
        // Records are applied under the same lock: this is the state the read sees.
        let bookmark = self.bookmark();
        let budget = budget.unwrap_or(self.request_timeout).min(self.request_timeout);
        match copy.execute_read(request, budget) {
            Inline::Done(results) => Ok(ReplicaRead::Done(Executed { results, bookmark: Some(bookmark) })),
            Inline::Failed(e) => Err(e),
            Inline::Declined => Ok(ReplicaRead::Declined),
            Inline::TooLong => Ok(ReplicaRead::TooLong),
        }
    }
}

/// One in a count while it lives.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Counted(count)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Marks the copy broken if it is dropped while a panic unwinds: an apply cut short may have
/// left the copy writable, or half a record in it.
struct BrokenIfPanicking<'a>(&'a Mutex<Option<String>>);

impl Drop for BrokenIfPanicking<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some("applying records panicked".to_owned());
        }
    }
}

/// Writes one page of the copy (`sqlite_dbpage`); a NULL page cuts the file before it.
const WRITE_PAGE: &str = "INSERT INTO sqlite_dbpage(pgno, data) VALUES (?1, ?2)";

/// What a read on a replica came to.
#[derive(Debug)]
pub enum ReplicaRead {
    /// It read, and here is its answer.
    Done(Executed),
    /// The owner must serve it: it would write, or may change the connection's state.
    Declined,
    /// It ran past its budget and was interrupted, or no reader was free within it.
    TooLong,
}

/// Where a segment's whole records end, and the header of its last one.
fn whole_records(file: &File, len: u64) -> (u64, Option<record::Header>) {
    let (mut applied, mut last) = (SEGMENT_HEADER_LEN, None);
    while let Ok(header) = record::header_at(file, applied, len) {
        last = Some(header);
        applied += header.record_len();
    }
    (applied, last)
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.dir.display(), error = %e, "removing a replica's files failed");
        }
    }
}
