//! D1's limits over HTTP, counted in bytes.

use serde_json::json;

use crate::common::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_are_limited_in_bytes_not_characters() {
    let server = Server::start().await;
    let db = server.create_db("limits").await;
    server.ok(&db, "CREATE TABLE t (v TEXT)", json!([])).await;
    let too_big = "€".repeat(700_000); // 2,100,000 bytes in UTF-8
    let (_, code, message) = server.fails(&db, "INSERT INTO t VALUES (?)", json!([too_big])).await;
    assert_eq!((code, message.as_str()), (7500, "string or blob too big: SQLITE_TOOBIG"));
    server.ok(&db, "INSERT INTO t VALUES (?)", json!(["€".repeat(600_000)])).await;
    let params: Vec<i64> = (0..101).collect();
    let sql = format!("SELECT {}", vec!["?"; 101].join(","));
    let (_, _, message) = server.fails(&db, &sql, json!(params)).await;
    assert!(message.starts_with("too many SQL variables"), "{message}");
    let (_, _, message) = server.fails(&db, &format!("SELECT '{}'", "x".repeat(100_001)), json!([])).await;
    assert_eq!(message, "statement too long: SQLITE_TOOBIG");
}
