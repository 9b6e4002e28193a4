//! File transfers for D1's export and import flows: the download URL of an export and the
//! upload URL of an import, which kura serves itself (Cloudflare serves them from R2).
//!
//! Each URL carries a random 128-bit token, the only thing that grants access, valid for one
//! hour; files live under `<data>/transfers` and go when their token expires or the server
//! restarts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use md5::{Digest, Md5};
use tokio::io::AsyncWriteExt;

/// How long a transfer URL works.
pub const TRANSFER_LIFETIME: Duration = Duration::from_secs(3600);

/// Largest import accepted, in bytes (D1's import limit).
pub const MAX_UPLOAD_BYTES: u64 = 5 * 1000 * 1000 * 1000;

/// An import file, expected and then received.
#[derive(Debug, Clone)]
pub struct Upload {
    /// The account and database it is for.
    pub account: String,
    /// The database's id.
    pub database: String,
    /// The MD5 (hex) the client announced.
    pub etag: String,
    /// Where it is stored.
    pub path: PathBuf,
    /// How far it has got.
    pub state: UploadState,
    expires: Instant,
}

/// Where an import file is in its journey.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UploadState {
    /// Its URL was handed out.
    Expected,
    /// A PUT is storing it.
    Receiving,
    /// It arrived whole.
    Received {
        /// Its MD5, hex.
        md5: String,
    },
}

/// Why an upload URL cannot take a PUT.
enum UploadRefused {
    Unknown,
    Busy,
}

#[derive(Default)]
struct Ledger {
    downloads: HashMap<String, (PathBuf, Instant)>,
    uploads: HashMap<String, Upload>,
    /// The last import outcome per database, for `action: poll`.
    imports: HashMap<String, serde_json::Value>,
}

/// The transfers of one server.
pub struct Transfers {
    dir: PathBuf,
    state: Mutex<Ledger>,
    /// In a cluster, `<node>~`: a transfer's URL names the node holding its file, so any node
    /// receiving it sends it there.
    prefix: String,
}

/// Separates the node from the random part of a cluster node's transfer tokens (node names
/// never hold it).
pub const NODE_SEPARATOR: char = '~';

fn random_hex() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the operating system's random source failed");
    hex::encode(bytes)
}

impl Transfers {
    /// Transfers kept in `dir`, which is created and emptied (tokens do not survive restarts).
    /// On a cluster node, `node` names it in every token.
    pub fn open(dir: &Path, node: Option<&str>) -> std::io::Result<Transfers> {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        std::fs::create_dir_all(dir)?;
        let prefix = node.map(|n| format!("{n}{NODE_SEPARATOR}")).unwrap_or_default();
        Ok(Transfers { dir: dir.to_owned(), state: Mutex::default(), prefix })
    }

    /// A new token and the random part its file is named by.
    fn token(&self) -> (String, String) {
        let random = random_hex();
        (format!("{}{random}", self.prefix), random)
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh token and the file its download will serve.
    pub fn reserve_download(&self) -> (String, PathBuf) {
        self.sweep();
        let (token, random) = self.token();
        let path = self.dir.join(format!("{random}.sql"));
        (token, path)
    }

    /// Makes a reserved download available.
    pub fn publish_download(&self, token: &str, path: PathBuf) {
        self.lock().downloads.insert(token.to_owned(), (path, Instant::now() + TRANSFER_LIFETIME));
    }

    /// Expects an import file for a database; returns its token.
    pub fn expect_upload(&self, account: &str, database: &str, etag: &str) -> String {
        self.sweep();
        let (token, random) = self.token();
        let upload = Upload {
            account: account.to_owned(),
            database: database.to_owned(),
            etag: etag.to_owned(),
            path: self.dir.join(format!("{random}.import.sql")),
            state: UploadState::Expected,
            expires: Instant::now() + TRANSFER_LIFETIME,
        };
        self.lock().uploads.insert(token.clone(), upload);
        token
    }

    /// Claims an expected upload for one PUT: a second, concurrent or later, is refused.
    fn begin_receiving(&self, token: &str) -> Result<Upload, UploadRefused> {
        let mut state = self.lock();
        let upload =
            state.uploads.get_mut(token).filter(|u| u.expires > Instant::now()).ok_or(UploadRefused::Unknown)?;
        if upload.state != UploadState::Expected {
            return Err(UploadRefused::Busy);
        }
        upload.state = UploadState::Receiving;
        Ok(upload.clone())
    }

    /// Ends a PUT: the file arrived with this MD5, or (`None`) the URL may be used again.
    /// Answers whether the upload is still expected (its URL may have expired meanwhile).
    fn end_receiving(&self, token: &str, md5: Option<String>) -> bool {
        let mut state = self.lock();
        let Some(u) = state.uploads.get_mut(token) else { return false };
        u.state = match md5 {
            Some(md5) => UploadState::Received { md5 },
            None => UploadState::Expected,
        };
        true
    }

    /// The upload a token stands for, for this database, if its URL is still valid.
    pub fn upload(&self, token: &str, account: &str, database: &str) -> Option<Upload> {
        self.lock()
            .uploads
            .get(token)
            .filter(|u| u.expires > Instant::now() && u.account == account && u.database == database)
            .cloned()
    }

    /// Hands over a received upload for ingestion, once; `None` unless it has arrived whole.
    pub fn take_received(&self, token: &str) -> Option<(Upload, String)> {
        let mut state = self.lock();
        let md5 = match &state.uploads.get(token)?.state {
            UploadState::Received { md5 } => md5.clone(),
            _ => return None,
        };
        state.uploads.remove(token).map(|u| (u, md5))
    }

    /// Remembers an import's outcome for later polls.
    pub fn record_import(&self, database: &str, outcome: serde_json::Value) {
        self.lock().imports.insert(database.to_owned(), outcome);
    }

    /// The last import outcome of a database.
    pub fn last_import(&self, database: &str) -> Option<serde_json::Value> {
        self.lock().imports.get(database).cloned()
    }

    /// Forgets expired transfers and deletes their files.
    fn sweep(&self) {
        let now = Instant::now();
        let mut state = self.lock();
        // An upload being received stays until its PUT ends, whatever its age.
        let gone = |u: &Upload| u.expires <= now && u.state != UploadState::Receiving;
        let expired: Vec<PathBuf> = state
            .downloads
            .values()
            .filter(|(_, t)| *t <= now)
            .map(|(p, _)| p.clone())
            .chain(state.uploads.values().filter(|u| gone(u)).map(|u| u.path.clone()))
            .collect();
        state.downloads.retain(|_, (_, t)| *t > now);
        state.uploads.retain(|_, u| !gone(u));
        drop(state);
        for path in expired {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Where clients reach this server: the scheme and host they used.
pub fn origin(headers: &HeaderMap) -> String {
    let scheme = headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()).unwrap_or("http");
    // A request another cluster node sent on names the host its client reached.
    let host = headers
        .get("x-forwarded-host")
        .or_else(|| headers.get(header::HOST))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("127.0.0.1");
    format!("{scheme}://{host}")
}

/// The URL of a transfer.
pub fn url(headers: &HeaderMap, token: &str) -> String {
    format!("{}/d1-transfers/{token}", origin(headers))
}

fn plain(status: StatusCode, text: &str) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text.to_owned()).into_response()
}

/// `GET /d1-transfers/{token}`: an export's SQL.
pub async fn download(State(transfers): State<std::sync::Arc<Transfers>>, UrlPath(token): UrlPath<String>) -> Response {
    let found = transfers.lock().downloads.get(&token).filter(|(_, t)| *t > Instant::now()).map(|(p, _)| p.clone());
    let Some(path) = found else {
        return plain(StatusCode::NOT_FOUND, "This download link is unknown or has expired.");
    };
    match tokio::fs::File::open(&path).await {
        Ok(file) => {
            let len = file.metadata().await.map(|m| m.len()).unwrap_or(0);
            let body = Body::from_stream(tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024));
            // A file to save, never a page to render (its SQL holds whatever the rows hold).
            (
                [
                    (header::CONTENT_TYPE, "application/sql"),
                    (header::CONTENT_LENGTH, &len.to_string()),
                    (header::CONTENT_DISPOSITION, "attachment"),
                    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                ],
                body,
            )
                .into_response()
        }
        Err(_) => plain(StatusCode::NOT_FOUND, "This download link is unknown or has expired."),
    }
}

/// Puts an upload back to expected, and removes what arrived of it, unless the PUT finished:
/// a PUT whose connection drops never runs to its end.
struct ReceivingGuard<'a> {
    transfers: &'a Transfers,
    token: &'a str,
    path: &'a Path,
    finished: bool,
}

impl Drop for ReceivingGuard<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_file(self.path);
            self.transfers.end_receiving(self.token, None);
        }
    }
}

/// `PUT /d1-transfers/{token}`: an import's SQL; answers with its MD5 as the ETag.
pub async fn upload(
    State(transfers): State<std::sync::Arc<Transfers>>,
    UrlPath(token): UrlPath<String>,
    body: Body,
) -> Response {
    let expected = match transfers.begin_receiving(&token) {
        Ok(upload) => upload,
        Err(UploadRefused::Unknown) => {
            return plain(StatusCode::NOT_FOUND, "This upload link is unknown or has expired.");
        }
        Err(UploadRefused::Busy) => {
            return plain(StatusCode::CONFLICT, "This upload link has already been used.");
        }
    };
    let mut guard = ReceivingGuard { transfers: &transfers, token: &token, path: &expected.path, finished: false };
    match receive(body, &expected.path).await {
        Ok(md5) => {
            guard.finished = true;
            if !transfers.end_receiving(&token, Some(md5.clone())) {
                let _ = tokio::fs::remove_file(&expected.path).await;
                return plain(StatusCode::NOT_FOUND, "This upload link expired while the file arrived.");
            }
            let mut response = StatusCode::OK.into_response();
            if let Ok(value) = HeaderValue::from_str(&format!("\"{md5}\"")) {
                response.headers_mut().insert(header::ETAG, value);
            }
            response
        }
        // The guard removes the partial file and frees the URL for another try.
        Err((status, why)) => plain(status, &why),
    }
}

/// Streams a body into a file, hashing it on the way.
async fn receive(body: Body, path: &Path) -> Result<String, (StatusCode, String)> {
    let failed = |e: std::io::Error| (StatusCode::INTERNAL_SERVER_ERROR, format!("could not store the upload: {e}"));
    let mut file = tokio::fs::File::create(path).await.map_err(failed)?;
    let mut hash = Md5::new();
    let mut size = 0u64;
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| (StatusCode::BAD_REQUEST, format!("the upload was cut short: {e}")))?;
        if let Some(data) = frame.data_ref() {
            size += data.len() as u64;
            if size > MAX_UPLOAD_BYTES {
                return Err((StatusCode::PAYLOAD_TOO_LARGE, "imports are limited to 5 GB".into()));
            }
            hash.update(data);
            file.write_all(data).await.map_err(failed)?;
        }
    }
    // tokio writes in the background: a failed last write (a full disk) is reported by flush,
    // never by sync_all, and an import of a cut file would run what arrived.
    file.flush().await.map_err(failed)?;
    file.sync_all().await.map_err(failed)?;
    Ok(hex::encode(hash.finalize()))
}
