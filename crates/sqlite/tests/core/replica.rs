//! Read replicas: a copy built from a database's shipped log follows the records shipped after
//! it — growing, freeing pages, schema changes, commits packed together — and reads what the owner
//! reads at the same bookmark; a restore or a gap breaks continuity instead of serving a wrong
//! state.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use kura_sqlite::{Continuity, Executed, LogShipper, LogView, Replica, ReplicaRead, ShipError};

use crate::common::*;

/// One shipment of log bytes: the segment (by its first position), where they start, the bytes.
type Shipment = (u64, u64, Vec<u8>);

/// A shipper that keeps what it is shown as a store would: every snapshot whole, and each
/// segment's new bytes as one shipment.
#[derive(Debug, Default)]
struct Store {
    snapshots: Mutex<BTreeMap<u64, Vec<u8>>>,
    sent: Mutex<BTreeMap<u64, u64>>,
    shipments: Mutex<Vec<Shipment>>,
}

impl LogShipper for Store {
    fn ship(&self, log: &LogView) -> Result<(), ShipError> {
        let mut snapshots = self.snapshots.lock().unwrap();
        for (seq, path) in &log.snapshots {
            if !snapshots.contains_key(seq) {
                snapshots.insert(*seq, std::fs::read(path).map_err(|e| ShipError::new(e.to_string()))?);
            }
        }
        let mut sent = self.sent.lock().unwrap();
        for segment in &log.segments {
            let from = sent.get(&segment.first_seq).copied().unwrap_or(0);
            if segment.len > from {
                let file = std::fs::File::open(&segment.path).map_err(|e| ShipError::new(e.to_string()))?;
                let mut bytes = vec![0u8; (segment.len - from) as usize];
                file.read_exact_at(&mut bytes, from).map_err(|e| ShipError::new(e.to_string()))?;
                self.shipments.lock().unwrap().push((segment.first_seq, from, bytes));
                sent.insert(segment.first_seq, segment.len);
            }
        }
        Ok(())
    }
}

impl Store {
    /// Builds a copy at `dir` from everything shipped so far (as a node rebuilding from the
    /// store does), and answers how many shipments it holds.
    fn rebuild(&self, dir: &Path) -> (PathBuf, usize) {
        let all = self.shipments.lock().unwrap().len();
        self.rebuild_upto(dir, all)
    }

    /// Builds a copy from the snapshots and the first `upto` shipments.
    fn rebuild_upto(&self, dir: &Path, upto: usize) -> (PathBuf, usize) {
        let log = dir.join("log");
        std::fs::create_dir_all(&log).unwrap();
        for (seq, bytes) in self.snapshots.lock().unwrap().iter() {
            std::fs::write(log.join(kura_sqlite::snapshot_file_name(*seq)), bytes).unwrap();
        }
        let shipments = self.shipments.lock().unwrap();
        for (segment, offset, bytes) in shipments[..upto].iter() {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(false)
                .open(log.join(kura_sqlite::segment_file_name(*segment)))
                .unwrap();
            file.write_all_at(bytes, *offset).unwrap();
        }
        let db = dir.join("db.sqlite");
        kura_sqlite::materialize(&db).unwrap().expect("the store holds a snapshot");
        (db, upto)
    }

    /// Applies the shipments from `from` on, which must continue the copy; answers where it
    /// got to.
    fn follow(&self, replica: &Replica, from: usize) -> usize {
        let (fed, continuity) = self.feed(replica, from);
        assert_eq!(continuity, Continuity::Continues);
        fed
    }

    /// Applies the shipments from `from` on, answering where it got to.
    fn feed(&self, replica: &Replica, from: usize) -> (usize, Continuity) {
        let shipments = self.shipments.lock().unwrap();
        for (segment, offset, bytes) in &shipments[from..] {
            match replica.append(*segment, *offset, bytes).unwrap() {
                Continuity::Continues => {}
                broken => return (shipments.len(), broken),
            }
        }
        (shipments.len(), Continuity::Continues)
    }
}

fn settings() -> HistorySettings {
    HistorySettings {
        checkpoint_frames: 6,
        segment_bytes: 24 * 1024,
        snapshot_log_bytes: 48 * 1024,
        ..HistorySettings::default()
    }
}

fn owner(store: &Arc<Store>) -> Context {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    let store = store.clone();
    let registry = Registry::new(RegistrySettings::default(), move |key: &str| {
        let dir = root.join(key);
        std::fs::create_dir_all(&dir).unwrap();
        Some(
            DatabaseOptions::new(dir.join("db.sqlite"))
                .create(true)
                .history(settings(), key)
                .shipper(store.clone() as Arc<dyn LogShipper>),
        )
    });
    Context { dir, registry }
}

fn select(sql: &str) -> Request {
    Request::new(vec![Statement::new(sql)])
}

const EVERYTHING: &str = "SELECT name, sql FROM sqlite_schema ORDER BY name";
const ROWS: &str = "SELECT id, length(v), hex(substr(v, 1, 8)) FROM t ORDER BY id";

async fn bookmark(cx: &Context) -> Bookmark {
    cx.registry.with_database("db", |db| db.bookmark()).await.unwrap().unwrap()
}

fn done(read: ReplicaRead) -> Executed {
    match read {
        ReplicaRead::Done(executed) => executed,
        other => panic!("a read is served by the copy: {other:?}"),
    }
}

/// What the copy and the owner read are the same, at the same bookmark.
async fn same_as_owner(replica: &Replica, cx: &Context, when: &str) {
    for sql in [EVERYTHING, ROWS] {
        let copy = done(replica.read(&select(sql), None).unwrap());
        let original = cx.ok(sql).await;
        assert_eq!(copy.results[0].rows, original[0].rows, "{when}: {sql}");
    }
    assert_eq!(replica.bookmark(), bookmark(cx).await, "{when}: the copy's bookmark is the owner's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_follows_commits_of_every_shape_and_reads_what_the_owner_reads() {
    let store = Arc::new(Store::default());
    let cx = owner(&store);
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)").await;
    cx.ok("INSERT INTO t VALUES (1, randomblob(100))").await;
    let copies = tempfile::tempdir().unwrap();
    let (db, mut fed) = store.rebuild(&copies.path().join("one"));
    let replica = Replica::open("db", &db, DatabaseOptions::new(&db)).unwrap();
    same_as_owner(&replica, &cx, "just built").await;

    // Growing by many pages at once, one commit at a time.
    for i in 2..=30 {
        cx.run_params("INSERT INTO t VALUES (?1, randomblob(?2))", vec![Value::Integer(i), Value::Integer(i * 700)])
            .await
            .unwrap();
    }
    fed = store.follow(&replica, fed);
    same_as_owner(&replica, &cx, "after growing").await;
    assert!(store.sent.lock().unwrap().len() > 2, "the copy followed the log across segments");

    // Commits the owner captures together (packed records), from concurrent writers.
    let mut writes = tokio::task::JoinSet::new();
    for i in 31..=90 {
        let registry = cx.registry.clone();
        let insert = Statement::with_params("INSERT INTO t VALUES (?1, randomblob(50))", vec![Value::Integer(i)]);
        writes.spawn(async move { registry.execute("db", Request::new(vec![insert])).await });
    }
    while let Some(written) = writes.join_next().await {
        written.unwrap().unwrap();
    }
    // Schema changes, updates and deletes.
    cx.ok("CREATE INDEX t_v ON t (v)").await;
    cx.ok("UPDATE t SET v = randomblob(10) WHERE id % 3 = 0").await;
    cx.ok("DELETE FROM t WHERE id > 20 AND id < 60").await;
    cx.ok("CREATE TABLE u (k TEXT PRIMARY KEY)").await;
    fed = store.follow(&replica, fed);
    same_as_owner(&replica, &cx, "after packed commits and schema changes").await;
    // A statement the copy keeps prepared sees a table's new shape.
    let columns = |read: ReplicaRead| done(read).results[0].columns.clone();
    assert_eq!(columns(replica.read(&select("SELECT * FROM u"), None).unwrap()), ["k"]);
    cx.ok("ALTER TABLE u ADD COLUMN extra INTEGER DEFAULT 7").await;
    cx.ok("INSERT INTO u (k) VALUES ('one')").await;
    fed = store.follow(&replica, fed);
    let reshaped = done(replica.read(&select("SELECT * FROM u"), None).unwrap());
    assert_eq!(reshaped.results[0].columns, ["k", "extra"]);
    assert_eq!(reshaped.results[0].rows, [[Value::Text("one".into()), Value::Integer(7)]]);

    // Freeing pages (D1 has no VACUUM: the file keeps its size).
    cx.ok("DROP INDEX t_v").await;
    cx.ok("DELETE FROM t WHERE id > 3").await;
    fed = store.follow(&replica, fed);
    same_as_owner(&replica, &cx, "after freeing pages").await;
    // A file that shrinks (kura's own VACUUM; D1 offers none) is cut on the copy too, and then
    // grows again.
    let vacuum = |db: &mut kura_sqlite::Database| {
        db.with_internal(|conn| {
            // VACUUM attaches the file it builds; D1's limits allow no attached database.
            let attached = rusqlite::limits::Limit::SQLITE_LIMIT_ATTACHED;
            let limit = conn.set_limit(attached, 1)?;
            let vacuumed = conn.execute_batch("VACUUM");
            conn.set_limit(attached, limit)?;
            vacuumed
        })
    };
    cx.registry.with_database("db", vacuum).await.unwrap().unwrap();
    cx.ok("INSERT INTO t VALUES (399, 'small')").await;
    fed = store.follow(&replica, fed);
    same_as_owner(&replica, &cx, "after the file shrank").await;
    cx.ok("INSERT INTO t VALUES (400, randomblob(30000))").await;
    fed = store.follow(&replica, fed);
    same_as_owner(&replica, &cx, "after the file grew again").await;
    let pragma = replica.read(&select("PRAGMA page_count"), None).unwrap();
    assert!(matches!(pragma, ReplicaRead::Declined), "a PRAGMA goes to the owner");

    // A copy built later from the same store reads the same, and so does a copy that is fed
    // each shipment twice (what a node that asks again sees).
    let (db_two, _) = store.rebuild(&copies.path().join("two"));
    let second = Replica::open("db", &db_two, DatabaseOptions::new(&db_two)).unwrap();
    same_as_owner(&second, &cx, "built from the store later").await;
    cx.ok("INSERT INTO t VALUES (500, randomblob(5000))").await;
    assert_eq!(store.feed(&second, 0).1, Continuity::Continues, "what the copy holds already is skipped");
    assert_eq!(store.feed(&replica, fed - 1).1, Continuity::Continues);
    same_as_owner(&second, &cx, "fed everything again").await;
    same_as_owner(&replica, &cx, "fed the last shipment again").await;
    // A write asked of the copy is declined: it goes to the owner.
    let write = Request::new(vec![Statement::new("INSERT INTO t VALUES (600, 'x')")]);
    assert!(matches!(replica.read(&write, None).unwrap(), ReplicaRead::Declined));
    assert_eq!(cx.scalar("SELECT count(*) FROM t WHERE id = 600").await, Value::Integer(0));

    // A restore breaks continuity: the copy is built again.
    let before = bookmark(&cx).await;
    cx.ok("INSERT INTO t VALUES (700, 'gone after the restore')").await;
    let fed = store.feed(&replica, fed).0;
    cx.registry.with_database("db", move |db| db.restore(&before)).await.unwrap().unwrap();
    let (_, continuity) = store.feed(&replica, fed);
    assert!(matches!(continuity, Continuity::Broken(ref why) if why.contains("restored")), "{continuity:?}");
    let (db_three, _) = store.rebuild(&copies.path().join("three"));
    let third = Replica::open("db", &db_three, DatabaseOptions::new(&db_three)).unwrap();
    same_as_owner(&third, &cx, "rebuilt after the restore").await;

    // Dropped, a copy takes its files with it.
    drop(replica);
    assert!(!copies.path().join("one").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_do_not_follow_the_copy_break_continuity() {
    let store = Arc::new(Store::default());
    let cx = owner(&store);
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)").await;
    let copies = tempfile::tempdir().unwrap();
    let (db, fed) = store.rebuild(&copies.path().join("copy"));
    let replica = Replica::open("db", &db, DatabaseOptions::new(&db)).unwrap();
    let position = replica.position();
    for i in 0..3 {
        cx.run_params("INSERT INTO t VALUES (?1, randomblob(100))", vec![Value::Integer(i)]).await.unwrap();
    }
    let shipments = store.shipments.lock().unwrap().clone();
    let (segment, offset, bytes) = &shipments[fed + 1];
    // The shipment before it is missing: a gap.
    let skipped = replica.append(*segment, *offset, bytes).unwrap();
    assert!(matches!(skipped, Continuity::Broken(ref why) if why.contains("gap")), "{skipped:?}");
    // Broken stays broken: the shipment that was missing applies nothing now.
    let (segment, offset, bytes) = &shipments[fed];
    assert!(matches!(replica.append(*segment, *offset, bytes).unwrap(), Continuity::Broken(_)));
    assert!(replica.broken().is_some());
    assert_eq!(replica.position(), position);
    // A damaged record is never applied (on a copy that followed until then).
    let (db, _) = store.rebuild_upto(&copies.path().join("second"), fed);
    let second = Replica::open("db", &db, DatabaseOptions::new(&db)).unwrap();
    let mut damaged = bytes.clone();
    let last = damaged.len() - 10;
    damaged[last] ^= 0xff;
    let broken = second.append(*segment, *offset, &damaged).unwrap();
    assert!(matches!(broken, Continuity::Broken(_)), "{broken:?}");
    assert_eq!(second.position(), position, "nothing was applied");
    let read = done(second.read(&select("SELECT count(*) FROM t"), None).unwrap());
    assert_eq!(read.results[0].rows[0][0], Value::Integer(0));
}

/// Reads on the copy while records are applied, as a node's async workers (with a budget) and
/// blocking threads (without) make them, each see every commit whole or not at all; a copy whose
/// node allows smaller databases than its owner's still holds everything the owner writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_beside_the_applier_see_whole_commits() {
    let store = Arc::new(Store::default());
    let cx = owner(&store);
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB); CREATE TABLE c (n INTEGER); INSERT INTO c VALUES (0)")
        .await;
    let copies = tempfile::tempdir().unwrap();
    let (db, fed) = store.rebuild(&copies.path().join("copy"));
    let mut options = DatabaseOptions::new(&db);
    options.limits.max_database_bytes = 64 * 1024;
    let replica = Arc::new(Replica::open("db", &db, options).unwrap());
    // Each commit adds a row to one table and counts it in another (different pages).
    const COMMITS: i64 = 300;
    for i in 1..=COMMITS {
        let insert = Statement::with_params("INSERT INTO t VALUES (?1, randomblob(700))", vec![Value::Integer(i)]);
        let count = Statement::new("UPDATE c SET n = n + 1");
        cx.registry.execute("db", Request::new(vec![insert, count])).await.unwrap();
    }
    let shipments = store.shipments.lock().unwrap()[fed..].to_vec();
    let feeding = Arc::clone(&replica);
    let feeder = std::thread::spawn(move || {
        for (segment, offset, bytes) in shipments {
            assert_eq!(feeding.append(segment, offset, &bytes).unwrap(), Continuity::Continues);
        }
    });
    let whole = select("SELECT (SELECT count(*) FROM t) = n, n FROM c");
    let (mut last, mut served, mut waited) = (0, 0, 0);
    loop {
        let finished = feeder.is_finished();
        for budget in [Some(std::time::Duration::from_millis(1)), None] {
            match replica.read(&whole, budget).unwrap() {
                ReplicaRead::Done(read) => {
                    let row = &read.results[0].rows[0];
                    assert_eq!(row[0], Value::Integer(1), "a read saw half a commit: {row:?}");
                    let Value::Integer(n) = row[1] else { panic!("{row:?}") };
                    assert!(n >= last, "the copy went back from {last} to {n}");
                    (last, served) = (n, served + 1);
                }
                ReplicaRead::TooLong => waited += 1,
                ReplicaRead::Declined => panic!("a plain SELECT is served by the copy"),
            }
        }
        if finished {
            break;
        }
    }
    feeder.join().unwrap();
    assert_eq!(last, COMMITS, "the copy applied every commit ({served} reads served, {waited} sent off the worker)");
    assert!(
        std::fs::metadata(&db).unwrap().len()
            + std::fs::metadata(db.with_extension("sqlite-wal")).map_or(0, |m| m.len())
            > 64 * 1024
    );
}
