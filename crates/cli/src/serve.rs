//! `kura serve`: opens the data directory, makes sure there is an account and a token to use,
//! binds the listeners and serves until interrupted.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use kura_server::{CredentialsConfig, Node, NodeSettings};
use tokio::net::TcpListener;

use crate::DataArgs;
use crate::cluster::{ClusterArgs, Joined};

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    data: DataArgs,
    /// Address of the Cloudflare v4 API listener.
    #[arg(long, env = "KURA_LISTEN", default_value = "127.0.0.1:8780")]
    listen: SocketAddr,
    /// Address of the S3 listener.
    #[arg(long, env = "KURA_S3_LISTEN", default_value = "127.0.0.1:8781")]
    s3_listen: SocketAddr,
    /// Use exactly this account id (created if missing).
    #[arg(long, env = "KURA_ACCOUNT_ID", hide_env_values = true)]
    account_id: Option<String>,
    /// Make this secret an admin API token of the account.
    #[arg(long, env = "KURA_API_TOKEN", hide_env_values = true)]
    api_token: Option<String>,
    /// Make this access key id (with --s3-secret-access-key) a read-write S3 key of the account.
    #[arg(long, env = "KURA_S3_ACCESS_KEY_ID", hide_env_values = true, requires = "s3_secret_access_key")]
    s3_access_key_id: Option<String>,
    /// The secret of --s3-access-key-id.
    #[arg(long, env = "KURA_S3_SECRET_ACCESS_KEY", hide_env_values = true, requires = "s3_access_key_id")]
    s3_secret_access_key: Option<String>,
    /// Serve buckets virtual-hosted style at `<bucket>.<DOMAIN>` (repeat, or comma-separate in
    /// the environment); other hosts are path-style.
    #[arg(long = "s3-domain", env = "KURA_S3_DOMAIN", value_delimiter = ',')]
    s3_domains: Vec<String>,
    /// Address of the listener that serves deployed Workers (routed by host: `<name>.localhost`).
    #[arg(long, env = "KURA_WORKERS_LISTEN", default_value = "127.0.0.1:8787")]
    workers_listen: SocketAddr,
    /// Serve Workers at `<name>.<DOMAIN>` too (repeat, or comma-separate in the environment).
    #[arg(long = "workers-domain", env = "KURA_WORKERS_DOMAIN", value_delimiter = ',')]
    workers_domains: Vec<String>,
    /// The workerd binary Workers run in (default: node_modules/workerd/bin/workerd here or in a
    /// directory above, else the pinned build kura fetches into the data directory on the first
    /// deploy; when named, nothing is fetched).
    #[arg(long, env = "KURA_WORKERD")]
    workerd: Option<std::path::PathBuf>,
    /// Serve Miniflare's /cdn-cgi/handler/scheduled (and wrangler's /__scheduled) on the Workers
    /// listener, to run a Worker's `scheduled` handler by URL: for development and tests only
    /// (anyone who reaches the listener can run it).
    #[arg(long, env = "KURA_TEST_SCHEDULED")]
    test_scheduled: bool,
    /// Days of history Time Travel keeps restorable.
    #[arg(long, env = "KURA_TIME_TRAVEL_DAYS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3650))]
    time_travel_days: u64,
    /// Time Travel restores allowed per database in 10 minutes (D1's limit is 10; a test
    /// environment that restores often may raise it).
    #[arg(long, env = "KURA_D1_MAX_RESTORES", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    d1_max_restores: u64,
    #[command(flatten)]
    cluster: ClusterArgs,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let mut settings = NodeSettings { s3_domains: args.s3_domains.clone(), ..NodeSettings::default() };
    if let Some(history) = settings.d1.history.as_mut() {
        history.retention = std::time::Duration::from_secs(args.time_travel_days * 24 * 3600);
    }
    settings.d1.max_restores = args.d1_max_restores as usize;
    let api = TcpListener::bind(args.listen).await.with_context(|| format!("cannot listen on {}", args.listen))?;
    let s3 = TcpListener::bind(args.s3_listen).await.with_context(|| format!("cannot listen on {}", args.s3_listen))?;
    let joined = match args.cluster.enabled() {
        true => Some(args.cluster.join(&api.local_addr()?, &s3.local_addr()?).await?),
        false => None,
    };
    let mut placements = Vec::new();
    let mut replicas = None;
    if let Some(Joined { storage, coordinator, member, .. }) = &joined {
        let placement = |kind| {
            Arc::new(kura_cluster::ClusterPlacement::new(
                kind,
                storage.clone(),
                Arc::clone(coordinator),
                member.clone(),
                args.cluster.durability(),
            ))
        };
        let (d1, r2) = (placement(kura_cluster::Kind::D1), placement(kura_cluster::Kind::R2));
        let (namespaces, objects) =
            (placement(kura_cluster::Kind::DoNamespace), placement(kura_cluster::Kind::DoObject));
        settings.d1.placement = Some(d1.clone());
        let copies = kura_cluster::ClusterReplicas::new(
            kura_cluster::Kind::D1,
            storage.clone(),
            Arc::clone(coordinator),
            args.data.data.join("replicas").join("d1"),
        );
        settings.d1.replicas = Some(Arc::new(copies.clone()));
        replicas = Some(copies);
        settings.r2.shared =
            Some(kura_r2::Shared { placement: r2.clone(), blobs: kura_cluster::StoreBlobs::new(storage.clone()) });
        settings.durable_objects.cluster =
            Some(kura_do::DoCluster { namespaces: namespaces.clone(), objects: objects.clone() });
        let kv = placement(kura_cluster::Kind::Kv);
        settings.kv_shared =
            Some(kura_r2::Shared { placement: kv.clone(), blobs: kura_cluster::StoreBlobs::new(storage.clone()) });
        let queues = placement(kura_cluster::Kind::Queue);
        settings.queue_placement = Some(queues.clone());
        placements = vec![d1, r2, namespaces, objects, kv, queues];
        let catalog_path = args.data.data.join("catalog.sqlite");
        settings.catalog_replication = Some(Arc::new(kura_cluster::catalog::SharedCatalog::new(
            storage.clone(),
            Arc::clone(coordinator),
            &catalog_path,
        )));
    }
    let joined = joined.map(Arc::new);
    if let Some(joined) = &joined {
        let replicas = replicas.clone().expect("a cluster node keeps read replicas");
        let status =
            crate::cluster::NodeStatus { joined: Arc::clone(joined), placements: placements.clone(), replicas };
        settings.forwarding =
            Some(kura_server::Forwarding::new(&joined.member.node, Arc::new(status), &joined.forwarding_key));
    }
    let cluster_node = joined.as_ref().map(|j| (j.member.node.clone(), args.cluster.store_description()));
    crate::membership::claim_directory(&args.data.data, cluster_node.as_ref().map(|(n, s)| (n.as_str(), s.as_str())))?;
    if let Some(replicas) = &replicas {
        replicas.remove_leftovers().context("removing the read replicas of an earlier run")?;
    }
    let node = Node::open(&args.data.data, settings)?;
    let credentials = CredentialsConfig {
        account_id: args.account_id.clone(),
        api_token: args.api_token.clone(),
        s3_key: args.s3_access_key_id.clone().zip(args.s3_secret_access_key.clone()),
    };
    let boot = bootstrap(&node, &credentials, joined.is_some())?;
    // Without its port, the rest of kura still serves (wrangler dev may hold 8787) — but not a
    // cluster node's: the others send it their Workers' binding calls and its queues' deliveries
    // run its Workers.
    let workers = match TcpListener::bind(args.workers_listen).await {
        Ok(listener) => Some(listener),
        Err(e) if joined.is_some() => {
            bail!(
                "cannot listen on {} for Workers ({e}); a cluster node serves Workers: choose another address with --workers-listen",
                args.workers_listen
            )
        }
        Err(e) => {
            tracing::warn!(
                "cannot listen on {} for Workers ({e}); Workers are not served: choose another address with --workers-listen",
                args.workers_listen
            );
            None
        }
    };
    let workers_url = match &workers {
        Some(listener) => format!("http://{} (as <name>.localhost)", listener.local_addr()?),
        None => "not served (see the warning above)".to_owned(),
    };
    let api_url = format!("http://{}/client/v4", api.local_addr()?);
    let s3_url = format!("http://{}", s3.local_addr()?);

    println!("kura {} serving {}", env!("CARGO_PKG_VERSION"), node.dir().display());
    println!("  console:             http://{}/console/", api.local_addr()?);
    println!("  API (Cloudflare v4): {api_url}");
    println!("  S3:                  {s3_url}");
    println!("  Workers:             {workers_url}");
    println!("  account:             {}", boot.account.id);
    if let Some(joined) = &joined {
        println!(
            "  cluster:             node {} through {}, data in {}",
            joined.member.node,
            joined.coordinator.describe(),
            args.cluster.store_description()
        );
    }
    if let Some(secret) = &boot.new_token {
        println!();
        println!("Created an admin API token; it is shown only this once:");
        println!("  {secret}");
        println!();
        println!("Point wrangler at kura with:");
        println!("  export CLOUDFLARE_API_BASE_URL={api_url}");
        println!("  export CLOUDFLARE_ACCOUNT_ID={}", boot.account.id);
        println!("  export CLOUDFLARE_API_TOKEN={secret}");
        if let Some(token) = node.catalog().authenticate(secret)?
            && let Some(key) = node.catalog().s3_credential(&token.id)?
        {
            println!();
            println!("and the AWS CLI or SDKs at its S3 listener (R2 derives S3 keys from tokens the same way) with:");
            println!("  export AWS_ACCESS_KEY_ID={}", key.access_key_id);
            println!("  export AWS_SECRET_ACCESS_KEY={}", key.secret_access_key);
            println!("  export AWS_DEFAULT_REGION=auto AWS_ENDPOINT_URL={s3_url}");
        }
    }
    println!("ready");

    let workers_settings = kura_workers::WorkersSettings {
        runtime: kura_workers::RuntimeSettings { workerd: args.workerd.clone(), ..Default::default() },
        domains: args.workers_domains.clone(),
        offline: false,
        test_scheduled: args.test_scheduled,
        shared: joined
            .as_ref()
            .map(|j| Arc::new(crate::cluster::StoreFiles(j.storage.clone())) as Arc<dyn kura_workers::SharedFiles>),
    };
    let listeners = kura_server::Listeners { api, s3, workers };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let follower = joined.as_ref().map(|_| {
        tokio::spawn(kura_cluster::catalog::follow(
            Arc::clone(node.catalog()),
            Duration::from_millis(250),
            stopped(stop_rx.clone()),
        ))
    });
    let signal = async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    };
    kura_server::serve_all(node, listeners, workers_settings, signal).await?;
    if let Some(follower) = follower {
        let _ = follower.await;
    }
    if let Some(joined) = &joined {
        // Handing the files over now spares the other nodes a lease's wait.
        for placement in &placements {
            placement.release_all().await;
        }
        if let Err(e) = joined.coordinator.leave().await {
            tracing::warn!(error = %e, "could not leave the cluster; its leases end with their TTL");
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// Bootstraps the credentials; in a cluster, nodes starting together may race to create the
/// same account or token, and the loser finds the winner's on a second look.
fn bootstrap(node: &Node, credentials: &CredentialsConfig, clustered: bool) -> anyhow::Result<kura_server::Bootstrap> {
    let attempts = if clustered { 5 } else { 1 };
    let mut attempt = 1;
    loop {
        match node.bootstrap(credentials) {
            Ok(boot) => return Ok(boot),
            Err(e) if attempt < attempts => {
                tracing::info!(error = %e, "bootstrapping the cluster's credentials again");
                std::thread::sleep(Duration::from_millis(100 * attempt));
                node.catalog().refresh()?;
                attempt += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
    tracing::info!("shutting down");
}
