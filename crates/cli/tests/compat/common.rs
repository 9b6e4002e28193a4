//! A `kura serve` child process on free ports and a fresh data directory, and helpers to run
//! commands against it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

pub const ACCOUNT: &str = "compat-account";
pub const TOKEN: &str = "compat-admin-token-0123456789abcdef";
pub const S3_ACCESS_KEY_ID: &str = "compat-s3-key";
pub const S3_SECRET_ACCESS_KEY: &str = "compat-s3-secret-0123456789abcdef";

pub fn kura_bin() -> &'static str {
    env!("CARGO_BIN_EXE_kura")
}

/// A running `kura serve`; killed when dropped.
pub struct KuraProcess {
    child: Child,
    pub api: String,
    pub s3: String,
    /// The Workers listener (`http://127.0.0.1:port`).
    pub workers: String,
    pub data: PathBuf,
    pub dir: tempfile::TempDir,
}

impl KuraProcess {
    pub fn start() -> KuraProcess {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        Self::start_on(dir, data)
    }

    pub fn start_on(dir: tempfile::TempDir, data: PathBuf) -> KuraProcess {
        Self::start_with(dir, data, &[], &[])
    }

    /// Starts `kura serve` with more arguments and environment (a cluster node's).
    pub fn start_with(dir: tempfile::TempDir, data: PathBuf, args: &[String], env: &[(&str, String)]) -> KuraProcess {
        Self::start_logging(dir, data, args, env, Stdio::inherit())
    }

    /// As [`KuraProcess::start_with`], its logs (stderr) going to `logs`.
    pub fn start_logging(
        dir: tempfile::TempDir,
        data: PathBuf,
        args: &[String],
        env: &[(&str, String)],
        logs: Stdio,
    ) -> KuraProcess {
        let listen_args =
            ["serve", "--listen", "127.0.0.1:0", "--s3-listen", "127.0.0.1:0", "--workers-listen", "127.0.0.1:0"];
        let mut child = Command::new(kura_bin())
            .args(listen_args)
            .args(args)
            .arg("--data")
            .arg(&data)
            .env("KURA_WORKERD", installed("node_modules/workerd/bin/workerd"))
            .env("KURA_ACCOUNT_ID", ACCOUNT)
            .env("KURA_API_TOKEN", TOKEN)
            .env("KURA_S3_ACCESS_KEY_ID", S3_ACCESS_KEY_ID)
            .env("KURA_S3_SECRET_ACCESS_KEY", S3_SECRET_ACCESS_KEY)
            .env("KURA_S3_DOMAIN", "s3.localhost")
            .env("KURA_LOG", std::env::var("KURA_TEST_LOG").unwrap_or_else(|_| "warn,s3s=off".into()))
            // The caller's environment last: it may set any of the above.
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::piped())
            .stderr(logs)
            .spawn()
            .expect("start kura serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        // Read the banner for the address, then keep draining so the server never blocks on it.
        std::thread::spawn(move || {
            let (mut api, mut s3, mut workers) = (None, None, None);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(url) = line.trim().strip_prefix("API (Cloudflare v4):") {
                    api = Some(url.trim().to_owned());
                }
                if let Some(url) = line.trim().strip_prefix("S3:") {
                    s3 = Some(url.trim().to_owned());
                }
                if let Some(url) = line.trim().strip_prefix("Workers:") {
                    workers = url.split_whitespace().next().map(str::to_owned);
                }
                if line == "ready" {
                    let _ = tx.send(api.take().zip(s3.take()).zip(workers.take()));
                }
            }
        });
        let ((api, s3), workers) = rx
            .recv_timeout(Duration::from_secs(60))
            .ok()
            .flatten()
            .expect("kura serve printed its API, S3 and Workers addresses and became ready");
        KuraProcess { child, api, s3, workers, data, dir }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Environment that points wrangler (or `kura --remote`) at this server.
    pub fn remote_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("CLOUDFLARE_API_BASE_URL", self.api.clone()),
            ("CLOUDFLARE_API_TOKEN", TOKEN.to_owned()),
            ("CLOUDFLARE_ACCOUNT_ID", ACCOUNT.to_owned()),
        ]
    }

    /// Environment that points the AWS CLI and SDKs at this server's S3 listener.
    pub fn s3_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", S3_ACCESS_KEY_ID.to_owned()),
            ("AWS_SECRET_ACCESS_KEY", S3_SECRET_ACCESS_KEY.to_owned()),
            ("AWS_DEFAULT_REGION", "auto".to_owned()),
            ("AWS_ENDPOINT_URL", self.s3.clone()),
            ("KURA_S3_ENDPOINT", self.s3.clone()),
            // Nothing from the developer's own AWS setup may leak in.
            ("AWS_CONFIG_FILE", "/dev/null".to_owned()),
            ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null".to_owned()),
            ("AWS_PAGER", String::new()),
        ]
    }

    pub fn stop(mut self) -> (tempfile::TempDir, PathBuf) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        (dir, self.data.clone())
    }
}

impl Drop for KuraProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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

/// Where `scripts/test` installed the npm packages the suites drive.
pub fn compat_dir() -> PathBuf {
    std::env::var_os("KURA_COMPAT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/compat"))
}

/// A program `scripts/test` installed; the suites fail, rather than skip, without it.
pub fn installed(relative: &str) -> PathBuf {
    let bin = compat_dir().join(relative);
    assert!(
        bin.exists(),
        "{} is not installed; run the README's test command (scripts/test), which installs it",
        bin.display()
    );
    bin
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
        run(&wrangler(), args, cwd, &env)
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
