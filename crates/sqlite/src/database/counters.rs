//! Rows written through indexes, counted as D1 counts them: the indexes of each written table,
//! loaded once and kept until the schema changes.

use super::Database;
use crate::policy::{SchemaObject, StatementFacts, WriteKind};

/// Index columns of one index; `None` when it indexes an expression, which any update may touch.
pub(super) type IndexColumns = Option<Vec<String>>;

impl Database {
    /// Index entries the statement wrote: every index of the table per inserted row, the indexes
    /// over updated columns per updated row. (D1 counts each `OP_IdxInsert`; deletes write none.)
    pub(super) fn index_writes(&mut self, facts: &StatementFacts, rows: u64) -> u64 {
        let Some((kind, table)) = &facts.writes else {
            return 0;
        };
        if rows == 0 || *kind == WriteKind::Delete {
            return 0;
        }
        let indexes = self.indexes_of(table);
        let touched = match kind {
            WriteKind::Update => indexes
                .iter()
                .filter(|columns| match columns {
                    None => true,
                    Some(cols) => cols.iter().any(|c| facts.updated_columns.iter().any(|u| u.eq_ignore_ascii_case(c))),
                })
                .count(),
            _ => indexes.len(),
        };
        rows * touched as u64
    }

    fn indexes_of(&mut self, table: &str) -> Vec<IndexColumns> {
        let key = table.to_ascii_lowercase();
        if let Some(found) = self.indexes.get(&key) {
            return found.clone();
        }
        let loaded = self.with_internal(|c| load_indexes(c, table)).unwrap_or_default();
        self.indexes.insert(key, loaded.clone());
        loaded
    }
}

/// Rows D1's and workerd's counters see written by DDL: `CREATE TABLE` and `CREATE VIEW`
/// insert their schema row and then update it, and a table inserts one more row for each index
/// its UNIQUE and PRIMARY KEY constraints make; `CREATE TRIGGER` inserts its row; `CREATE INDEX`
/// its row and one entry per row it indexes. Other DDL is counted as writing nothing (an
/// approximation; see docs/compatibility.md).
pub(super) fn schema_writes(conn: &rusqlite::Connection, facts: &StatementFacts) -> u64 {
    let count = |sql: &str, arg: &str| conn.query_row(sql, [arg], |r| r.get::<_, u64>(0)).unwrap_or(0);
    match &facts.creates {
        None => 0,
        Some(SchemaObject::Table(table)) => {
            2 + count(
                "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND tbl_name = ?1 AND sql IS NULL",
                table,
            )
        }
        Some(SchemaObject::View) => 2,
        Some(SchemaObject::Trigger) => 1,
        Some(SchemaObject::Index { index, table }) => {
            // A partial index holds only the rows its WHERE clause admits, which SQLite keeps
            // in the index's own text.
            let partial = conn
                .query_row("SELECT partial FROM pragma_index_list(?1) WHERE name = ?2", [table, index], |r| r.get(0))
                .unwrap_or(false);
            let stored: Option<String> = conn
                .query_row("SELECT sql FROM sqlite_schema WHERE type = 'index' AND name = ?1", [index], |r| r.get(0))
                .ok()
                .flatten()
                .filter(|_| partial);
            let predicate = stored.as_deref().and_then(partial_predicate).unwrap_or("1");
            let quoted = table.replace('"', "\"\"");
            let entries = format!("SELECT count(*) FROM \"{quoted}\" WHERE {predicate}");
            1 + conn.query_row(&entries, [], |r| r.get::<_, u64>(0)).unwrap_or(0)
        }
    }
}

/// The WHERE clause of a partial index's `CREATE INDEX` text.
fn partial_predicate(sql: &str) -> Option<&str> {
    // The clause comes last and may hold no subquery: the last `WHERE` standing as a word
    // (after whitespace or the column list's `)`, before whitespace or `(`).
    let upper = sql.to_ascii_uppercase();
    let bytes = upper.as_bytes();
    let at = upper.match_indices("WHERE").map(|(i, _)| i).filter(|&i| {
        let before = i.checked_sub(1).map(|j| bytes[j]);
        let after = bytes.get(i + 5).copied();
        before.is_some_and(|b| b.is_ascii_whitespace() || b == b')')
            && after.is_some_and(|b| b.is_ascii_whitespace() || b == b'(')
    });
    Some(sql[at.last()? + 5..].trim())
}

/// The indexes of `table`, through the PRAGMA statements rather than their table-valued
/// functions (`pragma_index_list(?1)`): each of those sets up a virtual table, about 15 µs
/// against 3 here, paid on the first write to each table after every open.
fn load_indexes(conn: &rusqlite::Connection, table: &str) -> rusqlite::Result<Vec<IndexColumns>> {
    // PRAGMA arguments cannot be bound: they are quoted as string literals.
    let pragma = |name: &str, arg: &str| format!("PRAGMA {name}('{}')", arg.replace('\'', "''"));
    // Columns: schema, name, type, ncol, wr, strict. Unreadable, the table counts as a rowid one.
    let without_rowid = conn
        .prepare(&pragma("table_list", table))
        .and_then(|mut tables| {
            tables
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, bool>(4)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .is_ok_and(|tables| tables.iter().any(|(schema, wr)| schema == "main" && *wr));
    // Columns: seq, name, unique, origin, partial.
    let mut list = conn.prepare(&pragma("index_list", table))?;
    let names: Vec<(String, String)> =
        list.query_map([], |r| Ok((r.get(1)?, r.get(3)?)))?.collect::<rusqlite::Result<_>>()?;
    let mut out = Vec::new();
    for (index, origin) in names {
        // A WITHOUT ROWID table's primary key is the table itself, not a separate index.
        if without_rowid && origin == "pk" {
            continue;
        }
        // Columns: seqno, cid, name (NULL for an expression).
        let mut info = conn.prepare(&pragma("index_info", &index))?;
        let columns: Vec<Option<String>> = info.query_map([], |r| r.get(2))?.collect::<rusqlite::Result<_>>()?;
        out.push(columns.into_iter().collect::<Option<Vec<String>>>());
    }
    Ok(out)
}
