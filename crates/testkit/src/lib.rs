//! What kura's tests and its benchmark share across crates: the counts that scale a test from
//! the environment (`KURA_FUZZ_CASES`, `KURA_CRASH_ITERATIONS`), read one way everywhere;
//! [`poll`], the one way a test waits for something that happens in the background (an alarm,
//! a shipment): it polls for the condition with a deadline instead of sleeping a fixed time;
//! and the one way each starts what it runs against, acting for one account
//! ([`credentials`]): kura in this process ([`in_process`], feature `server`), `kura serve` as
//! a child process — one node or a cluster's ([`process`], feature `process`, which `server`
//! includes) — and real etcd, Garage and moto ([`bed`], feature `bed`). An engine's tests take
//! the crate without features, so `cargo test -p` on an engine does not build the server
//! (`cargo test --workspace` unifies the features, and builds it once for all).
//!
//! A count that is set must say how much work to do: zero, or text that is not a number, is
//! refused with a panic naming the variable, rather than read as "use the default" or "do
//! nothing" — either would let a run pass that tested nothing.
//!
//! ```
//! let cases = kura_testkit::count("KURA_TESTKIT_EXAMPLE_UNSET", 400);
//! assert_eq!(cases, 400);
//! ```

#![deny(missing_docs)]

#[cfg(feature = "bed")]
pub mod bed;
pub mod credentials;
#[cfg(feature = "server")]
pub mod in_process;
#[cfg(feature = "process")]
pub mod process;

use std::future::Future;
use std::time::{Duration, Instant};

/// How many cases (or iterations) a test runs: `variable`'s value when set, `default` when not.
///
/// # Panics
///
/// When `variable` is set to zero or to anything but a whole number, so a run that would do no
/// work, or silently the default amount, fails instead of passing.
pub fn count(variable: &str, default: u32) -> u32 {
    match parse(variable, std::env::var(variable).ok().as_deref(), default) {
        Ok(n) => n,
        Err(refusal) => panic!("{refusal}"),
    }
}

/// [`count`]'s reading of `value`, apart from the environment.
fn parse(variable: &str, value: Option<&str>, default: u32) -> Result<u32, String> {
    let Some(value) = value else { return Ok(default) };
    match value.trim().parse::<u32>() {
        Ok(0) => Err(format!("{variable}=0 would run no cases: set it to at least 1, or unset it for {default}")),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{variable}={value:?} is not a count: set a whole number, or unset it for {default}")),
    }
}

/// Polls `check` every 50 ms until it answers `Some`, and answers that; panics naming `what`
/// once `limit` has passed without it. A fixed sleep either wastes time or, on a loaded
/// machine, fails falsely; this waits exactly as long as the condition takes, within a bound.
pub async fn poll<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(done) = check().await {
            return done;
        }
        assert!(Instant::now() < deadline, "{what}: not so after {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn unset_is_the_default_and_a_number_is_itself() {
        assert_eq!(parse("N", None, 7), Ok(7));
        assert_eq!(parse("N", Some("12"), 7), Ok(12));
        assert_eq!(parse("N", Some(" 3 "), 7), Ok(3));
    }

    #[test]
    fn zero_and_garbage_are_refused() {
        for bad in ["0", "", "ten", "-1", "1.5", "99999999999"] {
            let refusal = parse("KURA_FUZZ_CASES", Some(bad), 7).unwrap_err();
            assert!(refusal.starts_with("KURA_FUZZ_CASES="), "{refusal}");
        }
    }
}
