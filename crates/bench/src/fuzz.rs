//! The fuzz targets' long mode: every property-based target of outside input (kura's own
//! `proptest` tests, bounded in `scripts/test`) run again with many more cases through
//! `cargo test`, which builds them as the tests build them. Prints each target's cases, time and
//! outcome; a failure prints the minimal failing input proptest found.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::Context;

/// `cargo test` arguments of each target, and what it feeds.
const TARGETS: &[(&str, &[&str])] = &[
    ("SQL text through the engine", &["-p", "kura-sqlite", "--test", "core", "fuzz::"]),
    ("bookmarks", &["-p", "kura-sqlite", "--lib", "bookmark::tests::"]),
    ("RFC 2047 metadata", &["-p", "kura-server", "--lib", "rfc2047::tests::"]),
    ("R2 binding: Range header, request JSON", &["-p", "kura-server", "--lib", "binding::r2::tests::"]),
    ("listing cursors and continuation tokens", &["-p", "kura-r2", "--lib", "list::tests::"]),
    ("wrangler config files (JSON, JSONC, TOML)", &["-p", "kura-cli", "--bin", "kura", "config::tests::"]),
    ("hostile S3 requests and aws-chunked uploads at the wire", &["-p", "kura-cli", "--test", "compat", "s3_fuzz::"]),
    ("hostile v4 JSON and binding frames at the wire", &["-p", "kura-cli", "--test", "compat", "api_fuzz::"]),
    ("hostile Worker uploads at the wire", &["-p", "kura-cli", "--test", "compat", "workers_fuzz::"]),
];

/// `cargo test` in the workspace with `args`, the test binary's `test_args` after `--` (one
/// test at a time), and `env`: the tests built as `scripts/test` builds them.
pub fn cargo_test(args: &[&str], test_args: &[&str], env: &[(&str, String)]) -> Command {
    let mut command = Command::new(env!("CARGO"));
    command
        .arg("test")
        .args(args)
        .args(["--", "--test-threads=1"])
        .args(test_args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
    command
}

pub fn run(cases: u64) -> anyhow::Result<()> {
    let mut failed = 0;
    println!("fuzz targets, {cases} cases each (KURA_FUZZ_CASES)");
    for (name, args) in TARGETS {
        let started = Instant::now();
        let output = cargo_test(args, &[], &[("KURA_FUZZ_CASES", cases.to_string())])
            .output()
            .with_context(|| format!("running cargo test for {name}"))?;
        let took = started.elapsed().as_secs_f64();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let ran = stdout.lines().filter(|l| l.starts_with("test ") && l.ends_with(" ok")).count();
        if output.status.success() {
            println!("  {name:<48} ok      {ran} tests, {took:.0} s");
        } else {
            failed += 1;
            println!("  {name:<48} FAILED  after {took:.0} s");
            let stderr = String::from_utf8_lossy(&output.stderr);
            for line in stdout
                .lines()
                .chain(stderr.lines())
                .filter(|l| l.contains("minimal failing input") || l.contains("panicked"))
            {
                println!("      {line}");
            }
        }
    }
    anyhow::ensure!(failed == 0, "{failed} fuzz target(s) found a fault");
    Ok(())
}
