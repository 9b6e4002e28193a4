//! D1 read replicas in a three-node cluster (real Garage ×3 with fsync, etcd ×3): with the
//! database's read replication on, Sessions reads through the nodes that do not own it are
//! served from their own copies (`served_by_primary: false`, `served_by_region` the node) and
//! never return a state older than the bookmark they carry — checked over random interleavings
//! of writes and reads through every node, before and after the owner's kill -9 — while
//! `first-primary`, writes, and a database whose replication is off go to the owner.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::common::{ACCOUNT, TOKEN};

/// One binding call's answer.
#[derive(Debug)]
struct Answer {
    rows: Value,
    bookmark: String,
    primary: bool,
    region: Option<String>,
}

/// `POST /binding/d1/<uuid>/query` through `api`, in the session `session` (a constraint or a
/// bookmark; none for a plain call).
async fn call(
    client: &reqwest::Client,
    api: &str,
    uuid: &str,
    session: Option<&str>,
    sql: &str,
    params: Value,
) -> Result<Answer, String> {
    let mut request = client
        .post(format!("{}/binding/d1/{uuid}/query", api.trim_end_matches("/client/v4")))
        .bearer_auth(TOKEN)
        .json(&json!({ "sql": sql, "params": params }));
    if let Some(session) = session {
        request = request.header("x-cf-d1-session-commit-token", session);
    }
    let answer = request.send().await.map_err(|e| format!("no answer: {e}"))?;
    let status = answer.status();
    let bookmark =
        answer.headers().get("x-cf-d1-session-commit-token").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body: Value = answer.json().await.map_err(|e| format!("{status}, no JSON: {e}"))?;
    match (&body[0], bookmark) {
        (result, Some(bookmark)) if result["success"] == true => Ok(Answer {
            rows: result["results"].clone(),
            bookmark,
            primary: result["meta"]["served_by_primary"] == true,
            region: result["meta"]["served_by_region"].as_str().map(str::to_owned),
        }),
        _ => Err(format!("{status}: {body}")),
    }
}

/// Retries `call` while the cluster moves the database (a node killed), for up to 30 s.
async fn call_until_served(
    client: &reqwest::Client,
    api: &str,
    uuid: &str,
    session: Option<&str>,
    sql: &str,
    params: Value,
) -> Answer {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match call(client, api, uuid, session, sql, params.clone()).await {
            Ok(answer) => return answer,
            Err(e) if Instant::now() > deadline => panic!("{sql} through {api}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

fn ids(rows: &Value) -> BTreeSet<u64> {
    rows.as_array().unwrap().iter().map(|r| r["id"].as_u64().unwrap()).collect()
}

/// A small deterministic generator (the seed is printed, so a failing run can be replayed).
struct Random(u64);

impl Random {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Whether bookmark `answered` names the state `carried` (a bookmark or a constraint) names or
/// a later one: bookmarks sort as their positions do.
fn newer_or_same(answered: &str, carried: &str) -> bool {
    carried.starts_with("first-") || answered >= carried
}

/// What every session's acknowledged writes were: id → the bookmark answered with it.
type Acknowledged = Arc<Mutex<BTreeMap<u64, String>>>;

/// Counts of where the session reads were served.
#[derive(Default)]
struct Served {
    reads: AtomicU64,
    by_replicas: AtomicU64,
}

/// One session's random walk of `steps` writes and reads through the nodes at `apis`: each read
/// holds every write acknowledged at or before the bookmark it carries, every row the session
/// saw before, and answers a bookmark no older than it carried.
#[allow(clippy::too_many_arguments)]
async fn session_walk(
    client: reqwest::Client,
    apis: Vec<(String, String)>,
    uuid: String,
    mut random: Random,
    steps: usize,
    next_id: Arc<AtomicU64>,
    acknowledged: Acknowledged,
    served: Arc<Served>,
    mut bookmark: String,
) -> String {
    let mut seen = BTreeSet::new();
    for _ in 0..steps {
        let (api, node) = &apis[random.below(apis.len() as u64) as usize];
        if random.below(10) < 4 {
            let id = next_id.fetch_add(1, Ordering::SeqCst);
            // A write retried after the owner's kill may have landed the first time.
            let sql = "INSERT OR IGNORE INTO t (id, payload) VALUES (?1, ?2)";
            let answer = call_until_served(&client, api, &uuid, Some(&bookmark), sql, json!([id, "x"])).await;
            assert!(answer.primary, "a write is the primary's: {answer:?}");
            assert!(
                newer_or_same(&answer.bookmark, &bookmark),
                "a write's bookmark {} is older than {bookmark}",
                answer.bookmark
            );
            acknowledged.lock().unwrap().insert(id, answer.bookmark.clone());
            seen.insert(id);
            bookmark = answer.bookmark;
        } else {
            let carried = bookmark.clone();
            // Taken before the read is sent: every write acknowledged at or before its bookmark.
            let owed: BTreeSet<u64> = acknowledged
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, acked)| !carried.starts_with("first-") && **acked <= carried)
                .map(|(id, _)| *id)
                .collect();
            let answer = call_until_served(&client, api, &uuid, Some(&carried), "SELECT id FROM t", json!([])).await;
            let present = ids(&answer.rows);
            let missing: Vec<_> = owed.union(&seen).filter(|id| !present.contains(id)).collect();
            assert!(
                missing.is_empty(),
                "a read through {node} carrying {carried} (served by the primary: {}) lacks {missing:?}",
                answer.primary
            );
            assert!(
                newer_or_same(&answer.bookmark, &carried),
                "a read answered {} after carrying {carried}",
                answer.bookmark
            );
            served.reads.fetch_add(1, Ordering::Relaxed);
            if !answer.primary {
                assert_eq!(answer.region.as_deref(), Some(node.as_str()), "a replica's answer names its node");
                served.by_replicas.fetch_add(1, Ordering::Relaxed);
            }
            seen.extend(present);
            bookmark = answer.bookmark;
        }
    }
    bookmark
}

/// Runs `sessions` random walks at once through `apis`.
#[allow(clippy::too_many_arguments)]
async fn walks(
    client: &reqwest::Client,
    apis: &[(String, String)],
    uuid: &str,
    seed: u64,
    sessions: usize,
    steps: usize,
    next_id: &Arc<AtomicU64>,
    acknowledged: &Acknowledged,
) -> Arc<Served> {
    let served = Arc::new(Served::default());
    let walks = (0..sessions).map(|s| {
        tokio::spawn(session_walk(
            client.clone(),
            apis.to_vec(),
            uuid.to_owned(),
            Random(seed.wrapping_add(s as u64 * 0x9e37_79b9).max(1)),
            steps,
            Arc::clone(next_id),
            Arc::clone(acknowledged),
            Arc::clone(&served),
            "first-unconstrained".to_owned(),
        ))
    });
    for walk in futures_util::future::join_all(walks).await {
        walk.unwrap();
    }
    served
}

/// The node that owns the database, by the cluster's status on node 0.
async fn owner_of(client: &reqwest::Client, cluster: &Cluster, uuid: &str) -> usize {
    for i in 0..3 {
        let Some(node) = cluster.nodes[i].as_ref() else { continue };
        let url = format!("{}/accounts/{ACCOUNT}/kura/cluster", node.api);
        let status: Value = client.get(url).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap();
        let owned = status["result"]["databases"].as_array().cloned().unwrap_or_default();
        if owned.iter().any(|d| d["id"] == uuid) {
            return i;
        }
    }
    panic!("no node owns {uuid}");
}

#[test]
fn sessions_reads_through_replicas_never_return_a_state_older_than_their_bookmark() {
    let mut cluster = Cluster::start();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = reqwest::Client::new();
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    eprintln!("read replicas: seed {seed}");
    runtime.block_on(async {
        let v4s: Vec<String> =
            (0..3).map(|i| format!("{}/accounts/{ACCOUNT}/d1/database", cluster.node(i).api)).collect();
        let v4 = |i: usize| v4s[i].clone();
        let created: Value = client
            .post(v4(0))
            .bearer_auth(TOKEN)
            .json(&json!({ "name": "replicated" }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let uuid = created["result"]["uuid"].as_str().unwrap().to_owned();
        let create = "CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT)";
        call(&client, &cluster.node(0).api, &uuid, None, create, json!([])).await.unwrap();

        // Off (D1's default): a session read through another node is the primary's.
        let owner = owner_of(&client, &cluster, &uuid).await;
        let other = (owner + 1) % 3;
        // (Retried while the other node's catalog has yet to hear of the database.)
        let read = call_until_served(
            &client,
            &cluster.node(other).api,
            &uuid,
            Some("first-unconstrained"),
            "SELECT 1",
            json!([]),
        );
        assert!(read.await.primary, "with replication off the owner answers");

        // On, through another node than the owner: every node's copy follows.
        let put = client
            .put(format!("{}/{uuid}", v4(other)))
            .bearer_auth(TOKEN)
            .json(&json!({ "read_replication": { "mode": "auto" } }))
            .send()
            .await
            .unwrap();
        assert!(put.status().is_success(), "PUT read_replication: {}", put.text().await.unwrap());
        let deadline = Instant::now() + Duration::from_secs(30);
        for i in (0..3).filter(|i| *i != owner) {
            loop {
                let read =
                    call(&client, &cluster.node(i).api, &uuid, Some("first-unconstrained"), "SELECT 1", json!([]));
                let answer = read.await.unwrap();
                if !answer.primary {
                    assert_eq!(answer.region, Some(format!("node{i}")));
                    break;
                }
                assert!(Instant::now() < deadline, "node {i} never served from a copy of its own");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        // The primary's answers in a cluster name their node too.
        let on_owner = call(&client, &cluster.node(owner).api, &uuid, Some("first-primary"), "SELECT 1", json!([]));
        let on_owner = on_owner.await.unwrap();
        assert!(on_owner.primary);
        assert_eq!(on_owner.region, Some(format!("node{owner}")));
        // `first-primary` through another node, and a plain call, are the primary's.
        for session in [Some("first-primary"), None] {
            let read = call(&client, &cluster.node(other).api, &uuid, session, "SELECT 1", json!([]));
            assert!(read.await.unwrap().primary, "{session:?} goes to the primary");
        }

        let apis: Vec<(String, String)> = (0..3).map(|i| (cluster.node(i).api.clone(), format!("node{i}"))).collect();
        let next_id = Arc::new(AtomicU64::new(1));
        let acknowledged: Acknowledged = Arc::default();
        let served = walks(&client, &apis, &uuid, seed, 4, 60, &next_id, &acknowledged).await;
        let (reads, by_replicas) = (served.reads.load(Ordering::Relaxed), served.by_replicas.load(Ordering::Relaxed));
        eprintln!("read replicas: {reads} session reads, {by_replicas} served by replicas");
        // Two thirds of the reads go through nodes that do not own the database: at least three
        // quarters of those are served by their copies.
        assert!(by_replicas * 2 >= reads, "most reads through other nodes are served by their copies");

        // `kura node status` on another node shows its copy and how far behind it may be.
        let url = format!("{}/accounts/{ACCOUNT}/kura/cluster", cluster.node(other).api);
        let status: Value = client.get(url).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap();
        let replica =
            status["result"]["replicas"].as_array().unwrap().iter().find(|r| r["id"] == uuid.as_str()).cloned();
        let replica = replica.unwrap_or_else(|| panic!("node {other} lists its copy: {status}"));
        assert!(replica["position"].as_u64().unwrap() > 0 && replica["lag_ms"].as_u64().is_some(), "{replica}");

        // kill -9 of the owner; the walks go on through the survivors, whose copies follow the
        // next owner.
        cluster.signal(owner, "-KILL");
        cluster.nodes[owner].take();
        let survivors: Vec<(String, String)> =
            apis.iter().enumerate().filter(|(i, _)| *i != owner).map(|(_, a)| a.clone()).collect();
        let served = walks(&client, &survivors, &uuid, seed ^ 0x5555, 4, 40, &next_id, &acknowledged).await;
        let (reads, by_replicas) = (served.reads.load(Ordering::Relaxed), served.by_replicas.load(Ordering::Relaxed));
        eprintln!("read replicas after the kill: {reads} session reads, {by_replicas} served by replicas");
        assert!(by_replicas > 0, "a survivor that does not own the database serves from its copy");

        // Every acknowledged write is there, and turning replication off sends reads to the owner.
        let survivor = (owner + 1) % 3;
        let all = call_until_served(&client, &cluster.node(survivor).api, &uuid, None, "SELECT id FROM t", json!([]));
        let present = ids(&all.await.rows);
        let acked: BTreeSet<u64> = acknowledged.lock().unwrap().keys().copied().collect();
        assert!(
            acked.is_subset(&present),
            "acknowledged writes lost: {:?}",
            acked.difference(&present).collect::<Vec<_>>()
        );
        let put = client
            .put(format!("{}/{uuid}", v4(survivor)))
            .bearer_auth(TOKEN)
            .json(&json!({ "read_replication": { "mode": "disabled" } }))
            .send()
            .await
            .unwrap();
        assert!(put.status().is_success());
        // (Each node sees the catalog's change within moments.)
        let deadline = Instant::now() + Duration::from_secs(10);
        for (api, node) in &survivors {
            while !call_until_served(&client, api, &uuid, Some("first-unconstrained"), "SELECT 1", json!([]))
                .await
                .primary
            {
                assert!(Instant::now() < deadline, "with replication off again, {node} still answers from a copy");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
}
