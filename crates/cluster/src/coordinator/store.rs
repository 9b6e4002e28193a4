//! The object-store coordinator, for stores that pass the conditional-write probe (S3, R2,
//! MinIO…; never Garage 2.5.0): a lease object per resource replaced only with `If-Match`,
//! and a manifest that is a sequence of create-only objects, as SlateDB keeps its own.
//!
//! Objects, under the storage's root:
//! - `coordination/leases/<resource>` — the owner, its epoch, or that it was released;
//! - `coordination/manifest/<resource>/<seq>` — the epoch, then the entry (an empty entry is a
//!   *fence*: a new owner creates one at the next free position before it reads the manifest,
//!   so a replaced owner's next publish finds its position taken and learns it was fenced);
//! - `coordination/members/<node>` — each node's announcement, rewritten as it renews.
//!
//! A lease is taken over only after this node has seen the *same* version of it for a whole
//! TTL on its own monotonic clock; the holder's own clock decides when it stops, counted from
//! when it sent its last renewal, so no two nodes act as owner at once whatever their wall clocks.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use super::{
    Acquired, Coordinator, CoordinatorError, Lease, LeaseClock, Member, Owner, Published, check_resource, decode_entry,
    encode_entry, monotonic, seq_name,
};
use crate::storage::{PutMode, SharedStorage, StorageError, Version};

/// How many taken positions a new owner skips before it gives up fencing (a live writer that
/// keeps winning would otherwise starve it; SlateDB caps the same race).
const FENCE_ATTEMPTS: usize = 16;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct LeaseObject {
    node: String,
    incarnation: String,
    epoch: u64,
    released: bool,
    renewed_unix_ms: u64,
}

impl LeaseObject {
    /// The lease as `member` holds (or releases) it now.
    fn by(member: Option<&Member>, epoch: u64, released: bool) -> Self {
        LeaseObject {
            node: member.map(|m| m.node.clone()).unwrap_or_default(),
            incarnation: member.map(|m| m.incarnation.clone()).unwrap_or_default(),
            epoch,
            released,
            renewed_unix_ms: unix_ms(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct MemberObject {
    #[serde(flatten)]
    member: Member,
    renewed_unix_ms: u64,
}

/// Ownership kept in the object store itself.
#[derive(Debug)]
pub struct StoreCoordinator {
    storage: SharedStorage,
    ttl: Duration,
    state: Arc<Mutex<State>>,
    renewer: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[derive(Debug, Default)]
struct State {
    member: Option<(Member, Version)>,
    held: HashMap<String, (Lease, Version)>,
    /// The version of another node's lease this node last saw, and since when.
    observed: HashMap<String, (Version, Instant)>,
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn lease_name(resource: &str) -> String {
    format!("coordination/leases/{resource}")
}

fn manifest_folder(resource: &str) -> String {
    format!("coordination/manifest/{resource}/")
}

impl StoreCoordinator {
    /// A coordinator keeping its objects in `storage`, which the caller has probed.
    pub fn new(storage: SharedStorage, ttl: Duration) -> Self {
        StoreCoordinator { storage, ttl, state: Arc::new(Mutex::new(State::default())), renewer: Default::default() }
    }

    async fn read_lease(&self, resource: &str) -> Result<Option<(LeaseObject, Version)>, CoordinatorError> {
        match self.storage.get(&lease_name(resource)).await {
            Ok((bytes, version)) => {
                let lease = serde_json::from_slice(&bytes)
                    .map_err(|e| CoordinatorError::Corrupt { key: lease_name(resource), message: e.to_string() })?;
                Ok(Some((lease, version)))
            }
            Err(StorageError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn encode<T: Serialize>(value: &T) -> Bytes {
        Bytes::from(serde_json::to_vec(value).expect("coordination objects serialise"))
    }

    async fn last_seq(&self, resource: &str) -> Result<u64, CoordinatorError> {
        let folder = manifest_folder(resource);
        let listed = self.storage.list(&folder).await?;
        Ok(listed.iter().filter_map(|info| info.name.strip_prefix(&folder)?.parse().ok()).max().unwrap_or(0))
    }

    /// Creates a fence at the next free position, so a replaced owner's publish there fails.
    async fn fence(&self, resource: &str, epoch: u64) -> Result<u64, CoordinatorError> {
        let mut seq = self.last_seq(resource).await? + 1;
        for _ in 0..FENCE_ATTEMPTS {
            let name = format!("{}{}", manifest_folder(resource), seq_name(seq));
            match self.storage.put(&name, Bytes::from(encode_entry(epoch, &[])), PutMode::Create).await {
                Ok(_) => return Ok(seq),
                Err(StorageError::AlreadyExists { .. }) => seq += 1,
                Err(e) => return Err(e.into()),
            }
        }
        Err(CoordinatorError::Unavailable {
            at: self.describe(),
            message: format!("{resource}: the previous owner kept publishing; could not fence it"),
        })
    }

    /// Renews every held lease and the announcement every third of the TTL.
    async fn renew_all(storage: SharedStorage, state: Arc<Mutex<State>>, ttl: Duration) {
        loop {
            tokio::time::sleep(ttl / 3).await;
            let (held, member) = {
                let state = state.lock().await;
                (state.held.clone(), state.member.clone())
            };
            for (resource, (lease, version)) in held {
                if lease.inner.ended.load(std::sync::atomic::Ordering::Acquire) {
                    // Fenced: renewing it would keep the resource from its new owner's successors.
                    state.lock().await.held.remove(&resource);
                    continue;
                }
                let body = LeaseObject::by(member.as_ref().map(|(m, _)| m), lease.epoch(), false);
                let sent = Instant::now();
                let encoded = Self::encode(&body);
                let renewed =
                    match storage.put(&lease_name(&resource), encoded.clone(), PutMode::Replace(version)).await {
                        // A retry of a renewal that landed finds its own write: still ours.
                        Err(StorageError::Precondition { .. }) => match storage.get(&lease_name(&resource)).await {
                            Ok((found, version)) if found == encoded => Ok(version),
                            _ => Err(StorageError::Precondition { name: lease_name(&resource) }),
                        },
                        other => other,
                    };
                match renewed {
                    Ok(version) => {
                        lease.inner.clock.renewed(sent, ttl);
                        if let Some(entry) = state.lock().await.held.get_mut(&resource) {
                            entry.1 = version;
                        }
                    }
                    Err(StorageError::Precondition { .. } | StorageError::NotFound { .. }) => {
                        tracing::warn!(
                            resource,
                            epoch = lease.epoch(),
                            "lease taken over; this node no longer owns it"
                        );
                        lease.end();
                        state.lock().await.held.remove(&resource);
                    }
                    Err(error) => tracing::warn!(resource, %error, "renewing a lease failed; retrying"),
                }
            }
            if let Some((member, version)) = member {
                let body = Self::encode(&MemberObject { member: member.clone(), renewed_unix_ms: unix_ms() });
                let name = format!("coordination/members/{}", member.node);
                let mode = PutMode::Replace(version);
                let written = match storage.put(&name, body.clone(), mode).await {
                    Err(StorageError::Precondition { .. } | StorageError::NotFound { .. }) => {
                        // Another incarnation of this node wrote it: this one's is the live one.
                        let _ = storage.delete(&name).await;
                        storage.put(&name, body, PutMode::Create).await
                    }
                    other => other,
                };
                match written {
                    Ok(version) => state.lock().await.member = Some((member, version)),
                    Err(error) => tracing::warn!(%error, "renewing this node's announcement failed"),
                }
            }
        }
    }

    async fn take(
        &self,
        resource: &str,
        epoch: u64,
        mode: PutMode,
        member: &Member,
    ) -> Result<Option<Lease>, CoordinatorError> {
        let body = LeaseObject::by(Some(member), epoch, false);
        let sent = Instant::now();
        let version = match self.storage.put(&lease_name(resource), Self::encode(&body), mode).await {
            Ok(version) => version,
            Err(StorageError::AlreadyExists { .. } | StorageError::Precondition { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let clock = LeaseClock::new();
        clock.renewed(sent, self.ttl);
        let fence = self.fence(resource, epoch).await?;
        let lease = Lease::new(resource, epoch, fence + 1, clock);
        let mut state = self.state.lock().await;
        state.observed.remove(resource);
        state.held.insert(resource.to_owned(), (lease.clone(), version));
        Ok(Some(lease))
    }
}

impl Drop for StoreCoordinator {
    /// A dropped coordinator stops renewing: its leases run out as a stopped node's would.
    fn drop(&mut self) {
        if let Some(renewer) = self.renewer.lock().unwrap_or_else(|e| e.into_inner()).take() {
            renewer.abort();
        }
    }
}

#[async_trait]
impl Coordinator for StoreCoordinator {
    fn describe(&self) -> String {
        format!("conditional writes of {}", self.storage.describe())
    }

    async fn join(&self, member: Member) -> Result<(), CoordinatorError> {
        let name = format!("coordination/members/{}", member.node);
        let body = Self::encode(&MemberObject { member: member.clone(), renewed_unix_ms: unix_ms() });
        self.storage.delete(&name).await?;
        let version = self.storage.put(&name, body, PutMode::Create).await?;
        self.state.lock().await.member = Some((member, version));
        let mut renewer = self.renewer.lock().unwrap_or_else(|e| e.into_inner());
        if renewer.is_none() {
            *renewer = Some(tokio::spawn(Self::renew_all(self.storage.clone(), self.state.clone(), self.ttl)));
        }
        Ok(())
    }

    async fn members(&self) -> Result<Vec<Member>, CoordinatorError> {
        let mut members = Vec::new();
        for info in self.storage.list("coordination/members/").await? {
            let (bytes, _) = match self.storage.get(&info.name).await {
                Ok(found) => found,
                Err(StorageError::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let object: MemberObject = serde_json::from_slice(&bytes)
                .map_err(|e| CoordinatorError::Corrupt { key: info.name.clone(), message: e.to_string() })?;
            // Announcements are for finding nodes, not for safety: a wall-clock window will do.
            if unix_ms().saturating_sub(object.renewed_unix_ms) <= 3 * self.ttl.as_millis() as u64 {
                members.push(object.member);
            }
        }
        Ok(members)
    }

    async fn acquire(&self, resource: &str) -> Result<Acquired, CoordinatorError> {
        check_resource(resource)?;
        let member =
            self.state.lock().await.member.clone().map(|(m, _)| m).ok_or_else(|| CoordinatorError::Unavailable {
                at: self.describe(),
                message: "this node has not joined the cluster".into(),
            })?;
        if let Some((lease, _)) = self.state.lock().await.held.get(resource)
            && lease.is_valid()
        {
            return Ok(Acquired::Owned(lease.clone()));
        }
        let current = self.read_lease(resource).await?;
        let taken = match &current {
            None => {
                // Epochs continue past any the manifest holds, even if the lease object was lost.
                let mut highest = 0;
                for info in self.storage.list(&manifest_folder(resource)).await? {
                    let (bytes, _) = self.storage.get(&info.name).await?;
                    highest = highest.max(decode_entry(&info.name, 0, &bytes)?.epoch);
                }
                self.take(resource, highest + 1, PutMode::Create, &member).await?
            }
            Some((lease, version)) => {
                let expired = {
                    let mut state = self.state.lock().await;
                    let seen =
                        state.observed.entry(resource.to_owned()).or_insert_with(|| (version.clone(), Instant::now()));
                    if &seen.0 != version {
                        *seen = (version.clone(), Instant::now());
                    }
                    seen.1.elapsed() >= self.ttl
                };
                let mine = lease.node == member.node && lease.incarnation == member.incarnation;
                if lease.released || mine || expired {
                    self.take(resource, lease.epoch + 1, PutMode::Replace(version.clone()), &member).await?
                } else {
                    None
                }
            }
        };
        if let Some(lease) = taken {
            return Ok(Acquired::Owned(lease));
        }
        match self.read_lease(resource).await? {
            Some((lease, _)) => {
                Ok(Acquired::Held(Owner { node: lease.node, incarnation: lease.incarnation, epoch: lease.epoch }))
            }
            None => Err(CoordinatorError::Unavailable {
                at: self.describe(),
                message: format!("{resource} changed hands; retry"),
            }),
        }
    }

    async fn owner(&self, resource: &str) -> Result<Option<Owner>, CoordinatorError> {
        check_resource(resource)?;
        let Some((lease, version)) = self.read_lease(resource).await? else { return Ok(None) };
        if lease.released {
            return Ok(None);
        }
        // An owner whose lease this node has seen unchanged for a TTL is gone.
        let state = self.state.lock().await;
        if let Some((seen, since)) = state.observed.get(resource)
            && *seen == version
            && since.elapsed() >= self.ttl
        {
            return Ok(None);
        }
        Ok(Some(Owner { node: lease.node, incarnation: lease.incarnation, epoch: lease.epoch }))
    }

    async fn publish(&self, lease: &Lease, entry: Bytes) -> Result<u64, CoordinatorError> {
        if entry.is_empty() {
            return Err(CoordinatorError::Corrupt {
                key: lease.resource().to_owned(),
                message: "an empty manifest entry".into(),
            });
        }
        if !lease.is_valid() {
            return Err(lease.fenced());
        }
        let body = Bytes::from(encode_entry(lease.epoch(), &entry));
        // A taken position holding a lower epoch is a replaced owner's late fence, one holding
        // this epoch an earlier attempt of ours whose answer was lost: both are passed over
        // (readers drop the first, and a repeated shipment only rewrites the same bytes). Only
        // a higher epoch means this lease was replaced.
        for _ in 0..FENCE_ATTEMPTS {
            let seq = lease.next_seq();
            let name = format!("{}{}", manifest_folder(lease.resource()), seq_name(seq));
            match self.storage.put(&name, body.clone(), PutMode::Create).await {
                Ok(_) => {
                    lease.published(seq);
                    return Ok(seq);
                }
                Err(StorageError::AlreadyExists { .. }) => {
                    let (found, _) = self.storage.get(&name).await?;
                    if found == body {
                        lease.published(seq);
                        return Ok(seq);
                    }
                    let taken = decode_entry(&name, seq, &found)?;
                    if taken.epoch > lease.epoch() {
                        return Err(lease.fenced());
                    }
                    lease.published(seq);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(CoordinatorError::Unavailable {
            at: self.describe(),
            message: format!("{}: every manifest position tried was taken", lease.resource()),
        })
    }

    async fn manifest(&self, resource: &str, after: u64) -> Result<Vec<Published>, CoordinatorError> {
        check_resource(resource)?;
        let folder = manifest_folder(resource);
        let mut entries = Vec::new();
        for info in self.storage.list(&folder).await? {
            let Some(seq) = info.name.strip_prefix(&folder).and_then(|s| s.parse::<u64>().ok()) else { continue };
            if seq <= after {
                continue;
            }
            let (bytes, _) = self.storage.get(&info.name).await?;
            entries.push(decode_entry(&info.name, seq, &bytes)?);
        }
        Ok(monotonic(entries).into_iter().filter(|p| !p.entry.is_empty()).collect())
    }

    async fn forget(&self, lease: &Lease, before: u64) -> Result<(), CoordinatorError> {
        let folder = manifest_folder(lease.resource());
        for info in self.storage.list(&folder).await? {
            if !lease.is_valid() {
                return Err(lease.fenced());
            }
            if info.name.strip_prefix(&folder).and_then(|s| s.parse::<u64>().ok()).is_some_and(|seq| seq < before) {
                // Fences stay: a replaced owner's next publish must keep finding its position taken.
                let (bytes, _) = self.storage.get(&info.name).await?;
                if bytes.len() > 8 {
                    self.storage.delete(&info.name).await?;
                }
            }
        }
        Ok(())
    }

    async fn release(&self, lease: &Lease) -> Result<(), CoordinatorError> {
        lease.end();
        let held = self.state.lock().await.held.remove(lease.resource());
        let Some((_, version)) = held else { return Ok(()) };
        let member = self.state.lock().await.member.clone().map(|(m, _)| m);
        let body = LeaseObject::by(member.as_ref(), lease.epoch(), true);
        match self.storage.put(&lease_name(lease.resource()), Self::encode(&body), PutMode::Replace(version)).await {
            Ok(_) | Err(StorageError::Precondition { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn leave(&self) -> Result<(), CoordinatorError> {
        let renewer = self.renewer.lock().unwrap_or_else(|e| e.into_inner()).take();
        let (held, member) = {
            let state = self.state.lock().await;
            let held: Vec<Lease> = state.held.values().map(|(lease, _)| lease.clone()).collect();
            (held, state.member.clone())
        };
        if let Some(renewer) = renewer {
            renewer.abort();
        }
        for lease in held {
            self.release(&lease).await?;
        }
        if let Some((member, _)) = member {
            self.storage.delete(&format!("coordination/members/{}", member.node)).await?;
        }
        self.state.lock().await.member = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::RemoteStorage;

    fn member(node: &str) -> Member {
        Member { node: node.into(), incarnation: "1".into(), api: String::new(), s3: String::new() }
    }

    /// A replaced owner whose own clock still says it holds the lease (a clock running slow, a
    /// pause mid-publish) finds its next manifest position taken by the successor's fence.
    #[tokio::test]
    async fn a_replaced_owner_with_a_live_clock_is_fenced_by_the_store() {
        let storage: SharedStorage =
            Arc::new(RemoteStorage::new(Arc::new(object_store::memory::InMemory::new()), "", "memory".into()));
        let ttl = Duration::from_secs(30);
        let (a, b) = (StoreCoordinator::new(storage.clone(), ttl), StoreCoordinator::new(storage.clone(), ttl));
        a.join(member("a")).await.unwrap();
        b.join(member("b")).await.unwrap();
        let Acquired::Owned(old) = a.acquire("d1/x").await.unwrap() else { panic!("a owns a free resource") };
        a.publish(&old, Bytes::from_static(b"one")).await.unwrap();
        assert!(matches!(b.acquire("d1/x").await.unwrap(), Acquired::Held(owner) if owner.node == "a"));
        // b has seen the same lease version for a whole TTL.
        b.state.lock().await.observed.get_mut("d1/x").unwrap().1 -= ttl;
        let Acquired::Owned(new) = b.acquire("d1/x").await.unwrap() else { panic!("b takes an expired lease over") };
        assert_eq!(new.epoch(), old.epoch() + 1);

        let zombie = Lease::new("d1/x", old.epoch(), old.next_seq(), LeaseClock::new());
        zombie.inner.clock.renewed(Instant::now(), ttl);
        let refused = a.publish(&zombie, Bytes::from_static(b"late")).await;
        assert!(matches!(refused, Err(CoordinatorError::Fenced { .. })), "{refused:?}");
        assert!(!zombie.is_valid(), "a fenced lease stops serving");
        b.publish(&new, Bytes::from_static(b"two")).await.unwrap();
        let entries: Vec<_> = b.manifest("d1/x", 0).await.unwrap().into_iter().map(|p| p.entry).collect();
        assert_eq!(entries, [Bytes::from_static(b"one"), Bytes::from_static(b"two")]);
        // Compacting the manifest keeps the fence, so the zombie stays refused.
        b.forget(&new, new.next_seq()).await.unwrap();
        let zombie = Lease::new("d1/x", old.epoch(), old.next_seq(), LeaseClock::new());
        zombie.inner.clock.renewed(Instant::now(), ttl);
        assert!(matches!(a.publish(&zombie, Bytes::from_static(b"later")).await, Err(CoordinatorError::Fenced { .. })));
        // a's renewal finds the lease replaced and ends its own lease.
        tokio::time::sleep(ttl / 3 + Duration::from_secs(1)).await;
        assert!(!old.is_valid());
    }

    /// A position found taken by a lower epoch (a replaced acquirer's late fence) or by this
    /// epoch (an earlier attempt whose answer was lost) is passed over; only a higher epoch
    /// fences.
    #[tokio::test]
    async fn taken_positions_fence_only_when_a_later_epoch_holds_them() {
        let storage: SharedStorage =
            Arc::new(RemoteStorage::new(Arc::new(object_store::memory::InMemory::new()), "", "memory".into()));
        let coordinator = StoreCoordinator::new(storage.clone(), Duration::from_secs(30));
        coordinator.join(member("a")).await.unwrap();
        let Acquired::Owned(lease) = coordinator.acquire("d1/y").await.unwrap() else { panic!("free") };
        let slot = |seq: u64| format!("{}{}", manifest_folder("d1/y"), seq_name(seq));
        let next = lease.next_seq();
        let epoch = lease.epoch();
        storage.put(&slot(next), Bytes::from(encode_entry(epoch - 1, &[])), PutMode::Create).await.unwrap();
        storage.put(&slot(next + 1), Bytes::from(encode_entry(epoch, b"landed")), PutMode::Create).await.unwrap();
        assert_eq!(coordinator.publish(&lease, Bytes::from_static(b"one")).await.unwrap(), next + 2);
        storage.put(&slot(next + 3), Bytes::from(encode_entry(epoch + 1, &[])), PutMode::Create).await.unwrap();
        let fenced = coordinator.publish(&lease, Bytes::from_static(b"two")).await;
        assert!(matches!(fenced, Err(CoordinatorError::Fenced { .. })), "{fenced:?}");
        let seen: Vec<_> = coordinator.manifest("d1/y", 0).await.unwrap().into_iter().map(|p| p.entry).collect();
        assert_eq!(seen, [Bytes::from_static(b"landed"), Bytes::from_static(b"one")]);
    }
}
