//! kura's catalog: the accounts, API tokens and resource registry of one data directory, kept in
//! `catalog.sqlite`.
//!
//! - [`Catalog`]: the open catalog; cheap to share behind an `Arc`.
//! - accounts ([`Account`]), API tokens ([`Token`], [`Scope`]), D1 databases ([`D1Database`])
//!   and their hourly usage ([`Usage`]), R2 buckets ([`R2Bucket`]) and the S3 keys that reach
//!   them ([`S3Credential`], derived from tokens as R2 derives them), Durable Object namespaces
//!   ([`DoNamespace`]), deployed Workers ([`WorkerScript`], their versions, deployments and
//!   secrets).
//!
//! The catalog is small and written rarely: one connection reads and another writes, each
//! behind a mutex, so reads (every request authenticates) never wait behind a write that waits
//! for another process. It is safe to open from two processes at once (a running server and
//! `kura tokens create`): SQLite's own locking orders their writes, and nothing is cached across
//! calls.
//!
//! ```no_run
//! # fn demo() -> Result<(), kura_catalog::Error> {
//! let catalog = kura_catalog::Catalog::open("/tmp/catalog.sqlite")?;
//! let account = catalog.create_account(None, "me")?;
//! let (token, secret) = catalog.create_token(&account.id, "ci", kura_catalog::Scope::Admin, None)?;
//! assert_eq!(catalog.authenticate(&secret)?.map(|t| t.id), Some(token.id));
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod account;
mod d1;
mod durable_objects;
mod r2;
mod token;
mod workers;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

pub use account::{Account, is_valid_account_id};
pub use d1::{D1Database, D1DatabaseList, NewD1Database, Usage, UsageDelta, is_valid_database_name};
pub use durable_objects::{DoNamespace, NewDoNamespace, is_valid_namespace_name};
pub use r2::{R2Bucket, S3Credential, is_valid_bucket_name};
pub use token::{Scope, Token};
pub use workers::{
    HOST_KURA, HOST_WORKERD, NamespaceChange, NewWorkerVersion, RecordedVersion, WorkerDeployment, WorkerScript,
    WorkerVersion, is_valid_binding_name, is_valid_script_name,
};

/// What can go wrong with the catalog, grouped by what the caller must do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A name is already taken within the account.
    #[error("a {kind} with that name already exists")]
    Duplicate {
        /// What kind of resource.
        kind: &'static str,
    },
    /// The account holds as many resources of this kind as it may.
    #[error("System limit reached: {what} ({limit})")]
    LimitReached {
        /// Which limit.
        what: &'static str,
        /// Its value.
        limit: u64,
    },
    /// The input is not acceptable (bad id, bad name, unknown scope).
    #[error("{0}")]
    Invalid(String),
    /// An id or token secret already belongs to another account.
    #[error("{0}")]
    Conflict(String),
    /// The catalog file failed.
    #[error("catalog {path}: {source}")]
    Storage {
        /// The catalog file.
        path: PathBuf,
        /// SQLite's error.
        source: rusqlite::Error,
    },
}

/// Results of catalog calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The open catalog of one data directory.
pub struct Catalog {
    reader: Mutex<rusqlite::Connection>,
    writer: Mutex<rusqlite::Connection>,
    path: PathBuf,
}

/// The catalog's schema, one entry per version; applied in order, never edited once shipped.
const MIGRATIONS: &[&str] = &[
    r#"
    CREATE TABLE accounts (
        id         TEXT PRIMARY KEY,
        name       TEXT NOT NULL,
        created_at TEXT NOT NULL
    );
    CREATE TABLE tokens (
        id          TEXT PRIMARY KEY,
        account_id  TEXT NOT NULL REFERENCES accounts(id),
        name        TEXT NOT NULL,
        secret_hash TEXT NOT NULL UNIQUE,
        scope       TEXT NOT NULL,
        created_at  TEXT NOT NULL,
        revoked_at  TEXT
    );
    CREATE TABLE d1_databases (
        uuid                  TEXT PRIMARY KEY,
        account_id            TEXT NOT NULL REFERENCES accounts(id),
        name                  TEXT NOT NULL,
        created_at            TEXT NOT NULL,
        primary_location_hint TEXT,
        jurisdiction          TEXT,
        read_replication      TEXT NOT NULL DEFAULT 'disabled',
        UNIQUE (account_id, name)
    );
    CREATE TABLE d1_usage (
        database_id   TEXT NOT NULL,
        hour          INTEGER NOT NULL,
        read_queries  INTEGER NOT NULL DEFAULT 0,
        write_queries INTEGER NOT NULL DEFAULT 0,
        rows_read     INTEGER NOT NULL DEFAULT 0,
        rows_written  INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (database_id, hour)
    ) WITHOUT ROWID;
"#,
    r#"
    CREATE TABLE r2_buckets (
        id            TEXT PRIMARY KEY,
        account_id    TEXT NOT NULL REFERENCES accounts(id),
        name          TEXT NOT NULL,
        created_at    TEXT NOT NULL,
        location      TEXT,
        storage_class TEXT NOT NULL DEFAULT 'Standard',
        UNIQUE (account_id, name)
    );
    CREATE TABLE s3_keys (
        access_key_id TEXT PRIMARY KEY,
        account_id    TEXT NOT NULL REFERENCES accounts(id),
        secret        TEXT NOT NULL,
        scope         TEXT NOT NULL,
        buckets       TEXT,
        created_at    TEXT NOT NULL
    );
    ALTER TABLE tokens ADD COLUMN buckets TEXT;
"#,
    r#"
    CREATE TABLE do_namespaces (
        id          TEXT PRIMARY KEY,
        account_id  TEXT NOT NULL REFERENCES accounts(id),
        name        TEXT NOT NULL,
        script      TEXT,
        class_name  TEXT NOT NULL,
        unique_key  TEXT NOT NULL,
        alarm_url   TEXT,
        created_at  TEXT NOT NULL,
        UNIQUE (account_id, name)
    );
"#,
    r#"
    ALTER TABLE do_namespaces ADD COLUMN host TEXT NOT NULL DEFAULT 'kura';
    ALTER TABLE do_namespaces ADD COLUMN use_sqlite INTEGER NOT NULL DEFAULT 1;
    CREATE TABLE workers_scripts (
        id                TEXT PRIMARY KEY,
        account_id        TEXT NOT NULL REFERENCES accounts(id),
        name              TEXT NOT NULL,
        created_on        TEXT NOT NULL,
        modified_on       TEXT NOT NULL,
        migration_tag     TEXT,
        subdomain_enabled INTEGER NOT NULL DEFAULT 0,
        previews_enabled  INTEGER NOT NULL DEFAULT 0,
        deployed_version  TEXT,
        UNIQUE (account_id, name)
    );
    CREATE TABLE workers_versions (
        id          TEXT PRIMARY KEY,
        script_id   TEXT NOT NULL REFERENCES workers_scripts(id),
        number      INTEGER NOT NULL,
        created_on  TEXT NOT NULL,
        source      TEXT NOT NULL,
        metadata    TEXT NOT NULL,
        annotations TEXT,
        UNIQUE (script_id, number)
    );
    CREATE TABLE workers_deployments (
        id          TEXT PRIMARY KEY,
        script_id   TEXT NOT NULL REFERENCES workers_scripts(id),
        version_id  TEXT NOT NULL REFERENCES workers_versions(id),
        created_on  TEXT NOT NULL,
        source      TEXT NOT NULL,
        annotations TEXT
    );
    CREATE TABLE workers_secrets (
        script_id TEXT NOT NULL REFERENCES workers_scripts(id),
        name      TEXT NOT NULL,
        text      TEXT NOT NULL,
        PRIMARY KEY (script_id, name)
    ) WITHOUT ROWID;
"#,
];

impl Catalog {
    /// Opens the catalog at `path`, creating it and bringing its schema up to date.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_owned();
        let reader = connect(&path)?;
        let catalog = Catalog { reader: Mutex::new(reader), writer: Mutex::new(connect(&path)?), path };
        catalog.migrate()?;
        Ok(catalog)
    }

    /// The catalog file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn migrate(&self) -> Result<()> {
        self.write(|tx| {
            let version: usize = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            for (i, migration) in MIGRATIONS.iter().enumerate().skip(version) {
                tx.execute_batch(migration)?;
                tx.pragma_update(None, "user_version", i + 1)?;
            }
            Ok(())
        })
    }

    fn lock_reader(&self) -> MutexGuard<'_, rusqlite::Connection> {
        self.reader.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_writer(&self) -> MutexGuard<'_, rusqlite::Connection> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn storage(&self, source: rusqlite::Error) -> Error {
        Error::Storage { path: self.path.clone(), source }
    }

    /// Runs `f` on the connection.
    fn read<T>(&self, f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T>) -> Result<T> {
        f(&self.lock_reader()).map_err(|e| self.storage(e))
    }

    /// Runs `f` in an immediate transaction (so two processes never deadlock upgrading locks).
    fn write<T>(&self, f: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T>) -> Result<T> {
        let mut conn = self.lock_writer();
        let tx =
            conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(|e| self.storage(e))?;
        let out = f(&tx).map_err(|e| self.storage(e))?;
        tx.commit().map_err(|e| self.storage(e))?;
        Ok(out)
    }

    /// Like [`Catalog::write`], for closures that return catalog errors of their own.
    fn write_checked<T>(&self, f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T>) -> Result<T> {
        let mut conn = self.lock_writer();
        let tx =
            conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(|e| self.storage(e))?;
        let out = f(&tx)?;
        tx.commit().map_err(|e| self.storage(e))?;
        Ok(out)
    }
}

/// One connection to the catalog file, configured.
fn connect(path: &Path) -> Result<rusqlite::Connection> {
    let storage = |source| Error::Storage { path: path.to_owned(), source };
    let conn = rusqlite::Connection::open(path).map_err(storage)?;
    conn.busy_timeout(Duration::from_secs(10)).map_err(storage)?;
    conn.pragma_update(None, "journal_mode", "WAL").map_err(storage)?;
    conn.pragma_update(None, "synchronous", "FULL").map_err(storage)?;
    conn.pragma_update(None, "foreign_keys", "ON").map_err(storage)?;
    // Stable plans, so cached statements are not re-prepared for every new bound value.
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).map_err(storage)?;
    Ok(conn)
}

/// Now, as the ISO 8601 text Cloudflare's API uses (`2024-01-01T00:00:00.000Z`).
pub(crate) fn now_iso() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// `n` random bytes as lowercase hex.
pub(crate) fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    getrandom::fill(&mut bytes).expect("the operating system's random source failed");
    hex::encode(bytes)
}
