//! Tells the crate whether the bundled SQLite was built with per-loop scan counters.
//!
//! `rows_read` comes from `sqlite3_stmt_scanstatus_v2`, which exists only when SQLite is compiled
//! with `SQLITE_ENABLE_STMT_SCANSTATUS`. The workspace's `.cargo/config.toml` asks for it through
//! `LIBSQLITE3_FLAGS`; a build without that flag still links and falls back to coarser counters.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(kura_scanstatus)");
    println!("cargo::rerun-if-env-changed=LIBSQLITE3_FLAGS");
    let flags = std::env::var("LIBSQLITE3_FLAGS").unwrap_or_default();
    if flags.split_whitespace().any(|f| f.trim_start_matches("-D") == "SQLITE_ENABLE_STMT_SCANSTATUS") {
        println!("cargo::rustc-cfg=kura_scanstatus");
    }
}
