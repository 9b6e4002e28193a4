//! Static assets (`[assets]`): wrangler's upload session — a manifest of hashes, answered with
//! the buckets of files kura lacks; uploads checked against their hashes; a completion token the
//! script upload names — into content-addressed files that every version shares (a file is
//! stored once, whatever number of versions list it), and each version's manifest and serving
//! rules, kept in its directory so a rollback serves its own files. How they are served is
//! [`serve`]'s.

pub mod serve;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::error::{Result, WorkersError};

/// The largest file (Cloudflare's `Asset too large.` limit).
pub const MAX_ASSET_BYTES: u64 = 25 * 1024 * 1024;

/// The most files one version may have.
pub const MAX_ASSETS: usize = 100_000;

/// How long an upload session's token and a completion token last (Cloudflare's hour).
const TOKEN_LIFETIME: Duration = Duration::from_secs(3600);

/// About how many bytes of files one bucket (one upload request) carries.
const BUCKET_BYTES: u64 = 16 * 1024 * 1024;

/// The name of a version's assets file, in its directory.
pub const VERSION_FILE: &str = "assets.json";

/// One file of a version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Asset {
    /// wrangler's hash: the first 32 hex digits of BLAKE3 over the file's base64 and its
    /// extension. It names the stored file and is the ETag.
    pub hash: String,
    /// Bytes.
    pub size: u64,
    /// The type it was uploaded as (`None`: served without a `Content-Type`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
}

/// `html_handling`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HtmlHandling {
    /// `/about` serves `about.html`, `/blog/` serves `blog/index.html`, the other spellings
    /// redirect there.
    #[default]
    AutoTrailingSlash,
    /// Every HTML page is served at a path ending in `/`.
    ForceTrailingSlash,
    /// Every HTML page is served at a path without a trailing `/`.
    DropTrailingSlash,
    /// Files at their exact paths only.
    None,
}

/// `not_found_handling`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NotFoundHandling {
    /// `/index.html` with 200, for client-side routing.
    SinglePageApplication,
    /// The nearest `404.html` up the path, with 404.
    #[serde(rename = "404-page")]
    NotFoundPage,
    /// Nothing: the Worker runs, or an empty 404.
    #[default]
    None,
}

/// `run_worker_first`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RunWorkerFirst {
    /// Every request (`true`) or none (`false`).
    Always(bool),
    /// Route patterns: `/api/*` to the Worker, `!/api/docs/*` to the assets.
    Patterns(Vec<String>),
}

impl Default for RunWorkerFirst {
    fn default() -> Self {
        RunWorkerFirst::Always(false)
    }
}

/// How a version's assets are served: `metadata.assets.config` of its upload.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssetsConfig {
    /// How HTML pages are found.
    #[serde(default)]
    pub html_handling: HtmlHandling,
    /// What a path with no file gets.
    #[serde(default)]
    pub not_found_handling: NotFoundHandling,
    /// Which requests reach the Worker before the assets.
    #[serde(default)]
    pub run_worker_first: RunWorkerFirst,
    /// The `_redirects` file's text.
    #[serde(default, rename = "_redirects", skip_serializing_if = "Option::is_none")]
    pub redirects: Option<String>,
    /// The `_headers` file's text.
    #[serde(default, rename = "_headers", skip_serializing_if = "Option::is_none")]
    pub headers: Option<String>,
}

impl AssetsConfig {
    /// Reads `metadata.assets.config` (absent: the defaults), checking what it names.
    pub fn parse(config: &Json) -> Result<AssetsConfig> {
        if config.is_null() {
            return Ok(AssetsConfig::default());
        }
        let parsed: AssetsConfig = serde_json::from_value(config.clone())
            .map_err(|e| WorkersError::InvalidAssets(format!("the assets configuration is not one kura knows: {e}")))?;
        if let RunWorkerFirst::Patterns(rules) = &parsed.run_worker_first {
            serve::check_rules(rules)?;
        }
        serve::Rules::parse(&parsed)?;
        Ok(parsed)
    }
}

/// A version's assets: its files by path (`/index.html`) and how they are served. Kept as
/// [`VERSION_FILE`] in the version's directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionAssets {
    /// Path → file.
    pub files: BTreeMap<String, Asset>,
    /// How they are served.
    pub config: AssetsConfig,
}

impl VersionAssets {
    /// Reads a version's assets from its directory; `None` if it has none.
    pub fn read(version_dir: &Path) -> Result<Option<VersionAssets>> {
        let path = version_dir.join(VERSION_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| WorkersError::Storage(format!("{} is unreadable: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(WorkersError::Io { context: format!("reading {}", path.display()), source: e }),
        }
    }

    /// Writes them into a version's directory (synced: the version is recorded next).
    pub fn write(&self, version_dir: &Path) -> Result<()> {
        let path = version_dir.join(VERSION_FILE);
        let text = serde_json::to_vec(self).expect("assets serialise");
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(&text).and_then(|()| f.sync_all()))
            .map_err(WorkersError::io(format!("writing {}", path.display())))
    }
}

/// What a session asked for and what is still missing.
struct Session {
    account_id: String,
    manifest: BTreeMap<String, (String, u64)>,
    /// Hash → the extension it was hashed with (each hash has one: the extension is hashed)
    /// and its size.
    files: HashMap<String, (String, u64)>,
    missing: HashSet<String>,
    expires: Instant,
}

/// A finished session: the files a script upload may now name.
struct Completed {
    account_id: String,
    files: BTreeMap<String, Asset>,
    expires: Instant,
}

/// What an upload session answers: its token, and the hashes to upload, in buckets.
#[derive(Debug, Clone)]
pub struct SessionStarted {
    /// The session's token, or the completion token when nothing is missing.
    pub jwt: String,
    /// Hashes to upload, one request per bucket.
    pub buckets: Vec<Vec<String>>,
}

/// The store of every version's files, and the upload sessions in progress.
pub struct AssetStore {
    dir: PathBuf,
    sessions: Mutex<HashMap<String, Session>>,
    completed: Mutex<HashMap<String, Completed>>,
}

/// Open sessions (and unused completion tokens) an account may have; past that, its oldest go.
const PER_ACCOUNT: usize = 16;

/// Makes room for one more entry of `account_id`: drops its oldest beyond [`PER_ACCOUNT`] - 1.
fn keep_newest<V>(map: &mut HashMap<String, V>, account_id: &str, key: impl Fn(&V) -> (&String, Instant)) {
    let mut mine: Vec<(Instant, String)> =
        map.iter().filter(|(_, v)| key(v).0 == account_id).map(|(k, v)| (key(v).1, k.clone())).collect();
    if mine.len() < PER_ACCOUNT {
        return;
    }
    mine.sort();
    for (_, token) in mine.iter().take(mine.len() + 1 - PER_ACCOUNT) {
        map.remove(token);
    }
}

fn is_hash(text: &str) -> bool {
    text.len() == 32 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// wrangler's hash of a file: BLAKE3 over its base64 text and its extension (without the dot),
/// the first 32 hex digits.
pub fn hash_of(base64_text: &[u8], extension: &str) -> String {
    let mut hasher = blake3::Hasher::new();
    hasher.update(base64_text);
    hasher.update(extension.as_bytes());
    hasher.finalize().to_hex()[..32].to_owned()
}

/// A path's extension as wrangler hashes it: after the last dot of the last segment.
fn extension(path: &str) -> &str {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.rsplit_once('.').map_or("", |(_, ext)| ext)
}

/// A token shaped as a JWT, with the `exp` claim wrangler reads when an upload keeps failing;
/// kura looks tokens up, so its signature part is its secret: 128 random bits.
fn token(expires_in: Duration) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let exp = (SystemTime::now() + expires_in).duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!(
        "{}.{}.{}",
        b64.encode(br#"{"alg":"none","typ":"JWT"}"#),
        b64.encode(format!(r#"{{"exp":{exp}}}"#)),
        crate::random_hex(16)
    )
}

impl AssetStore {
    /// The store in `dir`.
    pub fn new(dir: PathBuf) -> AssetStore {
        AssetStore { dir, sessions: Mutex::default(), completed: Mutex::default() }
    }

    /// The directory the files are in (`<first two hex digits>/<hash>`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the file of `hash` is.
    pub fn file(&self, hash: &str) -> PathBuf {
        self.dir.join(&hash[..2]).join(hash)
    }

    fn type_file(&self, hash: &str) -> PathBuf {
        self.dir.join(&hash[..2]).join(format!("{hash}.type"))
    }

    fn stored(&self, hash: &str) -> bool {
        self.file(hash).is_file()
    }

    /// Starts an upload session for `manifest` (`{"/path": {"hash", "size"}}`): answers the
    /// hashes kura lacks in buckets, or, lacking none, the completion token itself.
    pub fn start_session(&self, account_id: &str, manifest: &Json) -> Result<SessionStarted> {
        let invalid = |m: String| WorkersError::InvalidAssets(m);
        let entries = manifest.as_object().ok_or_else(|| invalid("the manifest must be an object of paths".into()))?;
        if entries.len() > MAX_ASSETS {
            return Err(invalid(format!("{} files; a version may have at most {MAX_ASSETS}", entries.len())));
        }
        let mut session = Session {
            account_id: account_id.to_owned(),
            manifest: BTreeMap::new(),
            files: HashMap::new(),
            missing: HashSet::new(),
            expires: Instant::now() + TOKEN_LIFETIME,
        };
        let mut sizes: BTreeMap<String, u64> = BTreeMap::new();
        for (path, entry) in entries {
            let hash = entry["hash"].as_str().filter(|h| is_hash(h));
            let size = entry["size"].as_u64();
            let (Some(hash), Some(size)) = (hash, size) else {
                return Err(invalid(format!("the manifest's entry for '{path}' needs a 32-hex `hash` and a `size`")));
            };
            if !path.starts_with('/') || path.len() > 4096 || path.contains('\0') {
                return Err(invalid(format!("'{path}' is not an asset path: it must start with '/'")));
            }
            if size > MAX_ASSET_BYTES {
                return Err(invalid(format!(
                    "Asset too large: '{path}' is {size} bytes; the limit is {MAX_ASSET_BYTES}"
                )));
            }
            session.manifest.insert(path.clone(), (hash.to_owned(), size));
            session.files.insert(hash.to_owned(), (extension(path).to_owned(), size));
            if !self.stored(hash) {
                session.missing.insert(hash.to_owned());
                sizes.insert(hash.to_owned(), size);
            }
        }
        if session.missing.is_empty() {
            let jwt = self.complete(&session)?;
            return Ok(SessionStarted { jwt, buckets: Vec::new() });
        }
        let mut buckets: Vec<Vec<String>> = Vec::new();
        let mut filled = u64::MAX;
        for (hash, size) in sizes {
            if filled.saturating_add(size) > BUCKET_BYTES {
                buckets.push(Vec::new());
                filled = 0;
            }
            buckets.last_mut().expect("pushed").push(hash);
            filled += size;
        }
        let jwt = token(TOKEN_LIFETIME);
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.retain(|_, s| s.expires > Instant::now());
        keep_newest(&mut sessions, account_id, |s| (&s.account_id, s.expires));
        sessions.insert(jwt.clone(), session);
        Ok(SessionStarted { jwt, buckets })
    }

    /// Whether `jwt` is an open upload session that lists `hash` (checked before a request's
    /// body is read, so a stranger's upload is refused unread).
    pub fn expects(&self, jwt: &str, hash: Option<&str>) -> bool {
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions
            .get(jwt)
            .filter(|s| s.expires > Instant::now())
            .is_some_and(|s| hash.is_none_or(|h| s.files.contains_key(h)))
    }

    /// Stores one upload request's files (hash, content type, body) for the session `jwt`;
    /// answers the completion token once the session has every file it lacked. A file already
    /// stored is checked and kept as it is: its bytes and type are never replaced.
    pub fn upload(
        &self,
        jwt: &str,
        files: Vec<(String, Option<String>, Vec<u8>)>,
        base64: bool,
    ) -> Result<Option<String>> {
        let invalid = |m: String| WorkersError::InvalidAssets(m);
        // What the session says of this request's files only (a manifest may list 100,000).
        let expected: Vec<Option<(String, u64)>> = {
            let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            let session = sessions.get(jwt).filter(|s| s.expires > Instant::now()).ok_or_else(|| {
                invalid("the asset upload token is unknown or has expired; run `wrangler deploy` again".into())
            })?;
            files.iter().map(|(hash, _, _)| session.files.get(hash).cloned()).collect()
        };
        let mut stored = Vec::new();
        for ((hash, content_type, body), expected) in files.into_iter().zip(expected) {
            let body: &[u8] = &body;
            let Some((ext, size)) = &expected else {
                return Err(invalid(format!("A file was uploaded that does not appear in the manifest: {hash}")));
            };
            let bytes = if base64 {
                let text: Vec<u8> = body.iter().copied().filter(|b| !b.is_ascii_whitespace()).collect();
                if hash_of(&text, ext) != hash {
                    return Err(invalid(format!("the file uploaded as {hash} does not have that hash")));
                }
                base64::engine::general_purpose::STANDARD
                    .decode(&text)
                    .map_err(|e| invalid(format!("the file uploaded as {hash} is not base64: {e}")))?
            } else {
                let text = base64::engine::general_purpose::STANDARD.encode(body);
                if hash_of(text.as_bytes(), ext) != hash {
                    return Err(invalid(format!("the file uploaded as {hash} does not have that hash")));
                }
                body.to_vec()
            };
            if bytes.len() as u64 != *size {
                return Err(invalid(format!("the file uploaded as {hash} is {} bytes, not {size}", bytes.len())));
            }
            // `application/null` is wrangler's "no type known": served without one.
            let content_type = content_type.filter(|t| !t.starts_with("application/null"));
            if !self.stored(&hash) {
                self.store(&hash, content_type.as_deref(), &bytes)?;
            }
            stored.push(hash);
        }
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let Some(session) = sessions.get_mut(jwt) else {
            // Another request finished the session meanwhile; its answer carried the token.
            return Ok(None);
        };
        for hash in stored {
            session.missing.remove(&hash);
        }
        if !session.missing.is_empty() {
            return Ok(None);
        }
        // Completed before the session goes, so its files are always listed by one or the other
        // (the sweep keeps what either lists).
        let completion = self.complete(session)?;
        sessions.remove(jwt);
        Ok(Some(completion))
    }

    /// Writes a file (and its type) under its hash, durably, whole or not at all.
    pub(crate) fn store(&self, hash: &str, content_type: Option<&str>, bytes: &[u8]) -> Result<()> {
        let path = self.file(hash);
        let dir = path.parent().expect("a hash's directory");
        std::fs::create_dir_all(dir).map_err(WorkersError::io(format!("creating {}", dir.display())))?;
        let write = |target: &Path, bytes: &[u8]| -> std::io::Result<()> {
            let partial = target.with_extension(format!("partial-{}", crate::random_hex(4)));
            let mut file = std::fs::File::create(&partial)?;
            file.write_all(bytes)?;
            file.sync_all()?;
            std::fs::rename(&partial, target)
        };
        write(&self.type_file(hash), content_type.unwrap_or("").as_bytes())
            .and_then(|()| write(&path, bytes))
            .and_then(|()| std::fs::File::open(dir)?.sync_all())
            .map_err(WorkersError::io(format!("storing asset {hash}")))
    }

    fn stored_type(&self, hash: &str) -> Option<String> {
        std::fs::read_to_string(self.type_file(hash)).ok().filter(|t| !t.is_empty())
    }

    /// The session's files as stored — the size and type are the stored file's, whatever the
    /// manifest said — under a new completion token.
    fn complete(&self, session: &Session) -> Result<String> {
        let mut files = BTreeMap::new();
        for (path, (hash, _)) in &session.manifest {
            let size =
                std::fs::metadata(self.file(hash)).map_err(WorkersError::io(format!("reading asset {hash}")))?.len();
            files.insert(path.clone(), Asset { hash: hash.clone(), size, content_type: self.stored_type(hash) });
        }
        let jwt = token(TOKEN_LIFETIME);
        let mut completed = self.completed.lock().unwrap_or_else(|p| p.into_inner());
        completed.retain(|_, c| c.expires > Instant::now());
        keep_newest(&mut completed, &session.account_id, |c| (&c.account_id, c.expires));
        completed.insert(
            jwt.clone(),
            Completed { account_id: session.account_id.clone(), files, expires: Instant::now() + TOKEN_LIFETIME },
        );
        Ok(jwt)
    }

    /// The files a completion token stands for, for a script upload of `account_id`.
    pub fn completed(&self, account_id: &str, jwt: &str) -> Result<BTreeMap<String, Asset>> {
        let completed = self.completed.lock().unwrap_or_else(|p| p.into_inner());
        let found = completed.get(jwt).filter(|c| c.expires > Instant::now() && c.account_id == account_id);
        let files = found.map(|c| c.files.clone()).ok_or_else(|| {
            WorkersError::InvalidAssets(
                "the assets' completion token is unknown or has expired; run `wrangler deploy` again".into(),
            )
        })?;
        drop(completed);
        if let Some((path, _)) = files.iter().find(|(_, a)| !self.stored(&a.hash)) {
            return Err(WorkersError::InvalidAssets(format!("the file of '{path}' was never uploaded")));
        }
        Ok(files)
    }

    /// Forgets a completion token once a version has recorded its files: they are the
    /// version's now.
    pub fn consume(&self, jwt: &str) {
        self.completed.lock().unwrap_or_else(|p| p.into_inner()).remove(jwt);
    }

    /// Removes stored files no version lists (`listed`: every hash any version has).
    pub fn sweep(&self, listed: &HashSet<String>) -> Result<usize> {
        let mut removed = 0;
        let Ok(shards) = std::fs::read_dir(&self.dir) else { return Ok(0) };
        // Held to the end: no session starts, uploads or completes while files go, so none
        // can count on a file this sweep removes (one that started before sees its file kept;
        // one that starts after sees it missing and has it uploaded again).
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let completed = self.completed.lock().unwrap_or_else(|p| p.into_inner());
        let pending: HashSet<&str> = sessions
            .values()
            .flat_map(|s| s.manifest.values().map(|(h, _)| h.as_str()))
            .chain(completed.values().flat_map(|c| c.files.values().map(|a| a.hash.as_str())))
            .collect();
        for shard in shards.flatten() {
            for entry in std::fs::read_dir(shard.path()).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let hash = name.split('.').next().unwrap_or("");
                if !listed.contains(hash) && !pending.contains(hash) {
                    let _ = std::fs::remove_file(entry.path());
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hashes_are_wranglers() {
        // wrangler's own test vectors (assets.test.ts).
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        assert_eq!(hash_of(b64("<html></html>").as_bytes(), "html"), "4752155c2c0c0320b40bca1d83e8380a");
        assert_eq!(hash_of(b64("Content of file-1").as_bytes(), "txt"), "0de3dd5df907418e9730fd2bd747bd5e");
        assert_eq!(extension("/a.b/c"), "");
        assert_eq!(extension("/x/archive.tar.gz"), "gz");
    }

    #[test]
    fn a_session_uploads_only_what_is_missing_and_checks_every_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = AssetStore::new(dir.path().to_owned());
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let (page, style) = ("<html></html>", "body{}");
        let (page_hash, style_hash) = (hash_of(b64(page).as_bytes(), "html"), hash_of(b64(style).as_bytes(), "css"));
        let manifest = json!({
            "/index.html": {"hash": page_hash, "size": page.len()},
            "/a/index.html": {"hash": page_hash, "size": page.len()},
            "/style.css": {"hash": style_hash, "size": style.len()},
        });
        let started = store.start_session("acct", &manifest).unwrap();
        assert_eq!(started.buckets.concat().len(), 2, "each hash once");
        let wrong =
            store.upload(&started.jwt, vec![(page_hash.clone(), None, b64("<html>!</html>").into_bytes())], true);
        assert!(matches!(wrong, Err(WorkersError::InvalidAssets(_))), "a file that does not match its hash");
        let first = store
            .upload(&started.jwt, vec![(page_hash.clone(), Some("text/html".into()), b64(page).into_bytes())], true)
            .unwrap();
        assert!(first.is_none(), "one file still missing");
        let done = store
            .upload(
                &started.jwt,
                vec![(style_hash.clone(), Some("application/null".into()), b64(style).into_bytes())],
                true,
            )
            .unwrap()
            .expect("the last file completes the session");
        assert!(store.completed("other", &done).is_err(), "another account's token");
        let files = store.completed("acct", &done).unwrap();
        assert_eq!(files["/a/index.html"].content_type.as_deref(), Some("text/html"));
        assert_eq!(files["/style.css"].content_type, None);
        assert_eq!(std::fs::read(store.file(&style_hash)).unwrap(), style.as_bytes());

        // The same files again: nothing to upload, the answer is the completion token.
        let again = store.start_session("acct", &manifest).unwrap();
        assert!(again.buckets.is_empty());
        assert_eq!(store.completed("acct", &again.jwt).unwrap(), files);

        let listed: HashSet<String> = [page_hash.clone()].into();
        store.completed.lock().unwrap().clear();
        assert_eq!(store.sweep(&listed).unwrap(), 2, "the css and its type file");
        assert!(store.stored(&page_hash) && !store.stored(&style_hash));
    }

    #[test]
    fn bad_manifests_are_refused() {
        let store = AssetStore::new(std::env::temp_dir().join("kura-assets-unused"));
        let hash = "0".repeat(32);
        for manifest in [
            json!([]),
            json!({"nope": {"hash": hash, "size": 1}}),
            json!({"/a": {"hash": "xyz", "size": 1}}),
            json!({"/a": {"hash": hash, "size": MAX_ASSET_BYTES + 1}}),
        ] {
            assert!(matches!(store.start_session("a", &manifest), Err(WorkersError::InvalidAssets(_))), "{manifest}");
        }
    }
}
