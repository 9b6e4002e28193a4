//! The hook through which several nodes share one catalog: each keeps a copy, writes happen on
//! one node at a time, and every write is published as a whole new copy before it is answered.

use std::path::PathBuf;
use std::time::Duration;

/// An error from outside the catalog (the coordinator's, the store's), kept whole.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a shared catalog could not be written or brought up to date; nothing changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicationError {
    /// Another node has held the catalog for as long as a write waits.
    #[error("node {node} has held the catalog for {waited:?}")]
    Held {
        /// The node holding it.
        node: String,
        /// How long this write waited.
        waited: Duration,
    },
    /// The coordinator failed or refused (a fenced or lost ownership, an unreachable etcd).
    #[error("{0}")]
    Coordinator(#[source] BoxError),
    /// The shared store failed.
    #[error("{0}")]
    Store(#[source] BoxError),
    /// A local copy of the catalog could not be written, read or installed.
    #[error("{doing}{}: {source}", path.display())]
    File {
        /// What was being done (`""`, or `"installing "`).
        doing: &'static str,
        /// The file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// What the manifest or the store holds is not a catalog copy this node can use.
    #[error("{0}")]
    Unusable(String),
    /// The catalog changed faster than this node could fetch it.
    #[error("the catalog changed too fast to fetch")]
    TooFast,
    /// A copy was published with no write in progress.
    #[error("no catalog write in progress")]
    NotWriting,
    /// The write was published, committing it here failed, and so did installing the
    /// published copy in its place.
    #[error("committing failed ({commit}) and installing the published copy failed: {install}")]
    Unsettled {
        /// Why committing failed.
        commit: rusqlite::Error,
        /// Why installing the published copy failed.
        install: Box<crate::Error>,
    },
}

/// How a node's copy of a shared catalog stays the cluster's (implemented by kura-cluster over
/// its coordinator and object store).
///
/// The catalog calls these with its writer locked, so a node runs one of them at a time. Each
/// may block (they reach the network).
pub trait Replication: Send + Sync + std::fmt::Debug {
    /// Makes this node the catalog's only writer in the cluster until [`Replication::end_write`],
    /// and returns the newest published copy if this node's file is behind it (to install
    /// before writing).
    fn begin_write(&self) -> Result<Option<PathBuf>, ReplicationError>;
    /// Publishes `copy`, a consistent copy of the catalog with the write just committed; the
    /// write is acknowledged only if this succeeds.
    fn publish(&self, copy: &std::path::Path) -> Result<(), ReplicationError>;
    /// Ends the exclusive write.
    fn end_write(&self);
    /// The newest published copy if this node's file is behind it.
    fn newer(&self) -> Result<Option<PathBuf>, ReplicationError>;
    /// Runs `f`, which may wait for the catalog's lock while another thread holds it across
    /// the network, without holding up the caller's async runtime.
    fn wait(&self, f: &mut dyn FnMut()) {
        f()
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::{Replication, ReplicationError};
    use crate::{Catalog, Error};

    /// Published copies in a directory: the newest is what other nodes would bring in.
    #[derive(Debug)]
    struct Shelf {
        dir: PathBuf,
        published: Mutex<Vec<PathBuf>>,
        applied: Mutex<usize>,
        refuse: AtomicBool,
    }

    impl Shelf {
        fn copy_of_newest(&self, after: usize) -> Option<PathBuf> {
            let published = self.published.lock().unwrap();
            if published.len() <= after {
                return None;
            }
            let incoming = self.dir.join("incoming");
            std::fs::copy(published.last().unwrap(), &incoming).unwrap();
            *self.applied.lock().unwrap() = published.len();
            Some(incoming)
        }
    }

    impl Replication for std::sync::Arc<Shelf> {
        fn begin_write(&self) -> Result<Option<PathBuf>, ReplicationError> {
            let applied = *self.applied.lock().unwrap();
            Ok(self.copy_of_newest(applied))
        }
        fn publish(&self, copy: &Path) -> Result<(), ReplicationError> {
            if self.refuse.load(Ordering::SeqCst) {
                return Err(ReplicationError::Store("the store is away".into()));
            }
            let mut published = self.published.lock().unwrap();
            let kept = self.dir.join(format!("copy-{}", published.len()));
            std::fs::copy(copy, &kept).unwrap();
            published.push(kept);
            *self.applied.lock().unwrap() = published.len();
            Ok(())
        }
        fn end_write(&self) {}
        fn newer(&self) -> Result<Option<PathBuf>, ReplicationError> {
            let applied = *self.applied.lock().unwrap();
            Ok(self.copy_of_newest(applied))
        }
    }

    #[test]
    fn a_write_is_read_only_once_published_and_a_refused_one_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let shelf = std::sync::Arc::new(Shelf {
            dir: dir.path().to_owned(),
            published: Mutex::default(),
            applied: Mutex::new(0),
            refuse: AtomicBool::new(false),
        });
        let a = Catalog::open_replicated(dir.path().join("a.sqlite"), std::sync::Arc::new(shelf.clone())).unwrap();
        let account = a.create_account(Some("acct"), "one").unwrap();
        assert_eq!(shelf.published.lock().unwrap().len(), 1);

        shelf.refuse.store(true, Ordering::SeqCst);
        let refused = a.create_token(&account.id, "t", crate::Scope::Admin, Some("secret-0123456789abcdef"));
        assert!(matches!(refused, Err(Error::Replication(_))), "{refused:?}");
        assert!(a.authenticate("secret-0123456789abcdef").unwrap().is_none(), "a refused write left nothing");
        shelf.refuse.store(false, Ordering::SeqCst);

        // A second node, on its own file, brings the first node's write in on a miss.
        let b_shelf = std::sync::Arc::new(Shelf {
            dir: dir.path().to_owned(),
            published: Mutex::new(shelf.published.lock().unwrap().clone()),
            applied: Mutex::new(0),
            refuse: AtomicBool::new(false),
        });
        let b = Catalog::open_replicated(dir.path().join("b.sqlite"), std::sync::Arc::new(b_shelf)).unwrap();
        assert_eq!(b.account("acct").unwrap().map(|a| a.name), Some("one".to_owned()));
        assert!(b.installs() >= 1);
    }
}
