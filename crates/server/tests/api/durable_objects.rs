//! Durable Objects over HTTP: the seed experiment (rooms by name, a unique room, fan-out against
//! the same data in one D1 database), listing with names, export, point-in-time recovery,
//! alarms POSTed to the namespace's URL, and bad input changing nothing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value as Json, json};

use crate::common::{ACCOUNT, Server};

fn ns_path(suffix: &str) -> String {
    format!("/accounts/{ACCOUNT}/workers/durable_objects/namespaces{suffix}")
}

async fn create_namespace(server: &Server, body: Json) -> Json {
    let (status, body) = server.call(Method::POST, &ns_path(""), Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["result"].clone()
}

async fn batch(server: &Server, object: &str, operations: Json) -> (StatusCode, Json) {
    let object = object.replace(':', "%3A");
    server
        .call(
            Method::POST,
            &ns_path(&format!("/ROOMS/objects/{object}/batch")),
            Some(json!({ "operations": operations })),
        )
        .await
}

async fn rows(server: &Server, object: &str, sql: &str) -> Json {
    let (status, body) = batch(server, object, json!([{ "op": "sql", "sql": sql }])).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["result"]["results"][0]["rows"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_experiment_over_http() {
    let server = Server::start().await;
    let ns = create_namespace(&server, json!({ "name": "ROOMS", "class": "Room", "script": "chat" })).await;
    assert_eq!(ns["unique_key"], "chat-Room");
    for (room, member) in [("room:red", "alice"), ("room:blue", "bob")] {
        let (status, body) = batch(
            &server,
            room,
            json!([
                { "op": "sql", "sql": "CREATE TABLE IF NOT EXISTS members (name TEXT PRIMARY KEY)" },
                { "op": "sql", "sql": "INSERT INTO members VALUES (?)", "params": [member] },
            ]),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    assert_eq!(rows(&server, "room:red", "SELECT name FROM members").await, json!([["alice"]]));
    assert_eq!(rows(&server, "room:blue", "SELECT name FROM members").await, json!([["bob"]]));
    // Reaching room:red by its id finds the same object.
    let (_, listed) = server.call(Method::GET, &ns_path("/ROOMS/objects"), None).await;
    let red = listed["result"].as_array().unwrap().iter().find(|o| o["name"] == "room:red").unwrap().clone();
    assert_eq!(red["hasStoredData"], true);
    let red_id = red["id"].as_str().unwrap().to_owned();
    assert_eq!(rows(&server, &red_id, "SELECT name FROM members").await, json!([["alice"]]));
    // A new unique id is a new, empty object.
    let (_, unique) = server.call(Method::POST, &ns_path("/ROOMS/objects"), None).await;
    let unique = unique["result"]["id"].as_str().unwrap().to_owned();
    assert_eq!(rows(&server, &unique, "SELECT count(*) FROM sqlite_schema").await, json!([[0]]));

    // The same data in one D1 database answers the cross-room query…
    let db = server.create_db("rooms").await;
    server
        .ok(&db, "CREATE TABLE members (room TEXT, name TEXT); INSERT INTO members VALUES ('room:red','alice'), ('room:blue','bob')", json!([]))
        .await;
    let d1 = server.ok(&db, "SELECT room, name FROM members ORDER BY room", json!([])).await;
    let expected: Vec<(String, String)> = d1[0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["room"].as_str().unwrap().to_owned(), r["name"].as_str().unwrap().to_owned()))
        .collect();
    // …and the fan-out over red and blue gives the same rows, tagged with each room.
    let fan_out = |objects: Json| {
        let server = &server;
        async move {
            let (status, body) = server
                .call(
                    Method::POST,
                    &ns_path("/ROOMS/fan_out"),
                    Some(json!({ "sql": "SELECT name FROM members", "objects": objects })),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert_eq!(body["result"]["consistent_snapshot"], false);
            let mut got: Vec<(String, String)> = body["result"]["objects"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|o| {
                    let name = o["name"].as_str().unwrap().to_owned();
                    o["rows"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(move |r| (name.clone(), r[0].as_str().unwrap().to_owned()))
                        .collect::<Vec<_>>()
                })
                .collect();
            got.sort();
            got
        }
    };
    assert_eq!(fan_out(json!(["room:red", "room:blue"])).await, expected);
    assert_eq!(fan_out(json!(["room:red"])).await, vec![("room:red".to_owned(), "alice".to_owned())]);
    // The unique room stored nothing, so it is not one of the namespace's objects; once it
    // stores something (a KV entry, no members table), a fan-out over all objects reports its
    // error instead of hiding it.
    let fan_out_path = ns_path("/ROOMS/fan_out");
    let fan_out_all = || server.call(Method::POST, &fan_out_path, Some(json!({ "sql": "SELECT name FROM members" })));
    let (_, all) = fan_out_all().await;
    assert_eq!(all["result"]["objects"].as_array().unwrap().len(), 2, "{all}");
    let kv = json!({ "operations": [{ "op": "kv_put", "key": "topic", "value": "empty" }] });
    let (status, body) = server.call(Method::POST, &ns_path(&format!("/ROOMS/objects/{unique}/batch")), Some(kv)).await;
    assert_eq!(status, 200, "{body}");
    let (_, all) = fan_out_all().await;
    let objects = all["result"]["objects"].as_array().unwrap();
    assert_eq!(objects.len(), 3, "{all}");
    assert!(objects.iter().any(|o| o["error"].as_str().is_some_and(|e| e.contains("no such table"))), "{all}");

    // Miniflare's explorer query addresses an object by name.
    let (status, body) = server
        .call(
            Method::POST,
            &ns_path("/ROOMS/query"),
            Some(json!({ "durable_object_name": "room:blue", "queries": [{ "sql": "SELECT name FROM members" }] })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["result"][0]["rows"], json!([["bob"]]));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_export_pitr_and_bad_input() {
    let server = Server::start().await;
    create_namespace(&server, json!({ "name": "ROOMS" })).await;
    let (status, body) = batch(
        &server,
        "k",
        json!([
            { "op": "kv_put", "entries": { "a": 1, "b": { "x": [1, 2] } } },
            { "op": "sql", "sql": "CREATE TABLE t (v)" },
            { "op": "sql", "sql": "INSERT INTO t VALUES (1)" },
            { "op": "kv_get", "key": "b" },
            { "op": "kv_list", "prefix": "a" },
            { "op": "database_size" },
        ]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let results = &body["result"]["results"];
    assert_eq!(results[3], json!({ "x": [1, 2] }));
    assert_eq!(results[4], json!({ "a": 1 }));
    assert!(results[5].as_u64().unwrap() > 0);
    // Export holds the SQL rows and the KV entries.
    let response = server
        .http
        .get(format!("{}{}", server.base, ns_path("/ROOMS/objects/k/export")))
        .bearer_auth(crate::common::TOKEN)
        .send()
        .await
        .unwrap();
    let dump = response.text().await.unwrap();
    assert!(dump.contains("INSERT INTO \"t\" (\"v\") VALUES(1);") && dump.contains("_cf_KV"), "{dump}");
    // Bookmark, write, restore, check, undo.
    let (_, b) = server.call(Method::GET, &ns_path("/ROOMS/objects/k/bookmark"), None).await;
    let bookmark = b["result"]["bookmark"].as_str().unwrap().to_owned();
    rows(&server, "k", "INSERT INTO t VALUES (2)").await;
    let (status, restored) =
        server.call(Method::POST, &ns_path("/ROOMS/objects/k/restore"), Some(json!({ "bookmark": bookmark }))).await;
    assert_eq!(status, StatusCode::OK, "{restored}");
    assert_eq!(rows(&server, "k", "SELECT count(*) FROM t").await, json!([[1]]));
    let undo = restored["result"]["previous_bookmark"].as_str().unwrap().to_owned();
    server.call(Method::POST, &ns_path("/ROOMS/objects/k/restore"), Some(json!({ "bookmark": undo }))).await;
    assert_eq!(rows(&server, "k", "SELECT count(*) FROM t").await, json!([[2]]));

    // Bad input: clear errors, nothing changed.
    let fails = |object: &'static str, operations: Json| {
        let server = &server;
        async move {
            let (status, body) = batch(server, object, operations).await;
            assert_eq!(body["success"], false, "{body}");
            (status, body["errors"][0]["message"].as_str().unwrap().to_owned())
        }
    };
    let (status, message) = fails(
        "k",
        json!([{ "op": "sql", "sql": "INSERT INTO t VALUES (3)" }, { "op": "sql", "sql": "BEGIN TRANSACTION" }]),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message.starts_with("To execute a transaction, please use the state.storage.transaction()"), "{message}");
    let (_, message) = fails("k", json!([{ "op": "sql", "sql": "SELECT * FROM _cf_KV" }])).await;
    assert!(message.contains("SQLITE_AUTH"), "{message}");
    let big = "x".repeat(2_100_000);
    let (_, message) = fails("k", json!([{ "op": "sql", "sql": "INSERT INTO t VALUES (?)", "params": [big] }])).await;
    assert!(message.contains("SQLITE_TOOBIG"), "{message}");
    let keys: Vec<String> = (0..129).map(|i| i.to_string()).collect();
    let (_, message) = fails("k", json!([{ "op": "kv_get", "keys": keys }])).await;
    assert_eq!(message, "Maximum number of key value pairs is 128. 129 pairs were provided.");
    let (_, message) = fails("k", json!([{ "op": "set_alarm", "time": 0 }])).await;
    assert_eq!(message, "setAlarm() cannot be called with an alarm time <= 0");
    let bad_id = format!("{}0", "f".repeat(63));
    let (status, message) = fails(Box::leak(bad_id.into_boxed_str()), json!([{ "op": "get_alarm" }])).await;
    assert_eq!(
        (status, message.as_str()),
        (StatusCode::BAD_REQUEST, "Durable Object ID is not valid for this namespace.")
    );
    assert_eq!(rows(&server, "k", "SELECT count(*) FROM t").await, json!([[2]]), "nothing changed");
    let (status, body) =
        server.call(Method::POST, &ns_path("/NOPE/objects/k/batch"), Some(json!({ "operations": [] }))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, _) = server
        .call(Method::POST, &ns_path("/ROOMS/objects/k/batch"), Some(json!({ "operations": [{ "op": "nope" }] })))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alarms_are_posted_to_the_namespace_url_and_retried() {
    let received: Arc<Mutex<Vec<Json>>> = Arc::default();
    let seen = Arc::clone(&received);
    let app = axum::Router::new().route(
        "/alarm",
        axum::routing::post(move |axum::Json(body): axum::Json<Json>| {
            let seen = Arc::clone(&seen);
            async move {
                let mut seen = seen.lock().unwrap();
                seen.push(body.clone());
                // The flaky room fails its first attempt.
                if body["name"] == "room:flaky" && body["retryCount"] == 0 {
                    StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    StatusCode::OK
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/alarm", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let server = Server::start().await;
    create_namespace(&server, json!({ "name": "ROOMS", "alarm_url": url })).await;
    let soon = jiff::Timestamp::now().as_millisecond() + 200;
    for room in ["room:once", "room:flaky"] {
        let (status, body) =
            batch(&server, room, json!([{ "op": "set_alarm", "time": soon }, { "op": "get_alarm" }])).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["result"]["results"][1], json!(soon));
    }
    // The rooms' alarms delivered (`total` in all) and cleared.
    let settled = |rooms: &'static [&'static str], total: usize| {
        let (server, received) = (&server, &received);
        move || async move {
            for room in rooms {
                let (_, body) = batch(server, room, json!([{ "op": "get_alarm" }])).await;
                if !body["result"]["results"][0].is_null() {
                    return None;
                }
            }
            (received.lock().unwrap().len() >= total).then_some(())
        }
    };
    let both = &["room:once", "room:flaky"];
    kura_testkit::poll("both alarms delivered and cleared", Duration::from_secs(15), settled(both, 3)).await;
    // A sentinel set now and delivered: a second delivery of either, had one been scheduled,
    // would have come by then.
    let sentinel = jiff::Timestamp::now().as_millisecond() + 200;
    let (status, body) = batch(&server, "room:sentinel", json!([{ "op": "set_alarm", "time": sentinel }])).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    kura_testkit::poll("the sentinel delivered", Duration::from_secs(15), settled(&["room:sentinel"], 4)).await;
    let calls = received.lock().unwrap().clone();
    let once: Vec<&Json> = calls.iter().filter(|c| c["name"] == "room:once").collect();
    let flaky: Vec<&Json> = calls.iter().filter(|c| c["name"] == "room:flaky").collect();
    assert_eq!(once.len(), 1, "{calls:?}");
    assert_eq!(once[0]["scheduledTime"], json!(soon));
    assert_eq!(once[0]["namespace"], "ROOMS");
    assert_eq!(flaky.len(), 2, "{calls:?}");
    assert_eq!((flaky[0]["isRetry"].clone(), flaky[1]["isRetry"].clone()), (json!(false), json!(true)));
    let (_, body) = batch(&server, "room:once", json!([{ "op": "get_alarm" }])).await;
    assert_eq!(body["result"]["results"][0], Json::Null, "a delivered alarm is gone");
    server.stop().await;
}

/// A listing asked with a trailing slash answers as without one (Cloudflare's API does); an R2
/// object's key keeps its trailing slash.
#[tokio::test]
async fn a_trailing_slash_names_the_same_listing_but_an_r2_key_keeps_its_own() {
    let server = Server::start().await;
    create_namespace(&server, json!({ "name": "ROOMS" })).await;
    let (plain, listed) = server.call(Method::GET, &ns_path(""), None).await;
    let (slashed, listed_with_slash) = server.call(Method::GET, &ns_path("/"), None).await;
    assert_eq!((plain, slashed), (StatusCode::OK, StatusCode::OK), "{listed_with_slash}");
    assert_eq!(listed["result"], listed_with_slash["result"]);

    let buckets = format!("/accounts/{ACCOUNT}/r2/buckets");
    let (status, body) = server.call(Method::POST, &buckets, Some(json!({ "name": "keys" }))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let object = |key: &str| format!("{}{buckets}/keys/objects/{key}", server.base);
    let put = |key: &str, body: &'static str| server.http.put(object(key)).bearer_auth(crate::common::TOKEN).body(body);
    assert!(put("dir/", "the folder marker").send().await.unwrap().status().is_success());
    assert!(put("dir", "the file").send().await.unwrap().status().is_success());
    let get = |key: &str| server.http.get(object(key)).bearer_auth(crate::common::TOKEN).send();
    assert_eq!(get("dir/").await.unwrap().text().await.unwrap(), "the folder marker");
    assert_eq!(get("dir").await.unwrap().text().await.unwrap(), "the file");
}
