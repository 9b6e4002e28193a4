//! Point-in-time recovery for objects another process runs (namespaces
//! [`hosted elsewhere`](crate::Namespace::hosted_elsewhere): a deployed Worker's classes in
//! workerd). Each announced object gets a [`Follower`] that captures its committed WAL frames
//! into a history log of its own (`<namespace>/history/<object id>/`), as kura's own objects
//! keep theirs. A thread of its own (`kura-do-follow`) captures every attached object each
//! tick, lets go of objects whose writer has closed them, and looks again at the files of
//! objects it let go, attaching once they change. Restores need the writer gone: the caller
//! stops it first.
//!
//! In a cluster, the node serving a namespace ships each capture of its objects to the store
//! (through the objects' placement), so another node can rebuild them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use kura_sqlite::{Bookmark, Follower, HistorySettings, Placement, Restored};

use crate::error::{DoError, Result};

/// How often attached objects are captured. Each capture records every commit since the last
/// one on its own, stamped with the capture's time: this is how precise a bookmark for a time
/// is (a bookmark asked for by id captures first, and is exact).
const TICK: Duration = Duration::from_secs(1);
/// How often the files of objects let go are looked at.
const LOOK_AGAIN: Duration = Duration::from_secs(2);
/// An object just announced stays attached this long even before its writer opens the file.
const GRACE: Duration = Duration::from_secs(10);
/// Most objects attached at once (each holds two connections to its file).
const MAX_ATTACHED: usize = 256;

struct Entry {
    follower: Follower,
    announced: Instant,
    last_look: Instant,
    /// The WAL's length and modification time when last captured or let go: unchanged, there
    /// is nothing to capture.
    seen: Option<(u64, SystemTime)>,
    /// The object's alarm (workerd's nanoseconds) as last captured; `None` until read once.
    alarm: Option<Option<i64>>,
    /// Let go of for a rebuild: a tick still holding it must not attach it again.
    forgotten: bool,
}

/// The alarm an object's file holds: workerd keeps it in `_cf_METADATA` under key 1, in
/// nanoseconds since the epoch (no table, or no row: none).
fn read_alarm(conn: &rusqlite::Connection) -> rusqlite::Result<Option<i64>> {
    use rusqlite::OptionalExtension;
    let has_table = conn
        .query_row("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = '_cf_METADATA'", [], |_| Ok(()))
        .optional()?
        .is_some();
    if !has_table {
        return Ok(None);
    }
    Ok(conn
        .query_row("SELECT value FROM _cf_METADATA WHERE key = 1", [], |r| r.get::<_, Option<i64>>(0))
        .optional()?
        .flatten())
}

fn wal_stamp(db: &Path) -> Option<(u64, SystemTime)> {
    let meta = std::fs::metadata(format!("{}-wal", db.display())).ok()?;
    Some((meta.len(), meta.modified().ok()?))
}

/// Opens workerd's alarm scheduler file (`_cf_ALARM`: the object's id, nanoseconds) as workerd
/// made it, or `None` if workerd has not made it yet. kura never makes it itself: the table's
/// shape is workerd's.
fn open_scheduler(path: &Path) -> rusqlite::Result<Option<rusqlite::Connection>> {
    use rusqlite::OptionalExtension;
    if !path.exists() {
        return Ok(None);
    }
    let conn = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let made = conn
        .query_row("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = '_cf_ALARM'", [], |_| Ok(()))
        .optional()?
        .is_some();
    Ok(made.then_some(conn))
}

fn scheduler_error(path: &Path) -> impl Fn(rusqlite::Error) -> DoError + '_ {
    move |e| DoError::Storage(format!("workerd's alarm schedule {}: {e}", path.display()))
}

/// Sets each object's row in workerd's alarm schedule at `path` to its alarm (nanoseconds;
/// `None` removes it), keeping the others; answers whether anything changed (workerd reads
/// the schedule only when it starts). A schedule workerd has not made yet changes nothing.
pub(crate) fn schedule_in(path: &Path, alarms: &[(String, Option<i64>)]) -> Result<bool> {
    let fail = scheduler_error(path);
    let Some(conn) = open_scheduler(path).map_err(&fail)? else {
        tracing::warn!(path = %path.display(), "workerd has not made this alarm schedule yet; its alarms wait");
        return Ok(false);
    };
    let mut changed = 0;
    for (object, at) in alarms {
        changed += match at {
            Some(at) => conn.execute(
                "INSERT INTO _cf_ALARM (actor_id, scheduled_time) VALUES (?1, ?2) \
                 ON CONFLICT (actor_id) DO UPDATE SET scheduled_time = excluded.scheduled_time \
                 WHERE scheduled_time IS NOT excluded.scheduled_time",
                (object, at),
            ),
            None => conn.execute("DELETE FROM _cf_ALARM WHERE actor_id = ?1", [object]),
        }
        .map_err(&fail)?;
    }
    Ok(changed > 0)
}

/// Empties workerd's alarm schedule at `path`; answers whether it held any (an empty one is
/// only read).
pub(crate) fn unschedule_all(path: &Path) -> Result<bool> {
    let fail = scheduler_error(path);
    let Some(conn) = open_scheduler(path).map_err(&fail)? else { return Ok(false) };
    let any: bool = conn.query_row("SELECT EXISTS (SELECT 1 FROM _cf_ALARM)", [], |r| r.get(0)).map_err(&fail)?;
    if !any {
        return Ok(false);
    }
    Ok(conn.execute("DELETE FROM _cf_ALARM", []).map_err(&fail)? > 0)
}

/// The alarm an object's file holds now (read beside its writer), `None` without one or
/// without a file.
pub(crate) fn file_alarm(file: &Path) -> Result<Option<i64>> {
    if !file.exists() {
        return Ok(None);
    }
    let fail = |e: rusqlite::Error| DoError::Storage(format!("reading the alarm of {}: {e}", file.display()));
    let conn = rusqlite::Connection::open_with_flags(
        file,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(fail)?;
    conn.busy_timeout(Duration::from_secs(5)).map_err(fail)?;
    read_alarm(&conn).map_err(fail)
}

/// Empties workerd's alarm schedule of every namespace under `root` (a cluster's node starts
/// serving no namespace: what a schedule still lists from an earlier run is not its to fire).
pub(crate) fn unschedule_everywhere(root: &Path) {
    let Ok(listing) = std::fs::read_dir(root) else { return };
    for entry in listing.flatten() {
        let path = entry.path().join("workerd").join("metadata.sqlite");
        if path.exists()
            && let Err(e) = unschedule_all(&path)
        {
            tracing::warn!(error = %e, "cannot empty an alarm schedule left from an earlier run");
        }
    }
}

/// The followers of one engine.
pub(crate) struct Hosted {
    root: PathBuf,
    settings: HistorySettings,
    /// In a cluster, the objects' placement: whose shipper each capture passes.
    objects: Option<Arc<dyn Placement>>,
    entries: Mutex<HashMap<String, Arc<Mutex<Entry>>>>,
    /// In a cluster, alarms captured since they were last taken (by `<namespace>/<object>`),
    /// for the namespace's index: the node taking the namespace over schedules them.
    alarms_changed: Mutex<HashMap<String, Option<i64>>>,
    /// In a cluster, per object: calls hold it shared, a rebuild of its file exclusively.
    calls: Mutex<HashMap<String, Arc<tokio::sync::RwLock<()>>>>,
    stop: AtomicBool,
    ticker: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn from_sql(e: kura_sqlite::Error) -> DoError {
    DoError::from_sql(e)
}

impl Hosted {
    /// Starts the capture thread.
    pub(crate) fn start(root: PathBuf, settings: HistorySettings, objects: Option<Arc<dyn Placement>>) -> Arc<Hosted> {
        let hosted = Arc::new(Hosted {
            root,
            settings,
            objects,
            entries: Mutex::new(HashMap::new()),
            alarms_changed: Mutex::new(HashMap::new()),
            calls: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            ticker: Mutex::new(None),
        });
        let ticking = Arc::clone(&hosted);
        match std::thread::Builder::new().name("kura-do-follow".into()).spawn(move || ticking.run()) {
            Ok(handle) => *lock(&hosted.ticker) = Some(handle),
            Err(e) => tracing::error!(error = %e, "cannot start the thread that follows objects workerd runs"),
        }
        hosted
    }

    /// The file workerd keeps an object in.
    pub(crate) fn file(&self, namespace: &str, object: &str) -> PathBuf {
        self.root.join(namespace).join("workerd").join(format!("{object}.sqlite"))
    }

    /// The file workerd's alarm scheduler keeps a namespace's alarms in (it reads it when it
    /// starts, and writes it as objects set alarms).
    pub(crate) fn scheduler_file(&self, namespace: &str) -> PathBuf {
        self.root.join(namespace).join("workerd").join("metadata.sqlite")
    }

    /// The directory an object's history log is kept in.
    pub(crate) fn log(&self, namespace: &str, object: &str) -> PathBuf {
        self.root.join(namespace).join("history").join(object)
    }

    fn entry(&self, namespace: &str, object: &str) -> Arc<Mutex<Entry>> {
        let key = format!("{namespace}/{object}");
        let mut entries = lock(&self.entries);
        let entry = entries.entry(key.clone()).or_insert_with(|| {
            let (db, log) = (self.file(namespace, object), self.log(namespace, object));
            Arc::new(Mutex::new(Entry {
                follower: Follower::new(&key, &db, &log, self.settings.clone()),
                announced: Instant::now(),
                last_look: Instant::now(),
                seen: None,
                alarm: None,
                forgotten: false,
            }))
        });
        Arc::clone(entry)
    }

    /// An object is starting: follow it (from now, or from where its history left off).
    pub(crate) fn announce(&self, namespace: &str, object: &str) -> Result<()> {
        let entry = self.entry(namespace, object);
        let mut entry = lock(&entry);
        entry.announced = Instant::now();
        entry.follower.attach().map(|_| ()).map_err(from_sql)
    }

    /// Runs `f` on an object's follower (created, not yet attached, if new).
    pub(crate) fn with<T>(
        &self,
        namespace: &str,
        object: &str,
        f: impl FnOnce(&mut Follower) -> kura_sqlite::Result<T>,
    ) -> Result<T> {
        let entry = self.entry(namespace, object);
        let mut entry = lock(&entry);
        f(&mut entry.follower).map_err(from_sql)
    }

    /// Stops following an object without capturing anything more (its files are about to be
    /// rebuilt from the store): its connections close before this returns.
    pub(crate) fn forget(&self, namespace: &str, object: &str) {
        let Some(entry) = lock(&self.entries).remove(&format!("{namespace}/{object}")) else { return };
        let mut entry = lock(&entry);
        let (db, log) = (self.file(namespace, object), self.log(namespace, object));
        entry.follower = Follower::new(&format!("{namespace}/{object}"), &db, &log, self.settings.clone());
        entry.forgotten = true;
    }

    /// The lock an object's calls and the rebuilds of its file take (see `HostedCall`).
    pub(crate) fn calls(&self, key: &str) -> Arc<tokio::sync::RwLock<()>> {
        Arc::clone(lock(&self.calls).entry(key.to_owned()).or_default())
    }

    /// In a cluster, captures what an object committed and ships it: once this returns, the
    /// store holds every commit made before it was called. Fails if this node no longer owns
    /// the object.
    pub(crate) fn capture_and_ship(&self, namespace: &str, object: &str) -> Result<()> {
        let key = format!("{namespace}/{object}");
        let entry = self.entry(namespace, object);
        let mut entry = lock(&entry);
        let stamp = wal_stamp(entry.follower.db_path());
        entry.follower.capture().map_err(from_sql)?;
        entry.seen = stamp;
        self.note_alarm(&key, &mut entry);
        let Some(objects) = &self.objects else { return Ok(()) };
        let shipper = objects
            .shipper(&key)
            .ok_or_else(|| DoError::Unavailable("this node no longer holds the object; retry".into()))?;
        entry.follower.ship(&*shipper).map_err(from_sql)
    }

    /// Captures, notes the alarm, and in a cluster ships while this node owns the object: what
    /// no call waited for (an alarm's writes, `waitUntil`'s) ships here.
    fn capture_and_ship_owned(&self, key: &str, entry: &mut Entry) -> kura_sqlite::Result<()> {
        entry.follower.capture()?;
        self.note_alarm(key, entry);
        match self.objects.as_ref().and_then(|objects| objects.shipper(key)) {
            Some(shipper) => entry.follower.ship(&*shipper),
            None => Ok(()),
        }
    }

    /// In a cluster, notes the object's alarm as just captured, if it changed.
    fn note_alarm(&self, key: &str, entry: &mut Entry) {
        if self.objects.is_none() {
            return;
        }
        match entry.follower.read_captured(read_alarm) {
            Some(Ok(alarm)) if entry.alarm != Some(alarm) => {
                entry.alarm = Some(alarm);
                lock(&self.alarms_changed).insert(key.to_owned(), alarm);
            }
            Some(Err(e)) => tracing::warn!(object = key, error = %e, "could not read an object's alarm"),
            _ => {}
        }
    }

    /// The alarms captured since last taken, by `(namespace, object)`: all of them, or one
    /// object's.
    pub(crate) fn take_alarm_changes(&self, only: Option<(&str, &str)>) -> Vec<(String, String, Option<i64>)> {
        let mut changed = lock(&self.alarms_changed);
        let taken: Vec<(String, Option<i64>)> = match only {
            Some((namespace, object)) => {
                let key = format!("{namespace}/{object}");
                changed.remove(&key).map(|alarm| (key, alarm)).into_iter().collect()
            }
            None => changed.drain().collect(),
        };
        taken
            .into_iter()
            .filter_map(|(key, alarm)| {
                let (namespace, object) = key.split_once('/')?;
                Some((namespace.to_owned(), object.to_owned(), alarm))
            })
            .collect()
    }

    /// Gives back alarm changes that could not be recorded (a newer capture wins).
    pub(crate) fn restore_alarm_changes(&self, changes: Vec<(String, String, Option<i64>)>) {
        let mut changed = lock(&self.alarms_changed);
        for (namespace, object, alarm) in changes {
            changed.entry(format!("{namespace}/{object}")).or_insert(alarm);
        }
    }

    /// The bookmark of an object's current state.
    pub(crate) fn bookmark(&self, namespace: &str, object: &str) -> Result<Bookmark> {
        self.with(namespace, object, |f| f.bookmark())
    }

    /// The bookmark of an object's last commit at or before `time_ms`.
    pub(crate) fn bookmark_for_time(&self, namespace: &str, object: &str, time_ms: i64) -> Result<Bookmark> {
        self.with(namespace, object, |f| f.bookmark_for_time(time_ms))
    }

    /// Restores an object whose writer has closed it.
    pub(crate) fn restore(&self, namespace: &str, object: &str, bookmark: &Bookmark) -> Result<Restored> {
        self.with(namespace, object, |f| f.restore(bookmark))
    }

    /// Captures every attached object and lets go of them all (at shutdown).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        // The ticking thread ends first, so nothing attaches again behind this.
        if let Some(ticker) = lock(&self.ticker).take() {
            let _ = ticker.join();
        }
        let entries: Vec<_> = lock(&self.entries).iter().map(|(k, e)| (k.clone(), Arc::clone(e))).collect();
        for (key, entry) in entries {
            let mut entry = lock(&entry);
            if entry.forgotten {
                continue;
            }
            let last = self.capture_and_ship_owned(&key, &mut entry).and_then(|()| entry.follower.detach());
            if let Err(e) = last {
                tracing::warn!(error = %e, "could not capture (or ship) an object's last commits");
            }
        }
    }

    fn run(self: Arc<Self>) {
        while !self.stop.load(Ordering::SeqCst) {
            std::thread::sleep(TICK);
            let entries: Vec<_> = lock(&self.entries).iter().map(|(k, e)| (k.clone(), Arc::clone(e))).collect();
            let mut attached = 0;
            for (key, entry) in entries {
                let mut entry = lock(&entry);
                if let Err(e) = self.tick(&key, &mut entry, attached >= MAX_ATTACHED) {
                    tracing::warn!(error = %e, "capturing an object workerd runs failed; it is followed again next time");
                }
                attached += entry.follower.is_attached() as usize;
            }
        }
    }

    fn tick(&self, key: &str, entry: &mut Entry, crowded: bool) -> kura_sqlite::Result<()> {
        if entry.forgotten {
            return Ok(());
        }
        if entry.follower.is_attached() {
            // Stamped before the capture, so a commit landing during it is seen next time; a
            // capture is also due while the last checkpoint left frames behind, so the WAL of a
            // quiet object gets to start over.
            let stamp = wal_stamp(self.db_of(entry));
            if stamp != entry.seen || stamp.is_none() || entry.follower.behind() {
                self.capture_and_ship_owned(key, entry)?;
                entry.seen = stamp;
            }
            if entry.last_look.elapsed() >= LOOK_AGAIN || crowded {
                entry.last_look = Instant::now();
                let writer_gone = !entry.follower.writer_present();
                if writer_gone && (entry.announced.elapsed() > GRACE || crowded) {
                    // A follower let go of ships nothing: what it captures last ships first.
                    self.capture_and_ship_owned(key, entry)?;
                    entry.follower.detach()?;
                    entry.seen = wal_stamp(self.db_of(entry));
                }
            }
            return Ok(());
        }
        if entry.last_look.elapsed() < LOOK_AGAIN {
            return Ok(());
        }
        entry.last_look = Instant::now();
        let changed = wal_stamp(self.db_of(entry)) != entry.seen;
        if changed || entry.follower.writer_present() {
            entry.follower.attach()?;
        }
        Ok(())
    }

    fn db_of<'a>(&self, entry: &'a Entry) -> &'a Path {
        entry.follower.db_path()
    }
}
