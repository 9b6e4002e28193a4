//! Client compatibility: the real `kura` binary as a server, driven by real wrangler 4.85.0,
//! by real workerd through its own D1 binding, and by the `kura` CLI itself, locally and
//! remotely.
//!
//! wrangler (and the workerd it depends on) is installed by the README's test command
//! (`scripts/test`) into `target/compat`; these tests fail, rather than skip, when it is missing.

mod common;
mod crash;
mod kura_cli;
mod workerd;
mod wrangler;
