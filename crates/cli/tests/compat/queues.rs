//! Queues on kura, driven by real wrangler 4.85.0 and a real Worker in workerd
//! (`workers/queues`): `wrangler queues` commands, the producer and consumer registrations
//! `wrangler deploy` makes, 1,000 messages through `sendBatch` with kura killed (SIGKILL) twice
//! while they are delivered — every acknowledged send delivered at least once, duplicates
//! counted — retries with `attempts`, a poison message ending in the dead-letter queue,
//! `delaySeconds`, every content type, the limits; and an HTTP pull consumer's leases.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value as Json, json};

use crate::common::{ACCOUNT, KuraProcess, TOKEN, Wrangler};
use crate::workers::{Client, Project, deploy, wait_for};

/// The deliveries the Worker recorded, with the message bodies parsed.
fn deliveries(client: &Client) -> Vec<Json> {
    let mut all = client.get("queue-jobs", "/deliveries").as_array().cloned().unwrap_or_default();
    for d in &mut all {
        d["body"] = serde_json::from_str(d["body"].as_str().unwrap()).unwrap();
    }
    all
}

#[test]
fn queues_deliver_every_acknowledged_message_through_kills_retries_and_dead_letters() {
    let server = KuraProcess::start();
    let w = Wrangler::new(&server);
    let project = Project::new("queues");
    for queue in ["jobs", "jobs-dlq"] {
        let created = w.ok(project.path(), &["queues", "create", queue]);
        assert!(created.all().contains(&format!("Created queue '{queue}'")), "{}", created.all());
    }
    let again = w.run(project.path(), &["queues", "create", "jobs"]);
    assert!(!again.ok && again.all().contains("already exists"), "{}", again.all());
    let listed = w.ok(project.path(), &["queues", "list"]);
    assert!(listed.stdout.contains("jobs-dlq"), "{}", listed.all());
    deploy(&w, &project, &[]);
    let info = w.ok(project.path(), &["queues", "info", "jobs"]);
    assert!(info.stdout.contains("Producers: worker:queue-jobs"), "{}", info.all());
    assert!(info.stdout.contains("Consumers: worker:queue-jobs"), "{}", info.all());
    let client = Client::new(&server);
    client.get("queue-jobs", "/setup");

    // Every content type, as the consumer sees it.
    client.get("queue-jobs", "/send-types");
    let typed = wait_for(Duration::from_secs(20), || {
        let all = deliveries(&client);
        (all.len() >= 4).then_some(all)
    })
    .expect("the four typed messages arrive");
    let bodies: Vec<&Json> = typed.iter().map(|d| &d["body"]).collect();
    for expected in
        [json!("plain text"), json!({"bytes": [1, 2, 3]}), json!({"nested": [1, "two"]}), json!({"map": [["k", 1]]})]
    {
        assert!(bodies.contains(&&expected), "{expected} in {bodies:?}");
    }

    // A message that fails once is delivered again with attempts 2; a poison message has its
    // three deliveries (max_retries = 2) and then lands in the dead-letter queue.
    client.get("queue-jobs", "/send?body=%7B%22failTimes%22%3A1%2C%22tag%22%3A%22flaky%22%7D");
    client.get("queue-jobs", "/send?body=%7B%22poison%22%3Atrue%7D");
    client.get("queue-jobs", "/send?body=%7B%22tag%22%3A%22late%22%7D&delay=3");
    // A handler that throws has its batch retried whole.
    client.get("queue-jobs", "/send?body=%7B%22throwBatch%22%3Atrue%2C%22tag%22%3A%22thrown%22%7D");
    let sent_late = jiff::Timestamp::now().as_millisecond();
    let settled = wait_for(Duration::from_secs(30), || {
        let all = deliveries(&client);
        let dead = all.iter().any(|d| d["queue"] == "jobs-dlq" && d["body"]["poison"] == true);
        let late = all.iter().any(|d| d["body"]["tag"] == "late");
        let thrown = all.iter().filter(|d| d["body"]["tag"] == "thrown").count() >= 2;
        (dead && late && thrown).then_some(all)
    })
    .expect("the poison message reaches the dead-letter queue, the delayed one arrives");
    let attempts_of = |pred: &dyn Fn(&Json) -> bool, queue: &str| -> Vec<i64> {
        settled
            .iter()
            .filter(|d| d["queue"] == queue && pred(&d["body"]))
            .map(|d| d["attempts"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(attempts_of(&|b| b["tag"] == "flaky", "jobs"), [1, 2]);
    assert_eq!(attempts_of(&|b| b["tag"] == "thrown", "jobs"), [1, 2]);
    assert_eq!(attempts_of(&|b| b["poison"] == true, "jobs"), [1, 2, 3]);
    assert_eq!(attempts_of(&|b| b["poison"] == true, "jobs-dlq"), [1]);
    let late = settled.iter().find(|d| d["body"]["tag"] == "late").unwrap();
    let waited = late["delivered_ms"].as_i64().unwrap() - late["sent_ms"].as_i64().unwrap();
    assert!(waited >= 3000, "delaySeconds: 3 honoured ({waited} ms)");
    assert!(late["delivered_ms"].as_i64().unwrap() >= sent_late + 2500);

    // Limits: a message of 128,000 bytes goes, one byte more is refused (with this compatibility
    // date workerd shows the status text; from 2026-03-12 it shows the cause and code).
    client.get("queue-jobs", "/send-large?bytes=128000");
    let (status, refused) = client.send(client.request(reqwest::Method::GET, "queue-jobs", "/send-large?bytes=128001"));
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"], "Queue send failed: message length of 128001 bytes exceeds limit of 128000");

    // 1,000 messages, with kura killed twice while they are delivered.
    let (status, sent) = client.send(client.request(reqwest::Method::GET, "queue-jobs", "/send-many?n=1000&from=0"));
    assert_eq!((status, &sent["sent"]), (200, &json!(1000)), "{sent}");
    let (mut server, mut client) = (server, client);
    let mut at_kills = Vec::new();
    for threshold in [200, 600] {
        // Killed once some of the thousand have been delivered and (most likely) some not.
        let n = wait_for(Duration::from_secs(60), || {
            let seen: std::collections::BTreeSet<i64> =
                deliveries(&client).iter().filter_map(|d| d["body"]["seq"].as_i64()).collect();
            (seen.len() >= threshold).then_some(seen.len())
        })
        .expect("deliveries go on");
        at_kills.push(n);
        let (dir, data) = server.stop();
        server = KuraProcess::start_on(dir, data);
        // Its listeners have new ports.
        client = Client::new(&server);
    }
    wait_for(Duration::from_secs(120), || {
        let all = deliveries(&client);
        let seen: std::collections::BTreeSet<i64> = all.iter().filter_map(|d| d["body"]["seq"].as_i64()).collect();
        (seen.len() == 1000).then_some(())
    })
    .unwrap_or_else(|| {
        let seen: std::collections::BTreeSet<i64> =
            deliveries(&client).iter().filter_map(|d| d["body"]["seq"].as_i64()).collect();
        panic!("{} of 1,000 messages delivered after the kills", seen.len())
    });
    // Once every acknowledgement is in (the batches cut short by the kills delivered again
    // too), the queue is empty and nothing more arrives.
    wait_for(Duration::from_secs(60), || (client.get("queue-jobs", "/metrics")["backlogCount"] == 0).then_some(()))
        .expect("the backlog drains");
    let final_deliveries = deliveries(&client);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        deliveries(&client).len(),
        final_deliveries.len(),
        "nothing more arrives once everything is acknowledged"
    );
    let mut per_seq: BTreeMap<i64, usize> = BTreeMap::new();
    for d in final_deliveries.iter().filter(|d| d["queue"] == "jobs") {
        if let Some(seq) = d["body"]["seq"].as_i64() {
            *per_seq.entry(seq).or_default() += 1;
        }
    }
    let duplicates: usize = per_seq.values().map(|n| n - 1).sum();
    eprintln!(
        "queues: 1,000 messages through two kill -9s (at {at_kills:?} delivered), all delivered; {duplicates} duplicate deliveries"
    );
    assert!(at_kills.iter().all(|n| *n < 1000), "each kill landed mid-delivery: {at_kills:?}");

    // A consumer removed stops deliveries; a deleted queue is gone.
    let w = Wrangler::new(&server);
    w.ok(project.path(), &["queues", "consumer", "remove", "jobs", "queue-jobs"]);
    client.get("queue-jobs", "/send?body=%7B%22tag%22%3A%22unconsumed%22%7D");
    std::thread::sleep(Duration::from_secs(3));
    assert!(deliveries(&client).iter().all(|d| d["body"]["tag"] != "unconsumed"));
    assert_eq!(client.get("queue-jobs", "/metrics")["backlogCount"], 1);
}

#[test]
fn an_http_pull_consumer_leases_acknowledges_and_retries() {
    let server = KuraProcess::start();
    let w = Wrangler::new(&server);
    let dir = tempfile::tempdir().unwrap();
    w.ok(dir.path(), &["queues", "create", "pulled"]);
    let refused =
        w.run(dir.path(), &["queues", "consumer", "http", "add", "pulled", "--dead-letter-queue", "pulled-dlq"]);
    assert!(!refused.ok && refused.all().contains("does not exist"), "{}", refused.all());
    w.ok(dir.path(), &["queues", "create", "pulled-dlq"]);
    w.ok(
        dir.path(),
        &[
            "queues",
            "consumer",
            "http",
            "add",
            "pulled",
            "--visibility-timeout-secs",
            "2",
            "--message-retries",
            "1",
            "--dead-letter-queue",
            "pulled-dlq",
        ],
    );
    let client = Client::new(&server);
    let queues = format!("{}/accounts/{ACCOUNT}/queues", server.api);
    let get = |url: String| client.send(client.http.get(url).bearer_auth(TOKEN)).1;
    let listed = get(format!("{queues}?name=pulled"));
    let id = listed["result"][0]["queue_id"].as_str().unwrap().to_owned();
    let call = |path: &str, body: Json| -> Json {
        let (_, answer) = client.send(client.http.post(format!("{queues}/{id}{path}")).bearer_auth(TOKEN).json(&body));
        assert_eq!(answer["success"], true, "{path}: {answer}");
        answer["result"].clone()
    };
    call("/messages", json!({"body": "hello", "content_type": "text"}));
    call("/messages/batch", json!({"messages": [{"body": {"n": 1}}, {"body": {"n": 2}, "delay_seconds": 1}]}));
    let first = call("/messages/pull", json!({"batch_size": 10}));
    let messages = first["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "the delayed one waits: {first}");
    assert_eq!(messages[0]["body"], "hello");
    use base64::Engine as _;
    let json_body = base64::engine::general_purpose::STANDARD.decode(messages[1]["body"].as_str().unwrap()).unwrap();
    assert_eq!(serde_json::from_slice::<Json>(&json_body).unwrap(), json!({"n": 1}));
    assert_eq!(messages[1]["metadata"]["CF-Content-Type"], "json");
    // The first is acknowledged; the second's lease runs out, and it comes back with attempts 2.
    let acked = call("/messages/ack", json!({"acks": [{"lease_id": messages[0]["lease_id"]}]}));
    assert_eq!(acked["ackCount"], 1);
    std::thread::sleep(Duration::from_millis(2100));
    let second = call("/messages/pull", json!({"batch_size": 10}));
    let again: Vec<&Json> = second["messages"].as_array().unwrap().iter().collect();
    let redelivered = again.iter().find(|m| m["id"] == messages[1]["id"]).expect("the unacknowledged one returns");
    assert_eq!(redelivered["attempts"], 2);
    // Its retry after its last allowed delivery (max_retries 1) dead-letters it.
    let retried = call("/messages/ack", json!({"retries": [{"lease_id": redelivered["lease_id"]}]}));
    assert_eq!(retried["retryCount"], 1, "{retried}");
    let dlq = get(format!("{queues}?name=pulled-dlq"));
    let dlq_id = dlq["result"][0]["queue_id"].as_str().unwrap();
    let details = get(format!("{queues}/{dlq_id}"));
    assert_eq!(details["result"]["backlog"]["count"], 1, "{details}");
    let scraped = client.send(client.http.get(format!("{}/metrics", server.api.trim_end_matches("/client/v4")))).1;
    let scraped = scraped.as_str().unwrap_or_default().to_owned();
    let line = format!("kura_queue_backlog_messages{{queue=\"{dlq_id}\"}} 1");
    assert!(scraped.lines().any(|l| l == line), "{line} in:\n{scraped}");
    // A stale lease acknowledges nothing.
    let stale = call("/messages/ack", json!({"acks": [{"lease_id": messages[1]["lease_id"]}]}));
    assert_eq!(stale["ackCount"], 0);
    let info = w.ok(dir.path(), &["queues", "info", "pulled"]);
    assert!(info.stdout.contains("Consumers: HTTP Pull Consumer."), "{}", info.all());
    w.ok(dir.path(), &["queues", "consumer", "http", "remove", "pulled"]);
    w.ok(dir.path(), &["queues", "delete", "pulled"]);
    let gone = get(format!("{queues}?name=pulled"));
    assert_eq!(gone["result"], json!([]));
}
