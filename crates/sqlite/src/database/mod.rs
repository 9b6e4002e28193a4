//! One open database file: its read-write connection, configured for D1, and the executor that
//! runs a request's statements and computes D1's per-statement meta.

mod counters;
mod file_lock;
mod time_travel;
mod transaction;

use counters::{IndexColumns, schema_writes};
use file_lock::FileLock;
pub(crate) use time_travel::CAPTURE_DELAY;
pub(crate) use transaction::{Grouped, Inline};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use libsqlite3_sys as ffi;
use rusqlite::OpenFlags;
use rusqlite::config::DbConfig;

use crate::error::{
    Error, PARAMETERS_ON_LAST_STATEMENT_ONLY, Result, TRANSACTION_MESSAGE, WRONG_PARAMETER_COUNT, is_disk_full,
};
use crate::history::{self, History, HistorySettings, LogShipper};
use crate::policy::{Authorizer, Limits, StatementFacts};
use crate::raw::{RawStatement, SqlText};
use crate::request::{Access, Meta, Request, ResultMode, Statement, StatementResult, Value};

/// How to open a database file.
#[derive(Debug, Clone)]
pub struct DatabaseOptions {
    /// The database file.
    pub path: PathBuf,
    /// Create the file if it does not exist.
    pub create: bool,
    /// Limits on user SQL.
    pub limits: Limits,
    /// Longest a request may run before it is interrupted.
    pub request_timeout: Duration,
    /// Keep a Time Travel history (log and snapshots in a `log` directory beside the file),
    /// with these settings; `None` keeps none.
    pub history: Option<HistorySettings>,
    /// The database's identity, which its bookmarks carry (its id, for a D1 database).
    pub identity: String,
    /// One of many open at once (a Durable Object): no lookaside allocator and a page cache of
    /// at most [`COMPACT_CACHE_KIB`], so a thousand open files stay within a few hundred MB.
    pub compact: bool,
    /// Only read the file, which another process owns and writes (a Durable Object workerd
    /// runs): no history, no exclusive locking, no changes to its journal; every statement
    /// read-only.
    pub read_only: bool,
    /// Copies the history elsewhere after every commit, restore and checkpoint, before they are
    /// acknowledged (scale-out's shared storage); needs a history.
    pub shipper: Option<Arc<dyn LogShipper>>,
    /// Where the database's commits are counted (its registry's figures, set by the registry).
    pub stats: Option<(Arc<crate::stats::Stats>, Arc<crate::stats::DatabaseFigures>)>,
    /// Measure the database's size after every write statement, for D1's `size_after` and
    /// `changed_db`. A Durable Object's storage asks for its size only when its code does
    /// (`databaseSize`): measuring it after each write was a twentieth of its requests' time.
    pub reports_size: bool,
}

/// The page cache of a compact database, in KiB (SQLite's default is 2,000).
pub const COMPACT_CACHE_KIB: i64 = 256;

impl DatabaseOptions {
    /// D1's settings for the file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        DatabaseOptions {
            path: path.into(),
            create: false,
            limits: Limits::d1(),
            request_timeout: Duration::from_secs(30),
            history: None,
            identity: String::new(),
            compact: false,
            read_only: false,
            shipper: None,
            stats: None,
            reports_size: true,
        }
    }

    /// Ships the history with `shipper` (see [`DatabaseOptions::shipper`]).
    pub fn shipper(mut self, shipper: Arc<dyn LogShipper>) -> Self {
        self.shipper = Some(shipper);
        self
    }

    /// Opens the file read-only, beside the process that owns it (see
    /// [`DatabaseOptions::read_only`]).
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Opens the file as one of many open at once (see [`DatabaseOptions::compact`]).
    pub fn compact(mut self, compact: bool) -> Self {
        self.compact = compact;
        self
    }

    /// Keeps a Time Travel history with these settings, under this identity.
    pub fn history(mut self, settings: HistorySettings, identity: impl Into<String>) -> Self {
        self.history = Some(settings);
        self.identity = identity.into();
        self
    }

    /// Whether each write statement's result carries the database's size after it (see
    /// [`DatabaseOptions::reports_size`]).
    pub fn reports_size(mut self, reports_size: bool) -> Self {
        self.reports_size = reports_size;
        self
    }

    /// Creates the file if it is missing.
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }
}

/// A prepared statement kept for reuse, with what the authorizer learned when it was prepared.
struct CachedStatement {
    raw: RawStatement,
    facts: StatementFacts,
}

/// Distinct single-statement texts kept prepared per connection.
const STATEMENT_CACHE_SIZE: usize = 128;

/// An open database: the connection that owns the file's writes, and D1's execution rules.
///
/// Not `Sync`: its actor holds it behind a lock, and lends it between commands to a caller that
/// only reads (see `actor::Lender`).
pub struct Database {
    /// Prepared statements by SQL text; declared before `conn` so they are finalized first.
    statements: HashMap<String, CachedStatement>,
    /// The statement that reads page 1 for `size_after`, prepared on first use.
    page_one: Option<RawStatement>,
    /// kura's own statements (BEGIN, COMMIT, savepoints) by their text, each prepared on first
    /// use: rusqlite's statement cache looked each up by hashing its text, twice a request.
    own: Vec<(&'static str, RawStatement)>,
    conn: rusqlite::Connection,
    /// Keeps other processes off the file; declared after `conn`, so it outlives the close
    /// (which may checkpoint). `None` for a read-only connection.
    file_lock: Option<FileLock>,
    authorizer: Authorizer,
    /// Nanoseconds after `epoch` at which the running request is interrupted; 0 = none.
    deadline: Arc<AtomicU64>,
    epoch: Instant,
    request_timeout: Duration,
    page_size: u64,
    /// Size after the last statement, so each statement measures once.
    size: Option<u64>,
    /// Indexes per table (lower-cased), for counting index writes; cleared on schema changes.
    indexes: HashMap<String, Vec<IndexColumns>>,
    /// Bytes of results the running request may still collect.
    result_budget: usize,
    max_result_bytes: usize,
    /// Set while a request is tried on its caller's thread: a statement that would write stops
    /// it before it runs (see [`Database::execute_read`]).
    reads_only: bool,
    poisoned: bool,
    /// The Time Travel history, if the database keeps one.
    history: Option<History>,
    /// Since when the history could not be opened for lack of space (its log could not take
    /// what the WAL holds beyond it). The database is then served read-only (`query_only`):
    /// the WAL keeps every commit, and the next open, once there is room, captures them.
    history_full_since: Option<Instant>,
    /// Bytes free on the history's filesystem when it last could not grow: more than that, and
    /// the next write tries it again at once rather than after [`HISTORY_RETRY_IN_PLACE`].
    history_full_free: Option<u64>,
    /// What the WAL hook reported: frames after the last commit, and commits so far.
    wal: Arc<WalProgress>,
    /// Commits (as the WAL hook counts them) the history holds: those after were answered
    /// before their capture and are owed to it ([`Database::capture_due`]).
    captured_commits: u64,
    /// When each owed commit was answered, oldest first: the time its record will carry.
    owed_times: Vec<i64>,
    /// When the oldest owed commit was answered, by the monotonic clock (for
    /// [`Database::capture_due`], which a step of the wall clock must not hurry or hold up).
    oldest_owed: Option<Instant>,
    /// Commits (as the WAL hook counts them) when the WAL was last checkpointed: the hook's
    /// frame count is the WAL's only once a commit follows.
    checkpointed_at_commits: u64,
    options: DatabaseOptions,
    path: PathBuf,
}

/// What the WAL hook (registered with a history) reports after each commit of the connection.
#[derive(Debug, Default)]
pub(crate) struct WalProgress {
    /// Frames in the WAL after the last commit.
    frames: AtomicU32,
    /// Commits so far: one call of the hook each.
    commits: AtomicU64,
}

// SAFETY: the connection is opened with SQLITE_OPEN_NO_MUTEX ("multi-thread" mode), in which a
// connection and its statements may be used from any thread, one thread at a time. Its prepared
// statements (raw pointers, hence not `Send` alone) never leave the `Database`, so they move
// only together with their connection; the actor's lock makes their use one thread at a time.
unsafe impl Send for Database {}

/// A configured connection and the lock that keeps other processes off its file, dropped in
/// that order wherever they are dropped (a connection's close may checkpoint).
struct Connected {
    conn: rusqlite::Connection,
    /// `None` for a read-only connection.
    file_lock: Option<FileLock>,
    page_size: u64,
}

/// How long opening waits for another process to let go of the file, as SQLite's busy timeout
/// waited for its own locks.
const LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens and configures the read-write connection: WAL, `synchronous=FULL`, foreign keys,
/// defensive mode, D1's limits and authorizer, the request deadline, and (with a history) the
/// WAL hook that takes checkpoints away from SQLite.
fn connect(
    options: &DatabaseOptions,
    authorizer: &Authorizer,
    deadline: &Arc<AtomicU64>,
    epoch: Instant,
    wal: &Arc<WalProgress>,
) -> Result<Connected> {
    crate::configure_process();
    let open_error = |e: rusqlite::Error| Error::Open { path: options.path.clone(), message: e.to_string() };
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if options.read_only {
        flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    } else if options.create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let exists =
        |path: &Path| path.try_exists().map_err(|e| Error::Open { path: path.to_owned(), message: e.to_string() });
    let missing = options.create && !options.read_only && !exists(&options.path)?;
    if missing {
        create_in_wal_mode(&options.path).map_err(|message| Error::Open {
            path: options.path.clone(),
            message: format!("cannot create it: {message}"),
        })?;
    }
    let mut connected = if options.read_only {
        // Beside another process's connections: SQLite's own locks and shared WAL index.
        let conn = rusqlite::Connection::open_with_flags(&options.path, flags).map_err(open_error)?;
        Connected { conn, file_lock: None, page_size: 0 }
    } else {
        // The actor is the file's only user: SQLite takes no file locks (see `file_lock`), and
        // the file lock taken before the first read keeps other processes off.
        let conn =
            rusqlite::Connection::open_with_flags_and_vfs(&options.path, flags, c"unix-none").map_err(open_error)?;
        match FileLock::acquire_within(&options.path, LOCK_TIMEOUT) {
            Ok(Some(lock)) => Connected { conn, file_lock: Some(lock), page_size: 0 },
            Ok(None) => {
                return Err(Error::Open {
                    path: options.path.clone(),
                    message: format!(
                        "the file stayed locked for {} s: another process has it open (or it is opened twice here)",
                        LOCK_TIMEOUT.as_secs()
                    ),
                });
            }
            Err(e) => {
                return Err(Error::Open { path: options.path.clone(), message: format!("cannot lock the file: {e}") });
            }
        }
    };
    let conn = &mut connected.conn;
    if !options.read_only {
        // No WAL index in shared memory (`unix-none` has none): it lives on the heap only if the
        // mode is exclusive when the WAL is opened, and a pragma that reads the schema
        // (cache_size, below) opens it.
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE").map_err(open_error)?;
    }
    if options.compact {
        make_compact(conn).map_err(open_error)?;
    }
    if options.history.is_some() {
        // Only the history checkpoints, and only frames already in its log: registering the
        // hook turns SQLite's automatic checkpoints off, and closing must not checkpoint either, even
        // if configuring the connection fails below.
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true).map_err(open_error)?;
        let progress = Arc::clone(wal);
        conn.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, n: std::ffi::c_int| {
            progress.frames.store(n.max(0) as u32, Ordering::Relaxed);
            progress.commits.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }))
        .map_err(open_error)?;
    }
    conn.busy_timeout(Duration::from_secs(5)).map_err(open_error)?;
    if !options.read_only {
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)).map_err(open_error)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::Open {
                path: options.path.clone(),
                message: format!("cannot use WAL mode (got {mode})"),
            });
        }
        conn.pragma_update(None, "synchronous", "FULL").map_err(open_error)?;
    }
    conn.pragma_update(None, "foreign_keys", "ON").map_err(open_error)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true).map_err(open_error)?;
    // Stable plans: without this, STAT4 builds re-prepare a cached statement whenever a
    // bound value the planner looked at changes, which is on nearly every call.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).map_err(open_error)?;
    options.limits.apply(conn).map_err(open_error)?;
    let page_size: i64 = conn.pragma_query_value(None, "page_size", |r| r.get(0)).map_err(open_error)?;
    let page_size = page_size.max(512) as u64;
    let max_pages = (options.limits.max_database_bytes / page_size).clamp(1, i64::MAX as u64) as i64;
    conn.pragma_update(None, "max_page_count", max_pages).map_err(open_error)?;
    authorizer.install(conn).map_err(open_error)?;
    let watched = Arc::clone(deadline);
    conn.progress_handler(
        1000,
        Some(move || {
            let at = watched.load(Ordering::Relaxed);
            at != 0 && epoch.elapsed().as_nanos() as u64 >= at
        }),
    )
    .map_err(open_error)?;
    connected.page_size = page_size;
    Ok(connected)
}

/// Creates a new database file already in WAL mode: built under another name with no syncs and
/// no rollback journal, synced once, then renamed into place, so the file either is whole or
/// is not there. Left to SQLite, a new file's switch to WAL writes its first page through a
/// rollback journal: four syncs (the journal twice, the directory, the file) and a journal
/// made and removed, a fifth of a new Durable Object's first request. The directory is synced
/// with the WAL's first commit, which SQLite follows with a sync of the directory it created
/// the WAL in; until then nothing about the file has been acknowledged.
fn create_in_wal_mode(path: &Path) -> std::result::Result<(), String> {
    let building = PathBuf::from(format!("{}-new", path.display()));
    if history::remove_if_present(&building).map_err(|e| e.to_string())? {
        tracing::warn!(path = %building.display(), "removed a database file a crash left half made");
    }
    {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn =
            rusqlite::Connection::open_with_flags_and_vfs(&building, flags, c"unix-none").map_err(|e| e.to_string())?;
        // Exclusive before WAL: a `unix-none` connection keeps its WAL index on the heap.
        for (pragma, value) in [("locking_mode", "EXCLUSIVE"), ("synchronous", "OFF"), ("journal_mode", "MEMORY")] {
            conn.pragma_update(None, pragma, value).map_err(|e| e.to_string())?;
        }
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)).map_err(|e| e.to_string())?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(format!("cannot use WAL mode (got {mode})"));
        }
    }
    std::fs::File::open(&building).and_then(|f| f.sync_data()).map_err(|e| e.to_string())?;
    // A WAL or journal left without its database (a file removed by hand, a copy restored in
    // part) would be replayed onto the new one; SQLite drops them beside an empty file, which
    // this one is not. Nothing owns them while the database is missing.
    for leftover in ["-wal", "-shm", "-journal"] {
        if history::remove_if_present(Path::new(&format!("{}{leftover}", path.display()))).map_err(|e| e.to_string())? {
            tracing::warn!(path = %path.display(), leftover, "removed what a missing database left behind");
        }
    }
    std::fs::rename(&building, path).map_err(|e| e.to_string())
}

/// Configures a connection, before its first statement, to hold little memory while open, as
/// the Durable Objects' connections are (a thousand may be open): no lookaside allocator (about
/// 50 KB each otherwise) and a page cache of at most [`COMPACT_CACHE_KIB`].
pub fn make_compact(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    // SQLite refuses (SQLITE_BUSY) once lookaside memory is in use; before the first statement
    // it is not.
    // SAFETY: the handle is open and used by this thread only.
    let rc = unsafe {
        rusqlite::ffi::sqlite3_db_config(
            conn.handle(),
            rusqlite::ffi::SQLITE_DBCONFIG_LOOKASIDE,
            std::ptr::null_mut::<std::ffi::c_void>(),
            0 as std::ffi::c_int,
            0 as std::ffi::c_int,
        )
    };
    if rc != rusqlite::ffi::SQLITE_OK {
        tracing::debug!(rc, "the lookaside allocator stays on");
    }
    conn.pragma_update(None, "cache_size", -COMPACT_CACHE_KIB)
}

impl Database {
    /// Opens (or creates) the file and configures the connection: WAL, `synchronous=FULL`,
    /// foreign keys, defensive mode, D1's limits and authorizer.
    pub fn open(options: &DatabaseOptions) -> Result<Self> {
        let restore_interrupted =
            options.history.is_some() && options.path.exists() && history::finish_interrupted_restore(&options.path)?;
        let authorizer = Authorizer::default();
        let deadline = Arc::new(AtomicU64::new(0));
        let epoch = Instant::now();
        let wal = Arc::new(WalProgress::default());
        let connected = connect(options, &authorizer, &deadline, epoch, &wal)?;
        let conn = &connected.conn;
        let (mut history_full_since, mut history_full_free) = (None, None);
        let history = match &options.history {
            Some(settings) => match authorizer.internal(|| {
                History::open(&options.identity, &options.path, conn, settings.clone(), restore_interrupted)
            }) {
                Ok(history) => Some(history),
                Err(e) if !options.read_only && options.shipper.is_none() && is_disk_full(&e.to_string()) => {
                    tracing::error!(path = %options.path.display(), error = %e, "the history cannot grow; serving the database read-only until it can");
                    authorizer.internal(|| conn.pragma_update(None, "query_only", true)).map_err(Error::internal)?;
                    history_full_since = Some(Instant::now());
                    history_full_free = free_bytes(&options.path);
                    None
                }
                Err(e) => return Err(e),
            },
            None => None,
        };
        let mut database = Database {
            statements: HashMap::new(),
            page_one: None,
            own: Vec::new(),
            conn: connected.conn,
            file_lock: connected.file_lock,
            authorizer,
            deadline,
            epoch,
            request_timeout: options.request_timeout,
            page_size: connected.page_size,
            size: None,
            indexes: HashMap::new(),
            result_budget: options.limits.max_result_bytes,
            max_result_bytes: options.limits.max_result_bytes,
            reads_only: false,
            poisoned: false,
            history,
            history_full_since,
            history_full_free,
            captured_commits: wal.commits.load(Ordering::Relaxed),
            owed_times: Vec::new(),
            oldest_owed: None,
            checkpointed_at_commits: 0,
            wal,
            options: options.clone(),
            path: options.path.clone(),
        };
        // Whatever the log holds that was not shipped (a commit whose shipment failed before a
        // reopen, what recovery captured from the WAL) ships before anything is served, so no
        // read shows state the store does not hold.
        database.ship()?;
        database.measure_history();
        Ok(database)
    }

    /// Sets the longest statement accepted, in bytes, and returns the previous limit. Imports
    /// raise it: a dump's INSERT of a 2 MB value is a statement of up to 4 MB.
    pub fn set_max_statement_bytes(&mut self, bytes: i32) -> i32 {
        self.conn.set_limit(rusqlite::limits::Limit::SQLITE_LIMIT_SQL_LENGTH, bytes).unwrap_or(bytes)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The options it was opened with.
    pub(crate) fn options(&self) -> &DatabaseOptions {
        &self.options
    }

    /// Notes the history's size in the database's figures (at open and at each checkpoint).
    pub(crate) fn measure_history(&self) {
        if let (Some((_, figures)), Some(history)) = (&self.options.stats, &self.history) {
            figures.history_bytes.store(history.disk_bytes(), Ordering::Relaxed);
        }
    }

    fn handle(&self) -> *mut ffi::sqlite3 {
        // SAFETY: the handle stays valid while `self.conn` lives; it is used on this thread only.
        unsafe { self.conn.handle() }
    }

    /// Runs kura's own SQL on the connection, with the authorizer's rules off.
    pub fn with_internal<T>(&mut self, f: impl FnOnce(&rusqlite::Connection) -> T) -> T {
        let conn = &self.conn;
        self.authorizer.internal(|| f(conn))
    }

    fn internal_batch(&mut self, sql: &str) -> Result<()> {
        self.with_internal(|c| c.execute_batch(sql)).map_err(Error::internal)
    }

    /// Finalizes every statement kept prepared, before the connection closes.
    fn finalize_statements(&mut self) {
        self.statements.clear();
        self.page_one = None;
        self.own.clear();
    }

    /// Prepares one of kura's own statements (one statement, which the authorizer lets through).
    fn prepare_own(&self, sql: &'static str) -> Result<RawStatement> {
        let text = SqlText::new(sql)?;
        let db = self.handle();
        // SAFETY: the handle is open and used by this thread only.
        let prepared = self.authorizer.internal(|| unsafe { RawStatement::prepare(db, &text, 0) })?;
        prepared.statement.ok_or_else(|| Error::sql(ffi::SQLITE_INTERNAL, "an empty statement of kura's"))
    }

    /// Runs one of kura's own statements, kept prepared (BEGIN, COMMIT, savepoints).
    fn internal(&mut self, sql: &'static str) -> Result<()> {
        let at = match self.own.iter().position(|(text, _)| *text == sql) {
            Some(at) => at,
            None => {
                let statement = self.prepare_own(sql)?;
                self.own.push((sql, statement));
                self.own.len() - 1
            }
        };
        let (authorizer, statement) = (&self.authorizer, &mut self.own[at].1);
        let stepped = authorizer.internal(|| statement.step());
        statement.reset();
        stepped.map(drop)
    }

    /// Runs every statement of a request on the connection as it stands (the caller owns the
    /// transaction). Returns one result per statement, as `request.mode` says.
    pub fn execute(&mut self, request: &Request) -> Result<Vec<StatementResult>> {
        self.execute_for(request, self.request_timeout)
    }

    /// [`Database::execute`], interrupted after `limit` (at most the request timeout).
    fn execute_for(&mut self, request: &Request, limit: Duration) -> Result<Vec<StatementResult>> {
        let deadline = self.epoch.elapsed() + limit.min(self.request_timeout);
        self.deadline.store(deadline.as_nanos() as u64, Ordering::Relaxed);
        self.result_budget = self.max_result_bytes;
        let outcome = self.execute_statements(request);
        self.deadline.store(0, Ordering::Relaxed);
        outcome.map_err(|e| self.explain_history_full(self.explain_interrupt(e, deadline)))
    }

    /// While the history cannot grow, a write is refused as a full disk is (it changed
    /// nothing); one a second also marks the connection for reopening, which tries the history
    /// again, so writes resume without a restart once there is room.
    fn explain_history_full(&mut self, error: Error) -> Error {
        match (error, self.history_full_since) {
            (Error::Sql { code: ffi::SQLITE_READONLY, .. }, Some(since)) => {
                if since.elapsed() >= HISTORY_RETRY {
                    self.poisoned = true;
                }
                self.history_full()
            }
            (other, _) => other,
        }
    }

    /// Why the history is unavailable: no room for it, or none kept.
    fn no_history(&self) -> Error {
        match self.history_full_since {
            Some(_) => self.history_full(),
            None => Error::NoHistory,
        }
    }

    fn history_full(&self) -> Error {
        Error::Io {
            context: "the Time Travel history cannot grow; the database is read-only until there is room".into(),
            source: std::io::Error::from_raw_os_error(28),
        }
    }

    fn execute_statements(&mut self, request: &Request) -> Result<Vec<StatementResult>> {
        let mut results = Vec::with_capacity(request.statements.len());
        for statement in &request.statements {
            self.execute_text(statement, request, &mut results)?;
        }
        if results.is_empty() {
            return Err(Error::NoStatements);
        }
        Ok(results)
    }

    /// Runs each statement of one SQL text; its parameters bind to the last statement.
    fn execute_text(
        &mut self,
        statement: &Statement,
        request: &Request,
        results: &mut Vec<StatementResult>,
    ) -> Result<()> {
        // Text seen before as exactly one statement runs its prepared statement again.
        if let Some((sql, mut cached)) = self.statements.remove_entry(&statement.sql) {
            let result = self.run_prepared(&mut cached.raw, &cached.facts, statement, request, &statement.sql);
            // Kept whether it succeeded or not: a failed run (a constraint, a read-only
            // caller's write) leaves the statement reusable once reset.
            cached.raw.reset();
            self.statements.insert(sql, cached);
            results.push(result?);
            return Ok(());
        }
        let text = SqlText::new(&statement.sql)?;
        let mut position = 0;
        let mut count = 0;
        let mut last: Option<CachedStatement> = None;
        let mut combined: Option<StatementResult> = None;
        loop {
            self.authorizer.reset_facts();
            let prepared = unsafe { RawStatement::prepare(self.handle(), &text, position) };
            let facts = self.authorizer.take_facts();
            let prepared = prepared.map_err(|e| explain_prepare_error(e, &facts))?;
            let Some(mut raw) = prepared.statement else {
                // workerd prepares whatever follows the last statement, and refuses a tail that
                // holds no statement (a comment) as it refuses an empty text.
                if request.mode == ResultMode::Cursor && count > 0 && !text.from(position).trim().is_empty() {
                    return Err(Error::NoStatements);
                }
                break;
            };
            position = prepared.next;
            count += 1;
            if last.as_ref().is_some_and(|l| l.raw.parameter_count() > 0) {
                return Err(own_check(request.mode, ffi::SQLITE_ERROR, PARAMETERS_ON_LAST_STATEMENT_ONLY.to_owned()));
            }
            let sql = text.from(prepared.start);
            let result = if raw.parameter_count() > 0 {
                self.run_prepared(&mut raw, &facts, statement, request, sql)?
            } else {
                self.run_prepared(&mut raw, &facts, &Statement::new(""), request, sql)?
            };
            last = Some(CachedStatement { raw, facts });
            match request.mode {
                ResultMode::EveryStatement => results.push(result),
                ResultMode::LastStatement => combined = Some(merge(combined.take(), result)),
                ResultMode::Cursor => combined = Some(merge_keeping_counts(combined.take(), result)),
            }
        }
        if !statement.params.is_empty() && last.as_ref().is_none_or(|l| l.raw.parameter_count() == 0) {
            return Err(wrong_parameter_count(request.mode, 0, statement.params.len()));
        }
        results.extend(combined);
        if let (1, Some(mut single)) = (count, last) {
            single.raw.reset();
            if self.statements.len() >= STATEMENT_CACHE_SIZE {
                self.statements.clear();
            }
            self.statements.insert(statement.sql.clone(), single);
        }
        Ok(())
    }

    /// Binds a prepared statement's parameters, checks access, and runs it.
    fn run_prepared(
        &mut self,
        raw: &mut RawStatement,
        facts: &StatementFacts,
        statement: &Statement,
        request: &Request,
        sql: &str,
    ) -> Result<StatementResult> {
        if raw.parameter_count() != statement.params.len() {
            return Err(wrong_parameter_count(request.mode, raw.parameter_count(), statement.params.len()));
        }
        raw.bind_all(&statement.params)?;
        if (request.access == Access::ReadOnly || self.reads_only) && !raw.is_readonly() {
            return Err(Error::ReadOnly { sql: sql.trim().to_owned() });
        }
        let outcome = self.run(raw, facts);
        if outcome.is_err() {
            raw.reset();
        }
        outcome
    }

    /// Steps one prepared statement to the end and measures it.
    fn run(&mut self, raw: &mut RawStatement, facts: &StatementFacts) -> Result<StatementResult> {
        let db = self.handle();
        let started = Instant::now();
        let total_before = unsafe { ffi::sqlite3_total_changes64(db) };
        let last_before = unsafe { ffi::sqlite3_last_insert_rowid(db) };
        let reports_size = self.options.reports_size;
        let size_before = match self.size {
            _ if !reports_size => 0,
            Some(size) => size,
            None => self.measure_size()?,
        };
        let reserved_before = if facts.alters_table { self.count_reserved_names()? } else { 0 };
        // `IF NOT EXISTS` on an object that exists creates nothing and writes no schema row.
        let schema_before = if facts.creates.is_some() { Some(self.schema_version()?) } else { None };
        let columns = raw.column_names();
        let mut rows = Vec::new();
        while raw.step()? {
            let row = raw.row(columns.len());
            let bytes = row.iter().map(Value::footprint).sum::<usize>();
            self.result_budget = self.result_budget.checked_sub(bytes).ok_or_else(|| {
                Error::sql(
                    ffi::SQLITE_TOOBIG,
                    &format!(
                        "the results are larger than {} MB; select fewer rows or columns",
                        self.max_result_bytes / 1_000_000
                    ),
                )
            })?;
            rows.push(row);
        }
        let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
        if facts.alters_table && self.count_reserved_names()? > reserved_before {
            return Err(Error::sql(ffi::SQLITE_AUTH, "not authorized"));
        }
        let readonly = raw.is_readonly();
        let changes = unsafe { ffi::sqlite3_total_changes64(db) - total_before }.max(0) as u64;
        // sqlite3_changes() is sticky: only a DML statement's own count is meaningful here.
        let statement_changes =
            if readonly || facts.changes_schema { 0 } else { unsafe { ffi::sqlite3_changes64(db) }.max(0) as u64 };
        let last_row_id = unsafe { ffi::sqlite3_last_insert_rowid(db) };
        if facts.changes_schema {
            self.indexes.clear();
        }
        let size_after = if readonly || !reports_size { size_before } else { self.measure_size()? };
        let created = match schema_before {
            Some(before) => self.schema_version()? != before,
            None => false,
        };
        let schema = if created { self.with_internal(|c| schema_writes(c, facts)) } else { 0 };
        let rows_written = changes + self.index_writes(facts, statement_changes) + schema;
        let rows_read = raw.rows_visited();
        Ok(StatementResult {
            columns,
            rows,
            meta: Meta {
                changes,
                last_row_id,
                changed_db: changes != 0 || last_row_id != last_before || size_after != size_before,
                size_after,
                rows_read,
                rows_written,
                duration_ms,
                wrote: !readonly,
            },
        })
    }

    /// Schema objects with reserved names. `ALTER TABLE … RENAME TO _cf_x` passes the
    /// authorizer (SQLite shows it the old name only), so ALTER compares this before and after;
    /// the caller's savepoint undoes a rename that added one.
    fn schema_version(&mut self) -> Result<i64> {
        self.with_internal(|c| c.query_row("PRAGMA schema_version", [], |r| r.get(0))).map_err(Error::internal)
    }

    fn count_reserved_names(&mut self) -> Result<i64> {
        self.with_internal(|c| {
            c.prepare_cached("SELECT count(*) FROM sqlite_schema WHERE lower(substr(name, 1, 4)) = '_cf_'")?
                .query_row([], |r| r.get(0))
        })
        .map_err(Error::internal)
    }

    /// Bytes in use: `(page_count - freelist_count) * page_size`, as D1 reports `size_after`.
    fn measure_size(&mut self) -> Result<u64> {
        let pages = self.used_pages()?;
        let size = pages * self.page_size;
        self.size = Some(size);
        Ok(size)
    }

    /// Pages in use, from page 1 of the current transaction: the database size in pages (header
    /// offset 28) less the free pages (offset 36). Reading the page through a statement kept
    /// prepared costs a microsecond; `PRAGMA page_count` is prepared afresh on every run.
    #[cfg(kura_dbpage)]
    fn used_pages(&mut self) -> Result<u64> {
        if self.page_one.is_none() {
            self.page_one = Some(self.prepare_own("SELECT data FROM sqlite_dbpage('main') WHERE pgno = 1")?);
        }
        let (authorizer, statement) = (&self.authorizer, &mut self.page_one);
        let statement = statement.as_mut().expect("prepared just above");
        let pages = authorizer.internal(|| -> Result<u64> {
            if !statement.step()? {
                return Err(Error::sql(ffi::SQLITE_CORRUPT, "page 1 is missing"));
            }
            let header = statement.column_bytes(0);
            let word =
                |at: usize| header.get(at..at + 4).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as u64);
            Ok(word(28).saturating_sub(word(36)))
        });
        statement.reset();
        pages
    }

    /// Pages in use, from the pragmas, when SQLite was built without `sqlite_dbpage`.
    #[cfg(not(kura_dbpage))]
    fn used_pages(&mut self) -> Result<u64> {
        self.with_internal(|conn| {
            let count: i64 = conn.prepare_cached("PRAGMA page_count")?.query_row([], |r| r.get(0))?;
            let free: i64 = conn.prepare_cached("PRAGMA freelist_count")?.query_row([], |r| r.get(0))?;
            Ok(count.saturating_sub(free).max(0) as u64)
        })
        .map_err(Error::internal)
    }

    /// The current size in bytes, free pages excluded.
    pub fn size(&mut self) -> Result<u64> {
        self.measure_size()
    }

    fn explain_interrupt(&self, error: Error, deadline: Duration) -> Error {
        match error {
            Error::Sql { code: ffi::SQLITE_INTERRUPT, .. } if self.epoch.elapsed() >= deadline => Error::sql(
                ffi::SQLITE_INTERRUPT,
                &format!(
                    "the request exceeded its time limit of {} s and was cancelled",
                    self.request_timeout.as_secs()
                ),
            ),
            other => other,
        }
    }
}

/// How often a write refused for a full history tries the history again.
const HISTORY_RETRY: Duration = Duration::from_secs(1);

/// Rewords two preparation failures: a denied BEGIN/SAVEPOINT gets D1's explanation instead of
/// SQLite's bare "not authorized", and a statement over the length limit, which SQLite's
/// tokenizer reports as a generic "string or blob too big", says so.
fn explain_prepare_error(error: Error, facts: &StatementFacts) -> Error {
    match error {
        Error::Sql { code: ffi::SQLITE_AUTH, .. } if facts.transaction => {
            Error::Sql { message: TRANSACTION_MESSAGE.to_owned(), code: ffi::SQLITE_AUTH, extended: ffi::SQLITE_AUTH }
        }
        Error::Sql { code: ffi::SQLITE_TOOBIG, .. } => Error::sql(ffi::SQLITE_TOOBIG, "statement too long"),
        other => other,
    }
}

/// An error of the checks kura makes itself, worded as the caller's API words it: D1 ends its
/// texts with a result code, workerd's `sql.exec()` ([`ResultMode::Cursor`]) does not.
fn own_check(mode: ResultMode, code: i32, message: String) -> Error {
    match mode {
        ResultMode::Cursor => Error::Sql { message, code, extended: code },
        ResultMode::EveryStatement | ResultMode::LastStatement => Error::sql(code, &message),
    }
}

fn wrong_parameter_count(mode: ResultMode, expected: usize, given: usize) -> Error {
    let message = match mode {
        ResultMode::Cursor => format!("{WRONG_PARAMETER_COUNT}."),
        _ => format!("{WRONG_PARAMETER_COUNT} (the statement takes {expected}, {given} given)"),
    };
    own_check(mode, ffi::SQLITE_RANGE, message)
}

/// As [`merge`], but the counters reported are the last statement's own (workerd's cursor);
/// whether anything was written still covers every statement.
fn merge_keeping_counts(previous: Option<StatementResult>, mut last: StatementResult) -> StatementResult {
    if let Some(p) = previous {
        last.meta.duration_ms += p.meta.duration_ms;
        last.meta.changed_db |= p.meta.changed_db;
        last.meta.wrote |= p.meta.wrote;
    }
    last
}

/// Folds the statements of one multi-statement text into one result: rows of the last,
/// counters summed.
fn merge(previous: Option<StatementResult>, mut last: StatementResult) -> StatementResult {
    if let Some(p) = previous {
        last.meta.changes += p.meta.changes;
        last.meta.rows_read += p.meta.rows_read;
        last.meta.rows_written += p.meta.rows_written;
        last.meta.duration_ms += p.meta.duration_ms;
        last.meta.changed_db |= p.meta.changed_db;
        last.meta.wrote |= p.meta.wrote;
    }
    last
}

/// Bytes free to unprivileged writers on the filesystem holding `path` (`None` if unknown).
pub(crate) fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let c_path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: a NUL-terminated path and a zeroed `statvfs` for the call to fill.
    let stat = unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        (libc::statvfs(c_path.as_ptr(), &mut stat) == 0).then_some(stat)
    }?;
    Some((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{Request, Statement};

    /// A database kura writes alone keeps its WAL index on the heap: no `-shm` file to create,
    /// extend, map and have written back, for one of many open at once as for a D1 database.
    #[test]
    fn an_exclusively_written_database_keeps_no_shared_memory_file() {
        for compact in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("db.sqlite");
            for _ in 0..2 {
                // Opened twice: once made, once found with its WAL.
                let mut db = Database::open(&DatabaseOptions::new(&path).create(true).compact(compact)).unwrap();
                let write = "CREATE TABLE IF NOT EXISTS t (x); INSERT INTO t VALUES (1)";
                db.execute(&Request::new(vec![Statement::new(write)])).unwrap();
                assert!(path.with_extension("sqlite-wal").exists(), "the database is in WAL mode");
                assert!(!path.with_extension("sqlite-shm").exists(), "compact {compact}: a -shm file was made");
            }
        }
    }
    /// A new file is made whole under another name and renamed into place, already in WAL
    /// mode (no rollback journal, one sync); what a crash left of an earlier attempt is
    /// removed first.
    #[test]
    fn a_new_database_is_made_in_wal_mode_and_a_half_made_one_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let building = dir.path().join("db.sqlite-new");
        std::fs::write(&building, b"what a crash left halfway").unwrap();
        let mut db = Database::open(&DatabaseOptions::new(&path).create(true)).unwrap();
        assert!(!building.exists(), "the half-made file is still there");
        let header = std::fs::read(&path).unwrap();
        assert_eq!((header.len(), header[18], header[19]), (4096, 2, 2), "one page, WAL mode from the start");
        db.execute(&Request::new(vec![Statement::new("CREATE TABLE t (x); INSERT INTO t VALUES (1)")])).unwrap();
        drop(db);
        let mut db = Database::open(&DatabaseOptions::new(&path)).unwrap();
        let rows = db.execute(&Request::new(vec![Statement::new("SELECT x FROM t")])).unwrap();
        assert_eq!(rows[0].rows, vec![vec![crate::request::Value::Integer(1)]]);
    }
    /// A WAL left without its database is not replayed onto a new one: the new file starts
    /// empty, as SQLite starts one beside an empty file.
    #[test]
    fn a_wal_left_without_its_database_is_not_replayed_onto_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let wal = dir.path().join("db.sqlite-wal");
        let old = rusqlite::Connection::open(&path).unwrap();
        old.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0; CREATE TABLE old (x); INSERT INTO old VALUES (1);",
        )
        .unwrap();
        let left = std::fs::read(&wal).unwrap();
        drop(old);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&wal, left).unwrap();
        let mut db = Database::open(&DatabaseOptions::new(&path).create(true)).unwrap();
        let tables = db.execute(&Request::new(vec![Statement::new("SELECT count(*) FROM sqlite_schema")])).unwrap();
        assert_eq!(tables[0].rows, vec![vec![crate::request::Value::Integer(0)]], "the old WAL was replayed");
    }

    /// A database that does not report its size (a Durable Object's) still counts its writes
    /// and answers its size when asked; one that does (D1's) reports it after every write.
    #[test]
    fn size_after_each_write_is_measured_only_where_it_is_reported() {
        for reports_size in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let options = DatabaseOptions::new(dir.path().join("db.sqlite")).create(true).reports_size(reports_size);
            let mut db = Database::open(&options).unwrap();
            let write = "CREATE TABLE t (x); INSERT INTO t VALUES (zeroblob(20000))";
            let results = db.execute(&Request::new(vec![Statement::new(write)])).unwrap();
            let insert = &results[1].meta;
            assert_eq!((insert.changes, insert.changed_db), (1, true), "reports_size {reports_size}");
            let size = db.size().unwrap();
            assert!(size > 20_000, "the database holds the blob: {size} bytes");
            let expected = if reports_size { size } else { 0 };
            assert_eq!(insert.size_after, expected, "reports_size {reports_size}");
            // Measured on request, the size is not carried into later writes' results.
            let again = db.execute(&Request::new(vec![Statement::new("INSERT INTO t VALUES (1)")])).unwrap();
            let expected = if reports_size { db.size().unwrap() } else { 0 };
            assert_eq!(again[0].meta.size_after, expected, "reports_size {reports_size}");
        }
    }
}
