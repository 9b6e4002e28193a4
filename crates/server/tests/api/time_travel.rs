//! Time Travel over v4: bookmarks now and for a time, restore and undo, bad input, the restore
//! limit, and scopes.

use kura_catalog::Scope;
use reqwest::{Method, StatusCode};
use serde_json::{Value as Json, json};

use crate::common::{Server, first_row};

async fn bookmark(server: &Server, db: &str, query: &str) -> (StatusCode, Json) {
    server.call(Method::GET, &server.d1(&format!("/{db}/time_travel/bookmark{query}")), None).await
}

async fn restore(server: &Server, db: &str, query: &str) -> (StatusCode, Json) {
    server.call(Method::POST, &server.d1(&format!("/{db}/time_travel/restore{query}")), None).await
}

fn now_iso() -> String {
    jiff::Timestamp::now().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_and_undo_by_bookmark_and_timestamp() {
    let server = Server::start().await;
    let db = server.create_db("tt").await;
    server.ok(&db, "CREATE TABLE t (id INTEGER PRIMARY KEY); INSERT INTO t VALUES (1)", json!([])).await;
    let (status, body) = bookmark(&server, &db, "").await;
    assert_eq!(status, StatusCode::OK);
    let first = body["result"]["bookmark"].as_str().unwrap().to_owned();
    assert_eq!(first.len(), 59);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let between = now_iso();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    server.ok(&db, "INSERT INTO t VALUES (2), (3)", json!([])).await;
    let (_, body) = bookmark(&server, &db, "").await;
    let second = body["result"]["bookmark"].as_str().unwrap().to_owned();
    assert!(second > first);
    let (_, body) = bookmark(&server, &db, &format!("?timestamp={between}")).await;
    assert_eq!(body["result"]["bookmark"], json!(first), "the last commit at or before the time");

    let (status, body) = restore(&server, &db, &format!("?bookmark={first}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["result"]["previous_bookmark"], json!(second));
    assert_eq!(body["result"]["message"], "Database restored successfully");
    let restored = body["result"]["bookmark"].as_str().unwrap().to_owned();
    assert!(restored > second);
    let n = server.ok(&db, "SELECT count(*) AS n FROM t", json!([])).await;
    assert_eq!(first_row(&n)["n"], 1);

    let (status, _) = restore(&server, &db, &format!("?bookmark={second}")).await;
    assert_eq!(status, StatusCode::OK);
    let n = server.ok(&db, "SELECT count(*) AS n FROM t", json!([])).await;
    assert_eq!(first_row(&n)["n"], 3, "undone");

    let (status, _) = restore(&server, &db, &format!("?timestamp={between}")).await;
    assert_eq!(status, StatusCode::OK);
    let n = server.ok(&db, "SELECT count(*) AS n FROM t", json!([])).await;
    assert_eq!(first_row(&n)["n"], 1, "restored by timestamp");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bookmarks_and_timestamps_are_4xx_and_change_nothing() {
    let server = Server::start().await;
    let db = server.create_db("tt").await;
    let other = server.create_db("other").await;
    server.ok(&db, "CREATE TABLE t (x); INSERT INTO t VALUES (1)", json!([])).await;
    let (_, body) = bookmark(&server, &other, "").await;
    let foreign = body["result"]["bookmark"].as_str().unwrap().to_owned();
    let future = (jiff::Timestamp::now() + jiff::SignedDuration::from_hours(2)).to_string();
    let ancient = (jiff::Timestamp::now() - jiff::SignedDuration::from_hours(24 * 40)).to_string();
    for query in [
        "?bookmark=nope".to_owned(),
        "?bookmark=00000000-00000001-00000000-0000000000000000000000000000000Z".to_owned(),
        format!("?bookmark={foreign}"),
        format!("?timestamp={future}"),
        format!("?timestamp={ancient}"),
        "?timestamp=yesterday".to_owned(),
        "".to_owned(),
        format!("?bookmark={foreign}&timestamp={future}"),
    ] {
        let (status, body) = restore(&server, &db, &query).await;
        assert_eq!(
            (status, body["errors"][0]["code"].as_i64()),
            (StatusCode::BAD_REQUEST, Some(7400)),
            "{query}: {body}"
        );
    }
    let (status, _) = bookmark(&server, &db, &format!("?timestamp={future}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let n = server.ok(&db, "SELECT count(*) AS n FROM t", json!([])).await;
    assert_eq!(first_row(&n)["n"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restores_are_limited_and_need_write_access() {
    let server = Server::start().await;
    let db = server.create_db("tt").await;
    server.ok(&db, "CREATE TABLE t (x)", json!([])).await;
    let (_, body) = bookmark(&server, &db, "").await;
    let b = body["result"]["bookmark"].as_str().unwrap().to_owned();

    let reader = server.token(Scope::D1Read);
    let path = server.d1(&format!("/{db}/time_travel/bookmark"));
    assert_eq!(server.call_as(Some(&reader), Method::GET, &path, None).await.0, StatusCode::OK);
    let path = server.d1(&format!("/{db}/time_travel/restore?bookmark={b}"));
    assert_eq!(server.call_as(Some(&reader), Method::POST, &path, None).await.0, StatusCode::FORBIDDEN);

    for i in 0..10 {
        let (status, body) = restore(&server, &db, &format!("?bookmark={b}")).await;
        assert_eq!(status, StatusCode::OK, "restore {i}: {body}");
    }
    let (status, body) = restore(&server, &db, &format!("?bookmark={b}")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(body["errors"][0]["message"].as_str().unwrap().contains("at most 10 per 10 minutes"));
}
