//! D1's authorizer: transactions, reserved names, ATTACH and TEMP, PRAGMA and function allow-lists.

use crate::common::*;

#[tokio::test]
async fn transactions_get_d1s_message() {
    let cx = Context::new();
    for sql in ["BEGIN", "BEGIN TRANSACTION", "COMMIT", "ROLLBACK", "SAVEPOINT x", "RELEASE x"] {
        assert_eq!(cx.err(sql).await, TRANSACTION_MESSAGE, "{sql}");
    }
}

#[tokio::test]
async fn forbidden_statements_are_not_authorized() {
    let cx = Context::new();
    cx.ok("CREATE TABLE t (x)").await;
    for sql in [
        "ATTACH DATABASE '/tmp/x.sqlite' AS x",
        "CREATE TEMP TABLE tt (x)",
        "CREATE TABLE _cf_mine (x)",
        "CREATE TABLE _CF_mine (x)",
        "CREATE INDEX _cf_idx ON t(x)",
        "PRAGMA user_version",
        "PRAGMA journal_mode = delete",
        "PRAGMA table_info(_cf_KV)",
        "CREATE VIRTUAL TABLE v USING dbstat",
        "ALTER TABLE t RENAME TO _cf_t",
        "SELECT * FROM sqlite_dbpage",
        "SELECT * FROM dbstat",
    ] {
        let e = cx.err(sql).await;
        assert!(e.ends_with("SQLITE_AUTH") || e.contains("not authorized"), "{sql}: {e}");
    }
    assert_eq!(cx.scalar("SELECT count(*) FROM t").await, Value::Integer(0));
    for sql in ["PRAGMA case_sensitive_like = ON; ALTER TABLE t RENAME TO _CF_x", "ALTER TABLE t RENAME TO _cf_KV"] {
        let e = cx.err(sql).await;
        assert!(e.contains("not authorized"), "{sql}: {e}");
    }
    assert_eq!(cx.scalar("SELECT count(*) FROM sqlite_schema WHERE name = 't'").await, Value::Integer(1));
    let e = cx.err("SELECT sqlite_version()").await;
    assert!(e.contains("not authorized to use function: sqlite_version"), "{e}");
}

#[tokio::test]
async fn allowed_features_work() {
    let cx = Context::new();
    cx.ok("CREATE VIRTUAL TABLE docs USING fts5(body)").await;
    cx.ok("INSERT INTO docs VALUES ('hello world')").await;
    assert_eq!(cx.scalar("SELECT count(*) FROM docs WHERE docs MATCH 'hello'").await, Value::Integer(1));
    assert_eq!(cx.scalar("SELECT json_extract('{\"a\":[1,2]}', '$.a[1]')").await, Value::Integer(2));
    assert_eq!(cx.scalar("SELECT sqrt(16)").await, Value::Real(4.0));
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, x)").await;
    let info = cx.ok("PRAGMA table_info(t)").await;
    assert_eq!(info[0].rows.len(), 2);
    cx.ok("PRAGMA table_list").await;
    cx.ok("PRAGMA defer_foreign_keys = on").await;
    cx.ok("PRAGMA foreign_key_check").await;
    cx.ok("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10) SELECT sum(i) FROM n").await;
    cx.ok("ALTER TABLE t ADD COLUMN y TEXT; ALTER TABLE t RENAME COLUMN y TO z; ALTER TABLE t DROP COLUMN z").await;
}

#[tokio::test]
async fn read_only_access_refuses_writes() {
    let cx = Context::new();
    cx.ok("CREATE TABLE t (x); INSERT INTO t VALUES (1)").await;
    let read = Request { access: Access::ReadOnly, ..Request::new(vec![Statement::new("SELECT x FROM t")]) };
    cx.registry.execute("db", read).await.unwrap();
    let write = Request { access: Access::ReadOnly, ..Request::new(vec![Statement::new("SELECT 1; DELETE FROM t")]) };
    assert!(matches!(cx.registry.execute("db", write).await, Err(Error::ReadOnly { .. })));
    assert_eq!(cx.scalar("SELECT count(*) FROM t").await, Value::Integer(1));
}
