//! The crash test's long mode: `crash_random` (kill -9 at random moments of a mixed D1, R2,
//! Durable Objects and Workers workload, each restart checked against a model of what was acknowledged, and
//! the stopped directory by `kura check`), bounded in `scripts/test`, run here for many kills.
//! Its progress streams as it runs; a failure names the seed that replays it.

use anyhow::Context;

use crate::fuzz::cargo_test;

pub fn run(kills: u64, seed: Option<u64>) -> anyhow::Result<()> {
    let mut env = vec![("KURA_CRASH_ITERATIONS", kills.to_string()), ("KURA_TEST_LOG", "error".to_owned())];
    if let Some(seed) = seed {
        env.push(("KURA_CRASH_SEED", seed.to_string()));
    }
    println!("crash test: {kills} kills (KURA_CRASH_ITERATIONS)");
    let started = std::time::Instant::now();
    let status = cargo_test(&["-p", "kura-cli", "--test", "compat", "crash_random::"], &["--nocapture"], &env)
        .status()
        .context("running cargo test for the crash test")?;
    println!(
        "crash test: {} after {:.0} s",
        if status.success() { "passed" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    anyhow::ensure!(status.success(), "the crash test found a fault (its seed is printed above)");
    Ok(())
}
