//! Which node serves each shared SQLite file — a D1 database, an R2 bucket's metadata, a
//! Durable Object namespace's index or one of its objects: the one holding its `<kind>/<key>`
//! ownership (`d1/<uuid>`, `r2/<bucket id>`, `do-index/<namespace id>`, `do/<namespace id>/
//! <object id>`), which rebuilt the file from the store when it took it and ships every commit
//! before it is acknowledged. Requests reaching any other node are sent to that one.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kura_sqlite::{LogShipper, Placement, PlacementError, ReleaseFile};

use crate::coordinator::{Acquired, Coordinator, Lease, Member};
use crate::replica::{AsyncShipper, HistoryShipper, rebuild_to, sweep};
use crate::storage::SharedStorage;

/// Which of `nodes` nodes a resource goes to, the same on every node.
fn spread(resource: &str, nodes: usize) -> usize {
    resource.bytes().fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize)) % nodes.max(1)
}

/// What kind of file a placement places: the first part of its resources' names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// D1 databases, by UUID.
    D1,
    /// R2 buckets' metadata, by storage id.
    R2,
    /// Durable Object namespaces' indexes (objects, names, alarms), by storage id.
    DoNamespace,
    /// Durable Objects' own files, by `<namespace id>/<object id>`.
    DoObject,
    /// Workers KV namespaces' metadata (an R2 bucket's file each), by id.
    Kv,
    /// Queues' files, by id.
    Queue,
}

impl Kind {
    /// The prefix of this kind's resources.
    pub fn name(self) -> &'static str {
        match self {
            Kind::D1 => "d1",
            Kind::R2 => "r2",
            Kind::DoNamespace => "do-index",
            Kind::DoObject => "do",
            Kind::Kv => "kv",
            Kind::Queue => "queue",
        }
    }

    /// The coordinator's resource for the file `key` of this kind.
    pub fn resource(self, key: &str) -> String {
        format!("{}/{key}", self.name())
    }
}

/// How long an owner found for a forwarded request is trusted without asking again: a node
/// that took over is found at the latest this long after the old owner's lease ended (sooner
/// when the old owner refuses or cannot be reached, which forgets it at once).
const OWNER_CACHE: std::time::Duration = std::time::Duration::from_secs(1);

struct Claim {
    lease: Lease,
    shipper: Arc<HistoryShipper>,
    /// In `--durability async`, what commits pass instead (it ships in the background).
    background: Option<Arc<AsyncShipper>>,
    /// Where its shipping counts go when it ends, so the node's totals only grow.
    totals: Arc<Totals>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let (puts, shipments) = self.shipper.counts();
        self.totals.puts.fetch_add(puts, Ordering::Relaxed);
        self.totals.shipments.fetch_add(shipments, Ordering::Relaxed);
    }
}

/// What the node's ownerships of one kind did since it started, for the metrics.
#[derive(Debug, Default)]
struct Totals {
    /// Objects ended ownerships wrote to the store.
    puts: AtomicU64,
    /// Manifest entries ended ownerships published.
    shipments: AtomicU64,
    /// Ownerships taken (each rebuilt the file from the store).
    takeovers: AtomicU64,
}

/// A node's figures for one kind of file, for Prometheus.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    /// Files owned now.
    pub owned: u64,
    /// Objects written to the store, since the node started.
    pub puts: u64,
    /// Manifest entries published (one per shipped group commit), since the node started.
    pub shipments: u64,
    /// Ownerships taken, each with a rebuild from the store, since the node started.
    pub takeovers: u64,
    /// In `--durability async`: the longest any owned file's oldest unshipped commit has waited.
    pub shipping_lag: std::time::Duration,
}

/// When a commit is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Once the store holds it (RPO 0): the default.
    Shipped,
    /// Once it is fsynced locally; shipped within about this interval (the RPO).
    Local(std::time::Duration),
}

/// This node's ownerships of one kind of file.
pub struct ClusterPlacement {
    kind: Kind,
    storage: SharedStorage,
    coordinator: Arc<dyn Coordinator>,
    member: Member,
    claims: Mutex<HashMap<String, Claim>>,
    /// Owners found lately for files another node serves: asking the coordinator on every
    /// forwarded request would cost an etcd transaction each.
    elsewhere: Mutex<HashMap<String, (PlacementError, std::time::Instant)>>,
    durability: Durability,
    /// Set by a drain: this node gives its files up and takes none.
    draining: std::sync::atomic::AtomicBool,
    /// One claim at a time per file, so two requests never rebuild it at once.
    claiming: tokio::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    totals: Arc<Totals>,
    /// The live members lately seen, for [`Placement::is_home`] (asked of many files at once).
    members_seen: Mutex<Option<(Vec<Member>, std::time::Instant)>>,
}

impl std::fmt::Debug for ClusterPlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterPlacement")
            .field("kind", &self.kind)
            .field("node", &self.member.node)
            .finish_non_exhaustive()
    }
}

/// What one owned file has shipped, for `kura node status` and the metrics.
#[derive(Debug, Clone)]
pub struct Owned {
    /// Its resource (`d1/<uuid>`, `r2/<bucket id>`).
    pub resource: String,
    /// The ownership's epoch.
    pub epoch: u64,
    /// How long the lease has left.
    pub lease_remaining: std::time::Duration,
    /// Objects written to the store under this ownership.
    pub puts: u64,
    /// Manifest entries published (one per shipped group commit).
    pub shipments: u64,
    /// In `--durability async`: how long the oldest commit not yet in the store has waited.
    pub shipping_lag: std::time::Duration,
}

impl ClusterPlacement {
    /// The ownerships of `kind` of the node `member`, which has joined `coordinator`.
    pub fn new(
        kind: Kind,
        storage: SharedStorage,
        coordinator: Arc<dyn Coordinator>,
        member: Member,
        durability: Durability,
    ) -> Self {
        ClusterPlacement {
            kind,
            storage,
            coordinator,
            member,
            claims: Mutex::default(),
            elsewhere: Mutex::default(),
            durability,
            draining: Default::default(),
            claiming: tokio::sync::Mutex::default(),
            totals: Arc::default(),
            members_seen: Mutex::default(),
        }
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, HashMap<String, Claim>> {
        self.claims.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The kind of file placed.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The files this node owns now.
    pub fn owned(&self) -> Vec<Owned> {
        let mut owned: Vec<Owned> = self
            .claims()
            .iter()
            .filter(|(_, c)| c.lease.is_valid())
            .map(|(_, c)| {
                let (puts, shipments) = c.shipper.counts();
                Owned {
                    resource: c.lease.resource().to_owned(),
                    epoch: c.lease.epoch(),
                    lease_remaining: c.lease.remaining(),
                    puts,
                    shipments,
                    shipping_lag: c.background.as_ref().map(|b| b.lag()).unwrap_or_default(),
                }
            })
            .collect();
        owned.sort_by(|a, b| a.resource.cmp(&b.resource));
        owned
    }

    /// The node's figures for this kind of file since it started.
    pub fn figures(&self) -> Figures {
        let owned = self.owned();
        // Every claim's counts, valid or not: an ended claim's join the totals only when it
        // is dropped, and a counter must never go down.
        let (live_puts, live_shipments) = self.claims().values().fold((0, 0), |(p, s), claim| {
            let (puts, shipments) = claim.shipper.counts();
            (p + puts, s + shipments)
        });
        let totals = &self.totals;
        Figures {
            owned: owned.len() as u64,
            puts: totals.puts.load(Ordering::Relaxed) + live_puts,
            shipments: totals.shipments.load(Ordering::Relaxed) + live_shipments,
            takeovers: totals.takeovers.load(Ordering::Relaxed),
            shipping_lag: owned.iter().map(|o| o.shipping_lag).max().unwrap_or_default(),
        }
    }

    /// Drains the node: it gives every file up and takes none from now on; requests for them
    /// are sent to their owner, or to another node that will take them.
    pub async fn drain(&self) {
        self.draining.store(true, std::sync::atomic::Ordering::SeqCst);
        self.release_all().await;
    }

    /// Whether the node is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Where a draining node sends a file's request: its owner, or another live node,
    /// which takes it over.
    async fn handed_over(&self, resource: &str) -> Result<(), PlacementError> {
        let unavailable = |m: String| PlacementError::Unavailable(m);
        if let Some(owner) = self.coordinator.owner(resource).await.map_err(|e| unavailable(e.to_string()))?
            && owner.node != self.member.node
        {
            return Err(self.elsewhere_of(&owner).await?);
        }
        let members = self.coordinator.members().await.map_err(|e| unavailable(e.to_string()))?;
        let mut others: Vec<Member> = members.into_iter().filter(|m| m.node != self.member.node).collect();
        if others.is_empty() {
            return Err(unavailable("this node is draining and no other node is a member".into()));
        }
        // Spread the files over the other nodes by their id.
        let target = others.swap_remove(spread(resource, others.len()));
        Err(PlacementError::Elsewhere { node: target.node, url: target.api, s3: target.s3 })
    }

    /// Gives every file up (a drain, or a clean stop), so other nodes take them at once.
    pub async fn release_all(&self) {
        let claims: Vec<Claim> = self.claims().drain().map(|(_, c)| c).collect();
        for claim in claims {
            if let Err(e) = self.coordinator.release(&claim.lease).await {
                tracing::warn!(resource = claim.lease.resource(), error = %e, "could not give a file up");
            }
        }
    }

    fn elsewhere(&self) -> std::sync::MutexGuard<'_, HashMap<String, (PlacementError, std::time::Instant)>> {
        self.elsewhere.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn claim_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        Arc::clone(self.claiming.lock().await.entry(key.to_owned()).or_default())
    }

    /// Where requests for a file `owner` holds go: its live member's addresses.
    async fn elsewhere_of(&self, owner: &crate::coordinator::Owner) -> Result<PlacementError, PlacementError> {
        let unavailable = |m: String| PlacementError::Unavailable(m);
        if owner.node == self.member.node {
            return Err(unavailable(format!(
                "this node's earlier run (incarnation {}) holds it until its lease ends",
                owner.incarnation
            )));
        }
        let members = self.coordinator.members().await.map_err(|e| unavailable(e.to_string()))?;
        members
            .into_iter()
            .find(|m| m.node == owner.node && m.incarnation == owner.incarnation)
            .map(|m| PlacementError::Elsewhere { node: m.node, url: m.api, s3: m.s3 })
            .ok_or_else(|| {
                unavailable(format!("its owner, node {}, is not a live member; its lease is ending", owner.node))
            })
    }
}

#[async_trait::async_trait]
impl Placement for ClusterPlacement {
    fn is_current(&self, key: &str) -> bool {
        self.claims().get(key).is_some_and(|c| c.lease.is_valid())
    }

    async fn claim_at(
        &self,
        key: &str,
        path: &Path,
        log: &Path,
        release_file: ReleaseFile,
    ) -> Result<(), PlacementError> {
        if let Some(owner) = self.known_elsewhere(key) {
            return Err(owner);
        }
        let lock = self.claim_lock(key).await;
        let _claiming = lock.lock().await;
        if self.is_current(key) {
            return Ok(());
        }
        // From here nothing opens the file (the opener finds no claim) until this one settles.
        let previous = self.claims().remove(key);
        let resource = self.kind.resource(key);
        if previous.is_some() {
            tracing::warn!(%resource, "this node's lease lapsed (a renewal came late); claiming it again");
        }
        if self.is_draining() {
            if let Some(previous) = previous {
                previous.lease.end();
            }
            return self.handed_over(&resource).await;
        }
        let unavailable = |m: String| PlacementError::Unavailable(m);
        match self.coordinator.acquire(&resource).await.map_err(|e| unavailable(e.to_string()))? {
            // Even the same epoch renewed late is rebuilt: a commit its shipper was refused
            // may sit in the local file, and must never ship.
            Acquired::Owned(lease) => {
                if let Some(previous) = previous {
                    // Its shipper must never publish again, whatever its clock says.
                    previous.lease.end();
                }
                release_file.await;
                let shipped = match rebuild_to(&self.storage, &*self.coordinator, &resource, path, log).await {
                    Ok((shipped, _)) => shipped,
                    Err(e) => {
                        let _ = self.coordinator.release(&lease).await;
                        return Err(unavailable(format!("rebuilding it from the store failed: {e}")));
                    }
                };
                tracing::info!(%resource, epoch = lease.epoch(), "took over");
                let shipper = Arc::new(HistoryShipper::new(
                    self.storage.clone(),
                    Arc::clone(&self.coordinator),
                    lease.clone(),
                    shipped,
                ));
                self.elsewhere().remove(key);
                let background = match self.durability {
                    Durability::Shipped => None,
                    Durability::Local(interval) => Some(Arc::new(AsyncShipper::new(Arc::clone(&shipper), interval))),
                };
                self.totals.takeovers.fetch_add(1, Ordering::Relaxed);
                // Earlier owners' late uploads and failed shipments: removed in the background.
                let (storage, coordinator, swept_lease) =
                    (self.storage.clone(), Arc::clone(&self.coordinator), lease.clone());
                tokio::spawn(async move {
                    match sweep(&storage, &*coordinator, &swept_lease).await {
                        Ok(0) => {}
                        Ok(removed) => {
                            tracing::info!(resource = swept_lease.resource(), removed, "swept orphaned history")
                        }
                        Err(e) => {
                            tracing::warn!(resource = swept_lease.resource(), error = %e, "could not sweep history")
                        }
                    }
                });
                let totals = Arc::clone(&self.totals);
                self.claims().insert(key.to_owned(), Claim { lease, shipper, background, totals });
                Ok(())
            }
            Acquired::Held(owner) => {
                if let Some(previous) = previous {
                    previous.lease.end();
                }
                let elsewhere = self.elsewhere_of(&owner).await?;
                self.elsewhere().insert(key.to_owned(), (elsewhere.clone(), std::time::Instant::now()));
                Err(elsewhere)
            }
        }
    }

    fn forget_owner(&self, key: &str) {
        self.elsewhere().remove(key);
    }

    fn known_elsewhere(&self, key: &str) -> Option<PlacementError> {
        let elsewhere = self.elsewhere();
        let (owner, found) = elsewhere.get(key)?;
        (found.elapsed() < OWNER_CACHE).then(|| owner.clone())
    }

    async fn give_up_under(&self, prefix: &str) {
        let given_up: Vec<Claim> = {
            let mut claims = self.claims();
            let keys: Vec<String> = claims.keys().filter(|k| k.starts_with(prefix)).cloned().collect();
            keys.into_iter().filter_map(|k| claims.remove(&k)).collect()
        };
        for claim in given_up {
            claim.lease.end();
            if let Err(e) = self.coordinator.release(&claim.lease).await {
                tracing::warn!(resource = claim.lease.resource(), error = %e, "could not give a file up");
            }
        }
    }

    async fn is_home(&self, key: &str) -> bool {
        let seen = self.members_seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let members = match seen {
            Some((members, at)) if at.elapsed() < OWNER_CACHE => Ok(members),
            _ => self.coordinator.members().await.inspect(|members| {
                *self.members_seen.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some((members.clone(), std::time::Instant::now()));
            }),
        };
        match members {
            Ok(mut members) if !members.is_empty() => {
                members.sort_by(|a, b| a.node.cmp(&b.node));
                let pick = spread(&self.kind.resource(key), members.len());
                members[pick].node == self.member.node
            }
            // Without a view of the members, each node may adopt: ownership still admits one.
            _ => true,
        }
    }

    async fn has_history(&self, key: &str) -> bool {
        self.coordinator.manifest(&self.kind.resource(key), 0).await.is_ok_and(|manifest| !manifest.is_empty())
    }

    fn shipper(&self, key: &str) -> Option<Arc<dyn LogShipper>> {
        let claims = self.claims();
        let claim = claims.get(key).filter(|c| c.lease.is_valid())?;
        Some(match &claim.background {
            Some(background) => Arc::clone(background) as Arc<dyn LogShipper>,
            None => Arc::clone(&claim.shipper) as Arc<dyn LogShipper>,
        })
    }

    async fn release(&self, key: &str) {
        let Some(claim) = self.claims().remove(key) else { return };
        let folder = format!("history/{}/", claim.lease.resource());
        let forgotten = self.coordinator.forget(&claim.lease, u64::MAX).await;
        if let Err(e) = forgotten {
            tracing::warn!(resource = claim.lease.resource(), error = %e, "could not drop a deleted file's manifest");
        } else if let Ok(listed) = self.storage.list(&folder).await {
            for info in listed {
                let _ = self.storage.delete(&info.name).await;
            }
        }
        if let Err(e) = self.coordinator.release(&claim.lease).await {
            tracing::warn!(resource = claim.lease.resource(), error = %e, "could not give a deleted file up");
        }
    }
}
