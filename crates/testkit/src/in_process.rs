//! kura served from this process, on free loopback ports and a data directory the caller
//! gives, acting for the [`credentials`](crate::credentials) account: what the API suites
//! start per test, and what the benchmark runs on a runtime of its own.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kura_catalog::Catalog;
use kura_server::{CredentialsConfig, Listeners, Node, NodeError, NodeSettings};

use crate::credentials::{ACCOUNT, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, TOKEN};

/// Why the server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data directory could not be opened or given its account.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// A loopback listener could not be opened (or its address read).
    #[error("cannot open a loopback listener: {0}")]
    Listen(#[from] std::io::Error),
}

/// How the server is set up.
#[derive(Debug, Clone)]
pub struct Options {
    /// Time Travel's capture on (the default) or off.
    pub history: bool,
    /// Run Workers in this workerd, on a listener of their own.
    pub workerd: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options { history: true, workerd: None }
    }
}

/// A running server; stopped when dropped (or, waiting for it to drain, by [`Server::stop`]).
pub struct Server {
    /// `http://127.0.0.1:port` of the API listener.
    pub root: String,
    /// The S3 listener's base URL.
    pub s3: String,
    /// The Workers listener's base URL, when it runs Workers.
    pub workers: Option<String>,
    /// The node's catalog, for what a test sets up behind the API's back (another account, a
    /// scoped token).
    pub catalog: Arc<Catalog>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Server {
    /// Opens `dir` as a node, gives it the test account, and serves it on the current runtime.
    pub async fn start(dir: &Path, options: Options) -> Result<Server, StartError> {
        let mut settings = NodeSettings::default();
        if !options.history {
            settings.d1.history = None;
        }
        let node = Node::open(dir, settings)?;
        node.bootstrap(&CredentialsConfig {
            account_id: Some(ACCOUNT.into()),
            api_token: Some(TOKEN.into()),
            s3_key: Some((S3_ACCESS_KEY_ID.into(), S3_SECRET_ACCESS_KEY.into())),
        })?;
        let catalog = Arc::clone(node.catalog());
        let api = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let s3 = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let root = format!("http://{}", api.local_addr()?);
        let s3_url = format!("http://{}", s3.local_addr()?);
        let (workers, workers_url) = match &options.workerd {
            Some(_) => {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                let url = format!("http://{}", listener.local_addr()?);
                (Some(listener), Some(url))
            }
            None => (None, None),
        };
        let settings = kura_workers::WorkersSettings {
            runtime: kura_workers::RuntimeSettings { workerd: options.workerd, ..Default::default() },
            ..Default::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(kura_server::serve_all(node, Listeners { api, s3, workers }, settings, async {
            let _ = stopped.await;
        }));
        Ok(Server { root, s3: s3_url, workers: workers_url, catalog, stop: Some(stop), task: Some(task) })
    }

    /// The v4 API's base URL (`…/client/v4`).
    pub fn v4(&self) -> String {
        format!("{}/client/v4", self.root)
    }

    /// The API listener's `host:port`.
    pub fn api_host(&self) -> &str {
        self.root.trim_start_matches("http://")
    }

    /// Stops the server and waits until it has drained its requests and closed its databases.
    ///
    /// # Panics
    ///
    /// When serving failed or panicked.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("the server did not panic").expect("the server served until stopped");
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
