//! R2 on two nodes sharing one object store (object_store's in-memory store, coordinated by its
//! own conditional writes): bodies live in the store, each bucket's metadata has one owner and
//! ships every commit, and the node that takes a bucket over serves every acknowledged object
//! byte for byte.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::TryStreamExt;
use kura_cluster::{
    ClusterPlacement, Coordinator, Durability, Kind, RemoteStorage, SharedStorage, StoreBlobs, StoreCoordinator,
};
use kura_r2::{GetOptions, PutOptions, R2, R2Error, R2Settings, Shared};
use kura_sqlite::PlacementError;

use crate::contract::member;

const BUCKET: &str = "0123456789abcdef0123456789abcdef";
const MIB: usize = 1024 * 1024;

struct Node {
    r2: Arc<R2>,
    placement: Arc<ClusterPlacement>,
    _dir: tempfile::TempDir,
}

async fn node(name: &str, storage: &SharedStorage) -> Node {
    let coordinator: Arc<dyn Coordinator> = Arc::new(StoreCoordinator::new(storage.clone(), Duration::from_secs(3)));
    let member = member(name);
    coordinator.join(member.clone()).await.unwrap();
    let placement =
        Arc::new(ClusterPlacement::new(Kind::R2, storage.clone(), coordinator, member, Durability::Shipped));
    let dir = tempfile::tempdir().unwrap();
    let settings = R2Settings {
        min_part_size: MIB as u64,
        shared: Some(Shared { placement: placement.clone(), blobs: StoreBlobs::new(storage.clone()) }),
        ..R2Settings::default()
    };
    let r2 = Arc::new(R2::open(dir.path().join("r2"), settings).unwrap());
    Node { r2, placement, _dir: dir }
}

fn pattern(len: usize, seed: u8) -> Bytes {
    Bytes::from((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect::<Vec<u8>>())
}

fn body(bytes: Bytes) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    futures_util::stream::iter(bytes.chunks(300 * 1024).map(Bytes::copy_from_slice).map(Ok).collect::<Vec<_>>())
}

async fn read(r2: &R2, key: &str, options: GetOptions) -> Vec<u8> {
    let object = r2.get_object(BUCKET, key, options).await.unwrap();
    let chunks: Vec<Bytes> = object.body.try_collect().await.unwrap();
    chunks.concat()
}

async fn put(r2: &R2, key: &str, bytes: Bytes) -> String {
    let options = PutOptions {
        custom: BTreeMap::from([("owner".into(), "a".into())]),
        size: Some(bytes.len() as u64),
        ..Default::default()
    };
    r2.put_object(BUCKET, key, body(bytes), options).await.unwrap().etag
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bucket_moves_to_another_node_with_every_object_and_its_blobs_in_the_store() {
    let storage: SharedStorage =
        Arc::new(RemoteStorage::new(Arc::new(object_store::memory::InMemory::new()), "c", "memory".into()));
    let (a, b) = (node("a", &storage).await, node("b", &storage).await);

    a.r2.create_bucket(BUCKET).await.unwrap();
    let small = pattern(1000, 1);
    let large = pattern(20 * MIB + 7, 2);
    put(&a.r2, "small", small.clone()).await;
    let large_etag = put(&a.r2, "dir/large", large.clone()).await;
    let upload =
        a.r2.create_multipart_upload(BUCKET, "multi", Default::default(), BTreeMap::new(), None, None).await.unwrap();
    let parts = [pattern(MIB, 3), pattern(MIB, 4), pattern(1234, 5)];
    let mut named = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let number = i as u32 + 1;
        let options = kura_r2::PartOptions { size: Some(part.len() as u64), ..Default::default() };
        let info = a.r2.upload_part(BUCKET, "multi", &upload, number, body(part.clone()), options).await.unwrap();
        named.push((number, info.etag));
    }
    let multi = a.r2.complete_multipart_upload(BUCKET, "multi", &upload, named, Default::default()).await.unwrap();
    put(&a.r2, "overwritten", pattern(2 * MIB, 6)).await;
    put(&a.r2, "overwritten", pattern(3 * MIB, 7)).await;
    a.r2.delete_object(BUCKET, "small").await.unwrap();
    put(&a.r2, "small", small.clone()).await;
    let blobs = || async { storage.list(&format!("blobs/{BUCKET}/")).await.unwrap().len() };
    // dir/large, the three parts, the second `overwritten` (the first went with its row).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(blobs().await, 5, "bodies past the inline size live in the store, replaced ones are removed");

    // b cannot serve the bucket while a owns it.
    assert!(matches!(b.r2.claim(BUCKET).await, Err(PlacementError::Elsewhere { ref node, .. }) if node == "a"));

    // a drains: b takes the bucket over and serves every object from the store.
    a.placement.drain().await;
    b.r2.forget_owner(BUCKET);
    b.r2.claim(BUCKET).await.unwrap();
    assert_eq!(read(&b.r2, "small", GetOptions::default()).await, small);
    assert_eq!(read(&b.r2, "dir/large", GetOptions::default()).await, large);
    let head = b.r2.head_object(BUCKET, "dir/large").await.unwrap().unwrap();
    assert_eq!((head.etag, head.custom.get("owner").cloned()), (large_etag, Some("a".into())));
    let ranged = GetOptions {
        range: Some(kura_r2::ByteRange::From { start: 5 * MIB as u64, end: Some(6 * MIB as u64) }),
        ..Default::default()
    };
    assert_eq!(read(&b.r2, "dir/large", ranged).await, large[5 * MIB..=6 * MIB].to_vec());
    assert_eq!(b.r2.head_object(BUCKET, "multi").await.unwrap().unwrap().etag, multi.etag);
    assert_eq!(read(&b.r2, "multi", GetOptions::default()).await, parts.concat());
    let second = GetOptions { part_number: Some(2), ..Default::default() };
    assert_eq!(read(&b.r2, "multi", second).await, parts[1].to_vec());
    let listed = b.r2.list(BUCKET, kura_r2::ListOptions { limit: 100, ..Default::default() }).await.unwrap();
    let keys: Vec<_> = listed.objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys, ["dir/large", "multi", "overwritten", "small"]);

    // a no longer writes to it: refused before anything is stored.
    let late = a.r2.put_object(BUCKET, "late", body(pattern(100, 8)), PutOptions::default()).await;
    assert!(matches!(late, Err(R2Error::Unavailable(_))), "{late:?}");

    // A replaced owner's late upload (a blob no row names) is swept by the owner.
    storage
        .put(&format!("blobs/{BUCKET}/{}", "f".repeat(32)), Bytes::from_static(b"late"), kura_cluster::PutMode::New)
        .await
        .unwrap();
    put(&b.r2, "from-b", pattern(MIB, 9)).await;
    let report = b.r2.sweep(BUCKET).await.unwrap();
    assert_eq!(report.orphans, 1, "only the orphan goes");
    assert_eq!(read(&b.r2, "from-b", GetOptions::default()).await, pattern(MIB, 9).to_vec());

    // Deleting the bucket's objects and then the bucket leaves nothing of it in the store.
    let keys = ["dir/large", "multi", "overwritten", "small", "from-b"].map(str::to_owned).to_vec();
    b.r2.delete_objects(BUCKET, keys).await.unwrap();
    b.r2.delete_bucket(BUCKET).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(blobs().await, 0);
    assert!(storage.list(&format!("history/r2/{BUCKET}/")).await.unwrap().is_empty(), "its history goes too");
}
