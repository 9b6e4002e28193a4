//! The seeds' three Workers on three `kura serve` nodes over three Garage nodes and three etcd
//! members, deployed with real wrangler through one node: seats (D1), photos (R2 and D1, uploads
//! presigned with aws4fetch and sent to another node's S3 listener, a reclaim job run by a Cron
//! Trigger) and rooms (a SQLite-backed `Room` JavaScript Durable Object reached by name over
//! RPC, a D1 directory);
//! its rooms joined through every node's Workers listener run on the one node serving the
//! namespace, and every node reads the same members; values of every kind RPC copies cross
//! nodes as themselves, and what cannot is refused naming the limit; alarms fire on the
//! namespace's node; that node killed with SIGKILL while joins go through every node, a
//! survivor serves the rooms with every acknowledged join (and seat claim) kept, and adopts the
//! alarm due after the kill, which fires once; the reclaim job runs once a minute for the whole
//! cluster, across the kill.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cluster::Cluster;
use crate::common::{ACCOUNT, TOKEN, Wrangler, installed};
use crate::workers::{Project, deploy, secret};
use crate::writers::{Outcome, Write, assert_consistent, kill_mid_write};

const HOST: &str = "rooms.localhost";
const SEATS: &str = "seats.localhost";
const PHOTOS: &str = "photos.localhost";

/// The seeds' photos Worker, unchanged, with a Cron Trigger that runs its reclaim job and
/// notes each run (`GET /runs`), retrying while its database moves as a job should.
const PHOTOS_ENTRY: &str = r#"
import photos from "./index.js";
const RUNS = "CREATE TABLE IF NOT EXISTS runs (scheduled INTEGER NOT NULL)";
export default {
  async fetch(request, env, ctx) {
    if (new URL(request.url).pathname !== "/runs") return photos.fetch(request, env, ctx);
    await env.DB.prepare(RUNS).run();
    return Response.json((await env.DB.prepare("SELECT scheduled FROM runs ORDER BY scheduled").all()).results.map((r) => r.scheduled));
  },
  async scheduled(controller, env, ctx) {
    for (let attempt = 1; ; attempt++) {
      try {
        const reclaimed = await photos.fetch(new Request("https://photos/reclaim", { method: "POST" }), env, ctx);
        if (!reclaimed.ok) throw new Error(`reclaim answered ${reclaimed.status}`);
        await env.DB.batch([env.DB.prepare(RUNS), env.DB.prepare("INSERT INTO runs (scheduled) VALUES (?)").bind(controller.scheduledTime)]);
        return;
      } catch (e) {
        if (attempt >= 30) throw e;
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
    }
  },
};
"#;
const ROOMS: u64 = 5;

/// The seeds' Worker, unchanged, behind an entry that answers a call failing with a promise
/// that nothing happened (kura's "retry shortly") 503, as the ledger does, so the writers know
/// to count it refused; any other failure is a 500. Beside it, `Echo`, which sends values of
/// every kind JavaScript RPC copies there and back, and what RPC cannot take across nodes.
const ENTRY: &str = r#"
import { DurableObject } from "cloudflare:workers";
import rooms, { Room } from "./index.js";
export { Room };
const NOTHING_HAPPENED = /retry shortly|did not take effect|unavailable for now/;

export class Echo extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    ctx.blockConcurrencyWhile(async () => ctx.storage.sql.exec("CREATE TABLE IF NOT EXISTS fired (at INTEGER NOT NULL)"));
  }
  async arm(ms) {
    const at = Date.now() + ms;
    await this.ctx.storage.setAlarm(at);
    return at;
  }
  alarm() {
    this.ctx.storage.sql.exec("INSERT INTO fired (at) VALUES (?)", Date.now());
  }
  fired() {
    return this.ctx.storage.sql.exec("SELECT at FROM fired ORDER BY at").toArray().map((row) => row.at);
  }
  echo(value) {
    return value;
  }
  async fetch(request) {
    const said = { method: request.method, body: await request.text(), header: request.headers.get("x-h") };
    return Response.json(said, { status: 201, headers: { "x-o": "out" } });
  }
  fail() {
    throw new RangeError("out of range");
  }
}

async function echo(env) {
  const stub = env.ECHO.getByName("echo");
  const sent = {
    when: new Date(5), big: 2n ** 70n, map: new Map([[1, "one"]]), set: new Set(["a"]),
    bytes: new Uint8Array([1, 2, 3]), specials: [undefined, null, NaN, -0, Infinity], re: /a+/gi, text: "é\u0000",
  };
  const back = await stub.echo(sent);
  const checks = {
    date: back.when instanceof Date && back.when.getTime() === 5,
    bigint: back.big === 2n ** 70n,
    map: back.map instanceof Map && back.map.get(1) === "one",
    set: back.set instanceof Set && back.set.has("a"),
    bytes: back.bytes instanceof Uint8Array && back.bytes.join() === "1,2,3",
    specials: back.specials[0] === undefined && back.specials[1] === null && Number.isNaN(back.specials[2])
      && Object.is(back.specials[3], -0) && back.specials[4] === Infinity && back.specials.length === 5,
    regexp: back.re instanceof RegExp && back.re.source === "a+" && back.re.flags === "gi",
    text: back.text === sent.text,
  };
  let thrown = null;
  try {
    await stub.fail();
  } catch (e) {
    thrown = { name: e.name, message: e.message, range: e instanceof RangeError };
  }
  let refused = null;
  try {
    await stub.echo(() => 1);
  } catch (e) {
    refused = e.message;
  }
  const posted = await stub.fetch("https://echo/p", { method: "POST", body: "hé", headers: { "x-h": "in" } });
  const got = await stub.fetch("https://echo/g", { method: "DELETE" });
  let socket = null;
  try {
    await stub.fetch("https://echo/ws", { headers: { upgrade: "websocket" } });
  } catch (e) {
    socket = e.message;
  }
  const fetched = {
    posted: { status: posted.status, header: posted.headers.get("x-o"), body: await posted.json() },
    deleted: await got.json(),
    socket,
  };
  return Response.json({ checks, thrown, refused, fetched });
}

export default {
  async fetch(request, env, ctx) {
    try {
      const url = new URL(request.url);
      if (url.pathname === "/echo") return await echo(env);
      const alarms = env.ECHO.getByName(url.searchParams.get("name") ?? "");
      if (url.pathname === "/arm") return Response.json(await alarms.arm(Number(url.searchParams.get("ms"))));
      if (url.pathname === "/fired") return Response.json(await alarms.fired());
      return await rooms.fetch(request, env, ctx);
    } catch (e) {
      const said = String(e?.message ?? e);
      return Response.json({ error: said }, { status: NOTHING_HAPPENED.test(said) ? 503 : 500 });
    }
  },
};
"#;

async fn get(client: &reqwest::Client, base: &str, path: &str) -> (u16, Value) {
    let answer = client.get(format!("{base}{path}")).header("host", HOST).send().await.unwrap();
    let status = answer.status().as_u16();
    let text = answer.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// Waits (60 s at most) until `path` through `base` answers 200.
async fn wait_ok(client: &reqwest::Client, base: &str, path: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = get(client, base, path).await;
        if status == 200 {
            return body;
        }
        assert!(Instant::now() < deadline, "{base}{path} never answered 200: {status} {body}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Writes of unique ids: even ones join one of the rooms (a Durable Object, then the D1
/// directory), odd ones claim a seat's idempotency key (D1).
fn joins_and_claims() -> Write {
    Arc::new(|client, base, id| {
        Box::pin(async move {
            let sent = match id % 2 {
                0 => client.post(format!("{base}/rooms/r{}/join?name={id}", id % ROOMS)).header("host", HOST),
                _ => client.post(format!("{base}/claim?key={id}&who=writer")).header("host", SEATS),
            };
            Outcome::of(sent.send()).await
        })
    })
}

/// Every member of every room, read through `base`.
async fn members(client: &reqwest::Client, base: &str) -> BTreeSet<u64> {
    let mut present = BTreeSet::new();
    for room in 0..ROOMS {
        let names = wait_ok(client, base, &format!("/rooms/r{room}")).await;
        present.extend(names.as_array().unwrap().iter().map(|n| n.as_str().unwrap().parse::<u64>().unwrap()));
    }
    present
}

#[test]
fn javascript_durable_objects_run_on_their_namespaces_node_and_survive_its_loss() {
    let workerd = installed("node_modules/workerd/bin/workerd");
    let cluster = Cluster::start_with(vec!["--workerd".to_owned(), workerd.display().to_string()]);
    let workers: Vec<String> = (0..3).map(|i| cluster.node(i).workers.clone()).collect();
    // Seats and photos, deployed through node 0 (which provisions their databases and bucket);
    // the photos' presigned uploads go to node 2's S3 listener.
    let seats = Project::new("seats");
    deploy(&Wrangler::new(cluster.node(0)), &seats, &[]);
    let photos = Project::new("photos");
    std::fs::write(photos.path().join("src/cluster.js"), PHOTOS_ENTRY).unwrap();
    photos.edit("wrangler.toml", "main = \"src/index.js\"", "main = \"src/cluster.js\"");
    let toml = std::fs::read_to_string(photos.path().join("wrangler.toml")).unwrap();
    std::fs::write(photos.path().join("wrangler.toml"), toml + "\n[triggers]\ncrons = [\"* * * * *\"]\n").unwrap();
    let endpoint = format!("S3_ENDPOINT:{}", cluster.node(2).s3);
    deploy(&Wrangler::new(cluster.node(0)), &photos, &["--var", &endpoint]);
    secret(&Wrangler::new(cluster.node(1)), &photos, "S3_ACCESS_KEY_ID", crate::common::S3_ACCESS_KEY_ID);
    secret(&Wrangler::new(cluster.node(2)), &photos, "S3_SECRET_ACCESS_KEY", crate::common::S3_SECRET_ACCESS_KEY);
    let project = Project::new("rooms");
    std::fs::write(project.path().join("src/cluster.js"), ENTRY).unwrap();
    project.edit("wrangler.toml", "main = \"src/index.js\"", "main = \"src/cluster.js\"");
    let toml = std::fs::read_to_string(project.path().join("wrangler.toml")).unwrap();
    let echo = "\n[[durable_objects.bindings]]\nname = \"ECHO\"\nclass_name = \"Echo\"\n\n\
                [[migrations]]\ntag = \"v2\"\nnew_sqlite_classes = [\"Echo\"]\n";
    std::fs::write(project.path().join("wrangler.toml"), toml + echo).unwrap();
    // Node 0 provisions the directory's database, so it owns it.
    deploy(&Wrangler::new(cluster.node(0)), &project, &[]);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = reqwest::Client::new();

    let owner = runtime.block_on(async {
        // The first call to a room goes through node 1: node 1 takes the namespace.
        let lobby = wait_ok(&client, &workers[1], "/rooms/lobby").await;
        assert_eq!(lobby, serde_json::json!([]), "{lobby}");
        for base in &workers {
            wait_ok(&client, base, "/rooms/lobby").await;
        }
        let setup = wait_ok(&client, &workers[2], "/setup").await;
        assert_eq!(setup["ok"], true, "{setup}");
        // Seats: set up through node 1, a claim through each node, each claimed once.
        let answer = client.post(format!("{}/setup?seats=100", workers[1])).header("host", SEATS).send().await.unwrap();
        assert_eq!(answer.status(), 200, "{}", answer.text().await.unwrap());
        for (n, base) in workers.iter().enumerate() {
            for (attempt, claimed) in [(0, true), (1, false)] {
                let answer = client.post(format!("{base}/claim?key=k{n}&who=n{attempt}")).header("host", SEATS);
                let said: Value = answer.send().await.unwrap().json().await.unwrap();
                assert_eq!(said["claimed"], claimed, "claim {n} through node {n}, attempt {attempt}: {said}");
            }
        }
        // Photos: presigned through node 1, uploaded to node 2's S3 listener, finished through 0.
        let post = |base: &str, path: &str| client.post(format!("{base}{path}")).header("host", PHOTOS).send();
        assert_eq!(post(&workers[1], "/setup").await.unwrap().status(), 200);
        let upload: Value = post(&workers[1], "/uploads?type=image/png").await.unwrap().json().await.unwrap();
        let url = upload["url"].as_str().unwrap_or_else(|| panic!("{upload}"));
        let put = client.put(url).header("content-type", "image/png").body(vec![0x89, b'P', b'N', b'G']);
        let put = put.send().await.unwrap();
        assert_eq!(put.status(), 200, "the presigned upload to node 2: {}", put.text().await.unwrap());
        let done: Value = post(&workers[0], &format!("/uploads/{}/done", upload["id"].as_str().unwrap())).await.unwrap().json().await.unwrap();
        assert_eq!((&done["ready"], &done["size"]), (&true.into(), &4.into()), "{done}");
        // Joins through every node reach the one object each room is: every answer holds
        // every member joined before it, whichever node took it.
        let mut joined = Vec::new();
        for n in 0..12u64 {
            let base = &workers[n as usize % 3];
            let answer = client.post(format!("{base}/rooms/lobby/join?name=m{n:02}")).header("host", HOST);
            let answer = answer.send().await.unwrap();
            assert_eq!(answer.status(), 200);
            let members: Vec<String> = answer.json().await.unwrap();
            joined.push(format!("m{n:02}"));
            assert_eq!(members, joined, "join {n} through node {}", n % 3);
        }
        for base in &workers {
            let members = wait_ok(&client, base, "/rooms/lobby").await;
            assert_eq!(members.as_array().unwrap().len(), 12, "the lobby read through {base}: {members}");
            let directory = wait_ok(&client, base, "/directory?room=lobby").await;
            assert_eq!(directory.as_array().unwrap().len(), 12, "{directory}");
        }
        // An object reached by a new unique id, through a node that does not serve it.
        let unique = wait_ok(&client, &workers[2], "/unique").await;
        assert_eq!(unique["members"], serde_json::json!([]), "{unique}");
        assert_eq!(unique["id"].as_str().map(str::len), Some(64), "{unique}");
        // Values of every kind RPC copies go there and back through kura, a thrown error comes
        // back as itself, and what cannot cross nodes is refused, naming the limit. (Node 1
        // takes the echoes' namespace too.)
        for base in [&workers[1], &workers[0], &workers[2]] {
            let echoed = wait_ok(&client, base, "/echo").await;
            assert!(echoed["checks"].as_object().unwrap().values().all(|v| v == true), "{echoed}");
            let thrown = &echoed["thrown"];
            assert_eq!(
                (&thrown["name"], &thrown["message"], &thrown["range"]),
                (&"RangeError".into(), &"out of range".into(), &true.into()),
                "{echoed}"
            );
            let refused = echoed["refused"].as_str().unwrap_or_default();
            assert!(refused.contains("cannot be sent to or from a Durable Object on another kura node"), "{echoed}");
            // fetch() reaches the object's own handler, with its method, headers and body.
            let fetched = &echoed["fetched"];
            assert_eq!(
                fetched["posted"],
                serde_json::json!({"status": 201, "header": "out", "body": {"method": "POST", "body": "hé", "header": "in"}}),
                "{echoed}"
            );
            assert_eq!(fetched["deleted"], serde_json::json!({"method": "DELETE", "body": "", "header": null}), "{echoed}");
            assert!(fetched["socket"].as_str().unwrap_or_default().contains("WebSocket"), "{echoed}");
        }
        // The namespace is served by node 1 alone.
        let namespaces = format!("{}/accounts/{ACCOUNT}/workers/durable_objects/namespaces", cluster.node(0).api);
        let listed: Value = client.get(namespaces).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap();
        let rooms = listed["result"].as_array().unwrap().iter().find(|n| n["class"] == "Room").expect("listed");
        let id = rooms["id"].as_str().unwrap().to_owned();
        let mut serving = Vec::new();
        for i in 0..3 {
            let url = format!("{}/accounts/{ACCOUNT}/kura/cluster", cluster.node(i).api);
            let status: Value = client.get(url).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap();
            let owned = status["result"]["namespaces"].as_array().unwrap().iter().any(|n| n["id"] == id.as_str());
            // Said in the Workers' part of the status too, with the class it runs.
            let running = status["result"]["workers"]["object_namespaces"].as_array().unwrap();
            let runs = running.iter().any(|n| n["id"] == id.as_str() && n["class"] == "Room" && n["script"] == "rooms");
            assert_eq!(owned, runs, "node {i}: {status}");
            if owned {
                serving.push(i);
            }
        }
        assert_eq!(serving, vec![1], "the rooms' namespace is served by the node first reached");
        // Its /metrics counts the two namespaces (rooms and echoes) whose objects it runs.
        let metrics = format!("{}/metrics", cluster.node(1).api.trim_end_matches("/client/v4"));
        let metrics = client.get(metrics).send().await.unwrap().text().await.unwrap();
        assert!(metrics.contains("\nkura_workers_object_namespaces 2\n"), "{metrics}");
        // An alarm set through node 2 fires on node 1, once.
        let armed = wait_ok(&client, &workers[2], "/arm?name=soon&ms=300").await;
        let fired = wait_for_fired(&client, &workers[0], "soon").await;
        assert!(fired >= armed.as_i64().unwrap(), "fired at {fired}, set for {armed}");
        serving[0]
    });
    // An alarm due after the kill below (which comes at most about 12 s after this), on an
    // object no request reaches then.
    let armed = runtime.block_on(wait_ok(&client, &workers[0], "/arm?name=later&ms=15000")).as_i64().unwrap();

    // The namespace's node killed while joins go through every node's Workers listener.
    let (outcomes, takeover) =
        runtime.block_on(kill_mid_write(&cluster, owner, workers.clone(), joins_and_claims(), 1));
    let recovered_ms = unix_ms();
    eprintln!("rooms through the kill of their namespace's node: first acknowledgement {takeover:?} after it");
    runtime.block_on(async {
        for (i, base) in workers.iter().enumerate().filter(|(i, _)| *i != owner) {
            let mut present = members(&client, base).await;
            let answer = client.get(format!("{base}/state")).header("host", SEATS).send().await.unwrap();
            let state: Value = answer.json().await.unwrap();
            let claims = state["claims"].as_array().unwrap_or_else(|| panic!("{state}"));
            present.extend(claims.iter().filter_map(|c| c["key"].as_str()?.parse::<u64>().ok()));
            assert_consistent(&outcomes, &present, &format!("members read through node {i}"));
            let lobby = wait_ok(&client, base, "/rooms/lobby").await;
            assert_eq!(lobby.as_array().unwrap().len(), 12, "the lobby's members from before the kill: {lobby}");
        }
        // A survivor adopts the echoes' namespace with no request reaching it, and the alarm
        // fires there, once.
        let adopted = adopted_by_a_survivor(&client, &cluster, owner, "Echo").await;
        let fired = wait_for_fired(&client, &workers[adopted], "later").await;
        assert!(fired >= armed, "set for {armed}, fired at {fired}");
        tokio::time::sleep(Duration::from_secs(3)).await;
        let all = wait_ok(&client, &workers[(owner + 2) % 3], "/fired?name=later").await;
        assert_eq!(all.as_array().unwrap().len(), 1, "the alarm fired once: {all}");
    });

    // The photos' reclaim job ran once a minute for the whole cluster, across the kill (wait
    // for two minutes after it), and kept the finished upload.
    let survivor = workers[(owner + 1) % 3].clone();
    let runs = runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(150);
        loop {
            let answer = client.get(format!("{survivor}/runs")).header("host", PHOTOS).send().await.unwrap();
            let runs: Vec<i64> = answer.json().await.unwrap();
            if runs.iter().filter(|m| **m > recovered_ms).count() >= 2 {
                break runs;
            }
            assert!(Instant::now() < deadline, "two minutes after the kill did not both run: {runs:?}");
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    });
    eprintln!("the photos' reclaim runs: {runs:?} (survivors serving from {recovered_ms})");
    crate::cluster::assert_once_a_minute(&runs, recovered_ms);
    runtime.block_on(async {
        let listed = client.get(format!("{survivor}/photos")).header("host", PHOTOS).send().await.unwrap();
        let listed: Value = listed.json().await.unwrap();
        assert!(listed.as_array().unwrap().iter().any(|p| p["status"] == "ready"), "{listed}");
        let audit = client.get(format!("{survivor}/audit")).header("host", PHOTOS).send().await.unwrap();
        let audit: Value = audit.json().await.unwrap();
        assert_eq!(audit["missing"], serde_json::json!([]), "{audit}");
    });
}

/// Waits (60 s at most) until a node other than `dead` serves the namespace of `class`
/// (adopted by its home node); answers which.
async fn adopted_by_a_survivor(client: &reqwest::Client, cluster: &Cluster, dead: usize, class: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for i in (0..3).filter(|i| *i != dead) {
            let url = format!("{}/accounts/{ACCOUNT}/kura/cluster", cluster.node(i).api);
            let status: Value = client.get(url).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap();
            let running = status["result"]["workers"]["object_namespaces"].as_array().cloned().unwrap_or_default();
            if running.iter().any(|n| n["class"] == class) {
                return i;
            }
        }
        assert!(Instant::now() < deadline, "no survivor adopted the namespace of {class}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits (30 s at most) until the echo object `name`'s alarm has fired; answers when.
async fn wait_for_fired(client: &reqwest::Client, base: &str, name: &str) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let fired = wait_ok(client, base, &format!("/fired?name={name}")).await;
        if let Some(at) = fired.as_array().and_then(|f| f.first()).and_then(Value::as_i64) {
            return at;
        }
        assert!(Instant::now() < deadline, "the alarm of {name} never fired: {fired}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}
