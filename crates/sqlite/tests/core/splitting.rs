//! Multi-statement text is split by SQLite's own parser: results per statement, parameters, errors.

use crate::common::*;

#[tokio::test]
async fn every_statement_gets_a_result() {
    let cx = Context::new();
    let results = cx.ok("SELECT 1 AS one; SELECT 'a;b' AS two -- ; trailing comment\n; /* ; */ SELECT 3").await;
    assert_eq!(results.len(), 3);
    assert_eq!(results[0].columns, vec!["one"]);
    assert_eq!(results[1].rows, vec![vec![Value::Text("a;b".into())]]);
    assert_eq!(results[2].rows, vec![vec![Value::Integer(3)]]);
}

#[tokio::test]
async fn trigger_bodies_are_not_split() {
    let cx = Context::new();
    cx.ok("CREATE TABLE t (x INTEGER, y TEXT);
           CREATE TABLE audit (x INTEGER, kind TEXT);
           CREATE TRIGGER t_ins AFTER INSERT ON t BEGIN
             INSERT INTO audit VALUES (new.x, CASE WHEN new.x > 1 THEN 'big' ELSE 'small' END);
           END;
           INSERT INTO t VALUES (1, 'a'), (2, 'b');")
        .await;
    assert_eq!(cx.scalar("SELECT group_concat(kind, ',') FROM audit").await, Value::Text("small,big".into()));
}

#[tokio::test]
async fn only_comments_is_no_statement() {
    let cx = Context::new();
    assert_eq!(cx.err("  -- nothing here\n /* still nothing */ ").await, "No SQL statements detected.");
    assert_eq!(cx.err("").await, "No SQL statements detected.");
}

#[tokio::test]
async fn last_statement_mode_returns_one_result() {
    let cx = Context::new();
    let request = Request {
        statements: vec![Statement::with_params(
            "CREATE TABLE t (x); INSERT INTO t VALUES (?)",
            vec![Value::Integer(7)],
        )],
        mode: ResultMode::LastStatement,
        access: Access::ReadWrite,
    };
    let results = cx.registry.execute("db", request).await.unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].meta.changes, 1);
}

#[tokio::test]
async fn only_the_last_statement_may_take_parameters() {
    let cx = Context::new();
    let e = cx.run_params("SELECT ?; SELECT 2", vec![Value::Integer(1)]).await.unwrap_err();
    assert!(e.to_string().contains("only the last statement can have parameters"), "{e}");
    let e = cx.run_params("SELECT ?, ?", vec![Value::Integer(1)]).await.unwrap_err();
    assert!(e.to_string().starts_with("Wrong number of parameter bindings"), "{e}");
    let ok = cx.run_params("SELECT 1; SELECT ?2, ?1", vec![Value::Integer(1), Value::Text("b".into())]).await.unwrap();
    assert_eq!(ok[1].rows[0], vec![Value::Text("b".into()), Value::Integer(1)]);
}

#[tokio::test]
async fn errors_read_like_d1() {
    let cx = Context::new();
    assert_eq!(cx.err("SELECT * FROM nope").await, "no such table: nope: SQLITE_ERROR");
    assert_eq!(cx.err("SELEC 1").await, "near \"SELEC\": syntax error at offset 0: SQLITE_ERROR");
    cx.ok("CREATE TABLE u (email TEXT UNIQUE); INSERT INTO u VALUES ('a@b')").await;
    assert_eq!(
        cx.err("INSERT INTO u VALUES ('a@b')").await,
        "UNIQUE constraint failed: u.email: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_UNIQUE)"
    );
}
