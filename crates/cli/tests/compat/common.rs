//! What the suites share beside kura-testkit's harness (a `kura serve` child, the test account):
//! running the kura CLI, wrangler and other programs against it, and a Worker upload as wrangler
//! sends it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub use kura_testkit::credentials::{ACCOUNT, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, TOKEN};
pub use kura_testkit::process::{KuraProcess, compat_dir, installed};

/// The `kura` binary of this package, for running its commands.
/// The SHA-256 of `bytes`, in hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

pub fn kura_bin() -> &'static str {
    env!("CARGO_BIN_EXE_kura")
}

/// POSTs `body` as JSON to `url` with the admin token: the answer's v4 envelope, whatever it says.
pub async fn post_json(http: &reqwest::Client, url: &str, body: &serde_json::Value) -> serde_json::Value {
    let answer = http.post(url).bearer_auth(TOKEN).json(body).send().await.unwrap();
    answer.json().await.unwrap()
}

/// A Worker upload as wrangler sends it to `PUT …/workers/scripts/{name}`: a multipart form of
/// the `metadata` part and one ES module per `(name, source)`. Answers the body and its
/// content type.
pub fn worker_upload(metadata: &serde_json::Value, modules: &[(&str, &str)]) -> (Vec<u8>, String) {
    let boundary = "kura-compat-upload-boundary";
    let mut body = format!(
        "--{boundary}\r\ncontent-disposition: form-data; name=\"metadata\"\r\ncontent-type: application/json\r\n\r\n{metadata}\r\n"
    );
    for (name, source) in modules {
        body.push_str(&format!(
            "--{boundary}\r\ncontent-disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\n\
             content-type: application/javascript+module\r\n\r\n{source}\r\n"
        ));
    }
    body.push_str(&format!("--{boundary}--\r\n"));
    (body.into_bytes(), format!("multipart/form-data; boundary={boundary}"))
}

/// What a command did.
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn from(output: Output) -> Run {
        Run {
            ok: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    pub fn expect_ok(self, what: &str) -> Run {
        assert!(self.ok, "{what} failed\nstdout:\n{}\nstderr:\n{}", self.stdout, self.stderr);
        self
    }

    pub fn json(&self) -> serde_json::Value {
        let start = self.stdout.find(['[', '{']).unwrap_or_else(|| panic!("no JSON in: {}", self.stdout));
        serde_json::from_str(&self.stdout[start..]).unwrap_or_else(|e| panic!("bad JSON ({e}): {}", self.stdout))
    }

    pub fn all(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

/// Runs `program args` in `cwd` with `env`.
pub fn run(program: &Path, args: &[&str], cwd: &Path, env: &[(&str, String)]) -> Run {
    let mut command = Command::new(program);
    command.args(args).current_dir(cwd).stdin(Stdio::null());
    for (k, v) in env {
        command.env(k, v);
    }
    Run::from(command.output().unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display())))
}

/// Runs the `kura` CLI on the data directory `data`.
pub fn kura(cwd: &Path, data: &Path, args: &[&str], env: &[(&str, String)]) -> Run {
    let mut full: Vec<&str> = args.to_vec();
    let data = data.display().to_string();
    full.extend(["--data", &data]);
    let mut env = env.to_vec();
    env.push(("KURA_LOG", "error".into()));
    run(Path::new(kura_bin()), &full, cwd, &env)
}

/// Writes a wrangler.toml binding `DB` to the database `name` (with `id` if given).
pub fn write_wrangler_toml(dir: &Path, name: &str, id: Option<&str>) {
    let id_line = id.map(|i| format!("database_id = \"{i}\"\n")).unwrap_or_default();
    std::fs::write(
        dir.join("wrangler.toml"),
        format!("name = \"app\"\ncompatibility_date = \"2025-01-01\"\n\n[[d1_databases]]\nbinding = \"DB\"\ndatabase_name = \"{name}\"\n{id_line}"),
    )
    .unwrap();
}

/// wrangler as `scripts/test` installed it.
pub fn wrangler() -> PathBuf {
    installed("node_modules/.bin/wrangler")
}

pub struct Wrangler<'a> {
    pub server: &'a KuraProcess,
    pub home: tempfile::TempDir,
}

impl<'a> Wrangler<'a> {
    pub fn new(server: &'a KuraProcess) -> Self {
        Wrangler { server, home: tempfile::tempdir().unwrap() }
    }

    pub fn run(&self, cwd: &Path, args: &[&str]) -> Run {
        self.run_with(cwd, args, true)
    }

    /// Runs wrangler; without the account id it discovers the account through the API.
    pub fn run_with(&self, cwd: &Path, args: &[&str], with_account: bool) -> Run {
        run(&wrangler(), args, cwd, &self.env(with_account))
    }

    /// Starts wrangler with its stdin, stdout and stderr piped (`wrangler tail`, `secret put`).
    pub fn spawn(&self, cwd: &Path, args: &[&str]) -> std::process::Child {
        std::process::Command::new(wrangler())
            .args(args)
            .current_dir(cwd)
            .envs(self.env(true))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("wrangler starts")
    }

    /// The environment wrangler runs in: this server's API and credentials, a home of its own.
    fn env(&self, with_account: bool) -> Vec<(&'static str, String)> {
        let mut env = self.server.remote_env();
        if !with_account {
            env.retain(|(k, _)| *k != "CLOUDFLARE_ACCOUNT_ID");
        }
        env.extend([
            ("WRANGLER_SEND_METRICS", "false".to_owned()),
            ("CI", "true".to_owned()),
            ("NO_COLOR", "1".to_owned()),
            ("FORCE_COLOR", "0".to_owned()),
            ("HOME", self.home.path().display().to_string()),
            ("XDG_CONFIG_HOME", self.home.path().join(".config").display().to_string()),
        ]);
        env
    }

    pub fn ok(&self, cwd: &Path, args: &[&str]) -> Run {
        self.run(cwd, args).expect_ok(&format!("wrangler {}", args.join(" ")))
    }
}

/// Why a call gave no result: the server refused it (in its own words, or in a reply that is
/// not one), the request was never sent (no connection could be made), or it went out and no
/// reply came (the connection failed or broke off).
#[derive(Debug)]
pub(crate) enum Failed {
    Refused(String),
    NotSent(String),
    Gone(String),
}

impl Failed {
    /// What a client's error means for the request: not sent when the connection could not be
    /// made, else gone (it may have reached the server).
    pub fn of(error: reqwest::Error) -> Failed {
        match error.is_connect() {
            true => Failed::NotSent(error.to_string()),
            false => Failed::Gone(error.to_string()),
        }
    }
}

/// A reply that says something went wrong, or makes no sense: a refusal.
impl From<String> for Failed {
    fn from(why: String) -> Failed {
        Failed::Refused(why)
    }
}

impl From<&str> for Failed {
    fn from(why: &str) -> Failed {
        Failed::Refused(why.to_owned())
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Refused(why) => write!(f, "refused: {why}"),
            Failed::NotSent(why) => write!(f, "not sent: {why}"),
            Failed::Gone(why) => write!(f, "no reply: {why}"),
        }
    }
}

/// The files under `dir`, at any depth.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}
