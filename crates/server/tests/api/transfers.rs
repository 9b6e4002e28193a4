//! D1's import flow over v4 and kura's upload URLs: each step is checked, an upload URL takes
//! one PUT, and an upload is ingested once.

use md5::{Digest, Md5};
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::common::{Server, first_row};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_url_takes_one_put_and_an_upload_is_ingested_once() {
    let server = Server::start().await;
    let db = server.create_db("imports").await;
    let sql = "CREATE TABLE t (x);\nINSERT INTO t VALUES (1), (2);\n";
    let etag = hex::encode(Md5::digest(sql));
    let import = server.d1(&format!("/{db}/import"));
    let (status, init) = server.call(Method::POST, &import, Some(json!({"action": "init", "etag": etag}))).await;
    assert_eq!(status, StatusCode::OK, "{init}");
    let url = init["result"]["upload_url"].as_str().unwrap().to_owned();
    let filename = init["result"]["filename"].as_str().unwrap().to_owned();
    let ingest = json!({"action": "ingest", "etag": etag, "filename": filename});

    let (_, early) = server.call(Method::POST, &import, Some(ingest.clone())).await;
    assert_eq!(early["result"]["success"], json!(false), "{early}");
    assert_eq!(early["result"]["error"], json!("The file was not uploaded."));

    let put = server.http.put(&url).body(sql).send().await.unwrap();
    assert_eq!(put.status(), StatusCode::OK);
    assert_eq!(put.headers()["etag"].to_str().unwrap(), format!("\"{etag}\""));
    let again = server.http.put(&url).body("DROP TABLE t;\n").send().await.unwrap();
    assert_eq!(again.status(), StatusCode::CONFLICT, "a used upload URL takes no second file");
    let unknown = server.http.put(format!("{}/d1-transfers/{}", server.root, "0".repeat(32))).body(sql).send();
    assert_eq!(unknown.await.unwrap().status(), StatusCode::NOT_FOUND);

    let (status, done) = server.call(Method::POST, &import, Some(ingest.clone())).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["result"]["success"], json!(true), "{done}");
    let rows = server.ok(&db, "SELECT count(*) AS n FROM t", json!([])).await;
    assert_eq!(first_row(&rows)["n"], json!(2));

    let (status, twice) = server.call(Method::POST, &import, Some(ingest)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{twice}");
    let rows = server.ok(&db, "SELECT count(*) AS n FROM t", json!([])).await;
    assert_eq!(first_row(&rows)["n"], json!(2), "an upload is applied once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_does_not_match_its_etag_is_not_applied() {
    let server = Server::start().await;
    let db = server.create_db("mismatch").await;
    let import = server.d1(&format!("/{db}/import"));
    let announced = hex::encode(Md5::digest("CREATE TABLE a (x);\n"));
    let (_, init) = server.call(Method::POST, &import, Some(json!({"action": "init", "etag": announced}))).await;
    let url = init["result"]["upload_url"].as_str().unwrap();
    server.http.put(url).body("CREATE TABLE b (x);\n").send().await.unwrap();
    let filename = init["result"]["filename"].clone();
    let (_, outcome) = server
        .call(Method::POST, &import, Some(json!({"action": "ingest", "etag": announced, "filename": filename})))
        .await;
    assert_eq!(outcome["result"]["success"], json!(false), "{outcome}");
    let tables = server.ok(&db, "SELECT count(*) AS n FROM sqlite_schema WHERE name = 'b'", json!([])).await;
    assert_eq!(first_row(&tables)["n"], json!(0));
}
