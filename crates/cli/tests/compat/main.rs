//! Client compatibility: the real `kura` binary as a server, driven by real wrangler 4.85.0
//! and by the `kura` CLI itself, locally and remotely.
//!
//! wrangler is installed by the README's test command (`scripts/test`) into `target/compat`;
//! these tests fail, rather than skip, when it is missing.

mod common;
mod crash;
mod kura_cli;
mod wrangler;
