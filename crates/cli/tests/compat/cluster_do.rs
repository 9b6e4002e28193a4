//! Durable Objects on three `kura serve` nodes over three Garage nodes and three etcd members:
//! a namespace made through one node is served through every node; the node serving it killed
//! with SIGKILL during requests through all three loses no acknowledged request, the next node
//! rebuilds each object from the store as it reaches it (a bookmark taken before the crash
//! restores exactly there), a fan-out sees every object, and an alarm of another namespace the
//! dead node served fires from the node that adopts that namespace, although no request
//! reaches it.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::{Cluster, TTL_SECONDS};
use crate::common::{ACCOUNT, TOKEN};
use crate::writers::{Outcome, Write, assert_consistent, kill_mid_write};

const OBJECTS: u64 = 4;

fn namespaces(api: &str) -> String {
    format!("{api}/accounts/{ACCOUNT}/workers/durable_objects/namespaces")
}

/// A batch outside the crash: a 503 (the v4 API's "retry", as when a lease renewal came late
/// on a loaded machine) is printed and retried for a few seconds, as a client would.
async fn settled_batch_in(
    client: &reqwest::Client,
    api: &str,
    namespace: &str,
    object: &str,
    operations: Value,
) -> (Value, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match batch_in(client, api, namespace, object, operations.clone()).await {
            Err(e) if e.starts_with("answered 503") && Instant::now() < deadline => {
                eprintln!("a batch on {namespace}/{object} through {api} was refused, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            outcome => return outcome.unwrap(),
        }
    }
}

async fn settled_batch(client: &reqwest::Client, api: &str, object: &str, operations: Value) -> (Value, String) {
    settled_batch_in(client, api, "rooms", object, operations).await
}

async fn batch_in(
    client: &reqwest::Client,
    api: &str,
    namespace: &str,
    object: &str,
    operations: Value,
) -> Result<(Value, String), String> {
    let url = format!("{}/{namespace}/objects/{object}/batch", namespaces(api));
    let sent = client.post(url).bearer_auth(TOKEN).json(&json!({ "operations": operations })).send().await;
    let answer = sent.map_err(|e| format!("no answer: {e}"))?;
    let served_by = crate::writers::served_by(&answer);
    let status = answer.status();
    let body: Value = answer.json().await.map_err(|e| format!("no body: {e}"))?;
    if status.is_success() && body["success"] == true {
        Ok((body["result"]["results"].clone(), served_by))
    } else {
        Err(format!("answered {status}: {body}"))
    }
}

/// POSTs `body` with the admin token and checks the v4 envelope says it succeeded.
async fn post_ok(client: &reqwest::Client, url: String, body: Value) -> Value {
    let answer: Value = client.post(url).bearer_auth(TOKEN).json(&body).send().await.unwrap().json().await.unwrap();
    assert_eq!(answer["success"], true, "{answer}");
    answer
}

/// Requests that each record a unique id in one of the objects.
fn events() -> Write {
    Arc::new(|client, api, id| {
        Box::pin(async move {
            let object = format!("room:{}", id % OBJECTS);
            let operations = json!([
                { "op": "sql", "sql": "CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY)" },
                { "op": "sql", "sql": "INSERT INTO events VALUES (?1)", "params": [id] },
            ]);
            let url = format!("{}/rooms/objects/{object}/batch", namespaces(&api));
            let sent = client.post(url).bearer_auth(TOKEN).json(&json!({ "operations": operations })).send();
            Outcome::of(sent).await
        })
    })
}

/// Every id recorded in the objects, read through `api` with one fan-out.
async fn recorded(client: &reqwest::Client, api: &str) -> BTreeSet<u64> {
    let url = format!("{}/rooms/fan_out", namespaces(api));
    let body = json!({ "sql": "SELECT id FROM events" });
    let answer: Value = client.post(url).bearer_auth(TOKEN).json(&body).send().await.unwrap().json().await.unwrap();
    assert_eq!(answer["success"], true, "{answer}");
    let mut ids = BTreeSet::new();
    let mut objects = 0;
    for object in answer["result"]["objects"].as_array().expect("a fan-out's objects") {
        objects += 1;
        assert!(object["error"].is_null(), "every object answers: {object}");
        for row in object["rows"].as_array().unwrap() {
            ids.insert(row[0].as_u64().unwrap());
        }
    }
    assert_eq!(objects, OBJECTS as usize, "every object is listed: {answer}");
    ids
}

/// A minimal HTTP endpoint for alarm deliveries: it answers 200 and keeps each body.
async fn alarm_receiver() -> (String, Arc<Mutex<Vec<Value>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/alarm", listener.local_addr().unwrap());
    let received = Arc::new(Mutex::new(Vec::new()));
    let kept = received.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut data = Vec::new();
                let mut buffer = [0u8; 4096];
                loop {
                    let Ok(n) = socket.read(&mut buffer).await else { return };
                    if n == 0 {
                        return;
                    }
                    data.extend_from_slice(&buffer[..n]);
                    let text = String::from_utf8_lossy(&data).into_owned();
                    let Some((head, body)) = text.split_once("\r\n\r\n") else { continue };
                    let length = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned())
                        })
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    if body.len() < length {
                        continue;
                    }
                    if let Ok(alarm) = serde_json::from_str::<Value>(&body[..length]) {
                        kept.lock().unwrap().push(alarm);
                    }
                    let _ =
                        socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
                    return;
                }
            });
        }
    });
    (url, received)
}

#[test]
fn three_nodes_serve_durable_objects_through_a_kill_with_alarms_adopted() {
    let mut cluster = Cluster::start();
    let apis: Vec<String> = (0..3).map(|i| cluster.node(i).api.clone()).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let client = reqwest::Client::new();
    let (alarm_url, alarms) = runtime.block_on(alarm_receiver());

    // Namespaces made through node 2, used through the others.
    runtime.block_on(async {
        for (name, class) in [("rooms", "Room"), ("timers", "Timer")] {
            post_ok(&client, namespaces(&apis[2]), json!({ "name": name, "class": class, "alarm_url": alarm_url }))
                .await;
        }
        for i in 0..OBJECTS {
            let (_, served_by) = settled_batch(
                &client,
                &apis[(i as usize) % 3],
                &format!("room:{i}"),
                json!([{ "op": "sql", "sql": "CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY)" }]),
            )
            .await;
            assert!(served_by.starts_with("node"), "{served_by}");
        }
    });
    // A token made over HTTP through one node works through another (the catalog is the
    // cluster's), within its scope; revoked through a third, it is refused everywhere soon.
    runtime.block_on(async {
        let made = post_ok(
            &client,
            format!("{}/accounts/{ACCOUNT}/tokens", apis[0]),
            json!({ "name": "reader", "scope": "do:read" }),
        )
        .await;
        let (id, secret) =
            (made["result"]["id"].as_str().unwrap().to_owned(), made["result"]["value"].as_str().unwrap().to_owned());
        // Through another node within a catalog refresh: a lookup that finds nothing usually
        // brings the new copy in at once, but not always (a race under investigation), so the
        // bound checked is the refresh's.
        let deadline = Instant::now() + Duration::from_secs(2);
        let made_at = Instant::now();
        loop {
            let status = client.get(namespaces(&apis[1])).bearer_auth(&secret).send().await.unwrap().status();
            if status == 200 {
                eprintln!("the new token was accepted through another node after {:?}", made_at.elapsed());
                break;
            }
            eprintln!("the new token was refused through another node: {status}");
            assert!(Instant::now() < deadline, "the new token is refused through another node ({status})");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let url = format!("{}/rooms/objects/room:0/batch", namespaces(&apis[2]));
        let write = json!({ "operations": [{ "op": "sql", "sql": "CREATE TABLE t (x)" }] });
        let refused = client.post(&url).bearer_auth(&secret).json(&write).send().await.unwrap();
        assert_eq!(refused.status(), 403, "a do:read token may not write, through any node");
        let revoked = client
            .delete(format!("{}/accounts/{ACCOUNT}/tokens/{id}", apis[1]))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(revoked.status(), 200);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let status = client.get(namespaces(&apis[2])).bearer_auth(&secret).send().await.unwrap().status();
            if status == 401 {
                break;
            }
            assert!(Instant::now() < deadline, "the revoked token is still accepted by another node ({status})");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });

    let owner = runtime.block_on(async {
        let (_, served_by) = settled_batch(&client, &apis[0], "room:0", json!([{ "op": "get_alarm" }])).await;
        served_by.strip_prefix("node").unwrap().parse::<usize>().unwrap()
    });
    let others: Vec<usize> = (0..3).filter(|&i| i != owner).collect();

    // Before the crash: an alarm a while ahead in a namespace the same node serves and nothing
    // else reaches, and a bookmark of an object.
    let alarm_at = runtime.block_on(async {
        let at = kura_do::now_ms() + (TTL_SECONDS as i64 + 12) * 1000;
        let set = json!([{ "op": "set_alarm", "time": at }]);
        let (_, served_by) = settled_batch_in(&client, &apis[owner], "timers", "ticker", set).await;
        assert_eq!(served_by, format!("node{owner}"), "the dying node serves the timers too");
        let first = json!([
            { "op": "sql", "sql": "CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY)" },
            { "op": "sql", "sql": "INSERT INTO events VALUES (1), (2), (3)" },
        ]);
        settled_batch(&client, &apis[others[1]], "room:0", first).await;
        at
    });
    let bookmark = runtime.block_on(async {
        let url = format!("{}/rooms/objects/room:0/bookmark", namespaces(&apis[others[0]]));
        let answer: Value = client.get(url).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap();
        answer["result"]["bookmark"].as_str().expect("a bookmark").to_owned()
    });

    // kill -9 of the node serving the namespace during requests through every node.
    let (outcomes, _) = runtime.block_on(kill_mid_write(&cluster, owner, apis.clone(), events(), 1_000));
    cluster.nodes[owner] = None;
    for &i in &others {
        let present = runtime.block_on(recorded(&client, &apis[i]));
        let written: BTreeSet<u64> = present.iter().copied().filter(|id| *id >= 1_000).collect();
        assert_consistent(&outcomes, &written, &format!("node {i} after kill -9"));
    }

    // A bookmark taken before the crash restores exactly on the new node.
    runtime.block_on(async {
        let url = format!("{}/rooms/objects/room:0/restore", namespaces(&apis[others[1]]));
        post_ok(&client, url, json!({ "bookmark": bookmark })).await;
        let (rows, _) = settled_batch(
            &client,
            &apis[others[0]],
            "room:0",
            json!([{ "op": "sql", "sql": "SELECT id FROM events ORDER BY id" }]),
        )
        .await;
        assert_eq!(rows[0]["rows"], json!([[1], [2], [3]]), "room:0 as it was at the bookmark");
    });

    // The survivors' metrics count what they shipped and took over.
    let sample = |text: &str, name: &str| -> f64 {
        text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok()).unwrap_or(0.0)
    };
    let (mut takeovers, mut shipments) = (0.0, 0.0);
    for &i in &others {
        let url = apis[i].replace("/client/v4", "/metrics");
        let text = runtime.block_on(async { client.get(url).send().await.unwrap().text().await.unwrap() });
        assert!(text.contains("# TYPE kura_cluster_takeovers_total counter"), "{text}");
        assert_eq!(sample(&text, "kura_cluster_members"), 2.0, "{text}");
        takeovers += sample(&text, "kura_cluster_takeovers_total{kind=\"do-index\"}");
        shipments += sample(&text, "kura_cluster_shipments_total{kind=\"do\"}");
    }
    assert!(
        takeovers >= 1.0 && shipments >= 1.0,
        "a survivor took the namespace over ({takeovers}) and shipped ({shipments})"
    );

    // The alarm fires although nothing reached the namespace for it: a live node adopted it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let fired: Vec<Value> = alarms.lock().unwrap().clone();
        if let Some(alarm) = fired.iter().find(|a| a["name"] == "ticker") {
            assert_eq!(alarm["scheduledTime"], alarm_at, "{alarm}");
            eprintln!("the alarm fired {} ms after its time", kura_do::now_ms() - alarm_at);
            break;
        }
        assert!(Instant::now() < deadline, "the alarm set before the crash never fired: {fired:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
