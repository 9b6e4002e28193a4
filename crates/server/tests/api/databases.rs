//! Database lifecycle over v4: create, name rules, duplicates, listing and pagination, lookup by
//! id or name, details, delete, and the analytics wrangler's `d1 info` reads.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::common::{ACCOUNT, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_get_and_delete() {
    let server = Server::start().await;
    let (status, body) =
        server.call(Method::POST, &server.d1(""), Some(json!({"name": "prod", "primary_location_hint": "weur"}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let uuid = body["result"]["uuid"].as_str().unwrap().to_owned();
    assert_eq!(body["result"]["created_in_region"], "WEUR");
    assert_eq!(body["result"]["version"], "production");

    let (status, body) = server.call(Method::POST, &server.d1(""), Some(json!({"name": "prod"}))).await;
    assert_eq!((status, body["errors"][0]["code"].as_i64()), (StatusCode::BAD_REQUEST, Some(7502)));
    assert_eq!(body["errors"][0]["message"], "A database with that name already exists");
    for bad in [json!({"name": "-bad"}), json!({"name": "has space"}), json!({"nome": "x"}), json!({"name": 7})] {
        let (status, body) = server.call(Method::POST, &server.d1(""), Some(bad.clone())).await;
        assert_eq!((status, body["errors"][0]["code"].as_i64()), (StatusCode::BAD_REQUEST, Some(7400)), "{bad}");
    }
    let (status, _) =
        server.call(Method::POST, &server.d1(""), Some(json!({"name": "x", "primary_location_hint": "mars"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    server.ok(&uuid, "CREATE TABLE a (x); CREATE TABLE b (y)", json!([])).await;
    for key in [uuid.as_str(), "prod"] {
        let (status, body) = server.call(Method::GET, &server.d1(&format!("/{key}")), None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!((&body["result"]["uuid"], &body["result"]["num_tables"]), (&json!(uuid), &json!(2)));
        assert!(body["result"]["file_size"].as_u64().unwrap() >= 12288);
        assert_eq!(body["result"]["read_replication"]["mode"], "disabled");
    }
    let (_, body) = server.call(Method::GET, &server.d1("/prod?fields=uuid,name"), None).await;
    assert_eq!(body["result"], json!({"uuid": uuid, "name": "prod"}));

    let (status, body) = server.call(Method::DELETE, &server.d1(&format!("/{uuid}")), None).await;
    assert_eq!((status, &body["result"]), (StatusCode::OK, &json!(null)));
    let (status, body) = server.call(Method::GET, &server.d1(&format!("/{uuid}")), None).await;
    assert_eq!((status, body["errors"][0]["code"].as_i64()), (StatusCode::NOT_FOUND, Some(7404)));
    assert_eq!(body["errors"][0]["message"], format!("The database {uuid} could not be found"));
    let (status, body) = server.sql(&uuid, "SELECT 1", json!([])).await;
    assert_eq!((status, body["errors"][0]["code"].as_i64()), (StatusCode::NOT_FOUND, Some(7404)));
    let (status, body) = server.call(Method::GET, &server.d1("/not%20an%20id"), None).await;
    assert_eq!((status, body["errors"][0]["code"].as_i64()), (StatusCode::BAD_REQUEST, Some(7400)));

    // The name is free again, and the new database starts empty.
    let again = server.create_db("prod").await;
    assert_ne!(again, uuid);
    let tables = server.ok(&again, "SELECT count(*) AS n FROM sqlite_schema", json!([])).await;
    assert_eq!(tables[0]["results"][0]["n"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_pages_like_cloudflare() {
    let server = Server::start().await;
    for i in 0..25 {
        server.create_db(&format!("db-{i:02}")).await;
    }
    let mut seen = Vec::new();
    for page in 1..=3 {
        let (status, body) = server.call(Method::GET, &server.d1(&format!("?per_page=10&page={page}")), None).await;
        assert_eq!(status, StatusCode::OK);
        let info = &body["result_info"];
        assert_eq!(
            (info["page"].as_u64(), info["per_page"].as_u64(), info["total_count"].as_u64()),
            (Some(page), Some(10), Some(25))
        );
        let names: Vec<String> =
            body["result"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap().to_owned()).collect();
        assert_eq!(info["count"].as_u64(), Some(names.len() as u64));
        seen.extend(names);
    }
    assert_eq!(seen.len(), 25);
    seen.dedup();
    assert_eq!(seen.len(), 25);
    let (_, body) = server.call(Method::GET, &server.d1("?name=db-1"), None).await;
    assert_eq!(body["result"].as_array().unwrap().len(), 10);
    let (status, body) = server.call(Method::GET, &server.d1("?page=abc"), None).await;
    assert_eq!((status, body["errors"][0]["code"].as_i64()), (StatusCode::BAD_REQUEST, Some(7400)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graphql_reports_real_usage() {
    let server = Server::start().await;
    let db = server.create_db("metrics").await;
    server.ok(&db, "CREATE TABLE t (x); INSERT INTO t VALUES (1), (2), (3)", json!([])).await;
    server.ok(&db, "SELECT * FROM t", json!([])).await;
    let now = jiff::Timestamp::now();
    let query = json!({
        "query": "query { viewer { accounts { d1AnalyticsAdaptiveGroups { sum { readQueries writeQueries rowsRead rowsWritten } dimensions { datetimeHour } } } } }",
        "variables": { "accountTag": ACCOUNT, "filter": { "AND": [{
            "datetimeHour_geq": (now - jiff::SignedDuration::from_hours(24)).to_string(),
            "datetimeHour_leq": now.to_string(),
            "databaseId": db,
        }]}},
    });
    let (status, body) = server.call(Method::POST, "/graphql", Some(query)).await;
    assert_eq!(status, StatusCode::OK);
    let groups = body["data"]["viewer"]["accounts"][0]["d1AnalyticsAdaptiveGroups"].as_array().unwrap();
    let sum = |k: &str| groups.iter().map(|g| g["sum"][k].as_u64().unwrap()).sum::<u64>();
    assert_eq!((sum("readQueries"), sum("writeQueries")), (1, 2));
    assert_eq!(sum("rowsRead"), 4, "CREATE TABLE reads its schema row, SELECT reads three");
    assert!(sum("rowsWritten") >= 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_and_methods_answer_in_the_envelope() {
    let server = Server::start().await;
    // The v4 routes are registered at their full paths: everything under the prefix that
    // matches none of them, the prefix itself included, still answers in the envelope.
    for path in ["/nope", "", "/", &server.d1("/some-db/nope")] {
        let (status, body) = server.call(Method::GET, path, None).await;
        assert_eq!((status, body["errors"][0]["code"].as_i64()), (StatusCode::NOT_FOUND, Some(7003)), "{path}");
    }
    let (status, body) = server.call(Method::PUT, &server.d1(""), None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(body["success"], false);
    assert_eq!(body["errors"][0]["code"].as_i64(), Some(7001));
    // Outside the prefix, no envelope.
    let outside = server.http.get(format!("{}/nope", server.root)).send().await.unwrap();
    assert_eq!(outside.status(), StatusCode::NOT_FOUND);
    let health = server.http.get(format!("{}/healthz", server.root)).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    server.stop().await;
}
