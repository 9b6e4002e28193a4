//! `/query` and `/raw`: statements, batches, parameters and types, results and meta, errors and
//! atomicity, malformed bodies.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::common::{Server, first_row};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_statement_sql_gives_one_result_each() {
    let server = Server::start().await;
    let db = server.create_db("q").await;
    let results = server.ok(&db, "SELECT 1 AS one; SELECT 'a;b' AS two", json!([])).await;
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["results"], json!([{"one": 1}]));
    assert_eq!(results[1]["results"], json!([{"two": "a;b"}]));
    let meta = &results[0]["meta"];
    for key in [
        "served_by",
        "served_by_primary",
        "duration",
        "changes",
        "last_row_id",
        "changed_db",
        "size_after",
        "rows_read",
        "rows_written",
    ] {
        assert!(meta.get(key).is_some(), "meta.{key} missing: {meta}");
    }
    assert!(meta["timings"]["sql_duration_ms"].is_number());

    let (status, body) = server
        .call(Method::POST, &server.d1(&format!("/{db}/raw")), Some(json!({"sql": "SELECT 1 AS a, 2 AS a"})))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["result"][0]["results"], json!({"columns": ["a", "a"], "rows": [[1, 2]]}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameters_bind_as_d1_binds_them_and_values_round_trip() {
    let server = Server::start().await;
    let db = server.create_db("types").await;
    server.ok(&db, "CREATE TABLE v (i, r, t, b, n)", json!([])).await;
    server
        .ok(&db, "INSERT INTO v VALUES (?, ?, ?, ?, ?)", json!([42, 1.5, "quote ' and \"\nnewline", [0, 1, 255], null]))
        .await;
    let row = server
        .ok(&db, "SELECT i, typeof(i) AS ti, r, typeof(r) AS tr, t, b, typeof(b) AS tb, n FROM v", json!([]))
        .await;
    assert_eq!(
        first_row(&row),
        &json!({"i": 42, "ti": "integer", "r": 1.5, "tr": "real", "t": "quote ' and \"\nnewline", "b": [0, 1, 255], "tb": "blob", "n": null})
    );
    let row = server.ok(&db, "SELECT ?1 + 1 AS next, ?2 AS flag", json!([9007199254740991i64, true])).await;
    assert_eq!(first_row(&row), &json!({"next": 9007199254740992i64, "flag": 1}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_atomic() {
    let server = Server::start().await;
    let db = server.create_db("batch").await;
    server.ok(&db, "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)", json!([])).await;
    let path = server.d1(&format!("/{db}/query"));
    let batch = json!({"batch": [
        {"sql": "INSERT INTO t (id, v) VALUES (?, ?)", "params": [1, "a"]},
        {"sql": "INSERT INTO t (id, v) VALUES (?, ?)", "params": [2, "b"]},
        {"sql": "SELECT count(*) AS n FROM t"},
    ]});
    let (status, body) = server.call(Method::POST, &path, Some(batch)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["result"].as_array().unwrap().len(), 3);
    assert_eq!(body["result"][2]["results"][0]["n"], 2);

    let failing = json!({"batch": [
        {"sql": "INSERT INTO t (id, v) VALUES (3, 'c')"},
        {"sql": "INSERT INTO t (id, v) VALUES (4, NULL)"},
    ]});
    let (status, body) = server.call(Method::POST, &path, Some(failing)).await;
    assert_eq!((status, body["errors"][0]["code"].as_i64()), (StatusCode::BAD_REQUEST, Some(7500)));
    assert_eq!(
        body["errors"][0]["message"],
        "NOT NULL constraint failed: t.v: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_NOTNULL)"
    );
    let (_, _, message) =
        server.fails(&db, "INSERT INTO t (id, v) VALUES (5, 'e'); INSERT INTO nope VALUES (1)", json!([])).await;
    assert_eq!(message, "no such table: nope: SQLITE_ERROR");
    let count = server.ok(&db, "SELECT count(*) AS n FROM t", json!([])).await;
    assert_eq!(first_row(&count)["n"], 2, "nothing of the failed batches remains");

    let (_, _, message) = server.call(Method::POST, &path, Some(json!({"batch": []}))).await.1["errors"][0]["message"]
        .as_str()
        .map(|m| (0, 0, m.to_owned()))
        .unwrap();
    assert_eq!(message, "No SQL statements detected.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_errors_read_like_d1() {
    let server = Server::start().await;
    let db = server.create_db("errors").await;
    let (status, code, message) = server.fails(&db, "SELECT * FROM nope", json!([])).await;
    assert_eq!((status, code, message.as_str()), (StatusCode::BAD_REQUEST, 7500, "no such table: nope: SQLITE_ERROR"));
    let (_, _, message) = server.fails(&db, "SELEKT 1", json!([])).await;
    assert_eq!(message, "near \"SELEKT\": syntax error at offset 0: SQLITE_ERROR");
    let (_, _, message) = server.fails(&db, "BEGIN TRANSACTION", json!([])).await;
    assert!(message.starts_with("To execute a transaction, please use the state.storage.transaction()"), "{message}");
    let (_, _, message) = server.fails(&db, "CREATE TABLE _cf_x (a)", json!([])).await;
    assert_eq!(message, "not authorized: SQLITE_AUTH");
    let (_, _, message) = server.fails(&db, "PRAGMA user_version = 3", json!([])).await;
    assert_eq!(message, "not authorized: SQLITE_AUTH");
    let (_, _, message) = server.fails(&db, "ATTACH DATABASE 'x.db' AS x", json!([])).await;
    assert!(message.ends_with("SQLITE_AUTH") || message.contains("not authorized"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_are_4xx_and_change_nothing() {
    let server = Server::start().await;
    let db = server.create_db("malformed").await;
    server.ok(&db, "CREATE TABLE t (x)", json!([])).await;
    let url = format!("{}{}", server.base, server.d1(&format!("/{db}/query")));
    let bodies = [
        "",
        "{",
        "[]",
        "{\"sql\": 5}",
        "{\"sql\": \"INSERT INTO t VALUES (?)\", \"params\": {\"a\": 1}}",
        "{\"sql\": \"INSERT INTO t VALUES (?)\", \"params\": [{\"a\": 1}]}",
        "{\"sql\": \"INSERT INTO t VALUES (?)\", \"params\": [[1, 300]]}",
        "{\"sql\": \"INSERT INTO t VALUES (1)\", \"batch\": []}",
        "{\"batch\": [{\"params\": []}]}",
        "{}",
        "\u{0}\u{1}binary",
    ];
    for body in bodies {
        let response = server.http.post(&url).bearer_auth(crate::common::TOKEN).body(body).send().await.unwrap();
        let status = response.status();
        let json: serde_json::Value = response.json().await.unwrap();
        assert!(status.is_client_error(), "{body:?} → {status}");
        assert_eq!(json["success"], false, "{body:?}");
        assert!(json["errors"][0]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let count = server.ok(&db, "SELECT count(*) AS n FROM t", json!([])).await;
    assert_eq!(first_row(&count)["n"], 0);
}
