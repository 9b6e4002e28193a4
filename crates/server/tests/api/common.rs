//! A kura server in this process (kura-testkit's), on a free port and a fresh data directory,
//! with helpers that speak the v4 API to it.

use std::ops::Deref;

use kura_catalog::Scope;
use kura_testkit::in_process::{Options, Server as Running};
use reqwest::{Method, StatusCode};
use serde_json::{Value as Json, json};

pub use kura_testkit::credentials::{ACCOUNT, TOKEN};

pub struct Server {
    /// The v4 API's base URL.
    pub base: String,
    pub http: reqwest::Client,
    running: Running,
    _dir: tempfile::TempDir,
}

/// The running server's fields (`root`, `catalog`) read through.
impl Deref for Server {
    type Target = Running;
    fn deref(&self) -> &Running {
        &self.running
    }
}

impl Server {
    pub async fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let running = Running::start(dir.path(), Options::default()).await.unwrap();
        Server { base: running.v4(), http: reqwest::Client::new(), running, _dir: dir }
    }

    /// A new token of the test account with this scope.
    pub fn token(&self, scope: Scope) -> String {
        self.catalog.create_token(ACCOUNT, "test", scope, None).unwrap().1
    }

    pub async fn call_as(
        &self,
        token: Option<&str>,
        method: Method,
        path: &str,
        body: Option<Json>,
    ) -> (StatusCode, Json) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        let json = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON ({status}): {text}"));
        (status, json)
    }

    pub async fn call(&self, method: Method, path: &str, body: Option<Json>) -> (StatusCode, Json) {
        self.call_as(Some(TOKEN), method, path, body).await
    }

    pub fn d1(&self, suffix: &str) -> String {
        format!("/accounts/{ACCOUNT}/d1/database{suffix}")
    }

    pub async fn create_db(&self, name: &str) -> String {
        let (status, body) = self.call(Method::POST, &self.d1(""), Some(json!({ "name": name }))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["result"]["uuid"].as_str().unwrap().to_owned()
    }

    /// Runs SQL and returns the raw response.
    pub async fn sql(&self, db: &str, sql: &str, params: Json) -> (StatusCode, Json) {
        self.call(Method::POST, &self.d1(&format!("/{db}/query")), Some(json!({ "sql": sql, "params": params }))).await
    }

    /// Runs SQL that must succeed; returns the results array.
    pub async fn ok(&self, db: &str, sql: &str, params: Json) -> Vec<Json> {
        let (status, body) = self.sql(db, sql, params).await;
        assert_eq!(status, StatusCode::OK, "{sql}: {body}");
        assert_eq!(body["success"], true);
        body["result"].as_array().unwrap().clone()
    }

    /// Runs SQL that must fail; returns (status, Cloudflare code, message).
    pub async fn fails(&self, db: &str, sql: &str, params: Json) -> (StatusCode, i64, String) {
        let (status, body) = self.sql(db, sql, params).await;
        assert_eq!(body["success"], false, "{sql} should fail: {body}");
        (status, body["errors"][0]["code"].as_i64().unwrap(), body["errors"][0]["message"].as_str().unwrap().to_owned())
    }

    pub async fn stop(self) {
        self.running.stop().await;
    }
}

/// The first row of the last statement's results.
pub fn first_row(results: &[Json]) -> &Json {
    &results.last().unwrap()["results"][0]
}
