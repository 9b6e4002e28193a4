//! Client compatibility: the real `kura` binary as a server, driven by real wrangler 4.85.0,
//! by real workerd through its own D1 binding, by the AWS CLI and boto3 over S3, and by the
//! `kura` CLI itself, locally and remotely.
//!
//! wrangler (and the workerd it depends on), the AWS CLI and boto3 are installed by the README's
//! test command (`scripts/test`) when missing; these tests fail, rather than skip, without them.

mod api_fuzz;
mod authorization;
mod cluster;
mod cluster_do;
mod cluster_objects;
mod cluster_r2;
mod cluster_replicas;
mod cluster_workers;
mod common;
mod console;
mod crash;
mod crash_random;
mod disk_full;
mod docs;
mod fidelity;
mod hostile_clients;
mod kura_cli;
mod kv;
mod metrics;
mod node_bindings;
mod queues;
mod s3_clients;
mod s3_fuzz;
mod workerd;
mod workers;
mod workers_fuzz;
mod wrangler;
mod writers;
