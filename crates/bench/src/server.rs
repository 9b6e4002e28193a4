//! A kura server on a runtime of its own inside the benchmark process (as a separate process
//! would be), with the benchmark's account, API token and S3 key.

use kura_server::{CredentialsConfig, Node, NodeSettings};

pub const ACCOUNT: &str = "bench";
pub const TOKEN: &str = "bench-token-0123456789abcdefghij";
pub const S3_KEY: &str = "bench-s3-key";
pub const S3_SECRET: &str = "bench-s3-secret-0123456789abcdef";

/// A kura server running on a runtime of its own.
pub struct Kura {
    /// The D1 databases' v4 base URL.
    pub base: String,
    /// The S3 listener's base URL.
    pub s3: String,
    /// The Workers listener's base URL, when the server runs Workers.
    pub workers: Option<String>,
    /// The server's runtime (dropping it stops the server).
    pub runtime: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<()>>,
}

impl Kura {
    /// A server on `dir`; `history: false` switches Time Travel's capture off.
    pub fn start(dir: &std::path::Path, history: bool) -> anyhow::Result<Kura> {
        Kura::start_with(dir, history, None)
    }

    /// A server on `dir` that also runs Workers, in the workerd at `workerd`.
    pub fn start_with_workers(dir: &std::path::Path, workerd: &std::path::Path) -> anyhow::Result<Kura> {
        Kura::start_with(dir, true, Some(workerd.to_owned()))
    }

    fn start_with(dir: &std::path::Path, history: bool, workerd: Option<std::path::PathBuf>) -> anyhow::Result<Kura> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kura-server")
            .enable_all()
            .build()?;
        let mut settings = NodeSettings::default();
        if !history {
            settings.d1.history = None;
        }
        let node = Node::open(dir, settings)?;
        node.bootstrap(&CredentialsConfig {
            account_id: Some(ACCOUNT.into()),
            api_token: Some(TOKEN.into()),
            s3_key: Some((S3_KEY.into(), S3_SECRET.into())),
        })?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (base, s3_url, workers_url, done) = runtime.block_on(async {
            let api = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let s3 = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let base = format!("http://{}/client/v4/accounts/{ACCOUNT}/d1/database", api.local_addr()?);
            let s3_url = format!("http://{}", s3.local_addr()?);
            let (workers, workers_url) = match &workerd {
                Some(_) => {
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                    let url = format!("http://{}", listener.local_addr()?);
                    (Some(listener), Some(url))
                }
                None => (None, None),
            };
            let settings = kura_workers::WorkersSettings {
                runtime: kura_workers::RuntimeSettings { workerd, ..Default::default() },
                ..Default::default()
            };
            let listeners = kura_server::Listeners { api, s3, workers };
            let done = tokio::spawn(async move {
                let _ = kura_server::serve_all(node, listeners, settings, async {
                    let _ = stopped.await;
                })
                .await;
            });
            anyhow::Ok((base, s3_url, workers_url, done))
        })?;
        Ok(Kura { base, s3: s3_url, workers: workers_url, runtime, stop: Some(stop), done: Some(done) })
    }

    /// The API listener's host:port.
    pub fn api_host(&self) -> String {
        self.base.trim_start_matches("http://").split('/').next().unwrap_or_default().to_owned()
    }

    pub fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            let _ = self.runtime.block_on(done);
        }
    }
}

/// POSTs a JSON body with the benchmark's token and checks it succeeded, without parsing the
/// answer, so the load generator spends as little of the shared CPU as it can.
pub async fn post_ok(http: &reqwest::Client, url: &str, body: String) {
    let response = http
        .post(url)
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("request");
    let status = response.status();
    let bytes = response.bytes().await.expect("response body");
    assert!(status.is_success(), "benchmark request failed: {}", String::from_utf8_lossy(&bytes));
}

/// Has kura capture what a database's (or an object's) history owes, by GETting `bookmark_url`
/// (a bookmark endpoint) for the present: kura captures commits in batches, up to a second
/// after their answer, and a load taking turns ends with its own captures done rather than
/// leave them to the next load's turn.
pub async fn capture_by_bookmark(http: &reqwest::Client, bookmark_url: &str) {
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
    let url = format!("{bookmark_url}?timestamp={now_ms}");
    let answer = http.get(&url).bearer_auth(TOKEN).send().await.expect("bookmark request");
    assert!(answer.status().is_success(), "GET {url}: {}", answer.status());
}
