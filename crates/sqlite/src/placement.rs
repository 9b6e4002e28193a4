//! Where a SQLite file is served when several nodes share the data: the seam between an engine
//! (D1's databases, R2's bucket metadata) and the cluster layer that implements it. One node
//! owns each file, with its copy rebuilt from the shared store, and every commit to it passes
//! that ownership's [`LogShipper`] before it is acknowledged.

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use crate::history::LogShipper;

/// Why a file cannot be served on this node of a cluster (reads after "the database is", "the
/// bucket is").
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PlacementError {
    /// Another node owns it: send the request to `url` (its API).
    #[error("served by node {node}")]
    Elsewhere {
        /// The owner.
        node: String,
        /// Its API's URL.
        url: String,
        /// Its S3 listener's URL.
        s3: String,
    },
    /// No node can serve it right now (the coordinator or the store failed, or the last
    /// owner's lease has not ended yet); worth retrying shortly.
    #[error("unavailable for now: {0}")]
    Unavailable(String),
}

/// A future that closes whatever holds a file open.
pub type ReleaseFile = Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;

/// One kind of file's placement in a cluster (kura-cluster implements it), keyed by the id the
/// engine names the file by (a database's UUID, a bucket's storage id).
#[async_trait::async_trait]
pub trait Placement: Send + Sync + std::fmt::Debug {
    /// Whether this node owns the file now, with its copy current.
    fn is_current(&self, key: &str) -> bool;
    /// Makes this node the file's owner, its copy at `path` rebuilt from the store (a new file:
    /// nothing to rebuild), or says which node owns it. `release_file` closes whatever holds
    /// the file open; it is awaited before any rebuild, once nothing can open the file again
    /// until the claim is settled.
    async fn claim(&self, key: &str, path: &Path, release_file: ReleaseFile) -> Result<(), PlacementError> {
        self.claim_at(key, path, &crate::history::log_dir(path), release_file).await
    }
    /// [`Placement::claim`] for a file whose history log is kept in `log` rather than beside it
    /// (a followed file, whose writer chose where the file lives).
    async fn claim_at(
        &self,
        key: &str,
        path: &Path,
        log: &Path,
        release_file: ReleaseFile,
    ) -> Result<(), PlacementError>;
    /// What this node's commits to the file must pass: the shipper of its ownership (`None`
    /// when this node does not own it).
    fn shipper(&self, key: &str) -> Option<Arc<dyn LogShipper>>;
    /// Gives the file up for good (it was deleted): its history in the store goes too.
    async fn release(&self, key: &str);
    /// Forgets where the file was last found served (its owner did not answer as one).
    fn forget_owner(&self, _key: &str) {}
    /// Where the file was found served a moment ago, if by another node: what
    /// [`Placement::claim`] would answer, without a claim's work (a read sent on, or served by
    /// a copy, pays for none of it).
    fn known_elsewhere(&self, _key: &str) -> Option<PlacementError> {
        None
    }
    /// Gives up, without deleting anything, every file this node owns whose key starts with
    /// `prefix` (their group moved to another node, which claims them as it reaches them).
    async fn give_up_under(&self, _prefix: &str) {}
    /// Whether the file has a history in the store (it was ever written by an owner).
    async fn has_history(&self, _key: &str) -> bool {
        false
    }
    /// Whether this node is where the file should go when no node serves it and no request
    /// asks for it (work that runs on its own, such as alarms, is adopted by its home node).
    async fn is_home(&self, _key: &str) -> bool {
        true
    }
}

/// One copy a node keeps of a file another node owns, for `kura node status` and the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaFigures {
    /// The file's key (a database's UUID).
    pub key: String,
    /// The history position the copy is at.
    pub position: u64,
    /// How long since the copy was last found holding everything its owner had shipped
    /// (`None`: not yet built).
    pub behind: Option<std::time::Duration>,
}

/// Read replicas of files other nodes own (kura-cluster implements it): copies built from the
/// store and kept current from what their owners ship, so reads that accept a copy's state (D1's
/// Sessions) are served on the node they reach.
#[async_trait::async_trait]
pub trait ReadReplicas: Send + Sync + std::fmt::Debug {
    /// A copy of the file `key` at history position `at_least` or later, caught up first if it
    /// is behind; its readers are opened with the options `options` makes, which is asked only
    /// when a copy is built or caught up (not on a read the copy serves as it is). `None` when
    /// there is none to be had now (it is being built, the store cannot be reached, or it is
    /// still behind): the caller sends the read to the owner.
    async fn replica(
        &self,
        key: &str,
        at_least: u64,
        options: &(dyn Fn() -> crate::DatabaseOptions + Sync),
    ) -> Option<Arc<crate::Replica>>;
    /// Drops the copy of `key`, if there is one (replication was turned off, or the file
    /// deleted).
    fn discard(&self, key: &str);
    /// The copies kept now.
    fn figures(&self) -> Vec<ReplicaFigures>;
}
