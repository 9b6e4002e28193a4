//! SQL text from outside, fuzzed through the engine (statement splitting, the authorizer, the
//! limits): fragments of SQL, quotes, comments and control bytes in any order. Whatever a
//! request does, the engine never panics, stays usable, and a request that fails leaves
//! nothing behind (its statements run in one transaction). `KURA_FUZZ_CASES` sets how many
//! requests run (the long mode); `scripts/test` runs a bounded number.

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

#[test]
fn any_sql_text_runs_or_fails_whole() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cx = Context::new();
    runtime.block_on(async {
        cx.ok("CREATE TABLE canary (x INTEGER); CREATE TABLE t (a, b, c); INSERT INTO canary VALUES (0)").await;
    });
    let cases = std::env::var("KURA_FUZZ_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(1_500);
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let (succeeded, failed) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
    runner
        .run(&request(), |sql| {
            runtime.block_on(async {
                let before = cx.run("SELECT count(*), coalesce(sum(x), 0) FROM canary").await;
                let outcome = cx.run(&sql).await;
                let after = cx.run("SELECT count(*), coalesce(sum(x), 0) FROM canary").await;
                // The engine answers after any request: the canary table (or its absence) reads.
                prop_assert!(
                    after.is_ok() || before.is_err() || sql.contains("canary"),
                    "{sql:?} left the engine unusable: {after:?}"
                );
                match outcome {
                    Ok(_) => succeeded.set(succeeded.get() + 1),
                    Err(e) => {
                        failed.set(failed.get() + 1);
                        prop_assert!(!e.to_string().is_empty());
                        if let (Ok(b), Ok(a)) = (&before, &after) {
                            prop_assert_eq!(
                                &b[0].rows,
                                &a[0].rows,
                                "a failed request changed the canary: {:?} ({})",
                                sql,
                                e
                            );
                        }
                    }
                }
                // Put the fixtures back if a request dropped them (DROP TABLE is allowed).
                let _ = cx
                    .run("CREATE TABLE IF NOT EXISTS canary (x INTEGER); CREATE TABLE IF NOT EXISTS t (a, b, c)")
                    .await;
                Ok(())
            })
        })
        .unwrap();
    let (succeeded, failed) = (succeeded.get(), failed.get());
    eprintln!("SQL fuzz: {cases} requests, {succeeded} ran, {failed} refused or failed");
    assert!(succeeded > 0 && failed > 0, "the generator reaches both outcomes");
}
