//! Storage and the object-store coordinator on the wire: moto's S3 server (which honours
//! conditional writes), `object_store`'s in-memory store, and a three-node Garage (which does
//! not, and is refused).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kura_cluster::{
    ProbeOutcome, PutMode, RemoteStorage, SharedStorage, Storage, StorageError, StoreCoordinator,
    probe_conditional_writes,
};

use crate::contract;
use kura_testkit::bed::{Garage, Moto};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moto_passes_the_probe_and_coordinates() {
    let moto = Moto::start();
    let storage: SharedStorage = Arc::new(moto.storage("cluster-a"));
    assert_eq!(probe_conditional_writes(&*storage).await.unwrap(), ProbeOutcome::Honoured);
    let ttl = Duration::from_secs(2);
    let (a, b) = (StoreCoordinator::new(storage.clone(), ttl), StoreCoordinator::new(storage.clone(), ttl));
    contract::one_owner_at_a_time(&a, &b, "d1/contract").await;
    let took = contract::takeover_after_expiry(
        Box::new(StoreCoordinator::new(storage.clone(), ttl)),
        &StoreCoordinator::new(storage, ttl),
        "d1/expiry",
        ttl,
    )
    .await;
    eprintln!("object-store takeover after the owner stopped renewing: {took:?} (TTL {ttl:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_memory_store_coordinates() {
    let storage: SharedStorage =
        Arc::new(RemoteStorage::new(Arc::new(object_store::memory::InMemory::new()), "c", "memory".into()));
    let ttl = Duration::from_secs(2);
    let (a, b) = (StoreCoordinator::new(storage.clone(), ttl), StoreCoordinator::new(storage, ttl));
    contract::one_owner_at_a_time(&a, &b, "r2/bucket-meta").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garage_stores_bytes_on_a_quorum_but_is_refused_as_a_coordinator() {
    let mut garage = Garage::start();
    let nodes: Vec<RemoteStorage> = (0..3).map(|i| garage.storage(i, "cluster-g")).collect();

    let outcome = probe_conditional_writes(&nodes[0]).await.unwrap();
    assert!(matches!(outcome, ProbeOutcome::Ignored { .. }), "Garage 2.5.0 ignores If-None-Match: {outcome:?}");
    let refusal = outcome.refusal(&nodes[0]).unwrap();
    assert!(refusal.contains("ignores conditional writes") && refusal.contains("etcd"), "{refusal}");

    let body = Bytes::from((0..300_000u32).flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>());
    nodes[0].put("h/db/1/0001-a", body.clone(), PutMode::New).await.unwrap();
    for node in &nodes {
        assert_eq!(node.get("h/db/1/0001-a").await.unwrap().0, body, "read-after-write on every node");
    }
    assert_eq!(&nodes[2].get_range("h/db/1/0001-a", 4..8).await.unwrap()[..], &1u32.to_le_bytes());

    // One node of three stopped: writes and reads still reach a quorum.
    garage.stop(2);
    nodes[1].put("h/db/1/0002-b", Bytes::from_static(b"after a node stopped"), PutMode::New).await.unwrap();
    assert_eq!(&nodes[0].get("h/db/1/0002-b").await.unwrap().0[..], b"after a node stopped");
    let names: Vec<_> = nodes[0].list("h/db/").await.unwrap().into_iter().map(|i| i.name).collect();
    assert_eq!(names, ["h/db/1/0001-a", "h/db/1/0002-b"]);
    nodes[0].delete("h/db/1/0001-a").await.unwrap();
    assert!(matches!(nodes[1].get("h/db/1/0001-a").await, Err(StorageError::NotFound { .. })));
}
