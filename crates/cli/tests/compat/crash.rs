//! kill -9 under concurrent writes: every acknowledged write survives, and a bookmark taken
//! before the crash restores exactly the state it named.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use serde_json::{Value as Json, json};

use crate::common::{ACCOUNT, KuraProcess, TOKEN, kura, post_json};

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    fn new(server: &KuraProcess) -> Api {
        Api { http: reqwest::Client::new(), base: format!("{}/accounts/{ACCOUNT}/d1/database", server.api) }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Json>) -> Result<Json, String> {
        let mut request = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| e.to_string())?;
        let json: Json = response.json().await.map_err(|e| e.to_string())?;
        if json["success"] != true {
            return Err(json.to_string());
        }
        Ok(json["result"].clone())
    }

    async fn sql(&self, db: &str, sql: &str, params: Json) -> Result<Json, String> {
        self.call(reqwest::Method::POST, &format!("/{db}/query"), Some(json!({ "sql": sql, "params": params }))).await
    }

    async fn ids(&self, db: &str) -> BTreeSet<i64> {
        let rows = self.sql(db, "SELECT id FROM t", json!([])).await.unwrap();
        rows[0]["results"].as_array().unwrap().iter().map(|r| r["id"].as_i64().unwrap()).collect()
    }
}

#[test]
fn kill_9_under_write_load_loses_no_acknowledged_write() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let server = KuraProcess::start();
    let api = Arc::new(Api::new(&server));
    let (db, bookmark, at_bookmark, acknowledged) = runtime.block_on(async {
        let created = api.call(reqwest::Method::POST, "", Some(json!({ "name": "crash" }))).await.unwrap();
        let db = created["uuid"].as_str().unwrap().to_owned();
        api.sql(&db, "CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT)", json!([])).await.unwrap();

        let next = Arc::new(AtomicI64::new(0));
        let paused = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let mut writers = Vec::new();
        for _ in 0..8 {
            let (api, db, next, paused, stop) = (api.clone(), db.clone(), next.clone(), paused.clone(), stop.clone());
            writers.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    if paused.load(Ordering::SeqCst) {
                        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                        continue;
                    }
                    let id = next.fetch_add(1, Ordering::SeqCst);
                    match api.sql(&db, "INSERT INTO t VALUES (?, ?)", json!([id, "x".repeat(200)])).await {
                        Ok(_) => acked.push(id),
                        Err(_) => break, // the server is gone
                    }
                }
                acked
            }));
        }
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
        // Pause the writers, note the state and its bookmark, go on.
        paused.store(true, Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let bookmark = api.call(reqwest::Method::GET, &format!("/{db}/time_travel/bookmark"), None).await.unwrap();
        let bookmark = bookmark["bookmark"].as_str().unwrap().to_owned();
        let at_bookmark = api.ids(&db).await;
        paused.store(false, Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
        (db, bookmark, at_bookmark, (writers, stop))
    });
    // kill -9 while the writers are still writing.
    let (dir, data) = server.stop();
    let (writers, stop) = acknowledged;
    stop.store(true, Ordering::SeqCst);
    let acked: BTreeSet<i64> = runtime.block_on(async {
        let mut all = BTreeSet::new();
        for w in writers {
            all.extend(w.await.unwrap());
        }
        all
    });
    assert!(acked.len() > 50, "the load ran ({} writes acknowledged)", acked.len());

    let server = KuraProcess::start_on(dir, data);
    let api = Api::new(&server);
    runtime.block_on(async {
        let present = api.ids(&db).await;
        let lost: Vec<_> = acked.difference(&present).collect();
        assert!(lost.is_empty(), "acknowledged writes lost in the crash: {lost:?}");
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

/// One uploader's keys: what was last acknowledged for each, and what was in flight.
#[derive(Default)]
struct Uploads {
    acknowledged: std::collections::BTreeMap<String, Vec<u8>>,
    in_flight: Option<(String, Vec<u8>)>,
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
    let stop = Arc::new(AtomicBool::new(false));
    let uploaders = runtime.block_on(async {
        let created = http.post(&buckets).bearer_auth(TOKEN).json(&json!({ "name": "crash-bucket" })).send().await;
        assert!(created.unwrap().status().is_success());
        let mut uploaders = Vec::new();
        for u in 0..6 {
            let (http, objects, stop) = (http.clone(), objects.clone(), stop.clone());
            uploaders.push(tokio::spawn(async move {
                let mut state = Uploads::default();
                for n in 0.. {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    // Each uploader overwrites its own five keys over and over.
                    let key = format!("u{u}/key-{}", n % 5);
                    let bytes = body(u, n);
                    state.in_flight = Some((key.clone(), bytes.clone()));
                    let sent = http.put(format!("{objects}/{key}")).bearer_auth(TOKEN).body(bytes.clone()).send().await;
                    match sent {
                        Ok(r) if r.status().is_success() => {
                            state.acknowledged.insert(key, bytes);
                            state.in_flight = None;
                        }
                        _ => break, // the server is gone
                    }
                }
                state
            }));
        }
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        uploaders
    });
    // kill -9 in the middle of uploads.
    let (dir, data) = server.stop();
    stop.store(true, Ordering::SeqCst);
    let states: Vec<Uploads> = runtime
        .block_on(async { futures_util::future::join_all(uploaders).await.into_iter().map(Result::unwrap).collect() });
    let acknowledged: usize = states.iter().map(|s| s.acknowledged.len()).sum();
    assert!(acknowledged >= 10, "the load ran ({acknowledged} keys acknowledged)");

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
        for key in &listed_keys {
            let known = states
                .iter()
                .any(|s| s.acknowledged.contains_key(*key) || s.in_flight.as_ref().is_some_and(|(k, _)| k == key));
            assert!(known, "{key} is listed but was never written");
        }
        for object in listed {
            let key = object["key"].as_str().unwrap();
            let got =
                http.get(format!("{objects}/{key}")).bearer_auth(TOKEN).send().await.unwrap().bytes().await.unwrap();
            assert_eq!(got.len() as u64, object["size"].as_u64().unwrap(), "{key}: whole");
            assert_eq!(md5_hex(&got), object["etag"].as_str().unwrap(), "{key}: the bytes its ETag names");
        }
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

/// A tiny HTTP receiver for alarm POSTs: answers 200 to each and keeps the JSON bodies.
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
    let now_ms = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    // One alarm falls due while the server is down, the other after it is back.
    let (early, late) = (now_ms() + 1_500, now_ms() + 6_000);
    runtime.block_on(async {
        call(namespaces.clone(), String::new(), json!({ "name": "TIMERS", "alarm_url": alarm_url })).await;
        for (object, time) in [("early", early), ("late", late)] {
            let ops = json!({ "operations": [{ "op": "set_alarm", "time": time }] });
            call(namespaces.clone(), format!("/TIMERS/objects/{object}/batch"), ops).await;
        }
    });
    let (dir, data) = server.stop(); // SIGKILL: acknowledged alarms must still fire
    std::thread::sleep(std::time::Duration::from_millis(2_000));
    assert!(received.lock().unwrap().is_empty(), "nothing fired while the server was down");
    let server = KuraProcess::start_on(dir, data);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while received.lock().unwrap().len() < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Long enough for a duplicate delivery to show up.
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    let got = received.lock().unwrap().clone();
    let mut fired: Vec<(String, i64)> = got
        .iter()
        .map(|a| (a["name"].as_str().unwrap_or_default().to_owned(), a["scheduledTime"].as_i64().unwrap_or(0)))
        .collect();
    fired.sort();
    assert_eq!(fired, [("early".to_owned(), early), ("late".to_owned(), late)], "each alarm fired once: {got:?}");
    assert!(got.iter().all(|a| a["isRetry"] == false));
    let namespaces = format!("{}/accounts/{ACCOUNT}/workers/durable_objects/namespaces", server.api);
    runtime.block_on(async {
        for object in ["early", "late"] {
            let ops = json!({ "operations": [{ "op": "get_alarm" }] });
            let result = call(namespaces.clone(), format!("/TIMERS/objects/{object}/batch"), ops).await;
            assert_eq!(result["results"][0], Json::Null, "{object}'s alarm is gone once delivered");
        }
    });
}
