//! Prepared statements over SQLite's C API: the one place that prepares, binds and steps user SQL.
//!
//! rusqlite owns the connection (pragmas, hooks, the authorizer); this module uses its raw handle
//! for what rusqlite does not expose: the unparsed tail after each statement (so multi-statement
//! text is split by SQLite's own parser), error offsets, and per-loop scan counters.

use std::ffi::{CStr, c_int};
use std::ptr::{self, NonNull};

use libsqlite3_sys as ffi;

use crate::error::{Error, Result};
use crate::request::Value;

/// SQL text with the NUL terminator SQLite wants, so `prepare` never copies it and applies
/// `SQLITE_LIMIT_SQL_LENGTH` to each statement rather than to the whole text.
pub(crate) struct SqlText {
    bytes: Vec<u8>,
}

impl SqlText {
    pub(crate) fn new(sql: &str) -> Result<Self> {
        if sql.as_bytes().contains(&0) {
            return Err(Error::sql(ffi::SQLITE_ERROR, "SQL text must not contain NUL characters"));
        }
        let mut bytes = Vec::with_capacity(sql.len() + 1);
        bytes.extend_from_slice(sql.as_bytes());
        bytes.push(0);
        Ok(SqlText { bytes })
    }

    /// The text from `start` on, without the terminator.
    pub(crate) fn from(&self, start: usize) -> &str {
        let end = self.bytes.len() - 1;
        std::str::from_utf8(&self.bytes[start.min(end)..end]).unwrap_or("")
    }

    /// The first offset at or after `start` that is not ASCII whitespace.
    fn skip_whitespace(&self, mut start: usize) -> usize {
        while start < self.bytes.len() - 1 && self.bytes[start].is_ascii_whitespace() {
            start += 1;
        }
        start
    }
}

/// An owned `sqlite3_stmt`, finalized on drop.
pub(crate) struct RawStatement {
    ptr: NonNull<ffi::sqlite3_stmt>,
    db: *mut ffi::sqlite3,
}

/// A statement prepared from some text, and where the next one starts.
pub(crate) struct Prepared {
    /// `None` when only whitespace and comments were left.
    pub statement: Option<RawStatement>,
    /// Offset of the statement's first byte in the text.
    pub start: usize,
    /// Offset just past the statement (the tail).
    pub next: usize,
}

impl RawStatement {
    /// Prepares the first statement of `text` at or after `start`.
    ///
    /// # Safety
    /// `db` must be a valid, open connection used only by the calling thread.
    pub(crate) unsafe fn prepare(db: *mut ffi::sqlite3, text: &SqlText, start: usize) -> Result<Prepared> {
        let start = text.skip_whitespace(start);
        let remaining = &text.bytes[start..];
        let mut stmt = ptr::null_mut();
        let mut tail = ptr::null();
        let rc = unsafe {
            ffi::sqlite3_prepare_v3(db, remaining.as_ptr().cast(), remaining.len() as c_int, 0, &mut stmt, &mut tail)
        };
        if rc != ffi::SQLITE_OK {
            return Err(unsafe { Error::from_connection(db, rc, true) });
        }
        let consumed =
            if tail.is_null() { remaining.len() - 1 } else { (tail as usize) - (remaining.as_ptr() as usize) };
        Ok(Prepared {
            statement: NonNull::new(stmt).map(|ptr| RawStatement { ptr, db }),
            start,
            next: start + consumed,
        })
    }

    fn raw(&self) -> *mut ffi::sqlite3_stmt {
        self.ptr.as_ptr()
    }

    /// Number of the highest parameter (`?NNN` counts up to NNN).
    pub(crate) fn parameter_count(&self) -> usize {
        unsafe { ffi::sqlite3_bind_parameter_count(self.raw()) as usize }
    }

    /// Whether SQLite knows the statement cannot write.
    pub(crate) fn is_readonly(&self) -> bool {
        unsafe { ffi::sqlite3_stmt_readonly(self.raw()) != 0 }
    }

    /// Binds `values` to parameters 1..=n; values are copied, so they need not outlive the
    /// statement.
    pub(crate) fn bind_all(&mut self, values: &[Value]) -> Result<()> {
        for (i, value) in values.iter().enumerate() {
            let index = (i + 1) as c_int;
            let rc = unsafe {
                match value {
                    Value::Null => ffi::sqlite3_bind_null(self.raw(), index),
                    Value::Integer(n) => ffi::sqlite3_bind_int64(self.raw(), index, *n),
                    Value::Real(x) => ffi::sqlite3_bind_double(self.raw(), index, *x),
                    Value::Text(s) => ffi::sqlite3_bind_text64(
                        self.raw(),
                        index,
                        s.as_ptr().cast(),
                        s.len() as u64,
                        ffi::SQLITE_TRANSIENT(),
                        ffi::SQLITE_UTF8 as u8,
                    ),
                    Value::Blob(b) => ffi::sqlite3_bind_blob64(
                        self.raw(),
                        index,
                        b.as_ptr().cast(),
                        b.len() as u64,
                        ffi::SQLITE_TRANSIENT(),
                    ),
                }
            };
            if rc != ffi::SQLITE_OK {
                return Err(unsafe { Error::from_connection(self.db, rc, false) });
            }
        }
        Ok(())
    }

    /// Makes the statement ready to run again, with no parameters bound and its counters at 0.
    pub(crate) fn reset(&mut self) {
        // Both return the last step's error, already reported.
        unsafe {
            ffi::sqlite3_reset(self.raw());
            ffi::sqlite3_clear_bindings(self.raw());
        }
        self.reset_counters();
    }

    /// Zeroes the per-loop visit counters, which `sqlite3_reset` keeps.
    fn reset_counters(&mut self) {
        unsafe extern "C" {
            fn sqlite3_stmt_scanstatus_reset(stmt: *mut ffi::sqlite3_stmt);
        }
        unsafe { sqlite3_stmt_scanstatus_reset(self.raw()) };
    }

    /// Advances to the next row: `Ok(true)` on a row, `Ok(false)` when done.
    pub(crate) fn step(&mut self) -> Result<bool> {
        match unsafe { ffi::sqlite3_step(self.raw()) } {
            ffi::SQLITE_ROW => Ok(true),
            ffi::SQLITE_DONE => Ok(false),
            rc => Err(unsafe { Error::from_connection(self.db, rc, false) }),
        }
    }

    pub(crate) fn column_count(&self) -> usize {
        unsafe { ffi::sqlite3_column_count(self.raw()) as usize }
    }

    pub(crate) fn column_names(&self) -> Vec<String> {
        (0..self.column_count())
            .map(|i| {
                let name = unsafe { ffi::sqlite3_column_name(self.raw(), i as c_int) };
                if name.is_null() {
                    String::new()
                } else {
                    unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
                }
            })
            .collect()
    }

    /// The current row's value in column `i`.
    pub(crate) fn column_value(&self, i: usize) -> Value {
        let i = i as c_int;
        unsafe {
            match ffi::sqlite3_column_type(self.raw(), i) {
                ffi::SQLITE_INTEGER => Value::Integer(ffi::sqlite3_column_int64(self.raw(), i)),
                ffi::SQLITE_FLOAT => Value::Real(ffi::sqlite3_column_double(self.raw(), i)),
                ffi::SQLITE_TEXT => {
                    let p = ffi::sqlite3_column_text(self.raw(), i);
                    let n = ffi::sqlite3_column_bytes(self.raw(), i) as usize;
                    if p.is_null() {
                        Value::Text(String::new())
                    } else {
                        let bytes = std::slice::from_raw_parts(p, n);
                        Value::Text(String::from_utf8_lossy(bytes).into_owned())
                    }
                }
                ffi::SQLITE_BLOB => {
                    let p = ffi::sqlite3_column_blob(self.raw(), i);
                    let n = ffi::sqlite3_column_bytes(self.raw(), i) as usize;
                    if p.is_null() || n == 0 {
                        Value::Blob(Vec::new())
                    } else {
                        Value::Blob(std::slice::from_raw_parts(p.cast::<u8>(), n).to_vec())
                    }
                }
                _ => Value::Null,
            }
        }
    }

    /// The current row's bytes in column `i`, without copying them.
    pub(crate) fn column_bytes(&self, i: usize) -> &[u8] {
        unsafe {
            let p = ffi::sqlite3_column_blob(self.raw(), i as c_int);
            let n = ffi::sqlite3_column_bytes(self.raw(), i as c_int) as usize;
            if p.is_null() || n == 0 { &[] } else { std::slice::from_raw_parts(p.cast::<u8>(), n) }
        }
    }

    /// The current row.
    pub(crate) fn row(&self, columns: usize) -> Vec<Value> {
        (0..columns).map(|i| self.column_value(i)).collect()
    }

    /// Rows the statement's loops visited so far: the sum of SQLite's per-loop visit counters.
    pub(crate) fn rows_visited(&self) -> u64 {
        unsafe extern "C" {
            fn sqlite3_stmt_scanstatus_v2(
                stmt: *mut ffi::sqlite3_stmt,
                idx: c_int,
                op: c_int,
                flags: c_int,
                out: *mut std::ffi::c_void,
            ) -> c_int;
        }
        const SQLITE_SCANSTAT_NVISIT: c_int = 1;
        let mut total = 0u64;
        for idx in 0.. {
            let mut visits: i64 = 0;
            let rc = unsafe {
                sqlite3_stmt_scanstatus_v2(self.raw(), idx, SQLITE_SCANSTAT_NVISIT, 0, (&mut visits as *mut i64).cast())
            };
            if rc != 0 {
                break;
            }
            total += visits.max(0) as u64;
        }
        total
    }
}

impl Drop for RawStatement {
    fn drop(&mut self) {
        // The return value repeats the last step's error, already reported.
        unsafe { ffi::sqlite3_finalize(self.raw()) };
    }
}
