//! `kura serve`'s cluster flags: the object store every node shares, the coordinator that
//! decides who owns what (etcd, or the store's own conditional writes if it passes the probe),
//! and this node's name and addresses; joined before the data directory opens.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use kura_cluster::{
    Coordinator, EtcdClient, EtcdCoordinator, Member, RemoteStorage, S3Config, SharedStorage, StoreCoordinator,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CoordinatorKind {
    /// etcd 3.4+ (`--etcd`): leases and revision-compare transactions.
    Etcd,
    /// The store's own conditional writes; refused for stores that ignore them (Garage).
    Store,
}

#[derive(Args, Clone)]
pub struct ClusterArgs {
    /// Run as a node of a cluster whose data lives in this S3-compatible store:
    /// `s3://<bucket>[/<prefix>]` (Garage, AWS S3, R2, MinIO, Ceph). Off: everything stays in
    /// the data directory.
    #[arg(long, env = "KURA_CLUSTER_STORE", help_heading = "Cluster")]
    cluster_store: Option<String>,
    /// The store's endpoint (`http://127.0.0.1:3900`); AWS itself when absent.
    #[arg(long, env = "KURA_CLUSTER_STORE_ENDPOINT", help_heading = "Cluster")]
    cluster_store_endpoint: Option<String>,
    /// The region the store's requests are signed for (`garage` for Garage, `auto` for R2).
    #[arg(long, env = "KURA_CLUSTER_STORE_REGION", default_value = "us-east-1", help_heading = "Cluster")]
    cluster_store_region: String,
    /// The store's access key id.
    #[arg(long, env = "KURA_CLUSTER_STORE_ACCESS_KEY_ID", hide_env_values = true, help_heading = "Cluster")]
    cluster_store_access_key_id: Option<String>,
    /// The store's secret access key.
    #[arg(long, env = "KURA_CLUSTER_STORE_SECRET_ACCESS_KEY", hide_env_values = true, help_heading = "Cluster")]
    cluster_store_secret_access_key: Option<String>,
    /// Who decides ownership: etcd when --etcd is given, else the store.
    #[arg(long, env = "KURA_COORDINATOR", value_enum, help_heading = "Cluster")]
    coordinator: Option<CoordinatorKind>,
    /// etcd's client URLs (repeat, or comma-separate in the environment).
    #[arg(long = "etcd", env = "KURA_ETCD", value_delimiter = ',', help_heading = "Cluster")]
    etcd: Vec<String>,
    /// The cluster's name: its keys in etcd live under `/kura/<name>/`.
    #[arg(long, env = "KURA_CLUSTER_NAME", default_value = "kura", help_heading = "Cluster")]
    cluster_name: String,
    /// This node's name in the cluster, stable across restarts.
    #[arg(long, env = "KURA_NODE_ID", help_heading = "Cluster")]
    node_id: Option<String>,
    /// The URL other nodes reach this node's API at (default: http://<--listen>).
    #[arg(long, env = "KURA_ADVERTISE", help_heading = "Cluster")]
    advertise: Option<String>,
    /// The URL other nodes reach this node's S3 listener at (default: http://<--s3-listen>):
    /// where they send the requests of buckets this node owns.
    #[arg(long, env = "KURA_ADVERTISE_S3", help_heading = "Cluster")]
    advertise_s3: Option<String>,
    /// Seconds an owner's lease lasts without renewal: how long a dead node's databases wait
    /// before another node takes them over.
    #[arg(long, env = "KURA_LEASE_TTL", default_value_t = 5, value_parser = clap::value_parser!(u64).range(2..=300), help_heading = "Cluster")]
    lease_ttl: u64,
    /// When a D1 commit is acknowledged: `rpo0` once the store holds it, `async` once it is
    /// fsynced here (then shipped every --ship-interval-ms: a failover loses up to that).
    #[arg(long, env = "KURA_DURABILITY", value_enum, default_value = "rpo0", help_heading = "Cluster")]
    durability: DurabilityMode,
    /// In `--durability async`, how often the log ships: the RPO.
    #[arg(long, env = "KURA_SHIP_INTERVAL_MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=600_000), help_heading = "Cluster")]
    ship_interval_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DurabilityMode {
    /// Acknowledged once the store holds the commit (RPO 0).
    Rpo0,
    /// Acknowledged after the local fsync; shipped in the background.
    Async,
}

/// A node joined to its cluster.
pub struct Joined {
    pub storage: SharedStorage,
    pub coordinator: Arc<dyn Coordinator>,
    pub member: Member,
    /// What nodes prove requests they send each other with: derived from the store's secret,
    /// which every node holds and no client does.
    pub forwarding_key: [u8; 32],
}

impl ClusterArgs {
    pub fn durability(&self) -> kura_cluster::placement::Durability {
        match self.durability {
            DurabilityMode::Rpo0 => kura_cluster::placement::Durability::Shipped,
            DurabilityMode::Async => {
                kura_cluster::placement::Durability::Local(Duration::from_millis(self.ship_interval_ms))
            }
        }
    }

    pub fn enabled(&self) -> bool {
        self.cluster_store.is_some()
    }

    /// The store, for messages.
    pub fn store_description(&self) -> String {
        let store = self.cluster_store.as_deref().unwrap_or_default();
        match &self.cluster_store_endpoint {
            Some(endpoint) => format!("{store} at {endpoint}"),
            None => store.to_owned(),
        }
    }

    /// Connects to the store and the coordinator and joins as this node.
    pub async fn join(&self, api: &std::net::SocketAddr, s3: &std::net::SocketAddr) -> anyhow::Result<Joined> {
        let store = self.cluster_store.as_deref().expect("cluster mode is on");
        let location = store
            .strip_prefix("s3://")
            .with_context(|| format!("--cluster-store {store}: expected s3://<bucket>[/<prefix>]"))?;
        let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
        if bucket.is_empty() {
            bail!("--cluster-store {store}: no bucket named");
        }
        let (Some(access_key_id), Some(secret_access_key)) =
            (&self.cluster_store_access_key_id, &self.cluster_store_secret_access_key)
        else {
            bail!(
                "a cluster store needs credentials: set KURA_CLUSTER_STORE_ACCESS_KEY_ID and KURA_CLUSTER_STORE_SECRET_ACCESS_KEY"
            );
        };
        let Some(node) = self.node_id.clone() else {
            bail!("a cluster node needs a name: set --node-id (or KURA_NODE_ID)");
        };
        if node.is_empty() || !node.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
            bail!("--node-id {node}: use letters, digits, '-', '_' or '.'");
        }
        let storage: SharedStorage = Arc::new(
            RemoteStorage::s3(&S3Config {
                endpoint: self.cluster_store_endpoint.clone(),
                bucket: bucket.to_owned(),
                prefix: prefix.trim_matches('/').to_owned(),
                region: self.cluster_store_region.clone(),
                access_key_id: access_key_id.clone(),
                secret_access_key: secret_access_key.clone(),
            })
            .context("configuring the cluster store")?,
        );
        let ttl = Duration::from_secs(self.lease_ttl);
        let kind = self.coordinator.unwrap_or(if self.etcd.is_empty() {
            CoordinatorKind::Store
        } else {
            CoordinatorKind::Etcd
        });
        let coordinator: Arc<dyn Coordinator> = match kind {
            CoordinatorKind::Etcd => {
                if self.etcd.is_empty() {
                    bail!("the etcd coordinator needs its URLs: set --etcd (or KURA_ETCD)");
                }
                let prefix = format!("/kura/{}", self.cluster_name);
                Arc::new(EtcdCoordinator::new(EtcdClient::new(self.etcd.clone()), &prefix, ttl))
            }
            CoordinatorKind::Store => {
                let outcome = kura_cluster::probe_conditional_writes(&*storage)
                    .await
                    .context("probing the cluster store's conditional writes")?;
                if let Some(refusal) = outcome.refusal(&*storage) {
                    bail!("{refusal}");
                }
                Arc::new(StoreCoordinator::new(storage.clone(), ttl))
            }
        };
        if self.advertise.is_none() && api.ip().is_unspecified() {
            bail!(
                "--listen {api} does not say where other nodes reach this one: set --advertise http://<host>:{}",
                api.port()
            );
        }
        if self.advertise_s3.is_none() && s3.ip().is_unspecified() {
            bail!(
                "--s3-listen {s3} does not say where other nodes reach this one: set --advertise-s3 http://<host>:{}",
                s3.port()
            );
        }
        let mut incarnation = [0u8; 8];
        getrandom::fill(&mut incarnation).expect("the system has randomness");
        let member = Member {
            node,
            incarnation: hex::encode(incarnation),
            api: self.advertise.clone().unwrap_or_else(|| format!("http://{api}")).trim_end_matches('/').to_owned(),
            s3: self.advertise_s3.clone().unwrap_or_else(|| format!("http://{s3}")).trim_end_matches('/').to_owned(),
        };
        wait_for_name(&*coordinator, &member.node, ttl).await?;
        coordinator
            .join(member.clone())
            .await
            .with_context(|| format!("joining the cluster through {}", coordinator.describe()))?;
        let forwarding_key = {
            use sha2::Digest;
            let mut hash = sha2::Sha256::new();
            hash.update(b"kura forwarding key\0");
            hash.update(secret_access_key.as_bytes());
            hash.update(b"\0");
            hash.update(self.cluster_name.as_bytes());
            hash.finalize().into()
        };
        Ok(Joined { storage, coordinator, member, forwarding_key })
    }
}

/// Waits until no live member holds the name `node`: an earlier run of this node that died
/// leaves its announcement until its session ends (etcd: the TTL; the store: three TTLs); a
/// process still running under the name is refused, since two members of one name would take
/// each other's place.
async fn wait_for_name(coordinator: &dyn Coordinator, node: &str, ttl: Duration) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + 3 * ttl + Duration::from_secs(1);
    let mut said = false;
    loop {
        let members = coordinator.members().await.context("listing the cluster's members")?;
        let Some(holder) = members.into_iter().find(|m| m.node == node) else { return Ok(()) };
        if std::time::Instant::now() >= deadline {
            bail!(
                "another kura runs as node {node} (its API at {}): stop it first, or give this one another --node-id",
                holder.api
            );
        }
        if !said {
            eprintln!(
                "node {node} is still announced (an earlier run, at {}); waiting for its session to end…",
                holder.api
            );
            said = true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `kura serve`'s answer to `kura node status`: the members the coordinator knows and what this
/// node owns.
pub struct NodeStatus {
    pub joined: Arc<Joined>,
    /// One per kind of file (D1 databases, R2 buckets).
    pub placements: Vec<Arc<kura_cluster::ClusterPlacement>>,
    /// This node's copies of D1 databases other nodes own.
    pub replicas: kura_cluster::ClusterReplicas,
}

#[async_trait::async_trait]
impl kura_server::ClusterStatus for NodeStatus {
    async fn drain(&self) -> serde_json::Value {
        tracing::info!("draining: giving every database, bucket and namespace up");
        for placement in &self.placements {
            placement.drain().await;
        }
        self.status().await
    }

    async fn member_api(&self, node: &str) -> Option<String> {
        let members = self.joined.coordinator.members().await.ok()?;
        members.into_iter().find(|m| m.node == node).map(|m| m.api)
    }

    async fn members(&self) -> Vec<(String, String)> {
        let members = self.joined.coordinator.members().await.unwrap_or_default();
        members.into_iter().map(|m| (m.node, m.api)).collect()
    }

    async fn metrics(&self) -> String {
        use kura_server::metrics::family;
        let mut out = String::new();
        let members = self.joined.coordinator.members().await.map(|m| m.len() as f64).unwrap_or(f64::NAN);
        family(
            &mut out,
            "kura_cluster_members",
            "gauge",
            "Live members the coordinator knows.",
            &[(String::new(), members)],
        );
        let draining = self.placements.iter().any(|p| p.is_draining());
        family(
            &mut out,
            "kura_cluster_draining",
            "gauge",
            "Whether this node is draining (takes nothing, gave everything up).",
            &[(String::new(), f64::from(u8::from(draining)))],
        );
        let figures: Vec<(String, kura_cluster::placement::Figures)> =
            self.placements.iter().map(|p| (format!("{{kind=\"{}\"}}", p.kind().name()), p.figures())).collect();
        let per_kind = |value: &dyn Fn(&kura_cluster::placement::Figures) -> f64| -> Vec<(String, f64)> {
            figures.iter().map(|(labels, f)| (labels.clone(), value(f))).collect()
        };
        family(&mut out, "kura_cluster_owned", "gauge", "Files this node owns now.", &per_kind(&|f| f.owned as f64));
        family(
            &mut out,
            "kura_cluster_store_puts_total",
            "counter",
            "Objects this node's ownerships wrote to the store (history segments and snapshots).",
            &per_kind(&|f| f.puts as f64),
        );
        family(
            &mut out,
            "kura_cluster_shipments_total",
            "counter",
            "Manifest entries this node's ownerships published, one per shipped group commit.",
            &per_kind(&|f| f.shipments as f64),
        );
        family(
            &mut out,
            "kura_cluster_takeovers_total",
            "counter",
            "Ownerships this node took, each rebuilding the file from the store.",
            &per_kind(&|f| f.takeovers as f64),
        );
        family(
            &mut out,
            "kura_cluster_shipping_lag_seconds",
            "gauge",
            "In --durability async, how long the oldest commit not yet in the store has waited (what a failover would lose now).",
            &per_kind(&|f| f.shipping_lag.as_secs_f64()),
        );
        let replicas = kura_sqlite::ReadReplicas::figures(&self.replicas);
        let per_replica = |value: &dyn Fn(&kura_sqlite::ReplicaFigures) -> f64| -> Vec<(String, f64)> {
            replicas.iter().map(|r| (format!("{{database=\"{}\"}}", r.key), value(r))).collect()
        };
        family(
            &mut out,
            "kura_d1_replica_position",
            "gauge",
            "The history position of this node's copy of a D1 database another node owns.",
            &per_replica(&|r| r.position as f64),
        );
        family(
            &mut out,
            "kura_d1_replica_lag_seconds",
            "gauge",
            "How long since this node's copy of a D1 database last held everything its owner had shipped.",
            &per_replica(&|r| r.behind.map_or(f64::NAN, |b| b.as_secs_f64())),
        );
        out
    }

    async fn status(&self) -> serde_json::Value {
        let members = match self.joined.coordinator.members().await {
            Ok(members) => serde_json::json!(
                members
                    .iter()
                    .map(|m| serde_json::json!({ "node": m.node, "api": m.api, "incarnation": m.incarnation }))
                    .collect::<Vec<_>>()
            ),
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        };
        let owned = |kind| {
            let placement = self.placements.iter().find(|p| p.kind() == kind);
            placement.map(|p| p.owned()).unwrap_or_default()
        };
        let describe = |owned: Vec<kura_cluster::placement::Owned>| -> Vec<serde_json::Value> {
            owned
                .into_iter()
                .map(|d| {
                    let id = d.resource.split_once('/').map_or(d.resource.as_str(), |(_, id)| id).to_owned();
                    serde_json::json!({
                        "id": id,
                        "resource": d.resource,
                        "epoch": d.epoch,
                        "lease_remaining_ms": d.lease_remaining.as_millis() as u64,
                        "puts": d.puts,
                        "shipments": d.shipments,
                        "shipping_lag_ms": d.shipping_lag.as_millis() as u64,
                    })
                })
                .collect()
        };
        serde_json::json!({
            "draining": self.placements.iter().any(|p| p.is_draining()),
            "node": self.joined.member.node,
            "incarnation": self.joined.member.incarnation,
            "coordinator": self.joined.coordinator.describe(),
            "members": members,
            "databases": describe(owned(kura_cluster::Kind::D1)),
            "buckets": describe(owned(kura_cluster::Kind::R2)),
            "namespaces": describe(owned(kura_cluster::Kind::DoNamespace)),
            "objects": describe(owned(kura_cluster::Kind::DoObject)),
            "kv_namespaces": describe(owned(kura_cluster::Kind::Kv)),
            "queues": describe(owned(kura_cluster::Kind::Queue)),
            "replicas": kura_sqlite::ReadReplicas::figures(&self.replicas)
                .into_iter()
                .map(|r| serde_json::json!({
                    "id": r.key,
                    "position": r.position,
                    "lag_ms": r.behind.map(|b| b.as_millis() as u64),
                }))
                .collect::<Vec<_>>(),
        })
    }
}

#[derive(clap::Subcommand)]
pub enum NodeCommand {
    /// The node's members, the D1 databases, R2 buckets and Durable Object namespaces and
    /// objects it owns, their lease ages and what each has shipped.
    Status {
        /// Print the JSON the node answers.
        #[arg(long)]
        json: bool,
    },
    /// Give every database, bucket and namespace the node owns up to the other nodes, and take
    /// none from now on (before stopping it for maintenance).
    Drain {
        /// Print the JSON the node answers.
        #[arg(long)]
        json: bool,
    },
}

pub async fn run_node(command: NodeCommand) -> anyhow::Result<()> {
    let api = kura_client::ApiClient::from_env().await?;
    let (status, json) = match command {
        NodeCommand::Status { json } => {
            (api.call(reqwest::Method::GET, &api.account_path("/kura/cluster"), None).await?, json)
        }
        NodeCommand::Drain { json } => {
            (api.call(reqwest::Method::POST, &api.account_path("/kura/cluster/drain"), None).await?, json)
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(());
    }
    let draining = if status["draining"] == true { ", draining" } else { "" };
    println!(
        "node {} ({}{draining})",
        status["node"].as_str().unwrap_or("?"),
        status["coordinator"].as_str().unwrap_or("?")
    );
    println!("members:");
    for member in status["members"].as_array().into_iter().flatten() {
        println!("  {:<16} {}", member["node"].as_str().unwrap_or("?"), member["api"].as_str().unwrap_or("?"));
    }
    for (field, title) in [
        ("databases", "owned D1 databases"),
        ("buckets", "owned R2 buckets (metadata)"),
        ("namespaces", "owned Durable Object namespaces (index)"),
        ("objects", "owned Durable Objects"),
        ("kv_namespaces", "owned KV namespaces"),
        ("queues", "owned queues"),
    ] {
        let owned = status[field].as_array().cloned().unwrap_or_default();
        println!("{title}: {}", owned.len());
        for d in owned {
            println!(
                "  {}  epoch {:<8} lease {:>5} ms left  {} objects in {} shipments",
                d["id"].as_str().unwrap_or("?"),
                d["epoch"],
                d["lease_remaining_ms"],
                d["puts"],
                d["shipments"]
            );
        }
    }
    let replicas = status["replicas"].as_array().cloned().unwrap_or_default();
    println!("D1 read replicas here: {}", replicas.len());
    for r in replicas {
        let lag = r["lag_ms"].as_u64().map_or("being built".to_owned(), |ms| format!("current {ms} ms ago"));
        println!("  {}  position {:<10} {lag}", r["id"].as_str().unwrap_or("?"), r["position"]);
    }
    if let Some(running) = status["workers"]["running"].as_array() {
        println!(
            "Workers running here: {} ({} Cron Trigger runs started here)",
            running.len(),
            status["workers"]["cron_runs"].as_u64().unwrap_or(0)
        );
        for w in running {
            println!(
                "  {:<32} version {}",
                w["script"].as_str().unwrap_or("?"),
                w["version_id"].as_str().unwrap_or("?")
            );
        }
        let namespaces = status["workers"]["object_namespaces"].as_array().cloned().unwrap_or_default();
        println!("JavaScript Durable Object namespaces whose objects run here: {}", namespaces.len());
        for n in namespaces {
            println!(
                "  {}  {}.{}",
                n["id"].as_str().unwrap_or("?"),
                n["script"].as_str().unwrap_or("?"),
                n["class"].as_str().unwrap_or("?")
            );
        }
        let schedules = status["workers"]["schedules"].as_array().cloned().unwrap_or_default();
        println!("Cron Triggers (each minute claimed by the first node to reach it): {}", schedules.len());
        for s in schedules {
            let last = s["last_minute"].as_i64().map_or("never run".to_owned(), |m| format!("last ran for minute {m}"));
            println!("  {:<32} {:<16} {last}", s["script"].as_str().unwrap_or("?"), s["cron"].as_str().unwrap_or("?"));
        }
    }
    Ok(())
}

/// The cluster's store as the Workers layer keeps versions' files in it.
#[derive(Debug)]
pub struct StoreFiles(pub SharedStorage);

fn io_error(e: kura_cluster::StorageError) -> std::io::Error {
    match e {
        kura_cluster::StorageError::NotFound { .. } => std::io::Error::new(std::io::ErrorKind::NotFound, e.to_string()),
        other => std::io::Error::other(other.to_string()),
    }
}

#[async_trait::async_trait]
impl kura_workers::SharedFiles for StoreFiles {
    async fn put(&self, name: &str, bytes: bytes::Bytes) -> std::io::Result<()> {
        match self.0.put(name, bytes, kura_cluster::PutMode::New).await {
            // Each name holds one content: whoever wrote it first wrote the same bytes.
            Ok(_) | Err(kura_cluster::StorageError::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(io_error(e)),
        }
    }

    async fn get(&self, name: &str) -> std::io::Result<bytes::Bytes> {
        self.0.get(name).await.map(|(bytes, _)| bytes).map_err(io_error)
    }

    async fn delete(&self, name: &str) -> std::io::Result<()> {
        self.0.delete(name).await.map_err(io_error)
    }

    async fn exists(&self, name: &str) -> std::io::Result<bool> {
        match self.0.head(name).await {
            Ok(_) => Ok(true),
            Err(kura_cluster::StorageError::NotFound { .. }) => Ok(false),
            Err(e) => Err(io_error(e)),
        }
    }
}
