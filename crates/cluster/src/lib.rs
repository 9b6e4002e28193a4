//! kura's scale-out substrate: what several nodes share and how they agree on who owns what.
//!
//! - [`storage`] — the [`Storage`] trait every shared byte goes through, over a local directory
//!   ([`LocalStorage`]) or an S3-compatible object store ([`RemoteStorage`], the `object_store`
//!   crate: Garage, S3, R2, MinIO, Ceph).
//! - [`probe`] — whether a store's conditional writes can be trusted ([`probe_conditional_writes`]).
//! - [`blobs`] — R2's bodies in the store ([`StoreBlobs`]).
//! - [`placement`] — which node serves each D1 database, R2 bucket and Durable Object namespace
//!   and object ([`ClusterPlacement`]).
//! - [`replica`] — a database whose history is shipped to the store before each commit is
//!   acknowledged ([`HistoryShipper`]), and rebuilt from it by the node that takes it over ([`rebuild`]).
//! - [`read_replicas`] — copies of databases other nodes own, kept current from what they ship,
//!   for reads that accept a copy's state ([`ClusterReplicas`]).
//! - [`coordinator`] — one fenced owner per resource: [`EtcdCoordinator`] or, for stores that
//!   pass the probe, [`StoreCoordinator`].
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use kura_cluster::{Acquired, Coordinator, EtcdClient, EtcdCoordinator, Member};
//!
//! let etcd = EtcdCoordinator::new(EtcdClient::new(vec!["http://127.0.0.1:2379".into()]), "/kura/c1", Duration::from_secs(5));
//! etcd.join(Member { node: "a".into(), incarnation: "1".into(), api: "http://a:8080".into(), s3: "http://a:9000".into() }).await?;
//! if let Acquired::Owned(lease) = etcd.acquire("d1/0c2f").await? {
//!     etcd.publish(&lease, "segment 1".into()).await?;
//! }
//! # Ok(()) }
//! ```

pub mod blobs;
pub mod catalog;
pub mod coordinator;
pub mod placement;
pub mod probe;
pub mod read_replicas;
pub mod replica;
pub mod storage;

pub use blobs::StoreBlobs;
pub use coordinator::{
    Acquired, Coordinator, CoordinatorError, EtcdClient, EtcdCoordinator, Lease, Member, Owner, Published,
    StoreCoordinator,
};
pub use placement::{ClusterPlacement, Durability, Kind};
pub use probe::{ProbeOutcome, probe_conditional_writes};
pub use read_replicas::ClusterReplicas;
pub use replica::{HistoryShipper, ReplicaError, Shipped, rebuild, sweep};
pub use storage::{
    ByteStream, LocalStorage, ObjectInfo, ObjectWriter, PutMode, RemoteStorage, S3Config, SharedStorage, Storage,
    StorageError, Version,
};

/// Runs `future` to completion from synchronous code: on a runtime worker, in place (the
/// runtime must have several workers); on any other thread, directly.
pub(crate) fn wait<F: std::future::Future>(runtime: &tokio::runtime::Handle, future: F) -> F::Output {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => tokio::task::block_in_place(|| runtime.block_on(future)),
        Err(_) => runtime.block_on(future),
    }
}
