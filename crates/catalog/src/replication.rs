//! The hook through which several nodes share one catalog: each keeps a copy, writes happen on
//! one node at a time, and every write is published as a whole new copy before it is answered.

use std::path::PathBuf;

/// How a node's copy of a shared catalog stays the cluster's (implemented by kura-cluster over
/// its coordinator and object store).
///
/// The catalog calls these with its writer locked, so a node runs one of them at a time. Each
/// may block (they reach the network); errors are the reason, to show the caller.
pub trait Replication: Send + Sync + std::fmt::Debug {
    /// Makes this node the catalog's only writer in the cluster until [`Replication::end_write`],
    /// and returns the newest published copy if this node's file is behind it (to install
    /// before writing).
    fn begin_write(&self) -> Result<Option<PathBuf>, String>;
    /// Publishes `copy`, a consistent copy of the catalog with the write just committed; the
    /// write is acknowledged only if this succeeds.
    fn publish(&self, copy: &std::path::Path) -> Result<(), String>;
    /// Ends the exclusive write.
    fn end_write(&self);
    /// The newest published copy if this node's file is behind it.
    fn newer(&self) -> Result<Option<PathBuf>, String>;
    /// The newest published copy whatever this node holds (after a publish failed), or `None`
    /// if nothing was ever published.
    fn published(&self) -> Result<Option<PathBuf>, String>;
}
