//! SQL text from outside, fuzzed through the engine (statement splitting, the authorizer, the
//! limits): fragments of SQL, quotes, comments and control bytes in any order. Whatever a
//! request does, the engine never panics, stays usable (its schema and every table read, and it
//! takes a write), and a request that fails leaves nothing behind (its statements run in one
//! transaction): the whole schema and every table's row count (and the canary's sum) as they
//! were — counts, not rows, so a failed request that changed a row of `t` in place would pass.
//! `KURA_FUZZ_CASES` sets how many requests run (the long mode); `scripts/test` runs a bounded
//! number.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::common::*;

/// Whole statements a request strings together: ones the engine runs …
const ALLOWED: &[&str] = &[
    "SELECT 1",
    "SELECT * FROM canary",
    "INSERT INTO canary VALUES (1)",
    "UPDATE canary SET x = x + 1",
    "DELETE FROM canary",
    "INSERT INTO t VALUES (1, 'a;b', x'00ff')",
    "CREATE TABLE IF NOT EXISTS u (v)",
    "DROP TABLE IF EXISTS u",
    "CREATE INDEX IF NOT EXISTS i ON t(a)",
    "CREATE TRIGGER IF NOT EXISTS g AFTER INSERT ON t BEGIN INSERT INTO canary VALUES (7); END",
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 50) SELECT sum(x) FROM c",
    "SELECT randomblob(1000), zeroblob(1000)",
    "PRAGMA table_info(t)",
    "SELECT 'é😀', \"canary\".x FROM canary",
    "SELECT 1e308 * 10",
    "ALTER TABLE t ADD COLUMN d",
    "INSERT INTO t (a) SELECT x FROM canary",
];

/// … and ones it refuses or that fail.
const REFUSED: &[&str] = &[
    "PRAGMA writable_schema = 1",
    "PRAGMA journal_mode = DELETE",
    "ATTACH 'x' AS y",
    "SELECT load_extension('x')",
    "VACUUM",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "SAVEPOINT s",
    "SELECT * FROM nope",
    "INSERT INTO canary VALUES ('a', 2)",
    "SELECT -9223372036854775808 - 1",
    "SELECT :a, ?, ?5",
    "DROP TABLE canary",
    "INSERT INTO t VALUES (?, ?, ?)",
];

/// Separators and noise between statements: comments, blank lines, stray tokens.
const JOINS: &[&str] =
    &[";", "; ", ";\n", " -- comment ; here\n;", "/* ; */;", ";;", "\n", " ", "'", "(", "\0", ") ;", "`"];

fn request() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        (
            prop_oneof![8 => proptest::sample::select(ALLOWED), 1 => proptest::sample::select(REFUSED)],
            prop_oneof![
                12 => Just(";".to_owned()),
                3 => proptest::sample::select(JOINS).prop_map(str::to_owned),
                1 => "\\PC{0,4}",
            ],
        ),
        0..5,
    )
    .prop_map(|parts| parts.into_iter().map(|(statement, join)| format!("{statement}{join}")).collect())
}

/// What a request could change, as compared: the whole schema (every `sqlite_master` row) and
/// each table's row count, with the canary's sum (its `UPDATE` changes no count). Reading it
/// needs nothing the fuzzed requests may drop, so it reads after any request that left the
/// engine usable.
async fn state(cx: &Context) -> Result<Vec<Vec<Value>>, Error> {
    let schema = cx.run("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").await?;
    let mut state = schema[0].rows.clone();
    let tables: Vec<String> = schema[0]
        .rows
        .iter()
        .filter(|row| row[0] == Value::Text("table".into()))
        .filter_map(|row| match &row[1] {
            Value::Text(name) if !name.starts_with("_cf_") => Some(name.clone()),
            _ => None,
        })
        .collect();
    for table in tables {
        let sum = if table == "canary" { "coalesce(sum(x), 0)" } else { "NULL" };
        let counted = cx.run(&format!("SELECT '{table}', count(*), {sum} FROM \"{table}\"")).await?;
        state.extend(counted[0].rows.iter().cloned());
    }
    Ok(state)
}

#[test]
fn any_sql_text_runs_or_fails_whole() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cx = Context::new();
    runtime.block_on(async {
        cx.ok("CREATE TABLE canary (x INTEGER); CREATE TABLE t (a, b, c); INSERT INTO canary VALUES (0)").await;
    });
    let cases = kura_testkit::count("KURA_FUZZ_CASES", 1_500);
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let (succeeded, failed) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
    runner
        .run(&request(), |sql| {
            runtime.block_on(async {
                let before = state(&cx).await;
                prop_assert!(before.is_ok(), "the state before {sql:?} does not read: {before:?}");
                let outcome = cx.run(&sql).await;
                // The engine answers after any request: the schema and every table read …
                let after = state(&cx).await;
                prop_assert!(after.is_ok(), "{sql:?} left the engine unusable: {after:?}");
                match outcome {
                    Ok(_) => succeeded.set(succeeded.get() + 1),
                    Err(e) => {
                        failed.set(failed.get() + 1);
                        prop_assert!(!e.to_string().is_empty());
                        prop_assert_eq!(
                            before.unwrap(),
                            after.unwrap(),
                            "a failed request changed the schema or a table: {:?} ({})",
                            sql,
                            e
                        );
                    }
                }
                // … and takes writes: the fixtures put back if a request dropped them (DROP
                // TABLE is allowed).
                let restored = cx
                    .run("CREATE TABLE IF NOT EXISTS canary (x INTEGER); CREATE TABLE IF NOT EXISTS t (a, b, c)")
                    .await;
                prop_assert!(restored.is_ok(), "after {sql:?} the engine takes no write: {restored:?}");
                Ok(())
            })
        })
        .unwrap();
    let (succeeded, failed) = (succeeded.get(), failed.get());
    eprintln!("SQL fuzz: {cases} requests, {succeeded} ran, {failed} refused or failed");
    assert!(succeeded > 0 && failed > 0, "the generator reaches both outcomes");
}
