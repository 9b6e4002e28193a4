//! Export: a database as SQL text in D1's dump format (what `wrangler d1 export` downloads), which imports
//! back to exactly the same contents. D1's export and Durable Objects' export (which includes
//! the KV table `_cf_KV`) share it.
//!
//! The format: `PRAGMA defer_foreign_keys=TRUE;`, then each table's schema and its rows as
//! `INSERT INTO "t" ("a","b") VALUES(…);`, then indexes, triggers and views. Text containing
//! line breaks is written as SQLite's shell writes it (`replace('…\n…','\n',char(10))`), text
//! holding a NUL or bytes that are not UTF-8 as `CAST(X'…' AS TEXT)`, BLOBs as `X'…'`; indexes,
//! triggers and views in the order they were created. Where D1 writes a JavaScript number,
//! kura writes integers exactly and REALs so they read back as REALs (`2.0`, not `2`), so a
//! round trip keeps every value and its type.

use std::io::{self, Write};

use crate::Database;
use rusqlite::types::ValueRef;

/// What to export.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DumpOptions {
    /// Leave out CREATE statements.
    pub no_schema: bool,
    /// Leave out rows.
    pub no_data: bool,
    /// Only these tables (all when empty).
    pub tables: Vec<String>,
    /// Reserved (`_cf_`) tables to export as well; they are left out otherwise.
    pub reserved_tables: Vec<String>,
}

/// What an export wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DumpStats {
    /// Statements written.
    pub statements: u64,
    /// Rows exported.
    pub rows: u64,
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// D1 cannot export virtual tables.
    #[error("D1 Export error: cannot export databases with Virtual Tables (fts5)")]
    VirtualTable,
    /// Reading the database failed.
    #[error("reading the database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// Writing the dump failed.
    #[error("writing the export: {0}")]
    Io(#[from] io::Error),
}

/// Quotes an identifier: `"…"` with inner quotes doubled.
fn quote_id(id: &str) -> String {
    format!("\"{}\"", id.replace('"', "\"\""))
}

/// A string that does not occur in `value`: `primary`, `secondary`, or `(primary0)`, … as
/// SQLite's shell chooses.
fn unused(value: &str, primary: &str, secondary: &str) -> String {
    if !value.contains(primary) {
        return primary.to_owned();
    }
    if !value.contains(secondary) {
        return secondary.to_owned();
    }
    (0..).map(|n| format!("({primary}{n})")).find(|c| !value.contains(c.as_str())).expect("some suffix is unused")
}

/// A text value as an SQL literal, line breaks spelled out as SQLite's shell does.
fn quote_text(value: &str, out: &mut String) {
    let (lf, cr) = (value.contains('\n'), value.contains('\r'));
    if !lf && !cr {
        out.push('\'');
        out.push_str(&value.replace('\'', "''"));
        out.push('\'');
        return;
    }
    let lf_mark = unused(value, "\\n", "\\012");
    let cr_mark = unused(value, "\\r", "\\015");
    let escaped = value.replace('\'', "''").replace('\n', &lf_mark).replace('\r', &cr_mark);
    let mut literal = format!("'{escaped}'");
    if cr {
        literal = format!("replace({literal},'{cr_mark}',char(13))");
    }
    if lf {
        literal = format!("replace({literal},'{lf_mark}',char(10))");
    }
    out.push_str(&literal);
}

/// A REAL as SQL that reads back as the same REAL.
fn format_real(x: f64, out: &mut String) {
    if x.is_nan() {
        out.push_str("NULL");
    } else if x.is_infinite() {
        out.push_str(if x > 0.0 { "1e999" } else { "-1e999" });
    } else {
        let text = format!("{x:?}");
        out.push_str(&text);
        if !text.contains(['.', 'e', 'E']) {
            out.push_str(".0");
        }
    }
}

/// Bytes as a BLOB literal, `X'…'`.
fn push_hex(bytes: &[u8], out: &mut String) {
    use std::fmt::Write as _;
    out.push_str("X'");
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out.push('\'');
}

fn push_value(value: ValueRef<'_>, out: &mut String) {
    use std::fmt::Write as _;
    match value {
        ValueRef::Null => out.push_str("NULL"),
        ValueRef::Integer(i) => {
            let _ = write!(out, "{i}");
        }
        ValueRef::Real(x) => format_real(x, out),
        ValueRef::Text(t) => match std::str::from_utf8(t) {
            Ok(text) if !text.contains('\0') => quote_text(text, out),
            // Bytes no SQL string literal can hold (a NUL, or not UTF-8) keep every byte.
            _ => {
                out.push_str("CAST(");
                push_hex(t, out);
                out.push_str(" AS TEXT)");
            }
        },
        ValueRef::Blob(b) => push_hex(b, out),
    }
}

/// Writes the database as SQL to `out`, one statement per line.
pub fn dump(db: &mut Database, options: &DumpOptions, out: &mut dyn Write) -> Result<DumpStats, DumpError> {
    db.with_internal(|conn| dump_connection(conn, options, out))
}

fn dump_connection(
    conn: &rusqlite::Connection,
    options: &DumpOptions,
    out: &mut dyn Write,
) -> Result<DumpStats, DumpError> {
    let mut stats = DumpStats::default();
    let mut line = |text: &str, stats: &mut DumpStats| -> io::Result<()> {
        stats.statements += 1;
        out.write_all(text.as_bytes())?;
        out.write_all(b"\n")
    };
    line("PRAGMA defer_foreign_keys=TRUE;", &mut stats)?;
    let wanted = |name: &str| options.tables.is_empty() || options.tables.iter().any(|t| t == name);
    let tables: Vec<(String, String)> = conn
        .prepare(
            "SELECT name, sql FROM sqlite_schema WHERE type == 'table' AND sql NOT NULL \
             ORDER BY tbl_name == 'sqlite_sequence', rowid",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (table, sql) in &tables {
        if !wanted(table) {
            continue;
        }
        if table == "sqlite_sequence" {
            if !options.no_schema {
                line("DELETE FROM sqlite_sequence;", &mut stats)?;
            }
        } else if table.starts_with("sqlite_stat") {
            if !options.no_schema {
                line("ANALYZE sqlite_schema;", &mut stats)?;
            }
        } else if sql.starts_with("CREATE VIRTUAL TABLE") {
            return Err(DumpError::VirtualTable);
        } else if table.starts_with("sqlite_")
            || (table.starts_with("_cf_") && !options.reserved_tables.iter().any(|t| t == table))
        {
            continue;
        } else if !options.no_schema {
            if sql.starts_with("CREATE TABLE \"") || sql.starts_with("CREATE TABLE '") {
                line(&format!("CREATE TABLE IF NOT EXISTS {};", &sql[13..]), &mut stats)?;
            } else {
                line(&format!("{sql};"), &mut stats)?;
            }
        }
        if options.no_data {
            continue;
        }
        let columns: Vec<String> = conn
            .prepare(&format!("PRAGMA table_info={}", quote_id(table)))?
            .query_map([], |r| r.get(1))?
            .collect::<rusqlite::Result<_>>()?;
        let names = columns.iter().map(|c| quote_id(c)).collect::<Vec<_>>();
        let prefix = format!("INSERT INTO {} ({}) VALUES(", quote_id(table), names.join(","));
        let mut select = conn.prepare(&format!("SELECT {} FROM {}", names.join(", "), quote_id(table)))?;
        let mut rows = select.query([])?;
        let mut statement = String::new();
        while let Some(row) = rows.next()? {
            statement.clear();
            statement.push_str(&prefix);
            for i in 0..columns.len() {
                if i > 0 {
                    statement.push(',');
                }
                push_value(row.get_ref(i)?, &mut statement);
            }
            statement.push_str(");");
            line(&statement, &mut stats)?;
            stats.rows += 1;
        }
    }
    if !options.no_schema {
        let mut rest = conn.prepare(
            "SELECT tbl_name, sql FROM sqlite_schema WHERE sql NOT NULL AND type IN ('index', 'trigger', 'view') \
             ORDER BY rowid",
        )?;
        let rest: Vec<(String, String)> =
            rest.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<rusqlite::Result<_>>()?;
        // In creation order, so a view over a view, or a trigger on a view, follows what it uses.
        for (table, sql) in rest {
            if wanted(&table) {
                line(&format!("{sql};"), &mut stats)?;
            }
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(value: &str) -> String {
        let mut out = String::new();
        quote_text(value, &mut out);
        out
    }

    #[test]
    fn text_is_quoted_as_sqlites_shell_quotes_it() {
        assert_eq!(text("it's"), "'it''s'");
        assert_eq!(text("a\nb"), "replace('a\\nb','\\n',char(10))");
        assert_eq!(text("a\r\nb"), "replace(replace('a\\r\\nb','\\r',char(13)),'\\n',char(10))");
        assert_eq!(text("has \\n already\n"), "replace('has \\n already\\012','\\012',char(10))");
    }

    #[test]
    fn reals_stay_reals() {
        let real = |x| {
            let mut out = String::new();
            format_real(x, &mut out);
            out
        };
        assert_eq!(real(2.0), "2.0");
        assert_eq!(real(1.5), "1.5");
        assert_eq!(real(1e300), "1e300");
        assert_eq!(real(f64::INFINITY), "1e999");
    }
}
