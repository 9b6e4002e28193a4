//! The peer: Miniflare (Cloudflare's local simulator) running the same work inside a Worker,
//! driven by the shared `miniflare_peer.mjs` and installed from npm on first use.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Settings;

/// The Miniflare version verified to run on this machine's Node 20.
const MINIFLARE: &str = "4.20260730.0";

/// One figure the peer printed.
#[derive(Debug, Clone)]
pub struct Figure {
    pub op: String,
    pub vantage: String,
    pub ops_per_s: f64,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory Miniflare is installed in (installing it on first use); an error says why it
/// cannot be.
pub fn install() -> Result<PathBuf, String> {
    let node_ok = Command::new("node").arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    if !node_ok {
        return Err("node is not installed".into());
    }
    let dir = workspace().join("target/peer");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let installed = std::fs::read_to_string(dir.join("node_modules/miniflare/package.json"))
        .map(|p| p.contains(&format!("\"version\": \"{MINIFLARE}\"")))
        .unwrap_or(false);
    if !installed {
        eprintln!("installing miniflare@{MINIFLARE} for the peer (once)…");
        if !dir.join("package.json").exists() {
            std::fs::write(dir.join("package.json"), "{\"name\":\"kura-peer\",\"private\":true}")
                .map_err(|e| e.to_string())?;
        }
        let status = Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--loglevel=error", &format!("miniflare@{MINIFLARE}")])
            .current_dir(&dir)
            .status()
            .map_err(|e| format!("npm: {e}"))?;
        if !status.success() {
            return Err("npm could not install miniflare".into());
        }
    }
    Ok(dir)
}

/// Runs the peer's worker-side `ops`; an error says why the peer is unavailable.
pub fn run(settings: &Settings, ops: &[&str], persist: &Path) -> Result<Vec<Figure>, String> {
    let script = settings.peer_script.clone().unwrap_or_else(|| workspace().join("../shared/bench/miniflare_peer.mjs"));
    if !script.is_file() {
        return Err(format!("peer script not found at {}", script.display()));
    }
    let dir = install()?;
    let local_script = dir.join("miniflare_peer.mjs");
    std::fs::copy(&script, &local_script).map_err(|e| e.to_string())?;
    let output = Command::new("node")
        .arg(&local_script)
        .arg(persist)
        .arg(settings.peer_ops.to_string())
        .arg(ops.join(","))
        .current_dir(&dir)
        .output()
        .map_err(|e| format!("node: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "the peer failed: {}",
            String::from_utf8_lossy(&output.stderr).lines().last().unwrap_or("")
        ));
    }
    let figures = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| Figure {
            op: v["op"].as_str().unwrap_or_default().to_owned(),
            vantage: v["vantage"].as_str().unwrap_or_default().to_owned(),
            ops_per_s: v["ops_per_s"].as_f64().unwrap_or(0.0),
        })
        .collect();
    Ok(figures)
}

/// The peer's worker-side rate for an op, if it ran.
pub fn rate(figures: &[Figure], op: &str) -> Option<f64> {
    rate_from(figures, op, "worker")
}

/// The peer's rate for an op from one vantage point (`worker` or `node`), if it ran.
pub fn rate_from(figures: &[Figure], op: &str, vantage: &str) -> Option<f64> {
    figures.iter().find(|f| f.op == op && f.vantage == vantage).map(|f| f.ops_per_s)
}
