//! D1's binding protocol (what workerd's `env.DB` sends): one statement or an array, the three
//! result formats, errors as `{"success": false, "error"}`, atomic arrays, the session header,
//! and authentication.

use kura_catalog::Scope;
use reqwest::StatusCode;
use serde_json::{Value as Json, json};

use crate::common::{Server, TOKEN};

struct Answer {
    status: StatusCode,
    session: Option<String>,
    body: Json,
}

async fn post(server: &Server, path: &str, token: &str, headers: &[(&str, &str)], body: Json) -> Answer {
    let mut request = server.http.post(format!("{}{path}", server.root)).bearer_auth(token).json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let session = response.headers().get("x-cf-d1-session-commit-token").map(|v| v.to_str().unwrap().to_owned());
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON ({status}): {text}"));
    Answer { status, session, body }
}

/// As workerd's shim sends it: a fixed URL, the database in a header.
async fn shim(server: &Server, db: &str, endpoint: &str, format: &str, body: Json) -> Answer {
    let path = format!("/{endpoint}?resultsFormat={format}");
    post(server, &path, TOKEN, &[("x-kura-d1-database", db)], body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_formats_and_errors() {
    let server = Server::start().await;
    let db = server.create_db("bound").await;
    let created = shim(
        &server,
        "bound",
        "execute",
        "NONE",
        json!([
            {"sql": "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT, b BLOB)"},
            {"sql": "INSERT INTO t (v, b) VALUES (?, ?)", "params": ["one", [1, 2]]},
        ]),
    )
    .await;
    assert_eq!(created.status, StatusCode::OK, "{}", created.body);
    assert_eq!(created.body.as_array().unwrap().len(), 2);
    assert_eq!(created.body[1]["meta"]["last_row_id"], 1);

    let select = json!({"sql": "SELECT id, v, b FROM t WHERE id = ?", "params": [1]});
    let raw = shim(&server, "bound", "query", "ROWS_AND_COLUMNS", select.clone()).await;
    assert_eq!(raw.body[0]["results"], json!({"columns": ["id", "v", "b"], "rows": [[1, "one", [1, 2]]]}));
    assert_eq!(raw.body[0]["success"], true);
    for format in ["ARRAY_OF_OBJECTS", "NONE", "nonsense"] {
        let objects = shim(&server, "bound", "query", format, select.clone()).await;
        assert_eq!(objects.body[0]["results"], json!([{"id": 1, "v": "one", "b": [1, 2]}]), "{format}");
    }
    // Several statements in one `sql` answer once, for the last.
    let several =
        shim(&server, "bound", "query", "ROWS_AND_COLUMNS", json!({"sql": "SELECT 1 AS a; SELECT 2 AS b"})).await;
    assert_eq!(several.body.as_array().unwrap().len(), 1);
    assert_eq!(several.body[0]["results"]["columns"], json!(["b"]));

    // An array is one transaction: a failing statement undoes the others.
    let failed = shim(
        &server,
        "bound",
        "query",
        "ROWS_AND_COLUMNS",
        json!([
            {"sql": "INSERT INTO t (v) VALUES ('lost')"},
            {"sql": "INSERT INTO nope VALUES (1)"},
        ]),
    )
    .await;
    assert_eq!(failed.body, json!({"success": false, "error": "no such table: nope: SQLITE_ERROR"}));
    let count = shim(&server, "bound", "query", "ROWS_AND_COLUMNS", json!({"sql": "SELECT count(*) FROM t"})).await;
    assert_eq!(count.body[0]["results"]["rows"], json!([[1]]));

    // The database by id, in the path.
    let by_path = post(&server, &format!("/binding/d1/{db}/query"), TOKEN, &[], json!({"sql": "SELECT 7 AS n"})).await;
    assert_eq!(by_path.body[0]["results"], json!([{"n": 7}]));

    for (body, why) in [
        (json!({"params": []}), "no sql"),
        (json!({"sql": "SELECT ?", "params": [{"an": "object"}]}), "an object parameter"),
        (json!("SELECT 1"), "not a statement"),
    ] {
        let bad = shim(&server, "bound", "query", "NONE", body).await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{why}");
        assert_eq!(bad.body["success"], false, "{why}");
        assert!(bad.body["error"].as_str().unwrap().contains("malformed"), "{why}: {}", bad.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_carries_the_current_bookmark() {
    let server = Server::start().await;
    server.create_db("sessions").await;
    let first = shim(&server, "sessions", "execute", "NONE", json!({"sql": "CREATE TABLE t (x)"})).await;
    let b1 = first.session.expect("a bookmark");
    let wrote = post(
        &server,
        "/execute",
        TOKEN,
        &[("x-kura-d1-database", "sessions"), ("x-cf-d1-session-commit-token", "first-primary")],
        json!({"sql": "INSERT INTO t VALUES (1)"}),
    )
    .await;
    let b2 = wrote.session.unwrap();
    assert!(b2 > b1, "a write moves the bookmark on: {b1} then {b2}");
    let read = post(
        &server,
        "/query",
        TOKEN,
        &[("x-kura-d1-database", "sessions"), ("x-cf-d1-session-commit-token", &b2)],
        json!({"sql": "SELECT count(*) AS n FROM t"}),
    )
    .await;
    assert_eq!(read.body[0]["results"], json!([{"n": 1}]));
    assert_eq!(read.session.unwrap(), b2, "a read leaves it");
    let (_, rest) = server.call(reqwest::Method::GET, &server.d1("/sessions/time_travel/bookmark"), None).await;
    assert_eq!(rest["result"]["bookmark"], json!(b2), "it is the Time Travel bookmark");

    let bad = post(
        &server,
        "/query",
        TOKEN,
        &[("x-kura-d1-database", "sessions"), ("x-cf-d1-session-commit-token", "yesterday")],
        json!({"sql": "SELECT 1"}),
    )
    .await;
    assert_eq!((bad.status, &bad.body["success"]), (StatusCode::BAD_REQUEST, &json!(false)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_are_authenticated_and_scoped() {
    let server = Server::start().await;
    server.create_db("guarded").await;
    let select = json!({"sql": "SELECT 1"});
    let headers = [("x-kura-d1-database", "guarded")];
    let wrong = post(&server, "/query", "not-a-token", &headers, select.clone()).await;
    assert_eq!((wrong.status, &wrong.body["error"]), (StatusCode::UNAUTHORIZED, &json!("Authentication error")));
    let unknown = post(&server, "/query", TOKEN, &[("x-kura-d1-database", "nope")], select.clone()).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert!(unknown.body["error"].as_str().unwrap().contains("could not be found"));
    let unnamed = post(&server, "/query", TOKEN, &[], select.clone()).await;
    assert_eq!((unnamed.status, &unnamed.body["success"]), (StatusCode::BAD_REQUEST, &json!(false)));

    let reader = server.token(Scope::D1Read);
    let read = post(&server, "/query", &reader, &headers, select).await;
    assert_eq!(read.status, StatusCode::OK);
    let write = post(&server, "/execute", &reader, &headers, json!({"sql": "CREATE TABLE t (x)"})).await;
    assert_eq!((write.status, &write.body["success"]), (StatusCode::FORBIDDEN, &json!(false)));
}
