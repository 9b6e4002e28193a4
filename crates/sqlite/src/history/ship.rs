//! Shipping the history log elsewhere as it grows (to shared storage, for scale-out): what a
//! [`LogShipper`] is shown after every commit, restore and checkpoint, before any of them is
//! acknowledged. The log's files only ever grow or appear (a segment grows, then is sealed
//! under another name; a snapshot appears whole), so a shipper that remembers how much of
//! each it has sent ships only the difference.

use std::fmt;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use super::segment::open_name;
use super::{History, io_error};
use crate::error::{Error, Result};

/// The log as it stands, for a shipper: every snapshot and every segment with its length, all
/// of it readable (appended records are flushed to the file first, though not synced: the WAL
/// holds them durably already).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogView {
    /// Snapshots by position, oldest first, with their files.
    pub snapshots: Vec<(u64, PathBuf)>,
    /// Segments, oldest first: sealed ones and the open one last.
    pub segments: Vec<SegmentView>,
}

/// One segment of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentView {
    /// The position of its first record: what names it wherever it is shipped.
    pub first_seq: u64,
    /// Its file now (an open segment's file is renamed when it is sealed).
    pub path: PathBuf,
    /// Bytes in it, whole records only.
    pub len: u64,
}

/// Why shipping failed; the commit it was for is not acknowledged.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ShipError {
    message: String,
    superseded: bool,
}

impl ShipError {
    /// Shipping failed; the commit may still reach the store later (a timeout whose write
    /// landed, a retry when the database reopens).
    pub fn new(message: impl Into<String>) -> Self {
        ShipError { message: message.into(), superseded: false }
    }

    /// This shipper's ownership was replaced: nothing it ships from now on is ever accepted,
    /// so the commit definitely did not take effect.
    pub fn superseded(message: impl Into<String>) -> Self {
        ShipError { message: message.into(), superseded: true }
    }

    /// Whether the ownership was replaced (see [`ShipError::superseded`]).
    pub fn is_superseded(&self) -> bool {
        self.superseded
    }
}

/// Something that copies the log elsewhere, called on the database's own thread. Returning
/// `Ok` means what the view shows is safe elsewhere; an error fails the requests of the commit
/// and closes the database.
pub trait LogShipper: Send + Sync + fmt::Debug {
    /// Ships what `log` shows that this shipper has not shipped yet.
    fn ship(&self, log: &LogView) -> std::result::Result<(), ShipError>;
}

/// Ships `log` with `shipper`; an ownership replaced is [`Error::Superseded`].
pub(crate) fn ship_log(shipper: &dyn LogShipper, log: &LogView) -> Result<()> {
    shipper.ship(log).map_err(|e| match e.is_superseded() {
        true => Error::Superseded { message: e.to_string() },
        false => Error::Io { context: "shipping the history".into(), source: std::io::Error::other(e.to_string()) },
    })
}

/// The file name of the snapshot at `seq` inside a log directory.
pub fn snapshot_file_name(seq: u64) -> String {
    format!("{seq:016x}.snap")
}

/// The file name under which a segment starting at `first_seq` is rebuilt in a log directory
/// (as an open segment; opening the database seals all but the newest).
pub fn segment_file_name(first_seq: u64) -> String {
    open_name(first_seq)
}

impl History {
    /// The log as it stands now (every record appended is in its file).
    pub(crate) fn view(&mut self) -> Result<LogView> {
        let snapshots = self.snapshots.iter().map(|&seq| (seq, self.dir.join(snapshot_file_name(seq)))).collect();
        let mut segments = Vec::with_capacity(self.sealed.len() + 1);
        for sealed in &self.sealed {
            // Keyed as it was while open: by the position its header (and its open name) gives,
            // which can precede its first record's (a segment that began with a new base).
            let file = std::fs::File::open(&sealed.path).map_err(io_error("reading a sealed segment"))?;
            let len = file.metadata().map_err(io_error("reading a sealed segment"))?.len();
            let mut header = [0u8; 8];
            file.read_exact_at(&mut header, 8).map_err(io_error("reading a sealed segment"))?;
            segments.push(SegmentView { first_seq: u64::from_le_bytes(header), path: sealed.path.clone(), len });
        }
        segments.push(SegmentView {
            first_seq: self.open.first_seq(),
            path: self.open.path.clone(),
            len: self.open.len,
        });
        Ok(LogView { snapshots, segments })
    }
}
