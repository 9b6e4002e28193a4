//! The scale-out substrate against real components: a three-member etcd, a three-node Garage
//! and moto's S3 server, all on loopback; and R2 buckets moving between nodes over an
//! in-memory store.

mod buckets;
mod contract;
mod etcd;
mod replica;
mod store;
