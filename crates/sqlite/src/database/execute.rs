//! Running a request's statements: the statement cache, D1's per-statement meta (rows read and
//! written, size after, changes), limits and interrupts explained in D1's words.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use libsqlite3_sys as ffi;

use crate::error::{Error, PARAMETERS_ON_LAST_STATEMENT_ONLY, Result, TRANSACTION_MESSAGE, WRONG_PARAMETER_COUNT};
use crate::policy::StatementFacts;
use crate::raw::{RawStatement, SqlText};
use crate::request::{Access, Meta, Request, ResultMode, Statement, StatementResult, Value};

use super::Database;
use super::counters::schema_writes;

/// A prepared statement kept for reuse, with what the authorizer learned when it was prepared.
pub(super) struct CachedStatement {
    raw: RawStatement,
    facts: StatementFacts,
}

/// Distinct single-statement texts kept prepared per connection.
pub(super) const STATEMENT_CACHE_SIZE: usize = 128;

/// How often a write refused for a full history tries the history again.
pub(super) const HISTORY_RETRY: Duration = Duration::from_secs(1);

/// Rewords two preparation failures: a denied BEGIN/SAVEPOINT gets D1's explanation instead of
/// SQLite's bare "not authorized", and a statement over the length limit, which SQLite's
/// tokenizer reports as a generic "string or blob too big", says so.
pub(super) fn explain_prepare_error(error: Error, facts: &StatementFacts) -> Error {
    match error {
        Error::Sql { code: ffi::SQLITE_AUTH, .. } if facts.transaction => {
            Error::Sql { message: TRANSACTION_MESSAGE.to_owned(), code: ffi::SQLITE_AUTH, extended: ffi::SQLITE_AUTH }
        }
        Error::Sql { code: ffi::SQLITE_TOOBIG, .. } => Error::sql(ffi::SQLITE_TOOBIG, "statement too long"),
        other => other,
    }
}

/// An error of the checks kura makes itself, worded as the caller's API words it: D1 ends its
/// texts with a result code, workerd's `sql.exec()` ([`ResultMode::Cursor`]) does not.
pub(super) fn own_check(mode: ResultMode, code: i32, message: String) -> Error {
    match mode {
        ResultMode::Cursor => Error::Sql { message, code, extended: code },
        ResultMode::EveryStatement | ResultMode::LastStatement => Error::sql(code, &message),
    }
}

pub(super) fn wrong_parameter_count(mode: ResultMode, expected: usize, given: usize) -> Error {
    let message = match mode {
        ResultMode::Cursor => format!("{WRONG_PARAMETER_COUNT}."),
        _ => format!("{WRONG_PARAMETER_COUNT} (the statement takes {expected}, {given} given)"),
    };
    own_check(mode, ffi::SQLITE_RANGE, message)
}

/// As [`merge`], but the counters reported are the last statement's own (workerd's cursor);
/// whether anything was written still covers every statement.
pub(super) fn merge_keeping_counts(previous: Option<StatementResult>, mut last: StatementResult) -> StatementResult {
    if let Some(p) = previous {
        last.meta.duration_ms += p.meta.duration_ms;
        last.meta.changed_db |= p.meta.changed_db;
        last.meta.wrote |= p.meta.wrote;
    }
    last
}

/// Folds the statements of one multi-statement text into one result: rows of the last,
/// counters summed.
pub(super) fn merge(previous: Option<StatementResult>, mut last: StatementResult) -> StatementResult {
    if let Some(p) = previous {
        last.meta.changes += p.meta.changes;
        last.meta.rows_read += p.meta.rows_read;
        last.meta.rows_written += p.meta.rows_written;
        last.meta.duration_ms += p.meta.duration_ms;
        last.meta.changed_db |= p.meta.changed_db;
        last.meta.wrote |= p.meta.wrote;
    }
    last
}

impl Database {
    /// Runs every statement of a request on the connection as it stands (the caller owns the
    /// transaction). Returns one result per statement, as `request.mode` says.
    pub fn execute(&mut self, request: &Request) -> Result<Vec<StatementResult>> {
        self.execute_for(request, self.request_timeout)
    }

    /// [`Database::execute`], interrupted after `limit` (at most the request timeout).
    pub(super) fn execute_for(&mut self, request: &Request, limit: Duration) -> Result<Vec<StatementResult>> {
        let deadline = self.epoch.elapsed() + limit.min(self.request_timeout);
        self.deadline.store(deadline.as_nanos() as u64, Ordering::Relaxed);
        self.result_budget = self.max_result_bytes;
        let outcome = self.execute_statements(request);
        self.deadline.store(0, Ordering::Relaxed);
        outcome.map_err(|e| self.explain_history_full(self.explain_interrupt(e, deadline)))
    }

    /// While the history cannot grow, a write is refused as a full disk is (it changed
    /// nothing); one a second also marks the connection for reopening, which tries the history
    /// again, so writes resume without a restart once there is room.
    pub(super) fn explain_history_full(&mut self, error: Error) -> Error {
        match (error, self.capture.history_full_since) {
            (Error::Sql { code: ffi::SQLITE_READONLY, .. }, Some(since)) => {
                if since.elapsed() >= HISTORY_RETRY {
                    self.poisoned = true;
                }
                self.history_full()
            }
            (other, _) => other,
        }
    }

    /// Why the history is unavailable: no room for it, or none kept.
    pub(super) fn no_history(&self) -> Error {
        match self.capture.history_full_since {
            Some(_) => self.history_full(),
            None => Error::NoHistory,
        }
    }

    pub(super) fn history_full(&self) -> Error {
        Error::Io {
            context: "the Time Travel history cannot grow; the database is read-only until there is room".into(),
            source: std::io::Error::from_raw_os_error(28),
        }
    }

    pub(super) fn execute_statements(&mut self, request: &Request) -> Result<Vec<StatementResult>> {
        let mut results = Vec::with_capacity(request.statements.len());
        for statement in &request.statements {
            self.execute_text(statement, request, &mut results)?;
        }
        if results.is_empty() {
            return Err(Error::NoStatements);
        }
        Ok(results)
    }

    /// Runs each statement of one SQL text; its parameters bind to the last statement.
    pub(super) fn execute_text(
        &mut self,
        statement: &Statement,
        request: &Request,
        results: &mut Vec<StatementResult>,
    ) -> Result<()> {
        // Text seen before as exactly one statement runs its prepared statement again.
        if let Some((sql, mut cached)) = self.statements.remove_entry(&statement.sql) {
            let result = self.run_prepared(&mut cached.raw, &cached.facts, statement, request, &statement.sql);
            // Kept whether it succeeded or not: a failed run (a constraint, a read-only
            // caller's write) leaves the statement reusable once reset.
            cached.raw.reset();
            self.statements.insert(sql, cached);
            results.push(result?);
            return Ok(());
        }
        let text = SqlText::new(&statement.sql)?;
        let mut position = 0;
        let mut count = 0;
        let mut last: Option<CachedStatement> = None;
        let mut combined: Option<StatementResult> = None;
        loop {
            self.authorizer.reset_facts();
            let prepared = unsafe { RawStatement::prepare(self.handle(), &text, position) };
            let facts = self.authorizer.take_facts();
            let prepared = prepared.map_err(|e| explain_prepare_error(e, &facts))?;
            let Some(mut raw) = prepared.statement else {
                // workerd prepares whatever follows the last statement, and refuses a tail that
                // holds no statement (a comment) as it refuses an empty text.
                if request.mode == ResultMode::Cursor && count > 0 && !text.from(position).trim().is_empty() {
                    return Err(Error::NoStatements);
                }
                break;
            };
            position = prepared.next;
            count += 1;
            if last.as_ref().is_some_and(|l| l.raw.parameter_count() > 0) {
                return Err(own_check(request.mode, ffi::SQLITE_ERROR, PARAMETERS_ON_LAST_STATEMENT_ONLY.to_owned()));
            }
            let sql = text.from(prepared.start);
            let result = if raw.parameter_count() > 0 {
                self.run_prepared(&mut raw, &facts, statement, request, sql)?
            } else {
                self.run_prepared(&mut raw, &facts, &Statement::new(""), request, sql)?
            };
            last = Some(CachedStatement { raw, facts });
            match request.mode {
                ResultMode::EveryStatement => results.push(result),
                ResultMode::LastStatement => combined = Some(merge(combined.take(), result)),
                ResultMode::Cursor => combined = Some(merge_keeping_counts(combined.take(), result)),
            }
        }
        if !statement.params.is_empty() && last.as_ref().is_none_or(|l| l.raw.parameter_count() == 0) {
            return Err(wrong_parameter_count(request.mode, 0, statement.params.len()));
        }
        results.extend(combined);
        if let (1, Some(mut single)) = (count, last) {
            single.raw.reset();
            if self.statements.len() >= STATEMENT_CACHE_SIZE {
                self.statements.clear();
            }
            self.statements.insert(statement.sql.clone(), single);
        }
        Ok(())
    }

    /// Binds a prepared statement's parameters, checks access, and runs it.
    pub(super) fn run_prepared(
        &mut self,
        raw: &mut RawStatement,
        facts: &StatementFacts,
        statement: &Statement,
        request: &Request,
        sql: &str,
    ) -> Result<StatementResult> {
        if raw.parameter_count() != statement.params.len() {
            return Err(wrong_parameter_count(request.mode, raw.parameter_count(), statement.params.len()));
        }
        raw.bind_all(&statement.params)?;
        if (request.access == Access::ReadOnly || self.reads_only) && !raw.is_readonly() {
            return Err(Error::ReadOnly { sql: sql.trim().to_owned() });
        }
        let outcome = self.run(raw, facts);
        if outcome.is_err() {
            raw.reset();
        }
        outcome
    }

    /// Steps one prepared statement to the end and measures it.
    pub(super) fn run(&mut self, raw: &mut RawStatement, facts: &StatementFacts) -> Result<StatementResult> {
        let db = self.handle();
        let started = Instant::now();
        let total_before = unsafe { ffi::sqlite3_total_changes64(db) };
        let last_before = unsafe { ffi::sqlite3_last_insert_rowid(db) };
        let reports_size = self.options.reports_size;
        let size_before = match self.size {
            _ if !reports_size => 0,
            Some(size) => size,
            None => self.measure_size()?,
        };
        let reserved_before = if facts.alters_table { self.count_reserved_names()? } else { 0 };
        // `IF NOT EXISTS` on an object that exists creates nothing and writes no schema row.
        let schema_before = if facts.creates.is_some() { Some(self.schema_version()?) } else { None };
        let mut rows = Vec::new();
        // Named after the first step: a statement kept prepared across a schema change (an
        // ALTER TABLE here, or a record a read replica applied) is prepared again by that step.
        let mut columns = None;
        loop {
            let more = raw.step()?;
            let columns = columns.get_or_insert_with(|| raw.column_names());
            if !more {
                break;
            }
            let row = raw.row(columns.len());
            let bytes = row.iter().map(Value::footprint).sum::<usize>();
            self.result_budget = self.result_budget.checked_sub(bytes).ok_or_else(|| {
                Error::sql(
                    ffi::SQLITE_TOOBIG,
                    &format!(
                        "the results are larger than {} MB; select fewer rows or columns",
                        self.max_result_bytes / 1_000_000
                    ),
                )
            })?;
            rows.push(row);
        }
        let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
        if facts.alters_table && self.count_reserved_names()? > reserved_before {
            return Err(Error::sql(ffi::SQLITE_AUTH, "not authorized"));
        }
        let readonly = raw.is_readonly();
        let changes = unsafe { ffi::sqlite3_total_changes64(db) - total_before }.max(0) as u64;
        // sqlite3_changes() is sticky: only a DML statement's own count is meaningful here.
        let statement_changes =
            if readonly || facts.changes_schema { 0 } else { unsafe { ffi::sqlite3_changes64(db) }.max(0) as u64 };
        let last_row_id = unsafe { ffi::sqlite3_last_insert_rowid(db) };
        if facts.changes_schema {
            self.indexes.clear();
        }
        let size_after = if readonly || !reports_size { size_before } else { self.measure_size()? };
        let created = match schema_before {
            Some(before) => self.schema_version()? != before,
            None => false,
        };
        let schema = if created { self.with_internal(|c| schema_writes(c, facts)) } else { 0 };
        let rows_written = changes + self.index_writes(facts, statement_changes) + schema;
        let rows_read = raw.rows_visited();
        Ok(StatementResult {
            columns: columns.unwrap_or_default(),
            rows,
            meta: Meta {
                changes,
                last_row_id,
                changed_db: changes != 0 || last_row_id != last_before || size_after != size_before,
                size_after,
                rows_read,
                rows_written,
                duration_ms,
                wrote: !readonly,
            },
        })
    }

    /// Schema objects with reserved names. `ALTER TABLE … RENAME TO _cf_x` passes the
    /// authorizer (SQLite shows it the old name only), so ALTER compares this before and after;
    /// the caller's savepoint undoes a rename that added one.
    pub(super) fn schema_version(&mut self) -> Result<i64> {
        self.with_internal(|c| c.query_row("PRAGMA schema_version", [], |r| r.get(0))).map_err(Error::internal)
    }

    pub(super) fn count_reserved_names(&mut self) -> Result<i64> {
        self.with_internal(|c| {
            c.prepare_cached("SELECT count(*) FROM sqlite_schema WHERE lower(substr(name, 1, 4)) = '_cf_'")?
                .query_row([], |r| r.get(0))
        })
        .map_err(Error::internal)
    }

    /// Bytes in use: `(page_count - freelist_count) * page_size`, as D1 reports `size_after`.
    pub(super) fn measure_size(&mut self) -> Result<u64> {
        let pages = self.used_pages()?;
        let size = pages * self.page_size;
        self.size = Some(size);
        Ok(size)
    }

    /// Pages in use, from page 1 of the current transaction: the database size in pages (header
    /// offset 28) less the free pages (offset 36). Reading the page through a statement kept
    /// prepared costs a microsecond; `PRAGMA page_count` is prepared afresh on every run.
    pub(super) fn used_pages(&mut self) -> Result<u64> {
        if self.page_one.is_none() {
            self.page_one = Some(self.prepare_own("SELECT data FROM sqlite_dbpage('main') WHERE pgno = 1")?);
        }
        let (authorizer, statement) = (&self.authorizer, &mut self.page_one);
        let statement = statement.as_mut().expect("prepared just above");
        let pages = authorizer.internal(|| -> Result<u64> {
            if !statement.step()? {
                return Err(Error::sql(ffi::SQLITE_CORRUPT, "page 1 is missing"));
            }
            let header = statement.column_bytes(0);
            let word =
                |at: usize| header.get(at..at + 4).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as u64);
            Ok(word(28).saturating_sub(word(36)))
        });
        statement.reset();
        pages
    }

    /// The current size in bytes, free pages excluded.
    pub fn size(&mut self) -> Result<u64> {
        self.measure_size()
    }

    pub(super) fn explain_interrupt(&self, error: Error, deadline: Duration) -> Error {
        match error {
            Error::Sql { code: ffi::SQLITE_INTERRUPT, .. } if self.epoch.elapsed() >= deadline => Error::sql(
                ffi::SQLITE_INTERRUPT,
                &format!(
                    "the request exceeded its time limit of {} s and was cancelled",
                    self.request_timeout.as_secs()
                ),
            ),
            other => other,
        }
    }
}
