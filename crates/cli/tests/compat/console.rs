//! The web console in a real browser: Debian's headless Chromium, driven by puppeteer-core
//! (both installed by `scripts/test`), runs `console/console.test.mjs` against the real server.
//! Its screenshots land in `target/console-screenshots/` for review.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{ACCOUNT, KuraProcess, TOKEN, installed};

/// Debian's Chromium binary (the `/usr/bin/chromium` wrapper only adds flags).
fn chromium() -> PathBuf {
    let found = ["/usr/lib/chromium/chromium", "/usr/bin/chromium"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .or_else(|| std::env::var_os("KURA_CHROMIUM").map(PathBuf::from));
    found.expect("Chromium is not installed; run the README's test command (scripts/test), which installs it")
}

#[test]
fn the_console_in_headless_chromium() {
    let puppeteer = installed("node_modules/puppeteer-core");
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    let screenshots = target.canonicalize().unwrap_or(target).join("console-screenshots");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat/console/console.test.mjs");
    let server = KuraProcess::start();
    let out = Command::new("node")
        .arg(&script)
        .env("KURA_URL", server.api.trim_end_matches("/client/v4"))
        .env("KURA_WORKERS_URL", &server.workers)
        .env("KURA_API_TOKEN", TOKEN)
        .env("KURA_ACCOUNT_ID", ACCOUNT)
        .env("CHROMIUM", chromium())
        .env("SCREENSHOTS", &screenshots)
        .env("PUPPETEER", &puppeteer)
        .output()
        .expect("node runs (scripts/test needs it)");
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the console's browser test failed:\n{report}");
    assert!(report.contains("checks passed"), "{report}");
    eprintln!("{report}");
}
