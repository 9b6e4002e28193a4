//! The lock that keeps other processes off a database file an actor owns, in place of SQLite's
//! own file locks.
//!
//! The read-write connection uses SQLite's `unix-none` VFS, which takes no file locks. With the
//! default VFS, opening a file walks a process-wide list of every file SQLite has open (to find
//! a descriptor to reuse) under a process-wide mutex, so each open costs in proportion to the
//! databases already open: with 1,000 Durable Objects open, 63 µs of a first request's
//! 1.05 ms, a tenth of it (docs/performance.md, "An evicted Durable Object's first request"). The actor is the file's only user in this process;
//! across processes, this lock covers the bytes SQLite's exclusive lock covers (PENDING,
//! RESERVED and SHARED), so another SQLite connection (the `sqlite3` shell, or kura's own
//! read-only ones) is refused as it was while the connection held SQLite's exclusive lock.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

/// SQLite's PENDING byte, at 1 GiB; RESERVED and the 510 SHARED bytes follow it.
const LOCK_START: libc::off_t = 0x4000_0000;
const LOCK_LEN: libc::off_t = 512;

/// A write lock on a database file's SQLite lock bytes, held while this lives.
#[derive(Debug)]
pub(crate) struct FileLock {
    _file: File,
}

impl FileLock {
    /// [`FileLock::acquire`], trying again for up to `timeout` while the file is held (another
    /// process's SQLite holds its locks only for a transaction).
    pub(crate) fn acquire_within(path: &Path, timeout: Duration) -> io::Result<Option<FileLock>> {
        let deadline = Instant::now() + timeout;
        loop {
            match FileLock::acquire(path)? {
                Some(lock) => return Ok(Some(lock)),
                None if Instant::now() >= deadline => return Ok(None),
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Locks the file at `path` (which must exist); `Ok(None)` if another process (or another
    /// open of the file here) holds a lock on those bytes.
    pub(crate) fn acquire(path: &Path) -> io::Result<Option<FileLock>> {
        let file = File::options().read(true).write(true).open(path)?;
        // SAFETY: an all-zero flock is valid; the fields that matter are set below.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_WRLCK as libc::c_short;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        lock.l_start = LOCK_START;
        lock.l_len = LOCK_LEN;
        // SAFETY: a valid descriptor and an initialised flock.
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), SET_LOCK, &lock) };
        if rc == 0 {
            return Ok(Some(FileLock { _file: file }));
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(None),
            _ => Err(error),
        }
    }
}

/// An open file description's lock: closing some other descriptor of the file (SQLite's own)
/// does not release it, as it would a process's POSIX lock.
#[cfg(target_os = "linux")]
const SET_LOCK: libc::c_int = libc::F_OFD_SETLK;
/// Elsewhere a process's POSIX lock, a weaker guard: it keeps other processes off, but not a
/// second open in this one (the registry's one actor per file does), and closing any
/// descriptor of the file releases it (SQLite closes its own only as the connection closes).
#[cfg(not(target_os = "linux"))]
const SET_LOCK: libc::c_int = libc::F_SETLK;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn a_second_lock_on_the_same_file_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        std::fs::write(&path, b"").unwrap();
        let first = FileLock::acquire(&path).unwrap().expect("the first lock");
        assert!(FileLock::acquire(&path).unwrap().is_none(), "a second lock was granted");
        drop(first);
        assert!(FileLock::acquire(&path).unwrap().is_some(), "the lock was not released");
    }
}
