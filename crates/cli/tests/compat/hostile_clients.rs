//! Hostile clients at the socket: 2,000 connections held open at once, a client that trickles
//! its headers (slowloris), one that stalls in its body, oversized headers. The server keeps
//! answering others, cuts the trickler after its header timeout and the staller after its body
//! timeout, refuses what is too big with a status, and gives back every file descriptor once
//! the connections close.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::{ACCOUNT, KuraProcess, TOKEN};

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

fn address(url: &str) -> String {
    url.trim_start_matches("http://").split('/').next().unwrap().to_owned()
}

fn healthz(api: &str) -> (Duration, String) {
    let started = Instant::now();
    let mut s = TcpStream::connect(address(api)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: kura\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    (started.elapsed(), answer)
}

#[test]
fn held_trickled_and_oversized_connections_do_not_starve_the_server() {
    let server = KuraProcess::start();
    let pid = server.pid();
    let baseline = open_fds(pid);

    // 2,000 connections held open, idle: others are still answered at once.
    let held: Vec<TcpStream> = (0..2_000).map(|_| TcpStream::connect(address(&server.api)).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(500));
    let (took, answer) = healthz(&server.api);
    assert!(answer.starts_with("HTTP/1.1 200") && took < Duration::from_secs(2), "{took:?} {answer}");

    // A client that sends its headers and then stalls in its body is answered (and cut) once
    // the body has stalled for its timeout; it runs beside the header trickler below.
    let mut staller = TcpStream::connect(address(&server.api)).unwrap();
    let api_path =
        server.api.trim_start_matches("http://").split_once('/').map_or(String::new(), |(_, p)| format!("/{p}"));
    let stalled_request = format!(
        "POST {api_path}/accounts/{ACCOUNT}/d1/database/none/query HTTP/1.1\r\nHost: kura\r\n\
         Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n\
         {{\"sql\": \"SELECT"
    );
    staller.write_all(stalled_request.as_bytes()).unwrap();
    let stalled_at = Instant::now();

    // A client that trickles its headers is cut once its header timeout passes.
    let mut trickler = TcpStream::connect(address(&server.api)).unwrap();
    trickler.write_all(b"GET /healthz HTTP/1.1\r\nHost: kura\r\n").unwrap();
    let started = Instant::now();
    let cut = loop {
        std::thread::sleep(Duration::from_secs(1));
        if trickler.write_all(b"X-Slow: 1\r\n").is_err() {
            break started.elapsed();
        }
        trickler.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
        let mut byte = [0u8; 512];
        if let Ok(n) = trickler.read(&mut byte) {
            // Closed (0), or an error answer before closing.
            if n == 0 || String::from_utf8_lossy(&byte[..n]).starts_with("HTTP/1.1 408") {
                break started.elapsed();
            }
        }
        assert!(
            started.elapsed() < kura_server::HEADER_READ_TIMEOUT + Duration::from_secs(15),
            "the trickler is never cut"
        );
    };
    assert!(cut >= kura_server::HEADER_READ_TIMEOUT - Duration::from_secs(2), "cut too early: {cut:?}");

    // The staller was answered 400 (its body never came whole) once its body had stalled for
    // the timeout, and the connection closed.
    staller.set_read_timeout(Some(kura_server::BODY_IDLE_TIMEOUT + Duration::from_secs(15))).unwrap();
    let mut answer = String::new();
    let _ = staller.read_to_string(&mut answer);
    let stalled_for = stalled_at.elapsed();
    assert!(answer.starts_with("HTTP/1.1 400"), "a stalled body: {answer:?} after {stalled_for:?}");
    assert!(
        stalled_for >= kura_server::BODY_IDLE_TIMEOUT - Duration::from_secs(2)
            && stalled_for < kura_server::BODY_IDLE_TIMEOUT + Duration::from_secs(15),
        "a stalled body was cut after {stalled_for:?}"
    );

    // Headers too big for the server get a status, not a hang or a crash.
    let mut big = TcpStream::connect(address(&server.api)).unwrap();
    big.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let header = format!("GET /healthz HTTP/1.1\r\nHost: kura\r\nX-Big: {}\r\n\r\n", "a".repeat(1 << 20));
    let _ = big.write_all(header.as_bytes());
    let mut answer = String::new();
    let _ = big.read_to_string(&mut answer);
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 431") || answer.starts_with("HTTP/1.1 400"), "{answer}");

    // Closing the held connections gives every descriptor back.
    drop(held);
    drop(trickler);
    drop(staller);
    drop(big);
    let deadline = Instant::now() + Duration::from_secs(10);
    while open_fds(pid) > baseline + 5 {
        assert!(Instant::now() < deadline, "descriptors leak: {} open, {baseline} at start", open_fds(pid));
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, answer) = healthz(&server.api);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[test]
fn an_overloaded_database_sheds_load_with_retry_after() {
    let server = KuraProcess::start();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let url = format!("{}/accounts/{ACCOUNT}/d1/database", server.api);
    let statuses = runtime.block_on(async {
        let made = client.post(&url).bearer_auth(TOKEN).json(&serde_json::json!({ "name": "busy" })).send().await.unwrap();
        assert!(made.status().is_success());
        // Far more slow queries at once than one database queues (512): the rest are refused.
        let slow = serde_json::json!({ "sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 100000) SELECT count(*) FROM c" });
        let flood = (0..1_500).map(|_| {
            let (client, url, slow) = (client.clone(), format!("{url}/busy/query"), slow.clone());
            tokio::spawn(async move {
                let answer = client.post(url).bearer_auth(TOKEN).json(&slow).send().await.unwrap();
                let retry_after = answer.headers().get("retry-after").is_some();
                let status = answer.status().as_u16();
                let body: serde_json::Value = answer.json().await.unwrap();
                (status, retry_after, body)
            })
        });
        let mut statuses = Vec::new();
        for task in flood.collect::<Vec<_>>() {
            statuses.push(task.await.unwrap());
        }
        statuses
    });
    let refused: Vec<_> = statuses.iter().filter(|(s, _, _)| *s != 200).collect();
    assert!(!refused.is_empty(), "1,500 slow queries at once never filled the queue");
    for (status, retry_after, body) in &refused {
        assert_eq!(*status, 429, "an overload answers 429: {body}");
        assert!(*retry_after, "a 429 without Retry-After");
        assert_eq!(body["errors"][0]["message"], "D1 DB is overloaded. Too many requests queued.");
    }
    let served = statuses.len() - refused.len();
    assert!(served >= 512, "only {served} of the queued queries were answered");
    eprintln!("overload: {served} answered, {} refused with 429 and Retry-After", refused.len());
}
