//! Snapshots: whole database images at a history position, each checked by a CRC when used.
//!
//! `<seq>.snap` (16 hex digits): a 48-byte header, then the image (`db_pages` pages). Header,
//! little-endian: `KURASNAP`, u32 version (1), u32 page size, u64 seq, i64 time (Unix ms),
//! u32 database pages, u32 CRC-32 of the image, u32 CRC-32 of the header's first 40 bytes, and
//! 4 zero bytes. Written to `.tmp`, synced, then renamed into place.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::io_error;
use super::record::ReadError;
use super::segment::sync_dir;
use crate::error::{Error, Result};

const MAGIC: &[u8; 8] = b"KURASNAP";
const HEADER_LEN: u64 = 48;
const CHUNK: usize = 1 << 20;

/// A snapshot file's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SnapshotHeader {
    pub seq: u64,
    pub time_ms: i64,
    pub page_size: u32,
    pub db_pages: u32,
    pub image_crc: u32,
}

impl SnapshotHeader {
    fn encode(&self) -> [u8; HEADER_LEN as usize] {
        let mut b = [0u8; HEADER_LEN as usize];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        b[12..16].copy_from_slice(&self.page_size.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.time_ms.to_le_bytes());
        b[32..36].copy_from_slice(&self.db_pages.to_le_bytes());
        b[36..40].copy_from_slice(&self.image_crc.to_le_bytes());
        let crc = crc32fast::hash(&b[..40]);
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8; HEADER_LEN as usize]) -> Option<SnapshotHeader> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if &b[0..8] != MAGIC || u32_at(8) != 1 || crc32fast::hash(&b[..40]) != u32_at(40) {
            return None;
        }
        Some(SnapshotHeader {
            page_size: u32_at(12),
            seq: u64_at(16),
            time_ms: u64_at(24) as i64,
            db_pages: u32_at(32),
            image_crc: u32_at(36),
        })
    }
}

/// The path of the snapshot at `seq`.
pub(crate) fn path_for(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.snap"))
}

/// The seq a snapshot file name stands for.
pub(crate) fn seq_of(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?.strip_suffix(".snap")?;
    (name.len() == 16).then(|| u64::from_str_radix(name, 16).ok()).flatten()
}

/// A snapshot being written: the image is streamed in, page by page, then sealed with its
/// header and renamed into place.
pub(crate) struct SnapshotWriter {
    path: PathBuf,
    tmp: PathBuf,
    out: BufWriter<File>,
    crc: crc32fast::Hasher,
    written: u64,
}

impl SnapshotWriter {
    pub(crate) fn create(dir: &Path, seq: u64) -> io::Result<SnapshotWriter> {
        let path = path_for(dir, seq);
        let tmp = path.with_extension("snap.tmp");
        let mut out =
            BufWriter::with_capacity(CHUNK, OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?);
        out.write_all(&[0u8; HEADER_LEN as usize])?;
        Ok(SnapshotWriter { path, tmp, out, crc: crc32fast::Hasher::new(), written: 0 })
    }

    /// Appends the next bytes of the image.
    pub(crate) fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.crc.update(bytes);
        self.written += bytes.len() as u64;
        self.out.write_all(bytes)
    }

    /// Gives the snapshot up: its partial image goes.
    pub(crate) fn abandon(self) {
        drop(self.out);
        let _ = std::fs::remove_file(&self.tmp);
    }

    /// Checks the image is whole, writes the header, and makes the snapshot durable.
    pub(crate) fn finish(self, seq: u64, time_ms: i64, page_size: u32, db_pages: u32) -> io::Result<PathBuf> {
        if self.written != db_pages as u64 * page_size as u64 {
            let _ = std::fs::remove_file(&self.tmp);
            return Err(io::Error::other(format!(
                "the snapshot image has {} bytes, not {db_pages} pages of {page_size}",
                self.written
            )));
        }
        let header = SnapshotHeader { seq, time_ms, page_size, db_pages, image_crc: self.crc.finalize() };
        let out = self.out.into_inner().map_err(|e| e.into_error())?;
        out.write_all_at(&header.encode(), 0)?;
        out.sync_all()?;
        drop(out);
        std::fs::rename(&self.tmp, &self.path)?;
        sync_dir(self.path.parent().unwrap_or(Path::new(".")))?;
        Ok(self.path)
    }
}

/// Writes a snapshot of the first `db_pages` pages of `image`, a file only kura has open (a
/// restored image; never the live database, whose locks closing a second descriptor would drop).
/// The bytes are copied by the kernel; only the checksum reads them here.
pub(crate) fn write_from_file(
    dir: &Path,
    image: &File,
    seq: u64,
    time_ms: i64,
    page_size: u32,
    db_pages: u32,
) -> io::Result<PathBuf> {
    let total = db_pages as u64 * page_size as u64;
    let image_crc = crc_of(image, 0, total)?;
    let path = path_for(dir, seq);
    let tmp = path.with_extension("snap.tmp");
    let out = OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?;
    out.write_all_at(&SnapshotHeader { seq, time_ms, page_size, db_pages, image_crc }.encode(), 0)?;
    copy_range(image, 0, &out, HEADER_LEN, total)?;
    out.sync_all()?;
    drop(out);
    std::fs::rename(&tmp, &path)?;
    sync_dir(dir)?;
    Ok(path)
}

/// The CRC-32 of `len` bytes of `file` from `at`.
fn crc_of(file: &File, mut at: u64, len: u64) -> io::Result<u32> {
    let mut crc = crc32fast::Hasher::new();
    let mut buf = vec![0u8; CHUNK];
    let end = at + len;
    while at < end {
        let n = CHUNK.min((end - at) as usize);
        file.read_exact_at(&mut buf[..n], at)?;
        crc.update(&buf[..n]);
        at += n as u64;
    }
    Ok(crc.finalize())
}

/// Copies `len` bytes of `from` (at `from_at`) into `to` (at `to_at`) inside the kernel where it
/// can (`copy_file_range`), through a buffer where it cannot.
fn copy_range(from: &File, mut from_at: u64, to: &File, mut to_at: u64, len: u64) -> io::Result<()> {
    let end = from_at + len;
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        while from_at < end {
            let (mut src, mut dst) = (from_at as libc::loff_t, to_at as libc::loff_t);
            let want = (end - from_at).min(1 << 30) as usize;
            // SAFETY: valid descriptors and offsets owned by this frame; no flags.
            let n = unsafe { libc::copy_file_range(from.as_raw_fd(), &mut src, to.as_raw_fd(), &mut dst, want, 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    // Not supported between these files: copy the rest by hand.
                    Some(libc::ENOSYS | libc::EXDEV | libc::EINVAL | libc::EOPNOTSUPP) => break,
                    _ if e.kind() == io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the image is shorter than its size"));
            }
            from_at += n as u64;
            to_at += n as u64;
        }
    }
    let mut buf = vec![0u8; CHUNK];
    while from_at < end {
        let n = CHUNK.min((end - from_at) as usize);
        from.read_exact_at(&mut buf[..n], from_at)?;
        to.write_all_at(&buf[..n], to_at)?;
        from_at += n as u64;
        to_at += n as u64;
    }
    Ok(())
}

/// A snapshot's header, checked.
pub(crate) fn read_header(path: &Path) -> Result<SnapshotHeader, ReadError> {
    let file = File::open(path)?;
    header_of(&file, path)
}

fn header_of(file: &File, path: &Path) -> Result<SnapshotHeader, ReadError> {
    let mut b = [0u8; HEADER_LEN as usize];
    match file.read_exact_at(&mut b, 0) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(ReadError::Truncated),
        Err(e) => return Err(ReadError::Io(e)),
    }
    let header = SnapshotHeader::decode(&b)
        .ok_or_else(|| ReadError::Corrupt(format!("{} has no valid snapshot header", path.display())))?;
    if file.metadata()?.len() < HEADER_LEN + header.db_pages as u64 * header.page_size as u64 {
        return Err(ReadError::Corrupt(format!("{} is shorter than its header says", path.display())));
    }
    Ok(header)
}

/// Checks a snapshot's header and image against their CRCs.
pub(crate) fn verify(path: &Path) -> Result<SnapshotHeader, ReadError> {
    let file = File::open(path)?;
    let header = header_of(&file, path)?;
    if crc_of(&file, HEADER_LEN, header.db_pages as u64 * header.page_size as u64)? != header.image_crc {
        return Err(ReadError::Corrupt(format!("snapshot {} fails its checksum", path.display())));
    }
    Ok(header)
}

/// Checks a snapshot's image against its CRC, then copies it into `out` from offset 0.
pub(crate) fn copy_image(path: &Path, out: &File) -> Result<SnapshotHeader, ReadError> {
    let header = verify(path)?;
    let file = File::open(path)?;
    let total = header.db_pages as u64 * header.page_size as u64;
    // Snapshots are never written after they are renamed into place: what was checked is what
    // is copied.
    copy_range(&file, HEADER_LEN, out, 0, total)?;
    Ok(header)
}

/// Streams every page of the database, in order, into a snapshot; answers how many.
pub(super) fn copy_pages(conn: &rusqlite::Connection, writer: &mut SnapshotWriter, page_size: u32) -> Result<u32> {
    let _ = page_size;
    let mut count = 0;
    let mut pages = conn.prepare("SELECT data FROM sqlite_dbpage('main')").map_err(Error::internal)?;
    let mut rows = pages.query([]).map_err(Error::internal)?;
    while let Some(row) = rows.next().map_err(Error::internal)? {
        count += 1;
        let data = row.get_ref(0).and_then(|v| Ok(v.as_blob()?)).map_err(Error::internal)?;
        writer.write(data).map_err(io_error("writing a snapshot"))?;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_checks_and_copies_an_image() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("db");
        std::fs::write(&source, [7u8; 4096 * 3]).unwrap();
        let path = write_from_file(dir.path(), &File::open(&source).unwrap(), 5, 1234, 4096, 2).unwrap();
        assert_eq!(seq_of(&path), Some(5));
        let header = read_header(&path).unwrap();
        assert_eq!((header.seq, header.time_ms, header.db_pages), (5, 1234, 2));
        let out_path = dir.path().join("out");
        let out = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&out_path).unwrap();
        copy_image(&path, &out).unwrap();
        assert_eq!(std::fs::read(&out_path).unwrap(), vec![7u8; 4096 * 2]);

        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert!(matches!(copy_image(&path, &out), Err(ReadError::Corrupt(_))));
    }
}
