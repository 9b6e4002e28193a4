//! D1's limits, counted in bytes: values, parameters, statement length, results, compound selects.

use crate::common::*;

#[tokio::test]
async fn values_are_limited_in_bytes() {
    let cx = Context::new();
    cx.ok("CREATE TABLE t (v TEXT)").await;
    let three_byte = "€".repeat(700_000);
    assert_eq!(three_byte.len(), 2_100_000);
    let e = cx.run_params("INSERT INTO t VALUES (?)", vec![Value::Text(three_byte)]).await.unwrap_err();
    assert_eq!(e.to_string(), "string or blob too big: SQLITE_TOOBIG");
    let fits = "€".repeat(600_000);
    cx.run_params("INSERT INTO t VALUES (?)", vec![Value::Text(fits)]).await.unwrap();
    let e = cx.err("SELECT randomblob(2000001)").await;
    assert!(e.ends_with("SQLITE_TOOBIG"), "{e}");
}

#[tokio::test]
async fn at_most_100_parameters() {
    let cx = Context::new();
    let sql = |n: usize| format!("SELECT {}", vec!["?"; n].join(", "));
    cx.run_params(&sql(100), vec![Value::Integer(1); 100]).await.unwrap();
    let e = cx.run_params(&sql(101), vec![Value::Integer(1); 101]).await.unwrap_err();
    assert!(e.to_string().starts_with("too many SQL variables at offset"), "{e}");
}

#[tokio::test]
async fn statements_are_limited_to_100000_bytes_each() {
    let cx = Context::new();
    let long = format!("SELECT '{}'", "x".repeat(100_000));
    assert_eq!(cx.err(&long).await, "statement too long: SQLITE_TOOBIG");
    let short = format!("SELECT '{}'", "x".repeat(60_000));
    cx.ok(&format!("{short}; {short}")).await;
}

#[tokio::test]
async fn results_are_bounded_in_memory() {
    let cx = Context::new();
    let e =
        cx.err("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT zeroblob(1000000) FROM r").await;
    assert!(e.starts_with("the results are larger than") && e.ends_with("SQLITE_TOOBIG"), "{e}");
    cx.ok("SELECT zeroblob(1000000) FROM (SELECT 1 UNION ALL SELECT 2)").await;
}

#[tokio::test]
async fn compound_selects_columns_and_like_patterns() {
    let cx = Context::new();
    cx.ok("SELECT 1 UNION SELECT 2 UNION SELECT 3 UNION SELECT 4 UNION SELECT 5").await;
    assert!(
        cx.err("SELECT 1 UNION SELECT 2 UNION SELECT 3 UNION SELECT 4 UNION SELECT 5 UNION SELECT 6")
            .await
            .contains("too many terms in compound SELECT")
    );
    let columns: Vec<String> = (0..101).map(|i| format!("c{i}")).collect();
    assert!(cx.err(&format!("CREATE TABLE wide ({})", columns.join(", "))).await.contains("too many columns"));
    let e = cx.err(&format!("SELECT 'a' LIKE '{}'", "%".repeat(51))).await;
    assert!(e.contains("LIKE or GLOB pattern too complex"), "{e}");
}
