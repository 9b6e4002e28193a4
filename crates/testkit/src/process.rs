//! `kura serve` as a child process — the binary cargo built beside the test or the benchmark —
//! on free ports and a data directory of its own, acting for the [`credentials`](crate::credentials)
//! account; killed when dropped.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::credentials::{ACCOUNT, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, TOKEN};

/// Why `kura serve` could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The binary is not built, or cannot be run.
    #[error(
        "cannot run {binary}: {source} (build it with `cargo build -p kura-cli`, with --release for the benchmark)"
    )]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It did not print its addresses and `ready` within the limit.
    #[error("kura serve {args:?} did not print its API, S3 and Workers addresses and become ready within 60 s")]
    NotReady {
        /// The arguments it was started with.
        args: Vec<String>,
    },
}

/// The `kura` binary cargo built beside this program: in the directory of the running
/// executable (the benchmark, in `target/release`) or in its parent (a test, in
/// `target/debug/deps`; cargo builds a package's binaries before its integration tests).
pub fn kura_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the running program knows its own path");
    let mut dir = exe.parent().expect("a program lives in a directory").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(format!("kura{}", std::env::consts::EXE_SUFFIX))
}

/// Where `scripts/test` installed the npm and Python packages the suites drive
/// (`KURA_COMPAT_DIR`, or `target/compat` of this workspace).
pub fn compat_dir() -> PathBuf {
    std::env::var_os("KURA_COMPAT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/compat"))
}

/// A program `scripts/test` installed, under [`compat_dir`].
///
/// # Panics
///
/// When it is not there: the suites fail, rather than skip, without it.
pub fn installed(relative: &str) -> PathBuf {
    let bin = compat_dir().join(relative);
    assert!(
        bin.exists(),
        "{} is not installed; run the README's test command (scripts/test), which installs it",
        bin.display()
    );
    bin
}

/// A running `kura serve`; killed when dropped.
pub struct KuraProcess {
    child: Child,
    /// The v4 API's base URL (`http://127.0.0.1:port/client/v4`).
    pub api: String,
    /// The S3 listener.
    pub s3: String,
    /// The Workers listener (empty on a cluster node, which serves no Workers).
    pub workers: String,
    /// The data directory.
    pub data: PathBuf,
    /// The directory holding it, removed when this is dropped.
    pub dir: tempfile::TempDir,
}

impl KuraProcess {
    /// Starts a server on a fresh data directory.
    pub fn start() -> KuraProcess {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let data = dir.path().join("data");
        Self::start_on(dir, data)
    }

    /// Starts a server on `data` (inside `dir`, which it keeps).
    pub fn start_on(dir: tempfile::TempDir, data: PathBuf) -> KuraProcess {
        Self::start_with(dir, data, &[], &[])
    }

    /// Starts `kura serve` with more arguments and environment (a cluster node's).
    pub fn start_with(dir: tempfile::TempDir, data: PathBuf, args: &[String], env: &[(&str, String)]) -> KuraProcess {
        Self::start_logging(dir, data, args, env, Stdio::inherit())
    }

    /// As [`KuraProcess::start_with`], its logs (stderr) going to `logs`; it runs Workers in the
    /// workerd `scripts/test` installed.
    ///
    /// # Panics
    ///
    /// When workerd is not installed or the server does not start.
    pub fn start_logging(
        dir: tempfile::TempDir,
        data: PathBuf,
        args: &[String],
        env: &[(&str, String)],
        logs: Stdio,
    ) -> KuraProcess {
        let mut full = vec![("KURA_WORKERD", installed("node_modules/workerd/bin/workerd").display().to_string())];
        full.extend(env.iter().map(|(k, v)| (*k, v.clone())));
        Self::launch(dir, data, args, &full, logs).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts `kura serve` as a newcomer does: in `project` under `dir` as its working
    /// directory, with no
    /// `--data` (so on the default `./.kura`) and no workerd named or installed near it (so
    /// kura fetches its own on the first deploy).
    ///
    /// # Panics
    ///
    /// When the server does not start.
    pub fn start_in(dir: tempfile::TempDir, project: &str) -> KuraProcess {
        let cwd = dir.path().join(project);
        std::fs::create_dir_all(&cwd).expect("the project directory");
        let data = cwd.join(".kura");
        Self::spawn(dir, data, Some(&cwd), &[], &[], Stdio::inherit()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts `kura serve --data <data> <args>` with `env` over the defaults (the test
    /// account's credentials, `KURA_LOG` from `KURA_TEST_LOG` or warnings only).
    pub fn launch(
        dir: tempfile::TempDir,
        data: PathBuf,
        args: &[String],
        env: &[(&str, String)],
        logs: Stdio,
    ) -> Result<KuraProcess, LaunchError> {
        let mut full = args.to_vec();
        full.extend(["--data".to_owned(), data.display().to_string()]);
        Self::spawn(dir, data, None, &full, env, logs)
    }

    /// Starts `kura serve <args>`, in `cwd` when given.
    fn spawn(
        dir: tempfile::TempDir,
        data: PathBuf,
        cwd: Option<&Path>,
        args: &[String],
        env: &[(&str, String)],
        logs: Stdio,
    ) -> Result<KuraProcess, LaunchError> {
        let listen_args =
            ["serve", "--listen", "127.0.0.1:0", "--s3-listen", "127.0.0.1:0", "--workers-listen", "127.0.0.1:0"];
        let binary = kura_binary();
        let mut command = Command::new(&binary);
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        let mut child = command
            .args(listen_args)
            .args(args)
            .env_remove("KURA_WORKERD")
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
            .map_err(|source| LaunchError::Spawn { binary, source })?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = std::sync::mpsc::channel();
        // Read the banner for the addresses, then keep draining so the server never blocks on
        // (or is cut off from) its standard output.
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
                if let Some(rest) = line.trim().strip_prefix("Workers:") {
                    let url = rest.split_whitespace().next().filter(|url| url.starts_with("http"));
                    workers = Some(url.unwrap_or_default().to_owned());
                }
                if line == "ready" {
                    let _ = tx.send(api.take().zip(s3.take()).zip(workers.take()));
                }
            }
        });
        let ready = rx.recv_timeout(Duration::from_secs(60)).ok().flatten();
        let Some(((api, s3), workers)) = ready else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(LaunchError::NotReady { args: args.to_vec() });
        };
        Ok(KuraProcess { child, api, s3, workers, data, dir })
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

    /// Kills the server (as SIGKILL would) and hands back its directory and data directory.
    pub fn stop(mut self) -> (tempfile::TempDir, PathBuf) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("a temporary directory"));
        (dir, self.data.clone())
    }
}

impl Drop for KuraProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
