//! A kura server in this process, on a free port and a fresh data directory, with helpers that
//! speak the v4 API to it.

use std::sync::Arc;

use kura_catalog::{Catalog, Scope};
use kura_server::{CredentialsConfig, Node, NodeSettings};
use reqwest::{Method, StatusCode};
use serde_json::{Value as Json, json};

pub const ACCOUNT: &str = "test-account";
pub const TOKEN: &str = "test-admin-token-0123456789abcdef";

pub struct Server {
    pub root: String,
    pub base: String,
    pub http: reqwest::Client,
    pub catalog: Arc<Catalog>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Server {
    pub async fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let node = Node::open(dir.path(), NodeSettings::default()).unwrap();
        node.bootstrap(&CredentialsConfig {
            account_id: Some(ACCOUNT.into()),
            api_token: Some(TOKEN.into()),
            s3_key: None,
        })
        .unwrap();
        let catalog = Arc::clone(node.catalog());
        let api = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let s3 = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let root = format!("http://{}", api.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            kura_server::serve(node, api, s3, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        Server {
            base: format!("{root}/client/v4"),
            root,
            http: reqwest::Client::new(),
            catalog,
            stop: Some(stop),
            task: Some(task),
            _dir: dir,
        }
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

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The first row of the last statement's results.
pub fn first_row(results: &[Json]) -> &Json {
    &results.last().unwrap()["results"][0]
}
