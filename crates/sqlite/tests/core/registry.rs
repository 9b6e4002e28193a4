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

/// The actor's connection takes no SQLite file locks (see `file_lock`), yet another
/// connection to the file, with SQLite's own locks as another process's would take them, is
/// refused while the database is open, and reads once it has closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_connection_to_an_open_database_is_refused_until_it_closes() {
    let cx = Context::new();
    cx.ok("CREATE TABLE t (x); INSERT INTO t VALUES (1)").await;
    let outside = rusqlite::Connection::open(cx.dir.path().join("db.sqlite")).unwrap();
    outside.busy_timeout(Duration::ZERO).unwrap();
    let count = |c: &rusqlite::Connection| c.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0));
    let refused = count(&outside).unwrap_err();
    assert!(refused.to_string().contains("locked"), "{refused}");
    let written = outside.execute("CREATE TABLE u (y)", []).unwrap_err();
    assert!(written.to_string().contains("locked"), "{written}");
    cx.registry.close("db").await;
    assert_eq!(count(&outside).unwrap(), 1);
}

/// An open database with no work holds no thread: requests to fifty databases, one after
/// another, leave fifty open and run on a thread or two, reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_open_databases_hold_no_threads() {
    let cx = Context::new();
    for i in 0..50 {
        let create = Request::new(vec![Statement::new("CREATE TABLE t (x); INSERT INTO t VALUES (1)")]);
        cx.registry.execute(&format!("db{i}"), create).await.unwrap();
    }
    assert_eq!(cx.registry.open_count(), 50);
    let threads = cx.registry.threads();
    assert!((1..=4).contains(&threads), "{threads} threads for 50 open databases");
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

/// Reads run on the caller's thread while the actor is idle; one that runs past its budget
/// there is interrupted and finishes on the actor with the same answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_past_the_callers_budget_finishes_on_the_actor() {
    let cx = Context::new();
    cx.ok("CREATE TABLE t (x); INSERT INTO t VALUES (1)").await;
    let long =
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400000) SELECT count(*) FROM n";
    let started = std::time::Instant::now();
    assert_eq!(cx.scalar(long).await, Value::Integer(400_000));
    assert!(started.elapsed() > Duration::from_millis(2), "the read is long enough to pass the budget");
    assert_eq!(cx.scalar("SELECT count(*) FROM t").await, Value::Integer(1));
}

/// Reads served on callers' threads see every acknowledged request whole and nothing of one
/// not yet acknowledged, while writes go through the actor's group commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_beside_the_actor_never_see_half_a_request() {
    let cx = Arc::new(Context::new());
    cx.ok("CREATE TABLE t (x)").await;
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let cx = Arc::clone(&cx);
            tokio::spawn(async move {
                for i in 0..100 {
                    let pair = Request::new(vec![
                        Statement::new(format!("INSERT INTO t VALUES ({w}{i}0)")),
                        Statement::new(format!("INSERT INTO t VALUES ({w}{i}1)")),
                    ]);
                    cx.registry.execute("db", pair).await.unwrap();
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let cx = Arc::clone(&cx);
            tokio::spawn(async move {
                let mut last = 0;
                for _ in 0..300 {
                    let Value::Integer(n) = cx.scalar("SELECT count(*) FROM t").await else { panic!("a count") };
                    assert_eq!(n % 2, 0, "a request's two rows are seen together");
                    assert!(n >= last, "no read goes back in time");
                    last = n;
                }
            })
        })
        .collect();
    for task in writers.into_iter().chain(readers) {
        task.await.unwrap();
    }
    assert_eq!(cx.scalar("SELECT count(*) FROM t").await, Value::Integer(800));
}
