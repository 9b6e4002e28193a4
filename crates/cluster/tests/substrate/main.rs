//! The scale-out substrate against real components: a three-member etcd, a three-node Garage
//! and moto's S3 server, all on loopback.

mod contract;
mod etcd;
mod replica;
mod store;
