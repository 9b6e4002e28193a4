//! Who owns what: the coordinator trait that gives each resource (a D1 database, a bucket's
//! metadata, a namespace) one owner at a time, with an epoch that fences every manifest entry
//! the owner publishes, and its two implementations — etcd ([`EtcdCoordinator`]) and the object
//! store's own conditional writes ([`StoreCoordinator`]), for stores that pass the probe.
//!
//! The contract, whichever implementation:
//! - [`Coordinator::acquire`] makes this node the owner only if no live owner holds the
//!   resource; each ownership has an epoch higher than every earlier one.
//! - [`Coordinator::publish`] appends an entry to the resource's manifest only while the lease
//!   is still the current ownership; an owner that was replaced (paused past its lease,
//!   partitioned) gets [`CoordinatorError::Fenced`] and nothing it publishes becomes visible.
//! - A lease knows its own deadline ([`Lease::is_valid`]), measured on this node's monotonic
//!   clock from the moment a renewal was *sent*, less a margin: the owner stops serving before
//!   any other node could have taken over.

mod etcd;
mod store;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

pub use etcd::{EtcdClient, EtcdCoordinator};
pub use store::StoreCoordinator;

use crate::storage::StorageError;

/// A node as the cluster knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The operator's name for the node (`--node-id`), stable across restarts.
    pub node: String,
    /// Random per process start, so a restarted node is never mistaken for its old self.
    pub incarnation: String,
    /// The URL of its v4 API (and the binding endpoints), where other nodes forward to it.
    pub api: String,
    /// The URL of its S3 listener.
    pub s3: String,
}

/// Who holds a resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// The owning node.
    pub node: String,
    /// Its incarnation.
    pub incarnation: String,
    /// The ownership's epoch.
    pub epoch: u64,
}

/// One entry of a resource's manifest, as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// Its position in the manifest: dense, starting at 1.
    pub seq: u64,
    /// The epoch of the ownership that published it.
    pub epoch: u64,
    /// What the owner published (the caller's encoding).
    pub entry: Bytes,
}

/// What [`Coordinator::acquire`] found.
#[derive(Debug)]
pub enum Acquired {
    /// This node now owns the resource.
    Owned(Lease),
    /// Another ownership is live (possibly this node's earlier incarnation, until its lease ends).
    Held(Owner),
}

/// A coordinator failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoordinatorError {
    /// The lease is no longer the resource's ownership: stop serving it and publish nothing.
    #[error("{resource}: this node's ownership (epoch {epoch}) has ended")]
    Fenced {
        /// The resource.
        resource: String,
        /// The epoch that ended.
        epoch: u64,
    },
    /// The coordinator could not be reached or refused the request.
    #[error("coordinator {at}: {message}")]
    Unavailable {
        /// Which coordinator (an etcd endpoint, the store).
        at: String,
        /// What went wrong.
        message: String,
    },
    /// The store the coordinator keeps its state in failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The coordinator holds something kura cannot read (another program's keys, a bug).
    #[error("coordinator state {key}: {message}")]
    Corrupt {
        /// The key or object.
        key: String,
        /// What is wrong with it.
        message: String,
    },
}

/// Ownership of one resource by this node.
#[derive(Clone)]
pub struct Lease {
    inner: Arc<LeaseInner>,
}

struct LeaseInner {
    resource: String,
    epoch: u64,
    next_seq: AtomicU64,
    ended: AtomicBool,
    clock: Arc<LeaseClock>,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("resource", &self.inner.resource)
            .field("epoch", &self.inner.epoch)
            .field("valid", &self.is_valid())
            .finish()
    }
}

impl Lease {
    fn new(resource: &str, epoch: u64, next_seq: u64, clock: Arc<LeaseClock>) -> Self {
        Lease {
            inner: Arc::new(LeaseInner {
                resource: resource.to_owned(),
                epoch,
                next_seq: AtomicU64::new(next_seq),
                ended: AtomicBool::new(false),
                clock,
            }),
        }
    }

    /// The resource owned.
    pub fn resource(&self) -> &str {
        &self.inner.resource
    }

    /// The ownership's epoch: higher than every earlier ownership of the resource.
    pub fn epoch(&self) -> u64 {
        self.inner.epoch
    }

    /// Whether this node may still act as the owner: not fenced, and before its own deadline.
    pub fn is_valid(&self) -> bool {
        !self.remaining().is_zero()
    }

    /// How long the lease has left by this node's clock (zero once it has ended).
    pub fn remaining(&self) -> Duration {
        if self.inner.ended.load(Ordering::Acquire) { Duration::ZERO } else { self.inner.clock.remaining() }
    }

    pub(crate) fn end(&self) {
        self.inner.ended.store(true, Ordering::Release);
    }

    fn next_seq(&self) -> u64 {
        self.inner.next_seq.load(Ordering::Acquire)
    }

    fn published(&self, seq: u64) {
        self.inner.next_seq.store(seq + 1, Ordering::Release);
    }

    fn fenced(&self) -> CoordinatorError {
        self.end();
        CoordinatorError::Fenced { resource: self.inner.resource.clone(), epoch: self.inner.epoch }
    }
}

impl fmt::Debug for LeaseClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseClock").field("remaining", &self.remaining()).finish()
    }
}

/// A lease's deadline on this node's monotonic clock, moved by renewals; shared by every lease
/// one etcd session carries.
pub(crate) struct LeaseClock {
    base: Instant,
    deadline_ms: AtomicU64,
    lost: AtomicBool,
}

impl LeaseClock {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(LeaseClock { base: Instant::now(), deadline_ms: AtomicU64::new(0), lost: AtomicBool::new(false) })
    }

    /// A renewal sent at `sent` granted `ttl`: the lease holds until `sent + ttl - margin`.
    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) {
        let until = sent.saturating_duration_since(self.base) + ttl.saturating_sub(safety_margin(ttl));
        self.deadline_ms.fetch_max(until.as_millis() as u64, Ordering::AcqRel);
    }

    pub(crate) fn lose(&self) {
        self.lost.store(true, Ordering::Release);
    }

    pub(crate) fn is_valid(&self) -> bool {
        !self.remaining().is_zero()
    }

    fn remaining(&self) -> Duration {
        if self.lost.load(Ordering::Acquire) {
            return Duration::ZERO;
        }
        let deadline = Duration::from_millis(self.deadline_ms.load(Ordering::Acquire));
        deadline.saturating_sub(self.base.elapsed())
    }
}

/// How much earlier than its TTL an owner gives up: clocks run at slightly different rates on
/// different machines, and a lease may be granted a moment after the request was sent.
fn safety_margin(ttl: Duration) -> Duration {
    (ttl / 5).clamp(Duration::from_millis(200), Duration::from_secs(2))
}

/// The ownership service kura's nodes share.
#[async_trait]
pub trait Coordinator: Send + Sync + fmt::Debug + 'static {
    /// Which coordinator, for messages and `kura node status`.
    fn describe(&self) -> String;

    /// Announces this node and keeps it (and every lease it holds) alive until [`leave`]
    /// or until it can no longer reach the coordinator within its TTL.
    ///
    /// [`leave`]: Coordinator::leave
    async fn join(&self, member: Member) -> Result<(), CoordinatorError>;

    /// The nodes whose announcement is live.
    async fn members(&self) -> Result<Vec<Member>, CoordinatorError>;

    /// Becomes the owner of `resource` if no live ownership holds it.
    async fn acquire(&self, resource: &str) -> Result<Acquired, CoordinatorError>;

    /// The live ownership of `resource`, if any.
    async fn owner(&self, resource: &str) -> Result<Option<Owner>, CoordinatorError>;

    /// Appends `entry` to the resource's manifest under `lease`, or refuses with
    /// [`CoordinatorError::Fenced`] if the lease is no longer the ownership. Returns its seq.
    async fn publish(&self, lease: &Lease, entry: Bytes) -> Result<u64, CoordinatorError>;

    /// The manifest's entries after `after` (0 for all), in order.
    async fn manifest(&self, resource: &str, after: u64) -> Result<Vec<Published>, CoordinatorError>;

    /// Drops the manifest's entries before `before` (a snapshot made them unneeded), fenced
    /// like [`publish`](Coordinator::publish).
    async fn forget(&self, lease: &Lease, before: u64) -> Result<(), CoordinatorError>;

    /// Gives the resource up now, so another node can take it without waiting for the TTL.
    async fn release(&self, lease: &Lease) -> Result<(), CoordinatorError>;

    /// Gives every lease up and withdraws the announcement.
    async fn leave(&self) -> Result<(), CoordinatorError>;
}

/// A resource name as coordinators store it: kura composes them (`d1/<uuid>`), never users.
pub(crate) fn check_resource(resource: &str) -> Result<(), CoordinatorError> {
    let valid = !resource.is_empty()
        && resource.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
        && resource.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
    if valid {
        Ok(())
    } else {
        Err(CoordinatorError::Corrupt { key: resource.to_owned(), message: "not a resource name kura makes".into() })
    }
}

/// A manifest entry as both coordinators keep it: the publishing epoch, then the caller's bytes.
pub(crate) fn encode_entry(epoch: u64, entry: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(8 + entry.len());
    bytes.extend_from_slice(&epoch.to_be_bytes());
    bytes.extend_from_slice(entry);
    bytes
}

pub(crate) fn decode_entry(key: &str, seq: u64, bytes: &[u8]) -> Result<Published, CoordinatorError> {
    let Some((epoch, entry)) = bytes.split_first_chunk::<8>() else {
        return Err(CoordinatorError::Corrupt {
            key: key.to_owned(),
            message: "a manifest entry shorter than its epoch".into(),
        });
    };
    Ok(Published { seq, epoch: u64::from_be_bytes(*epoch), entry: Bytes::copy_from_slice(entry) })
}

/// Manifest positions are zero-padded so a listing sorts them.
pub(crate) fn seq_name(seq: u64) -> String {
    format!("{seq:020}")
}

/// Entries whose epoch is lower than an earlier entry's cannot be a live owner's: a replaced
/// owner's publish raced the successor's fence. Readers drop them.
pub(crate) fn monotonic(entries: Vec<Published>) -> Vec<Published> {
    let mut highest = 0;
    entries
        .into_iter()
        .filter(|p| {
            let keep = p.epoch >= highest;
            highest = highest.max(p.epoch);
            keep
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_holds_until_ttl_less_margin_from_sending() {
        let clock = LeaseClock::new();
        assert!(!clock.is_valid(), "no renewal yet");
        clock.renewed(Instant::now(), Duration::from_secs(10));
        let left = clock.remaining();
        assert!(left <= Duration::from_secs(8) && left > Duration::from_millis(7900), "{left:?}");
        clock.renewed(Instant::now() - Duration::from_secs(60), Duration::from_secs(10));
        assert!(clock.is_valid(), "a late answer to an old renewal never shortens the lease");
        clock.lose();
        assert!(!clock.is_valid());
    }

    #[test]
    fn entries_round_trip_and_lower_epochs_after_higher_are_dropped() {
        let bytes = encode_entry(7, b"segment");
        let p = decode_entry("k", 3, &bytes).unwrap();
        assert_eq!((p.seq, p.epoch, &p.entry[..]), (3, 7, &b"segment"[..]));
        assert!(decode_entry("k", 1, b"short").is_err());
        let entries =
            [(1, 1), (2, 2), (3, 1), (4, 2), (5, 3)].map(|(seq, epoch)| Published { seq, epoch, entry: Bytes::new() });
        let kept: Vec<_> = monotonic(entries.into()).into_iter().map(|p| p.seq).collect();
        assert_eq!(kept, [1, 2, 4, 5]);
        assert!(check_resource("d1/0a-b").is_ok());
        assert!(check_resource("d1/../x").is_err() && check_resource("").is_err() && check_resource("a b").is_err());
    }
}
