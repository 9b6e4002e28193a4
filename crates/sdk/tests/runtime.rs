//! The Durable Object runtime end to end: the seed experiment (rooms by name, a unique room,
//! fan-out against the same data in one database), serial execution, failures, alarms, PITR
//! and eviction of instances.

#[path = "../examples/room.rs"]
mod room;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use kura::{AlarmInfo, BoxFuture, DurableObject, Error, Result, Runtime, RuntimeSettings, State, Value};
use kura_sqlite::{DatabaseOptions, Registry, RegistrySettings, Request, Statement};
use room::{Room, add, members};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_experiment_holds() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::open(dir.path()).unwrap();
    let rooms = runtime.namespace::<Room>("ROOMS", "chat-Room", ()).unwrap();
    rooms.get_by_name("room:red").call(add("alice")).await.unwrap();
    rooms.get_by_name("room:blue").call(add("bob")).await.unwrap();
    assert_eq!(rooms.get_by_name("room:red").call(members()).await.unwrap(), ["alice"]);
    assert_eq!(rooms.get_by_name("room:blue").call(members()).await.unwrap(), ["bob"]);
    let fresh = rooms.get(rooms.new_unique_id());
    assert_eq!(fresh.call(members()).await.unwrap(), Vec::<String>::new());

    // The same data in one database answers the cross-room query in one statement…
    let db_path = dir.path().join("d1.sqlite");
    let d1 =
        Registry::new(RegistrySettings::default(), move |_: &str| Some(DatabaseOptions::new(&db_path).create(true)));
    d1.execute(
        "rooms",
        Request::new(vec![
            Statement::new("CREATE TABLE members (room TEXT, name TEXT)"),
            Statement::new("INSERT INTO members VALUES ('room:red', 'alice'), ('room:blue', 'bob')"),
        ]),
    )
    .await
    .unwrap();
    let one_db = d1
        .execute("rooms", Request::new(vec![Statement::new("SELECT room, name FROM members ORDER BY room, name")]))
        .await
        .unwrap();
    let expected: Vec<(String, Value)> = one_db[0].rows.iter().map(|r| (text(&r[0]), r[1].clone())).collect();
    // …and the fan-out over red and blue returns the same rows, tagged by room.
    let ns = rooms.engine_namespace();
    let ids = vec![rooms.id_from_name("room:red"), rooms.id_from_name("room:blue")];
    let fanned = runtime.engine().fan_out(ns, Some(ids), "SELECT name FROM members", vec![]).await.unwrap();
    let mut got: Vec<(String, Value)> = fanned
        .iter()
        .flat_map(|row| {
            let room = row.object.name.clone().unwrap();
            row.outcome.as_ref().unwrap().rows.iter().map(move |r| (room.clone(), r[0].clone()))
        })
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got, expected);
    let red_only = runtime
        .engine()
        .fan_out(ns, Some(vec![rooms.id_from_name("room:red")]), "SELECT name FROM members", vec![])
        .await
        .unwrap();
    assert_eq!(red_only.len(), 1);
    assert_eq!(red_only[0].outcome.as_ref().unwrap().rows, vec![vec![Value::Text("alice".into())]]);
    runtime.shutdown().await;

    // A new runtime on the same directory reaches the same rooms.
    let again = Runtime::open(dir.path()).unwrap();
    let rooms = again.namespace::<Room>("ROOMS", "chat-Room", ()).unwrap();
    assert_eq!(rooms.get_by_name("room:red").call(members()).await.unwrap(), ["alice"]);
}

fn text(v: &Value) -> String {
    match v {
        Value::Text(t) => t.clone(),
        other => panic!("not text: {other:?}"),
    }
}

/// A counter whose increments read, await, then write: only serial requests keep them all.
struct Counter {
    state: State,
    alarms: Arc<AtomicU32>,
}

#[derive(Clone)]
struct CounterEnv {
    alarms: Arc<AtomicU32>,
    fail_alarms: Arc<AtomicU32>,
}

impl DurableObject for Counter {
    type Env = CounterEnv;

    async fn new(state: State, env: CounterEnv) -> Result<Self> {
        let _ = &env.fail_alarms;
        Ok(Counter { state, alarms: env.alarms })
    }

    async fn alarm(&mut self, info: AlarmInfo) -> Result<()> {
        assert_eq!(self.state.storage().get_alarm().await?, None, "the running alarm reads as unset");
        self.alarms.fetch_add(1, Ordering::SeqCst);
        self.state.storage().put("last_alarm_retry", &info.retry_count).await?;
        if info.retry_count == 0 && self.state.id().name() == Some("flaky") {
            return Err(Error::msg("the first attempt fails"));
        }
        Ok(())
    }
}

impl Counter {
    async fn increment(&mut self) -> Result<u64> {
        let n: u64 = self.state.storage().get("n").await?.unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.state.storage().put("n", &(n + 1)).await?;
        Ok(n + 1)
    }

    async fn write_then_fail(&mut self) -> Result<()> {
        self.state.storage().put("n", &1_000_000u64).await?;
        Err(Error::msg("boom"))
    }
}

fn increment() -> impl for<'a> FnOnce(&'a mut Counter) -> BoxFuture<'a, Result<u64>> + Send {
    |c: &mut Counter| -> BoxFuture<'_, Result<u64>> { Box::pin(c.increment()) }
}

fn counters(runtime: &Runtime) -> (kura::Namespace<Counter>, Arc<AtomicU32>) {
    let alarms = Arc::new(AtomicU32::new(0));
    let env = CounterEnv { alarms: Arc::clone(&alarms), fail_alarms: Arc::new(AtomicU32::new(0)) };
    (runtime.namespace::<Counter>("COUNTERS", "w-Counter", env).unwrap(), alarms)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_to_one_object_never_interleave_and_failures_roll_back() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::open(dir.path()).unwrap();
    let (ns, _) = counters(&runtime);
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let stub = ns.get_by_name("hits");
        tasks.push(tokio::spawn(async move { stub.call(increment()).await.unwrap() }));
    }
    let mut seen: Vec<u64> = Vec::new();
    for t in tasks {
        seen.push(t.await.unwrap());
    }
    seen.sort();
    assert_eq!(seen, (1..=100).collect::<Vec<_>>());
    let failed = ns
        .get_by_name("hits")
        .call(|c: &mut Counter| -> BoxFuture<'_, Result<()>> { Box::pin(c.write_then_fail()) })
        .await;
    assert!(matches!(failed, Err(Error::Object(ref m)) if m == "boom"));
    // The failed request wrote nothing, and the object still answers.
    assert_eq!(ns.get_by_name("hits").call(increment()).await.unwrap(), 101);
    let bad_sql = ns
        .get_by_name("hits")
        .call(|c: &mut Counter| -> BoxFuture<'_, Result<kura::Cursor>> {
            Box::pin(c.state.storage().exec("BEGIN TRANSACTION", vec![]))
        })
        .await;
    assert!(bad_sql.unwrap_err().to_string().contains("transactionSync"));
    assert!(ns.id_from_string("abc").unwrap_err().to_string().contains("must be 64 hex digits"));
    // Storage belongs to the request's own task: a task it spawns is refused, cleanly.
    let spawned = ns
        .get_by_name("hits")
        .call(|c: &mut Counter| -> BoxFuture<'_, Result<Result<()>>> {
            let storage = c.state.storage().clone();
            Box::pin(async move { Ok(tokio::spawn(async move { storage.put("n", &0u64).await }).await.unwrap()) })
        })
        .await
        .unwrap();
    assert!(matches!(spawned, Err(Error::NoRequest)), "{spawned:?}");
    assert_eq!(ns.get_by_name("hits").call(increment()).await.unwrap(), 102, "the refused write changed nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alarms_reach_alarm_and_retry() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::open(dir.path()).unwrap();
    let (ns, alarms) = counters(&runtime);
    let serving = ns.serve_alarms();
    for name in ["steady", "flaky"] {
        ns.get_by_name(name)
            .call(|c: &mut Counter| -> BoxFuture<'_, Result<()>> { Box::pin(c.state.storage().set_alarm(1)) })
            .await
            .unwrap();
    }
    // Each object's alarm delivered and cleared: `names` pending none, `total` calls of alarm().
    let settled = |names: &'static [&'static str], total: u32| {
        let (ns, alarms) = (&ns, &alarms);
        move || async move {
            for name in names {
                let pending = ns
                    .get_by_name(name)
                    .call(|c: &mut Counter| -> BoxFuture<'_, Result<Option<i64>>> {
                        Box::pin(c.state.storage().get_alarm())
                    })
                    .await
                    .unwrap();
                if pending.is_some() {
                    return None;
                }
            }
            (alarms.load(Ordering::SeqCst) >= total).then_some(())
        }
    };
    kura_testkit::poll("both alarms delivered and cleared", Duration::from_secs(15), settled(&["steady", "flaky"], 3))
        .await;
    // A sentinel set now and delivered: a second delivery of either, had one been scheduled,
    // would have come by then.
    ns.get_by_name("sentinel")
        .call(|c: &mut Counter| -> BoxFuture<'_, Result<()>> { Box::pin(c.state.storage().set_alarm(1)) })
        .await
        .unwrap();
    kura_testkit::poll("the sentinel delivered", Duration::from_secs(15), settled(&["sentinel"], 4)).await;
    assert_eq!(alarms.load(Ordering::SeqCst), 4, "steady once, flaky twice, the sentinel once");
    let retry: Option<u32> = ns
        .get_by_name("flaky")
        .call(|c: &mut Counter| -> BoxFuture<'_, Result<Option<u32>>> {
            Box::pin(c.state.storage().get("last_alarm_retry"))
        })
        .await
        .unwrap();
    assert_eq!(retry, Some(1));
    serving.abort();
}

/// The object's bookmark now, asked for in a request of its own.
async fn current_bookmark(stub: &kura::Stub<Counter>) -> kura::Bookmark {
    stub.call(|c: &mut Counter| -> BoxFuture<'_, Result<kura::Bookmark>> {
        Box::pin(c.state.storage().get_current_bookmark())
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn point_in_time_recovery_through_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::open(dir.path()).unwrap();
    let (ns, _) = counters(&runtime);
    let stub = ns.get_by_name("pitr");
    stub.call(increment()).await.unwrap();
    let bookmark = current_bookmark(&stub).await;
    stub.call(increment()).await.unwrap();
    let undo = stub
        .call(move |c: &mut Counter| -> BoxFuture<'_, Result<kura::Bookmark>> {
            Box::pin(c.state.storage().on_next_session_restore_bookmark(bookmark))
        })
        .await
        .unwrap();
    assert_eq!(stub.call(increment()).await.unwrap(), 2, "restored to n = 1");
    stub.call(move |c: &mut Counter| -> BoxFuture<'_, Result<kura::Bookmark>> {
        Box::pin(c.state.storage().on_next_session_restore_bookmark(undo))
    })
    .await
    .unwrap();
    assert_eq!(stub.call(increment()).await.unwrap(), 3, "the restore was undone (n = 2)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_caller_stops_waiting_ends_whole() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::open(dir.path()).unwrap();
    let (ns, _) = counters(&runtime);
    let stub = ns.get_by_name("abandoned");
    let late_write = stub.call(|c: &mut Counter| -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            c.state.storage().put("early", &1u64).await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            c.state.storage().put("late", &2u64).await
        })
    });
    assert!(tokio::time::timeout(Duration::from_millis(30), late_write).await.is_err(), "the caller gave up");
    let (early, late) = stub
        .call(|c: &mut Counter| -> BoxFuture<'_, Result<(Option<u64>, Option<u64>)>> {
            Box::pin(async move { Ok((c.state.storage().get("early").await?, c.state.storage().get("late").await?)) })
        })
        .await
        .unwrap();
    assert_eq!((early, late), (Some(1), Some(2)), "the abandoned request ran to its end and committed");

    // A restore asked for by a request whose caller left is applied before the next request.
    stub.call(increment()).await.unwrap();
    let bookmark = current_bookmark(&stub).await;
    stub.call(increment()).await.unwrap();
    let restoring = stub.call(move |c: &mut Counter| -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            c.state.storage().on_next_session_restore_bookmark(bookmark).await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(())
        })
    });
    assert!(tokio::time::timeout(Duration::from_millis(30), restoring).await.is_err(), "the caller gave up");
    assert_eq!(stub.call(increment()).await.unwrap(), 2, "restored to n = 1 before this request");
}

/// Resident memory of this process, in bytes (Linux).
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().trim_end_matches(" kB");
    kib.trim().parse::<u64>().unwrap() * 1024
}

/// Touches `range`'s counters from 8 tasks at once, checking the caps after each request;
/// answers the counters' values.
async fn touch_all(ns: &kura::Namespace<Counter>, runtime: &Runtime, range: std::ops::Range<u64>) -> Vec<u64> {
    let next = Arc::new(std::sync::atomic::AtomicU64::new(range.start));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (ns, runtime, next, end) = (ns.clone(), runtime.clone(), Arc::clone(&next), range.end);
            tokio::spawn(async move {
                let mut seen = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= end {
                        return seen;
                    }
                    seen.push(ns.get_by_name(&format!("c{i}")).call(increment()).await.unwrap());
                    assert!(runtime.engine().open_objects() <= 64, "{} files open", runtime.engine().open_objects());
                    assert!(ns.instances() <= 500 + 8, "{} instances", ns.instances());
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_objects_stay_within_their_caps() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings =
        RuntimeSettings { max_instances: 500, idle_timeout: Duration::from_secs(60), ..Default::default() };
    settings.engine.registry.max_open = 64;
    let runtime = Runtime::open_with(dir.path(), settings).unwrap();
    let (ns, _) = counters(&runtime);
    let objects = 20_000u64;
    // The caps are full after the first few thousand; from then on memory must not grow with
    // the number of objects.
    assert!(touch_all(&ns, &runtime, 0..4_000).await.iter().all(|n| *n == 1));
    let warm = resident_bytes();
    assert!(touch_all(&ns, &runtime, 4_000..objects).await.iter().all(|n| *n == 1));
    let grown = resident_bytes().saturating_sub(warm);
    assert!(grown < 48 << 20, "16,000 more objects grew memory by {} MiB", grown >> 20);
    // Every object still answers with its data.
    let second = touch_all(&ns, &runtime, 0..objects).await;
    assert_eq!(second.len() as u64, objects);
    assert!(second.iter().all(|n| *n == 2), "every counter kept its first increment");
    assert_eq!(runtime.engine().count(ns.engine_namespace()).await.unwrap(), objects);
}

/// Requests run on their object's thread; timers they await are driven by the caller's
/// runtime, a single-threaded one too.
#[tokio::test(flavor = "current_thread")]
async fn requests_work_from_a_current_thread_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::open(dir.path()).unwrap();
    let (ns, _) = counters(&runtime);
    for expected in 1..=3 {
        assert_eq!(ns.get_by_name("single").call(increment()).await.unwrap(), expected);
    }
    let ticks = ns
        .get_by_name("single")
        .call(|_: &mut Counter| -> BoxFuture<'_, Result<u32>> {
            Box::pin(async {
                let spawned = tokio::spawn(async { 7 });
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok(spawned.await.unwrap())
            })
        })
        .await
        .unwrap();
    assert_eq!(ticks, 7);
}

/// One object's storage, carried into another object's request, reaches neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_carried_into_another_objects_request_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::open(dir.path()).unwrap();
    let (ns, _) = counters(&runtime);
    let b = ns.get_by_name("b");
    let smuggled = ns
        .get_by_name("a")
        .call(move |a: &mut Counter| -> BoxFuture<'_, Result<Result<()>>> {
            let storage = a.state.storage().clone();
            Box::pin(async move {
                Ok(b.call(move |_: &mut Counter| -> BoxFuture<'_, Result<()>> {
                    Box::pin(async move { storage.put("n", &500u64).await })
                })
                .await)
            })
        })
        .await
        .unwrap();
    assert!(matches!(smuggled, Err(Error::NoRequest)), "{smuggled:?}");
    assert_eq!(ns.get_by_name("b").call(increment()).await.unwrap(), 1, "b was not written");
    assert_eq!(ns.get_by_name("a").call(increment()).await.unwrap(), 1, "nor was a");
}

/// A request that holds its object past the limit is rolled back, and the object goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_the_limit_is_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = RuntimeSettings::default();
    // Long enough for the first request, which creates and opens the object, on a machine busy
    // with the other tests (300 ms was not, once): the limit bounds every request.
    settings.engine.session_idle_limit = Duration::from_secs(3);
    let runtime = Runtime::open_with(dir.path(), settings).unwrap();
    let (ns, _) = counters(&runtime);
    assert_eq!(ns.get_by_name("slow").call(increment()).await.unwrap(), 1);
    let stuck = ns
        .get_by_name("slow")
        .call(|c: &mut Counter| -> BoxFuture<'_, Result<()>> {
            Box::pin(async move {
                c.state.storage().put("n", &1_000u64).await?;
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok(())
            })
        })
        .await;
    assert!(matches!(stuck, Err(Error::Storage(_))), "{stuck:?}");
    assert!(stuck.unwrap_err().to_string().contains("ran longer than"));
    assert_eq!(ns.get_by_name("slow").call(increment()).await.unwrap(), 2, "the stuck request's write was rolled back");
}
