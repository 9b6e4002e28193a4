//! The history log's record: one committed transaction (its changed pages) or one restore, with
//! a CRC over every byte, so a torn or damaged record is detected and never applied.
//!
//! Layout, little-endian (`HEADER_LEN` bytes of header, then the pages, then the CRC):
//!
//! ```text
//!  0  u64  total length of the record, CRC included (a transaction may exceed 4 GiB)
//!  8  u8   kind: 1 = commit, 2 = restore (the state becomes the snapshot at `seq`)
//!  9  [7]  zero
//! 16  u64  seq: the history position, strictly increasing, restores included
//! 24  i64  commit time, Unix milliseconds (never decreasing within a database)
//! 32  u32  page size
//! 36  u32  database size after the commit, in pages
//! 40  u64  WAL salts (salt-1 << 32 | salt-2) of the frames captured; 0 for a restore
//! 48  u32  last WAL frame captured; 0 for a restore
//! 52  u32  number of pages that follow
//! 56  n × (u32 page number, page bytes)
//! end-4    u32  CRC-32 of every byte before it
//! ```

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;

/// Bytes before the first page.
pub(crate) const HEADER_LEN: usize = 56;

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A committed transaction: its pages.
    Commit = 1,
    /// A restore: from here on the state is the snapshot with this record's `seq`.
    Restore = 2,
}

impl Kind {
    /// The kind a header's byte names, if any.
    pub(crate) fn from_byte(byte: u8) -> Option<Kind> {
        match byte {
            1 => Some(Kind::Commit),
            2 => Some(Kind::Restore),
            _ => None,
        }
    }
}

/// A record's header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub kind: Kind,
    pub seq: u64,
    pub time_ms: i64,
    pub page_size: u32,
    pub db_pages: u32,
    pub wal_salt: u64,
    pub wal_frame: u32,
    pub n_pages: u32,
}

impl Header {
    /// The record's total length, CRC included.
    pub(crate) fn record_len(&self) -> u64 {
        HEADER_LEN as u64 + self.n_pages as u64 * (4 + self.page_size as u64) + 4
    }

    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&self.record_len().to_le_bytes());
        b[8] = self.kind as u8;
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.time_ms.to_le_bytes());
        b[32..36].copy_from_slice(&self.page_size.to_le_bytes());
        b[36..40].copy_from_slice(&self.db_pages.to_le_bytes());
        b[40..48].copy_from_slice(&self.wal_salt.to_le_bytes());
        b[48..52].copy_from_slice(&self.wal_frame.to_le_bytes());
        b[52..56].copy_from_slice(&self.n_pages.to_le_bytes());
        b
    }

    /// Parses a header; `None` if it cannot be one (a torn tail, or garbage).
    pub(crate) fn decode(b: &[u8; HEADER_LEN]) -> Option<Header> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let kind = Kind::from_byte(b[8])?;
        let header = Header {
            kind,
            seq: u64_at(16),
            time_ms: u64_at(24) as i64,
            page_size: u32_at(32),
            db_pages: u32_at(36),
            wal_salt: u64_at(40),
            wal_frame: u32_at(48),
            n_pages: u32_at(52),
        };
        let sane_page_size = header.page_size.is_power_of_two() && (512..=65536).contains(&header.page_size);
        (sane_page_size && b[9..16].iter().all(|&z| z == 0) && u64_at(0) == header.record_len()).then_some(header)
    }
}

/// Writes one record, page by page, with its CRC; pages come from `next_page` in order.
pub(crate) struct RecordWriter<'a, W: Write + ?Sized> {
    out: &'a mut W,
    crc: crc32fast::Hasher,
    remaining: u32,
}

impl<'a, W: Write + ?Sized> RecordWriter<'a, W> {
    pub(crate) fn begin(out: &'a mut W, header: &Header) -> io::Result<Self> {
        let bytes = header.encode();
        let mut crc = crc32fast::Hasher::new();
        crc.update(&bytes);
        out.write_all(&bytes)?;
        Ok(RecordWriter { out, crc, remaining: header.n_pages })
    }

    pub(crate) fn page(&mut self, pgno: u32, data: &[u8]) -> io::Result<()> {
        if self.remaining == 0 {
            return Err(io::Error::other("more pages than the record's header announced"));
        }
        self.remaining -= 1;
        let number = pgno.to_le_bytes();
        self.crc.update(&number);
        self.crc.update(data);
        self.out.write_all(&number)?;
        self.out.write_all(data)
    }

    pub(crate) fn finish(self) -> io::Result<()> {
        if self.remaining != 0 {
            return Err(io::Error::other("fewer pages than the record's header announced"));
        }
        self.out.write_all(&self.crc.finalize().to_le_bytes())
    }
}

/// Why reading a record stopped.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The file ends inside the record (a torn write): nothing of it may be used.
    Truncated,
    /// The bytes are all there but do not match their CRC, or the header is not a header.
    Corrupt(String),
    /// The file system failed.
    Io(io::Error),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

/// Bytes read at a time when streaming a record.
const CHUNK: usize = 256 * 1024;

/// The header of the record at `offset` of a file `len` bytes long, without checking the record.
pub(crate) fn header_at(file: &File, offset: u64, len: u64) -> Result<Header, ReadError> {
    raw_header_at(file, offset, len).map(|(header, _)| header)
}

/// The header's bytes at `offset`, undecoded, if the file holds that many.
pub(crate) fn header_bytes_at(file: &File, offset: u64, len: u64) -> io::Result<Option<[u8; HEADER_LEN]>> {
    if len.saturating_sub(offset) < HEADER_LEN as u64 {
        return Ok(None);
    }
    let mut head = [0u8; HEADER_LEN];
    file.read_exact_at(&mut head, offset)?;
    Ok(Some(head))
}

/// The header at `offset`, with its bytes as they are on disk.
fn raw_header_at(file: &File, offset: u64, len: u64) -> Result<(Header, [u8; HEADER_LEN]), ReadError> {
    if len.saturating_sub(offset) < HEADER_LEN as u64 {
        return Err(ReadError::Truncated);
    }
    let mut head = [0u8; HEADER_LEN];
    file.read_exact_at(&mut head, offset)?;
    let header =
        Header::decode(&head).ok_or_else(|| ReadError::Corrupt(format!("no record header at byte {offset}")))?;
    if len - offset < header.record_len() {
        return Err(ReadError::Truncated);
    }
    Ok((header, head))
}

thread_local! {
    /// Where [`verify_at`] reads records: one buffer per thread, reused.
    static VERIFY_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The window a [`Walk`] reads a file through: one per thread, reused.
    static WALK_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Checks the record at `offset` of a file `len` bytes long: read whole if it is at most
/// [`CHUNK`] bytes, else streamed through its CRC (records can be as large as the database).
/// `Ok(None)` at the end.
pub(crate) fn verify_at(file: &File, offset: u64, len: u64) -> Result<Option<Header>, ReadError> {
    if offset == len {
        return Ok(None);
    }
    let (header, head) = raw_header_at(file, offset, len)?;
    if header.record_len() <= CHUNK as u64 {
        return VERIFY_BUFFER.with_borrow_mut(|buf| {
            buf.resize(header.record_len() as usize, 0);
            file.read_exact_at(buf, offset)?;
            check_crc(&header, buf, offset).map(|()| Some(header))
        });
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head);
    let mut stored = [0u8; 4];
    let body_end = offset + header.record_len() - 4;
    VERIFY_BUFFER.with_borrow_mut(|buf| -> io::Result<()> {
        buf.resize(CHUNK, 0);
        let mut at = offset + HEADER_LEN as u64;
        while at < body_end {
            let n = CHUNK.min((body_end - at) as usize);
            file.read_exact_at(&mut buf[..n], at)?;
            crc.update(&buf[..n]);
            at += n as u64;
        }
        file.read_exact_at(&mut stored, body_end)
    })?;
    if crc.finalize().to_le_bytes() != stored {
        return Err(bad_crc(&header, offset));
    }
    Ok(Some(header))
}

/// Checks a whole record's bytes against the CRC they end with.
fn check_crc(header: &Header, record: &[u8], offset: u64) -> Result<(), ReadError> {
    let (covered, stored) = record.split_at(record.len() - 4);
    match crc32fast::hash(covered).to_le_bytes() == stored {
        true => Ok(()),
        false => Err(bad_crc(header, offset)),
    }
}

fn bad_crc(header: &Header, offset: u64) -> ReadError {
    ReadError::Corrupt(format!("record {} (at byte {offset}) fails its checksum", header.seq))
}

/// Runs `f` with a [`Walk`] over `file`, `len` bytes long.
pub(crate) fn walk<T>(file: &File, len: u64, f: impl FnOnce(&mut Walk<'_>) -> T) -> T {
    WALK_BUFFER.with_borrow_mut(|window| f(&mut Walk { file, len, window, window_at: 0, filled: 0 }))
}

/// Checks a file's records one after another as [`verify_at`] does, reading the file [`CHUNK`]
/// bytes at a time: opening a database checks every record of its open segment, dozens of
/// small ones after a busy spell, and two reads for each cost more than the checking.
pub(crate) struct Walk<'a> {
    file: &'a File,
    len: u64,
    window: &'a mut Vec<u8>,
    /// Where in the file the window's first `filled` bytes come from.
    window_at: u64,
    filled: usize,
}

impl Walk<'_> {
    /// The record at `offset`, checked, as [`verify_at`] answers.
    pub(crate) fn verify_at(&mut self, offset: u64) -> Result<Option<Header>, ReadError> {
        if offset == self.len {
            return Ok(None);
        }
        let head = self.bytes(offset, HEADER_LEN)?.ok_or(ReadError::Truncated)?;
        let header = head
            .try_into()
            .ok()
            .and_then(Header::decode)
            .ok_or_else(|| ReadError::Corrupt(format!("no record header at byte {offset}")))?;
        if header.record_len() > CHUNK as u64 {
            return verify_at(self.file, offset, self.len);
        }
        let record = self.bytes(offset, header.record_len() as usize)?.ok_or(ReadError::Truncated)?;
        check_crc(&header, record, offset).map(|()| Some(header))
    }

    /// The `n` bytes (at most [`CHUNK`]) at `offset`, the window moved there first if it does
    /// not hold them; `None` if the file ends before.
    fn bytes(&mut self, offset: u64, n: usize) -> io::Result<Option<&[u8]>> {
        if self.len.saturating_sub(offset) < n as u64 {
            return Ok(None);
        }
        if offset < self.window_at || offset + n as u64 > self.window_at + self.filled as u64 {
            let fill = CHUNK.min((self.len - offset) as usize);
            self.window.resize(fill, 0);
            self.file.read_exact_at(&mut self.window[..fill], offset)?;
            (self.window_at, self.filled) = (offset, fill);
        }
        let start = (offset - self.window_at) as usize;
        Ok(Some(&self.window[start..start + n]))
    }
}

/// Records up to this size are read once, whole, into the caller's buffer.
const WHOLE_RECORD_MAX: u64 = 8 << 20;

/// Checks the record at `offset` (of a file `len` bytes long) and hands each of its pages to
/// `page`, in order, only once every byte is checked. A record of up to `WHOLE_RECORD_MAX`
/// bytes is read once into `buf` (kept by the caller across records); a larger one is streamed
/// twice, to check it and then to apply it.
pub(crate) fn apply_at(
    file: &File,
    offset: u64,
    len: u64,
    buf: &mut Vec<u8>,
    mut page: impl FnMut(u32, &[u8]) -> io::Result<()>,
) -> Result<Header, ReadError> {
    let (header, _) = raw_header_at(file, offset, len)?;
    if header.record_len() > WHOLE_RECORD_MAX {
        let checked = verify_at(file, offset, len)?.ok_or(ReadError::Truncated)?;
        pages_at(file, offset, &checked, page)?;
        return Ok(checked);
    }
    buf.resize(header.record_len() as usize, 0);
    file.read_exact_at(buf, offset)?;
    let body_end = buf.len() - 4;
    if crc32fast::hash(&buf[..body_end]).to_le_bytes() != buf[body_end..] {
        return Err(ReadError::Corrupt(format!("record {} (at byte {offset}) fails its checksum", header.seq)));
    }
    for entry in buf[HEADER_LEN..body_end].chunks_exact(4 + header.page_size as usize) {
        page(u32::from_le_bytes(entry[..4].try_into().expect("4 bytes")), &entry[4..])?;
    }
    Ok(header)
}

/// Hands each page of a record already checked by [`verify_at`] to `page`, in order.
pub(crate) fn pages_at(
    file: &File,
    offset: u64,
    header: &Header,
    mut page: impl FnMut(u32, &[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let stride = 4 + header.page_size as usize;
    let per_read = (CHUNK / stride).max(1);
    let mut buf = vec![0u8; per_read * stride];
    let mut at = offset + HEADER_LEN as u64;
    let mut left = header.n_pages as usize;
    while left > 0 {
        let n = per_read.min(left);
        file.read_exact_at(&mut buf[..n * stride], at)?;
        for entry in buf[..n * stride].chunks_exact(stride) {
            page(u32::from_le_bytes(entry[..4].try_into().expect("4 bytes")), &entry[4..])?;
        }
        at += (n * stride) as u64;
        left -= n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(n_pages: u32) -> Header {
        Header {
            kind: Kind::Commit,
            seq: 7,
            time_ms: 1_700_000_000_000,
            page_size: 512,
            db_pages: 3,
            wal_salt: 0xdead_beef_0000_0001,
            wal_frame: 9,
            n_pages,
        }
    }

    fn encoded() -> Vec<u8> {
        let mut out = Vec::new();
        let mut w = RecordWriter::begin(&mut out, &header(2)).unwrap();
        w.page(1, &[1u8; 512]).unwrap();
        w.page(3, &[3u8; 512]).unwrap();
        w.finish().unwrap();
        out
    }

    fn file_of(bytes: &[u8]) -> (tempfile::NamedTempFile, File) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        let file = File::open(f.path()).unwrap();
        (f, file)
    }

    #[test]
    fn round_trips_and_checks_every_byte() {
        let bytes = encoded();
        assert_eq!(bytes.len() as u64, header(2).record_len());
        let (_keep, file) = file_of(&bytes);
        let h = verify_at(&file, 0, bytes.len() as u64).unwrap().unwrap();
        assert_eq!(h, header(2));
        let mut pages = Vec::new();
        pages_at(&file, 0, &h, |n, d| {
            pages.push((n, d[0]));
            Ok(())
        })
        .unwrap();
        assert_eq!(pages, [(1, 1), (3, 3)]);
        assert!(verify_at(&file, bytes.len() as u64, bytes.len() as u64).unwrap().is_none());

        for flip in [0usize, 5, 20, 60, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[flip] ^= 0x40;
            let (_keep, file) = file_of(&bad);
            assert!(verify_at(&file, 0, bad.len() as u64).is_err(), "flipping byte {flip} went unnoticed");
        }
    }

    #[test]
    fn applying_checks_before_handing_out_pages() {
        let bytes = encoded();
        let (_keep, file) = file_of(&bytes);
        let mut buf = Vec::new();
        let mut pages = Vec::new();
        let h = apply_at(&file, 0, bytes.len() as u64, &mut buf, |n, d| {
            pages.push((n, d[0]));
            Ok(())
        })
        .unwrap();
        assert_eq!((h, pages), (header(2), vec![(1, 1), (3, 3)]));
        let mut bad = bytes.clone();
        bad[HEADER_LEN + 100] ^= 1;
        let (_keep, file) = file_of(&bad);
        let mut handed = 0;
        let outcome = apply_at(&file, 0, bad.len() as u64, &mut buf, |_, _| {
            handed += 1;
            Ok(())
        });
        assert!(matches!(outcome, Err(ReadError::Corrupt(_))));
        assert_eq!(handed, 0, "no page of a damaged record is used");
    }

    #[test]
    fn a_torn_tail_is_truncated_not_corrupt() {
        let bytes = encoded();
        for cut in [1, HEADER_LEN - 1, HEADER_LEN + 10, bytes.len() - 1] {
            let (_keep, file) = file_of(&bytes[..cut]);
            assert!(matches!(verify_at(&file, 0, cut as u64), Err(ReadError::Truncated)), "cut at {cut}");
        }
    }
}
