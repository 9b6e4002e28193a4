//! The Durable Objects engine end to end on a real data directory: SQL and KV under DO's rules,
//! atomic requests, serial execution, alarms, point-in-time recovery, fan-out and export.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kura_do::alarm::{AlarmInvocation, AlarmRunner, BoxFuture, Deliver, DeliveryError};
use kura_do::{DoError, DoSettings, DurableObjects, ListOptions, Namespace, ObjectId, Value, now_ms};

fn engine(dir: &std::path::Path) -> DurableObjects {
    DurableObjects::open(dir.join("do"), DoSettings::default()).unwrap()
}

fn rooms() -> Namespace {
    Namespace::new("0123456789abcdef0123456789abcdef", "my-worker-Room").unwrap()
}

fn text(s: &str) -> Value {
    Value::Text(s.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_and_kv_share_one_atomic_request() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let ns = rooms();
    let red = ns.id_from_name("room:red");
    e.run(&ns, &red, |s| {
        s.exec("CREATE TABLE members (name TEXT PRIMARY KEY)", vec![])?;
        s.exec("INSERT INTO members VALUES (?)", vec![text("alice")])?;
        s.kv_put("topic", b"\"cats\"")
    })
    .await
    .unwrap();
    // A failing request leaves nothing behind, SQL or KV.
    let failed = e
        .run(&ns, &red, |s| {
            s.exec("INSERT INTO members VALUES (?)", vec![text("mallory")])?;
            s.kv_put("topic", b"\"dogs\"")?;
            s.exec("INSERT INTO members VALUES (?)", vec![text("alice")]).map(|_| ())
        })
        .await;
    assert!(
        matches!(failed, Err(DoError::Sql { ref message, .. }) if message.contains("UNIQUE constraint failed")),
        "{failed:?}"
    );
    let (rows, topic) = e
        .run(&ns, &red, |s| Ok((s.exec("SELECT name FROM members ORDER BY name", vec![])?.rows, s.kv_get("topic")?)))
        .await
        .unwrap();
    assert_eq!(rows, vec![vec![text("alice")]]);
    assert_eq!(topic.as_deref(), Some(&b"\"cats\""[..]));
    // DO's rules: no BEGIN, no _cf_ names, parameters only on the last statement.
    let begin = e.run(&ns, &red, |s| s.exec("BEGIN", vec![])).await.unwrap_err();
    assert!(begin.to_string().contains("state.storage.transactionSync()"), "{begin}");
    let reserved = e.run(&ns, &red, |s| s.exec("SELECT * FROM _cf_KV", vec![])).await.unwrap_err();
    assert!(reserved.to_string().contains("SQLITE_AUTH"), "{reserved}");
    let empty = e.run(&ns, &red, |s| s.exec(" ; ", vec![])).await.unwrap_err();
    assert_eq!(empty.to_string(), "SQL code did not contain a statement.");
    let too_many = e.run(&ns, &red, |s| s.kv_get_many(&(0..129).map(|i| i.to_string()).collect::<Vec<_>>())).await;
    assert!(matches!(too_many, Err(DoError::Invalid(_))));
    let big = e.run(&ns, &red, |s| s.kv_put("big", &vec![0u8; 3 * 1024 * 1024])).await;
    assert!(matches!(big, Err(DoError::Invalid(_))), "{big:?}");
    // transaction_sync: an inner failure undoes only the inner part.
    e.run(&ns, &red, |s| {
        s.transaction_sync(|s| s.exec("INSERT INTO members VALUES ('bob')", vec![]).map(|_| ()))?;
        let inner: Result<(), DoError> = s.transaction_sync(|s| {
            s.exec("INSERT INTO members VALUES ('carol')", vec![])?;
            Err(DoError::Invalid("changed my mind".into()))
        });
        assert!(inner.is_err());
        Ok(())
    })
    .await
    .unwrap();
    let names = e.run(&ns, &red, |s| s.exec("SELECT group_concat(name) FROM members", vec![])).await.unwrap();
    assert_eq!(names.rows[0][0], text("alice,bob"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_lists_in_byte_order_with_workerd_options() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let ns = rooms();
    let id = ns.new_unique_id(None).unwrap();
    let entries: Vec<(String, Vec<u8>)> =
        ["a", "b", "ba", "bb", "c", "é"].iter().map(|k| (k.to_string(), k.as_bytes().to_vec())).collect();
    e.run(&ns, &id, move |s| s.kv_put_many(&entries)).await.unwrap();
    let keys = |o: ListOptions| {
        let e = e.clone();
        let ns = ns.clone();
        let id = id.clone();
        async move { e.run(&ns, &id, move |s| s.kv_list(&o)).await.unwrap().into_iter().map(|(k, _)| k).collect::<Vec<_>>() }
    };
    assert_eq!(keys(ListOptions::default()).await, ["a", "b", "ba", "bb", "c", "é"]);
    assert_eq!(keys(ListOptions { prefix: Some("b".into()), ..Default::default() }).await, ["b", "ba", "bb"]);
    assert_eq!(
        keys(ListOptions { start_after: Some("b".into()), limit: Some(2), ..Default::default() }).await,
        ["ba", "bb"]
    );
    assert_eq!(keys(ListOptions { reverse: true, limit: Some(2), ..Default::default() }).await, ["é", "c"]);
    assert_eq!(
        keys(ListOptions { start: Some("b".into()), end: Some("c".into()), ..Default::default() }).await,
        ["b", "ba", "bb"]
    );
    let deleted = e.run(&ns, &id, |s| s.kv_delete_many(&["a".into(), "zz".into()])).await.unwrap();
    assert_eq!(deleted, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_increments_of_one_object_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let ns = rooms();
    let counter = ns.id_from_name("counter");
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let (e, ns, counter) = (e.clone(), ns.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            // Read, then write from the async side: only serial execution keeps every increment.
            let session = e.begin(&ns, &counter).await.unwrap();
            let n = session
                .call(|s| s.kv_get("n").map(|v| v.map_or(0, |b| String::from_utf8(b).unwrap().parse::<u64>().unwrap())))
                .await
                .unwrap()
                .unwrap();
            tokio::task::yield_now().await;
            session.call(move |s| s.kv_put("n", (n + 1).to_string().as_bytes())).await.unwrap().unwrap();
            session.commit().await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n = e.run(&ns, &counter, |s| s.kv_get("n")).await.unwrap().unwrap();
    assert_eq!(n, b"200");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn point_in_time_recovery_restores_and_can_be_undone() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let ns = rooms();
    let id = ns.id_from_name("pitr");
    e.run(&ns, &id, |s| {
        s.exec("CREATE TABLE t (v)", vec![])?;
        s.exec("INSERT INTO t VALUES (1)", vec![])?;
        s.kv_put("k", b"1")
    })
    .await
    .unwrap();
    let before = e.bookmark(&ns, &id).await.unwrap();
    e.run(&ns, &id, |s| {
        s.exec("INSERT INTO t VALUES (2)", vec![])?;
        s.kv_put("k", b"2")
    })
    .await
    .unwrap();
    let restored = e.restore(&ns, &id, &before).await.unwrap();
    let state = e
        .run(&ns, &id, |s| Ok((s.exec("SELECT count(*) FROM t", vec![])?.rows[0][0].clone(), s.kv_get("k")?)))
        .await
        .unwrap();
    assert_eq!(state, (Value::Integer(1), Some(b"1".to_vec())));
    e.restore(&ns, &id, &restored.previous).await.unwrap();
    let count = e.run(&ns, &id, |s| s.exec("SELECT count(*) FROM t", vec![])).await.unwrap();
    assert_eq!(count.rows[0][0], Value::Integer(2));
    let bad = "00000000-00000000-00000000-00000000000000000000000000000000".parse();
    assert!(bad.is_err() || e.restore(&ns, &id, &bad.unwrap()).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_all_wipes_sql_kv_and_alarm_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let ns = rooms();
    let id = ns.id_from_name("wipe");
    e.run(&ns, &id, |s| {
        s.exec("CREATE TABLE parent (id INTEGER PRIMARY KEY)", vec![])?;
        s.exec("CREATE TABLE child (p REFERENCES parent(id))", vec![])?;
        s.exec("INSERT INTO parent VALUES (1); INSERT INTO child VALUES (1)", vec![])?;
        s.kv_put("k", b"v")?;
        s.set_alarm(now_ms() + 3_600_000)
    })
    .await
    .unwrap();
    let size = e.run(&ns, &id, |s| s.database_size()).await.unwrap();
    e.run(&ns, &id, |s| s.delete_all()).await.unwrap();
    let after = e
        .run(&ns, &id, |s| {
            Ok((
                s.exec("SELECT count(*) FROM sqlite_schema", vec![])?.rows[0][0].clone(),
                s.kv_get("k")?,
                s.get_alarm()?,
                s.database_size()?,
            ))
        })
        .await
        .unwrap();
    assert_eq!((after.0, after.1, after.2), (Value::Integer(0), None, None));
    assert!(after.3 < size, "{} < {size}", after.3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_tags_rows_and_reports_errors_per_object() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let ns = rooms();
    for (room, member) in [("room:red", "alice"), ("room:blue", "bob")] {
        let m = member.to_owned();
        e.run(&ns, &ns.id_from_name(room), move |s| {
            s.exec("CREATE TABLE members (name TEXT)", vec![])?;
            s.exec("INSERT INTO members VALUES (?)", vec![Value::Text(m)])
        })
        .await
        .unwrap();
    }
    let odd = ns.id_from_name("room:odd");
    e.run(&ns, &odd, |s| s.kv_put("x", b"1")).await.unwrap();
    let all = e.fan_out(&ns, None, "SELECT name FROM members", vec![]).await.unwrap();
    assert_eq!(all.len(), 3);
    let mut names: Vec<(String, Value)> = all
        .iter()
        .filter_map(|r| r.outcome.as_ref().ok().map(|c| (r.object.name.clone().unwrap(), c.rows[0][0].clone())))
        .collect();
    names.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(names, vec![("room:blue".into(), text("bob")), ("room:red".into(), text("alice"))]);
    let odd_row = all.iter().find(|r| r.object.name.as_deref() == Some("room:odd")).unwrap();
    assert!(odd_row.outcome.as_ref().unwrap_err().to_string().contains("no such table"));
    let writes = e.fan_out(&ns, Some(vec![ns.id_from_name("room:red")]), "DELETE FROM members", vec![]).await.unwrap();
    assert!(
        matches!(writes[0].outcome, Err(DoError::Invalid(ref m)) if m.contains("read-only statements only")),
        "{:?}",
        writes[0].outcome
    );
    let listed = e.list(&ns, "", 10).await.unwrap();
    assert_eq!(listed.len(), 3);
    assert!(listed.iter().all(|o| o.stored_bytes > 0));
    let dump = e.export(&ns, &ns.id_from_name("room:red")).await.unwrap();
    assert!(dump.contains("INSERT INTO \"members\" (\"name\") VALUES('alice');"), "{dump}");
    let kv_dump = e.export(&ns, &odd).await.unwrap();
    assert!(kv_dump.contains("_cf_KV"), "{kv_dump}");
}

struct Recorder {
    calls: Mutex<Vec<AlarmInvocation>>,
    failures_left: Mutex<u32>,
}

impl Deliver for Recorder {
    fn deliver(&self, _ns: &Namespace, alarm: AlarmInvocation) -> BoxFuture<'static, Result<(), DeliveryError>> {
        self.calls.lock().unwrap().push(alarm);
        let mut left = self.failures_left.lock().unwrap();
        let outcome = if *left > 0 {
            *left -= 1;
            Err(DeliveryError::Handler("handler threw".into()))
        } else {
            Ok(())
        };
        Box::pin(async move { outcome })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alarms_fire_once_and_retry_with_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let ns = rooms();
    let once = ns.id_from_name("once");
    let flaky = ns.id_from_name("flaky");
    let recorder = Arc::new(Recorder { calls: Mutex::new(Vec::new()), failures_left: Mutex::new(0) });
    let runner = AlarmRunner::new(e.clone(), recorder.clone());
    let ns_list = ns.clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(runner.run(
        move || {
            let ns = ns_list.clone();
            async move { vec![ns] }
        },
        async move {
            let _ = stop_rx.await;
        },
    ));
    let at = now_ms() + 300;
    e.run(&ns, &once, move |s| s.set_alarm(at)).await.unwrap();
    // `id`'s alarm delivered `n` times, and cleared.
    let delivered = |id, n: usize| {
        let (e, ns, recorder) = (&e, &ns, &recorder);
        move || async move {
            let cleared = e.run(ns, id, |s| s.get_alarm()).await.unwrap().is_none();
            let calls = recorder.calls.lock().unwrap().iter().filter(|c| c.id == *id).count();
            (calls >= n && cleared).then_some(())
        }
    };
    let calls_of = |id: &ObjectId| -> Vec<AlarmInvocation> {
        recorder.calls.lock().unwrap().iter().filter(|c| c.id == *id).cloned().collect()
    };
    kura_testkit::poll("the alarm delivered and cleared", Duration::from_secs(10), delivered(&once, 1)).await;
    // One failure, then success: a retry about 2 s later that says so.
    *recorder.failures_left.lock().unwrap() = 1;
    e.run(&ns, &flaky, |s| s.set_alarm(1)).await.unwrap();
    kura_testkit::poll("the retried alarm delivered and cleared", Duration::from_secs(15), delivered(&flaky, 2)).await;
    // A sentinel set now and delivered: a second delivery of either, had one been scheduled,
    // would have come by then.
    let sentinel = ns.id_from_name("sentinel");
    let soon = now_ms() + 300;
    e.run(&ns, &sentinel, move |s| s.set_alarm(soon)).await.unwrap();
    kura_testkit::poll("the sentinel delivered", Duration::from_secs(10), delivered(&sentinel, 1)).await;
    let calls = calls_of(&once);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].scheduled_ms, at);
    assert!(!calls[0].is_retry());
    let calls = calls_of(&flaky);
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!((calls[0].retry_count, calls[1].retry_count), (0, 1));
    let _ = stop_tx.send(());
    task.await.unwrap();
    let bad = e.run(&ns, &once, |s| s.set_alarm(0)).await.unwrap_err();
    assert_eq!(bad.to_string(), "setAlarm() cannot be called with an alarm time <= 0");
}

/// An object joins its namespace's listing with the first request that writes to it: reading
/// it, or a request that fails, leaves nothing listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_objects_that_stored_something_are_listed() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let ns = rooms();
    let (reader, failed, writer) = (ns.id_from_name("reader"), ns.id_from_name("failed"), ns.id_from_name("writer"));
    e.run(&ns, &reader, |s| s.exec("SELECT 1", vec![])).await.unwrap();
    let outcome = e
        .run(&ns, &failed, |s| {
            s.exec("CREATE TABLE t (x)", vec![])?;
            s.exec("SELEKT 1", vec![])
        })
        .await;
    assert!(outcome.is_err());
    e.run(&ns, &writer, |s| s.exec("CREATE TABLE t (x)", vec![])).await.unwrap();
    assert!(!e.exists(&ns, &reader).await.unwrap());
    assert!(!e.exists(&ns, &failed).await.unwrap());
    assert!(e.exists(&ns, &writer).await.unwrap());
    let listed = e.list(&ns, "", 10).await.unwrap();
    let names: Vec<Option<String>> = listed.iter().map(|o| o.entry.name.clone()).collect();
    assert_eq!(names, [Some("writer".to_owned())]);
    // Written again, and after delete_all (which drops the marker with everything), still once.
    e.run(&ns, &writer, |s| s.exec("INSERT INTO t VALUES (1)", vec![])).await.unwrap();
    e.run(&ns, &writer, |s| s.delete_all()).await.unwrap();
    e.run(&ns, &writer, |s| s.kv_put("k", b"1")).await.unwrap();
    assert_eq!(e.count(&ns).await.unwrap(), 1);
}
