//! Markers: a small file naming a history position, written durably before a step a crash
//! must not leave half done (a restore's swap, a rebase past damage) and removed after it, so
//! the next open finishes or forgets the step.

use std::io;
use std::path::Path;

use super::io_error;
use super::segment::sync_dir;
use crate::error::Result;
use std::fs::File;

/// Names a restore's position from before its entry is written until the swapped database
/// file is durable.
pub(super) const RESTORE_MARKER: &str = "restore.pending";

/// Names the position a new base must take, from before damage is cut out of the log until
/// that base's entry is durable.
pub(super) const REBASE_MARKER: &str = "rebase.pending";

/// Writes a marker naming a position, durably.
pub(super) fn write_marker(dir: &Path, name: &str, seq: u64) -> io::Result<()> {
    let mut file = File::create(dir.join(name))?;
    io::Write::write_all(&mut file, format!("{seq:016x}\n").as_bytes())?;
    file.sync_all()?;
    sync_dir(dir)
}

/// A marker's position: `None` without the marker, `Some(None)` if a crash tore its writing
/// (which happens before anything it guards).
pub(super) fn read_marker(dir: &Path, name: &str) -> Result<Option<Option<u64>>> {
    match std::fs::read_to_string(dir.join(name)) {
        Ok(text) => Ok(Some(u64::from_str_radix(text.trim(), 16).ok())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error("reading a marker")(e)),
    }
}

/// Removes a marker, durably.
pub(super) fn remove_marker(dir: &Path, name: &str) -> io::Result<()> {
    std::fs::remove_file(dir.join(name))?;
    sync_dir(dir)
}
