//! D1 migrations as wrangler defines them: numbered `.sql` files in a directory, a tracking
//! table, and one atomic request per migration (its text plus the INSERT that records it).
//!
//! The same functions serve `kura d1 migrations` locally and remotely, so both apply exactly
//! what `wrangler d1 migrations apply` would.

use std::path::{Path, PathBuf};

/// The tracking table wrangler uses unless `migrations_table` says otherwise.
pub const DEFAULT_TABLE: &str = "d1_migrations";
/// The directory wrangler uses unless `migrations_dir` says otherwise.
pub const DEFAULT_DIR: &str = "migrations";

/// One migration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// The name recorded in the tracking table: the path relative to the directory, with `/`.
    pub name: String,
    /// The file.
    pub path: PathBuf,
}

/// Quotes an identifier for SQL: `"` around it, inner `"` doubled.
pub fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Creates the tracking table if it is missing.
pub fn create_table_sql(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {}(\n\t\tid         INTEGER PRIMARY KEY AUTOINCREMENT,\n\t\tname       TEXT UNIQUE,\n\t\tapplied_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP NOT NULL\n);",
        quote_identifier(table)
    )
}

/// Lists applied migrations (read `name` from each row).
pub fn applied_sql(table: &str) -> String {
    format!("SELECT *\n\t\tFROM {}\n\t\tORDER BY id", quote_identifier(table))
}

/// The request that applies one migration and records it, atomically.
pub fn apply_sql(contents: &str, table: &str, name: &str) -> String {
    format!("{contents}\nINSERT INTO {} (name)\nvalues ('{}');", quote_identifier(table), name.replace('\'', "''"))
}

/// The leading integer of a file name (`0007_add_users.sql` → 7).
fn leading_number(name: &str) -> Option<u64> {
    let digits: String = name.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// Wrangler's order: numbered files by number, then by name; unnumbered files last, by name.
fn sort_key(name: &str) -> (bool, u64, String) {
    match leading_number(name) {
        Some(n) => (false, n, name.to_owned()),
        None => (true, 0, name.to_owned()),
    }
}

/// The `.sql` files directly in `dir`, in the order they apply.
pub fn list(dir: &Path) -> std::io::Result<Vec<Migration>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type()?.is_file() && name.ends_with(".sql") {
            found.push(Migration { name, path });
        }
    }
    found.sort_by_key(|m| sort_key(&m.name));
    Ok(found)
}

/// The migrations not yet recorded in `applied`, in order.
pub fn unapplied(all: Vec<Migration>, applied: &[String]) -> Vec<Migration> {
    all.into_iter().filter(|m| !applied.contains(&m.name)).collect()
}

/// Creates the next migration file (`NNNN_<message>.sql`) and returns its path.
pub fn create(dir: &Path, message: &str) -> std::io::Result<PathBuf> {
    if message.contains('/') || message.contains('\\') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a migration name cannot contain '/' or '\\'",
        ));
    }
    std::fs::create_dir_all(dir)?;
    let next = list(dir)?.iter().filter_map(|m| leading_number(&m.name)).max().map_or(1, |n| n + 1);
    let path = dir.join(format!("{next:04}_{}.sql", message.replace(' ', "_")));
    let stamp = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.3fZ");
    std::fs::write(&path, format!("-- Migration number: {next:04} \t {stamp}\n"))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_sort_as_wrangler_sorts_them() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["10_c.sql", "2_b.sql", "0001_a.sql", "zzz.sql", "notes.txt", "0002_a.sql"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let names: Vec<String> = list(dir.path()).unwrap().into_iter().map(|m| m.name).collect();
        assert_eq!(names, ["0001_a.sql", "0002_a.sql", "2_b.sql", "10_c.sql", "zzz.sql"]);
    }

    #[test]
    fn new_files_take_the_next_number() {
        let dir = tempfile::tempdir().unwrap();
        let first = create(dir.path(), "create users").unwrap();
        assert_eq!(first.file_name().unwrap(), "0001_create_users.sql");
        assert!(std::fs::read_to_string(&first).unwrap().starts_with("-- Migration number: 0001 \t "));
        assert_eq!(create(dir.path(), "more").unwrap().file_name().unwrap(), "0002_more.sql");
        assert!(create(dir.path(), "a/b").is_err());
    }

    #[test]
    fn apply_records_the_name_in_the_same_request() {
        assert_eq!(
            apply_sql("CREATE TABLE t (x);", "d1_migrations", "0001_it's.sql"),
            "CREATE TABLE t (x);\nINSERT INTO \"d1_migrations\" (name)\nvalues ('0001_it''s.sql');"
        );
    }
}
