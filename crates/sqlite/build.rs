//! Tells the crate which optional SQLite features the bundled build has.
//!
//! `rows_read` comes from `sqlite3_stmt_scanstatus_v2`, which exists only when SQLite is compiled
//! with `SQLITE_ENABLE_STMT_SCANSTATUS`; `size_after` is read from page 1 through the
//! `sqlite_dbpage` table (`SQLITE_ENABLE_DBPAGE_VTAB`). The workspace's `.cargo/config.toml`
//! asks for both through `LIBSQLITE3_FLAGS`; a build without them is refused (`src/lib.rs`),
//! rather than silently building a different engine no test runs.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(kura_scanstatus)");
    println!("cargo::rustc-check-cfg=cfg(kura_dbpage)");
    println!("cargo::rerun-if-env-changed=LIBSQLITE3_FLAGS");
    let flags = std::env::var("LIBSQLITE3_FLAGS").unwrap_or_default();
    let has = |name: &str| flags.split_whitespace().any(|f| f.trim_start_matches("-D") == name);
    if has("SQLITE_ENABLE_STMT_SCANSTATUS") {
        println!("cargo::rustc-cfg=kura_scanstatus");
    }
    if has("SQLITE_ENABLE_DBPAGE_VTAB") {
        println!("cargo::rustc-cfg=kura_dbpage");
    }
}
