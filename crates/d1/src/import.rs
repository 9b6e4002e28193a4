//! Import: SQL text run against a database in one transaction, read as a stream so its size is
//! not bounded by memory. All of it applies, or none of it.

use std::io::BufRead;

use kura_sqlite::{Database, Meta, Request, Statement};

/// Statements longer than this are refused even in an import (a dump writes one INSERT per
/// row; a 2 MB BLOB is a 4 MB hex literal).
const MAX_IMPORT_STATEMENT_BYTES: usize = 10_000_000;

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImportOutcome {
    /// Statements run.
    pub num_queries: u64,
    /// Counters summed over every statement; `size_after` is the size at the end.
    pub meta: Meta,
}

/// Why an import failed; nothing of it was applied.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A statement failed (the message reads like D1's).
    #[error("{0}")]
    Sql(#[from] kura_sqlite::Error),
    /// The input could not be read, or is not UTF-8.
    #[error("reading the SQL: {0}")]
    Read(#[from] std::io::Error),
}

/// Whether `sql` ends with a whole statement, as SQLite's tokenizer sees it.
fn is_complete(sql: &str) -> bool {
    let Ok(text) = std::ffi::CString::new(sql) else { return false };
    unsafe { rusqlite::ffi::sqlite3_complete(text.as_ptr()) != 0 }
}

/// Runs every statement of `input` in one transaction on `db`.
pub fn import(db: &mut Database, input: &mut dyn BufRead) -> Result<ImportOutcome, ImportError> {
    let previous_limit = db.set_max_statement_bytes(MAX_IMPORT_STATEMENT_BYTES as i32);
    db.begin()?;
    let outcome = run_all(db, input);
    let outcome = match outcome {
        Ok(outcome) => db.commit().map(|()| outcome).map_err(ImportError::from),
        Err(e) => {
            db.rollback();
            Err(e)
        }
    };
    db.set_max_statement_bytes(previous_limit);
    // Whatever PRAGMAs the file set (a dump starts with `defer_foreign_keys`) end with it.
    db.reset_connection_pragmas();
    outcome
}

fn run_all(db: &mut Database, input: &mut dyn BufRead) -> Result<ImportOutcome, ImportError> {
    let mut outcome = ImportOutcome::default();
    let mut pending = String::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        // Never more than the statement may still grow by: one endless line is refused, not held.
        let room = (MAX_IMPORT_STATEMENT_BYTES - pending.len()) as u64 + 1;
        let n = std::io::Read::take(&mut *input, room).read_until(b'\n', &mut line)?;
        if n > 0 {
            if pending.len() + line.len() > MAX_IMPORT_STATEMENT_BYTES {
                return Err(kura_sqlite::Error::Sql {
                    message: format!("statement too long (over {MAX_IMPORT_STATEMENT_BYTES} bytes)"),
                    code: rusqlite::ffi::SQLITE_TOOBIG,
                    extended: rusqlite::ffi::SQLITE_TOOBIG,
                }
                .into());
            }
            let text = std::str::from_utf8(&line).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("the SQL is not UTF-8: {e}"))
            })?;
            pending.push_str(text);
            // A statement ends with a `;`: only then is the tokenizer asked, so a statement of
            // many lines is scanned once per `;`, not once per line.
            if !text.contains(';') || !is_complete(&pending) {
                continue;
            }
        }
        if !pending.trim().is_empty() {
            match db.execute(&Request::new(vec![Statement::new(std::mem::take(&mut pending))])) {
                Ok(results) => {
                    for r in results {
                        outcome.num_queries += 1;
                        outcome.meta.rows_read += r.meta.rows_read;
                        outcome.meta.rows_written += r.meta.rows_written;
                        outcome.meta.changes += r.meta.changes;
                        outcome.meta.duration_ms += r.meta.duration_ms;
                        outcome.meta.changed_db |= r.meta.changed_db;
                        outcome.meta.last_row_id = r.meta.last_row_id;
                        outcome.meta.size_after = r.meta.size_after;
                    }
                }
                // Only comments and whitespace since the last statement.
                Err(kura_sqlite::Error::NoStatements) => {}
                Err(e) => return Err(e.into()),
            }
            pending.clear();
        }
        if n == 0 {
            return Ok(outcome);
        }
    }
}
