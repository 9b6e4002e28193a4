//! A `kura serve` child process — kura-testkit's, on the release binary built beside the
//! benchmark — on free ports and a fresh data directory, acting for the test account.

use std::process::Stdio;

use kura_testkit::process::KuraProcess;

/// Starts `kura serve` with `args` and `env` beside the benchmark's own (errors only in its log).
pub fn start(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<KuraProcess> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let mut full = vec![("KURA_LOG", "error".to_owned())];
    full.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
    Ok(KuraProcess::launch(dir, data, &args, &full, Stdio::inherit())?)
}
