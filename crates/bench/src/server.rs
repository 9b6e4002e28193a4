//! kura-testkit's in-process server on a runtime of its own inside the benchmark process (as a
//! separate process would be), acting for the test account; and the benchmark's requests to it.

use kura_testkit::in_process::{Options, Server};

pub use kura_testkit::credentials::{ACCOUNT, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, TOKEN};

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
    server: Option<Server>,
}

impl Kura {
    /// A server on `dir`; `history: false` switches Time Travel's capture off.
    pub fn start(dir: &std::path::Path, history: bool) -> anyhow::Result<Kura> {
        Kura::start_with(dir, Options { history, workerd: None })
    }

    /// A server on `dir` that also runs Workers, in the workerd at `workerd`.
    pub fn start_with_workers(dir: &std::path::Path, workerd: &std::path::Path) -> anyhow::Result<Kura> {
        Kura::start_with(dir, Options { history: true, workerd: Some(workerd.to_owned()) })
    }

    fn start_with(dir: &std::path::Path, options: Options) -> anyhow::Result<Kura> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kura-server")
            .enable_all()
            .build()?;
        let server = runtime.block_on(Server::start(dir, options))?;
        Ok(Kura {
            base: format!("{}/accounts/{ACCOUNT}/d1/database", server.v4()),
            s3: server.s3.clone(),
            workers: server.workers.clone(),
            runtime,
            server: Some(server),
        })
    }

    /// The API listener's host:port.
    pub fn api_host(&self) -> String {
        self.server.as_ref().map(|s| s.api_host().to_owned()).unwrap_or_default()
    }

    /// Stops the server and waits until it has drained and closed its databases.
    pub fn shutdown(mut self) {
        if let Some(server) = self.server.take() {
            self.runtime.block_on(server.stop());
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
