//! Workers on three `kura serve` nodes over three Garage nodes and three etcd members: a Worker
//! (`workers/ledger`: D1, R2, KV and a Cron Trigger) deployed with real wrangler through one
//! node runs on every node; a redeploy through another and a secret through a third reach all
//! of them; its R2, D1 and KV calls from nodes that do not own the bucket, database or
//! namespace reach the owner, and wrangler's `kv` commands work through any node; its D1
//! Sessions reads (`withSession`) are served by read replicas on the nodes that do not own the
//! database once its read replication is on; the owner
//! killed with SIGKILL while requests go through every node's Workers listener loses no
//! acknowledged write, and a survivor serves the bucket and the namespace; and its schedule
//! fires once a minute for the whole cluster, before and after the kill.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::cluster::Cluster;
use crate::common::{Wrangler, installed};
use crate::workers::{Project, Tail, deploy, secret};
use crate::writers::{Outcome, Write, assert_consistent, kill_mid_write};

const HOST: &str = "ledger.localhost";

/// Sends a request to the ledger through the Workers listener at `base`; answers (status, body
/// as JSON or as a string), or why there was no answer.
async fn call(
    client: &reqwest::Client,
    base: &str,
    method: reqwest::Method,
    path: &str,
    body: &[u8],
) -> Result<(u16, Value), String> {
    let sent = client.request(method, format!("{base}{path}")).header("host", HOST).body(body.to_vec()).send().await;
    let answer = sent.map_err(|e| format!("no answer: {e}"))?;
    let status = answer.status().as_u16();
    let text = answer.text().await.map_err(|e| format!("no body: {e}"))?;
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
}

/// GETs `path` until it answers 200 with a body `good` accepts (a node runs what the cluster
/// deploys a moment after the deploy), for up to 30 s.
async fn wait_for(client: &reqwest::Client, base: &str, path: &str, good: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = call(client, base, reqwest::Method::GET, path, b"").await;
        match answer {
            Ok((200, body)) if good(&body) => return body,
            other if Instant::now() > deadline => {
                panic!("GET {path} through {base} at {:?}: {other:?}", SystemTime::now())
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Requests that each record a unique id through the Worker.
fn entries() -> Write {
    Arc::new(|client, base, id| {
        Box::pin(async move {
            let url = format!("{base}/entries/{id}");
            Outcome::of(client.post(url).header("host", HOST).send()).await
        })
    })
}

/// GETs a v4 URL with the admin token; answers its JSON.
async fn api_get(client: &reqwest::Client, url: &str) -> Value {
    client.get(url).bearer_auth(crate::common::TOKEN).send().await.unwrap().json().await.unwrap()
}

/// The queue's v4 details once its backlog is empty (acknowledgements settle a moment after
/// the deliveries they follow are recorded).
async fn wait_for_queue_drained(client: &reqwest::Client, url: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let details = api_get(client, url).await;
        if details["result"]["backlog"]["count"] == 0 || Instant::now() > deadline {
            assert_eq!(details["result"]["backlog"]["count"], 0, "the backlog drains: {details}");
            return details;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn unix_ms() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis() as i64
}

#[test]
fn a_worker_deployed_through_one_node_runs_on_every_node_and_survives_the_loss_of_its_databases_owner() {
    let workerd = installed("node_modules/workerd/bin/workerd");
    let cluster = Cluster::start_with(vec!["--workerd".to_owned(), workerd.display().to_string()]);
    let workers: Vec<String> = (0..3).map(|i| cluster.node(i).workers.clone()).collect();
    let project = Project::new("ledger");
    // Node 0 makes the queue and provisions the database, the bucket and the namespace, so it
    // owns them all.
    Wrangler::new(cluster.node(0)).ok(project.path(), &["queues", "create", "ledger-jobs"]);
    deploy(&Wrangler::new(cluster.node(0)), &project, &[]);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = reqwest::Client::new();

    runtime.block_on(async {
        for base in &workers {
            wait_for(&client, base, "/greeting", |b| b["greeting"] == "hello").await;
        }
        let (status, body) = call(&client, &workers[1], reqwest::Method::POST, "/setup", b"").await.unwrap();
        assert_eq!(status, 200, "setup through node 1: {body}");
    });

    // A redeploy through node 2 and a secret through node 1 reach every node.
    project.edit("wrangler.toml", "GREETING = \"hello\"", "GREETING = \"hi\"");
    deploy(&Wrangler::new(cluster.node(2)), &project, &[]);
    secret(&Wrangler::new(cluster.node(1)), &project, "SECRET", "s3cret");
    runtime.block_on(async {
        for base in &workers {
            wait_for(&client, base, "/greeting", |b| b["greeting"] == "hi" && b["secret"] == "s3cret").await;
        }
    });
    // Each node says what its workerd runs: the version deployed last, through any node.
    let version = |status: &Value| status["result"]["workers"]["running"][0]["version_id"].as_str().map(str::to_owned);
    let versions: Vec<Option<String>> = runtime.block_on(async {
        let mut versions = Vec::new();
        for i in 0..3 {
            let url = format!("{}/accounts/{}/kura/cluster", cluster.node(i).api, crate::common::ACCOUNT);
            let status = api_get(&client, &url).await;
            assert_eq!(status["result"]["workers"]["running"][0]["script"], "ledger", "node {i}: {status}");
            versions.push(version(&status));
        }
        versions
    });
    assert!(
        versions[0].is_some() && versions.iter().all(|v| *v == versions[0]),
        "one version everywhere: {versions:?}"
    );
    let listed = Wrangler::new(cluster.node(1)).ok(project.path(), &["deployments", "list"]);
    assert!(listed.all().matches("Version(s):").count() >= 2, "two deployments through node 1: {}", listed.all());

    // A version uploaded through node 2 without deploying it (`wrangler versions upload`) and
    // deployed through node 1 (what `wrangler versions deploy` sends), which had never seen its
    // files: it brings them in from the store.
    project.edit("wrangler.toml", "GREETING = \"hi\"", "GREETING = \"hey\"");
    Wrangler::new(cluster.node(2)).ok(project.path(), &["versions", "upload"]);
    runtime.block_on(async {
        let scripts = format!("{}/accounts/{}/workers/scripts/ledger", cluster.node(1).api, crate::common::ACCOUNT);
        let versions = api_get(&client, &format!("{scripts}/versions")).await;
        let newest = versions["result"]["items"][0]["id"].as_str().expect("the uploaded version").to_owned();
        let deploy =
            serde_json::json!({"strategy": "percentage", "versions": [{"version_id": newest, "percentage": 100}]});
        let answer = client.post(format!("{scripts}/deployments")).bearer_auth(crate::common::TOKEN).json(&deploy);
        let deployed: Value = answer.send().await.unwrap().json().await.unwrap();
        assert_eq!(deployed["success"], true, "deploying through node 1 a version uploaded through node 2: {deployed}");
        for base in &workers {
            wait_for(&client, base, "/greeting", |b| b["greeting"] == "hey").await;
        }
    });

    // A `wrangler tail` opened through node 1 hears the invocations node 2 and node 0 run.
    let tail = Tail::start(&Wrangler::new(cluster.node(1)), &project, &["tail", "ledger", "--format", "json"]);
    for node in [2, 0] {
        let mut n = 0;
        let heard = crate::workers::wait_for(Duration::from_secs(60), || {
            n += 1;
            let path = format!("/greeting?through={node}&n={n}");
            runtime.block_on(call(&client, &workers[node], reqwest::Method::GET, &path, b"")).unwrap();
            let wanted = format!("through={node}&");
            tail.events()
                .into_iter()
                .find(|e| e["event"]["request"]["url"].as_str().is_some_and(|u| u.contains(&wanted)))
        });
        let event =
            heard.unwrap_or_else(|| panic!("node {node}'s invocations reach a tail on node 1: {}", tail.text()));
        assert_eq!(event["scriptName"], "ledger", "{event}");
        assert_eq!(event["outcome"], "ok", "{event}");
    }
    let said = tail.stop();
    assert!(!said.contains("ERROR"), "wrangler tail left cleanly: {said}");

    // Where nodes take in each other's Workers' calls, and each other's tails, a client is no
    // node: without a node's stamp, or with a forged one, nothing is served.
    runtime.block_on(async {
        let api = cluster.node(1).api.trim_end_matches("/client/v4").to_owned();
        for path in ["/kura/worker-bindings/query", "/kura/tail-listeners", "/kura/tail-events/0123"] {
            for stamp in [None, Some("node0 0000"), Some("node0 1796659200 0000")] {
                let mut request = client.post(format!("{api}{path}")).bearer_auth(crate::common::TOKEN).body("{}");
                if let Some(stamp) = stamp {
                    request = request.header("x-kura-forwarded-by", stamp);
                }
                let answer = request.send().await.unwrap();
                assert_eq!(answer.status(), 403, "{path}, {stamp:?}: {}", answer.text().await.unwrap());
            }
        }
    });

    // R2 and D1 through nodes that own neither: node 2 writes, node 1 reads.
    let body = vec![7u8; 300 * 1024];
    runtime.block_on(async {
        let (status, put) = call(&client, &workers[2], reqwest::Method::PUT, "/files/big", &body).await.unwrap();
        assert_eq!((status, put["size"].as_u64()), (200, Some(body.len() as u64)), "{put}");
        let read = client.get(format!("{}/files/big", workers[1])).header("host", HOST).send().await.unwrap();
        assert_eq!(read.status(), 200);
        assert_eq!(read.bytes().await.unwrap().as_ref(), &body[..], "the body written through node 2, read through 1");
        let (status, id) = call(&client, &workers[2], reqwest::Method::POST, "/entries/0", b"").await.unwrap();
        assert_eq!(status, 200, "{id}");
        // With the database's read replication on, a Worker's Sessions reads on nodes that do
        // not own it are served by their copies, from the session's bookmark on.
        let databases = format!("{}/accounts/{}/d1/database", cluster.node(1).api, crate::common::ACCOUNT);
        let uuid = api_get(&client, &databases).await["result"][0]["uuid"].as_str().unwrap().to_owned();
        let put = client
            .put(format!("{databases}/{uuid}"))
            .bearer_auth(crate::common::TOKEN)
            .json(&serde_json::json!({ "read_replication": { "mode": "auto" } }))
            .send()
            .await
            .unwrap();
        assert!(put.status().is_success());
        let read = wait_for(&client, &workers[1], "/session", |b| b["served_by_primary"] == false).await;
        assert_eq!((read["n"].as_u64(), read["served_by_region"].as_str()), (Some(1), Some("node1")), "{read}");
        let bookmark = read["bookmark"].as_str().unwrap().to_owned();
        let path = format!("/session?bookmark={bookmark}");
        let read = wait_for(&client, &workers[2], &path, |b| b["served_by_primary"] == false).await;
        assert_eq!((read["n"].as_u64(), read["served_by_region"].as_str()), (Some(1), Some("node2")), "{read}");
        assert!(read["bookmark"].as_str().unwrap() >= bookmark.as_str(), "{read}");
        let (status, put) = call(&client, &workers[2], reqwest::Method::PUT, "/notes/greeting", b"hej").await.unwrap();
        assert_eq!(status, 200, "{put}");
        let note = wait_for(&client, &workers[1], "/notes/greeting", |b| b["value"] == "hej").await;
        assert_eq!(note["metadata"]["by"], "ledger");
    });
    // wrangler's KV commands through a node that does not own the namespace.
    let namespace_id = {
        let listed = crate::kv::parse_json_output(
            &Wrangler::new(cluster.node(1)).ok(project.path(), &["kv", "namespace", "list"]),
        );
        listed[0]["id"].as_str().expect("the provisioned namespace").to_owned()
    };
    let kv = |node: usize, args: &[&str]| {
        let mut all = vec!["kv", "key"];
        all.extend_from_slice(args);
        all.extend(["--namespace-id", &namespace_id, "--remote"]);
        Wrangler::new(cluster.node(node)).ok(project.path(), &all)
    };
    kv(2, &["put", "from-wrangler", "through node 2"]);
    assert_eq!(kv(1, &["get", "greeting", "--text"]).stdout.trim(), "hej");

    // Jobs sent through every node's producer, half of them due only after the owner's kill.
    const JOBS: u64 = 90;
    runtime.block_on(async {
        for id in 0..JOBS {
            let path = format!("/jobs/{id}?delay={}", if id % 2 == 0 { 0 } else { 8 });
            let (status, body) =
                call(&client, &workers[id as usize % 3], reqwest::Method::POST, &path, b"").await.unwrap();
            assert_eq!(status, 200, "job {id}: {body}");
        }
        let early = wait_for(&client, &workers[2], "/jobs", |b| b.is_array()).await;
        assert!(
            early.as_array().unwrap().iter().all(|id| id.as_u64().unwrap() % 2 == 0),
            "delayed jobs ran early: {early}"
        );
    });

    // The owner of them all killed while writes go through every node's Workers listener.
    let (outcomes, takeover) = runtime.block_on(kill_mid_write(&cluster, 0, workers.clone(), entries(), 1));
    let recovered_ms = unix_ms();
    eprintln!("Workers through the kill of their database's owner: first acknowledgement {takeover:?} after it");
    runtime.block_on(async {
        for base in &workers[1..] {
            let ids = wait_for(&client, base, "/entries", |b| b.is_array()).await;
            let present: BTreeSet<u64> = ids.as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
            assert!(present.contains(&0), "the entry from before the kill is kept");
            assert_consistent(&outcomes, &present, &format!("entries read through {base}"));
        }
        let read = client.get(format!("{}/files/big", workers[2])).header("host", HOST).send().await.unwrap();
        assert_eq!(read.status(), 200, "the bucket is served after its owner died");
        assert_eq!(read.bytes().await.unwrap().len(), body.len());
        let note = wait_for(&client, &workers[2], "/notes/from-wrangler", |b| b.is_object()).await;
        assert_eq!(note["value"], "through node 2", "the KV namespace is served after its owner died");
        // Every job acknowledged before the kill is delivered, by the queue's new owner for those
        // due after it.
        let deliveries = wait_for(&client, &workers[1], "/jobs", |b| {
            let ids: BTreeSet<u64> = b.as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
            ids.len() as u64 == JOBS
        })
        .await;
        let count = deliveries.as_array().unwrap().len() as u64;
        eprintln!("{JOBS} jobs, {} deliveries through the kill of the queue's owner", count);
        // The queue's details, its backlog drained, through a node that does not own it.
        let queues = format!("{}/accounts/{}/queues", cluster.node(2).api, crate::common::ACCOUNT);
        let listed = api_get(&client, &queues).await;
        let id = listed["result"][0]["queue_id"].as_str().expect("the queue is listed").to_owned();
        let details = wait_for_queue_drained(&client, &format!("{queues}/{id}")).await;
        assert_eq!(details["result"]["queue_name"], "ledger-jobs", "{details}");
    });

    // The schedule fired once per minute for the whole cluster: no minute twice, and every
    // minute once the survivors had taken over (wait for two of them).
    let runs = runtime.block_on(async {
        let first_after = (recovered_ms / 60_000 + 1) * 60_000;
        let deadline = Instant::now() + Duration::from_secs(150);
        loop {
            let runs = wait_for(&client, &workers[1], "/runs", |b| b.is_array()).await;
            let minutes: Vec<i64> = runs.as_array().unwrap().iter().map(|r| r["scheduled"].as_i64().unwrap()).collect();
            if minutes.iter().filter(|m| **m >= first_after).count() >= 2 {
                break minutes;
            }
            assert!(Instant::now() < deadline, "two minutes after the takeover did not both run: {minutes:?}");
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    });
    eprintln!("the ledger's scheduled runs: {runs:?} (survivors serving from {recovered_ms})");
    crate::cluster::assert_once_a_minute(&runs, recovered_ms);
    let after: Vec<i64> = runs.iter().copied().filter(|m| *m > recovered_ms).collect();
    // The survivors say how many runs each started: together, at least every run since the
    // takeover, and never more than ran.
    let started: u64 = runtime.block_on(async {
        let mut started = 0;
        for i in 1..3 {
            let url = format!("{}/accounts/{}/kura/cluster", cluster.node(i).api, crate::common::ACCOUNT);
            started += api_get(&client, &url).await["result"]["workers"]["cron_runs"].as_u64().unwrap();
        }
        started
    });
    assert!(
        (after.len() as u64..=runs.len() as u64).contains(&started),
        "the survivors started {started} runs; {} ran since the takeover, {} in all",
        after.len(),
        runs.len()
    );

    // Deleted through node 2, the Worker stops on both survivors, and its files go from the
    // survivors' disks and from the store.
    Wrangler::new(cluster.node(2)).ok(project.path(), &["delete", "--force"]);
    runtime.block_on(async {
        for i in 1..3 {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let url = format!("{}/accounts/{}/kura/cluster", cluster.node(i).api, crate::common::ACCOUNT);
                let running = api_get(&client, &url).await["result"]["workers"]["running"].clone();
                let versions = cluster.node(i).data.join("workers/versions");
                let left = std::fs::read_dir(&versions).map(|d| d.count()).unwrap_or(0);
                if running.as_array().is_some_and(|r| r.is_empty()) && left == 0 {
                    break;
                }
                assert!(Instant::now() < deadline, "node {i} still runs {running} and keeps {left} versions' files");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
}
