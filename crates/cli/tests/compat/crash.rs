//! kill -9 under concurrent writes: every acknowledged write survives, and a bookmark taken
//! before the crash restores exactly the state it named.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use serde_json::{Value as Json, json};

use crate::common::{ACCOUNT, KuraProcess, TOKEN};

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
