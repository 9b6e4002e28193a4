//! Reading committed transactions out of SQLite's write-ahead log (the `-wal` file).
//!
//! Layout (big-endian): a 32-byte header (magic, version, page size, checkpoint sequence,
//! salt-1, salt-2, two checksums), then frames of a 24-byte header (page number, database size
//! in pages if this frame commits a transaction else 0, salt-1, salt-2, two checksums) and one
//! page. SQLite itself validates the frames when it opens or writes the log; kura reads only
//! frames SQLite reports as valid (`mxFrame`), and only up to their last commit frame.

use super::io_error;
use crate::error::{Error, Result};
use std::cell::Cell;
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

const WAL_HEADER_LEN: u64 = 32;
pub(crate) const FRAME_HEADER_LEN: u64 = 24;

/// What identifies one incarnation of the log: SQLite changes the salts every time it
/// restarts the log from its beginning after a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WalHeader {
    pub page_size: u32,
    pub salt: u64,
}

/// One committed transaction in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WalTransaction {
    /// Each changed page once, with the frame holding its final image, by page number.
    pub pages: Vec<(u32, u32)>,
    /// Database size in pages after the commit.
    pub db_pages: u32,
    /// The commit frame.
    pub last_frame: u32,
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().expect("4 bytes"))
}

/// The log's header, or `None` if the file is missing or too short to have one.
pub(crate) fn read_header(file: &File) -> io::Result<Option<WalHeader>> {
    let mut b = [0u8; WAL_HEADER_LEN as usize];
    match file.read_exact_at(&mut b, 0) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let magic = be32(&b[0..4]);
    if magic != 0x377f_0682 && magic != 0x377f_0683 {
        return Ok(None);
    }
    let page_size = match be32(&b[8..12]) {
        1 => 65536,
        n => n,
    };
    Ok(Some(WalHeader { page_size, salt: (be32(&b[16..20]) as u64) << 32 | be32(&b[20..24]) as u64 }))
}

/// Where the log's frames end when it holds `frames` frames of `page_size` bytes.
pub(crate) fn end_of_frames(page_size: u32, frames: u32) -> u64 {
    WAL_HEADER_LEN + frames as u64 * (FRAME_HEADER_LEN + page_size as u64)
}

fn frame_offset(header: &WalHeader, frame: u32) -> u64 {
    end_of_frames(header.page_size, frame - 1)
}

/// Frames of the log, read for capturing. A small range (the usual: one commit's few pages) is
/// read with one system call, headers and pages together; a large one frame by frame.
pub(crate) struct Frames {
    header: WalHeader,
    first: u32,
    /// Frames `first..` as they are in the file, when the range was small enough to buffer:
    /// its first `buffered` bytes (the rest is left from an earlier read).
    buffer: Option<Vec<u8>>,
    buffered: usize,
    transactions: Vec<WalTransaction>,
}

/// Ranges up to this many bytes are read in one go.
pub(crate) const BUFFERED_BYTES: u64 = 1 << 20;

thread_local! {
    /// Where [`Frames::read`] reads a range: one per thread, reused, as the history's other
    /// buffers are. A fresh one per capture was zeroed before every read, and allocated past
    /// the allocator's mapping threshold: 4% of a one-client INSERT's instructions.
    static READ_BUFFER: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

impl Frames {
    /// Reads frames `after + 1 ..= upto` and groups them into committed transactions; frames
    /// past the last commit frame in that range belong to no finished transaction.
    pub(crate) fn read(file: &File, header: &WalHeader, after: u32, upto: u32) -> io::Result<Frames> {
        let stride = FRAME_HEADER_LEN + header.page_size as u64;
        let bytes = (upto - after) as u64 * stride;
        let buffer = if bytes <= BUFFERED_BYTES {
            let mut buf = READ_BUFFER.take();
            if buf.len() < bytes as usize {
                buf.reserve_exact(bytes as usize - buf.len());
                buf.resize(bytes as usize, 0);
            }
            let read = file.read_exact_at(&mut buf[..bytes as usize], frame_offset(header, after + 1));
            if let Err(e) = read {
                READ_BUFFER.set(buf);
                return Err(e);
            }
            Some(buf)
        } else {
            None
        };
        let buffered = if buffer.is_some() { bytes as usize } else { 0 };
        let mut frames = Frames { header: *header, first: after + 1, buffer, buffered, transactions: Vec::new() };
        let mut pending: HashMap<u32, u32> = HashMap::new();
        let mut head = [0u8; FRAME_HEADER_LEN as usize];
        for frame in after + 1..=upto {
            let head = match &frames.buffer {
                Some(buf) => {
                    let at = ((frame - frames.first) as u64 * stride) as usize;
                    &buf[..frames.buffered][at..at + FRAME_HEADER_LEN as usize]
                }
                None => {
                    file.read_exact_at(&mut head, frame_offset(header, frame))?;
                    &head[..]
                }
            };
            let salt = (be32(&head[8..12]) as u64) << 32 | be32(&head[12..16]) as u64;
            if salt != header.salt {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("WAL frame {frame} belongs to another incarnation of the log"),
                ));
            }
            pending.insert(be32(&head[0..4]), frame);
            let db_pages = be32(&head[4..8]);
            if db_pages != 0 {
                let mut pages: Vec<(u32, u32)> = pending.drain().filter(|(pgno, _)| *pgno <= db_pages).collect();
                pages.sort_unstable();
                frames.transactions.push(WalTransaction { pages, db_pages, last_frame: frame });
            }
        }
        Ok(frames)
    }

    /// The committed transactions, in order.
    pub(crate) fn transactions(&self) -> &[WalTransaction] {
        &self.transactions
    }

    /// The page image of `frame`, from the buffer or else read into `scratch`.
    pub(crate) fn page<'a>(&'a self, file: &File, frame: u32, scratch: &'a mut Vec<u8>) -> io::Result<&'a [u8]> {
        let page_size = self.header.page_size as usize;
        match &self.buffer {
            Some(buf) => {
                let stride = FRAME_HEADER_LEN as usize + page_size;
                let at = (frame - self.first) as usize * stride + FRAME_HEADER_LEN as usize;
                Ok(&buf[..self.buffered][at..at + page_size])
            }
            None => {
                scratch.resize(page_size, 0);
                file.read_exact_at(scratch, frame_offset(&self.header, frame) + FRAME_HEADER_LEN)?;
                Ok(scratch)
            }
        }
    }
}

impl Drop for Frames {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            READ_BUFFER.set(buffer);
        }
    }
}

/// The salt in the WAL's header; 0 when there is no WAL or it has no header yet.
pub(super) fn read_wal_salt(wal_path: &Path) -> Result<u64> {
    match File::open(wal_path) {
        Ok(file) => Ok(read_header(&file).map_err(io_error("reading the WAL"))?.map_or(0, |h| h.salt)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(io_error("opening the WAL")(e)),
    }
}

/// Runs a checkpoint in `mode` and returns (frames in the WAL, frames checkpointed).
pub(super) fn wal_counts(conn: &rusqlite::Connection, mode: i32) -> Result<(i32, i32)> {
    let (mut log, mut done) = (0, 0);
    let rc =
        unsafe { rusqlite::ffi::sqlite3_wal_checkpoint_v2(conn.handle(), std::ptr::null(), mode, &mut log, &mut done) };
    if rc != rusqlite::ffi::SQLITE_OK {
        return Err(unsafe { Error::from_connection(conn.handle(), rc, false) });
    }
    Ok((log, done))
}
