//! All or nothing: failing batches, deferred foreign keys, group commit's independence, reopening.

use crate::common::*;

#[tokio::test]
async fn a_failing_batch_changes_nothing() {
    let cx = Context::new();
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY)").await;
    let batch = Request::new(vec![
        Statement::new("INSERT INTO t VALUES (1)"),
        Statement::new("INSERT INTO t VALUES (2)"),
        Statement::new("INSERT INTO nope VALUES (3)"),
    ]);
    cx.registry.execute("db", batch).await.unwrap_err();
    assert_eq!(cx.scalar("SELECT count(*) FROM t").await, Value::Integer(0));
}

#[tokio::test]
async fn deferred_foreign_keys_are_checked_at_the_end() {
    let cx = Context::new();
    cx.ok("CREATE TABLE parent (id INTEGER PRIMARY KEY); CREATE TABLE child (pid INTEGER REFERENCES parent(id))").await;
    assert!(cx.err("INSERT INTO child VALUES (1)").await.contains("FOREIGN KEY constraint failed"));
    cx.ok("PRAGMA defer_foreign_keys = on; INSERT INTO child VALUES (1); INSERT INTO parent VALUES (1)").await;
    let e = cx.err("PRAGMA defer_foreign_keys = on; INSERT INTO child VALUES (2)").await;
    assert!(e.contains("FOREIGN KEY constraint failed"), "{e}");
    assert_eq!(cx.scalar("SELECT count(*) FROM child").await, Value::Integer(1));
    // The pragma lasted one request only.
    assert!(cx.err("INSERT INTO child VALUES (3)").await.contains("FOREIGN KEY constraint failed"));
}

#[tokio::test]
async fn group_commit_keeps_requests_independent() {
    let cx = Arc::new(Context::new());
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY)").await;
    let mut tasks = Vec::new();
    for i in 0..200i64 {
        let cx = Arc::clone(&cx);
        tasks.push(tokio::spawn(async move {
            // Every 10th request fails halfway (duplicate id) and must leave nothing behind.
            let sql = if i % 10 == 0 {
                format!("INSERT INTO t VALUES ({}); INSERT INTO t VALUES ({})", 10_000 + i, 10_000 + i)
            } else {
                format!("INSERT INTO t VALUES ({i})")
            };
            cx.run(&sql).await.is_ok()
        }));
    }
    let mut succeeded = 0;
    for t in tasks {
        succeeded += usize::from(t.await.unwrap());
    }
    assert_eq!(succeeded, 180);
    assert_eq!(cx.scalar("SELECT count(*) FROM t").await, Value::Integer(180));
    assert_eq!(cx.scalar("SELECT count(*) FROM t WHERE id >= 10000").await, Value::Integer(0));
}

#[tokio::test]
async fn on_conflict_rollback_in_a_group_loses_no_other_request() {
    let cx = Arc::new(Context::new());
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY)").await;
    cx.ok("INSERT INTO t VALUES (0)").await;
    let mut tasks = Vec::new();
    for i in 1..100i64 {
        let cx = Arc::clone(&cx);
        let sql = if i % 7 == 0 {
            "INSERT OR ROLLBACK INTO t VALUES (0)".to_owned()
        } else {
            format!("INSERT INTO t VALUES ({i})")
        };
        tasks.push(tokio::spawn(async move { cx.run(&sql).await.is_ok() }));
    }
    let succeeded: usize = futures_sum(tasks).await;
    assert_eq!(succeeded, 99 - 14);
    assert_eq!(cx.scalar("SELECT count(*) FROM t").await, Value::Integer(1 + 99 - 14));
}

async fn futures_sum(tasks: Vec<tokio::task::JoinHandle<bool>>) -> usize {
    let mut n = 0;
    for t in tasks {
        n += usize::from(t.await.unwrap());
    }
    n
}

#[tokio::test]
async fn acknowledged_writes_survive_reopening() {
    let cx = Context::new();
    cx.ok("CREATE TABLE t (x); INSERT INTO t VALUES ('kept')").await;
    cx.registry.close("db").await;
    assert_eq!(cx.scalar("SELECT x FROM t").await, Value::Text("kept".into()));
    assert!(cx.dir.path().join("db.sqlite").exists());
}
