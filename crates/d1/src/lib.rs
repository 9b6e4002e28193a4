//! kura's D1 engine: the databases of every account, and running statements on them with
//! D1's semantics.
//!
//! - [`D1`]: create, look up, list and delete databases; run a [`Request`] (a batch, or a
//!   multi-statement text) atomically on one; report usage.
//! - [`wire`]: D1's JSON formats (parameters in, results and `meta` out).
//! - [`migrations`]: wrangler's migration files and tracking table.
//!
//! Files live under `<data>/d1/<uuid>/db.sqlite`; the catalog maps accounts and names to ids.
//! The engine knows nothing of HTTP: protocol layers authenticate, parse and translate.

#![deny(missing_docs)]

pub use kura_sqlite::dump;
pub mod import;
pub mod migrations;
mod usage;
pub mod wire;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use kura_catalog::{Catalog, D1Database, D1DatabaseList, NewD1Database};
use kura_sqlite::{DatabaseOptions, HistorySettings, Limits, ReadReplicas, Registry, RegistrySettings, ReplicaRead};

pub use kura_sqlite::{
    Access, Bookmark, Error as SqlError, Executed, Meta, Placement, PlacementError, Request, Restored, ResultMode,
    Statement, StatementResult, Value,
};
pub use usage::UsageTotals;

/// What can go wrong, grouped by what the caller must do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No database with this id or name in the account.
    #[error("The database {0} could not be found")]
    NotFound(String),
    /// The id in the request is neither a UUID nor a database name.
    #[error("Invalid property: databaseId => Invalid uuid: {0}")]
    InvalidId(String),
    /// The name is taken in the account.
    #[error("A database with that name already exists")]
    DuplicateName,
    /// The database was restored as often as the window allows.
    #[error("too many restores: at most {limit} per {minutes} minutes for one database")]
    TooManyRestores {
        /// Restores allowed per window.
        limit: usize,
        /// The window, in minutes.
        minutes: u64,
    },
    /// The account holds as many databases as it may.
    #[error("System limit reached: databases per account ({0})")]
    LimitReached(u64),
    /// The input is not acceptable (a bad name, a bad option).
    #[error("{0}")]
    Invalid(String),
    /// Running SQL failed (the message reads like D1's), or the database was busy.
    #[error(transparent)]
    Sql(#[from] kura_sqlite::Error),
    /// The catalog failed.
    #[error(transparent)]
    Catalog(kura_catalog::Error),
    /// An export failed (a virtual table, or the output could not be written).
    #[error(transparent)]
    Export(#[from] dump::DumpError),
    /// An import failed; nothing of it was applied.
    #[error(transparent)]
    Import(#[from] import::ImportError),
    /// In a cluster: another node owns the database (requests for it go there), or ownership
    /// could not be settled.
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// The file system failed.
    #[error("{context}: {source}")]
    Io {
        /// What kura was doing.
        context: String,
        /// The failure.
        source: std::io::Error,
    },
}

impl From<kura_catalog::Error> for Error {
    fn from(e: kura_catalog::Error) -> Self {
        match e {
            kura_catalog::Error::Duplicate { .. } => Error::DuplicateName,
            kura_catalog::Error::LimitReached { limit, .. } => Error::LimitReached(limit),
            kura_catalog::Error::Invalid(m) => Error::Invalid(m),
            other => Error::Catalog(other),
        }
    }
}

/// Results of D1 calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct D1Settings {
    /// Actors: how many open, queue depth, idle timeout, group size.
    pub registry: RegistrySettings,
    /// SQLite limits for user SQL.
    pub limits: Limits,
    /// Most databases one account may hold (D1: 50,000 on paid plans).
    pub max_databases_per_account: u64,
    /// How Time Travel's history is kept (`None` keeps none: for measuring its cost only, since
    /// bookmarks, restores and exports then fail).
    pub history: Option<HistorySettings>,
    /// Restores allowed per database in `restore_window` (D1: 10 per 10 minutes).
    pub max_restores: usize,
    /// The window `max_restores` counts over.
    pub restore_window: Duration,
    /// In a cluster, which node serves each database; `None` serves every database here.
    pub placement: Option<Arc<dyn Placement>>,
    /// In a cluster, this node's copies of databases other nodes own, for Sessions reads of
    /// databases whose read replication is on.
    pub replicas: Option<Arc<dyn ReadReplicas>>,
}

impl Default for D1Settings {
    fn default() -> Self {
        D1Settings {
            registry: RegistrySettings::default(),
            limits: Limits::d1(),
            max_databases_per_account: 50_000,
            history: Some(HistorySettings::default()),
            max_restores: 10,
            restore_window: Duration::from_secs(600),
            placement: None,
            replicas: None,
        }
    }
}

/// Where a restore goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreTarget {
    /// To this bookmark.
    Bookmark(String),
    /// To the last commit at or before this time (Unix milliseconds).
    Time(i64),
}

/// What `GET /d1/database/{id}` reports beyond the catalog record.
#[derive(Debug, Clone, PartialEq)]
pub struct DatabaseDetails {
    /// The catalog record.
    pub database: D1Database,
    /// User tables (SQLite's and the platform's own excluded).
    pub num_tables: u64,
    /// Bytes the database occupies (pages in use times page size).
    pub file_size: u64,
}

/// Options for creating a database.
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    /// Location hint (`wnam`, `enam`, `weur`, `eeur`, `apac`, `oc`), recorded only.
    pub primary_location_hint: Option<String>,
    /// Jurisdiction (`eu`, `fedramp`), recorded only.
    pub jurisdiction: Option<String>,
}

/// The D1 engine of one data directory.
///
/// Database records are cached in memory: only this engine changes them (the data directory
/// is locked to one process), and every change here clears the cache.
pub struct D1 {
    catalog: Arc<Catalog>,
    records: RwLock<RecordCache>,
    /// Recent restores per database, for the rate limit.
    restores: Mutex<HashMap<String, VecDeque<Instant>>>,
    registry: Registry,
    root: PathBuf,
    settings: D1Settings,
    usage: usage::UsageRecorder,
}

/// Most database records kept in memory.
const RECORD_CACHE_SIZE: usize = 100_000;

/// Database records by account, then by id or name (so a lookup allocates nothing), with a
/// generation that every change bumps, so a record read before a change is never cached after
/// it.
#[derive(Default)]
struct RecordCache {
    generation: u64,
    /// The catalog's install count the records were read under (a shared catalog's copy can be
    /// replaced by a newer one another node wrote).
    installs: u64,
    records: HashMap<String, HashMap<String, Arc<D1Database>>>,
    /// Records by id alone, whichever account's ([`D1::get_by_uuid`]).
    by_uuid: HashMap<String, Arc<D1Database>>,
    /// Records kept, in all accounts.
    len: usize,
}

impl RecordCache {
    fn get(&self, account_id: &str, id_or_name: &str) -> Option<&Arc<D1Database>> {
        self.records.get(account_id)?.get(id_or_name)
    }

    fn insert(&mut self, account_id: &str, id_or_name: &str, record: Arc<D1Database>) {
        if self.len >= RECORD_CACHE_SIZE {
            self.clear();
        }
        let account = self.records.entry(account_id.to_owned()).or_default();
        if account.insert(id_or_name.to_owned(), record).is_none() {
            self.len += 1;
        }
    }

    fn insert_by_uuid(&mut self, record: Arc<D1Database>) {
        if self.len >= RECORD_CACHE_SIZE {
            self.clear();
        }
        if self.by_uuid.insert(record.uuid.clone(), record).is_none() {
            self.len += 1;
        }
    }

    fn clear(&mut self) {
        self.records.clear();
        self.by_uuid.clear();
        self.len = 0;
    }
}

fn database_file(root: &Path, uuid: &str) -> PathBuf {
    root.join(uuid).join("db.sqlite")
}

/// How a D1 database's file opens: D1's limits, and a history under the database's id.
fn database_options(root: &Path, uuid: &str, limits: &Limits, history: &Option<HistorySettings>) -> DatabaseOptions {
    let options = DatabaseOptions { limits: limits.clone(), ..DatabaseOptions::new(database_file(root, uuid)) };
    match history {
        Some(settings) => options.history(settings.clone(), uuid),
        None => options,
    }
}

/// How long a read on a replica may hold an async worker before it is interrupted and run
/// again on a blocking thread (as the owner's inline reads are).
const INLINE_READ_BUDGET: Duration = Duration::from_millis(1);

/// The read replication mode that turns replicas on (D1's `read_replication.mode`).
pub const REPLICATED: &str = "auto";

/// Database ids are lowercase hyphenated UUIDs; nothing else ever names a directory.
fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit() && !b.is_ascii_uppercase(),
        })
}

impl D1 {
    /// Opens the engine on `<data_dir>/d1`, removing directories the catalog no longer knows
    /// (a crash between deleting a database's record and its files leaves one behind).
    pub fn open(data_dir: &Path, catalog: Arc<Catalog>, settings: D1Settings) -> Result<Self> {
        let root = data_dir.join("d1");
        std::fs::create_dir_all(&root)
            .map_err(|source| Error::Io { context: format!("creating {}", root.display()), source })?;
        let known = catalog.d1_database_ids()?;
        sweep_orphans(&root, &known);
        let opener_root = root.clone();
        let limits = settings.limits.clone();
        let history = settings.history.clone();
        let placement = settings.placement.clone();
        let registry = Registry::new(settings.registry.clone(), move |uuid: &str| {
            let options = is_uuid(uuid).then(|| database_options(&opener_root, uuid, &limits, &history))?;
            match &placement {
                // A database this node does not own (any more) is not opened here.
                Some(placement) => placement.shipper(uuid).map(|shipper| options.shipper(shipper)),
                None => Some(options),
            }
        });
        Ok(D1 {
            catalog,
            records: RwLock::default(),
            restores: Mutex::default(),
            registry,
            root,
            settings,
            usage: usage::UsageRecorder::default(),
        })
    }

    /// The catalog the engine records databases in.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// Creates a database: its file first, then its catalog record, so a crash between the two
    /// leaves at worst a directory without a record, which the next start removes.
    pub async fn create(&self, account_id: &str, name: &str, options: CreateOptions) -> Result<D1Database> {
        if !kura_catalog::is_valid_database_name(name) {
            return Err(Error::Invalid(format!(
                "invalid database name '{name}': use 1 to 64 letters, digits, '_' or '-', starting with a letter or digit"
            )));
        }
        if self.catalog.d1_database(account_id, name)?.is_some() {
            return Err(Error::DuplicateName);
        }
        let uuid = uuid::Uuid::new_v4().to_string();
        let dir = self.root.join(&uuid);
        let path = database_file(&self.root, &uuid);
        let (root, id) = (self.root.clone(), uuid.clone());
        let (limits, history) = (self.settings.limits.clone(), self.settings.history.clone());
        let mut opening = database_options(&root, &id, &limits, &history).create(true);
        if let Some(placement) = &self.settings.placement {
            // Owned before its first byte exists, so even its empty state is in the store.
            placement.claim(&uuid, &path, Box::pin(async {})).await?;
            opening = opening.shipper(placement.shipper(&uuid).ok_or_else(|| {
                PlacementError::Unavailable("this node's ownership ended as the database was created".into())
            })?);
        }
        let created = tokio::task::spawn_blocking(move || -> Result<()> {
            let dir = path.parent().expect("database files live in a directory");
            std::fs::create_dir_all(dir)
                .map_err(|source| Error::Io { context: format!("creating {}", dir.display()), source })?;
            kura_sqlite::Database::open(&opening)?;
            // The record that points at the file is written next: make the file's name durable.
            sync_directory(dir)?;
            sync_directory(dir.parent().expect("the d1 directory"))?;
            Ok(())
        })
        .await
        .unwrap_or_else(|e| Err(Error::Invalid(format!("creating the database failed: {e}"))));
        let recorded = created.and_then(|()| {
            Ok(self.catalog.create_d1_database(&NewD1Database {
                uuid: Some(&uuid),
                account_id,
                name,
                primary_location_hint: options.primary_location_hint.as_deref(),
                jurisdiction: options.jurisdiction.as_deref(),
                max_per_account: self.settings.max_databases_per_account,
            })?)
        });
        match recorded {
            Ok(database) => {
                tracing::info!(account = account_id, uuid = %database.uuid, name, "created D1 database");
                Ok(database)
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                if let Some(placement) = &self.settings.placement {
                    placement.release(&uuid).await;
                }
                Err(e)
            }
        }
    }

    /// The account's database with this id or name.
    pub fn get(&self, account_id: &str, id_or_name: &str) -> Result<Arc<D1Database>> {
        let found = self.cached(
            |cache| cache.get(account_id, id_or_name),
            || {
                if !is_uuid(&id_or_name.to_ascii_lowercase()) && !kura_catalog::is_valid_database_name(id_or_name) {
                    return Err(Error::InvalidId(id_or_name.to_owned()));
                }
                Ok(self.catalog.d1_database(account_id, id_or_name)?)
            },
            |cache, found| cache.insert(account_id, id_or_name, found),
        )?;
        found.ok_or_else(|| Error::NotFound(id_or_name.to_owned()))
    }

    /// The database whose id is `uuid` (lower case), whichever account's it is, or `None`: for
    /// a cluster's placement, which asks on every request where a database is served. Kept in
    /// the same cache as [`D1::get`]'s records.
    pub fn get_by_uuid(&self, uuid: &str) -> Result<Option<Arc<D1Database>>> {
        self.cached(
            |cache| cache.by_uuid.get(uuid),
            || Ok(self.catalog.d1_database_by_uuid(uuid)?),
            |cache, found| cache.insert_by_uuid(found),
        )
    }

    /// A record from the cache (`hit`), or read from the catalog (`read`) and kept (`keep`)
    /// unless the catalog changed meanwhile: a record read before a change is never kept after
    /// it.
    fn cached(
        &self,
        hit: impl FnOnce(&RecordCache) -> Option<&Arc<D1Database>>,
        read: impl FnOnce() -> Result<Option<D1Database>>,
        keep: impl FnOnce(&mut RecordCache, Arc<D1Database>),
    ) -> Result<Option<Arc<D1Database>>> {
        let installs = self.catalog.installs();
        let generation = {
            let cache = self.records.read().unwrap_or_else(|p| p.into_inner());
            if cache.installs == installs
                && let Some(found) = hit(&cache)
            {
                return Ok(Some(Arc::clone(found)));
            }
            cache.generation
        };
        let Some(found) = read()? else { return Ok(None) };
        let found = Arc::new(found);
        let mut cache = self.records.write().unwrap_or_else(|p| p.into_inner());
        if cache.installs != installs {
            cache.clear();
            cache.installs = installs;
        }
        if cache.generation == generation {
            keep(&mut cache, Arc::clone(&found));
        }
        Ok(Some(found))
    }

    /// In a cluster, makes sure this node may serve the database `uuid` — it owns it, and its
    /// file holds everything the store does — or says where it is served. Alone, a no-op.
    pub async fn claim(&self, uuid: &str) -> Result<()> {
        let Some(placement) = &self.settings.placement else { return Ok(()) };
        if !is_uuid(uuid) {
            return Err(Error::InvalidId(uuid.to_owned()));
        }
        if placement.is_current(uuid) {
            return Ok(());
        }
        if let Some(owner) = placement.known_elsewhere(uuid) {
            return Err(owner.into());
        }
        // Whatever an earlier ownership left open goes before its files are rebuilt.
        let (registry, key) = (self.registry.clone(), uuid.to_owned());
        let release_file = Box::pin(async move { registry.close(&key).await });
        Ok(placement.claim(uuid, &database_file(&self.root, uuid), release_file).await?)
    }

    /// In a cluster: the node last named as the database's owner did not serve it; look again
    /// next time.
    pub fn forget_owner(&self, uuid: &str) {
        if let Some(placement) = &self.settings.placement {
            placement.forget_owner(uuid);
        }
    }

    /// Forgets cached records after a change.
    fn forget_records(&self) {
        let mut cache = self.records.write().unwrap_or_else(|p| p.into_inner());
        cache.generation += 1;
        cache.clear();
    }

    /// The database with its table count and size.
    pub async fn details(&self, account_id: &str, id_or_name: &str) -> Result<DatabaseDetails> {
        let database = self.get(account_id, id_or_name)?;
        let (num_tables, file_size) = self
            .registry
            .with_database(&database.uuid, |db| {
                let tables = db.with_internal(|c| {
                    c.query_row(
                        "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' \
                         AND name NOT LIKE '\\_cf\\_%' ESCAPE '\\'",
                        [],
                        |r| r.get::<_, i64>(0),
                    )
                });
                let size = db.size();
                (tables, size)
            })
            .await?;
        Ok(DatabaseDetails {
            database: Arc::unwrap_or_clone(database),
            num_tables: num_tables.map_err(|e| Error::Invalid(e.to_string()))?.max(0) as u64,
            file_size: file_size?,
        })
    }

    /// One page (1-based) of the account's databases.
    pub fn list(&self, account_id: &str, name: Option<&str>, page: u64, per_page: u64) -> Result<D1DatabaseList> {
        Ok(self.catalog.list_d1_databases(account_id, name, page, per_page)?)
    }

    /// Deletes a database: its record first (so no new request reaches it), then its file.
    pub async fn delete(&self, account_id: &str, id_or_name: &str) -> Result<D1Database> {
        let database = self.get(account_id, id_or_name)?;
        let deleted = self.catalog.delete_d1_database(account_id, &database.uuid);
        self.forget_records();
        if !deleted? {
            return Err(Error::NotFound(id_or_name.to_owned()));
        }
        self.registry.retire(&database.uuid).await;
        self.usage.forget(&database.uuid);
        if let Some(placement) = &self.settings.placement {
            placement.release(&database.uuid).await;
        }
        if let Some(replicas) = &self.settings.replicas {
            replicas.discard(&database.uuid);
        }
        let dir = self.root.join(&database.uuid);
        tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&dir))
            .await
            .map_err(|e| Error::Invalid(format!("deleting the database files failed: {e}")))?
            .map_err(|source| Error::Io { context: "removing the database files".into(), source })?;
        tracing::info!(account = account_id, uuid = %database.uuid, "deleted D1 database");
        Ok(Arc::unwrap_or_clone(database))
    }

    /// Sets the read replication mode: with `auto`, a cluster's nodes serve Sessions reads of
    /// the database from copies of their own ([`D1::read_replica`]); alone, kura has one copy
    /// and serves every query from it.
    pub fn set_read_replication(&self, account_id: &str, id_or_name: &str, mode: &str) -> Result<D1Database> {
        let database = self.get(account_id, id_or_name)?;
        let changed = self.catalog.set_d1_read_replication(account_id, &database.uuid, mode);
        self.forget_records();
        changed?;
        if let Some(replicas) = self.settings.replicas.as_ref().filter(|_| mode != REPLICATED) {
            replicas.discard(&database.uuid);
        }
        self.get(account_id, &database.uuid).map(Arc::unwrap_or_clone)
    }

    /// In a cluster, runs a request that only reads on this node's copy of a database another
    /// node owns, if its read replication is on and the copy holds the state of `at_least` (a
    /// session's bookmark; `None` takes any state). `None` when the owner must serve it: the
    /// copy is still being built or is behind, replication is off, the bookmark is another
    /// database's, or the request would write.
    pub async fn read_replica(
        &self,
        account_id: &str,
        id_or_name: &str,
        request: Request,
        at_least: Option<&Bookmark>,
    ) -> Result<Option<Executed>> {
        let Some(replicas) = &self.settings.replicas else { return Ok(None) };
        let database = self.get(account_id, id_or_name)?;
        if database.read_replication != REPLICATED {
            replicas.discard(&database.uuid);
            return Ok(None);
        }
        // A bookmark that is not this database's names no state a copy could reach.
        if at_least.is_some_and(|bookmark| !bookmark.belongs_to(&database.uuid)) {
            return Ok(None);
        }
        let at_least = at_least.map_or(0, |bookmark| bookmark.seq);
        let options = || database_options(&self.root, &database.uuid, &self.settings.limits, &None);
        let Some(replica) = replicas.replica(&database.uuid, at_least, &options).await else { return Ok(None) };
        // On this worker if it is as short as a point read (as the owner's reads are), on a
        // blocking thread if not.
        let read = match replica.read(&request, Some(INLINE_READ_BUDGET))? {
            ReplicaRead::TooLong => tokio::task::spawn_blocking(move || replica.read(&request, None))
                .await
                .map_err(|e| Error::Invalid(format!("a read on a replica failed: {e}")))??,
            other => other,
        };
        match read {
            ReplicaRead::Done(executed) => {
                self.usage.record(&database.uuid, &executed.results);
                Ok(Some(executed))
            }
            ReplicaRead::Declined | ReplicaRead::TooLong => Ok(None),
        }
    }

    /// Runs a request on the account's database `id`, atomically; answers once it is durable.
    pub async fn query(&self, account_id: &str, id_or_name: &str, request: Request) -> Result<Vec<StatementResult>> {
        Ok(self.query_with_bookmark(account_id, id_or_name, request).await?.results)
    }

    /// Runs a request as [`D1::query`] does, and answers with the bookmark of a state that
    /// includes it as well (what D1's sessions hand back).
    pub async fn query_with_bookmark(&self, account_id: &str, id_or_name: &str, request: Request) -> Result<Executed> {
        let database = self.get(account_id, id_or_name)?;
        let executed = match self.registry.execute_with_bookmark(&database.uuid, request).await {
            Ok(executed) => executed,
            // Deleted while the request was on its way.
            Err(kura_sqlite::Error::Closed) if self.catalog.d1_database_by_uuid(&database.uuid)?.is_none() => {
                return Err(Error::NotFound(database.uuid.clone()));
            }
            Err(e) => return Err(e.into()),
        };
        self.usage.record(&database.uuid, &executed.results);
        Ok(executed)
    }

    /// The current bookmark of a database, or with `at` (Unix milliseconds) the bookmark of its
    /// last commit at or before then.
    pub async fn bookmark(&self, account_id: &str, id_or_name: &str, at: Option<i64>) -> Result<Bookmark> {
        let database = self.get(account_id, id_or_name)?;
        let found = self
            .registry
            .with_database(&database.uuid, move |db| match at {
                Some(t) => db.bookmark_for_time(t),
                None => db.bookmark(),
            })
            .await?;
        Ok(found?)
    }

    /// A database's newest commits and restores in the Time Travel window, newest first: at
    /// most `limit`, before the bookmark `before` when given.
    pub async fn timeline(
        &self,
        account_id: &str,
        id_or_name: &str,
        limit: usize,
        before: Option<String>,
    ) -> Result<Vec<kura_sqlite::Moment>> {
        let database = self.get(account_id, id_or_name)?;
        let found = self
            .registry
            .with_database(&database.uuid, move |db| {
                let before = match before {
                    Some(text) => Some(
                        text.parse::<Bookmark>()
                            .map_err(|e| kura_sqlite::Error::InvalidBookmark { message: e.to_string() })?,
                    ),
                    None => None,
                };
                db.timeline(limit, before.as_ref())
            })
            .await?;
        Ok(found?)
    }

    /// The current bookmark of a database whose owner is closing to reopen it: asked again
    /// until the reopened file answers.
    async fn bookmark_after_reopening(&self, uuid: &str) -> Result<Bookmark> {
        let mut tries = 0;
        loop {
            match self.registry.with_database(uuid, |db| db.bookmark()).await {
                Ok(found) => return Ok(found?),
                Err(kura_sqlite::Error::Closed) if tries < 20 => {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Restores a database to a bookmark or a time. Queries already queued run first; later ones
    /// see the restored state. Returns the new bookmark and the previous one (the undo point).
    pub async fn restore(&self, account_id: &str, id_or_name: &str, target: RestoreTarget) -> Result<Restored> {
        let database = self.get(account_id, id_or_name)?;
        self.check_restore_limit(&database.uuid)?;
        let restored = self
            .registry
            .with_database(&database.uuid, move |db| {
                let bookmark = match target {
                    RestoreTarget::Bookmark(text) => text
                        .parse::<Bookmark>()
                        .map_err(|e| kura_sqlite::Error::InvalidBookmark { message: e.to_string() })?,
                    RestoreTarget::Time(t) => db.bookmark_for_time(t)?,
                };
                db.restore(&bookmark)
            })
            .await??;
        self.restores
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(database.uuid.clone())
            .or_default()
            .push_back(Instant::now());
        tracing::info!(uuid = %database.uuid, to = %restored.bookmark, from = %restored.previous, "restored D1 database");
        Ok(restored)
    }

    /// Refuses a restore when the database had as many as the window allows.
    fn check_restore_limit(&self, uuid: &str) -> Result<()> {
        let mut restores = self.restores.lock().unwrap_or_else(|p| p.into_inner());
        let recent = restores.entry(uuid.to_owned()).or_default();
        let window = self.settings.restore_window;
        while recent.front().is_some_and(|t| t.elapsed() >= window) {
            recent.pop_front();
        }
        if recent.len() >= self.settings.max_restores {
            return Err(Error::TooManyRestores { limit: self.settings.max_restores, minutes: window.as_secs() / 60 });
        }
        Ok(())
    }

    /// Exports a database as SQL into `output`; returns the bookmark of the exported state.
    pub async fn export(
        &self,
        account_id: &str,
        id_or_name: &str,
        options: dump::DumpOptions,
        output: PathBuf,
    ) -> Result<(Bookmark, dump::DumpStats)> {
        let database = self.get(account_id, id_or_name)?;
        self.registry
            .with_database(&database.uuid, move |db| -> Result<(Bookmark, dump::DumpStats)> {
                let bookmark = db.bookmark()?;
                let file = std::fs::File::create(&output)
                    .map_err(|source| Error::Io { context: format!("creating {}", output.display()), source })?;
                let mut out = std::io::BufWriter::new(file);
                let stats = dump::dump(db, &options, &mut out)?;
                std::io::Write::flush(&mut out).map_err(dump::DumpError::from)?;
                Ok((bookmark, stats))
            })
            .await?
    }

    /// Runs SQL from `input` in one transaction (all of it, or none); returns what it did and
    /// the bookmark after it.
    pub async fn import(
        &self,
        account_id: &str,
        id_or_name: &str,
        mut input: Box<dyn std::io::BufRead + Send>,
    ) -> Result<(import::ImportOutcome, Bookmark)> {
        let database = self.get(account_id, id_or_name)?;
        let outcome = self
            .registry
            .with_database(&database.uuid, move |db| -> Result<(import::ImportOutcome, Option<Bookmark>)> {
                let outcome = import::import(db, &mut input)?;
                // After a failed capture the import is durable but has no position yet.
                let bookmark = if db.is_poisoned() { None } else { Some(db.bookmark()?) };
                Ok((outcome, bookmark))
            })
            .await??;
        let bookmark = match outcome.1 {
            Some(bookmark) => bookmark,
            None => self.bookmark_after_reopening(&database.uuid).await?,
        };
        let outcome = (outcome.0, bookmark);
        let meta = &outcome.0.meta;
        self.usage.add(
            &database.uuid,
            UsageTotals {
                read_queries: 0,
                write_queries: outcome.0.num_queries,
                rows_read: meta.rows_read,
                rows_written: meta.rows_written,
            },
        );
        tracing::info!(uuid = %database.uuid, statements = outcome.0.num_queries, "imported SQL");
        Ok(outcome)
    }

    /// Usage of a database over the hours from `from` to `to` (Unix seconds), hour by hour.
    pub fn usage(&self, uuid: &str, from: i64, to: i64) -> Result<Vec<kura_catalog::Usage>> {
        self.flush_usage()?;
        Ok(self.catalog.d1_usage(uuid, from.div_euclid(3600) * 3600, to)?)
    }

    /// Writes the usage counted since the last flush to the catalog.
    pub fn flush_usage(&self) -> Result<()> {
        self.usage.flush(&self.catalog)?;
        Ok(())
    }

    /// How many databases are open now.
    pub fn open_databases(&self) -> usize {
        self.registry.open_count()
    }

    /// What the databases' files did since the engine started.
    pub fn stats(&self) -> &kura_sqlite::Stats {
        self.registry.stats()
    }

    /// Closes every database, after the requests already queued have run.
    pub async fn shutdown(&self) {
        self.registry.shutdown().await;
        if let Err(e) = self.flush_usage() {
            tracing::warn!(error = %e, "could not save D1 usage counters");
        }
    }
}

/// Makes a directory's entries durable.
fn sync_directory(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| Error::Io { context: format!("syncing {}", dir.display()), source })
}

/// Parses a point in time as D1's API and wrangler give it: ISO 8601 (`2026-01-01T00:00:00Z`),
/// or Unix time in seconds (10 digits or fewer) or milliseconds. Returns Unix milliseconds.
pub fn parse_timestamp(text: &str) -> std::result::Result<i64, String> {
    let text = text.trim();
    let invalid = || format!("invalid timestamp '{text}': use ISO 8601 (2026-01-01T00:00:00Z) or Unix seconds");
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        let n: i64 = text.parse().map_err(|_| invalid())?;
        return Ok(if text.len() <= 10 { n.saturating_mul(1000) } else { n });
    }
    if let Ok(t) = text.parse::<jiff::Timestamp>() {
        return Ok(t.as_millisecond());
    }
    // A date and time without an offset is UTC, as JavaScript's toISOString writes it.
    text.parse::<jiff::civil::DateTime>()
        .ok()
        .and_then(|d| jiff::tz::TimeZone::UTC.to_ambiguous_zoned_datetime(d).compatible().ok())
        .map(|z| z.timestamp().as_millisecond())
        .ok_or_else(invalid)
}

fn sweep_orphans(root: &Path, known: &[String]) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_uuid(&name) && !known.contains(&name) {
            tracing::info!(dir = %entry.path().display(), "removing files of a deleted D1 database");
            if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                tracing::warn!(dir = %entry.path().display(), error = %e, "could not remove");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_parse_as_wrangler_sends_them() {
        assert_eq!(parse_timestamp("2026-01-01T00:00:00.000Z").unwrap(), 1_767_225_600_000);
        assert_eq!(parse_timestamp("2026-01-01T00:00:00").unwrap(), 1_767_225_600_000);
        assert_eq!(parse_timestamp("1767225600").unwrap(), 1_767_225_600_000);
        assert_eq!(parse_timestamp("1767225600123").unwrap(), 1_767_225_600_123);
        assert!(parse_timestamp("yesterday").is_err());
        assert!(parse_timestamp("").is_err());
    }

    #[test]
    fn only_lowercase_uuids_name_directories() {
        assert!(is_uuid("51e7c314-456e-4167-b6c3-869ad188fc23"));
        assert!(!is_uuid("51E7C314-456E-4167-B6C3-869AD188FC23"));
        assert!(!is_uuid("../../etc/passwd"));
        assert!(!is_uuid("51e7c314-456e-4167-b6c3-869ad188fc2"));
    }
}
