//! kura's SQLite core, shared by D1, R2's metadata and Durable Objects.
//!
//! - [`Database`]: one file's read-write connection, configured as D1 configures SQLite (WAL,
//!   `synchronous=FULL`, foreign keys, defensive mode, D1's [`Limits`] and authorizer), and the
//!   executor that runs a [`Request`] and reports D1's [`Meta`] for each statement.
//! - [`Registry`]: one actor per open file with a bounded queue, run on a shared pool of threads
//!   while it has work; requests queued together share one transaction and one fsync (group
//!   commit), each in its own savepoint.
//!
//! ```no_run
//! # async fn demo() -> kura_sqlite::Result<()> {
//! use kura_sqlite::{DatabaseOptions, Registry, RegistrySettings, Request, Statement};
//! let registry = Registry::new(RegistrySettings::default(), |key: &str| {
//!     Some(DatabaseOptions::new(format!("/tmp/{key}.sqlite")).create(true))
//! });
//! let results = registry
//!     .execute("demo", Request::new(vec![Statement::new("CREATE TABLE t (x); INSERT INTO t VALUES (1)")]))
//!     .await?;
//! assert_eq!(results.len(), 2);
//! # Ok(()) }
//! ```
//!
//! # How the meta counters are computed
//!
//! D1 patches SQLite's virtual machine to count rows; stock SQLite has no such counters, so
//! kura derives them from public interfaces:
//! - `rows_read` is the sum of SQLite's per-loop visit counters (`sqlite3_stmt_scanstatus_v2`,
//!   `SQLITE_SCANSTAT_NVISIT`): each row a scan or index lookup visits counts once, which is
//!   D1's rule for scans and joins. Point lookups that find nothing, `count(*)`'s fast path and
//!   the existence check of an explicit-rowid INSERT are not counted. `CREATE TABLE` counts 1.
//!   The counters are on for the whole connection (turning them off and on per statement would
//!   make SQLite prepare every statement anew). SQLite would also time every instruction with
//!   the CPU's timestamp counter while they are; the build (`.cargo/config.toml`) gives it a
//!   timer that returns 0, since kura reads visits, never cycles.
//! - `rows_written` is the `total_changes()` delta (rows, trigger writes included) plus one
//!   entry per index of the written table for each inserted row, and per index over an updated
//!   column for each updated row; `CREATE TABLE` counts 2 (its schema row, written twice).

#![deny(missing_docs)]

// kura's SQLite is built with scan counters (D1's `rows_read`) and the `sqlite_dbpage` table
// (`size_after`, snapshots through the connection, following another writer's WAL). Without
// them this would be a different engine that no test runs.
#[cfg(not(all(kura_scanstatus, kura_dbpage)))]
compile_error!(
    "kura-sqlite needs SQLite built with its options: set LIBSQLITE3_FLAGS as the workspace's \
     .cargo/config.toml does (SQLITE_ENABLE_STMT_SCANSTATUS SQLITE_ENABLE_DBPAGE_VTAB \
     SQLITE_ENABLE_MATH_FUNCTIONS -DHAVE_FDATASYNC=1 -D__STRICT_ANSI__), or build inside the workspace"
);

mod actor;
mod database;
pub mod dump;
mod error;
mod history;
pub mod placement;
mod policy;
mod pool;
mod raw;
mod registry;
mod replica;
mod request;
pub mod stats;

pub use actor::Executed;
pub use database::{COMPACT_CACHE_KIB, Database, DatabaseOptions, make_compact};
pub use error::{Error, Result, TRANSACTION_MESSAGE, code_name, extended_code_name, is_disk_full};
pub use history::{
    Bookmark, Follower, HistorySettings, LogCheck, LogDamage, LogShipper, LogView, MalformedBookmark, Moment, Restored,
    SegmentView, ShipError, log_dir, materialize, materialize_in, open_elsewhere, segment_file_name,
    snapshot_file_name, verify as verify_history,
};
pub use placement::{Placement, PlacementError, ReadReplicas, ReleaseFile, ReplicaFigures};
pub use policy::Limits;
pub use registry::{Opener, Registry, RegistrySettings};
pub use replica::{Continuity, Replica, ReplicaRead};
pub use request::{Access, Meta, Request, ResultMode, Statement, StatementResult, Value};
pub use stats::{DatabaseFigures, Histogram, HistogramSnapshot, Stats};

/// Configures SQLite for a process that may hold a thousand connections open: no up-front
/// page-cache allocation per connection (SQLite's default reserves about 90 KB in each on its
/// first read; pages are then allocated one by one, as they are needed). Takes effect only
/// before SQLite's first connection in the process, so call it first thing (opening a
/// [`Database`] also calls it); later calls do nothing.
pub fn configure_process() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: sqlite3_config is documented as safe before sqlite3_initialize; after it, it
        // answers SQLITE_MISUSE and changes nothing.
        let rc = unsafe {
            rusqlite::ffi::sqlite3_config(
                rusqlite::ffi::SQLITE_CONFIG_PAGECACHE,
                std::ptr::null_mut::<std::ffi::c_void>(),
                0 as std::ffi::c_int,
                0 as std::ffi::c_int,
            )
        };
        if rc != rusqlite::ffi::SQLITE_OK {
            tracing::debug!(rc, "SQLite was already initialized; its page cache keeps its defaults");
        }
    });
}
