//! The operator's surface: `/metrics` read with Prometheus' own text-format parser (its Python
//! client) before and after real D1, R2 and S3 requests, whose counters and histograms move as
//! they should; every answer names its request (`x-kura-request-id`; on S3 also
//! `x-amz-request-id` and an error body's `RequestId`, all the same id); and `--log-format json`
//! writes one JSON object per line, each request's lines carrying its id.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::common::{ACCOUNT, KuraProcess, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, TOKEN};

/// Every sample of a scrape, `name{label="value",…}` → value, as Prometheus' parser reads it.
async fn scrape(api: &str) -> BTreeMap<String, f64> {
    let url = api.replace("/client/v4", "/metrics");
    let text = reqwest::get(&url).await.unwrap().text().await.unwrap();
    let parser = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
samples = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
        samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
print(json.dumps(samples))
"#;
    let mut child = Command::new("python3")
        .args(["-c", parser])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs (scripts/test installs prometheus-client)");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "Prometheus' parser refused the scrape: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn sample(samples: &BTreeMap<String, f64>, key: &str) -> f64 {
    samples.get(key).copied().unwrap_or(0.0)
}

#[test]
fn metrics_parse_and_move_and_every_answer_names_its_request() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(metrics_and_request_ids());
}

async fn metrics_and_request_ids() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let logs_dir = tempfile::tempdir().unwrap();
    let log_path = logs_dir.path().join("kura.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let env = [("KURA_LOG", "warn,kura_server::observe=debug".to_owned())];
    let args = ["--log-format".to_owned(), "json".to_owned()];
    let server = KuraProcess::start_logging(dir, data, &args, &env, Stdio::from(log));
    let before = scrape(&server.api).await;
    assert_eq!(sample(&before, "kura_up"), 1.0);

    // D1: a database, a table, three inserts.
    let http = reqwest::Client::new();
    let call = async |method: reqwest::Method, url: String, body: Value| {
        let answer = http.request(method, url).bearer_auth(TOKEN).json(&body).send().await.unwrap();
        let id = answer.headers()["x-kura-request-id"].to_str().unwrap().to_owned();
        let body: Value = answer.json().await.unwrap();
        assert_eq!(body["success"], true, "{body}");
        (id, body)
    };
    let databases = format!("{}/accounts/{ACCOUNT}/d1/database", server.api);
    let (first_id, created) = call(reqwest::Method::POST, databases.clone(), json!({ "name": "metered" })).await;
    let uuid = created["result"]["uuid"].as_str().unwrap().to_owned();
    let query = format!("{databases}/{uuid}/query");
    let mut ids = vec![first_id];
    for sql in
        ["CREATE TABLE t (x)", "INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)", "INSERT INTO t VALUES (3)"]
    {
        ids.push(call(reqwest::Method::POST, query.clone(), json!({ "sql": sql })).await.0);
    }
    assert!(ids.iter().all(|id| id.len() == 32), "{ids:?}");
    let distinct: std::collections::BTreeSet<_> = ids.iter().collect();
    assert_eq!(distinct.len(), ids.len(), "each request has an id of its own");

    // R2 over S3: a bucket, a 100 KiB object written and read, and a missing key.
    let s3 = async |method: reqwest::Method, path: &str, body: Vec<u8>| {
        let url = format!("{}{path}", server.s3);
        let host = kura_client::sigv4::host_of(&url).to_owned();
        let headers = kura_client::sigv4::signed_headers(
            method.as_str(),
            &url,
            &[("host", host.as_str())],
            S3_ACCESS_KEY_ID,
            S3_SECRET_ACCESS_KEY,
        )
        .unwrap();
        let mut request = http.request(method, &url).body(body);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        request.send().await.unwrap()
    };
    assert!(s3(reqwest::Method::PUT, "/metered", Vec::new()).await.status().is_success());
    let object = vec![7u8; 100 * 1024];
    assert!(s3(reqwest::Method::PUT, "/metered/blob", object.clone()).await.status().is_success());
    let got = s3(reqwest::Method::GET, "/metered/blob", Vec::new()).await;
    assert_eq!(got.headers()["x-amz-request-id"], got.headers()["x-kura-request-id"]);
    assert_eq!(got.bytes().await.unwrap().len(), object.len());
    let missing = s3(reqwest::Method::GET, "/metered/nothing-here", Vec::new()).await;
    assert_eq!(missing.status(), 404);
    let header_id = missing.headers()["x-amz-request-id"].to_str().unwrap().to_owned();
    let body = missing.text().await.unwrap();
    assert!(body.contains(&format!("<RequestId>{header_id}</RequestId>")), "{body}");

    let after = scrape(&server.api).await;
    let moved = |key: &str| sample(&after, key) - sample(&before, key);
    assert!(moved(r#"kura_http_requests_total{code="200",surface="v4"}"#) >= 5.0, "{after:?}");
    assert!(moved(r#"kura_http_requests_total{code="404",surface="s3"}"#) >= 1.0);
    assert!(moved(r#"kura_http_request_duration_seconds_count{surface="s3"}"#) >= 4.0);
    assert!(moved(r#"kura_sqlite_commits_total{engine="d1"}"#) >= 4.0);
    assert!(moved(r#"kura_sqlite_commits_total{engine="r2"}"#) >= 2.0);
    assert!(moved(r#"kura_sqlite_group_commit_requests_count{engine="d1"}"#) >= 4.0);
    assert!(moved(r#"kura_sqlite_commit_duration_seconds_sum{engine="d1"}"#) > 0.0);
    assert!(sample(&after, &format!(r#"kura_d1_database_commits_total{{database="{uuid}"}}"#)) >= 4.0);
    assert!(sample(&after, &format!(r#"kura_d1_database_history_bytes{{database="{uuid}"}}"#)) >= 0.0);
    assert!(moved("kura_r2_received_bytes_total") >= object.len() as f64);
    assert!(moved("kura_r2_sent_bytes_total") >= object.len() as f64);
    assert!(sample(&after, r#"kura_sqlite_open_files{engine="d1"}"#) >= 1.0);
    assert!(sample(&after, "process_open_fds") > 0.0 && sample(&after, "process_resident_memory_bytes") > 0.0);

    // The logs: JSON lines; each request's lines carry its id in their span.
    drop(server);
    let logs = std::fs::read_to_string(&log_path).unwrap();
    let lines: Vec<Value> = logs
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {l}")))
        .collect();
    let answered: Vec<&Value> = lines.iter().filter(|l| l["fields"]["message"] == "answered").collect();
    for id in &ids {
        let line = answered
            .iter()
            .find(|l| l["span"]["request_id"] == id.as_str())
            .unwrap_or_else(|| panic!("no log line for request {id}: {logs}"));
        assert_eq!(line["span"]["surface"], "v4", "{line}");
        assert_eq!(line["fields"]["status"], 200, "{line}");
        assert!(line["fields"]["method"].is_string(), "{line}");
        assert!(line["fields"]["path"].as_str().is_some_and(|p| p.starts_with("/client/v4/")), "{line}");
    }
}
