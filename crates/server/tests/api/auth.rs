//! Authentication and scopes: missing, malformed, wrong and revoked tokens; read-only tokens;
//! accounts never reaching each other's databases.

use kura_catalog::Scope;
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::common::{ACCOUNT, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_get_401_in_the_envelope() {
    let server = Server::start().await;
    let path = server.d1("");
    let (status, body) = server.call_as(None, Method::GET, &path, None).await;
    assert_eq!((status, body["errors"][0]["code"].as_i64()), (StatusCode::UNAUTHORIZED, Some(9106)));
    assert_eq!(body["success"], false);
    assert_eq!(body["result"], json!(null));

    let raw =
        server.http.get(format!("{}{path}", server.base)).header("authorization", "Basic abc").send().await.unwrap();
    assert_eq!(raw.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(raw.json::<serde_json::Value>().await.unwrap()["errors"][0]["code"], 6111);

    let (status, body) = server.call_as(Some("not-a-real-token-at-all"), Method::GET, &path, None).await;
    assert_eq!((status, body["errors"][0]["code"].as_i64()), (StatusCode::UNAUTHORIZED, Some(10000)));

    let secret = server.token(Scope::Admin);
    assert_eq!(server.call_as(Some(&secret), Method::GET, &path, None).await.0, StatusCode::OK);
    let token = server.catalog.authenticate(&secret).unwrap().unwrap();
    assert!(server.catalog.revoke_token(ACCOUNT, &token.id).unwrap());
    assert_eq!(server.call_as(Some(&secret), Method::GET, &path, None).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_tokens_read_and_cannot_write() {
    let server = Server::start().await;
    let db = server.create_db("shop").await;
    server
        .ok(
            &db,
            "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO items (name) VALUES ('a')",
            json!([]),
        )
        .await;
    let reader = server.token(Scope::D1Read);

    let (status, _) = server.call_as(Some(&reader), Method::GET, &server.d1(""), None).await;
    assert_eq!(status, StatusCode::OK);
    let query = server.d1(&format!("/{db}/query"));
    let (status, body) = server
        .call_as(Some(&reader), Method::POST, &query, Some(json!({"sql": "SELECT count(*) AS n FROM items"})))
        .await;
    assert_eq!((status, &body["result"][0]["results"][0]["n"]), (StatusCode::OK, &json!(1)));

    let (status, body) = server
        .call_as(
            Some(&reader),
            Method::POST,
            &query,
            Some(json!({"sql": "SELECT 1; INSERT INTO items (name) VALUES ('b')"})),
        )
        .await;
    assert_eq!((status, body["errors"][0]["code"].as_i64()), (StatusCode::FORBIDDEN, Some(10000)));
    let (status, _) = server.call_as(Some(&reader), Method::POST, &server.d1(""), Some(json!({"name": "x"}))).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = server.call_as(Some(&reader), Method::DELETE, &server.d1(&format!("/{db}")), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    let n = server.ok(&db, "SELECT count(*) AS n FROM items", json!([])).await;
    assert_eq!(n[0]["results"][0]["n"], 1, "the refused write changed nothing");

    let writer = server.token(Scope::D1Write);
    let (status, _) = server
        .call_as(Some(&writer), Method::POST, &query, Some(json!({"sql": "INSERT INTO items (name) VALUES ('c')"})))
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_of_one_account_reaches_another() {
    let server = Server::start().await;
    let db = server.create_db("private").await;
    let other = server.catalog.create_account(Some("other-account"), "other").unwrap();
    let (_, other_token) = server.catalog.create_token(&other.id, "t", Scope::Admin, None).unwrap();

    // Through our account's URLs: refused, whether the database exists or not.
    for path in [server.d1(""), server.d1(&format!("/{db}")), server.d1("/00000000-0000-4000-8000-000000000000")] {
        let (status, body) = server.call_as(Some(&other_token), Method::GET, &path, None).await;
        assert_eq!((status, body["errors"][0]["code"].as_i64()), (StatusCode::FORBIDDEN, Some(10000)), "{path}");
    }
    let (status, _) = server
        .call_as(
            Some(&other_token),
            Method::POST,
            &server.d1(&format!("/{db}/query")),
            Some(json!({"sql": "SELECT 1"})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // A large body is refused before it is read: the client sees the 403, or, if it was still
    // sending when the server answered and closed the connection, a closed connection.
    let big = format!("{{\"sql\": \"SELECT 1\", \"params\": [\"{}\"]}}", "x".repeat(5_000_000));
    let refused = server
        .http
        .post(format!("{}{}", server.base, server.d1(&format!("/{db}/query"))))
        .bearer_auth(&other_token)
        .body(big)
        .send()
        .await;
    match refused {
        Ok(response) => assert_eq!(response.status(), StatusCode::FORBIDDEN),
        Err(e) => assert!(e.is_request() && !e.is_timeout(), "the server closed the connection: {e:?}"),
    }

    // Through its own account's URLs: our database does not exist there.
    let theirs = format!("/accounts/{}/d1/database/{db}", other.id);
    let (status, body) = server.call_as(Some(&other_token), Method::GET, &theirs, None).await;
    assert_eq!((status, body["errors"][0]["code"].as_i64()), (StatusCode::NOT_FOUND, Some(7404)));
    let (status, _) = server
        .call_as(Some(&other_token), Method::POST, &format!("{theirs}/query"), Some(json!({"sql": "SELECT 1"})))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, listing) =
        server.call_as(Some(&other_token), Method::GET, &format!("/accounts/{}/d1/database", other.id), None).await;
    assert_eq!(listing["result"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_and_memberships_show_the_tokens_account() {
    let server = Server::start().await;
    let (status, body) = server.call(Method::GET, "/accounts", None).await;
    assert_eq!((status, &body["result"][0]["id"]), (StatusCode::OK, &json!(ACCOUNT)));
    assert_eq!(body["result_info"]["total_count"], 1);
    let (_, body) = server.call(Method::GET, "/memberships", None).await;
    assert_eq!(body["result"][0]["account"]["id"], ACCOUNT);
    let (_, body) = server.call(Method::GET, "/user/tokens/verify", None).await;
    assert_eq!(body["result"]["status"], "active");
}

/// One HTTP/1.1 answer read off a raw connection: its head (lower-cased) and its body.
async fn read_answer(stream: &mut tokio::net::TcpStream) -> (String, String) {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let length: usize =
                head.lines().find_map(|l| l.strip_prefix("content-length:")).map_or(0, |n| n.trim().parse().unwrap());
            if got.len() >= end + 4 + length {
                let body = String::from_utf8_lossy(&got[end + 4..end + 4 + length]).into_owned();
                return (head, body);
            }
        }
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the connection closed mid-answer: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&chunk[..n]);
    }
}

/// A client that sent `Expect: 100-continue` and was refused before its body was asked for
/// may send the body or not: the answer closes the connection, so the first bytes of its next
/// request are never taken for that body (botocore's next request once arrived as `OST /…`).
/// A body that was asked for (`100 Continue`) and sent leaves the connection open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_before_its_expected_body_is_read_closes_its_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Server::start().await;
    let db = server.create_db("expect").await;
    let address = server.root.trim_start_matches("http://").to_owned();
    let body = r#"{"sql": "SELECT 1 AS one"}"#;
    let request = |token: &str| {
        format!(
            "POST /client/v4{} HTTP/1.1\r\nHost: kura\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            server.d1(&format!("/{db}/query")),
            body.len()
        )
    };

    let mut refused = tokio::net::TcpStream::connect(&address).await.unwrap();
    refused.write_all(request("not-a-token-of-this-server").as_bytes()).await.unwrap();
    let (head, _) = read_answer(&mut refused).await;
    assert!(head.starts_with("http/1.1 401"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    // The next request, body unsent: the server has closed, and answers nothing more.
    let _ = refused.write_all(b"GET /healthz HTTP/1.1\r\nHost: kura\r\n\r\n").await;
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), refused.read_to_end(&mut rest)).await.unwrap();
    assert!(rest.is_empty(), "answered on a closed exchange: {}", String::from_utf8_lossy(&rest));

    let mut kept = tokio::net::TcpStream::connect(&address).await.unwrap();
    kept.write_all(request(crate::common::TOKEN).as_bytes()).await.unwrap();
    let (head, _) = read_answer(&mut kept).await;
    assert!(head.starts_with("http/1.1 100"), "{head}");
    kept.write_all(body.as_bytes()).await.unwrap();
    let (head, answer) = read_answer(&mut kept).await;
    assert!(head.starts_with("http/1.1 200") && !head.contains("connection: close"), "{head}");
    assert!(answer.contains(r#""one":1"#), "{answer}");
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: kura\r\n\r\n").await.unwrap();
    let (head, answer) = read_answer(&mut kept).await;
    assert!(head.starts_with("http/1.1 200") && answer == "ok", "{head} {answer}");
}
