//! A D1-style database shipped to a three-node Garage under etcd ownership: every acknowledged
//! commit is in the store before its answer, a replaced owner's commit fails and never becomes
//! visible, and the node that takes over rebuilds the database exactly, bookmarks included.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kura_cluster::{Coordinator, EtcdClient, EtcdCoordinator, HistoryShipper, Lease, SharedStorage, rebuild, sweep};
use kura_sqlite::{Bookmark, DatabaseOptions, HistorySettings, Registry, RegistrySettings, Request, Statement, Value};

use crate::contract::{member, owned};
use kura_testkit::bed::{Etcd, Garage};

const RESOURCE: &str = "d1/orders";

struct Node {
    registry: Registry,
    shipper: Arc<HistoryShipper>,
    lease: Lease,
    storage: SharedStorage,
    coordinator: Arc<dyn Coordinator>,
    _dir: tempfile::TempDir,
}

fn settings() -> HistorySettings {
    HistorySettings {
        checkpoint_frames: 20,
        segment_bytes: 16 * 1024,
        snapshot_log_bytes: 64 * 1024,
        ..HistorySettings::default()
    }
}

/// Takes the database over on a node: acquire, rebuild from the store, open with a shipper.
async fn take_over(coordinator: Arc<EtcdCoordinator>, storage: SharedStorage) -> Node {
    let lease = owned(&*coordinator, RESOURCE).await;
    let dir = tempfile::tempdir().unwrap();
    let db: PathBuf = dir.path().join("orders/db.sqlite");
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    let shipped = rebuild(&storage, &*coordinator, RESOURCE, &db).await.unwrap();
    let shipper = Arc::new(HistoryShipper::new(storage.clone(), coordinator.clone(), lease.clone(), shipped));
    let for_opener = shipper.clone();
    let registry = Registry::new(RegistrySettings::default(), move |_| {
        Some(DatabaseOptions::new(&db).create(true).history(settings(), RESOURCE).shipper(for_opener.clone()))
    });
    Node { registry, shipper, lease, storage, coordinator, _dir: dir }
}

async fn run(node: &Node, sql: &str, params: Vec<Value>) -> Result<(), kura_sqlite::Error> {
    node.registry.execute("db", Request::new(vec![Statement::with_params(sql, params)])).await.map(drop)
}

async fn ids(node: &Node) -> Vec<i64> {
    let results = node
        .registry
        .execute("db", Request::new(vec![Statement::new("SELECT id FROM orders ORDER BY id")]))
        .await
        .unwrap();
    results[0].rows.iter().map(|r| if let Value::Integer(i) = r[0] { i } else { -1 }).collect()
}

async fn bookmark(node: &Node) -> Bookmark {
    node.registry.with_database("db", |db| db.bookmark()).await.unwrap().unwrap()
}

async fn restore(node: &Node, to: Bookmark) {
    node.registry.with_database("db", move |db| db.restore(&to)).await.unwrap().unwrap();
}

async fn insert_concurrently(node: &Node, ids: std::ops::RangeInclusive<i64>) {
    let inserts = ids.map(|id| {
        run(
            node,
            "INSERT INTO orders VALUES (?1, ?2)",
            vec![Value::Integer(id), Value::Text(format!("order {id} ").repeat(20))],
        )
    });
    for outcome in futures_util::future::join_all(inserts).await {
        outcome.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_fails_over_with_every_acknowledged_commit_and_no_fenced_one() {
    let (etcd, garage) = (Etcd::start(), Garage::start());
    let ttl = Duration::from_secs(10);
    let coordinator = |first: usize| {
        let mut endpoints = etcd.endpoints.clone();
        endpoints.rotate_left(first);
        Arc::new(EtcdCoordinator::new(EtcdClient::new(endpoints), "/kura/replica", ttl))
    };
    let (on_a, on_b) = (coordinator(0), coordinator(1));
    on_a.join(member("a")).await.unwrap();
    on_b.join(member("b")).await.unwrap();
    let a = take_over(on_a.clone(), Arc::new(garage.storage(0, "cluster"))).await;

    run(&a, "CREATE TABLE orders (id INTEGER PRIMARY KEY, note TEXT)", vec![]).await.unwrap();
    insert_concurrently(&a, 1..=60).await;
    let middle = bookmark(&a).await;
    insert_concurrently(&a, 61..=100).await;
    restore(&a, middle).await;
    insert_concurrently(&a, 101..=120).await;
    let last = bookmark(&a).await;
    let acknowledged = ids(&a).await;
    assert_eq!(acknowledged, (1..=60).chain(101..=120).collect::<Vec<_>>());
    let (puts, shipments) = a.shipper.counts();
    eprintln!("121 commits and a restore shipped in {shipments} manifest entries and {puts} objects");
    assert!(shipments <= 123, "at most one shipment per group commit");

    // a is paused past its lease: etcd ends its session, b takes over and rebuilds.
    EtcdClient::new(etcd.endpoints.clone()).revoke(on_a.session_lease().await.unwrap()).await.unwrap();
    let b = take_over(on_b.clone(), Arc::new(garage.storage(1, "cluster"))).await;
    assert_eq!(ids(&b).await, acknowledged, "every acknowledged commit, from the store alone");
    assert_eq!(bookmark(&b).await, last);

    // a wakes up and writes: the commit is refused, and never visible. (Larger than what ships
    // inside a manifest entry, so its records were uploaded as an object first.)
    let note = Value::Text("from the replaced owner ".repeat(16_000));
    let late = run(&a, "INSERT INTO orders VALUES (999, ?1)", vec![note]).await;
    assert!(late.is_err(), "a fenced owner acknowledges nothing");
    let objects = b.storage.list("history/").await.unwrap().len();
    let swept = sweep(&b.storage, &*b.coordinator, &b.lease).await.unwrap();
    assert!(swept >= 1, "the replaced owner's late upload is an orphan the sweep removes");
    assert_eq!(b.storage.list("history/").await.unwrap().len(), objects - swept);
    assert_eq!(sweep(&b.storage, &*b.coordinator, &b.lease).await.unwrap(), 0);

    insert_concurrently(&b, 121..=130).await;
    restore(&b, middle).await;
    assert_eq!(ids(&b).await, (1..=60).collect::<Vec<_>>(), "a bookmark from the old owner restores on the new one");
    restore(&b, last).await;
    insert_concurrently(&b, 131..=131).await;
    let after = ids(&b).await;
    assert!(!after.contains(&999));
    assert_eq!(after, acknowledged.iter().copied().chain([131]).collect::<Vec<_>>());

    // A third rebuild, on another Garage node, sees b's commits too (and still not a's late one).
    drop(b);
    let on_c = coordinator(2);
    on_c.join(member("c")).await.unwrap();
    on_b.leave().await.unwrap();
    let c = take_over(on_c, Arc::new(garage.storage(2, "cluster"))).await;
    assert_eq!(ids(&c).await, after);
    restore(&c, middle).await;
    assert_eq!(ids(&c).await, (1..=60).collect::<Vec<_>>());
}

/// Small commits ship inside their manifest entries (no object each), and past a threshold are
/// compacted into objects and a base entry that drops the entries before it: the manifest stays
/// short, and a rebuild from it is exact, bookmarks included.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inline_shipments_compact_into_a_base_and_rebuild_exactly() {
    use kura_cluster::{Acquired, RemoteStorage, StoreCoordinator};
    let storage: SharedStorage =
        Arc::new(RemoteStorage::new(Arc::new(object_store::memory::InMemory::new()), "c", "memory".into()));
    let coordinator: Arc<dyn Coordinator> = Arc::new(StoreCoordinator::new(storage.clone(), Duration::from_secs(30)));
    coordinator.join(member("a")).await.unwrap();
    let lease = owned(&*coordinator, RESOURCE).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("orders/db.sqlite");
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    let shipped = rebuild(&storage, &*coordinator, RESOURCE, &db).await.unwrap();
    // Each of these commits, packed, ships a few hundred bytes: compacting every 16 KiB does it
    // several times over the run.
    let shipper = Arc::new(
        HistoryShipper::new(storage.clone(), coordinator.clone(), lease.clone(), shipped).compact_after(16 * 1024),
    );
    let for_opener = shipper.clone();
    let path = db.clone();
    let registry = Registry::new(RegistrySettings::default(), move |_| {
        Some(DatabaseOptions::new(&path).create(true).history(settings(), RESOURCE).shipper(for_opener.clone()))
    });
    let node = Node { registry, shipper, lease, storage: storage.clone(), coordinator: coordinator.clone(), _dir: dir };

    run(&node, "CREATE TABLE orders (id INTEGER PRIMARY KEY, note TEXT)", vec![]).await.unwrap();
    for id in 1..=150 {
        // One at a time: each commit is its own small shipment.
        insert_concurrently(&node, id..=id).await;
    }
    let middle = bookmark(&node).await;
    insert_concurrently(&node, 151..=200).await;
    let (puts, shipments) = node.shipper.counts();
    let manifest = coordinator.manifest(RESOURCE, 0).await.unwrap();
    eprintln!("201 commits: {shipments} manifest entries published, {} kept, {puts} objects", manifest.len());
    // Objects are the snapshots (this log takes many) and one per segment and compaction.
    assert!(puts < 100, "small commits ship inline, not as an object each ({puts} objects)");
    assert!(manifest.len() < 60, "compaction dropped the entries before its base ({} entries)", manifest.len());
    let acknowledged = ids(&node).await;
    let last = bookmark(&node).await;

    // Another node takes over (the first gave it up) and rebuilds from the base and what follows.
    coordinator.release(&node.lease).await.unwrap();
    drop(node);
    let other: Arc<dyn Coordinator> = Arc::new(StoreCoordinator::new(storage.clone(), Duration::from_secs(30)));
    other.join(member("b")).await.unwrap();
    let Acquired::Owned(lease) = other.acquire(RESOURCE).await.unwrap() else { panic!("a released resource is free") };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("orders/db.sqlite");
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    let shipped = rebuild(&storage, &*other, RESOURCE, &db).await.unwrap();
    let shipper = Arc::new(HistoryShipper::new(storage.clone(), other.clone(), lease.clone(), shipped));
    let for_opener = shipper.clone();
    let path = db.clone();
    let registry = Registry::new(RegistrySettings::default(), move |_| {
        Some(DatabaseOptions::new(&path).create(true).history(settings(), RESOURCE).shipper(for_opener.clone()))
    });
    let b = Node { registry, shipper, lease, storage, coordinator: other, _dir: dir };
    assert_eq!(ids(&b).await, acknowledged, "every commit, from the base and the entries after it");
    assert_eq!(bookmark(&b).await, last);
    insert_concurrently(&b, 201..=210).await;
    restore(&b, middle).await;
    assert_eq!(ids(&b).await, (1..=150).collect::<Vec<_>>(), "a bookmark from before the compaction restores");
}
