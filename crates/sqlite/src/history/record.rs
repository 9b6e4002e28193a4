//! The history log's record: one committed transaction (its changed pages), one restore, or a
//! run of consecutive commits compressed together, with a CRC over every byte, so a torn or
//! damaged record is detected and never applied.
//!
//! Layout, little-endian (`HEADER_LEN` bytes of header, then the body, then the CRC):
//!
//! ```text
//!  0  u64  total length of the record, CRC included (a transaction may exceed 4 GiB)
//!  8  u8   kind: 1 = commit, 2 = restore (the state becomes the snapshot at `seq`),
//!          3 = commits compressed together (below)
//!  9  [3]  zero
//! 12  u32  kind 3: bytes of the compressed pages; otherwise zero
//! 16  u64  seq: the history position, strictly increasing, restores included
//! 24  i64  commit time, Unix milliseconds (never decreasing within a database)
//! 32  u32  page size
//! 36  u32  database size after the commit, in pages
//! 40  u64  WAL salts (salt-1 << 32 | salt-2) of the frames captured; 0 for a restore
//! 48  u32  last WAL frame captured; 0 for a restore
//! 52  u32  number of pages that follow; kind 3: number of commits
//! 56  n × (u32 page number, page bytes)
//! end-4    u32  CRC-32 of every byte before it
//! ```
//!
//! A record of kind 3 holds the commits one capture wrote together (positions `seq - n + 1` to
//! `seq`); its header describes the last of them. Its body is an index of the commits, then
//! their pages, one commit after another, as one LZ4 block. Successive commits to a small
//! database rewrite the same few pages, so the block is a fraction of the pages: the history's
//! copy of a busy Durable Object's commits was most of what it left the disk to write back.
//!
//! ```text
//! 56  n × (i64 commit time, u32 database size in pages, u32 last WAL frame, u32 pages)
//! 56 + 20n  the LZ4 block: every commit's n × (u32 page number, page bytes), in order
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
    /// Consecutive commits, their pages compressed together; the header describes the last.
    Commits = 3,
}

impl Kind {
    /// The kind a header's byte names, if any.
    pub(crate) fn from_byte(byte: u8) -> Option<Kind> {
        match byte {
            1 => Some(Kind::Commit),
            2 => Some(Kind::Restore),
            3 => Some(Kind::Commits),
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
    /// Pages that follow; for [`Kind::Commits`], the number of commits.
    pub n_pages: u32,
    /// For [`Kind::Commits`], bytes of the compressed pages; otherwise 0.
    pub packed_len: u32,
}

/// Most bytes of pages one [`Kind::Commits`] record may unpack to: a capture packs at most one
/// write's worth of records ([`WHOLE_RECORD`]).
const PACKED_PAGES_MAX: u64 = WHOLE_RECORD;

/// Largest record built whole in a thread's buffer, then written with one system call; a
/// larger one (a bulk write: records can be as large as the database) is streamed to its place
/// through a buffer of its own (`segment.rs`).
pub(crate) const WHOLE_RECORD: u64 = 1 << 20;

/// Bytes of one commit's entry in the index of a [`Kind::Commits`] record.
pub(crate) const INDEX_ENTRY_LEN: usize = 20;

/// Fewest bytes of log one position takes (an index entry of a [`Kind::Commits`] record): a
/// bound on how many positions damaged bytes held.
pub(crate) const MIN_BYTES_PER_POSITION: u64 = INDEX_ENTRY_LEN as u64;

impl Header {
    /// The record's total length, CRC included.
    pub(crate) fn record_len(&self) -> u64 {
        match self.kind {
            Kind::Commits => {
                HEADER_LEN as u64 + self.n_pages as u64 * INDEX_ENTRY_LEN as u64 + self.packed_len as u64 + 4
            }
            Kind::Commit | Kind::Restore => HEADER_LEN as u64 + self.n_pages as u64 * (4 + self.page_size as u64) + 4,
        }
    }

    /// Bytes a commit's pages take, uncompressed.
    fn pages_len(&self) -> u64 {
        self.n_pages as u64 * (4 + self.page_size as u64)
    }

    /// The first position the record holds (its only one unless it packs commits).
    pub(crate) fn first_seq(&self) -> u64 {
        match self.kind {
            // `decode` holds `seq >= n_pages >= 1` for a record read from a file.
            Kind::Commits => self.seq - (self.n_pages.max(1) as u64 - 1),
            Kind::Commit | Kind::Restore => self.seq,
        }
    }

    /// What its last (or only) position is: a commit or a restore.
    pub(crate) fn last_kind(&self) -> Kind {
        match self.kind {
            Kind::Restore => Kind::Restore,
            Kind::Commit | Kind::Commits => Kind::Commit,
        }
    }

    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&self.record_len().to_le_bytes());
        b[8] = self.kind as u8;
        b[12..16].copy_from_slice(&self.packed_len.to_le_bytes());
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
            packed_len: u32_at(12),
        };
        let sane_page_size = header.page_size.is_power_of_two() && (512..=65536).contains(&header.page_size);
        let sane_kind = match kind {
            Kind::Commits => header.n_pages > 0 && header.packed_len > 0 && header.seq >= header.n_pages as u64,
            Kind::Commit | Kind::Restore => header.packed_len == 0,
        };
        (sane_page_size && sane_kind && b[9..12].iter().all(|&z| z == 0) && u64_at(0) == header.record_len())
            .then_some(header)
    }
}

/// Writes one record, page by page, with its CRC; or only a commit's pages, for [`pack`].
pub(crate) struct RecordWriter<'a, W: Write + ?Sized> {
    out: &'a mut W,
    /// `None` when only the pages are written.
    crc: Option<crc32fast::Hasher>,
    remaining: u32,
}

impl<'a, W: Write + ?Sized> RecordWriter<'a, W> {
    pub(crate) fn begin(out: &'a mut W, header: &Header) -> io::Result<Self> {
        let bytes = header.encode();
        let mut crc = crc32fast::Hasher::new();
        crc.update(&bytes);
        out.write_all(&bytes)?;
        Ok(RecordWriter { out, crc: Some(crc), remaining: header.n_pages })
    }

    /// Writes the pages of the commit `header` describes and nothing else: no header, no CRC.
    pub(crate) fn pages_only(out: &'a mut W, header: &Header) -> Self {
        RecordWriter { out, crc: None, remaining: header.n_pages }
    }

    pub(crate) fn page(&mut self, pgno: u32, data: &[u8]) -> io::Result<()> {
        if self.remaining == 0 {
            return Err(io::Error::other("more pages than the record's header announced"));
        }
        self.remaining -= 1;
        let number = pgno.to_le_bytes();
        if let Some(crc) = &mut self.crc {
            crc.update(&number);
            crc.update(data);
        }
        self.out.write_all(&number)?;
        self.out.write_all(data)
    }

    pub(crate) fn finish(self) -> io::Result<()> {
        if self.remaining != 0 {
            return Err(io::Error::other("fewer pages than the record's header announced"));
        }
        match self.crc {
            Some(crc) => self.out.write_all(&crc.finalize().to_le_bytes()),
            None => Ok(()),
        }
    }
}

/// Packs consecutive commits into one [`Kind::Commits`] record at the start of `out`, from their
/// headers and their pages (written one commit after another by [`RecordWriter::pages_only`]),
/// if that record takes at most `most` bytes; returns its length if it did. Commits that are not
/// consecutive, or differ in page size or WAL, are never packed together. `out` only grows:
/// zeroing the room a block may take, every time, cost as much as compressing into it.
pub(crate) fn pack(headers: &[Header], pages: &[u8], most: u64, out: &mut Vec<u8>) -> Option<usize> {
    let last = headers.last()?;
    let together = headers.iter().enumerate().all(|(i, h)| {
        h.kind == Kind::Commit
            && h.page_size == last.page_size
            && h.wal_salt == last.wal_salt
            && h.seq + (headers.len() - 1 - i) as u64 == last.seq
    });
    let index_len = headers.len() * INDEX_ENTRY_LEN;
    let block_at = HEADER_LEN + index_len;
    let most_block = lz4_flex::block::get_maximum_output_size(pages.len());
    let pages_announced = headers.iter().try_fold(0u64, |sum, h| sum.checked_add(h.pages_len()));
    if !together || pages_announced != Some(pages.len() as u64) || pages.len() as u64 > PACKED_PAGES_MAX {
        return None;
    }
    if out.len() < block_at + most_block + 4 {
        out.resize(block_at + most_block + 4, 0);
    }
    let packed_len = lz4_flex::block::compress_into(pages, &mut out[block_at..]).ok()?;
    let (Ok(n_commits), Ok(packed_len32)) = (u32::try_from(headers.len()), u32::try_from(packed_len)) else {
        return None;
    };
    let header = Header { kind: Kind::Commits, n_pages: n_commits, packed_len: packed_len32, ..*last };
    if header.record_len() > most {
        return None;
    }
    let crc_at = block_at + packed_len;
    out[..HEADER_LEN].copy_from_slice(&header.encode());
    for (h, entry) in headers.iter().zip(out[HEADER_LEN..block_at].chunks_exact_mut(INDEX_ENTRY_LEN)) {
        entry[0..8].copy_from_slice(&h.time_ms.to_le_bytes());
        entry[8..12].copy_from_slice(&h.db_pages.to_le_bytes());
        entry[12..16].copy_from_slice(&h.wal_frame.to_le_bytes());
        entry[16..20].copy_from_slice(&h.n_pages.to_le_bytes());
    }
    let crc = crc32fast::hash(&out[..crc_at]);
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(crc_at as u64 + 4, header.record_len());
    Some(crc_at + 4)
}

/// Writes the commits [`pack`] would not take as records of their own to `out`, from the same
/// headers and pages.
pub(crate) fn unpacked(headers: &[Header], pages: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
    out.clear();
    let mut at = 0;
    for header in headers {
        let n = header.pages_len() as usize;
        let own = pages.get(at..at + n).ok_or_else(|| io::Error::other("fewer pages than the headers announce"))?;
        let mut writer = RecordWriter::begin(out, header)?;
        for entry in own.chunks_exact(4 + header.page_size as usize) {
            writer.page(u32::from_le_bytes(entry[..4].try_into().expect("4 bytes")), &entry[4..])?;
        }
        writer.finish()?;
        at += n;
    }
    match at == pages.len() {
        true => Ok(()),
        false => Err(io::Error::other("more pages than the headers announce")),
    }
}

/// The commits a [`Kind::Commits`] record packs, each as a header of its own, from the index
/// (the bytes after the record's header); refused unless the index agrees with the header.
pub(crate) fn packed_headers(header: &Header, index: &[u8]) -> Result<Vec<Header>, ReadError> {
    let corrupt = || ReadError::Corrupt(format!("record {} has an index that does not match it", header.seq));
    if header.kind != Kind::Commits || index.len() != header.n_pages as usize * INDEX_ENTRY_LEN {
        return Err(corrupt());
    }
    let first = header.first_seq();
    let u32_at = |b: &[u8], i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let commits: Vec<Header> = index
        .chunks_exact(INDEX_ENTRY_LEN)
        .enumerate()
        .map(|(i, entry)| Header {
            kind: Kind::Commit,
            seq: first + i as u64,
            time_ms: i64::from_le_bytes(entry[0..8].try_into().expect("8 bytes")),
            page_size: header.page_size,
            db_pages: u32_at(entry, 8),
            wal_salt: header.wal_salt,
            wal_frame: u32_at(entry, 12),
            n_pages: u32_at(entry, 16),
            packed_len: 0,
        })
        .collect();
    let last = commits.last().expect("a record of commits holds one");
    let agrees = (last.seq, last.time_ms, last.db_pages, last.wal_frame)
        == (header.seq, header.time_ms, header.db_pages, header.wal_frame)
        && commits.windows(2).all(|pair| pair[0].time_ms <= pair[1].time_ms);
    agrees.then_some(commits).ok_or_else(corrupt)
}

/// The index of the [`Kind::Commits`] record at `offset`, read on its own (not checked against
/// the record's CRC: that is done when the record is applied).
pub(crate) fn packed_headers_at(file: &File, offset: u64, header: &Header) -> Result<Vec<Header>, ReadError> {
    let mut index = vec![0u8; header.n_pages as usize * INDEX_ENTRY_LEN];
    file.read_exact_at(&mut index, offset + HEADER_LEN as u64)?;
    packed_headers(header, &index)
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

    /// The commits the packed record at `offset` holds, as [`packed_headers_at`] reads them, but
    /// through the window, which holds them already once the record is checked.
    pub(crate) fn packed_headers_at(&mut self, offset: u64, header: &Header) -> Result<Vec<Header>, ReadError> {
        let index_len = header.n_pages as usize * INDEX_ENTRY_LEN;
        if index_len > CHUNK {
            return packed_headers_at(self.file, offset, header);
        }
        let index = self.bytes(offset + HEADER_LEN as u64, index_len)?.ok_or(ReadError::Truncated)?;
        packed_headers(header, index)
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

/// Where [`apply_at`] reads records and unpacks their pages: kept by the caller across records.
#[derive(Default)]
pub(crate) struct ApplyBuffers {
    record: Vec<u8>,
    pages: Vec<u8>,
}

/// Checks the record at `offset` (of a file `len` bytes long) and hands each page of its commits
/// at positions in `seqs` to `page`, in order, only once every byte is checked; returns the
/// header of the last commit applied. A record of up to `WHOLE_RECORD_MAX` bytes is read once
/// into `bufs`; a larger one (never a packed one) is streamed twice, to check it and then to
/// apply it.
pub(crate) fn apply_at(
    file: &File,
    offset: u64,
    len: u64,
    bufs: &mut ApplyBuffers,
    seqs: std::ops::RangeInclusive<u64>,
    mut page: impl FnMut(u32, &[u8]) -> io::Result<()>,
) -> Result<Header, ReadError> {
    let (header, _) = raw_header_at(file, offset, len)?;
    let corrupt = |why: &str| ReadError::Corrupt(format!("record {} (at byte {offset}) {why}", header.seq));
    // Every position asked for must be the record's: a plan that names others has read
    // entries that do not match the file.
    if *seqs.start() < header.first_seq() || *seqs.end() > header.seq || seqs.is_empty() {
        return Err(corrupt(&format!("does not hold positions {} to {}", seqs.start(), seqs.end())));
    }
    if header.record_len() > WHOLE_RECORD_MAX {
        if header.kind == Kind::Commits {
            return Err(corrupt("packs more than any capture writes"));
        }
        let checked = verify_at(file, offset, len)?.ok_or(ReadError::Truncated)?;
        pages_at(file, offset, &checked, page)?;
        return Ok(checked);
    }
    let buf = &mut bufs.record;
    buf.resize(header.record_len() as usize, 0);
    file.read_exact_at(buf, offset)?;
    let body_end = buf.len() - 4;
    if crc32fast::hash(&buf[..body_end]).to_le_bytes() != buf[body_end..] {
        return Err(corrupt("fails its checksum"));
    }
    let stride = 4 + header.page_size as usize;
    let hand_out = |pages: &[u8], page: &mut dyn FnMut(u32, &[u8]) -> io::Result<()>| -> io::Result<()> {
        for entry in pages.chunks_exact(stride) {
            page(u32::from_le_bytes(entry[..4].try_into().expect("4 bytes")), &entry[4..])?;
        }
        Ok(())
    };
    if header.kind != Kind::Commits {
        hand_out(&buf[HEADER_LEN..body_end], &mut page)?;
        return Ok(header);
    }
    let index_end = HEADER_LEN + header.n_pages as usize * INDEX_ENTRY_LEN;
    let commits = packed_headers(&header, &buf[HEADER_LEN..index_end])?;
    // A capture packs at most one write's worth of pages: a larger claim (even one that
    // overflows) is damage, not an allocation to make.
    let unpacked_len = commits.iter().try_fold(0u64, |sum, commit| sum.checked_add(commit.pages_len()));
    let Some(unpacked_len) = unpacked_len.filter(|&n| n <= PACKED_PAGES_MAX) else {
        return Err(corrupt("claims more pages than a capture packs"));
    };
    bufs.pages.resize(unpacked_len as usize, 0);
    match lz4_flex::block::decompress_into(&buf[index_end..body_end], &mut bufs.pages) {
        Ok(n) if n as u64 == unpacked_len => {}
        _ => return Err(corrupt("does not unpack to its pages")),
    }
    let (mut at, mut applied) = (0, None);
    for commit in commits {
        let n = commit.pages_len() as usize;
        if seqs.contains(&commit.seq) {
            hand_out(&bufs.pages[at..at + n], &mut page)?;
            applied = Some(commit);
        }
        at += n;
    }
    applied.ok_or_else(|| corrupt("holds none of the positions asked for"))
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
            packed_len: 0,
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
        let mut buf = ApplyBuffers::default();
        let mut pages = Vec::new();
        let h = apply_at(&file, 0, bytes.len() as u64, &mut buf, 7..=7, |n, d| {
            pages.push((n, d[0]));
            Ok(())
        })
        .unwrap();
        assert_eq!((h, pages), (header(2), vec![(1, 1), (3, 3)]));
        let mut bad = bytes.clone();
        bad[HEADER_LEN + 100] ^= 1;
        let (_keep, file) = file_of(&bad);
        let mut handed = 0;
        let outcome = apply_at(&file, 0, bad.len() as u64, &mut buf, 7..=7, |_, _| {
            handed += 1;
            Ok(())
        });
        assert!(matches!(outcome, Err(ReadError::Corrupt(_))));
        assert_eq!(handed, 0, "no page of a damaged record is used");
    }

    /// Commits 5 to 8, each rewriting pages 1 and 2 with its own position inside, packed.
    fn packed() -> (Vec<Header>, Vec<u8>) {
        let headers: Vec<Header> = (5..=8u64)
            .map(|seq| Header { seq, time_ms: 1_700_000_000_000 + seq as i64, db_pages: seq as u32, ..header(2) })
            .collect();
        let mut pages = Vec::new();
        for h in &headers {
            let mut w = RecordWriter::pages_only(&mut pages, h);
            for pgno in 1..=2u32 {
                let mut page = [pgno as u8; 512];
                page[9] = h.seq as u8;
                w.page(pgno, &page).unwrap();
            }
            w.finish().unwrap();
        }
        let mut out = Vec::new();
        let len = pack(&headers, &pages, u64::MAX, &mut out).unwrap();
        out.truncate(len);
        (headers, out)
    }

    #[test]
    fn packed_commits_apply_any_run_of_their_positions_and_check_every_byte() {
        let (headers, bytes) = packed();
        let (_keep, file) = file_of(&bytes);
        let outer = verify_at(&file, 0, bytes.len() as u64).unwrap().unwrap();
        assert_eq!(
            (outer.kind, outer.first_seq(), outer.seq, outer.record_len()),
            (Kind::Commits, 5, 8, bytes.len() as u64)
        );
        assert_eq!(packed_headers_at(&file, 0, &outer).unwrap(), headers);
        let mut bufs = ApplyBuffers::default();
        let mut applied = Vec::new();
        let last = apply_at(&file, 0, bytes.len() as u64, &mut bufs, 6..=7, |pgno, data| {
            applied.push((pgno, data[0], data[9]));
            Ok(())
        })
        .unwrap();
        assert_eq!(last, headers[2], "the header of the last commit applied");
        assert_eq!(applied, [(1, 1, 6), (2, 2, 6), (1, 1, 7), (2, 2, 7)]);
        assert!(apply_at(&file, 0, bytes.len() as u64, &mut bufs, 9..=9, |_, _| Ok(())).is_err());
        assert!(
            apply_at(&file, 0, bytes.len() as u64, &mut bufs, 4..=6, |_, _| Ok(())).is_err(),
            "position 4 is not its"
        );

        // An index claiming more pages than any capture packs (with a CRC that matches, as a
        // crafted file could have) is refused, not allocated for.
        for claim in [u32::MAX, 1 << 20] {
            let mut hostile = bytes.clone();
            let at = HEADER_LEN + INDEX_ENTRY_LEN + 16;
            hostile[at..at + 4].copy_from_slice(&claim.to_le_bytes());
            let body_end = hostile.len() - 4;
            let crc = crc32fast::hash(&hostile[..body_end]);
            hostile[body_end..].copy_from_slice(&crc.to_le_bytes());
            let (_keep, file) = file_of(&hostile);
            let outcome = apply_at(&file, 0, hostile.len() as u64, &mut bufs, 5..=8, |_, _| Ok(()));
            assert!(matches!(outcome, Err(ReadError::Corrupt(_))), "a claim of {claim} pages");
        }

        for flip in [0usize, 13, 20, HEADER_LEN + 3, HEADER_LEN + 4 * INDEX_ENTRY_LEN + 2, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[flip] ^= 0x40;
            let (_keep, file) = file_of(&bad);
            let mut handed = 0;
            let outcome = apply_at(&file, 0, bad.len() as u64, &mut bufs, 5..=8, |_, _| {
                handed += 1;
                Ok(())
            });
            assert!(outcome.is_err() && handed == 0, "flipping byte {flip} went unnoticed");
        }
    }

    #[test]
    fn what_packing_would_not_save_is_written_as_records_of_their_own() {
        let (headers, _) = packed();
        let mut pages = Vec::new();
        for h in &headers {
            let mut w = RecordWriter::pages_only(&mut pages, h);
            w.page(1, &[h.seq as u8; 512]).unwrap();
            w.page(3, &[3u8; 512]).unwrap();
            w.finish().unwrap();
        }
        let plain: u64 = headers.iter().map(Header::record_len).sum();
        let mut out = Vec::new();
        assert_eq!(pack(&headers, &pages, 100, &mut out), None, "not within the bytes allowed");
        assert_eq!(pack(&[headers[0], headers[2]], &pages[..2 * 516 * 2], u64::MAX, &mut out), None, "not consecutive");
        unpacked(&headers, &pages, &mut out).unwrap();
        assert_eq!(out.len() as u64, plain);
        let (_keep, file) = file_of(&out);
        let mut offset = 0;
        for h in &headers {
            assert_eq!(verify_at(&file, offset, plain).unwrap(), Some(*h));
            offset += h.record_len();
        }
        assert!(unpacked(&headers, &pages[..100], &mut out).is_err());
    }

    /// Any run of commits (each some of eight 512-byte pages, each page one of a few contents or
    /// noise, so that some runs pack and others do not), written as `append_together` writes
    /// it (packed only if that saves an eighth), reads back exactly: every sub-run of its
    /// positions applies the pages of those commits and no others, in order. Both forms occur.
    #[test]
    fn any_run_of_commits_reads_back_exactly() {
        use proptest::prelude::*;
        let cases = kura_testkit::count("KURA_FUZZ_CASES", 300);
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config::with_cases(cases));
        let commits =
            proptest::collection::vec(proptest::collection::vec((1u32..=8, 0u8..4, any::<bool>()), 0..4), 1..12);
        let (packed_runs, unpacked_runs) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        runner
            .run(&(commits, 0usize..12, 0usize..12), |(commits, from, span)| {
                let headers: Vec<Header> = commits
                    .iter()
                    .enumerate()
                    .map(|(i, pages)| Header {
                        seq: 20 + i as u64,
                        time_ms: 1_700_000_000_000 + i as i64,
                        db_pages: 8,
                        wal_frame: 3 * i as u32 + 1,
                        n_pages: pages.len() as u32,
                        ..header(0)
                    })
                    .collect();
                let mut noise = 0x2545_f491_4f6c_dd1du64;
                let (mut contents, mut pages) = (Vec::new(), Vec::new());
                for (h, commit) in headers.iter().zip(&commits) {
                    let mut w = RecordWriter::pages_only(&mut pages, h);
                    for &(pgno, fill, noisy) in commit {
                        let mut page = [fill; 512];
                        if noisy {
                            for byte in page.iter_mut() {
                                noise ^= noise << 13;
                                noise ^= noise >> 7;
                                noise ^= noise << 17;
                                *byte = noise as u8;
                            }
                        }
                        w.page(pgno, &page).unwrap();
                        contents.push((h.seq, pgno, page.to_vec()));
                    }
                    w.finish().unwrap();
                }
                let plain: u64 = headers.iter().map(Header::record_len).sum();
                let mut bytes = Vec::new();
                let offsets: Vec<u64> = match pack(&headers, &pages, plain - plain / 8, &mut bytes) {
                    Some(len) => {
                        bytes.truncate(len);
                        packed_runs.set(packed_runs.get() + 1);
                        vec![0]
                    }
                    None => {
                        unpacked(&headers, &pages, &mut bytes).unwrap();
                        unpacked_runs.set(unpacked_runs.get() + 1);
                        headers.iter().scan(0, |at, h| Some(std::mem::replace(at, *at + h.record_len()))).collect()
                    }
                };
                let (_keep, file) = file_of(&bytes);
                let len = bytes.len() as u64;
                let first = 20 + from.min(headers.len() - 1) as u64;
                let last = (first + span as u64).min(20 + headers.len() as u64 - 1);
                let mut bufs = ApplyBuffers::default();
                let (mut applied, mut last_applied) = (Vec::new(), None);
                for offset in offsets {
                    let outer = verify_at(&file, offset, len).unwrap().unwrap();
                    if outer.seq < first || outer.first_seq() > last {
                        continue;
                    }
                    let range = first.max(outer.first_seq())..=last.min(outer.seq);
                    let end = *range.end();
                    let got = apply_at(&file, offset, len, &mut bufs, range, |pgno, data| {
                        applied.push((pgno, data.to_vec()));
                        Ok(())
                    })
                    .unwrap();
                    prop_assert_eq!(got, headers[(end - 20) as usize]);
                    last_applied = Some(got.seq);
                }
                let expected: Vec<(u32, Vec<u8>)> = contents
                    .into_iter()
                    .filter(|(seq, _, _)| (first..=last).contains(seq))
                    .map(|(_, pgno, page)| (pgno, page))
                    .collect();
                prop_assert_eq!(applied, expected);
                prop_assert_eq!(last_applied, Some(last));
                Ok(())
            })
            .unwrap();
        assert!(
            packed_runs.get() > 0 && unpacked_runs.get() > 0,
            "{} packed, {} not",
            packed_runs.get(),
            unpacked_runs.get()
        );
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
