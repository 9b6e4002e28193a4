//! R2 on three `kura serve` nodes over three Garage nodes and three etcd members: boto3's whole
//! suite with each call through the next node, the AWS CLI against each node (a multipart
//! upload, a multipart copy between buckets two different nodes own, downloads byte for byte);
//! the owner of a bucket killed with SIGKILL during concurrent uploads through every node loses
//! no acknowledged object and leaves nothing listed unreadable; a paused owner's uploads after
//! a takeover never appear.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use md5::Digest;

use crate::cluster::Cluster;
use crate::common::{KuraProcess, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, Wrangler};
use crate::writers::{Outcome, Write, assert_consistent, kill_mid_write, pause_owner_until_fenced};

const BUCKET: &str = "uploads";

/// A request to an S3 listener signed with the compat key (SigV4 in headers, unsigned payload).
fn signed(client: &reqwest::Client, method: reqwest::Method, endpoint: &str, path: &str) -> reqwest::RequestBuilder {
    let url = format!("{endpoint}{path}");
    let host = kura_client::sigv4::host_of(&url).to_owned();
    let headers = [("host", host.as_str())];
    let signed =
        kura_client::sigv4::signed_headers(method.as_str(), &url, &headers, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY)
            .unwrap();
    let mut builder = client.request(method, &url);
    for (name, value) in signed {
        builder = builder.header(name, value);
    }
    builder
}

/// The body of object `id`: its size spans inline rows (up to 16 KiB) and blobs in the store.
fn content(id: u64) -> Vec<u8> {
    let size = [100, 9_000, 40_000, 300_000][(id % 4) as usize] + (id % 97) as usize;
    (0..size).map(|i| (i as u64).wrapping_mul(2_654_435_761).wrapping_add(id) as u8).collect()
}

fn key(id: u64) -> String {
    format!("w/{id}")
}

/// Uploads of unique objects into [`BUCKET`].
fn uploads() -> Write {
    Arc::new(|client, s3, id| {
        Box::pin(async move {
            let sent =
                signed(&client, reqwest::Method::PUT, &s3, &format!("/{BUCKET}/{}", key(id))).body(content(id)).send();
            Outcome::of(sent).await
        })
    })
}

/// Every writer's key listed through `s3`, each read back and checked against what was written:
/// nothing listed is unreadable or different.
async fn listed_and_intact(client: &reqwest::Client, s3: &str) -> BTreeSet<u64> {
    let mut ids = BTreeSet::new();
    let mut token: Option<String> = None;
    loop {
        let mut query = format!("/{BUCKET}?list-type=2&prefix=w%2F&max-keys=1000");
        if let Some(token) = &token {
            query.push_str(&format!("&continuation-token={}", urlencode(token)));
        }
        let answer = signed(client, reqwest::Method::GET, s3, &query).send().await.unwrap();
        assert!(answer.status().is_success(), "listing through {s3}: {}", answer.status());
        let text = answer.text().await.unwrap();
        for listed in text.split("<Key>").skip(1) {
            let key = listed.split("</Key>").next().unwrap();
            ids.insert(key.trim_start_matches("w/").parse::<u64>().unwrap());
        }
        token = text.split("<NextContinuationToken>").nth(1).and_then(|t| t.split('<').next()).map(str::to_owned);
        if token.is_none() {
            break;
        }
    }
    for id in &ids {
        let answer = signed(client, reqwest::Method::GET, s3, &format!("/{BUCKET}/{}", key(*id))).send().await.unwrap();
        assert!(answer.status().is_success(), "{} is listed but answers {}", key(*id), answer.status());
        let body = answer.bytes().await.unwrap();
        assert!(body[..] == content(*id)[..], "{} read back through {s3} differs from what was written", key(*id));
    }
    ids
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// The node serving `bucket`'s requests now (the answer's `x-kura-node`), asked through `s3`.
/// A 503 (retryable in S3, and retried by its SDKs) is retried a few times and printed: one
/// was seen once, right after a bucket was made through another node (under investigation).
async fn owner_of(client: &reqwest::Client, s3: &str, bucket: &str) -> usize {
    let mut answer;
    let mut tries = 0;
    loop {
        answer = signed(client, reqwest::Method::GET, s3, &format!("/{bucket}?list-type=2&max-keys=1"))
            .send()
            .await
            .unwrap();
        tries += 1;
        if answer.status() != 503 || tries == 4 {
            break;
        }
        eprintln!("listing {bucket} through {s3} answered 503: {}", answer.text().await.unwrap_or_default());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(answer.status().is_success(), "listing {bucket}: {}", answer.status());
    let node = crate::writers::served_by(&answer);
    node.strip_prefix("node").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no serving node: {node:?}"))
}

fn aws(node: &KuraProcess, args: &[&str]) -> String {
    let out = Command::new("aws").args(args).envs(node.s3_env()).output().expect("the AWS CLI runs");
    assert!(
        out.status.success(),
        "aws {args:?} through {} failed: {}{}",
        node.s3,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn md5(bytes: &[u8]) -> String {
    hex::encode(md5::Md5::digest(bytes))
}

#[test]
fn three_nodes_serve_r2_to_boto3_and_the_aws_cli_through_kill_and_pause() {
    let mut cluster = Cluster::start();
    let s3s: Vec<String> = (0..3).map(|i| cluster.node(i).s3.clone()).collect();

    // boto3's suite, each call through the next node.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat/s3/boto3_suite.py");
    let out = Command::new("python3")
        .arg(&script)
        .envs(cluster.node(0).s3_env())
        .env("KURA_S3_ENDPOINTS", s3s.join(","))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "boto3 suite through three nodes failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // The AWS CLI: buckets made through two nodes, a 20 MiB multipart upload through a third,
    // listed by all, copied between the buckets (a multipart copy: its parts read from the
    // source's owner) and downloaded byte for byte.
    let work = tempfile::tempdir().unwrap();
    let big: Vec<u8> = (0..20 * 1024 * 1024 + 5).map(|i: usize| (i.wrapping_mul(7919) >> 3) as u8).collect();
    let big_path = work.path().join("big.bin");
    std::fs::write(&big_path, &big).unwrap();
    aws(cluster.node(0), &["s3", "mb", "s3://photos"]);
    aws(cluster.node(2), &["s3", "mb", "s3://thumbs"]);
    aws(cluster.node(1), &["s3", "cp", big_path.to_str().unwrap(), "s3://photos/big.bin"]);
    for i in 0..3 {
        let listed = aws(cluster.node(i), &["s3", "ls", "s3://photos/"]);
        assert!(listed.contains(&format!("{} big.bin", big.len())), "node {i}: {listed}");
    }
    aws(cluster.node(1), &["s3", "cp", "s3://photos/big.bin", "s3://thumbs/copied.bin"]);
    for (i, source) in [(2, "s3://photos/big.bin"), (0, "s3://thumbs/copied.bin")] {
        let back = work.path().join(format!("back-{i}.bin"));
        aws(cluster.node(i), &["s3", "cp", source, back.to_str().unwrap()]);
        assert!(std::fs::read(&back).unwrap() == big, "{source} through node {i} is the uploaded file");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let client = reqwest::Client::new();
    let (photos, thumbs) = runtime
        .block_on(async { (owner_of(&client, &s3s[1], "photos").await, owner_of(&client, &s3s[1], "thumbs").await) });
    assert_eq!((photos, thumbs), (0, 2), "each bucket is served by the node that made it");
    let head = aws(cluster.node(1), &["s3api", "head-object", "--bucket", "thumbs", "--key", "copied.bin"]);
    assert!(head.contains(&format!("\"ContentLength\": {}", big.len())), "{head}");
    eprintln!(
        "the copy's ETag: {}; the file's MD5: {}",
        head.lines().find(|l| l.contains("ETag")).unwrap_or(""),
        md5(&big)
    );

    // wrangler's r2 commands (the v4 API) through the nodes that do not own the bucket.
    let note = work.path().join("note.txt");
    std::fs::write(&note, "through the v4 API\n").unwrap();
    let listed = Wrangler::new(cluster.node(1)).ok(work.path(), &["r2", "bucket", "list"]);
    assert!(listed.stdout.contains("name:           photos") && listed.stdout.contains("name:           thumbs"));
    let put = ["r2", "object", "put", "photos/note.txt", "--file", note.to_str().unwrap(), "--remote"];
    Wrangler::new(cluster.node(2)).ok(work.path(), &put);
    let got = Wrangler::new(cluster.node(1))
        .ok(work.path(), &["r2", "object", "get", "photos/note.txt", "--remote", "--pipe"]);
    assert!(got.stdout.contains("through the v4 API"), "{}", got.all());
    let refused = Wrangler::new(cluster.node(1)).run(work.path(), &["r2", "bucket", "delete", "photos"]);
    assert!(!refused.ok, "a bucket holding objects is not deleted, whichever node is asked");

    // kill -9 of the bucket's owner during uploads through every node.
    aws(cluster.node(1), &["s3", "mb", &format!("s3://{BUCKET}")]);
    let owner = runtime.block_on(owner_of(&client, &s3s[0], BUCKET));
    assert_eq!(owner, 1);
    let (outcomes, _) = runtime.block_on(kill_mid_write(&cluster, owner, s3s.clone(), uploads(), 1_000));
    cluster.nodes[owner] = None;
    let survivors: Vec<usize> = (0..3).filter(|&i| i != owner).collect();
    for &i in &survivors {
        let present = runtime.block_on(listed_and_intact(&client, &s3s[i]));
        assert_consistent(&outcomes, &present, &format!("node {i} after kill -9"));
    }

    // A paused owner: another node takes the bucket over; the paused one's uploads, once it
    // resumes, are refused as fenced and never appear.
    let zombie = runtime.block_on(owner_of(&client, &s3s[survivors[0]], BUCKET));
    let other = *survivors.iter().find(|&&i| i != zombie).unwrap();
    let paused = runtime.block_on(pause_owner_until_fenced(&cluster, (zombie, other), &s3s, uploads(), 5_000_000));
    let (zombie, other) = (paused.zombie, paused.other);
    for i in [zombie, other] {
        let present = runtime.block_on(listed_and_intact(&client, &s3s[i]));
        assert!(present.contains(&20_000_000));
        assert_consistent(&outcomes, &present, &format!("node {i} after the pause (first writers)"));
        for (round, outcomes) in paused.rounds.iter().enumerate() {
            assert_consistent(outcomes, &present, &format!("node {i} after pause {round}"));
        }
    }
    assert_eq!(runtime.block_on(owner_of(&client, &s3s[zombie], BUCKET)), other, "the resumed node forwards");
}
