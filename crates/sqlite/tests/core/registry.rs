//! The registry's lifecycle: idle close, the cap on open databases, full queues.

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_databases_close_and_reopen() {
    let cx = Context::with_settings(RegistrySettings { idle_timeout: Duration::from_millis(50), ..Default::default() });
    cx.ok("CREATE TABLE t (x); INSERT INTO t VALUES (1)").await;
    assert_eq!(cx.registry.open_count(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(cx.registry.open_count(), 0);
    assert_eq!(cx.scalar("SELECT count(*) FROM t").await, Value::Integer(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_number_open_is_capped() {
    let cx = Context::with_settings(RegistrySettings { max_open: 4, ..Default::default() });
    for round in 0..3 {
        for i in 0..20 {
            let key = format!("db{i}");
            let sql =
                if round == 0 { "CREATE TABLE t (x)".to_owned() } else { format!("INSERT INTO t VALUES ({round})") };
            cx.registry.execute(&key, Request::new(vec![Statement::new(sql)])).await.unwrap();
            assert!(cx.registry.open_count() <= 4);
        }
    }
    for i in 0..20 {
        let r = cx
            .registry
            .execute(&format!("db{i}"), Request::new(vec![Statement::new("SELECT count(*) FROM t")]))
            .await
            .unwrap();
        assert_eq!(r[0].rows[0][0], Value::Integer(2));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_overloaded() {
    let cx = Arc::new(Context::with_settings(RegistrySettings { queue_depth: 1, ..Default::default() }));
    cx.ok("CREATE TABLE t (x)").await;
    let slow =
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000000) SELECT count(*) FROM n";
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let cx = Arc::clone(&cx);
        tasks.push(tokio::spawn(async move { cx.run(slow).await }));
    }
    let mut overloaded = 0;
    for t in tasks {
        if let Err(Error::Overloaded) = t.await.unwrap() {
            overloaded += 1;
        }
    }
    assert!(overloaded > 0);
}
