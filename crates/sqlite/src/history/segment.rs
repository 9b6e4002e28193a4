//! Log segments: append-only files of records. One segment is open for appending; sealed ones
//! are immutable, and their names say what they hold, so the history can be surveyed from a
//! directory listing alone.
//!
//! ```text
//! <first seq>.open                                        being appended
//! <first seq>.checked                                     what a clean close found whole in it
//! <first seq>-<last seq>-<first ms>-<last ms>.seg         sealed (hex, fixed width)
//! ```
//!
//! A segment starts with 16 bytes (`KURALOG1` and the first seq, little-endian), then records.
//!
//! Opening a database checks every record of its open segment, since a crash may have torn
//! the last ones; after a busy spell that is hundreds of kilobytes read back before the first
//! request. A clean close, having synced the segment, writes what it holds (its length and
//! its records' places) beside it: the next open takes that as checked and reads only what
//! was appended after it, the only bytes a crash could have torn.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::record::{self, Header, ReadError};

const MAGIC: &[u8; 8] = b"KURALOG1";
pub(crate) const SEGMENT_HEADER_LEN: u64 = 16;

/// Where one position's record sits, and what it is. The commits of a packed record
/// ([`record::Kind::Commits`]) each have an entry, all at the record's offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub seq: u64,
    pub time_ms: i64,
    pub offset: u64,
    pub kind: record::Kind,
    pub wal_salt: u64,
    pub wal_frame: u32,
}

/// A sealed segment, as its name describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sealed {
    pub path: PathBuf,
    pub first_seq: u64,
    pub last_seq: u64,
    pub first_ms: i64,
    pub last_ms: i64,
}

impl Sealed {
    /// Parses a sealed segment's file name.
    pub(crate) fn from_path(path: &Path) -> Option<Sealed> {
        let name = path.file_name()?.to_str()?.strip_suffix(".seg")?;
        let parts: Vec<&str> = name.split('-').collect();
        let [first, last, first_ms, last_ms] = parts.as_slice() else { return None };
        Some(Sealed {
            path: path.to_owned(),
            first_seq: u64::from_str_radix(first, 16).ok()?,
            last_seq: u64::from_str_radix(last, 16).ok()?,
            first_ms: i64::from_str_radix(first_ms, 16).ok()?,
            last_ms: i64::from_str_radix(last_ms, 16).ok()?,
        })
    }

    /// Every record's place, read from the headers (the records themselves are checked when
    /// they are applied).
    pub(crate) fn entries(&self) -> Result<Vec<Entry>, ReadError> {
        entries_of(&self.path)
    }
}

/// Every record's place in the segment at `path` (sealed or open), which must hold whole
/// records only.
pub(crate) fn entries_of(path: &Path) -> Result<Vec<Entry>, ReadError> {
    let file = File::open(path)?;
    check_magic(&file, path)?;
    let len = file.metadata()?.len();
    let mut entries = Vec::new();
    let mut offset = SEGMENT_HEADER_LEN;
    while offset < len {
        let header = record::header_at(&file, offset, len)?;
        push_entries(&header, offset, &mut entries, || record::packed_headers_at(&file, offset, &header))?;
        offset += header.record_len();
    }
    Ok(entries)
}

/// The entry of a record's last (or only) position.
fn entry(header: &Header, offset: u64) -> Entry {
    Entry {
        seq: header.seq,
        time_ms: header.time_ms,
        offset,
        kind: header.last_kind(),
        wal_salt: header.wal_salt,
        wal_frame: header.wal_frame,
    }
}

/// Appends an entry for every position the record at `offset` holds: one, or one per commit it
/// packs (read from its index by `packed`).
fn push_entries(
    header: &Header,
    offset: u64,
    entries: &mut Vec<Entry>,
    packed: impl FnOnce() -> Result<Vec<Header>, ReadError>,
) -> Result<(), ReadError> {
    match header.kind {
        record::Kind::Commits => entries.extend(packed()?.iter().map(|commit| entry(commit, offset))),
        record::Kind::Commit | record::Kind::Restore => entries.push(entry(header, offset)),
    }
    Ok(())
}

pub(crate) fn check_magic(file: &File, path: &Path) -> Result<(), ReadError> {
    let mut magic = [0u8; 8];
    match file.read_exact_at(&mut magic, 0) {
        Ok(()) if &magic == MAGIC => Ok(()),
        Ok(()) => Err(ReadError::Corrupt(format!("{} is not a kura log segment", path.display()))),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(ReadError::Truncated),
        Err(e) => Err(ReadError::Io(e)),
    }
}

/// The last whole, valid record of an open segment, found without checking every record: the
/// headers are walked, and only the last records are checked, newest first.
pub(crate) fn last_valid_entry(path: &Path) -> Result<Option<Entry>, ReadError> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    if len < SEGMENT_HEADER_LEN {
        return Ok(None);
    }
    check_magic(&file, path)?;
    let mut offsets = Vec::new();
    let mut offset = SEGMENT_HEADER_LEN;
    while let Ok(header) = record::header_at(&file, offset, len) {
        offsets.push(offset);
        offset += header.record_len();
    }
    for &offset in offsets.iter().rev() {
        if let Ok(Some(header)) = record::verify_at(&file, offset, len) {
            return Ok(Some(entry(&header, offset)));
        }
    }
    Ok(None)
}

/// The segment being appended to.
pub(crate) struct OpenSegment {
    pub path: PathBuf,
    first_seq: u64,
    /// Records in this segment, in order.
    pub entries: Vec<Entry>,
    /// Bytes in the file, records included.
    pub len: u64,
    pub opened: Instant,
    file: File,
    /// Whether bytes were written since the last fsync.
    dirty: bool,
    /// Bytes appended since writeback was last started.
    unsynced: u64,
}

/// Every this many bytes the kernel is asked to start writing the segment out, so the fsync
/// before a checkpoint finds little left to do.
const WRITEBACK_BYTES: u64 = 1 << 20;

/// The buffer a large record is streamed through.
const STREAM_BUFFER: usize = 256 * 1024;

/// Writes at a file's position, moving it on: where a streamed record goes.
struct FileAt<'a> {
    file: &'a File,
    at: u64,
}

impl Write for FileAt<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let written = self.file.write_at(bytes, self.at)?;
        self.at += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

thread_local! {
    /// Where a record is built before it is written: one per thread, not one per open segment,
    /// since a thousand Durable Objects may be open at once and a per-segment buffer of
    /// records not yet written was 11-16 KiB of each idle object's memory.
    static RECORD_BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Where the pages of commits written together gather before they are packed.
    static PAGES_BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A run of commits is packed into one record only if that saves at least this fraction of
/// its bytes (1/8): below, unpacking it on every restore costs more than the bytes saved.
const PACKING_SAVES_AT_LEAST: u64 = 8;

/// Starts writing a file's dirty pages to disk without waiting for them.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor; SYNC_FILE_RANGE_WRITE only queues writeback of the whole file.
    unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File) {}

/// What recovering an open segment found.
pub(crate) struct Recovered {
    /// The segment, holding every whole, valid record before the first bad one.
    pub segment: OpenSegment,
    /// What follows the last valid record, if anything does; the file still holds it until
    /// the caller decides what it is ([`OpenSegment::cut_tail`]).
    pub tail: Option<BadTail>,
}

/// Bytes after an open segment's last valid record: a torn append, or damage.
#[derive(Debug)]
pub(crate) struct BadTail {
    pub offset: u64,
    pub file_len: u64,
    /// The first bad record's header, if it has a readable one.
    pub header: Option<Header>,
    /// The record runs past the end of the file.
    pub truncated: bool,
    /// Every byte of the tail is zero (blocks allocated but never written).
    pub all_zero: bool,
    pub why: String,
}

pub(crate) fn open_name(first_seq: u64) -> String {
    format!("{first_seq:016x}.open")
}

impl OpenSegment {
    /// Starts a new, empty segment whose first record will have `first_seq`.
    pub(crate) fn create(dir: &Path, first_seq: u64) -> io::Result<OpenSegment> {
        let path = dir.join(open_name(first_seq));
        let mut file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        file.write_all(MAGIC)?;
        file.write_all(&first_seq.to_le_bytes())?;
        file.sync_all()?;
        sync_dir(dir)?;
        Ok(OpenSegment {
            path,
            first_seq,
            entries: Vec::new(),
            len: SEGMENT_HEADER_LEN,
            opened: Instant::now(),
            file,
            dirty: false,
            unsynced: 0,
        })
    }

    /// Reopens an open segment after a restart: every record is checked, up to the first that
    /// is not whole and valid, except those a clean close found whole ([`OpenSegment::note_checked`]).
    /// What follows the first bad record stays in the file until [`OpenSegment::cut_tail`].
    pub(crate) fn recover(path: &Path, first_seq: u64) -> Result<Recovered, ReadError> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = file.metadata()?.len();
        if len < SEGMENT_HEADER_LEN {
            // Torn while being created: start it again.
            file.set_len(0)?;
            let mut file = file;
            file.write_all(MAGIC)?;
            file.write_all(&first_seq.to_le_bytes())?;
            file.sync_all()?;
            return Ok(Recovered {
                segment: Self::from_parts(path, first_seq, file, Vec::new(), SEGMENT_HEADER_LEN),
                tail: None,
            });
        }
        check_magic(&file, path)?;
        let (mut entries, mut offset) =
            checked_prefix(path, first_seq, &file, len).unwrap_or((Vec::new(), SEGMENT_HEADER_LEN));
        let noted = offset;
        let tail = record::walk(&file, len, |records| -> Result<Option<BadTail>, ReadError> {
            loop {
                let (truncated, why) = match records.verify_at(offset) {
                    Ok(Some(header)) => {
                        match push_entries(&header, offset, &mut entries, || records.packed_headers_at(offset, &header))
                        {
                            Ok(()) => {
                                offset += header.record_len();
                                continue;
                            }
                            Err(ReadError::Corrupt(why)) => (false, why),
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(None) => return Ok(None),
                    Err(ReadError::Truncated) => (true, "a record is cut short".to_owned()),
                    Err(ReadError::Corrupt(why)) => (false, why),
                    Err(ReadError::Io(e)) => return Err(ReadError::Io(e)),
                };
                let header = record::header_bytes_at(&file, offset, len)?.and_then(|b| Header::decode(&b));
                return Ok(Some(BadTail {
                    offset,
                    file_len: len,
                    header,
                    truncated,
                    all_zero: all_zero(&file, offset, len)?,
                    why,
                }));
            }
        })?;
        let mut segment = Self::from_parts(path, first_seq, file, entries, offset);
        // Records past what a clean close synced and noted may be in the page cache only (the
        // process died, not the machine): the next sync must reach the disk before a checkpoint
        // lets the WAL go, and before a note says they are synced.
        segment.dirty = offset > noted;
        Ok(Recovered { segment, tail })
    }

    /// Cuts the file back to its last valid record; with `keep`, the bytes cut are first copied
    /// there (for whoever investigates damage).
    pub(crate) fn cut_tail(&mut self, tail: &BadTail, keep: Option<&Path>) -> io::Result<()> {
        let file = &self.file;
        if let Some(keep) = keep {
            let mut copy = OpenOptions::new().write(true).create(true).truncate(true).open(keep)?;
            let mut buf = vec![0u8; 1 << 20];
            let mut at = tail.offset;
            while at < tail.file_len {
                let n = buf.len().min((tail.file_len - at) as usize);
                file.read_exact_at(&mut buf[..n], at)?;
                copy.write_all(&buf[..n])?;
                at += n as u64;
            }
            copy.sync_all()?;
            sync_dir(keep.parent().unwrap_or(Path::new(".")))?;
        }
        file.set_len(tail.offset)?;
        file.sync_all()
    }

    fn from_parts(path: &Path, first_seq: u64, file: File, entries: Vec<Entry>, len: u64) -> OpenSegment {
        OpenSegment {
            path: path.to_owned(),
            first_seq,
            entries,
            len,
            opened: Instant::now(),
            file,
            dirty: false,
            unsynced: 0,
        }
    }

    /// Appends a record: `write_pages` writes its pages through the writer it is given. The
    /// record reaches the file (not the disk: see [`OpenSegment::sync`]) before this returns.
    pub(crate) fn append(
        &mut self,
        header: &Header,
        write_pages: impl FnOnce(&mut record::RecordWriter<'_, dyn Write + '_>) -> io::Result<()>,
    ) -> io::Result<()> {
        // Written at its offset, over whatever a failed earlier append left there (the history
        // is unusable after a failed append until reopened, and reopening cuts a torn tail). The
        // length and the entries move on only once the whole record is in the file.
        let offset = self.len;
        if header.record_len() > record::WHOLE_RECORD {
            let mut out = BufWriter::with_capacity(STREAM_BUFFER, FileAt { file: &self.file, at: offset });
            let mut writer = record::RecordWriter::begin(&mut out as &mut dyn Write, header)?;
            write_pages(&mut writer)?;
            writer.finish()?;
            out.flush()?;
        } else {
            RECORD_BUFFER.with_borrow_mut(|buffer| {
                buffer.clear();
                let mut writer = record::RecordWriter::begin(buffer as &mut dyn Write, header)?;
                write_pages(&mut writer)?;
                writer.finish()?;
                debug_assert_eq!(buffer.len() as u64, header.record_len());
                self.file.write_all_at(buffer, offset)
            })?;
        }
        self.entries.push(entry(header, offset));
        self.appended(header.record_len());
        Ok(())
    }

    /// Appends commits built whole in one buffer, with one write for them all: `write_pages(i,
    /// writer)` writes the pages of the `i`th. They are packed into one compressed record
    /// ([`record::pack`]) when that pays, else written as records of their own. As records
    /// they take at most [`record::WHOLE_RECORD`] bytes (a larger one goes alone through
    /// [`OpenSegment::append`]). As with one record, the length and the entries move on only
    /// once every byte is in the file. Returns the bytes appended.
    pub(crate) fn append_together(
        &mut self,
        headers: &[Header],
        mut write_pages: impl FnMut(usize, &mut record::RecordWriter<'_, dyn Write + '_>) -> io::Result<()>,
    ) -> io::Result<u64> {
        let total: u64 = headers.iter().map(Header::record_len).sum();
        if total > record::WHOLE_RECORD {
            return Err(io::Error::other("records appended together take more than one write's buffer"));
        }
        let offset = self.len;
        let (packed, written) = PAGES_BUFFER.with_borrow_mut(|pages| {
            RECORD_BUFFER.with_borrow_mut(|buffer| -> io::Result<(bool, u64)> {
                pages.clear();
                for (i, header) in headers.iter().enumerate() {
                    let mut writer = record::RecordWriter::pages_only(pages as &mut dyn Write, header);
                    write_pages(i, &mut writer)?;
                    writer.finish()?;
                }
                let packed = record::pack(headers, pages, total - total / PACKING_SAVES_AT_LEAST, buffer);
                let record = match packed {
                    Some(len) => &buffer[..len],
                    None => {
                        record::unpacked(headers, pages, buffer)?;
                        debug_assert_eq!(buffer.len() as u64, total);
                        &buffer[..]
                    }
                };
                self.file.write_all_at(record, offset)?;
                Ok((packed.is_some(), record.len() as u64))
            })
        })?;
        let mut at = offset;
        for header in headers {
            self.entries.push(entry(header, at));
            if !packed {
                at += header.record_len();
            }
        }
        self.appended(written);
        Ok(written)
    }

    /// Counts `bytes` just written at the end of the file, and starts their writeback once
    /// [`WRITEBACK_BYTES`] have gathered.
    fn appended(&mut self, bytes: u64) {
        self.len += bytes;
        self.dirty = true;
        self.unsynced += bytes;
        if self.unsynced >= WRITEBACK_BYTES {
            start_writeback(&self.file);
            self.unsynced = 0;
        }
    }

    /// The position its first record has (or will have): what its name says.
    pub(crate) fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// Makes every appended record durable.
    pub(crate) fn sync(&mut self) -> io::Result<()> {
        if self.dirty {
            self.file.sync_data()?;
            self.dirty = false;
            self.unsynced = 0;
        }
        Ok(())
    }

    /// Syncs the segment, then writes beside it that every record in it is whole, for the next
    /// [`OpenSegment::recover`]. Not synced: a note lost or torn is ignored (every record is
    /// checked then), and one that survives a crash still speaks of synced records only.
    pub(crate) fn note_checked(&mut self) -> io::Result<()> {
        self.sync()?;
        let mut note = Vec::with_capacity(CHECKED_HEAD_LEN + self.entries.len() * CHECKED_ENTRY_LEN + 4);
        note.extend_from_slice(CHECKED_MAGIC);
        note.extend_from_slice(&self.first_seq.to_le_bytes());
        note.extend_from_slice(&self.len.to_le_bytes());
        for e in &self.entries {
            note.extend_from_slice(&e.seq.to_le_bytes());
            note.extend_from_slice(&e.time_ms.to_le_bytes());
            note.extend_from_slice(&e.offset.to_le_bytes());
            note.push(e.kind as u8);
            note.extend_from_slice(&e.wal_salt.to_le_bytes());
            note.extend_from_slice(&e.wal_frame.to_le_bytes());
        }
        note.extend_from_slice(&crc32fast::hash(&note).to_le_bytes());
        let checked = checked_path(&self.path);
        // A leftover `.tmp` is removed by the next open's listing.
        let tmp = checked.with_extension("checked.tmp");
        std::fs::write(&tmp, &note)?;
        std::fs::rename(&tmp, &checked)
    }

    /// Syncs and renames the segment to its sealed name, durably; `None` if it holds no record
    /// (it is then deleted). Nothing may be appended afterwards.
    pub(crate) fn seal(&mut self, dir: &Path) -> io::Result<Option<Sealed>> {
        self.sync()?;
        // Before the rename: a note never outlives its segment's open name.
        match std::fs::remove_file(checked_path(&self.path)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let (Some(first), Some(last)) = (self.entries.first(), self.entries.last()) else {
            std::fs::remove_file(&self.path)?;
            sync_dir(dir)?;
            return Ok(None);
        };
        let sealed = Sealed {
            path: dir
                .join(format!("{:016x}-{:016x}-{:012x}-{:012x}.seg", first.seq, last.seq, first.time_ms, last.time_ms)),
            first_seq: first.seq,
            last_seq: last.seq,
            first_ms: first.time_ms,
            last_ms: last.time_ms,
        };
        std::fs::rename(&self.path, &sealed.path)?;
        sync_dir(dir)?;
        self.path = sealed.path.clone();
        Ok(Some(sealed))
    }
}

const CHECKED_MAGIC: &[u8; 8] = b"KURACHK1";
/// Magic, first seq, checked length.
const CHECKED_HEAD_LEN: usize = 24;
/// Seq, time, offset, kind, WAL salt, WAL frame.
const CHECKED_ENTRY_LEN: usize = 37;

/// Where a clean close notes what it found whole in the open segment at `segment`.
fn checked_path(segment: &Path) -> PathBuf {
    segment.with_extension("checked")
}

/// Where what a clean close noted whole in the open segment at `path` (`file`, `len` bytes
/// long) ends: before it, a bad record is damage, never a torn append.
pub(crate) fn checked_len(path: &Path, file: &File, len: u64) -> Option<u64> {
    let mut first_seq = [0u8; 8];
    file.read_exact_at(&mut first_seq, MAGIC.len() as u64).ok()?;
    checked_prefix(path, u64::from_le_bytes(first_seq), file, len).map(|(_, checked_len)| checked_len)
}

/// The records a clean close noted whole in the open segment (`len` bytes long now), and where
/// they end; `None` unless the note is intact, is this segment's, and its last record is still
/// where it says (the segment was not cut back below it).
fn checked_prefix(path: &Path, first_seq: u64, file: &File, len: u64) -> Option<(Vec<Entry>, u64)> {
    let note = std::fs::read(checked_path(path)).ok()?;
    let (body, crc) = note.split_at_checked(note.len().checked_sub(4)?)?;
    if crc32fast::hash(body).to_le_bytes() != crc
        || body.len() < CHECKED_HEAD_LEN
        || !(body.len() - CHECKED_HEAD_LEN).is_multiple_of(CHECKED_ENTRY_LEN)
        || &body[..8] != CHECKED_MAGIC
    {
        return None;
    }
    let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let checked_len = u64_at(body, 16);
    if u64_at(body, 8) != first_seq || checked_len > len {
        return None;
    }
    let entries = body[CHECKED_HEAD_LEN..]
        .chunks_exact(CHECKED_ENTRY_LEN)
        .map(|b| {
            Some(Entry {
                seq: u64_at(b, 0),
                time_ms: u64_at(b, 8) as i64,
                offset: u64_at(b, 16),
                kind: record::Kind::from_byte(b[24])?,
                wal_salt: u64_at(b, 25),
                wal_frame: u32::from_le_bytes(b[33..37].try_into().expect("4 bytes")),
            })
        })
        .collect::<Option<Vec<Entry>>>()?;
    let ends_at = match entries.last() {
        Some(last) => {
            let header = record::header_at(file, last.offset, len).ok()?;
            (entry(&header, last.offset) == *last).then(|| last.offset + header.record_len())?
        }
        None => SEGMENT_HEADER_LEN,
    };
    (ends_at == checked_len).then_some((entries, checked_len))
}

/// Whether every byte of `file` from `from` to `to` is zero.
fn all_zero(file: &File, from: u64, to: u64) -> io::Result<bool> {
    let mut buf = vec![0u8; 1 << 20];
    let mut at = from;
    while at < to {
        let n = buf.len().min((to - at) as usize);
        file.read_exact_at(&mut buf[..n], at)?;
        if buf[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

/// Removes the file at `path`; whether there was one.
pub(crate) fn remove_if_present(path: &Path) -> io::Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Makes a directory's entries (creations, renames, removals) durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Every open segment's path and first seq, oldest first. There is one, except after a crash
/// in an older version that started a segment before sealing the previous one.
pub(super) fn open_segments(dir: &Path) -> io::Result<Vec<(PathBuf, u64)>> {
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
pub(crate) fn open_segment_first(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    u64::from_str_radix(name.strip_suffix(".open")?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use record::Kind;

    fn header(seq: u64, n_pages: u32, page_size: u32) -> Header {
        Header {
            kind: Kind::Commit,
            seq,
            time_ms: 1_700_000_000_000 + seq as i64,
            page_size,
            db_pages: n_pages,
            wal_salt: 1,
            wal_frame: seq as u32,
            n_pages,
            packed_len: 0,
        }
    }

    /// Appends commits `first..=last` together, each rewriting pages 1 and 2 of a small
    /// database with a few bytes changed (as a busy object's commits do), or with `noise`,
    /// pages nothing compresses.
    fn append_run(segment: &mut OpenSegment, first: u64, last: u64, noise: bool) -> u64 {
        let headers: Vec<Header> = (first..=last).map(|seq| header(seq, 2, 4096)).collect();
        let mut state = first;
        segment
            .append_together(&headers, |i, w| {
                for pgno in 1..=2u32 {
                    let mut page = vec![pgno as u8; 4096];
                    page[100..108].copy_from_slice(&(first + i as u64).to_le_bytes());
                    if noise {
                        for byte in page.iter_mut() {
                            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                            *byte = (state >> 56) as u8;
                        }
                    }
                    w.page(pgno, &page)?;
                }
                Ok(())
            })
            .unwrap()
    }

    /// Commits written together are packed into one record when that pays, each still with an
    /// entry of its own; noise is written as records of their own. Reopening, listing and
    /// finding the last valid entry all see every position, and a packed record torn or
    /// damaged is found as a bad tail like any other.
    #[test]
    fn commits_written_together_are_packed_and_read_back_one_by_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut segment = OpenSegment::create(dir.path(), 1).unwrap();
        let plain = |n: u64| n * header(0, 2, 4096).record_len();
        let packed = append_run(&mut segment, 1, 10, false);
        assert!(packed * 20 < plain(10), "ten versions of two pages pack small: {packed} bytes");
        let noise = append_run(&mut segment, 11, 13, true);
        assert_eq!(noise, plain(3), "noise goes as it is");
        append_run(&mut segment, 14, 14, false);
        segment.sync().unwrap();

        let seqs: Vec<u64> = segment.entries.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=14).collect::<Vec<_>>());
        assert!(segment.entries[..10].iter().all(|e| e.offset == SEGMENT_HEADER_LEN && e.kind == Kind::Commit));
        assert_eq!(segment.entries[10].offset, SEGMENT_HEADER_LEN + packed);
        assert_eq!(entries_of(&segment.path).unwrap(), segment.entries);
        let recovered = OpenSegment::recover(&segment.path, 1).unwrap();
        assert!(recovered.tail.is_none());
        assert_eq!(recovered.segment.entries, segment.entries);
        assert_eq!(last_valid_entry(&segment.path).unwrap(), segment.entries.last().copied());
        segment.note_checked().unwrap();
        let recovered = OpenSegment::recover(&segment.path, 1).unwrap();
        assert_eq!(recovered.segment.entries, segment.entries, "the note names every packed position");

        // Torn inside the first packed record: nothing of it is used.
        std::fs::remove_file(checked_path(&segment.path)).unwrap();
        let file = OpenOptions::new().write(true).open(&segment.path).unwrap();
        file.write_all_at(&[0x5a], SEGMENT_HEADER_LEN + packed - 10).unwrap();
        let recovered = OpenSegment::recover(&segment.path, 1).unwrap();
        let tail = recovered.tail.expect("the damaged packed record is found");
        assert_eq!((tail.offset, tail.truncated), (SEGMENT_HEADER_LEN, false));
        assert!(recovered.segment.entries.is_empty());
        assert_eq!(tail.header.map(|h| (h.first_seq(), h.seq)), Some((1, 10)));
    }

    /// Small records are built whole and written at once, a large one is streamed: either way
    /// each lands at its offset, whole, and a reopening finds them all valid.
    #[test]
    fn small_and_streamed_records_read_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut segment = OpenSegment::create(dir.path(), 1).unwrap();
        let page_size = 4096u32;
        // One page, 600 pages (2.4 MB: streamed), one page again.
        let sizes = [1u32, 600, 1];
        for (i, &n) in sizes.iter().enumerate() {
            let h = header(i as u64 + 1, n, page_size);
            segment
                .append(&h, |w| {
                    for p in 1..=n {
                        w.page(p, &vec![(p % 251) as u8 ^ i as u8; page_size as usize])?;
                    }
                    Ok(())
                })
                .unwrap();
        }
        segment.sync().unwrap();
        let expected_len =
            SEGMENT_HEADER_LEN + sizes.iter().map(|&n| header(0, n, page_size).record_len()).sum::<u64>();
        assert_eq!(segment.len, expected_len);
        assert_eq!(std::fs::metadata(&segment.path).unwrap().len(), expected_len);
        let recovered = OpenSegment::recover(&segment.path, 1).unwrap();
        assert!(recovered.tail.is_none());
        let seqs: Vec<u64> = recovered.segment.entries.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [1, 2, 3]);
        assert_eq!(recovered.segment.entries, segment.entries);
    }

    fn append_small(segment: &mut OpenSegment, seq: u64) {
        segment.append(&header(seq, 1, 512), |w| w.page(1, &[seq as u8; 512])).unwrap();
    }

    /// What a clean close notes is taken as checked; what was appended after it is checked
    /// (and a torn tail found there); a note that no longer fits its segment is ignored.
    #[test]
    fn a_clean_close_spares_the_next_open_checking_what_it_noted() {
        let dir = tempfile::tempdir().unwrap();
        let mut segment = OpenSegment::create(dir.path(), 1).unwrap();
        for seq in 1..=3 {
            append_small(&mut segment, seq);
        }
        segment.note_checked().unwrap();
        let noted_len = segment.len;
        // A byte flipped inside a noted record's pages goes unread: that record is not checked.
        let file = OpenOptions::new().write(true).open(&segment.path).unwrap();
        file.write_all_at(&[0xff], SEGMENT_HEADER_LEN + record::HEADER_LEN as u64 + 10).unwrap();
        let recovered = OpenSegment::recover(&segment.path, 1).unwrap();
        assert!(recovered.tail.is_none());
        assert_eq!(recovered.segment.entries, segment.entries);
        assert_eq!(recovered.segment.len, noted_len);
        assert!(!recovered.segment.dirty, "what the note covers was synced");

        // Records appended after the note may not be on the disk (the process died, not the
        // machine): the recovered segment's next sync reaches it.
        let mut segment = recovered.segment;
        append_small(&mut segment, 4);
        let recovered = OpenSegment::recover(&segment.path, 1).unwrap();
        assert_eq!(recovered.segment.entries.len(), 4);
        assert!(recovered.segment.dirty, "records past the note are synced again");

        // Records appended after the note are checked: a torn one is found.
        segment.sync().unwrap();
        file.set_len(segment.len - 3).unwrap();
        let recovered = OpenSegment::recover(&segment.path, 1).unwrap();
        let tail = recovered.tail.expect("the torn record is found");
        assert_eq!(tail.offset, noted_len);
        assert_eq!(recovered.segment.entries.len(), 3);

        // Cut back below the note, the segment is checked whole (and the flipped byte found).
        file.set_len(noted_len - 1).unwrap();
        let recovered = OpenSegment::recover(&segment.path, 1).unwrap();
        let tail = recovered.tail.expect("the damaged first record is found");
        assert_eq!(tail.offset, SEGMENT_HEADER_LEN);
        assert!(recovered.segment.entries.is_empty());

        // A note torn or for another segment is ignored; sealing removes it.
        std::fs::write(checked_path(&segment.path), b"KURACHK1 torn").unwrap();
        assert!(OpenSegment::recover(&segment.path, 1).unwrap().tail.is_some());
        let mut other = OpenSegment::create(dir.path(), 7).unwrap();
        append_small(&mut other, 7);
        other.note_checked().unwrap();
        std::fs::copy(checked_path(&other.path), checked_path(&segment.path)).unwrap();
        assert!(OpenSegment::recover(&segment.path, 1).unwrap().tail.is_some());
        other.seal(dir.path()).unwrap();
        assert!(!checked_path(&dir.path().join(format!("{:016x}.open", 7))).exists());
    }
}
