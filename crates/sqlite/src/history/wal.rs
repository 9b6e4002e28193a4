//! Reading committed transactions out of SQLite's write-ahead log (the `-wal` file).
//!
//! Layout (big-endian): a 32-byte header (magic, version, page size, checkpoint sequence,
//! salt-1, salt-2, two checksums), then frames of a 24-byte header (page number, database size
//! in pages if this frame commits a transaction else 0, salt-1, salt-2, two checksums) and one
//! page. SQLite itself validates the frames when it opens or writes the log; kura reads only
//! frames SQLite reports as valid (`mxFrame`), and only up to their last commit frame.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

const WAL_HEADER_LEN: u64 = 32;
const FRAME_HEADER_LEN: u64 = 24;

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

fn frame_offset(header: &WalHeader, frame: u32) -> u64 {
    WAL_HEADER_LEN + (frame as u64 - 1) * (FRAME_HEADER_LEN + header.page_size as u64)
}

/// The transactions committed in frames `after + 1 ..= upto`. Frames past the last commit
/// frame in that range belong to no finished transaction and are left out.
pub(crate) fn transactions(file: &File, header: &WalHeader, after: u32, upto: u32) -> io::Result<Vec<WalTransaction>> {
    let mut done = Vec::new();
    let mut pending: HashMap<u32, u32> = HashMap::new();
    let mut frame_header = [0u8; FRAME_HEADER_LEN as usize];
    for frame in after + 1..=upto {
        file.read_exact_at(&mut frame_header, frame_offset(header, frame))?;
        let salt = (be32(&frame_header[8..12]) as u64) << 32 | be32(&frame_header[12..16]) as u64;
        if salt != header.salt {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("WAL frame {frame} belongs to another incarnation of the log"),
            ));
        }
        pending.insert(be32(&frame_header[0..4]), frame);
        let db_pages = be32(&frame_header[4..8]);
        if db_pages != 0 {
            let mut pages: Vec<(u32, u32)> = pending.drain().filter(|(pgno, _)| *pgno <= db_pages).collect();
            pages.sort_unstable();
            done.push(WalTransaction { pages, db_pages, last_frame: frame });
        }
    }
    Ok(done)
}

/// Reads the page image of `frame` into `page` (which must be one page long).
pub(crate) fn read_page(file: &File, header: &WalHeader, frame: u32, page: &mut [u8]) -> io::Result<()> {
    file.read_exact_at(page, frame_offset(header, frame) + FRAME_HEADER_LEN)
}
