//! Opening a database file: its options, the read-write connection configured for D1 (WAL,
//! `synchronous=FULL`, limits, the authorizer, the deadline, the WAL hook), the lock that keeps
//! other processes off it, and its history recovered.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rusqlite::OpenFlags;
use rusqlite::config::DbConfig;

use crate::error::{Error, Result, is_disk_full};
use crate::history::{self, History, HistorySettings, LogShipper};
use crate::policy::{Authorizer, Limits};

use super::file_lock::FileLock;
use super::{Capture, Database, WalProgress};

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

/// A configured connection and the lock that keeps other processes off its file, dropped in
/// that order wherever they are dropped (a connection's close may checkpoint).
pub(super) struct Connected {
    pub(super) conn: rusqlite::Connection,
    /// `None` for a read-only connection.
    pub(super) file_lock: Option<FileLock>,
    pub(super) page_size: u64,
}

/// How long opening waits for another process to let go of the file, as SQLite's busy timeout
/// waited for its own locks.
pub(super) const LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens and configures the read-write connection: WAL, `synchronous=FULL`, foreign keys,
/// defensive mode, D1's limits and authorizer, the request deadline, and (with a history) the
/// WAL hook that takes checkpoints away from SQLite.
pub(super) fn connect(
    options: &DatabaseOptions,
    authorizer: &Authorizer,
    deadline: &Arc<AtomicU64>,
    epoch: Instant,
    wal: &Arc<WalProgress>,
) -> Result<Connected> {
    crate::configure_process();
    let open_error = |e: rusqlite::Error| Error::open(&options.path, "", e);
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if options.read_only {
        flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    } else if options.create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let exists = |path: &Path| path.try_exists().map_err(|e| Error::open(path, "", e));
    let missing = options.create && !options.read_only && !exists(&options.path)?;
    if missing {
        create_in_wal_mode(&options.path)?;
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
                    disk_full: false,
                });
            }
            Err(e) => {
                return Err(Error::open(&options.path, "cannot lock the file: ", e));
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
                disk_full: false,
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
pub(super) fn create_in_wal_mode(path: &Path) -> Result<()> {
    // One per error type (a closure is not generic): the file system's and SQLite's.
    let cannot = |e: std::io::Error| Error::open(path, "cannot create it: ", e);
    let cannot_sql = |e: rusqlite::Error| Error::open(path, "cannot create it: ", e);
    let building = PathBuf::from(format!("{}-new", path.display()));
    if history::remove_if_present(&building).map_err(cannot)? {
        tracing::warn!(path = %building.display(), "removed a database file a crash left half made");
    }
    {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = rusqlite::Connection::open_with_flags_and_vfs(&building, flags, c"unix-none").map_err(cannot_sql)?;
        // Exclusive before WAL: a `unix-none` connection keeps its WAL index on the heap.
        for (pragma, value) in [("locking_mode", "EXCLUSIVE"), ("synchronous", "OFF"), ("journal_mode", "MEMORY")] {
            conn.pragma_update(None, pragma, value).map_err(cannot_sql)?;
        }
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)).map_err(cannot_sql)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::Open {
                path: path.to_owned(),
                message: format!("cannot create it: cannot use WAL mode (got {mode})"),
                disk_full: false,
            });
        }
    }
    std::fs::File::open(&building).and_then(|f| f.sync_data()).map_err(cannot)?;
    // A WAL or journal left without its database (a file removed by hand, a copy restored in
    // part) would be replayed onto the new one; SQLite drops them beside an empty file, which
    // this one is not. Nothing owns them while the database is missing.
    for leftover in ["-wal", "-shm", "-journal"] {
        if history::remove_if_present(Path::new(&format!("{}{leftover}", path.display()))).map_err(cannot)? {
            tracing::warn!(path = %path.display(), leftover, "removed what a missing database left behind");
        }
    }
    std::fs::rename(&building, path).map_err(cannot)
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
                Err(e) if !options.read_only && options.shipper.is_none() && is_disk_full(&e) => {
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
            capture: Capture {
                history_full_since,
                history_full_free,
                captured_commits: wal.commits.load(Ordering::Relaxed),
                owed_times: Vec::new(),
                oldest_owed: None,
                checkpointed_at_commits: 0,
                wal,
            },
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
}
