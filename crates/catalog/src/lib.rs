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
//! `kura tokens create`): SQLite's own locking orders their writes, and what is cached across
//! calls (the rows every request looks up: its token, its D1 database or Durable Object
//! namespace) is dropped as soon as any writer marks a change.
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
mod kv;
mod queues;
mod r2;
mod remembered;
mod replication;
mod token;
mod workers;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

pub use account::{Account, is_valid_account_id};
pub use d1::{D1Database, D1DatabaseList, NewD1Database, Usage, UsageDelta, is_valid_database_name};
pub use durable_objects::{DoNamespace, NewDoNamespace, is_valid_namespace_name};
pub use kv::{KvNamespace, KvOrder, MAX_KV_NAMESPACES, MAX_KV_TITLE_CHARS};
pub use queues::{
    ConsumerSettings, DEFAULT_CONCURRENCY, DeadLetter, MAX_QUEUES, Queue, QueueConsumer, is_valid_queue_name, spent,
    spent_on_lease,
};
pub use r2::{R2Bucket, S3Credential, is_valid_bucket_name};
pub use replication::{BoxError, Replication, ReplicationError};
pub use token::{Scope, Token, s3_secret_for};
pub use workers::{
    HOST_KURA, HOST_WORKERD, NamespaceChange, NewWorkerVersion, RecordedVersion, WorkerDeployment, WorkerSchedule,
    WorkerScript, WorkerVersion, is_valid_binding_name, is_valid_script_name,
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
    /// The catalog is shared by several nodes and the write could not be made theirs (the
    /// coordinator or the store failed, or another node holds the catalog too long): nothing
    /// changed.
    #[error("the shared catalog is unavailable: {0}")]
    Replication(#[from] ReplicationError),
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
    replication: Option<std::sync::Arc<dyn Replication>>,
    /// Bumped each time a copy from the cluster replaces the file, so caches over the catalog
    /// know to let go.
    installs: std::sync::atomic::AtomicU64,
    /// When the last look for a newer copy began: lookups that missed before it need not look
    /// again (one look serves every miss waiting behind it).
    looked: Mutex<Option<std::time::Instant>>,
    /// Live tokens lately authenticated, by the hash of their secret: every request
    /// authenticates.
    tokens_seen: remembered::Remembered<Token>,
    /// D1 databases lately looked up, by account and id or name.
    d1_seen: remembered::Remembered<D1Database>,
    /// Durable Object namespaces lately looked up, by account and id or name.
    do_namespaces_seen: remembered::Remembered<DoNamespace>,
    /// KV namespaces lately looked up, by account and id: every KV binding call names one.
    kv_seen: remembered::Remembered<KvNamespace>,
    /// Queues lately looked up, by account and id or name: every producer's send names one.
    queues_seen: remembered::Remembered<Queue>,
    /// See [`ChangeMark`].
    changes: ChangeMark,
}

/// A small file beside the catalog (`catalog.sqlite-changed`) whose eight bytes every kura
/// process that writes the catalog (a server, `kura tokens revoke`) sets to a new random value
/// after each write: one `pread` tells a reader whether anything it remembers may have changed.
/// A writer that dies between its commit and the mark, or a writer that is not kura, is caught
/// by the short life of what is remembered ([`remembered::TRUSTED_FOR`]).
#[derive(Debug)]
struct ChangeMark {
    file: Option<std::fs::File>,
}

impl ChangeMark {
    fn open(catalog: &Path) -> Self {
        let mut path = catalog.as_os_str().to_owned();
        path.push("-changed");
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path);
        let mark = ChangeMark { file: file.inspect_err(|e| tracing::warn!(error = %e, "no catalog change mark")).ok() };
        if mark.read().is_none() {
            mark.touch();
        }
        mark
    }

    fn read(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut bytes = [0u8; 8];
        self.file.as_ref()?.read_exact_at(&mut bytes, 0).ok()?;
        Some(u64::from_le_bytes(bytes))
    }

    fn touch(&self) {
        use std::os::unix::fs::FileExt;
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).expect("the operating system's random source failed");
        if let Some(file) = &self.file
            && let Err(e) = file.write_all_at(&bytes, 0)
        {
            tracing::warn!(error = %e, "cannot mark a catalog change");
        }
    }
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
    r#"
    CREATE TABLE workers_schedules (
        script_id   TEXT NOT NULL REFERENCES workers_scripts(id),
        cron        TEXT NOT NULL,
        created_on  TEXT NOT NULL,
        modified_on TEXT NOT NULL,
        -- The last minute (Unix seconds) this schedule was fired for: recorded before it fires,
        -- so no minute fires twice across a restart or a redeploy.
        fired_minute INTEGER,
        PRIMARY KEY (script_id, cron)
    ) WITHOUT ROWID;
"#,
    r#"
    CREATE TABLE kv_namespaces (
        id         TEXT PRIMARY KEY,
        account_id TEXT NOT NULL REFERENCES accounts(id),
        title      TEXT NOT NULL,
        created_at TEXT NOT NULL,
        UNIQUE (account_id, title)
    );
"#,
    r#"
    CREATE TABLE queues (
        id                TEXT PRIMARY KEY,
        account_id        TEXT NOT NULL REFERENCES accounts(id),
        name              TEXT NOT NULL,
        created_on        TEXT NOT NULL,
        modified_on       TEXT NOT NULL,
        delivery_delay    INTEGER NOT NULL DEFAULT 0,
        retention_seconds INTEGER NOT NULL DEFAULT 345600,
        delivery_paused   INTEGER NOT NULL DEFAULT 0,
        UNIQUE (account_id, name)
    );
    CREATE TABLE queue_consumers (
        id                TEXT PRIMARY KEY,
        queue_id          TEXT NOT NULL REFERENCES queues(id),
        kind              TEXT NOT NULL,
        script            TEXT,
        settings          TEXT NOT NULL,
        dead_letter_queue TEXT,
        created_on        TEXT NOT NULL
    );
"#,
];

impl Catalog {
    /// Opens the catalog at `path`, creating it and bringing its schema up to date.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_owned();
        Self::open_with(path.as_ref(), None)
    }

    /// Opens the catalog at `path` as this node's copy of a catalog that several nodes share:
    /// `replication` makes every write exclusive to one node at a time and publishes it before it
    /// is acknowledged, and brings newer copies in (see [`Replication`]).
    pub fn open_replicated(path: impl AsRef<Path>, replication: std::sync::Arc<dyn Replication>) -> Result<Self> {
        let catalog = Self::open_with(path.as_ref(), Some(replication))?;
        catalog.refresh()?;
        Ok(catalog)
    }

    fn open_with(path: &Path, replication: Option<std::sync::Arc<dyn Replication>>) -> Result<Self> {
        let path = path.to_owned();
        let reader = connect(&path)?;
        let catalog = Catalog {
            changes: ChangeMark::open(&path),
            reader: Mutex::new(reader),
            writer: Mutex::new(connect(&path)?),
            path,
            replication: None,
            installs: Default::default(),
            looked: Mutex::new(None),
            tokens_seen: Default::default(),
            d1_seen: Default::default(),
            do_namespaces_seen: Default::default(),
            kv_seen: Default::default(),
            queues_seen: Default::default(),
        };
        catalog.migrate()?;
        Ok(Catalog { replication, ..catalog })
    }

    /// How many times a newer copy has replaced this node's file; changes whenever anything
    /// read before may have changed without this process writing it.
    pub fn installs(&self) -> u64 {
        self.installs.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Which version of the catalog a read sees, without a SQLite transaction (which costs as
    /// much as the read it would save): this process's installs of newer copies, and the change
    /// mark every kura process writing the catalog rewrites after each commit. `None` if the
    /// mark cannot be read: nothing read then may be reused.
    fn version(&self) -> Option<(u64, u64)> {
        Some((self.installs(), self.changes.read()?))
    }

    /// The row `read` finds, or the one it found lately under `key` if the catalog has not
    /// changed since (see [`remembered`]). Only rows found are remembered: a miss reads again.
    fn remembered<V: Clone>(
        &self,
        memory: &remembered::Remembered<V>,
        key: String,
        read: impl FnOnce() -> Result<Option<V>>,
    ) -> Result<Option<V>> {
        // Read before the row, so a row read after a change is never filed under the version
        // from before it.
        let version = self.version();
        if let Some(version) = version
            && let Some(value) = memory.get(&key, version)
        {
            return Ok(Some(value));
        }
        let found = read()?;
        if let (Some(value), Some(version)) = (&found, version) {
            memory.put(key, version, value.clone());
        }
        Ok(found)
    }

    /// Brings in the newest published copy of a shared catalog if this node's is behind;
    /// true if it replaced the file. A catalog of one data directory has nothing to bring in.
    pub fn refresh(&self) -> Result<bool> {
        self.refresh_since(None)
    }

    /// [`Catalog::refresh`], skipped (answering true: read again) when a look began after
    /// `missed_at`, since it saw everything the caller's read could have missed.
    fn refresh_since(&self, missed_at: Option<std::time::Instant>) -> Result<bool> {
        let Some(replication) = &self.replication else { return Ok(false) };
        let mut writer = self.lock_writer_shared(replication.as_ref());
        {
            let looked = self.looked.lock().unwrap_or_else(|p| p.into_inner());
            if let (Some(missed_at), Some(looked)) = (missed_at, *looked)
                && looked >= missed_at
            {
                return Ok(true);
            }
        }
        // Recorded only once the look has succeeded: a failed one saw nothing, and a caller
        // that skipped its own look on the strength of it would miss a write published before.
        let started = std::time::Instant::now();
        let installed = match replication.newer().map_err(Error::Replication)? {
            Some(copy) => self.install(&mut writer, &copy).map(|()| true)?,
            None => false,
        };
        *self.looked.lock().unwrap_or_else(|p| p.into_inner()) = Some(started);
        Ok(installed)
    }

    /// Reads with `f` what a shared catalog holds now: a newer copy, if another node published
    /// one, is brought in first, so a listing shows what was written through any node a moment
    /// ago (one look at the coordinator, shared by the reads that wait for it).
    fn read_current<T>(&self, f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T>) -> Result<T> {
        if self.replication.is_some() {
            self.refresh_since(Some(std::time::Instant::now()))?;
        }
        self.read(f)
    }

    /// Reads with `f`; when it finds nothing and the catalog is shared, brings in a newer copy
    /// (another node may have just written it) and reads once more.
    fn read_found<T>(&self, f: impl Fn(&rusqlite::Connection) -> rusqlite::Result<Option<T>>) -> Result<Option<T>> {
        let asked = std::time::Instant::now();
        match self.read(&f)? {
            None if self.replication.is_some() && self.refresh_since(Some(asked))? => self.read(&f),
            found => Ok(found),
        }
    }

    /// The writer of a shared catalog, waited for without holding up the caller's async
    /// runtime (its holder may be waiting on the network).
    fn lock_writer_shared(&self, replication: &dyn Replication) -> MutexGuard<'_, rusqlite::Connection> {
        let mut guard = None;
        replication.wait(&mut || guard = Some(self.lock_writer()));
        guard.expect("wait runs its closure")
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
        self.write_checked(|tx| f(tx).map_err(|e| self.storage(e)))
    }

    /// Like [`Catalog::write`], for closures that return catalog errors of their own. In a
    /// shared catalog the write runs while this node is the only writer, on the newest copy,
    /// and commits only once a copy with it is published: a write that fails changes nothing,
    /// and no reader sees a write before it is published.
    fn write_checked<T>(&self, f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T>) -> Result<T> {
        let written = self.write_unmarked(f, Publish::Always);
        // Whatever the outcome: a failed write changed nothing, and a spare mark costs a read.
        self.changes.touch();
        written
    }

    /// [`Catalog::write`] for a write that may well find nothing to change (a claim another node
    /// made first): in a shared catalog, one whose statements changed no row is rolled back
    /// rather than published. Only for writes of rows: a schema change counts no row.
    fn write_rows<T>(&self, f: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T>) -> Result<T> {
        let written = self.write_unmarked(|tx| f(tx).map_err(|e| self.storage(e)), Publish::IfRowsChanged);
        self.changes.touch();
        written
    }

    fn write_unmarked<T>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T>,
        publish: Publish,
    ) -> Result<T> {
        let Some(replication) = &self.replication else { return self.transact(&mut self.lock_writer(), f) };
        let mut conn = self.lock_writer_shared(replication.as_ref());
        if let Some(copy) = replication.begin_write().map_err(Error::Replication)?
            && let Err(e) = self.install(&mut conn, &copy)
        {
            replication.end_write();
            return Err(e);
        }
        let outcome = self.write_published(&mut conn, replication.as_ref(), f, publish);
        replication.end_write();
        outcome
    }

    fn write_published<T>(
        &self,
        conn: &mut rusqlite::Connection,
        replication: &dyn Replication,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T>,
        publish: Publish,
    ) -> Result<T> {
        let storage = |e| self.storage(e);
        let rollback = |conn: &rusqlite::Connection| {
            if let Err(e) = conn.execute_batch("ROLLBACK") {
                tracing::warn!(path = %self.path.display(), error = %e, "rolling a catalog write back failed");
            }
        };
        let mut tx =
            rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate).map_err(storage)?;
        // The transaction stays open past this wrapper: it is serialised, then committed or
        // rolled back below.
        tx.set_drop_behavior(rusqlite::DropBehavior::Ignore);
        let rows_before = conn.total_changes();
        let done = f(&tx);
        drop(tx);
        let out = match done {
            Ok(out) => out,
            Err(e) => {
                rollback(conn);
                return Err(e);
            }
        };
        if publish == Publish::IfRowsChanged && conn.total_changes() == rows_before {
            rollback(conn);
            return Ok(out);
        }
        // The file as it will be once committed: a connection's serialisation reads its own
        // transaction's pages.
        let copy = self.path.with_extension("sqlite.publish");
        let written = conn.serialize(rusqlite::MAIN_DB).map_err(storage).and_then(|data| {
            write_synced(&copy, &data)
                .map_err(|source| ReplicationError::File { doing: "", path: copy.clone(), source }.into())
        });
        if let Err(e) = written {
            rollback(conn);
            return Err(e);
        }
        if let Err(e) = replication.publish(&copy) {
            rollback(conn);
            let _ = std::fs::remove_file(&copy);
            return Err(Error::Replication(e));
        }
        match conn.execute_batch("COMMIT") {
            Ok(()) => {
                let _ = std::fs::remove_file(&copy);
                Ok(out)
            }
            // Published but not committed here: the published copy is the catalog now.
            Err(e) => {
                rollback(conn);
                self.install(conn, &copy)
                    .map_err(|again| ReplicationError::Unsettled { commit: e, install: Box::new(again) })?;
                Ok(out)
            }
        }
    }

    fn transact<T>(
        &self,
        conn: &mut rusqlite::Connection,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        let tx =
            conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(|e| self.storage(e))?;
        let out = f(&tx)?;
        tx.commit().map_err(|e| self.storage(e))?;
        Ok(out)
    }

    /// Replaces the catalog file with `copy` (the writer already locked): both connections
    /// close, the file and its WAL go, the copy takes its name durably, and both reopen (on the
    /// old file, if the copy could not take its place).
    fn install(&self, writer: &mut rusqlite::Connection, copy: &Path) -> Result<()> {
        let mut reader = self.lock_reader();
        let io = |source: std::io::Error| {
            Error::from(ReplicationError::File { doing: "installing ", path: copy.to_owned(), source })
        };
        let placeholder = || rusqlite::Connection::open_in_memory().map_err(|e| self.storage(e));
        *reader = placeholder()?;
        *writer = placeholder()?;
        let swapped = (|| {
            for suffix in ["-wal", "-shm"] {
                let mut side = self.path.as_os_str().to_owned();
                side.push(suffix);
                match std::fs::remove_file(PathBuf::from(side)) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
                    _ => {}
                }
            }
            std::fs::rename(copy, &self.path).map_err(io)?;
            if let Some(dir) = self.path.parent() {
                std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
            }
            Ok(())
        })();
        *reader = connect(&self.path)?;
        *writer = connect(&self.path)?;
        swapped?;
        self.installs.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.changes.touch();
        Ok(())
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// Whether a shared catalog's write is published when its statements changed no row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Publish {
    Always,
    IfRowsChanged,
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
