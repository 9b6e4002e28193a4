//! A `kura serve` child process — the release binary built beside the benchmark — on free
//! ports and a fresh data directory, with the benchmark's account, token and S3 key.

use std::io::BufRead;

/// A running `kura serve`; killed when dropped.
pub struct KuraChild {
    child: std::process::Child,
    /// `http://127.0.0.1:port` of the v4 API listener.
    pub api: String,
    /// The S3 listener's base URL.
    pub s3: String,
    _dir: tempfile::TempDir,
}

impl KuraChild {
    /// Starts `kura serve` with `args` and `env` beside the benchmark's own.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<KuraChild> {
        let dir = tempfile::tempdir()?;
        let mut child = std::process::Command::new(kura_binary()?)
            .args(["serve", "--listen", "127.0.0.1:0", "--s3-listen", "127.0.0.1:0", "--workers-listen", "127.0.0.1:0"])
            .arg("--data")
            .arg(dir.path().join("data"))
            .args(args)
            .env("KURA_ACCOUNT_ID", crate::server::ACCOUNT)
            .env("KURA_API_TOKEN", crate::server::TOKEN)
            .env("KURA_S3_ACCESS_KEY_ID", crate::server::S3_KEY)
            .env("KURA_S3_SECRET_ACCESS_KEY", crate::server::S3_SECRET)
            .env("KURA_LOG", "error")
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()?;
        let stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
        let (mut api, mut s3) = (None, None);
        for line in stdout.lines() {
            let line = line?;
            if let Some(url) = line.trim().strip_prefix("API (Cloudflare v4):") {
                api = Some(url.trim().to_owned());
            }
            if let Some(url) = line.trim().strip_prefix("S3:") {
                s3 = Some(url.trim().to_owned());
            }
            if line == "ready" {
                break;
            }
        }
        let (api, s3) = api.zip(s3).ok_or_else(|| anyhow::anyhow!("kura serve {args:?} did not start"))?;
        Ok(KuraChild { child, api, s3, _dir: dir })
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for KuraChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `kura` binary built beside this benchmark (`cargo build --release -p kura-cli`).
fn kura_binary() -> anyhow::Result<std::path::PathBuf> {
    let beside = std::env::current_exe()?.with_file_name("kura");
    anyhow::ensure!(
        beside.exists(),
        "{} is missing: build it first with `cargo build --release -p kura-cli`",
        beside.display()
    );
    Ok(beside)
}
