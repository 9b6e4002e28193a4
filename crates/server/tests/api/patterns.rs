//! The concurrency patterns applications build on D1, each as a race over real HTTP.

use std::sync::Arc;

use reqwest::Method;
use serde_json::{Value as Json, json};

use crate::common::{Server, first_row};

fn changes(results: &[Json], i: usize) -> u64 {
    results[i]["meta"]["changes"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_guarded_update_lets_exactly_one_writer_win() {
    let server = Arc::new(Server::start().await);
    let db = server.create_db("docs").await;
    server.ok(&db, "CREATE TABLE docs (id INTEGER PRIMARY KEY, body TEXT, version INTEGER NOT NULL)", json!([])).await;
    for round in 0..20 {
        server.ok(&db, "INSERT OR REPLACE INTO docs VALUES (1, 'draft', 1)", json!([])).await;
        let update = "UPDATE docs SET body = ?, version = version + 1 WHERE id = 1 AND version = ?";
        let (a, b) =
            tokio::join!(server.ok(&db, update, json!(["from a", 1])), server.ok(&db, update, json!(["from b", 1])));
        let mut outcomes = [changes(&a, 0), changes(&b, 0)];
        outcomes.sort();
        assert_eq!(outcomes, [0, 1], "round {round}: exactly one writer wins, the other succeeds with 0 changes");
        assert_eq!(a[0]["success"], true);
        assert_eq!(b[0]["success"], true);
        let row = server.ok(&db, "SELECT body, version FROM docs WHERE id = 1", json!([])).await;
        assert_eq!(first_row(&row)["version"], 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_catches_the_aba_case_a_value_guard_misses() {
    let server = Server::start().await;
    let db = server.create_db("aba").await;
    server.ok(&db, "CREATE TABLE docs (id INTEGER PRIMARY KEY, body TEXT, version INTEGER NOT NULL); INSERT INTO docs VALUES (1, 'A', 1)", json!([])).await;
    // A slow writer read (body 'A', version 1). Meanwhile A → B → A.
    server.ok(&db, "UPDATE docs SET body = 'B', version = version + 1 WHERE id = 1", json!([])).await;
    server.ok(&db, "UPDATE docs SET body = 'A', version = version + 1 WHERE id = 1", json!([])).await;
    let by_value =
        server.ok(&db, "UPDATE docs SET body = 'slow' WHERE id = 1 AND body = 'A' RETURNING body", json!([])).await;
    assert_eq!(changes(&by_value, 0), 1, "guarding on the value is fooled");
    server.ok(&db, "UPDATE docs SET body = 'A' WHERE id = 1", json!([])).await;
    let by_version = server
        .ok(&db, "UPDATE docs SET body = 'slow', version = version + 1 WHERE id = 1 AND version = 1", json!([]))
        .await;
    assert_eq!(changes(&by_version, 0), 0, "guarding on the version is not");
    assert_eq!(by_version[0]["success"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_conflict_do_nothing_deduplicates_concurrent_deliveries() {
    let server = Arc::new(Server::start().await);
    let db = server.create_db("dedup").await;
    server.ok(&db, "CREATE TABLE events (idempotency_key TEXT PRIMARY KEY, payload TEXT)", json!([])).await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let (server, db) = (Arc::clone(&server), db.clone());
        tasks.push(tokio::spawn(async move {
            let r = server
                .ok(
                    &db,
                    "INSERT INTO events VALUES (?, ?) ON CONFLICT DO NOTHING",
                    json!(["evt-1", format!("copy {i}")]),
                )
                .await;
            changes(&r, 0)
        }));
    }
    let mut inserted = 0;
    for t in tasks {
        inserted += t.await.unwrap();
    }
    assert_eq!(inserted, 1);
    let n = server.ok(&db, "SELECT count(*) AS n FROM events", json!([])).await;
    assert_eq!(first_row(&n)["n"], 1);
}

const LEASE: &str = "INSERT INTO leases (name, holder, lease_until, claim_token) VALUES (?1, ?2, ?3, 1)
    ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, lease_until = excluded.lease_until, claim_token = claim_token + 1
    WHERE leases.lease_until < ?4
    RETURNING claim_token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_upsert_and_fencing_tokens() {
    let server = Server::start().await;
    let db = server.create_db("leases").await;
    server.ok(&db, "CREATE TABLE leases (name TEXT PRIMARY KEY, holder TEXT, lease_until INTEGER, claim_token INTEGER NOT NULL);
                    CREATE TABLE output (job TEXT PRIMARY KEY, result TEXT, token INTEGER)", json!([])).await;
    let now = 1_000;
    let first = server.ok(&db, LEASE, json!(["job", "worker-a", now + 30, now])).await;
    assert_eq!(first[0]["results"], json!([{"claim_token": 1}]));
    let while_live = server.ok(&db, LEASE, json!(["job", "worker-b", now + 40, now + 10])).await;
    assert_eq!(while_live[0]["results"], json!([]), "no row while the lease is live");
    let after = server.ok(&db, LEASE, json!(["job", "worker-b", now + 100, now + 31])).await;
    assert_eq!(after[0]["results"], json!([{"claim_token": 2}]), "token + 1 once it expired");

    let fenced = "INSERT INTO output (job, result, token) SELECT ?1, ?2, ?3 WHERE (SELECT claim_token FROM leases WHERE name = ?1) = ?3
                  ON CONFLICT (job) DO UPDATE SET result = excluded.result, token = excluded.token";
    let stale = server.ok(&db, fenced, json!(["job", "from a", 1])).await;
    assert_eq!(changes(&stale, 0), 0, "the stale holder is fenced out");
    let current = server.ok(&db, fenced, json!(["job", "from b", 2])).await;
    assert_eq!(changes(&current, 0), 1);
    let out = server.ok(&db, "SELECT result FROM output", json!([])).await;
    assert_eq!(first_row(&out)["result"], "from b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_is_visible_inside_the_same_batch() {
    let server = Server::start().await;
    let db = server.create_db("changes").await;
    server
        .ok(
            &db,
            "CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER); INSERT INTO t VALUES (1, 0), (2, 0), (3, 5)",
            json!([]),
        )
        .await;
    let batch = json!({"batch": [
        {"sql": "UPDATE t SET n = n + 1 WHERE n = 0"},
        {"sql": "SELECT changes() AS c, last_insert_rowid() AS r"},
    ]});
    let (_, body) = server.call(Method::POST, &server.d1(&format!("/{db}/query")), Some(batch)).await;
    assert_eq!(body["result"][1]["results"][0]["c"], 2);
    assert_eq!(body["result"][0]["meta"]["changes"], 2);
    assert_eq!(body["result"][1]["results"][0]["r"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_seat_booking_never_oversells() {
    const SEATS: i64 = 10;
    const CLIENTS: usize = 32;
    let server = Arc::new(Server::start().await);
    let db = server.create_db("seats").await;
    server
        .ok(
            &db,
            "CREATE TABLE shows (id INTEGER PRIMARY KEY, seats_left INTEGER NOT NULL, version INTEGER NOT NULL);
                  CREATE TABLE bookings (client INTEGER PRIMARY KEY, show INTEGER NOT NULL);
                  INSERT INTO shows VALUES (1, ?, 1)",
            json!([SEATS]),
        )
        .await;
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let (server, db) = (Arc::clone(&server), db.clone());
        tasks.push(tokio::spawn(async move {
            // Read, then write guarded by the version read; on a lost race, read again.
            loop {
                let read = server.ok(&db, "SELECT seats_left, version FROM shows WHERE id = 1", json!([])).await;
                let row = first_row(&read);
                let (left, version) = (row["seats_left"].as_i64().unwrap(), row["version"].as_i64().unwrap());
                if left == 0 {
                    return false;
                }
                let batch = json!({"batch": [
                    {"sql": "UPDATE shows SET seats_left = seats_left - 1, version = version + 1 WHERE id = 1 AND version = ? AND seats_left > 0", "params": [version]},
                    {"sql": "INSERT INTO bookings (client, show) SELECT ?, 1 WHERE changes() = 1", "params": [client]},
                ]});
                let (_, body) = server.call(Method::POST, &server.d1(&format!("/{db}/query")), Some(batch)).await;
                assert_eq!(body["success"], true, "{body}");
                if body["result"][0]["meta"]["changes"] == 1 {
                    return true;
                }
            }
        }));
    }
    let mut booked = 0;
    for t in tasks {
        booked += i64::from(t.await.unwrap());
    }
    assert_eq!(booked, SEATS);
    let state = server
        .ok(&db, "SELECT (SELECT seats_left FROM shows) AS left, (SELECT count(*) FROM bookings) AS booked", json!([]))
        .await;
    assert_eq!(first_row(&state), &json!({"left": 0, "booked": SEATS}));
}
