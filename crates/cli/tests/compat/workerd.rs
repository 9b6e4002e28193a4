//! Real workerd (the runtime under wrangler dev and Miniflare), its own D1 binding
//! (`cloudflare-internal:d1-api`, unmodified) pointed at a live kura: `prepare/bind/run/all/
//! first/raw`, `batch`, `exec`, errors, and sessions, whose bookmarks are kura's Time Travel
//! bookmarks and restore exactly.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

use crate::common::{KuraProcess, TOKEN, installed, kura};

/// A `workerd serve` running `workerd/worker.js` with `env.DB` bound to a kura database.
struct Workerd {
    child: Child,
    address: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Workerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_address() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

impl Workerd {
    fn start(kura_api: &str, database: &str) -> Workerd {
        let dir = tempfile::tempdir().unwrap();
        let kura_host = kura_api.trim_start_matches("http://").split('/').next().unwrap();
        let address = free_address();
        std::fs::write(dir.path().join("worker.js"), include_str!("workerd/worker.js")).unwrap();
        // The binding's inner service is kura, reached over HTTP; the service injects the token
        // and the database name, since the binding's URLs are fixed (`http://d1/query`).
        let config = format!(
            r#"using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [
    (name = "main", worker = .worker),
    (name = "kura", external = (address = "{kura_host}", http = (injectRequestHeaders = [
      (name = "authorization", value = "Bearer {TOKEN}"),
      (name = "x-kura-d1-database", value = "{database}")]))),
  ],
  sockets = [(name = "http", address = "{address}", http = (), service = "main")],
);
const worker :Workerd.Worker = (
  modules = [(name = "worker.js", esModule = embed "worker.js")],
  compatibilityDate = "2025-04-01",
  bindings = [(name = "DB", wrapped = (moduleName = "cloudflare-internal:d1-api",
    innerBindings = [(name = "fetcher", service = "kura")]))],
);
"#
        );
        std::fs::write(dir.path().join("config.capnp"), config).unwrap();
        let child = Command::new(installed("node_modules/workerd/bin/workerd"))
            .args(["serve", "config.capnp"])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start workerd");
        let started = Instant::now();
        while TcpStream::connect(address).is_err() {
            assert!(started.elapsed() < Duration::from_secs(30), "workerd did not listen on {address}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Workerd { child, address, _dir: dir }
    }

    fn get(&self, path: &str) -> Json {
        let url = format!("http://{}{path}", self.address);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let response = reqwest::get(&url).await.unwrap();
            let status = response.status();
            let body = response.text().await.unwrap();
            assert!(status.is_success(), "{path}: {status} {body}");
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
        })
    }
}

#[test]
fn workerds_own_d1_binding_works_against_kura() {
    let server = KuraProcess::start();
    let (cwd, data, remote) = (server.dir.path().to_owned(), server.data.clone(), server.remote_env());
    let ok = |args: &[&str]| kura(&cwd, &data, args, &remote).expect_ok(&args.join(" "));
    ok(&["d1", "create", "worker-db", "--remote"]);
    let worker = Workerd::start(&server.api, "worker-db");

    let out = worker.get("/scenario");
    assert_eq!(out["exec"]["count"], 2, "{out}");
    let run_meta = &out["run"]["meta"];
    assert_eq!(
        (&run_meta["changes"], &run_meta["last_row_id"], &run_meta["changed_db"]),
        (&json!(1), &json!(1), &json!(true))
    );
    assert_eq!(run_meta["served_by"], "kura");
    assert_eq!(out["all"]["results"], json!([{"id": 1, "v": "one", "b": [1, 2, 3]}]));
    assert_eq!(out["first"], "one");
    assert_eq!(out["raw"], json!([["id", "v"], [1, "one"]]));
    assert_eq!(out["batch"][1]["results"], json!([{"n": 2}]));
    assert_eq!(out["batchError"], "D1_ERROR: no such table: nope: SQLITE_ERROR");
    assert_eq!(out["afterFailedBatch"], 2, "a failing batch changes nothing");
    assert_eq!(out["error"], "D1_ERROR: no such table: nope: SQLITE_ERROR");
    let bookmark = out["bookmark"].as_str().expect("a session's writes carry a bookmark").to_owned();
    assert_eq!(out["sessionRead"], 3, "a session resumed from a bookmark reads its writes");
    assert!(out["laterBookmark"].as_str().unwrap() >= bookmark.as_str());

    // The session's bookmark is a Time Travel bookmark: later writes are undone by restoring it.
    worker.get("/insert?v=four");
    assert_eq!(worker.get("/count"), 4);
    let current = ok(&["d1", "time-travel", "info", "worker-db", "--remote", "--json"]).json();
    assert!(current["bookmark"].as_str().unwrap() > bookmark.as_str());
    ok(&["d1", "time-travel", "restore", "worker-db", "--remote", &format!("--bookmark={bookmark}"), "--json"]);
    assert_eq!(worker.get("/count"), 3);
}
