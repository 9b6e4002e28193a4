//! Workers on kura: the Workers under `workers/`, written as Cloudflare's guides write them,
//! deployed with real wrangler 4.85.0 to a live `kura serve`, run by the real workerd it
//! supervises, and driven over HTTP — D1 (seat booking), R2 with aws4fetch presigning and D1
//! (photo uploads), Durable Objects (rooms), every R2 binding method against S3, redeploys
//! under load, a Worker that throws, bad deploys, secrets, deployments, delete and logs.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value as Json, json};

use crate::common::{KuraProcess, Run, Wrangler, compat_dir, kura};
use crate::s3_clients::ok as aws_ok;

/// A copy of one of the Workers under `workers/`, where wrangler can bundle it (aws4fetch
/// resolves from the compat directory's node_modules).
pub(crate) struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    pub(crate) fn new(name: &str) -> Project {
        let parent = compat_dir().join("projects");
        std::fs::create_dir_all(&parent).unwrap();
        let dir = tempfile::tempdir_in(&parent).unwrap();
        copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat/workers").join(name), dir.path());
        Project { dir }
    }

    /// A project of the files given (name, contents).
    pub(crate) fn with_files(files: &[(&str, &str)]) -> Project {
        let parent = compat_dir().join("projects");
        std::fs::create_dir_all(&parent).unwrap();
        let dir = tempfile::tempdir_in(&parent).unwrap();
        for (name, contents) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, contents).unwrap();
        }
        Project { dir }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn edit(&self, file: &str, from: &str, to: &str) {
        let path = self.path().join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{file} has no '{from}'");
        std::fs::write(path, text.replacen(from, to, 1)).unwrap();
    }
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A client of the Workers listener, reaching a Worker by its host name.
pub(crate) struct Client {
    pub(crate) http: reqwest::Client,
    base: String,
    runtime: tokio::runtime::Runtime,
}

impl Client {
    pub(crate) fn new(server: &KuraProcess) -> Client {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        Client { http: reqwest::Client::new(), base: server.workers.clone(), runtime }
    }

    pub(crate) fn request(&self, method: reqwest::Method, worker: &str, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, format!("{}{path}", self.base)).header("host", format!("{worker}.localhost"))
    }

    /// Sends and answers (status, body as JSON or as a string).
    pub(crate) fn send(&self, request: reqwest::RequestBuilder) -> (u16, Json) {
        self.runtime.block_on(answer(request))
    }

    pub(crate) fn get(&self, worker: &str, path: &str) -> Json {
        let (status, body) = self.send(self.request(reqwest::Method::GET, worker, path));
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    fn post(&self, worker: &str, path: &str) -> Json {
        let (status, body) = self.send(self.request(reqwest::Method::POST, worker, path));
        assert_eq!(status, 200, "POST {path}: {body}");
        body
    }

    /// Sends `requests` all at once; answers each (status, body).
    fn concurrently(&self, requests: Vec<reqwest::RequestBuilder>) -> Vec<(u16, Json)> {
        self.runtime.block_on(futures_util::future::join_all(requests.into_iter().map(answer)))
    }
}

async fn answer(request: reqwest::RequestBuilder) -> (u16, Json) {
    let response = request.send().await.expect("the Workers listener answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Json::String(text)))
}

pub(crate) fn deploy(w: &Wrangler<'_>, project: &Project, extra: &[&str]) -> Run {
    let mut args = vec!["deploy"];
    args.extend(extra);
    w.ok(project.path(), &args)
}

pub(crate) fn secret(w: &Wrangler<'_>, project: &Project, name: &str, value: &str) {
    let mut child = w.spawn(project.path(), &["secret", "put", name]);
    use std::io::Write;
    child.stdin.take().unwrap().write_all(value.as_bytes()).unwrap();
    let out = Run::from(child.wait_with_output().unwrap());
    assert!(out.ok && out.all().contains("Success! Uploaded secret"), "secret put {name}: {}", out.all());
}

fn kura_remote(server: &KuraProcess, args: &[&str]) -> Run {
    kura(server.dir.path(), &server.data, args, &server.remote_env())
}

/// The documented path as a newcomer takes it: `kura serve` with no `--data`, so on `./.kura`
/// relative to where it runs, and no workerd installed, then `wrangler deploy`. kura fetches
/// the pinned workerd itself (from the npm registry, checked against its pinned SHA-512) on
/// that first deploy, and every path it hands workerd (its configuration, the sockets, the
/// module files) must resolve from workerd's own directory.
#[test]
fn a_worker_deploys_and_serves_on_the_default_relative_data_directory() {
    // A project directory of a usual length: its deploy checks' sockets would be past the
    // kernel's 108 bytes under ./.kura/workers/run, where the served ones still fit.
    let dir = tempfile::tempdir().unwrap();
    let project = "projects-of-a-usual-length/my-first-worker-app";
    let length = dir.path().join(project).as_os_str().len();
    assert!((58..=64).contains(&length), "{length}");
    let server = KuraProcess::start_in(dir, project);
    let w = Wrangler::new(&server);
    let project = Project::new("seats");
    deploy(&w, &project, &[]);
    let fetched = server.data.join("workers/runtime").join(kura_workers::WORKERD_VERSION).join("workerd");
    assert!(fetched.is_file(), "kura fetched workerd into its data directory");
    let client = Client::new(&server);
    assert_eq!(client.get("seats", "/config")["greeting"], json!("welcome"));
    client.get("seats", "/setup?seats=1");
    assert_eq!(client.post("seats", "/book?who=newcomer")["booked"], true, "D1 through the binding socket");
    assert!(server.data.join("workers/versions").read_dir().unwrap().next().is_some(), "kept under ./.kura");
}

/// `npm install workerd@…` where kura runs, after kura started: the next deploy finds it (no
/// restart, nothing fetched).
#[test]
fn a_workerd_installed_after_kura_started_is_found_on_the_next_deploy() {
    let server = KuraProcess::start_in(tempfile::tempdir().unwrap(), "");
    let installed_here = server.dir.path().join("node_modules/workerd/bin");
    std::fs::create_dir_all(&installed_here).unwrap();
    std::os::unix::fs::symlink(compat_dir().join("node_modules/workerd/bin/workerd"), installed_here.join("workerd"))
        .unwrap();
    let w = Wrangler::new(&server);
    deploy(&w, &Project::new("seats"), &[]);
    assert_eq!(Client::new(&server).get("seats", "/config")["greeting"], json!("welcome"));
    assert!(!server.data.join("workers/runtime").exists(), "nothing was fetched");
}

#[test]
fn seat_booking_on_d1_books_exactly_the_seats_there_are() {
    let server = KuraProcess::start();
    let w = Wrangler::new(&server);
    let project = Project::new("seats");
    let first = deploy(&w, &project, &[]);
    assert!(first.all().contains("env.DB (seats-db)") && first.all().contains("Current Version ID"), "{}", first.all());
    secret(&w, &project, "API_KEY", "s3cr3t");
    let client = Client::new(&server);

    let config = client.get("seats", "/config");
    assert_eq!((&config["greeting"], &config["apiKey"]), (&json!("welcome"), &json!("s3cr3t")), "vars and secrets");
    assert_eq!(config["keys"], json!(["API_KEY", "DB", "GREETING"]));

    // 50 concurrent bookings for 10 seats: exactly 10 confirmed, no overbooking.
    client.get("seats", "/setup?seats=10");
    let bookings =
        (0..50).map(|i| client.request(reqwest::Method::POST, "seats", &format!("/book?who=guest{i}"))).collect();
    let answers = client.concurrently(bookings);
    let confirmed = answers.iter().filter(|(status, body)| *status == 200 && body["booked"] == true).count();
    let sold_out = answers.iter().filter(|(status, _)| *status == 409).count();
    assert_eq!((confirmed, sold_out), (10, 40), "{answers:?}");
    let state = client.get("seats", "/state");
    assert_eq!(state["event"], json!({"available": 0, "version": 10}), "the version advanced once per seat");
    assert_eq!(state["bookings"], 10);

    // The same idempotency key sent concurrently is claimed once.
    let claims = (0..20)
        .map(|i| client.request(reqwest::Method::POST, "seats", &format!("/claim?key=order-1&who=c{i}")))
        .collect();
    let claimed = client.concurrently(claims).iter().filter(|(_, body)| body["claimed"] == true).count();
    assert_eq!(claimed, 1);
    assert_eq!(client.get("seats", "/state")["claims"].as_array().unwrap().len(), 1);

    // A Worker that throws answers 500 and the server goes on serving; its console output and
    // exception reach `kura workers logs`.
    let (status, _) = client.send(client.request(reqwest::Method::GET, "seats", "/throw?who=eve"));
    assert_eq!(status, 500);
    assert_eq!(client.get("seats", "/state")["bookings"], 10);
    let mut logged = Json::Null;
    for _ in 0..100 {
        logged =
            kura_remote(&server, &["workers", "logs", "seats", "--remote", "--json"]).expect_ok("workers logs").json();
        if logged.as_array().is_some_and(|events| events.iter().any(|e| e["outcome"] == "exception")) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = logged.to_string();
    assert!(text.contains("about to throw for") && text.contains("kaboom for eve"), "{text}");
    let pretty = kura_remote(&server, &["workers", "logs", "seats", "--remote"]).expect_ok("workers logs");
    assert!(
        pretty.stdout.contains("(log) about to throw for eve") && pretty.stdout.contains("Error: kaboom for eve"),
        "{}",
        pretty.stdout
    );

    // A redeploy under load loses no request: requests wait while workerd restarts.
    let deployed = std::sync::atomic::AtomicBool::new(false);
    let load = std::thread::scope(|scope| {
        let loader = scope.spawn(|| client.load_until(&deployed, "seats", "/config"));
        project.edit("wrangler.toml", "GREETING = \"welcome\"", "GREETING = \"welcome back\"");
        deploy(&w, &project, &[]);
        deployed.store(true, std::sync::atomic::Ordering::SeqCst);
        loader.join().unwrap()
    });
    let failed: Vec<_> = load.iter().filter(|(status, _)| *status != 200).collect();
    assert!(failed.is_empty(), "requests failed during a redeploy: {failed:?}");
    assert!(load.iter().any(|(_, b)| b["greeting"] == "welcome back"), "the new version served after the deploy");
    assert_eq!(client.get("seats", "/config")["greeting"], "welcome back");
    assert_eq!(client.get("seats", "/config")["apiKey"], "s3cr3t", "secrets survive deploys");

    // Deployments and versions as wrangler lists them; the catalog as kura lists it.
    let deployments = w.ok(project.path(), &["deployments", "list"]);
    assert_eq!(deployments.stdout.matches("Version(s):").count(), 2, "{}", deployments.stdout);
    let listed = kura_remote(&server, &["workers", "list", "--remote", "--json"]).expect_ok("workers list").json();
    assert_eq!(listed[0]["id"], "seats");
    assert!(w.ok(project.path(), &["secret", "list"]).stdout.contains("API_KEY"));

    // A deploy naming a database that does not exist gets Cloudflare's error; nothing changes.
    let bad = Project::new("seats");
    bad.edit(
        "wrangler.toml",
        "database_name = \"seats-db\"",
        "database_name = \"seats-db\"\ndatabase_id = \"00000000-0000-4000-8000-000000000000\"",
    );
    let refused = w.run(bad.path(), &["deploy"]);
    assert!(!refused.ok && refused.all().contains("[code: 10181]"), "{}", refused.all());
    // A script that throws at start-up is refused by workerd before it replaces anything.
    std::fs::write(
        bad.path().join("src/index.js"),
        "throw new Error('broken at load');\nexport default { fetch() { return new Response('never'); } };\n",
    )
    .unwrap();
    bad.edit("wrangler.toml", "database_id = \"00000000-0000-4000-8000-000000000000\"", "");
    let refused = w.run(bad.path(), &["deploy"]);
    assert!(!refused.ok && refused.all().contains("Uncaught Error: broken at load"), "{}", refused.all());
    assert!(refused.all().contains("[code: 10021]"), "{}", refused.all());
    // A Durable Object binding to a class no migration declared.
    let bad = Project::new("seats");
    std::fs::write(
        bad.path().join("wrangler.toml"),
        std::fs::read_to_string(bad.path().join("wrangler.toml")).unwrap()
            + "\n[[durable_objects.bindings]]\nname = \"ROOMS\"\nclass_name = \"Room\"\nscript_name = \"elsewhere\"\n",
    )
    .unwrap();
    let refused = w.run(bad.path(), &["deploy"]);
    assert!(!refused.ok && refused.all().contains("[code: 10061]"), "{}", refused.all());
    assert_eq!(client.get("seats", "/config")["greeting"], "welcome back", "the deployed version serves on");
    let deployments = w.ok(project.path(), &["deployments", "list"]);
    assert_eq!(deployments.stdout.matches("Version(s):").count(), 2, "bad deploys deploy nothing");

    // A service binding: another Worker of the account calls this one.
    let gateway = Project::with_files(&[
        (
            "wrangler.toml",
            "name = \"gateway\"\nmain = \"src/index.js\"\ncompatibility_date = \"2025-06-01\"\n\n[[services]]\nbinding = \"SEATS\"\nservice = \"seats\"\n",
        ),
        (
            "src/index.js",
            "export default { async fetch(request, env) { const state = await (await env.SEATS.fetch('http://seats/state')).json(); return Response.json({ via: 'gateway', bookings: state.bookings }); } };\n",
        ),
    ]);
    deploy(&w, &gateway, &[]);
    assert_eq!(client.get("gateway", "/"), json!({"via": "gateway", "bookings": 10}));

    // workerd dies: kura starts it again, and requests go on.
    let workerd = workerd_of(server.pid()).expect("kura runs workerd");
    unsafe {
        libc::kill(workerd as i32, libc::SIGKILL);
    }
    let mut back = false;
    for _ in 0..100 {
        let (status, body) = client.send(client.request(reqwest::Method::GET, "seats", "/state"));
        if status == 200 && body["bookings"] == 10 {
            back = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(back, "kura restarted workerd");
    assert_ne!(workerd_of(server.pid()), Some(workerd));

    // Without a server, `kura workers` reads the data directory.
    drop(w);
    let (dir, data) = server.stop();
    let local =
        |args: &[&str]| kura(dir.path(), &data, args, &[("KURA_ACCOUNT_ID", crate::common::ACCOUNT.to_owned())]);
    let listed = local(&["workers", "list", "--json"]).expect_ok("workers list").json();
    let names: Vec<&str> = listed.as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(names, ["gateway", "seats"]);
    assert!(local(&["workers", "logs", "seats"]).expect_ok("workers logs").stdout.contains("kaboom for eve"));
    local(&["workers", "delete", "gateway"]).expect_ok("workers delete");
    let server = KuraProcess::start_on(dir, data);
    let w = Wrangler::new(&server);
    let client = Client::new(&server);
    assert_eq!(client.get("seats", "/state")["bookings"], 10, "seats serves again after the restart");

    // wrangler delete: the Worker stops serving.
    let deleted = w.ok(project.path(), &["delete", "--force"]);
    assert!(deleted.stdout.contains("Successfully deleted seats"), "{}", deleted.stdout);
    let (status, body) = client.send(client.request(reqwest::Method::GET, "seats", "/config"));
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        kura_remote(&server, &["workers", "list", "--remote", "--json"]).expect_ok("workers list").json(),
        json!([])
    );
}

/// The workerd process a kura server runs.
fn workerd_of(kura: u32) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        let (name, rest) = stat.split_once(") ")?;
        let parent: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        (name.ends_with("(workerd") && parent == kura).then_some(pid)
    })
}

impl Client {
    /// Keeps 4 requests in flight until `done`, and a little after; answers every one.
    fn load_until(&self, done: &std::sync::atomic::AtomicBool, worker: &str, path: &str) -> Vec<(u16, Json)> {
        self.runtime.block_on(async {
            let mut out = Vec::new();
            let mut after = 0;
            while after < 10 {
                if done.load(std::sync::atomic::Ordering::SeqCst) {
                    after += 1;
                }
                let batch = (0..4).map(|_| answer(self.request(reqwest::Method::GET, worker, path)));
                out.extend(futures_util::future::join_all(batch).await);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            out
        })
    }
}

#[test]
fn photo_uploads_presign_with_aws4fetch_store_blob_first_and_reclaim_unreferenced() {
    let server = KuraProcess::start();
    let w = Wrangler::new(&server);
    let project = Project::new("photos");
    let endpoint = format!("S3_ENDPOINT:{}", server.s3);
    deploy(&w, &project, &["--var", &endpoint]);
    secret(&w, &project, "S3_ACCESS_KEY_ID", crate::common::S3_ACCESS_KEY_ID);
    secret(&w, &project, "S3_SECRET_ACCESS_KEY", crate::common::S3_SECRET_ACCESS_KEY);
    let client = Client::new(&server);
    client.post("photos", "/setup");

    // The Worker presigns; the upload goes straight to S3 with the signed content type.
    let upload = client.post("photos", "/uploads?type=image/png");
    let url = upload["url"].as_str().unwrap().to_owned();
    assert!(url.contains("X-Amz-Expires=300") && url.contains("X-Amz-SignedHeaders=content-type%3Bhost"), "{url}");
    let put = |url: &str, content_type: &str| {
        client.runtime.block_on(async {
            let response = reqwest::Client::new()
                .put(url)
                .header("content-type", content_type)
                .body(vec![0x89, b'P', b'N', b'G'])
                .send()
                .await
                .unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        })
    };
    let other = client.post("photos", "/uploads?type=image/png");
    let (status, body) = put(other["url"].as_str().unwrap(), "text/html");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("SignatureDoesNotMatch"), "{body}");
    let (status, body) = client.send(client.request(
        reqwest::Method::POST,
        "photos",
        &format!("/uploads/{}/done", other["id"].as_str().unwrap()),
    ));
    assert_eq!((status, &body["reason"]), (409, &json!("the blob is not uploaded")), "a refused upload stores nothing");
    assert_eq!(put(&url, "image/png").0, 200);
    let done = client.post("photos", &format!("/uploads/{}/done", upload["id"].as_str().unwrap()));
    assert_eq!((&done["ready"], &done["size"], &done["type"]), (&json!(true), &json!(4), &json!("image/png")));

    // 2,500 photos, 500 of them referenced, plus a key that is not a photo; reclaim pages
    // through list() with cursors and deletes only the unreferenced UUID keys.
    client.post("photos", "/seed?count=2500&referenced=500");
    let reclaimed = client.post("photos", "/reclaim");
    assert_eq!(reclaimed["listed"], 2500 + 1 + 1, "the seeded photos, the README and the upload: {reclaimed}");
    assert_eq!(reclaimed["deleted"], 2000, "{reclaimed}");
    assert!(reclaimed["pages"].as_u64().unwrap() >= 3, "{reclaimed}");
    let left = aws_ok(&server, &["s3api", "list-objects-v2", "--bucket", "photos", "--prefix", "photos/"]);
    let left: Json = serde_json::from_str(&left).unwrap();
    assert_eq!(left["Contents"].as_array().unwrap().len(), 502, "500 referenced, the uploaded one and the README");
    assert!(left["Contents"].as_array().unwrap().iter().any(|o| o["Key"] == "photos/README.txt"));

    // Content-addressed blobs: a reference made while a reclaim runs keeps (or restores) its
    // blob, every time.
    for round in 0..15 {
        let body = format!("shared blob {round}");
        let made =
            client.send(client.request(reqwest::Method::POST, "photos", &format!("/refs/a{round}")).body(body.clone()));
        assert_eq!(made.0, 200, "{made:?}");
        client.send(client.request(reqwest::Method::DELETE, "photos", &format!("/refs/a{round}")));
        let race = vec![
            client.request(reqwest::Method::POST, "photos", "/reclaim-blobs"),
            client.request(reqwest::Method::POST, "photos", &format!("/refs/b{round}")).body(body),
        ];
        for (status, answer) in client.concurrently(race) {
            assert_eq!(status, 200, "{answer}");
        }
    }
    let audit = client.get("photos", "/audit");
    assert_eq!((&audit["referenced"], &audit["missing"]), (&json!(15), &json!([])), "{audit}");
}

#[test]
fn rooms_are_durable_objects_reached_by_name_and_listed_by_kura() {
    let server = KuraProcess::start();
    let w = Wrangler::new(&server);
    let project = Project::new("rooms");
    let deployed = deploy(&w, &project, &[]);
    assert!(deployed.all().contains("env.ROOMS (Room)"), "{}", deployed.all());
    let client = Client::new(&server);
    client.get("rooms", "/setup");

    assert_eq!(client.post("rooms", "/rooms/red/join?name=alice"), json!(["alice"]));
    assert_eq!(client.post("rooms", "/rooms/blue/join?name=bob"), json!(["bob"]));
    assert_eq!(client.get("rooms", "/rooms/red"), json!(["alice"]), "red again, by name, is the same object");
    let unique = client.get("rooms", "/unique");
    assert_eq!(unique["members"], json!([]), "a newUniqueId() room is empty");
    let directory = client.get("rooms", "/directory");
    assert_eq!(directory, json!([{"room": "blue", "name": "bob"}, {"room": "red", "name": "alice"}]));
    assert_eq!(client.get("rooms", "/collect"), directory, "D1's directory and the rooms agree");
    assert_eq!(client.get("rooms", "/collect?room=red"), json!([{"room": "red", "name": "alice"}]));

    // kura lists the objects workerd runs, by name, and reads them.
    let listed = kura_remote(&server, &["do", "list", "rooms_Room", "--remote", "--json"]).expect_ok("do list").json();
    let names: Vec<&str> = listed["objects"].as_array().unwrap().iter().filter_map(|o| o["name"].as_str()).collect();
    assert!(names.contains(&"room:red") && names.contains(&"room:blue"), "{listed}");
    let namespaces =
        kura_remote(&server, &["do", "namespace", "list", "--remote", "--json"]).expect_ok("namespaces").json();
    assert_eq!(namespaces[0]["host"], "workerd", "{namespaces}");
    let fanned = kura_remote(
        &server,
        &["do", "query-all", "rooms_Room", "SELECT name FROM members ORDER BY name", "--remote", "--json"],
    )
    .expect_ok("do query-all")
    .json();
    let mut from_kura: Vec<Json> = Vec::new();
    for object in fanned["objects"].as_array().unwrap() {
        let Some(room) = object["name"].as_str().and_then(|n| n.strip_prefix("room:")) else { continue };
        for row in object["rows"].as_array().unwrap() {
            from_kura.push(json!({"room": room, "name": row[0]}));
        }
    }
    from_kura.sort_by_key(|r| r["room"].as_str().unwrap().to_owned());
    assert_eq!(Json::Array(from_kura), client.get("rooms", "/collect"), "kura's fan-out equals the Worker's");
    let export = kura_remote(&server, &["do", "export", "rooms_Room", "room:red", "--remote"]).expect_ok("do export");
    assert!(
        export.stdout.contains("INSERT INTO \"members\"") && export.stdout.contains("'alice'"),
        "{}",
        export.stdout
    );
    let refused = kura_remote(&server, &["do", "sql", "rooms_Room", "room:red", "DELETE FROM members", "--remote"]);
    assert!(!refused.ok && refused.all().contains("run in workerd"), "{}", refused.all());
    assert_eq!(client.get("rooms", "/rooms/red"), json!(["alice"]), "kura never writes what workerd owns");

    // Point-in-time recovery of an object workerd runs: a bookmark taken before bob joined
    // red, restored, removes him; restoring the undo point brings him back.
    let api = |method: reqwest::Method, path: &str, body: Option<Json>| {
        let url = format!(
            "{}/accounts/{}/workers/durable_objects/namespaces/rooms_Room/objects/room:red/{path}",
            server.api,
            crate::common::ACCOUNT
        );
        let mut request = client.http.request(method, url).bearer_auth(crate::common::TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let (status, answer) = client.send(request);
        assert_eq!(status, 200, "{path}: {answer}");
        answer["result"].clone()
    };
    let before_bob = api(reqwest::Method::GET, "bookmark", None)["bookmark"].as_str().unwrap().to_owned();
    assert_eq!(client.post("rooms", "/rooms/red/join?name=bob"), json!(["alice", "bob"]));
    let restored = api(reqwest::Method::POST, "restore", Some(json!({"bookmark": before_bob})));
    assert_eq!(client.get("rooms", "/rooms/red"), json!(["alice"]), "the restore removed bob");
    let undo = restored["previous_bookmark"].as_str().unwrap().to_owned();
    api(reqwest::Method::POST, "restore", Some(json!({"bookmark": undo})));
    assert_eq!(client.get("rooms", "/rooms/red"), json!(["alice", "bob"]), "the restore is undone");

    // The configuration's binding names the deployed class's namespace; nothing new is made.
    let by_binding =
        kura(project.path(), &server.data, &["do", "list", "ROOMS", "--remote", "--json"], &server.remote_env())
            .expect_ok("do list ROOMS");
    assert!(!by_binding.stderr.contains("Creating namespace"), "{}", by_binding.stderr);
    assert_eq!(by_binding.json()["objects"].as_array().unwrap().len(), listed["objects"].as_array().unwrap().len());

    // Objects survive a restart of everything.
    let (dir, data) = server.stop();
    let server = KuraProcess::start_on(dir, data);
    let client = Client::new(&server);
    assert_eq!(client.post("rooms", "/rooms/red/join?name=carol"), json!(["alice", "bob", "carol"]));

    // A second class by a migration; rolling back to the version without it is refused by the
    // check every deployment gets, and changes nothing.
    let w = Wrangler::new(&server);
    std::fs::write(
        project.path().join("src/index.js"),
        std::fs::read_to_string(project.path().join("src/index.js")).unwrap()
            + "\nexport class Lobby extends DurableObject { ping() { return 'pong'; } }\n",
    )
    .unwrap();
    std::fs::write(
        project.path().join("wrangler.toml"),
        std::fs::read_to_string(project.path().join("wrangler.toml")).unwrap()
            + "\n[[durable_objects.bindings]]\nname = \"LOBBY\"\nclass_name = \"Lobby\"\n\n[[migrations]]\ntag = \"v2\"\nnew_sqlite_classes = [\"Lobby\"]\n",
    )
    .unwrap();
    deploy(&w, &project, &[]);
    let scripts = format!("{}/accounts/{}/workers/scripts/rooms", server.api, crate::common::ACCOUNT);
    let (_, versions) = client.send(client.http.get(format!("{scripts}/versions")).bearer_auth(crate::common::TOKEN));
    let first = versions["result"]["items"].as_array().unwrap().last().unwrap()["id"].as_str().unwrap().to_owned();
    let rollback = json!({"strategy": "percentage", "versions": [{"version_id": first, "percentage": 100}]});
    let (status, refused) = client
        .send(client.http.post(format!("{scripts}/deployments")).bearer_auth(crate::common::TOKEN).json(&rollback));
    assert_eq!((status, &refused["errors"][0]["code"]), (400, &json!(10021)), "{refused}");
    assert!(refused.to_string().contains("Lobby"), "{refused}");
    let (_, deployments) =
        client.send(client.http.get(format!("{scripts}/deployments")).bearer_auth(crate::common::TOKEN));
    assert_eq!(
        deployments["result"]["deployments"].as_array().unwrap().len(),
        2,
        "the refused rollback deployed nothing"
    );
    assert_eq!(client.get("rooms", "/rooms/red"), json!(["alice", "bob", "carol"]));
}

fn s3_json(server: &KuraProcess, args: &[&str]) -> Json {
    serde_json::from_str(&aws_ok(server, args)).unwrap()
}

#[test]
fn every_r2_binding_method_reads_and_writes_what_s3_sees() {
    let server = KuraProcess::start();
    let w = Wrangler::new(&server);
    let project = Project::new("files");
    deploy(&w, &project, &[]);
    let client = Client::new(&server);
    let put = |key: &str, query: &str, body: &str| {
        let request =
            client.request(reqwest::Method::PUT, "files", &format!("/objects/{key}?{query}")).body(body.to_owned());
        client.send(request)
    };

    // put, with HTTP and custom metadata, seen over S3.
    let (status, object) = put("docs/hello.txt", "type=text/plain&meta=%7B%22owner%22%3A%22ann%22%7D", "hello world");
    assert_eq!(status, 200, "{object}");
    assert_eq!(object["etag"], "5eb63bbbe01eeed093cb22bb8f5acdc3");
    assert_eq!(object["checksums"]["md5"], "5eb63bbbe01eeed093cb22bb8f5acdc3");
    let head = s3_json(&server, &["s3api", "head-object", "--bucket", "files", "--key", "docs/hello.txt"]);
    assert_eq!((&head["ContentType"], &head["Metadata"]), (&json!("text/plain"), &json!({"owner": "ann"})));
    assert_eq!(head["ETag"], "\"5eb63bbbe01eeed093cb22bb8f5acdc3\"");
    assert_eq!(head["CacheControl"], "max-age=60");

    // An object written over S3, read by the binding.
    let local = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(local.path(), "a,b\n1,2\n").unwrap();
    let source = local.path().display().to_string();
    aws_ok(
        &server,
        &[
            "s3api",
            "put-object",
            "--bucket",
            "files",
            "--key",
            "docs/data.csv",
            "--body",
            &source,
            "--content-type",
            "text/csv",
        ],
    );
    let read = client.get("files", "/objects/docs/data.csv");
    assert_eq!((&read["text"], &read["httpMetadata"]["contentType"]), (&json!("a,b\n1,2\n"), &json!("text/csv")));

    // get with ranges and conditions; head; misses.
    assert_eq!(client.get("files", "/objects/docs/hello.txt?offset=6&length=5")["text"], "world");
    let suffix = client.get("files", "/objects/docs/hello.txt?suffix=3");
    assert_eq!((&suffix["text"], &suffix["range"]), (&json!("rld"), &json!({"offset": 8, "length": 3})));
    assert_eq!(client.get("files", "/objects/docs/hello.txt?rangeHeader=bytes%3D0-4")["text"], "hello");
    let unchanged = client.get("files", "/objects/docs/hello.txt?ifNoneMatch=5eb63bbbe01eeed093cb22bb8f5acdc3");
    assert_eq!((&unchanged["hasBody"], &unchanged["key"]), (&json!(false), &json!("docs/hello.txt")));
    assert_eq!(client.get("files", "/objects/docs/hello.txt?head=1")["size"], 11);
    assert_eq!(client.get("files", "/objects/nope?head=1"), Json::Null);
    let (status, _) = client.send(client.request(reqwest::Method::GET, "files", "/objects/nope"));
    assert_eq!(status, 404);
    let (status, refused) = put("docs/hello.txt", "ifMatch=wrong", "replaced");
    assert_eq!((status, refused), (200, Json::Null), "a failed onlyIf put returns null and writes nothing");
    assert_eq!(client.get("files", "/objects/docs/hello.txt")["text"], "hello world");

    // list: prefix, limit and cursor, delimiter, startAfter, include.
    for i in 1..=5 {
        put(&format!("list/a/{i}"), "type=text/plain", "x");
    }
    put("list/b/1", "", "x");
    let first = client.get("files", "/list?prefix=list/a/&limit=2");
    assert_eq!((&first["keys"], &first["truncated"]), (&json!(["list/a/1", "list/a/2"]), &json!(true)));
    let cursor = first["cursor"].as_str().unwrap();
    let rest = client.get("files", &format!("/list?prefix=list/a/&cursor={cursor}"));
    assert_eq!((&rest["keys"], &rest["truncated"]), (&json!(["list/a/3", "list/a/4", "list/a/5"]), &json!(false)));
    let folded = client.get("files", "/list?prefix=list/&delimiter=/");
    assert_eq!(folded["delimitedPrefixes"], json!(["list/a/", "list/b/"]));
    assert_eq!(client.get("files", "/list?prefix=list/&startAfter=list/a/4")["keys"], json!(["list/a/5", "list/b/1"]));
    let included = client.get("files", "/list?prefix=list/a/&limit=1&include=httpMetadata");
    assert_eq!(
        included["objects"][0]["httpMetadata"],
        json!({"contentType": "text/plain", "cacheControl": "max-age=60"})
    );

    // delete one and many, seen over S3.
    client.send(client.request(reqwest::Method::DELETE, "files", "/objects/list/b/1"));
    client.send(client.request(reqwest::Method::POST, "files", "/delete-many").json(&json!(["list/a/1", "list/a/2"])));
    let listed = s3_json(&server, &["s3api", "list-objects-v2", "--bucket", "files", "--prefix", "list/"]);
    let keys: Vec<&str> = listed["Contents"].as_array().unwrap().iter().map(|o| o["Key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["list/a/3", "list/a/4", "list/a/5"]);

    // Multipart: create, resume, upload parts, complete; abort.
    let multipart = client.post("files", "/multipart?key=big.bin");
    let object = &multipart["object"];
    assert_eq!(object["size"], 5 * 1024 * 1024 + 4);
    assert!(object["etag"].as_str().unwrap().ends_with("-2"), "{multipart}");
    assert!(
        multipart["badPart"]["error"].as_str().unwrap().contains("Part number must be between 1 and 10000"),
        "{multipart}"
    );
    assert!(multipart["completeAborted"]["error"].as_str().unwrap().contains("(10024)"), "{multipart}");
    let head = s3_json(&server, &["s3api", "head-object", "--bucket", "files", "--key", "big.bin"]);
    assert_eq!(head["ETag"].as_str().unwrap(), format!("\"{}\"", object["etag"].as_str().unwrap()));
    assert_eq!((&head["ContentLength"], &head["Metadata"]), (&json!(5 * 1024 * 1024 + 4), &json!({"parts": "2"})));
    let uploads = s3_json(&server, &["s3api", "list-multipart-uploads", "--bucket", "files"]);
    assert!(
        uploads.get("Uploads").is_none_or(|u| u.as_array().unwrap().is_empty()),
        "the aborted upload is gone: {uploads}"
    );

    // R2's errors as workerd turns them into exceptions; none of them writes anything.
    put("small", "", "tiny");
    let errors = client.get("files", "/errors");
    let error = |name: &str| errors[name]["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        error("badDigest").contains("SHA-256 checksum you specified did not match")
            && error("badDigest").contains("(10037)"),
        "{errors}"
    );
    assert!(error("unknownLength").contains("known length"), "{errors}");
    assert_eq!(errors["failedPut"]["ok"], Json::Null);
    assert!(error("badRange").contains("(10039)"), "{errors}");
    assert!(error("badLimit").contains("(10022)"), "{errors}");
    assert!(error("longKey").contains("(10020)"), "{errors}");
    assert_eq!(errors["digestStored"], Json::Null, "a bad digest stores nothing");
}

#[test]
fn wrangler_dev_state_imports_and_the_deployed_worker_serves_it() {
    // wrangler dev's state, made by the Miniflare wrangler bundles, running the rooms Worker.
    let project = Project::new("rooms");
    let state = project.path().join(".wrangler/state/v3");
    // Beside node_modules (under the compat directory), where an ES module finds its imports.
    let maker = project.path().join("wrangler-state.mjs");
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat/workers/wrangler-state.mjs"), &maker)
        .unwrap();
    let made = crate::common::run(
        Path::new("node"),
        &[
            &maker.display().to_string(),
            &state.display().to_string(),
            &project.path().join("src/index.js").display().to_string(),
        ],
        &compat_dir(),
        &[],
    );
    assert!(made.ok, "{}", made.all());

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let state_arg = state.display().to_string();
    let config = project.path().join("wrangler.toml").display().to_string();
    let import = |env: &[(&str, String)]| {
        kura(dir.path(), &data, &["import", "wrangler-state", &state_arg, "--config", &config], env)
    };
    let env = [("KURA_ACCOUNT_ID", crate::common::ACCOUNT.to_owned())];
    let first = import(&env).expect_ok("import");
    assert!(first.stdout.contains("D1 database rooms-db"), "{}", first.stdout);
    assert!(first.stdout.contains("R2 bucket avatars: 1 object(s) imported"), "{}", first.stdout);
    assert!(first.stdout.contains("(namespace rooms_Room): 2 imported"), "{}", first.stdout);
    let cache = "c0ffee00c0ffee00c0ffee00c0ffee00";
    assert!(
        first.stdout.contains(&format!("KV namespace {cache} (id {cache}): 2 key(s) imported")),
        "{}",
        first.stdout
    );
    let again = import(&env).expect_ok("import again");
    assert!(again.stdout.contains("Imported 0 D1 database(s) (1 already here), 0 R2 object(s) (1 already here), 0 KV key(s) (2 already here), 0 Durable Object(s) (2 already here)"), "{}", again.stdout);

    // The Worker deployed from the same project serves what wrangler dev had stored.
    let server = KuraProcess::start_on(dir, data);
    let refused = kura(server.dir.path(), &server.data, &["import", "wrangler-state", &state_arg], &env);
    assert!(!refused.ok && refused.all().contains("in use by another kura process"), "{}", refused.all());
    let w = Wrangler::new(&server);
    deploy(&w, &project, &[]);
    let client = Client::new(&server);
    assert_eq!(client.get("rooms", "/rooms/red"), json!(["alice"]));
    assert_eq!(
        client.get("rooms", "/directory"),
        json!([{"room": "blue", "name": "bob"}, {"room": "red", "name": "alice"}])
    );
    let listed = kura_remote(&server, &["do", "list", "rooms_Room", "--remote", "--json"]).expect_ok("do list").json();
    let names: Vec<&str> = listed["objects"].as_array().unwrap().iter().filter_map(|o| o["name"].as_str()).collect();
    assert_eq!(names.len(), 2, "{listed}");
    assert!(names.contains(&"room:red") && names.contains(&"room:blue"), "{listed}");
    let head = s3_json(&server, &["s3api", "head-object", "--bucket", "avatars", "--key", "alice.png"]);
    assert_eq!(
        (&head["ContentType"], &head["Metadata"], &head["ContentLength"]),
        (&json!("image/png"), &json!({"owner": "alice"}), &json!(4))
    );
    // KV keys keep the namespace's id, their metadata and their expiry.
    let value = w.ok(project.path(), &["kv", "key", "get", "greeting", "--namespace-id", cache, "--remote", "--text"]);
    assert_eq!(value.stdout.trim_end(), "hello");
    let keys = w.ok(project.path(), &["kv", "key", "list", "--namespace-id", cache, "--remote"]).stdout;
    let keys: Json = serde_json::from_str(&keys[keys.find('[').unwrap()..]).unwrap();
    assert_eq!((&keys[0]["name"], &keys[0]["metadata"]), (&json!("greeting"), &json!({"lang": "en"})), "{keys}");
    assert!(keys[0]["expiration"].as_i64().unwrap() > jiff::Timestamp::now().as_second() + 80_000, "{keys}");
    assert_eq!((&keys[1]["name"], keys[1].get("expiration")), (&json!("large"), None), "{keys}");
}

/// Cron Triggers: `[triggers] crons` deploy as schedules (`GET …/schedules` reads them back, a bad
/// expression changes nothing), `kura workers trigger` runs the handler with the cron text and
/// scheduled time given (its `ctx.waitUntil` work done when it answers; a throw reported as an
/// exception, in `kura workers logs` too), and the schedule fires by itself at the next minute,
/// with `scheduledTime` that minute.
#[test]
fn cron_triggers_are_kept_fired_by_hand_and_fire_on_their_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = KuraProcess::start_with(dir, data, &["--test-scheduled".to_owned()], &[]);
    let w = Wrangler::new(&server);
    let project = Project::new("cron");
    let deployed = deploy(&w, &project, &[]);
    assert!(deployed.all().contains("schedule: * * * * *"), "{}", deployed.all());
    let client = Client::new(&server);
    let schedules_url = format!("{}/accounts/{}/workers/scripts/cronjob/schedules", server.api, crate::common::ACCOUNT);
    let api = |method: reqwest::Method, body: Option<Json>| -> Json {
        let mut request = client.http.request(method, &schedules_url).bearer_auth(crate::common::TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        client.runtime.block_on(async { request.send().await.unwrap().json().await.unwrap() })
    };
    let get_schedules = || api(reqwest::Method::GET, None);
    assert_eq!(get_schedules()["result"]["schedules"][0]["cron"], "* * * * *");
    let refused = api(reqwest::Method::PUT, Some(json!([{ "cron": "* * * * *" }, { "cron": "61 * * * *" }])));
    assert_eq!(refused["success"], false, "{refused}");
    assert!(refused["errors"][0]["message"].as_str().unwrap().contains("'61 * * * *'"), "{refused}");
    assert_eq!(get_schedules()["result"]["schedules"].as_array().unwrap().len(), 1, "nothing changed");

    let remote = server.remote_env();
    let trigger = |cron: &str, time: &str| {
        kura(
            project.path(),
            &server.data,
            &["workers", "trigger", "cronjob", "--cron", cron, "--time", time, "--remote"],
            &remote,
        )
    };
    let by_hand = trigger("*/5 * * * *", "1765000000000").expect_ok("workers trigger");
    assert!(by_hand.stdout.contains("\"*/5 * * * *\" - ok"), "{}", by_hand.stdout);
    assert_eq!(
        runs_by_hand(&client.get("cronjob", "/")),
        vec![json!({ "cron": "*/5 * * * *", "scheduled": 1765000000000_i64, "no_retry": "function" })],
        "the handler saw the cron and the time given, and its waitUntil work was done"
    );
    for i in 0..5 {
        trigger("0 * * * *", &(1765000000000_i64 + i * 3_600_000).to_string()).expect_ok("many triggers");
    }
    assert_eq!(runs_by_hand(&client.get("cronjob", "/")).len(), 6);

    // By URL, as Miniflare and `wrangler dev --test-scheduled` run it (kura serve --test-scheduled).
    let by_url = |path: &str| client.send(client.request(reqwest::Method::GET, "cronjob", path));
    assert_eq!(by_url("/cdn-cgi/handler/scheduled?cron=*%2F10+*+*+*+*&time=1765000600000"), (200, json!("ok")));
    assert_eq!(by_url("/__scheduled?cron=0+0+*+*+*&time=1765000000000"), (200, json!("Ran scheduled event")));
    assert_eq!(by_url("/cdn-cgi/handler/scheduled?cron=fail").0, 500);
    let runs = client.get("cronjob", "/");
    assert!(
        runs.as_array()
            .unwrap()
            .contains(&json!({ "cron": "*/10 * * * *", "scheduled": 1765000600000_i64, "no_retry": "function" })),
        "{runs}"
    );
    assert_eq!(runs_by_hand(&runs).len(), 8);
    let failed = trigger("fail", "1765000000000");
    assert!(!failed.ok && failed.all().contains("exception"), "{}", failed.all());
    let logs = wait_for(Duration::from_secs(10), || {
        let logs = kura(project.path(), &server.data, &["workers", "logs", "cronjob", "--remote"], &remote);
        logs.stdout.contains("\"fail\" @ 2025-12-06T05:46:40Z - Exception").then_some(logs)
    })
    .expect("the failed run is in the logs");
    assert!(logs.stdout.contains("the job failed"), "{}", logs.stdout);

    // A user's experimental compatibility flag — here the one kura's own trigger needs, with
    // which a Worker could fake a scheduled run — is refused at deploy: workerd checks an
    // upload without --experimental.
    let sneaky = Project::with_files(&[
        (
            "wrangler.toml",
            "name = \"sneaky\"\nmain = \"index.js\"\ncompatibility_date = \"2025-06-01\"\n\
             compatibility_flags = [\"service_binding_extra_handlers\"]\n",
        ),
        ("index.js", "export default { fetch() { return new Response('hi'); } };\n"),
    ]);
    let refused = w.run(sneaky.path(), &["deploy"]);
    assert!(!refused.ok && refused.all().contains("experimental"), "{}", refused.all());

    // By itself, at the next minute (one wait of up to a minute and a bit).
    let fired = wait_for(Duration::from_secs(75), || {
        let runs = client.get("cronjob", "/");
        runs.as_array().unwrap().iter().find(|r| r["cron"] == "* * * * *").cloned()
    })
    .expect("the schedule fired by itself within a minute");
    assert_eq!(fired["scheduled"].as_i64().unwrap() % 60_000, 0, "scheduledTime is the minute: {fired}");
}

/// `wrangler tail` as its users run it: `--format json` (what it prints when piped) and
/// `pretty`, several tails at once, one with a filter. Each tail gets every invocation from the
/// moment it is connected — requests that logged something, quiet ones, cron runs with their
/// logs — and only those its filters pass; a quiet request still stays out of `kura workers
/// logs`. A tail outlives wrangler's pings (every 10 s), and ends with wrangler.
#[test]
fn wrangler_tail_streams_each_invocation_live_with_its_logs_and_filters() {
    let server = KuraProcess::start();
    let w = Wrangler::new(&server);
    let project = Project::new("cron");
    deploy(&w, &project, &[]);
    let client = Client::new(&server);
    let started = std::time::Instant::now();
    let everything = Tail::start(&w, &project, &["tail", "cronjob", "--format", "json"]);
    let posts = Tail::start(&w, &project, &["tail", "cronjob", "--format", "json", "--method", "POST"]);
    let pretty = Tail::start(&w, &project, &["tail", "cronjob", "--format", "pretty"]);

    // Connected once a request that logs shows up (wrangler prints nothing on connecting in JSON).
    let mut n = 0;
    let said = |tail: &Tail, word: &str| {
        tail.events()
            .into_iter()
            .find(|e| e["logs"].as_array().is_some_and(|l| l.iter().any(|l| l["message"] == json!(["said", word]))))
    };
    // Events reach a tail a few milliseconds after the answer: any request so far will do.
    let hello = wait_for(Duration::from_secs(60), || {
        n += 1;
        client.get("cronjob", &format!("/?say=hello{n}"));
        (1..=n).find_map(|k| {
            let word = format!("hello{k}");
            said(&everything, &word).filter(|_| pretty.text().contains(&format!("(log) said {word}\n")))
        })
    })
    .unwrap_or_else(|| {
        panic!("a request's console.log reaches the tails: {}\n---\n{}", everything.text(), pretty.text())
    });
    assert_eq!(hello["scriptName"], "cronjob");
    assert_eq!(hello["outcome"], "ok");
    assert_eq!(hello["event"]["request"]["method"], "GET");
    assert!(hello["event"]["request"]["url"].as_str().unwrap().contains("/?say=hello"), "{hello}");
    assert_eq!(hello["logs"][0]["level"], "log");
    assert!(hello["eventTimestamp"].as_u64().is_some(), "{hello}");
    assert!(pretty.text().contains("Successfully created tail, expires at"), "{}", pretty.text());
    assert!(pretty.text().contains("Connected to cronjob, waiting for logs..."), "{}", pretty.text());
    assert!(pretty.text().contains("GET http://cronjob.localhost"), "{}", pretty.text());

    // A request that logs nothing reaches a tail too; a POST reaches the POST tail.
    client.get("cronjob", "/?quiet=1");
    client.post("cronjob", "/?posted=1");
    let url_of = |e: &Json| e["event"]["request"]["url"].as_str().unwrap_or("").to_owned();
    wait_for(Duration::from_secs(20), || {
        let urls: Vec<String> = everything.events().iter().map(url_of).collect();
        (urls.iter().any(|u| u.contains("quiet=1")) && urls.iter().any(|u| u.contains("posted=1"))).then_some(())
    })
    .expect("quiet requests are tailed");

    // A cron run, with its logs.
    let remote = server.remote_env();
    kura(
        project.path(),
        &server.data,
        &["workers", "trigger", "cronjob", "--cron", "*/5 * * * *", "--remote"],
        &remote,
    )
    .expect_ok("workers trigger");
    let cron = wait_for(Duration::from_secs(20), || {
        everything.events().into_iter().find(|e| e["event"]["cron"] == "*/5 * * * *")
    })
    .expect("a cron run is tailed");
    assert_eq!(cron["outcome"], "ok");
    assert!(cron["event"]["scheduledTime"].as_u64().is_some(), "{cron}");
    assert!(cron["logs"][0]["message"][0].as_str().unwrap().starts_with("running */5 * * * *"), "{cron}");
    wait_for(Duration::from_secs(20), || pretty.text().contains("\"*/5 * * * *\" @ ").then_some(()))
        .expect("pretty prints the cron run as wrangler does");

    let posted = posts.events();
    assert!(posted.iter().any(|e| url_of(e).contains("posted=1")), "{posted:?}");
    assert!(
        posted.iter().all(|e| e["event"]["request"]["method"] == "POST"),
        "the POST tail got only POSTs: {posted:?}"
    );
    let logs = kura(project.path(), &server.data, &["workers", "logs", "cronjob", "--remote"], &remote);
    assert!(logs.stdout.contains("said hello") && !logs.stdout.contains("quiet"), "{}", logs.stdout);

    let tails_url = format!("{}/accounts/{}/workers/scripts/cronjob/tails", server.api, crate::common::ACCOUNT);
    let open_tails = || -> usize {
        let listed: Json = client.runtime.block_on(async {
            client.http.get(&tails_url).bearer_auth(crate::common::TOKEN).send().await.unwrap().json().await.unwrap()
        });
        listed["result"].as_array().unwrap().len()
    };
    assert_eq!(open_tails(), 3);
    // Past two of wrangler's pings, each answered.
    std::thread::sleep(Duration::from_secs(25).saturating_sub(started.elapsed()));
    for tail in [everything, posts, pretty] {
        assert!(!tail.text().contains("Tail disconnected"), "{}", tail.text());
        let said = tail.stop();
        assert!(!said.contains("ERROR") && !said.contains("failed"), "wrangler left cleanly: {said}");
    }
    wait_for(Duration::from_secs(20), || (open_tails() == 0).then_some(())).expect("a tail ends with wrangler");
}

/// A running `wrangler tail`, its output gathered as it comes.
pub(crate) struct Tail {
    child: std::process::Child,
    stdout: std::sync::Arc<std::sync::Mutex<String>>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Tail {
    pub(crate) fn start(w: &Wrangler<'_>, project: &Project, args: &[&str]) -> Tail {
        let mut child = w.spawn(project.path(), args);
        let gather = |mut pipe: Box<dyn Read + Send>| {
            let output = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
            let gathered = std::sync::Arc::clone(&output);
            std::thread::spawn(move || {
                let mut buffer = [0u8; 8192];
                while let Ok(n) = pipe.read(&mut buffer) {
                    if n == 0 {
                        break;
                    }
                    gathered.lock().unwrap().push_str(&String::from_utf8_lossy(&buffer[..n]));
                }
            });
            output
        };
        let stdout = gather(Box::new(child.stdout.take().unwrap()));
        let stderr = gather(Box::new(child.stderr.take().unwrap()));
        Tail { child, stdout, stderr }
    }

    /// Everything it printed so far.
    pub(crate) fn text(&self) -> String {
        format!("{}{}", self.stdout.lock().unwrap(), self.stderr.lock().unwrap())
    }

    /// The JSON events printed so far (wrangler prints each indented, one after another).
    pub(crate) fn events(&self) -> Vec<Json> {
        let text = self.stdout.lock().unwrap().clone();
        let start = text.find('{').unwrap_or(text.len());
        serde_json::Deserializer::from_str(&text[start..]).into_iter::<Json>().map_while(Result::ok).collect()
    }

    /// Interrupts wrangler as a user's Ctrl-C does (it then closes its tail); answers what it
    /// printed on its way out.
    pub(crate) fn stop(mut self) -> String {
        let before = self.text().len();
        // SAFETY: kill(2) on a child this test started and has not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
        std::thread::sleep(Duration::from_millis(200));
        self.text()[before..].to_owned()
    }
}

/// Static assets as a framework template deploys them: wrangler's upload session (only files
/// kura lacks are uploaded), served before the Worker as Cloudflare serves them — HTML
/// handling, single-page-app fallback for navigations, `_redirects`, `_headers`, ETags, ranges,
/// `run_worker_first` routes and `env.ASSETS` — each version with its own files, so a rollback
/// serves the old ones; and an assets-only Worker with a 404 page.
#[test]
fn static_assets_upload_once_serve_before_the_worker_and_follow_rollbacks() {
    let server = KuraProcess::start();
    let w = Wrangler::new(&server);
    let project = Project::new("site");
    let first = deploy(&w, &project, &[]);
    assert!(first.all().contains("Uploaded 4 files"), "{}", first.all());
    let client = Client::new(&server);
    let plain = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let fetch = |method: &str, path: &str, headers: &[(&str, &str)]| -> (u16, reqwest::header::HeaderMap, String) {
        let mut request = plain
            .request(method.parse().unwrap(), format!("{}{path}", server.workers))
            .header("host", "site.localhost");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        client.runtime.block_on(async {
            let response = request.send().await.unwrap();
            let (status, headers) = (response.status().as_u16(), response.headers().clone());
            (status, headers, response.text().await.unwrap())
        })
    };
    let header = |headers: &reqwest::header::HeaderMap, name: &str| {
        headers.get(name).map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default()
    };

    let (status, headers, body) = fetch("GET", "/", &[]);
    assert_eq!((status, body.contains("the app shell")), (200, true), "{body}");
    assert!(header(&headers, "content-type").starts_with("text/html"), "{headers:?}");
    assert_eq!(header(&headers, "x-served-by"), "kura", "_headers applies");
    let etag = header(&headers, "etag");
    assert_eq!(etag.len(), 34, "a quoted 32-hex hash: {etag}");
    assert_eq!(fetch("GET", "/", &[("if-none-match", &etag)]).0, 304);
    assert_eq!(fetch("GET", "/about", &[]).2, "<!doctype html><title>about</title><p>about this site</p>\n");
    let (status, headers, _) = fetch("GET", "/about.html?x=1", &[]);
    assert_eq!((status, header(&headers, "location")), (307, "/about?x=1".to_owned()));
    assert_eq!(fetch("GET", "/docs/", &[]).0, 200);
    let (status, headers, _) = fetch("GET", "/old-about", &[]);
    assert_eq!((status, header(&headers, "location")), (301, "/about".to_owned()));
    assert_eq!(header(&fetch("GET", "/blog/intro", &[]).1, "location"), "/docs/intro");
    let (status, headers, body) = fetch("GET", "/app.js", &[("range", "bytes=0-10")]);
    assert_eq!((status, body.as_str()), (206, "console.log"));
    assert_eq!(header(&headers, "content-range"), "bytes 0-10/23");
    assert_eq!(header(&fetch("GET", "/app.js", &[]).1, "cache-control"), "public, max-age=60");
    assert_eq!(fetch("POST", "/app.js", &[]).0, 405);

    // A client-side route gets the app — a browser's navigation and, because `run_worker_first`
    // lists routes (Cloudflare's static routing), a script's fetch too; the listed routes reach
    // the Worker.
    for headers in [&[("sec-fetch-mode", "navigate")][..], &[]] {
        let (status, _, body) = fetch("GET", "/rooms/42", headers);
        assert_eq!((status, body.contains("the app shell")), (200, true), "{body}");
    }
    assert_eq!(fetch("GET", "/api/hello", &[]).2, r#"{"api":"/api/hello"}"#);
    assert_eq!(fetch("GET", "/api/asset", &[]).2, "asset 200: console.log(\"app v1\");\n");

    // A redeploy that changes one file uploads that one file.
    let versions_url = format!("{}/accounts/{}/workers/scripts/site/versions", server.api, crate::common::ACCOUNT);
    let (_, versions) = client.send(client.http.get(&versions_url).bearer_auth(crate::common::TOKEN));
    let first_version = versions["result"]["items"][0]["id"].as_str().unwrap().to_owned();
    std::fs::write(project.path().join("public/app.js"), "console.log(\"app v2\");\n").unwrap();
    let second = deploy(&w, &project, &[]);
    assert!(second.all().contains("Uploaded 1 file (3 already uploaded)"), "{}", second.all());
    assert_eq!(fetch("GET", "/app.js", &[]).2, "console.log(\"app v2\");\n");
    assert_ne!(header(&fetch("GET", "/app.js", &[]).1, "etag"), "", "a new file, a new ETag");
    // Nothing changed: nothing uploaded.
    let third = deploy(&w, &project, &[]);
    assert!(third.all().contains("No updated asset files to upload"), "{}", third.all());

    // Back to the first version: its files serve again.
    let rolled = w.ok(project.path(), &["rollback", &first_version, "--message", "back to v1", "-y"]);
    assert!(rolled.all().contains("SUCCESS") || rolled.all().contains("Success"), "{}", rolled.all());
    assert_eq!(fetch("GET", "/app.js", &[]).2, "console.log(\"app v1\");\n");
    assert_eq!(fetch("GET", "/api/asset", &[]).2, "asset 200: console.log(\"app v1\");\n");

    // An assets-only Worker: no script at all.
    let site = Project::new("static");
    deploy(&w, &site, &[]);
    let get = |path: &str| client.send(client.request(reqwest::Method::GET, "static", path));
    assert_eq!(get("/"), (200, json!("<p>static home</p>\n")));
    assert_eq!(get("/no/such/page"), (404, json!("<p>nothing here</p>\n")));

    // Deleted, its files go with it (each file and its type); the other Worker's stay.
    let stored = || crate::common::files_under(&server.data.join("workers/assets")).len();
    let before = stored();
    w.ok(site.path(), &["delete"]);
    assert_eq!(stored(), before - 4, "the two files of the deleted site, and their types");
    assert_eq!(fetch("GET", "/app.js", &[]).2, "console.log(\"app v1\");\n");
}

/// The guides' periodic jobs as Workers write them (workers/jobs): a D1 work queue whose claims
/// are leases with fencing tokens, and the R2 reclaim job, run many times by hand and by their
/// own `* * * * *` schedule. Every task is completed exactly once — a task whose holder died is
/// taken over under a new token, and the dead holder's late completion changes nothing — and
/// only unreferenced objects are deleted.
#[test]
fn periodic_jobs_claim_with_fencing_tokens_and_reclaim_orphans_on_their_schedule() {
    let server = KuraProcess::start();
    let w = Wrangler::new(&server);
    let project = Project::new("jobs");
    deploy(&w, &project, &[]);
    let client = Client::new(&server);
    client.get("jobs", "/enqueue?n=7");
    client.get("jobs", "/files?n=3");
    client.get("jobs", "/stale");
    let remote = server.remote_env();
    for i in 0..4 {
        let time = (1_765_000_000_000_i64 + i * 60_000).to_string();
        kura(
            project.path(),
            &server.data,
            &["workers", "trigger", "jobs", "--cron", "by-hand", "--time", &time, "--remote"],
            &remote,
        )
        .expect_ok("workers trigger");
    }
    let state = client.get("jobs", "/");
    let tasks = state["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 8, "{state}");
    for task in tasks {
        assert_eq!((&task["state"], &task["completions"]), (&json!("done"), &json!(1)), "each task once: {task}");
    }
    let stale = tasks.iter().find(|t| t["payload"] == "stale").unwrap();
    assert_eq!(stale["claim_token"], 2, "taken over under a new token: {stale}");
    assert!(stale["claimed_by"].as_str().unwrap().starts_with("cron@"), "{stale}");
    let late = client.get("jobs", &format!("/late-completion?id={}", stale["id"]));
    assert_eq!(late["changes"], 0, "the dead holder's completion is fenced off");
    assert_eq!(state["objects"], json!(["kept/0", "kept/1", "kept/2"]), "only the orphans were reclaimed");
    let runs = state["runs"].as_array().unwrap();
    assert_eq!(runs.iter().filter(|r| r["cron"] == "by-hand").count(), 4, "{state}");
    assert_eq!(runs.iter().map(|r| r["claimed"].as_i64().unwrap()).sum::<i64>(), 8);
    assert_eq!(runs.iter().map(|r| r["reclaimed"].as_i64().unwrap()).sum::<i64>(), 3);

    // Their own schedule: new work is done within a minute or so, by a `* * * * *` run.
    client.get("jobs", "/enqueue?n=2");
    client.get("jobs", "/files?n=4");
    let done = wait_for(Duration::from_secs(75), || {
        let state = client.get("jobs", "/");
        let all_done = state["tasks"].as_array().unwrap().iter().all(|t| t["state"] == "done");
        let scheduled = state["runs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["cron"] == "* * * * *" && r["claimed"].as_i64() > Some(0));
        (all_done && scheduled).then_some(state)
    })
    .expect("the schedule ran the jobs");
    assert_eq!(done["objects"].as_array().unwrap().len(), 4, "kept/0..3: {done}");
    for run in done["runs"].as_array().unwrap().iter().filter(|r| r["cron"] == "* * * * *") {
        assert_eq!(run["scheduled"].as_i64().unwrap() % 60_000, 0, "{run}");
    }
}

/// kura killed just before a minute starts and started again just after: no minute fires
/// twice, the minute that began while it was down is not replayed, and the schedule goes on.
#[test]
fn a_restart_across_a_minute_boundary_fires_no_minute_twice() {
    let server = KuraProcess::start();
    let w = Wrangler::new(&server);
    let project = Project::new("jobs");
    deploy(&w, &project, &[]);
    let client = Client::new(&server);
    let scheduled_minutes = |client: &Client| -> Vec<i64> {
        let state = client.get("jobs", "/");
        state["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["cron"] == "* * * * *")
            .map(|r| r["scheduled"].as_i64().unwrap())
            .collect()
    };
    let first = wait_for(Duration::from_secs(75), || scheduled_minutes(&client).first().copied()).expect("a first run");
    // Down from 1.5 s before the next minute to 1.5 s after it.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let boundary = (now / 60_000 + 1) * 60_000;
    std::thread::sleep(Duration::from_millis((boundary - now - 1_500).max(0) as u64));
    let (dir, data) = server.stop();
    std::thread::sleep(Duration::from_secs(3));
    let server = KuraProcess::start_on(dir, data);
    let client = Client::new(&server);
    let after = wait_for(Duration::from_secs(75), || {
        let minutes = scheduled_minutes(&client);
        minutes.iter().any(|m| *m > boundary).then_some(minutes)
    })
    .expect("the schedule goes on after the restart");
    let mut unique = after.clone();
    unique.dedup();
    assert_eq!(unique, after, "no minute fired twice: {after:?}");
    assert!(after.contains(&first), "{after:?}");
    assert!(!after.contains(&boundary), "the minute that began while kura was down is not replayed: {after:?}");
    assert!(after.windows(2).all(|w| w[0] < w[1]), "{after:?}");
}

/// The cron Worker's runs other than its own schedule's (`* * * * *`, which may fire at any
/// moment of the test).
fn runs_by_hand(runs: &Json) -> Vec<Json> {
    runs.as_array().unwrap().iter().filter(|r| r["cron"] != "* * * * *").cloned().collect()
}

/// `check`'s answer once it has one, polling every 250 ms up to `limit`.
pub(crate) fn wait_for<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(done) = check() {
            return Some(done);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}
