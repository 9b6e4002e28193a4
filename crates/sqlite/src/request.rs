//! The typed requests the core executes and the results it returns: values, statements, meta.

/// One SQLite value, as bound to a parameter or read from a column.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// A 64-bit signed integer.
    Integer(i64),
    /// A 64-bit float.
    Real(f64),
    /// UTF-8 text. Text that is not valid UTF-8 in the file is read back lossily.
    Text(String),
    /// Bytes.
    Blob(Vec<u8>),
}

impl Value {
    /// Roughly the memory the value takes, for bounding results.
    pub fn footprint(&self) -> usize {
        match self {
            Value::Text(t) => 24 + t.len(),
            Value::Blob(b) => 24 + b.len(),
            _ => 16,
        }
    }
}

/// SQL text with the values for its parameters (`?` and `?NNN`, in order).
///
/// The text may hold several statements; see [`ResultMode`] for how their results are returned
/// and which of them may take parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    /// The SQL text.
    pub sql: String,
    /// Values for the parameters of the last statement in `sql`.
    pub params: Vec<Value>,
}

impl Statement {
    /// A statement without parameters.
    pub fn new(sql: impl Into<String>) -> Self {
        Statement { sql: sql.into(), params: Vec::new() }
    }

    /// A statement with parameters.
    pub fn with_params(sql: impl Into<String>, params: Vec<Value>) -> Self {
        Statement { sql: sql.into(), params }
    }
}

/// Which statements of a multi-statement text produce a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResultMode {
    /// Every statement produces a result (D1's REST `/query` and `/raw`).
    #[default]
    EveryStatement,
    /// Only the last statement of each text produces a result; earlier ones run and their rows
    /// are discarded (the Workers binding's `prepare("A; B")`).
    LastStatement,
    /// As workerd's `sql.exec()` for Durable Objects: the last statement's rows and its own
    /// `rows_read`/`rows_written` (not the sum), and text after the last statement must be
    /// whitespace (a trailing comment is "SQL code did not contain a statement.").
    Cursor,
}

/// What the caller is allowed to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Access {
    /// Any statement the policy allows.
    #[default]
    ReadWrite,
    /// Only statements that leave the database unchanged.
    ReadOnly,
}

/// A batch: every statement runs in one transaction, all or nothing.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Request {
    /// The statements, in order.
    pub statements: Vec<Statement>,
    /// Which statements produce results.
    pub mode: ResultMode,
    /// What the caller may do.
    pub access: Access,
}

impl Request {
    /// A batch of statements with D1's REST defaults.
    pub fn new(statements: Vec<Statement>) -> Self {
        Request { statements, ..Default::default() }
    }

    /// Whether the request might change connection state beyond its own transaction, so that
    /// it must not share a group commit with other requests.
    ///
    /// `PRAGMA`s are the only statements that can (`defer_foreign_keys` moves constraint checks
    /// to COMMIT, `case_sensitive_like` redefines LIKE). Matching the word anywhere in the text,
    /// string literals included, is deliberately conservative: a false positive costs one fsync.
    pub(crate) fn needs_own_transaction(&self) -> bool {
        self.statements.iter().any(|s| contains_ignore_ascii_case(&s.sql, "pragma"))
    }

    /// Whether the first statement plainly writes (its text starts with INSERT, UPDATE,
    /// DELETE, REPLACE, CREATE, DROP or ALTER): such a request is not tried as a read first.
    /// Only a hint: a write it misses is found when its statement is prepared.
    pub(crate) fn plainly_writes(&self) -> bool {
        let Some(first) = self.statements.first() else { return false };
        let text = first.sql.trim_start().as_bytes();
        let word = &text[..text.iter().position(|b| !b.is_ascii_alphabetic()).unwrap_or(text.len())];
        ["INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER"]
            .iter()
            .any(|keyword| word.eq_ignore_ascii_case(keyword.as_bytes()))
    }
}

fn contains_ignore_ascii_case(haystack: &str, needle: &str) -> bool {
    haystack.as_bytes().windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// The result of one statement.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StatementResult {
    /// Column names, in order; duplicates preserved.
    pub columns: Vec<String>,
    /// Rows, each with one value per column.
    pub rows: Vec<Vec<Value>>,
    /// Counters and timings.
    pub meta: Meta,
}

/// Per-statement counters, as D1 reports them in `meta`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Meta {
    /// Rows changed by this statement (a `total_changes()` delta: triggers included, DDL 0).
    pub changes: u64,
    /// `last_insert_rowid()` after the statement; sticky across statements on the connection.
    pub last_row_id: i64,
    /// Whether the statement changed anything: rows, the last rowid or the file size.
    pub changed_db: bool,
    /// Database size in bytes after the statement, free pages excluded.
    pub size_after: u64,
    /// Rows visited (see the crate docs for how it is counted).
    pub rows_read: u64,
    /// Rows written, index entries included (see the crate docs).
    pub rows_written: u64,
    /// Wall-clock time spent in SQLite, in milliseconds.
    pub duration_ms: f64,
    /// Whether the statement may have written (SQLite's `sqlite3_stmt_readonly` said no).
    pub wrote: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_writes_are_recognised_by_their_first_word() {
        let plain = |sql: &str| Request::new(vec![Statement::new(sql)]).plainly_writes();
        assert!(plain("INSERT INTO t VALUES (1)") && plain("  delete from t") && plain("Create table x (y)"));
        assert!(!plain("SELECT 1") && !plain("WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x"));
        assert!(!plain("/* c */ INSERT INTO t VALUES (1)") && !plain("INSERTED") && !plain(""));
    }

    #[test]
    fn only_pragmas_need_their_own_transaction() {
        assert!(Request::new(vec![Statement::new("PRAGMA defer_foreign_keys = on")]).needs_own_transaction());
        assert!(Request::new(vec![Statement::new("select 1; pRaGmA foreign_keys")]).needs_own_transaction());
        assert!(!Request::new(vec![Statement::new("INSERT INTO t VALUES (1)")]).needs_own_transaction());
    }
}
