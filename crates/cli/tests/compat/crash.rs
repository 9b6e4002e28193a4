//! kill -9 under concurrent writes: every acknowledged write survives, and a bookmark taken
//! before the crash restores exactly the state it named.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

use crate::common::{ACCOUNT, Failed, KuraProcess, TOKEN, kura, post_json};

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    fn new(server: &KuraProcess) -> Api {
        Api { http: reqwest::Client::new(), base: format!("{}/accounts/{ACCOUNT}/d1/database", server.api) }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Json>) -> Result<Json, Failed> {
        let mut request = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(Failed::of)?;
        let status = response.status();
        let text = response.text().await.map_err(Failed::of)?;
        let json: Json = serde_json::from_str(&text).map_err(|_| Failed::Refused(format!("{status}: {text}")))?;
        if json["success"] != true {
            return Err(Failed::Refused(format!("{status}: {json}")));
        }
        Ok(json["result"].clone())
    }

    async fn sql(&self, db: &str, sql: &str, params: Json) -> Result<Json, Failed> {
        self.call(reqwest::Method::POST, &format!("/{db}/query"), Some(json!({ "sql": sql, "params": params }))).await
    }

    async fn ids(&self, db: &str) -> BTreeSet<i64> {
        let rows = self.sql(db, "SELECT id FROM t", json!([])).await.unwrap();
        rows[0]["results"].as_array().unwrap().iter().map(|r| r["id"].as_i64().unwrap()).collect()
    }
}

/// The moment of a kill, shared by a test and its clients: how many writes are in flight, whether
/// new ones wait (while the test looks at a paused server), and whether the kill is decided (after
/// which no write begins, so each one in flight began before it).
#[derive(Default)]
struct KillSwitch {
    in_flight: AtomicUsize,
    holding: AtomicBool,
    killing: AtomicBool,
}

impl KillSwitch {
    /// Waits while the test holds writes back; false once the kill is decided.
    async fn may_begin(&self) -> bool {
        while self.holding.load(Ordering::SeqCst) && !self.killing() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        !self.killing()
    }

    fn killing(&self) -> bool {
        self.killing.load(Ordering::SeqCst)
    }

    fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
    }

    fn end(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// Sends the server (`pid`) SIGKILL while writes are in flight: once `at_least` of the
    /// clients' writes are, it freezes the server (SIGSTOP) and gives the answers already sent
    /// time to arrive; a write still unanswered then cannot be answered before the kill lands.
    /// If none is, the server goes on and the wait starts again. (Counting at full speed is not
    /// enough: a group commit answers every write in flight at once, and on a loaded machine it
    /// can land between the count and the signal.) Kills at once when a client stopped: it
    /// failed, and the caller's check of its outcome says why.
    async fn kill<T>(&self, at_least: usize, clients: &[tokio::task::JoinHandle<T>], pid: u32) {
        let signal = |signal| {
            // SAFETY: kill(2) on the server's process id; it touches no memory of ours.
            unsafe { libc::kill(pid as libc::pid_t, signal) };
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let failed = || clients.iter().any(|c| c.is_finished());
        loop {
            while self.in_flight.load(Ordering::SeqCst) < at_least && !failed() {
                assert!(
                    Instant::now() < deadline,
                    "fewer than {at_least} writes were in flight at once when the server was paused"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            self.holding.store(true, Ordering::SeqCst);
            signal(libc::SIGSTOP);
            tokio::time::sleep(Duration::from_millis(300)).await;
            if self.in_flight.load(Ordering::SeqCst) > 0 || failed() {
                self.killing.store(true, Ordering::SeqCst);
                signal(libc::SIGKILL);
                return;
            }
            signal(libc::SIGCONT);
            self.holding.store(false, Ordering::SeqCst);
        }
    }
}

/// What one writer saw: the ids acknowledged, the one in flight when the server died, and why
/// it stopped if not because of the kill.
#[derive(Default)]
struct Writer {
    acked: Vec<i64>,
    in_flight: Option<i64>,
    failure: Option<String>,
}

#[test]
fn kill_9_under_write_load_loses_no_acknowledged_write() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let server = KuraProcess::start();
    let api = Arc::new(Api::new(&server));
    let created = runtime.block_on(api.call(reqwest::Method::POST, "", Some(json!({ "name": "crash" })))).unwrap();
    let db = created["uuid"].as_str().unwrap().to_owned();
    runtime.block_on(api.sql(&db, "CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT)", json!([]))).unwrap();

    let next = Arc::new(AtomicI64::new(0));
    // Each write holds this shared; the test holds it alone to pause every writer.
    let gate = Arc::new(tokio::sync::RwLock::new(()));
    let switch = Arc::new(KillSwitch::default());
    let writers: Vec<_> = (0..8)
        .map(|_| {
            let (api, db, next, gate, switch) = (api.clone(), db.clone(), next.clone(), gate.clone(), switch.clone());
            runtime.spawn(async move {
                let mut writer = Writer::default();
                while switch.may_begin().await {
                    let _writing = gate.read().await;
                    let id = next.fetch_add(1, Ordering::SeqCst);
                    writer.in_flight = Some(id);
                    switch.begin();
                    let written = api.sql(&db, "INSERT INTO t VALUES (?, ?)", json!([id, "x".repeat(200)])).await;
                    switch.end();
                    match written {
                        Ok(_) => writer.acked.push(id),
                        // Never sent: the server was already gone.
                        Err(Failed::NotSent(_)) if switch.killing() => {}
                        // The kill: the write stays in flight.
                        Err(Failed::Gone(_)) if switch.killing() => return writer,
                        Err(e) => {
                            writer.failure = Some(format!("write {id} failed while the server served: {e:?}"));
                            return writer;
                        }
                    }
                    writer.in_flight = None;
                }
                writer
            })
        })
        .collect();
    let (bookmark, at_bookmark) = runtime.block_on(async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        // Pause the writers (each write in flight ends first), note the state and its
        // bookmark, go on.
        let paused = gate.write().await;
        let bookmark = api.call(reqwest::Method::GET, &format!("/{db}/time_travel/bookmark"), None).await.unwrap();
        let bookmark = bookmark["bookmark"].as_str().unwrap().to_owned();
        let at_bookmark = api.ids(&db).await;
        drop(paused);
        tokio::time::sleep(Duration::from_millis(700)).await;
        // kill -9 while writes are in flight: half the writers'.
        switch.kill(4, &writers, server.pid()).await;
        (bookmark, at_bookmark)
    });
    let (dir, data) = server.stop();
    let writers: Vec<Writer> = runtime
        .block_on(async { futures_util::future::join_all(writers).await.into_iter().map(Result::unwrap).collect() });
    let failures: Vec<&String> = writers.iter().filter_map(|w| w.failure.as_ref()).collect();
    assert!(failures.is_empty(), "writes failed before the kill: {failures:?}");
    let acked: BTreeSet<i64> = writers.iter().flat_map(|w| w.acked.iter().copied()).collect();
    let in_flight: BTreeSet<i64> = writers.iter().filter_map(|w| w.in_flight).collect();
    assert!(acked.len() > 50, "the load ran ({} writes acknowledged)", acked.len());
    assert!(!in_flight.is_empty(), "writes were in flight at the kill");

    let server = KuraProcess::start_on(dir, data);
    let api = Api::new(&server);
    runtime.block_on(async {
        let present = api.ids(&db).await;
        let lost: Vec<_> = acked.difference(&present).collect();
        assert!(lost.is_empty(), "acknowledged writes lost in the crash: {lost:?}");
        let unexplained: Vec<_> = present.iter().filter(|id| !acked.contains(id) && !in_flight.contains(id)).collect();
        assert!(unexplained.is_empty(), "rows neither acknowledged nor in flight at the kill: {unexplained:?}");
        let applied = in_flight.iter().filter(|id| present.contains(id)).count();
        eprintln!(
            "kill -9 under write load: {} acknowledged, {} in flight at the kill ({applied} of them applied)",
            acked.len(),
            in_flight.len()
        );
        let restored = api
            .call(reqwest::Method::POST, &format!("/{db}/time_travel/restore?bookmark={bookmark}"), None)
            .await
            .unwrap();
        assert_eq!(api.ids(&db).await, at_bookmark, "the bookmark from before the crash restores exactly");
        // And the crash-time state is one restore away.
        let previous = restored["previous_bookmark"].as_str().unwrap();
        api.call(reqwest::Method::POST, &format!("/{db}/time_travel/restore?bookmark={previous}"), None).await.unwrap();
        assert_eq!(api.ids(&db).await, present);
    });
}

/// One uploader's keys: what was last acknowledged for each, what was in flight at the kill,
/// and why it stopped if not because of the kill.
#[derive(Default)]
struct Uploads {
    acknowledged: std::collections::BTreeMap<String, Vec<u8>>,
    in_flight: Option<(String, Vec<u8>)>,
    failure: Option<String>,
}

fn md5_hex(bytes: &[u8]) -> String {
    use md5::Digest;
    hex::encode(md5::Md5::digest(bytes))
}

/// Bodies of varied size, different on every write.
fn body(uploader: usize, n: usize) -> Vec<u8> {
    let size = match n % 4 {
        0 => 17,
        1 => 40_000,
        2 => 300_000,
        _ => 1_500_000 + n * 7,
    };
    let seed = (uploader * 1_000_003 + n * 7919) as u32;
    (0..size as u32).map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 24) as u8).collect()
}

#[test]
fn kill_9_during_uploads_and_overwrites_keeps_every_acknowledged_object() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let server = KuraProcess::start();
    let http = reqwest::Client::new();
    let buckets = format!("{}/accounts/{ACCOUNT}/r2/buckets", server.api);
    let objects = format!("{buckets}/crash-bucket/objects");
    let switch = Arc::new(KillSwitch::default());
    let uploaders = runtime.block_on(async {
        let created = http.post(&buckets).bearer_auth(TOKEN).json(&json!({ "name": "crash-bucket" })).send().await;
        assert!(created.unwrap().status().is_success());
        let mut uploaders = Vec::new();
        for u in 0..6 {
            let (http, objects, switch) = (http.clone(), objects.clone(), switch.clone());
            uploaders.push(tokio::spawn(async move {
                let mut state = Uploads::default();
                for n in 0.. {
                    if !switch.may_begin().await {
                        break;
                    }
                    // Each uploader overwrites its own five keys over and over.
                    let key = format!("u{u}/key-{}", n % 5);
                    let bytes = body(u, n);
                    state.in_flight = Some((key.clone(), bytes.clone()));
                    switch.begin();
                    let sent = http.put(format!("{objects}/{key}")).bearer_auth(TOKEN).body(bytes.clone()).send().await;
                    switch.end();
                    match sent {
                        Ok(r) if r.status().is_success() => {
                            state.acknowledged.insert(key, bytes);
                            state.in_flight = None;
                        }
                        // Never sent: the server was already gone.
                        Err(e) if e.is_connect() && switch.killing() => {
                            state.in_flight = None;
                            break;
                        }
                        // The kill: the upload stays in flight.
                        Err(_) if switch.killing() => break,
                        Err(e) => {
                            state.failure = Some(format!("{key}: no answer while the server served: {e}"));
                            break;
                        }
                        Ok(r) => {
                            let status = r.status();
                            let text = r.text().await.unwrap_or_default();
                            state.failure = Some(format!("{key}: refused while the server served: {status} {text}"));
                            break;
                        }
                    }
                }
                state
            }));
        }
        tokio::time::sleep(Duration::from_millis(2500)).await;
        // kill -9 in the middle of uploads: half the uploaders'.
        switch.kill(3, &uploaders, server.pid()).await;
        uploaders
    });
    let (dir, data) = server.stop();
    let states: Vec<Uploads> = runtime
        .block_on(async { futures_util::future::join_all(uploaders).await.into_iter().map(Result::unwrap).collect() });
    let failures: Vec<&String> = states.iter().filter_map(|s| s.failure.as_ref()).collect();
    assert!(failures.is_empty(), "uploads failed before the kill: {failures:?}");
    let acknowledged: usize = states.iter().map(|s| s.acknowledged.len()).sum();
    assert!(acknowledged >= 10, "the load ran ({acknowledged} keys acknowledged)");
    assert!(states.iter().any(|s| s.in_flight.is_some()), "uploads were in flight at the kill");

    // Besides whatever the crash left, a blob no row names (as a crash between a blob's sync and
    // its row's commit leaves one), so the sweep is seen to work.
    let bucket_dir = std::fs::read_dir(data.join("r2")).unwrap().next().unwrap().unwrap().path();
    let shard = bucket_dir.join("blobs").join("00");
    std::fs::create_dir_all(&shard).unwrap();
    std::fs::write(shard.join("00ffffffffffffffffffffffffffffff"), b"orphan").unwrap();

    let server = KuraProcess::start_on(dir, data.clone());
    let objects = format!("{}/accounts/{ACCOUNT}/r2/buckets/crash-bucket/objects", server.api);
    runtime.block_on(async {
        for state in &states {
            for (key, acked) in &state.acknowledged {
                let got = http.get(format!("{objects}/{key}")).bearer_auth(TOKEN).send().await.unwrap();
                assert!(got.status().is_success(), "{key} was acknowledged and is gone");
                let got = got.bytes().await.unwrap();
                let in_flight = state.in_flight.as_ref().filter(|(k, _)| k == key).map(|(_, b)| b.as_slice());
                assert!(
                    got.as_ref() == acked.as_slice() || Some(got.as_ref()) == in_flight,
                    "{key} reads back neither its acknowledged bytes nor the write in flight at the crash"
                );
            }
        }
        // Every listed key reads back whole, with the bytes its ETag names.
        let listing: Json = http.get(&objects).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap();
        let listed = listing["result"].as_array().unwrap();
        let listed_keys: BTreeSet<&str> = listed.iter().map(|o| o["key"].as_str().unwrap()).collect();
        for state in &states {
            for key in state.acknowledged.keys() {
                assert!(listed_keys.contains(key.as_str()), "{key} is acknowledged but not listed");
            }
        }
        // Every listed object reads back whole, with the bytes its ETag names, and those are
        // what was acknowledged for its key or the upload in flight to it at the kill.
        let (mut applied, mut not_applied) = (0, 0);
        for object in listed {
            let key = object["key"].as_str().unwrap();
            let got =
                http.get(format!("{objects}/{key}")).bearer_auth(TOKEN).send().await.unwrap().bytes().await.unwrap();
            assert_eq!(got.len() as u64, object["size"].as_u64().unwrap(), "{key}: whole");
            assert_eq!(md5_hex(&got), object["etag"].as_str().unwrap(), "{key}: the bytes its ETag names");
            let acknowledged = states.iter().find_map(|s| s.acknowledged.get(key));
            let in_flight = states.iter().find_map(|s| s.in_flight.as_ref().filter(|(k, _)| k == key).map(|(_, b)| b));
            assert!(
                acknowledged.is_some_and(|a| a[..] == got[..]) || in_flight.is_some_and(|b| b[..] == got[..]),
                "{key} holds bytes neither acknowledged nor in flight at the kill"
            );
            match in_flight {
                Some(b) if b[..] == got[..] => applied += 1,
                Some(_) => not_applied += 1,
                None => {}
            }
        }
        let unlisted = states.iter().filter(|s| s.in_flight.as_ref().is_some_and(|(k, _)| !listed_keys.contains(k.as_str()))).count();
        eprintln!(
            "kill -9 during uploads: {acknowledged} keys acknowledged; of the uploads in flight, {applied} applied, {} not",
            not_applied + unlisted
        );
        // The start-up sweep leaves exactly one blob per object too large to live in its row
        // (16 KiB and less do): the orphans of the crash are gone.
        let with_blobs = listed.iter().filter(|o| o["size"].as_u64().unwrap() > 16 * 1024).count();
        let count_blobs = || -> usize {
            std::fs::read_dir(bucket_dir.join("blobs"))
                .unwrap()
                .map(|shard| std::fs::read_dir(shard.unwrap().path()).unwrap().count())
                .sum()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while count_blobs() != with_blobs && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert_eq!(count_blobs(), with_blobs, "orphan blobs are swept at start-up");
        assert!(!shard.join("00ffffffffffffffffffffffffffffff").exists());
    });

    // `kura check` finds the swept directory sound, and names a blob lost behind its back.
    let (dir, data) = server.stop();
    let checked = kura(dir.path(), &data, &["check", "--json"], &[]);
    assert!(checked.ok, "{}{}", checked.stdout, checked.stderr);
    assert_eq!(checked.json()["orphan_blobs"], 0);
    let blob = std::fs::read_dir(bucket_dir.join("blobs"))
        .unwrap()
        .flatten()
        .flat_map(|shard| std::fs::read_dir(shard.path()).unwrap().flatten())
        .next()
        .unwrap();
    std::fs::remove_file(blob.path()).unwrap();
    let checked = kura(dir.path(), &data, &["check"], &[]);
    assert!(!checked.ok && checked.stdout.contains("is missing"), "{}{}", checked.stdout, checked.stderr);
}

/// Now, in milliseconds since the epoch (alarms' own clock).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Alarms that arrived before the time they were set for (each kept with `arrived_ms`).
pub(crate) fn early_alarms(received: &[Json]) -> Vec<&Json> {
    received.iter().filter(|a| a["arrived_ms"].as_i64() < a["scheduledTime"].as_i64()).collect()
}

/// A tiny HTTP receiver for alarm POSTs: answers 200 to each and keeps the JSON bodies, each
/// with the time it arrived (`arrived_ms`).
pub(crate) fn alarm_receiver() -> (String, Arc<std::sync::Mutex<Vec<Json>>>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/alarm", listener.local_addr().unwrap());
    let received = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = Arc::clone(&received);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_ok()
                && let Ok(json) = serde_json::from_slice::<Json>(&body)
            {
                let mut json = json;
                // When it arrived, to hold against the time it was set for.
                json["arrived_ms"] = Json::from(now_ms());
                sink.lock().unwrap().push(json);
            }
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    (url, received)
}

#[test]
fn durable_object_alarms_survive_kill_9() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (alarm_url, received) = alarm_receiver();
    let server = KuraProcess::start();
    let http = reqwest::Client::new();
    let namespaces = format!("{}/accounts/{ACCOUNT}/workers/durable_objects/namespaces", server.api);
    let call = |base: String, path: String, body: Json| {
        let http = http.clone();
        async move {
            let answer = post_json(&http, &format!("{base}{path}"), &body).await;
            assert_eq!(answer["success"], true, "{answer}");
            answer["result"].clone()
        }
    };
    // One alarm falls due while the server is down, the other after it is back.
    let (early, late) = (now_ms() + 3_000, now_ms() + 8_000);
    runtime.block_on(async {
        call(namespaces.clone(), String::new(), json!({ "name": "TIMERS", "alarm_url": alarm_url })).await;
        for (object, time) in [("early", early), ("late", late)] {
            let ops = json!({ "operations": [{ "op": "set_alarm", "time": time }] });
            call(namespaces.clone(), format!("/TIMERS/objects/{object}/batch"), ops).await;
        }
    });
    // Nothing fires before its time: watched until just before the early one is due.
    while now_ms() < early - 500 {
        assert!(
            received.lock().unwrap().is_empty(),
            "an alarm fired before it was due: {:?}",
            received.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (dir, data) = server.stop(); // SIGKILL: acknowledged alarms must still fire
    // The early one falls due while the server is down.
    while now_ms() <= early + 200 {
        std::thread::sleep(Duration::from_millis(50));
    }
    let server = KuraProcess::start_on(dir, data);
    let namespaces = format!("{}/accounts/{ACCOUNT}/workers/durable_objects/namespaces", server.api);
    // Each fires, and is cleared once delivered; then a sentinel alarm set after that fires
    // too, so a second delivery of either, had one been scheduled, would have come by then.
    let alarm_of = |object: &'static str, ops: Json| {
        let call = &call;
        let namespaces = namespaces.clone();
        async move { call(namespaces, format!("/TIMERS/objects/{object}/batch"), json!({ "operations": ops })).await }
    };
    let named = |name: &str| received.lock().unwrap().iter().filter(|a| a["name"] == name).count();
    runtime.block_on(async {
        kura_testkit::poll("both alarms delivered and cleared", Duration::from_secs(30), || async {
            let cleared = alarm_of("early", json!([{ "op": "get_alarm" }])).await["results"][0].is_null()
                && alarm_of("late", json!([{ "op": "get_alarm" }])).await["results"][0].is_null();
            (named("early") >= 1 && named("late") >= 1 && cleared).then_some(())
        })
        .await;
        alarm_of("sentinel", json!([{ "op": "set_alarm", "time": now_ms() + 300 }])).await;
        kura_testkit::poll("the sentinel alarm delivered", Duration::from_secs(30), || async {
            (named("sentinel") == 1).then_some(())
        })
        .await;
    });
    let got: Vec<Json> = received.lock().unwrap().iter().filter(|a| a["name"] != "sentinel").cloned().collect();
    let mut fired: Vec<(String, i64)> = got
        .iter()
        .map(|a| (a["name"].as_str().unwrap_or_default().to_owned(), a["scheduledTime"].as_i64().unwrap_or(0)))
        .collect();
    fired.sort();
    assert_eq!(fired, [("early".to_owned(), early), ("late".to_owned(), late)], "each alarm fired once: {got:?}");
    assert!(early_alarms(&received.lock().unwrap()).is_empty(), "alarms before their time: {got:?}");
    assert!(got.iter().all(|a| a["isRetry"] == false));
}
