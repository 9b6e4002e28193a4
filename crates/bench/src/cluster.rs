//! The scale-out suite: durable D1-style INSERTs with every commit shipped to a three-node
//! Garage (fsync on) under etcd ownership before it is acknowledged (RPO 0), beside the same
//! engine on one node (no shipping) and beside the limit for RPO 0 — one PUT to Garage per
//! commit — measured in the same run; PUTs per commit; and how long a takeover of a 100 MiB
//! database takes — all of it through the engine in-process (no HTTP on either side), so the
//! ratios isolate what shipping costs; then D1 over HTTP through two `kura serve` cluster
//! nodes (the owner, and another that forwards to it) beside one single-node server; and R2's
//! 1 MiB PUT and GET through those nodes beside the same requests sent to Garage itself.

use anyhow::Context;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kura_cluster::{
    Acquired, Coordinator, EtcdClient, EtcdCoordinator, HistoryShipper, Member, PutMode, SharedStorage, Shipped,
    rebuild,
};
use kura_sqlite::{DatabaseOptions, HistorySettings, Registry, RegistrySettings, Request, Statement, Value};
use kura_testkit::bed::{Etcd, Garage};

use crate::Settings;
use crate::load::{self, Stats};
use kura_testkit::process::KuraProcess;

fn member(node: &str) -> Member {
    Member {
        node: node.into(),
        incarnation: format!("{node}-{}", std::process::id()),
        api: String::new(),
        s3: String::new(),
    }
}

async fn acquire(coordinator: &dyn Coordinator, resource: &str) -> anyhow::Result<kura_cluster::Lease> {
    loop {
        match coordinator.acquire(resource).await? {
            Acquired::Owned(lease) => return Ok(lease),
            Acquired::Held(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

fn registry(db: &Path, identity: &str, shipper: Option<Arc<HistoryShipper>>) -> Registry {
    let (db, identity) = (db.to_owned(), identity.to_owned());
    Registry::new(RegistrySettings::default(), move |_| {
        let options = DatabaseOptions::new(&db).create(true).history(HistorySettings::default(), &identity);
        Some(match &shipper {
            Some(shipper) => options.shipper(shipper.clone()),
            None => options,
        })
    })
}

async fn insert(registry: &Registry, id: i64) {
    let statement =
        Statement::with_params("INSERT INTO t VALUES (?1, ?2)", vec![Value::Integer(id), Value::Text("x".repeat(100))]);
    registry.execute("db", Request::new(vec![statement])).await.expect("insert");
}

async fn inserts(registry: &Registry, clients: usize, seconds: f64) -> Stats {
    registry
        .execute(
            "db",
            Request::new(vec![Statement::new("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT)")]),
        )
        .await
        .expect("create");
    let registry = registry.clone();
    let base = Instant::now().elapsed().as_nanos() as i64 + rand_base();
    load::run(clients, Duration::from_secs_f64(seconds), move |client, n| {
        let registry = registry.clone();
        async move {
            insert(&registry, base + (client as i64) * 100_000_000 + n as i64).await;
            1
        }
    })
    .await
}

fn rand_base() -> i64 {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).expect("randomness");
    (u32::from_le_bytes(b) as i64) << 30
}

async fn puts(storage: &SharedStorage, clients: usize, seconds: f64) -> Stats {
    let storage = storage.clone();
    let body = Bytes::from(vec![7u8; 1024]);
    load::run(clients, Duration::from_secs_f64(seconds), move |client, n| {
        let (storage, body) = (storage.clone(), body.clone());
        async move {
            storage.put(&format!("limit/{client}/{n}"), body, PutMode::New).await.expect("put");
            1
        }
    })
    .await
}

struct Shipping {
    registry: Registry,
    shipper: Arc<HistoryShipper>,
}

async fn shipping(
    storage: &SharedStorage,
    coordinator: &Arc<EtcdCoordinator>,
    resource: &str,
    dir: &Path,
) -> anyhow::Result<Shipping> {
    let lease = acquire(&**coordinator, resource).await?;
    let db = dir.join(resource.replace('/', "-")).join("db.sqlite");
    std::fs::create_dir_all(db.parent().expect("a folder"))?;
    let shipped = rebuild(storage, &**coordinator, resource, &db).await?;
    let shipper = Arc::new(HistoryShipper::new(storage.clone(), coordinator.clone(), lease, shipped));
    Ok(Shipping { registry: registry(&db, resource, Some(shipper.clone())), shipper })
}

fn line(what: &str, stats: &Stats, against: &[(&str, f64, Option<f64>)]) {
    let mut text = format!(
        "{what:<44} {:>8.0}/s  p50 {:>6.2} ms  p99 {:>6.2} ms",
        stats.rate(),
        stats.p50.as_secs_f64() * 1e3,
        stats.p99.as_secs_f64() * 1e3
    );
    for (name, other, target) in against {
        let ratio = stats.rate() / other;
        let verdict = match target {
            Some(t) if ratio >= *t => format!(" (target {t}× ✓)"),
            Some(t) => format!(" (target {t}× ✗)"),
            None => String::new(),
        };
        text.push_str(&format!("  {ratio:.2}× {name}{verdict}"));
    }
    println!("{text}");
}

pub fn run(settings: &Settings) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(run_async(settings))
}

async fn run_async(settings: &Settings) -> anyhow::Result<()> {
    eprintln!("starting a three-member etcd and a three-node Garage (replication 3, fsync on)…");
    let (etcd, garage) = (Etcd::start(), Garage::start());
    let scratch = settings.scratch_dir()?;
    let storage: SharedStorage = Arc::new(garage.storage(0, "bench"));
    let ttl = Duration::from_secs(5);
    let coordinator = Arc::new(EtcdCoordinator::new(EtcdClient::new(etcd.endpoints.clone()), "/kura/bench", ttl));
    coordinator.join(member("a")).await?;
    let seconds = settings.seconds;

    let wanted = |part: &str| settings.only.is_empty() || settings.only.iter().any(|o| o == part);
    eprintln!("measuring…");
    let mut rows = Vec::new();
    for clients in [64usize, 16, 1].into_iter().filter(|_| wanted("engine")) {
        let single = registry(&scratch.path().join(format!("single-{clients}/db.sqlite")), "single", None);
        std::fs::create_dir_all(scratch.path().join(format!("single-{clients}")))?;
        let single_stats = inserts(&single, clients, seconds).await;
        single.shutdown().await;
        let limit = puts(&storage, clients, seconds).await;
        let shipped = shipping(&storage, &coordinator, &format!("d1/bench-{clients}"), scratch.path()).await?;
        let before = shipped.shipper.counts();
        let rpo0 = inserts(&shipped.registry, clients, seconds).await;
        let after = shipped.shipper.counts();
        shipped.registry.shutdown().await;
        let commits = rpo0.units.max(1) as f64;
        rows.push((
            clients,
            single_stats,
            limit,
            rpo0,
            (after.0 - before.0) as f64 / commits,
            (after.1 - before.1) as f64 / commits,
        ));
    }

    if !rows.is_empty() {
        println!();
        println!(
            "Scale-out: durable INSERTs, RPO 0 (each commit's records a Garage object and an etcd manifest entry before the answer)"
        );
        println!(
            "store: Garage 2.5.0 ×3 on loopback, replication 3, data_fsync and metadata_fsync on; coordinator: etcd 3.4 ×3"
        );
        println!(
            "single node = the same engine with no shipping; PUT per commit = one 1 KiB PUT to Garage per operation, the RPO-0 limit without group commit"
        );
    }
    for (clients, single, limit, rpo0, puts_per_commit, entries_per_commit) in &rows {
        let target_single = (*clients == 16).then_some(0.5);
        let target_limit = (*clients == 16).then_some(3.0);
        // In a closed loop every commit waits for at least one PUT and one manifest commit, so
        // `clients` clients can never exceed clients / (PUT latency + etcd commit latency).
        line(&format!("single node, {clients} client(s)"), single, &[]);
        line(&format!("PUT per commit to Garage, {clients} client(s)"), limit, &[]);
        line(
            &format!("RPO 0 through one node, {clients} client(s)"),
            rpo0,
            &[("single node", single.rate(), target_single), ("PUT per commit", limit.rate(), target_limit)],
        );
        println!("{:<44} {puts_per_commit:.3} PUTs and {entries_per_commit:.3} manifest entries per commit", "");
    }

    if wanted("takeover") {
        takeover(settings, &etcd, &garage, &storage, ttl, scratch.path()).await?;
    }
    if wanted("d1") {
        through_nodes(settings, &etcd, &garage).await?;
    }
    if wanted("r2") {
        r2_through_nodes(settings, &etcd, &garage, &storage).await?;
    }
    if wanted("workers") {
        workers_through_nodes(settings, &etcd, &garage).await?;
    }
    Ok(())
}

/// The Worker of the Workers part: one D1 point SELECT per request.
const SELECT_WORKER: &str = r#"export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const i = Number(url.searchParams.get("i") ?? 0);
    const db = url.pathname === "/session" ? env.DB.withSession("first-unconstrained") : env.DB;
    return Response.json(await db.prepare("SELECT * FROM kv WHERE id = ?").bind(i % 1000).first());
  },
};"#;

/// A Worker's D1 point SELECT at 16 clients through two cluster nodes' Workers listeners — the
/// database's owner, and another node, whose binding calls go to the owner — beside the same
/// Worker on one single-node server.
async fn workers_through_nodes(settings: &Settings, etcd: &Etcd, garage: &Garage) -> anyhow::Result<()> {
    let Some(workerd) = crate::workers::workerd() else {
        anyhow::bail!("no workerd: run scripts/test once (it installs wrangler's workerd), or set KURA_WORKERD");
    };
    let duration = Duration::from_secs_f64(settings.seconds);
    let workerd_arg = workerd.display().to_string();
    let extra = ["--workerd", workerd_arg.as_str()];
    let nodes = [start_node(etcd, garage, (0, "w"), &extra)?, start_node(etcd, garage, (1, "w"), &extra)?];
    let single_dir = tempfile::tempdir()?;
    let single_path = single_dir.path().to_owned();
    let single =
        tokio::task::spawn_blocking(move || crate::server::Kura::start_with_workers(&single_path, &workerd)).await??;
    let single_api = single.base.split("/client/v4").next().unwrap_or_default().to_owned();
    let owner_api = nodes[0].api.split("/client/v4").next().unwrap_or_default().to_owned();
    for api in [&single_api, &owner_api] {
        crate::workers::deploy_select_worker(api, SELECT_WORKER).await?;
    }
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build()?;
    let target = |base: &str| crate::workers::Target::new(http.clone(), base, "bench.localhost");
    let (single_target, owner, other) =
        (target(single.workers.as_deref().unwrap_or_default()), target(&nodes[0].workers), target(&nodes[1].workers));
    // The other node runs the Worker once it has followed the deploy.
    other.wait_for("/d1?i=1", "node 1 never ran the Worker deployed through node 0").await?;
    let single_stats = single_target.measure("/d1", duration).await.0;
    let via_owner = owner.measure("/d1", duration).await.0;
    let via_other = other.measure("/d1", duration).await.0;
    println!();
    println!("A Worker's D1 point SELECT through kura cluster nodes' Workers listeners, 16 clients");
    line("Worker D1 SELECT, single node", &single_stats, &[]);
    line("Worker D1 SELECT via the owner", &via_owner, &[("single node", single_stats.rate(), Some(0.8))]);
    line(
        "Worker D1 SELECT via another node",
        &via_other,
        &[("single node", single_stats.rate(), Some(0.8)), ("via the owner", via_owner.rate(), None)],
    );
    // The same read in a D1 session (`withSession("first-unconstrained")`) once the database's
    // read replication is on: the other node's read replica serves it.
    let databases = format!("{owner_api}/client/v4/accounts/{}/d1/database", crate::server::ACCOUNT);
    let listed: serde_json::Value = http.get(&databases).bearer_auth(crate::server::TOKEN).send().await?.json().await?;
    let uuid = listed["result"]
        .as_array()
        .and_then(|all| all.iter().find(|d| d["name"] == "bench-select"))
        .and_then(|d| d["uuid"].as_str())
        .context("the bench database")?
        .to_owned();
    turn_read_replication_on(&http, &format!("{databases}/{uuid}")).await?;
    other.wait_for("/session?i=1", "node 1 never answered a session read").await?;
    let single_session = single_target.measure("/session", duration).await.0;
    let other_session = other.measure("/session", duration).await.0;
    line("Worker D1 session SELECT, single node", &single_session, &[]);
    line(
        "Worker D1 session SELECT via another node",
        &other_session,
        &[("single node", single_session.rate(), Some(0.8)), ("via the owner", via_owner.rate(), None)],
    );

    // A Durable Object's RPC call: node 0 serves the namespace (the first call goes through it).
    for api in [&single_api, &owner_api] {
        crate::workers::deploy_object_worker(api, OBJECT_WORKER).await?;
    }
    let object_target = |base: &str| crate::workers::Target::new(http.clone(), base, "objects.localhost");
    let (single_target, owner, other) = (
        object_target(single.workers.as_deref().unwrap_or_default()),
        object_target(&nodes[0].workers),
        object_target(&nodes[1].workers),
    );
    for target in [&single_target, &owner, &other] {
        target.wait_for("/read?i=0", "a node never ran the Worker with the Durable Object class").await?;
    }
    println!();
    println!("A Worker's JavaScript Durable Object RPC call (64 objects, SQLite storage), 16 clients");
    for (what, path) in [("read", "/read"), ("write", "/write")] {
        let single_stats = single_target.measure(path, duration).await.0;
        let via_owner = owner.measure(path, duration).await.0;
        let via_other = other.measure(path, duration).await.0;
        line(&format!("DO RPC {what}, single node"), &single_stats, &[]);
        line(
            &format!("DO RPC {what}, on the namespace's node"),
            &via_owner,
            &[("single node", single_stats.rate(), None)],
        );
        line(
            &format!("DO RPC {what}, from another node"),
            &via_other,
            &[("single node", single_stats.rate(), None), ("on the namespace's node", via_owner.rate(), None)],
        );
    }
    drop(nodes);
    tokio::task::spawn_blocking(move || single.shutdown()).await?;
    Ok(())
}

/// The Worker of the Durable Object part: an RPC read or write of one of 64 objects per request.
const OBJECT_WORKER: &str = r#"import { DurableObject } from "cloudflare:workers";
export class Counter extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    ctx.storage.sql.exec("CREATE TABLE IF NOT EXISTS hits (n INTEGER NOT NULL)");
  }
  read() {
    return this.ctx.storage.sql.exec("SELECT count(*) AS n FROM hits").one().n;
  }
  write() {
    this.ctx.storage.sql.exec("INSERT INTO hits (n) VALUES (1)");
    return 1;
  }
}
export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const stub = env.COUNTERS.getByName(`c${Number(url.searchParams.get("i") ?? 0) % 64}`);
    return Response.json(url.pathname === "/write" ? await stub.write() : await stub.read());
  },
};"#;

/// R2 over S3 through two cluster nodes (the bucket's owner, and another that forwards to it),
/// 1 MiB PUTs and GETs at 16 clients, beside the same sizes PUT to and read from Garage directly
/// (`object_store`, as kura itself speaks to it): the blob goes to Garage and the metadata row
/// ships (RPO 0) before each PUT is answered.
async fn r2_through_nodes(
    settings: &Settings,
    etcd: &Etcd,
    garage: &Garage,
    storage: &SharedStorage,
) -> anyhow::Result<()> {
    const MIB: usize = 1024 * 1024;
    let duration = Duration::from_secs_f64(settings.seconds);
    let clients = 16;
    let nodes = [start_node(etcd, garage, (0, ""), &[])?, start_node(etcd, garage, (1, ""), &[])?];
    let (owner, forwarder) = (crate::r2::S3::new(&nodes[0].s3), crate::r2::S3::new(&nodes[1].s3));
    let created = owner.signed(reqwest::Method::PUT, &format!("/{}", crate::r2::BUCKET)).send().await?;
    anyhow::ensure!(created.status().is_success(), "creating the bucket: {}", created.status());
    let body = Bytes::from(vec![9u8; MIB]);
    let direct_put = {
        let (storage, body) = (storage.clone(), body.clone());
        load::run(clients, duration, move |c, n| {
            let (storage, body) = (storage.clone(), body.clone());
            async move {
                storage.put(&format!("direct/{c}/{}", n % 8), body, PutMode::New).await.expect("put");
                1
            }
        })
        .await
    };
    let direct_get = {
        let storage = storage.clone();
        load::run(clients, duration, move |c, n| {
            let storage = storage.clone();
            async move {
                storage.get(&format!("direct/{c}/{}", n % 8)).await.expect("get");
                1
            }
        })
        .await
    };
    // What kura asks of Garage for a GET: a streamed read of the blob's byte range.
    let direct_ranged = {
        let storage = storage.clone();
        load::run(clients, duration, move |c, n| {
            let storage = storage.clone();
            async move {
                let stream = storage.read(&format!("direct/{c}/{}", n % 8), 0..MIB as u64).await.expect("read");
                let chunks: Vec<Bytes> = futures_util::TryStreamExt::try_collect(stream).await.expect("read");
                assert_eq!(chunks.iter().map(Bytes::len).sum::<usize>(), MIB);
                1
            }
        })
        .await
    };
    let kura_put = |s3: crate::r2::S3, prefix: &'static str| {
        let body = body.clone();
        load::run(clients, duration, move |c, n| {
            let (s3, body) = (s3.clone(), body.clone());
            async move {
                s3.put(&format!("{prefix}/{c}/{}", n % 8), body).await;
                1
            }
        })
    };
    let kura_get = |s3: crate::r2::S3, prefix: &'static str| {
        load::run(clients, duration, move |c, n| {
            let s3 = s3.clone();
            async move {
                s3.get(&format!("{prefix}/{c}/{}", n % 8)).await;
                1
            }
        })
    };
    let owner_put = kura_put(owner.clone(), "owner").await;
    let owner_get = kura_get(owner.clone(), "owner").await;
    let forwarded_put = kura_put(forwarder.clone(), "forwarded").await;
    let forwarded_get = kura_get(forwarder.clone(), "forwarded").await;
    println!();
    println!("R2 over S3 through kura cluster nodes (RPO 0, etcd, Garage ×3), 1 MiB objects, {clients} clients");
    line("PUT to Garage directly", &direct_put, &[]);
    line("PUT via the bucket's owner", &owner_put, &[("Garage directly", direct_put.rate(), Some(0.8))]);
    line(
        "PUT via another node",
        &forwarded_put,
        &[("Garage directly", direct_put.rate(), None), ("via the owner", owner_put.rate(), None)],
    );
    line("GET from Garage directly", &direct_get, &[]);
    line("ranged, streamed GET from Garage directly", &direct_ranged, &[("GET", direct_get.rate(), None)]);
    line("GET via the bucket's owner", &owner_get, &[("Garage directly", direct_get.rate(), Some(0.8))]);
    line(
        "GET via another node",
        &forwarded_get,
        &[("Garage directly", direct_get.rate(), None), ("via the owner", owner_get.rate(), None)],
    );
    Ok(())
}

/// A 100 MiB database shipped, its owner gone: the next node's lease wait (the TTL: etcd ends
/// the old session) plus its rebuild from the store.
async fn takeover(
    settings: &Settings,
    etcd: &Etcd,
    garage: &Garage,
    storage: &SharedStorage,
    ttl: Duration,
    scratch: &Path,
) -> anyhow::Result<()> {
    let _ = settings;
    let resource = "d1/takeover";
    let owner = Arc::new(EtcdCoordinator::new(EtcdClient::new(etcd.endpoints.clone()), "/kura/bench", ttl));
    owner.join(member("owner")).await?;
    let shipped = shipping(storage, &owner, resource, &scratch.join("owner")).await?;
    let statement = Statement::new("CREATE TABLE big (id INTEGER PRIMARY KEY, data BLOB)");
    shipped.registry.execute("db", Request::new(vec![statement])).await?;
    let blob = vec![0x5au8; 256 * 1024];
    for i in 0..400 {
        let statement = Statement::with_params(
            "INSERT INTO big VALUES (?1, ?2)",
            vec![Value::Integer(i), Value::Blob(blob.clone())],
        );
        shipped.registry.execute("db", Request::new(vec![statement])).await?;
    }
    let size = shipped.registry.with_database("db", |db| db.size()).await??;
    drop(shipped);
    // The owner stops as a killed process does: it renews nothing more.
    drop(owner);

    let successor = Arc::new(EtcdCoordinator::new(EtcdClient::new(etcd.endpoints.clone()), "/kura/bench", ttl));
    successor.join(member("successor")).await?;
    let stopped = Instant::now();
    let lease = acquire(&*successor, resource).await?;
    let waited = stopped.elapsed();
    let db = scratch.join("successor/db.sqlite");
    std::fs::create_dir_all(db.parent().expect("a folder"))?;
    let other: SharedStorage = Arc::new(garage.storage(1, "bench"));
    let rebuilding = Instant::now();
    let shipped_state: Shipped = rebuild(&other, &*successor, resource, &db).await?;
    let rebuilt = rebuilding.elapsed();
    let shipper = Arc::new(HistoryShipper::new(other, successor.clone(), lease, shipped_state));
    let registry = registry(&db, resource, Some(shipper));
    let count = registry.execute("db", Request::new(vec![Statement::new("SELECT count(*) FROM big")])).await?;
    let serving = stopped.elapsed();
    println!();
    println!(
        "takeover of a {:.0} MiB database after its owner stopped: lease {:.2} s (TTL {} s) + rebuild from Garage {:.2} s = serving after {:.2} s (target ≤ TTL + 1 s: {}); rows {:?}",
        size as f64 / (1024.0 * 1024.0),
        waited.as_secs_f64(),
        ttl.as_secs(),
        rebuilt.as_secs_f64(),
        serving.as_secs_f64(),
        if serving <= ttl + Duration::from_secs(1) { "✓" } else { "✗" },
        count[0].rows[0][0],
    );
    registry.shutdown().await;
    Ok(())
}

/// A `kura serve` process joined to the benchmark's cluster.
/// Starts cluster node `bench{i}{suffix}`, speaking to Garage node `i`.
/// Turns read replication on for the database at `database` (its v4 URL).
async fn turn_read_replication_on(http: &reqwest::Client, database: &str) -> anyhow::Result<()> {
    let replication = serde_json::json!({ "read_replication": { "mode": "auto" } });
    let put = http.put(database).bearer_auth(crate::server::TOKEN).json(&replication).send().await?;
    anyhow::ensure!(put.status().is_success(), "turning read replication on: {}", put.text().await?);
    Ok(())
}

/// D1 Sessions reads with read replication on: the point SELECT through the binding endpoint
/// in a `first-unconstrained` session on the owner and on node 1 (its read replica), with
/// `first-primary` on node 1 (forwarded) beside them; then how far the replica trails the
/// owner's commits under a write load: from a write's answer until a read through node 1
/// answers a bookmark at or after it.
async fn replica_reads(
    http: &reqwest::Client,
    nodes: &[KuraProcess],
    owner_query: &str,
    duration: Duration,
) -> anyhow::Result<()> {
    const SESSION: &str = "x-cf-d1-session-commit-token";
    let database = owner_query.trim_end_matches("/query");
    let uuid = database.rsplit('/').next().unwrap_or_default().to_owned();
    turn_read_replication_on(http, database).await?;
    let binding = |node: &KuraProcess| format!("{}/binding/d1/{uuid}/query", node.api.trim_end_matches("/client/v4"));
    let (on_owner, on_replica) = (binding(&nodes[0]), binding(&nodes[1]));
    // One session read: the answer's bookmark, and whether the primary served it.
    let client = http.clone();
    let read = move |url: String, session: String| {
        let http = client.clone();
        async move {
            let body = serde_json::json!({ "sql": "SELECT v FROM kv WHERE id = ?1", "params": [1] });
            let answer =
                http.post(&url).bearer_auth(crate::server::TOKEN).header(SESSION, session).json(&body).send().await?;
            let bookmark = answer.headers().get(SESSION).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
            let json: serde_json::Value = answer.json().await?;
            anyhow::ensure!(json[0]["success"] == true, "a session read failed: {json}");
            anyhow::Ok((bookmark, json[0]["meta"]["served_by_primary"] == true))
        }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while read(on_replica.clone(), "first-unconstrained".into()).await?.1 {
        anyhow::ensure!(Instant::now() < deadline, "node 1 never served from its read replica");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reads = |url: String, session: &'static str| {
        let read = read.clone();
        load::run(16, duration, move |_, _| {
            let read = read(url.clone(), session.to_owned());
            async move {
                read.await.expect("a session read");
                1
            }
        })
    };
    // CPU per read of the node serving it (its own process's: the load generator shares the
    // machine's two cores).
    let cpu = |node: &KuraProcess| crate::workers::cpu_seconds(node.pid());
    let before = cpu(&nodes[0]);
    let owner = reads(on_owner.clone(), "first-unconstrained").await;
    let owner_cpu = (cpu(&nodes[0]) - before) / owner.units.max(1) as f64;
    let before = cpu(&nodes[1]);
    let replica = reads(on_replica.clone(), "first-unconstrained").await;
    let replica_cpu = (cpu(&nodes[1]) - before) / replica.units.max(1) as f64;
    let forwarded = reads(on_replica.clone(), "first-primary").await;
    line("session SELECT via the owner, 16 clients", &owner, &[]);
    line("session SELECT via a replica, 16 clients", &replica, &[("via the owner", owner.rate(), Some(0.9))]);
    line("first-primary SELECT via another, 16 clients", &forwarded, &[("via the owner", owner.rate(), None)]);
    println!(
        "{:<44} serving node's CPU per read: owner {:.0} µs, replica {:.0} µs",
        "",
        owner_cpu * 1e6,
        replica_cpu * 1e6
    );

    // Lag under 16 writers: each probe writes through the owner, then reads through node 1 in
    // an unconstrained session every millisecond until its answer's bookmark reaches the write's.
    let writers = {
        let (http, url) = (http.clone(), owner_query.to_owned());
        let base = rand_base();
        tokio::spawn(load::run(16, duration, move |client, n| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let id = base + (client as i64) * 10_000_000 + n as i64;
                let body = serde_json::json!({ "sql": "INSERT INTO kv VALUES (?1, 'v')", "params": [id] });
                crate::server::post_ok(&http, &url, body.to_string()).await;
                1
            }
        }))
    };
    let mut lags = Vec::new();
    let until = Instant::now() + duration;
    let mut probe = -1i64;
    while Instant::now() < until {
        let body = serde_json::json!({ "sql": "INSERT OR REPLACE INTO kv VALUES (?1, 'probe')", "params": [probe] });
        probe -= 1;
        let written = http.post(&on_owner).bearer_auth(crate::server::TOKEN).json(&body).send().await?;
        let acked = Instant::now();
        let bookmark = written.headers().get(SESSION).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        anyhow::ensure!(!bookmark.is_empty(), "a write through the binding answered no bookmark");
        loop {
            let (seen, _) = read(on_replica.clone(), "first-unconstrained".into()).await?;
            if seen >= bookmark {
                lags.push(acked.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let written = writers.await?;
    lags.sort();
    let at = |q: f64| lags.get(((lags.len() as f64 * q) as usize).min(lags.len().saturating_sub(1))).copied();
    println!(
        "{:<44} replica lag under {:.0} INSERTs/s: p50 {:.1} ms, p99 {:.1} ms ({} probes; it polls every {} ms)",
        "",
        written.rate(),
        at(0.5).unwrap_or_default().as_secs_f64() * 1e3,
        at(0.99).unwrap_or_default().as_secs_f64() * 1e3,
        lags.len(),
        kura_cluster::read_replicas::POLL.as_millis()
    );
    Ok(())
}

fn start_node(etcd: &Etcd, garage: &Garage, (i, suffix): (usize, &str), extra: &[&str]) -> anyhow::Result<KuraProcess> {
    let (endpoints, node_id) = (etcd.endpoints.join(","), format!("bench{i}{suffix}"));
    let mut args = vec!["--cluster-store", "s3://kura/bench-nodes", "--cluster-store-region", "garage"];
    args.extend(["--cluster-store-endpoint", &garage.s3_endpoints[i], "--etcd", &endpoints, "--node-id", &node_id]);
    args.extend(extra);
    crate::child::start(
        &args,
        &[
            ("KURA_CLUSTER_STORE_ACCESS_KEY_ID", kura_testkit::bed::GARAGE_KEY_ID),
            ("KURA_CLUSTER_STORE_SECRET_ACCESS_KEY", kura_testkit::bed::GARAGE_SECRET),
        ],
    )
}

/// D1 over HTTP through cluster nodes: durable INSERTs through the owner and through another
/// node (which forwards), point SELECTs likewise, beside one single-node server in-process.
async fn through_nodes(settings: &Settings, etcd: &Etcd, garage: &Garage) -> anyhow::Result<()> {
    let duration = Duration::from_secs_f64(settings.seconds);
    let nodes = [start_node(etcd, garage, (0, ""), &[])?, start_node(etcd, garage, (1, ""), &[])?];
    let single_dir = tempfile::tempdir()?;
    // The in-process server has a runtime of its own, started and stopped off this one.
    let single_path = single_dir.path().to_owned();
    let single = tokio::task::spawn_blocking(move || crate::server::Kura::start(&single_path, true)).await??;
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build()?;
    // `url`: an account's D1 databases.
    let create = |url: String, name: &'static str| {
        let http = http.clone();
        async move {
            let created: serde_json::Value = http
                .post(&url)
                .bearer_auth(crate::server::TOKEN)
                .json(&serde_json::json!({ "name": name }))
                .send()
                .await?
                .json()
                .await?;
            let uuid = created["result"]["uuid"].as_str().ok_or_else(|| anyhow::anyhow!("create: {created}"))?;
            anyhow::Ok(format!("{url}/{uuid}/query"))
        }
    };
    // Created through node 0, which then owns it; node 1 forwards to it.
    let databases = |api: &str| format!("{api}/accounts/{}/d1/database", crate::server::ACCOUNT);
    let owner_query = create(databases(&nodes[0].api), "bench").await?;
    let forwarded_query = owner_query.replacen(&nodes[0].api, &nodes[1].api, 1);
    let single_query = create(single.base.clone(), "bench").await?;
    for url in [&owner_query, &single_query] {
        let table = serde_json::json!({ "sql": "CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT)" }).to_string();
        crate::server::post_ok(&http, url, table).await;
    }
    let insert = |url: String, clients: usize| {
        let http = http.clone();
        let base = rand_base();
        load::run(clients, duration, move |client, n| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let id = base + (client as i64) * 10_000_000 + n as i64;
                let body = serde_json::json!({ "sql": "INSERT INTO kv VALUES (?1, 'v')", "params": [id] });
                crate::server::post_ok(&http, &url, body.to_string()).await;
                1
            }
        })
    };
    let select = |url: String, clients: usize| {
        let http = http.clone();
        load::run(clients, duration, move |_, _| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let body = serde_json::json!({ "sql": "SELECT v FROM kv WHERE id = ?1", "params": [1] });
                crate::server::post_ok(&http, &url, body.to_string()).await;
                1
            }
        })
    };
    println!();
    println!("D1 over HTTP through kura cluster nodes (RPO 0, etcd, Garage ×3) beside one single-node server");
    for clients in [16usize, 1] {
        let single_stats = insert(single_query.clone(), clients).await;
        let owner = insert(owner_query.clone(), clients).await;
        let forwarded = insert(forwarded_query.clone(), clients).await;
        line(&format!("INSERT, single node, {clients} client(s)"), &single_stats, &[]);
        let target = (clients == 16).then_some(0.5);
        line(
            &format!("INSERT via the owner, {clients} client(s)"),
            &owner,
            &[("single node", single_stats.rate(), target)],
        );
        line(
            &format!("INSERT via another node, {clients} client(s)"),
            &forwarded,
            &[("via the owner", owner.rate(), None)],
        );
    }
    let owner = select(owner_query.clone(), 16).await;
    let forwarded = select(forwarded_query.clone(), 16).await;
    line("SELECT via the owner, 16 clients", &owner, &[]);
    line("SELECT via another node, 16 clients", &forwarded, &[("via the owner", owner.rate(), None)]);
    println!(
        "{:<44} forwarding adds {:.2} ms at p50",
        "",
        (forwarded.p50.as_secs_f64() - owner.p50.as_secs_f64()) * 1e3
    );
    replica_reads(&http, &nodes, &owner_query, duration).await?;
    // --durability async: acknowledged after the local fsync, shipped every second.
    drop(nodes);
    let async_node = start_node(etcd, garage, (2, ""), &["--durability", "async"])?;
    let async_query = create(databases(&async_node.api), "bench-async").await?;
    let table = serde_json::json!({ "sql": "CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT)" }).to_string();
    crate::server::post_ok(&http, &async_query, table).await;
    for clients in [16usize, 1] {
        let single_stats = insert(single_query.clone(), clients).await;
        let shipped_async = insert(async_query.clone(), clients).await;
        line(
            &format!("INSERT, async durability, {clients} client(s)"),
            &shipped_async,
            &[("single node", single_stats.rate(), None)],
        );
    }
    drop(async_node);
    tokio::task::spawn_blocking(move || single.shutdown()).await?;
    Ok(())
}
