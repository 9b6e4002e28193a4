//! A disk that fills: kura on a size-limited tmpfs (mounted by the test; it needs root, as
//! `scripts/test` has for its Debian packages). D1 writes, the history log behind them, R2
//! uploads, bucket creation and Durable Object writes run into the limit: each answers a clear error in its protocol's
//! shape, reads go on, nothing acknowledged is lost or cut, no partial blob is left behind, and
//! once space is freed (the filesystem grown) writes succeed again without a restart. The same
//! for a D1 database's Time Travel history alone, and for a Durable Object's, each on a
//! filesystem of its own: the database is served read-only while its history cannot grow, and
//! every commit reaches the history once it can.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::common::{ACCOUNT, KuraProcess, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, TOKEN};

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(path: &Path, megabytes: u32) -> Tmpfs {
        std::fs::create_dir_all(path).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(path)
            .output();
        let out = out.expect("mount runs");
        assert!(
            out.status.success(),
            "mounting a tmpfs needs root (scripts/test runs as root or with sudo): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(path.to_owned())
    }

    fn resize(&self, megabytes: u32) {
        let out =
            Command::new("mount").args(["-o", &format!("remount,size={megabytes}m")]).arg(&self.0).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn blob_files(data: &Path) -> Vec<(PathBuf, u64)> {
    crate::common::files_under(&data.join("r2"))
        .into_iter()
        .filter(|path| path.components().any(|c| c.as_os_str() == "blobs"))
        .map(|path| {
            let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            (path, len)
        })
        .collect()
}

/// One SQL statement through the v4 query endpoint at `url`: its status and envelope.
async fn d1_query(client: &reqwest::Client, url: &str, sql: &str) -> (u16, Value) {
    let answer = client.post(url).bearer_auth(TOKEN).json(&json!({ "sql": sql })).send().await.unwrap();
    (answer.status().as_u16(), answer.json().await.unwrap())
}

fn body(i: u32, size: usize) -> Vec<u8> {
    (0..size).map(|j| (j as u32).wrapping_mul(2_654_435_761).wrapping_add(i) as u8).collect()
}

#[test]
fn a_full_disk_refuses_writes_clearly_keeps_everything_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let disk = Tmpfs::mount(&dir.path().join("disk"), 24);
    let data = disk.0.join("data");
    let server = KuraProcess::start_on(tempfile::tempdir().unwrap(), data.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = reqwest::Client::new();
    let v4 = |path: &str| format!("{}/accounts/{ACCOUNT}{path}", server.api);
    let s3 = |method: reqwest::Method, path: &str| {
        let url = format!("{}{path}", server.s3);
        let host = kura_client::sigv4::host_of(&url).to_owned();
        let signed = kura_client::sigv4::signed_headers(
            method.as_str(),
            &url,
            &[("host", &host)],
            S3_ACCESS_KEY_ID,
            S3_SECRET_ACCESS_KEY,
        )
        .unwrap();
        let mut request = client.request(method, &url);
        for (name, value) in signed {
            request = request.header(name, value);
        }
        request
    };
    let query = async |sql: &str| d1_query(&client, &v4("/d1/database/full/query"), sql).await;

    runtime.block_on(async {
        let made =
            client.post(v4("/d1/database")).bearer_auth(TOKEN).json(&json!({ "name": "full" })).send().await.unwrap();
        assert!(made.status().is_success());
        assert_eq!(query("CREATE TABLE b (i INTEGER, x BLOB)").await.0, 200);
        assert!(s3(reqwest::Method::PUT, "/fill").send().await.unwrap().status().is_success());
        // A Durable Object with a row, while there is room.
        let namespaces = v4("/workers/durable_objects/namespaces");
        let made = client.post(&namespaces).bearer_auth(TOKEN).json(&json!({ "name": "FULL" })).send().await.unwrap();
        assert!(made.status().is_success());
        let object = format!("{namespaces}/FULL/objects/room");
        let batch = async |sql: &str| -> (u16, Value) {
            let body = json!({ "operations": [{ "op": "sql", "sql": sql }] });
            let answer = client.post(format!("{object}/batch")).bearer_auth(TOKEN).json(&body).send().await.unwrap();
            (answer.status().as_u16(), answer.json().await.unwrap())
        };
        assert_eq!(batch("CREATE TABLE r (x BLOB)").await.0, 200);
        assert_eq!(batch("INSERT INTO r VALUES (randomblob(1000))").await.0, 200);

        // D1 until the disk refuses: every acknowledged row stays; the refusal is D1's error.
        // A 503 says the connection is reopening after the failed write: retried, as clients do,
        // it meets the disk's own error.
        let mut acknowledged = 0;
        let mut reopenings = 0;
        let refusal = loop {
            let (status, answer) = query(&format!("INSERT INTO b VALUES ({acknowledged}, randomblob(400000))")).await;
            if status == 200 {
                acknowledged += 1;
                assert!(acknowledged < 200, "the disk never filled");
                continue;
            }
            if status == 503 && reopenings < 5 {
                let message = answer["errors"][0]["message"].as_str().unwrap_or_default();
                assert!(message.contains("reopening"), "a 503 that does not say why: {answer}");
                reopenings += 1;
                continue;
            }
            break (status, answer);
        };
        let message = refusal.1["errors"][0]["message"].as_str().unwrap_or_default().to_owned();
        assert!(
            refusal.1["success"] == false && (message.contains("SQLITE_FULL") || message.contains("disk is full")),
            "a full disk is not a clear D1 error: {refusal:?}"
        );
        let (status, counted) = query("SELECT count(*) AS n, max(i) AS top FROM b").await;
        assert_eq!(status, 200, "reads go on: {counted}");
        assert_eq!(counted["result"][0]["results"][0]["n"], acknowledged, "an acknowledged row is missing");

        // R2 until the disk refuses: S3's shape, 507, and no blob left by a refused upload.
        let mut stored = Vec::new();
        for i in 0..40u32 {
            let answer = s3(reqwest::Method::PUT, &format!("/fill/o{i}")).body(body(i, 700_000)).send().await.unwrap();
            let status = answer.status().as_u16();
            let text = answer.text().await.unwrap();
            if status == 200 {
                stored.push(i);
                continue;
            }
            assert_eq!(status, 507, "a full disk over S3: {text}");
            assert!(text.contains("<Code>InsufficientStorage</Code>"), "{text}");
        }
        assert!(stored.len() < 40, "the disk never filled for R2");
        // A bucket can no longer be made: the v4 envelope, 507.
        let bucket =
            client.post(v4("/r2/buckets")).bearer_auth(TOKEN).json(&json!({ "name": "another" })).send().await.unwrap();
        let status = bucket.status().as_u16();
        let answer: Value = bucket.json().await.unwrap();
        assert!(status == 507 && answer["success"] == false, "a full disk over the v4 API: {status} {answer}");

        // A Durable Object's write is refused in the v4 envelope, changing nothing, and its
        // reads go on. (A 503 says its file is reopening after the failed write: retried.)
        let mut object_refusal = batch("INSERT INTO r VALUES (randomblob(1500000))").await;
        for _ in 0..5 {
            if object_refusal.0 != 503 {
                break;
            }
            object_refusal = batch("INSERT INTO r VALUES (randomblob(1500000))").await;
        }
        // SQLite's own error, as workerd reports it to a Worker, or the envelope's 507 when the
        // refusal comes from outside SQLite.
        let (status, answer) = object_refusal;
        let message = answer["errors"][0]["message"].as_str().unwrap_or_default();
        assert!(
            answer["success"] == false && (status == 507 || message.contains("SQLITE_FULL")),
            "a full disk for a Durable Object: {status} {answer}"
        );
        let (status, answer) = batch("SELECT count(*) AS n FROM r").await;
        assert_eq!(status, 200, "an object's reads go on: {answer}");
        assert_eq!(answer["result"]["results"][0]["rows"][0][0], 1, "{answer}");

        // Every listed object reads back whole; refused uploads left nothing.
        let listing = s3(reqwest::Method::GET, "/fill?list-type=2").send().await.unwrap().text().await.unwrap();
        let listed = listing.matches("<Key>").count();
        assert_eq!(listed, stored.len(), "{listing}");
        for &i in &stored {
            let read = s3(reqwest::Method::GET, &format!("/fill/o{i}")).send().await.unwrap().bytes().await.unwrap();
            assert!(read == body(i, 700_000), "object o{i} does not read back whole");
        }
        let blobs = blob_files(&data);
        assert_eq!(blobs.len(), stored.len(), "a refused upload left a blob behind: {blobs:?}");
        assert!(blobs.iter().all(|(_, size)| *size == 700_000), "a blob was cut: {blobs:?}");

        // Space freed: writes succeed again, no restart, the first one included (if the disk
        // filled while the D1 history appended rather than while the WAL did, the database
        // served read-only, and tries its history again before the write).
        disk.resize(64);
        let (status, answer) = query("INSERT INTO b VALUES (-1, randomblob(400000))").await;
        assert_eq!(status, 200, "D1 writes after space was freed: {answer}");
        let put = s3(reqwest::Method::PUT, "/fill/after").body(body(99, 700_000)).send().await.unwrap();
        assert!(put.status().is_success(), "R2 writes after space was freed: {}", put.text().await.unwrap());
        let bucket =
            client.post(v4("/r2/buckets")).bearer_auth(TOKEN).json(&json!({ "name": "another" })).send().await.unwrap();
        assert!(bucket.status().is_success(), "buckets after space was freed");
        let (_, counted) = query("SELECT count(*) AS n FROM b").await;
        assert_eq!(counted["result"][0]["results"][0]["n"], acknowledged + 1);
        let mut object_write = batch("INSERT INTO r VALUES (randomblob(1000))").await;
        for _ in 0..5 {
            if object_write.0 != 503 {
                break;
            }
            object_write = batch("INSERT INTO r VALUES (randomblob(1000))").await;
        }
        assert_eq!(object_write.0, 200, "Durable Object writes after space was freed: {}", object_write.1);
        // The history kept up: the bookmark of now restores to exactly this state.
        let bookmark: Value = client
            .get(v4("/d1/database/full/time_travel/bookmark"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let bookmark = bookmark["result"]["bookmark"].as_str().unwrap().to_owned();
        assert_eq!(query("DELETE FROM b").await.0, 200);
        let restored = client
            .post(v4(&format!("/d1/database/full/time_travel/restore?bookmark={bookmark}")))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert!(restored.status().is_success(), "{}", restored.text().await.unwrap());
        let (_, counted) = query("SELECT count(*) AS n FROM b").await;
        assert_eq!(
            counted["result"][0]["results"][0]["n"],
            acknowledged + 1,
            "the history lost a commit made around the full disk"
        );
    });
    // Nothing half-written is left behind: every history, database and blob checks out.
    let (_, data) = server.stop();
    let checked = crate::common::kura(dir.path(), &data, &["check"], &[]);
    assert!(checked.ok, "kura check after the disk filled: {}", checked.all());
    drop(disk);
}

/// Copies the files of `from` into `to` (one level: a history's log directory has no others).
fn copy_files(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// A database whose history a test moves onto a small filesystem: a D1 database or a Durable
/// Object, over the v4 API. Its table `b (i INTEGER, x BLOB)`.
trait HistoryHolder {
    /// Creates the database with its table; answers the name of the directory its files are in.
    async fn create(&self) -> String;
    /// One statement: its status and envelope.
    async fn run(&self, sql: &str) -> (u16, Value);
    /// The first value of the first row a read answered.
    fn first_value(answer: &Value) -> &Value;
    async fn bookmark(&self) -> String;
    async fn restore(&self, bookmark: &str);

    async fn count(&self) -> Value {
        let (status, counted) = self.run("SELECT count(*) AS n FROM b").await;
        assert_eq!(status, 200, "reads go on: {counted}");
        Self::first_value(&counted).clone()
    }
}

/// The D1 database `hist` of one server.
struct HistDb {
    client: reqwest::Client,
    account: String,
}

impl HistDb {
    fn new(api: &str) -> HistDb {
        HistDb { client: reqwest::Client::new(), account: format!("{api}/accounts/{ACCOUNT}") }
    }
}

impl HistoryHolder for HistDb {
    async fn create(&self) -> String {
        let made = self.client.post(format!("{}/d1/database", self.account)).bearer_auth(TOKEN);
        let made: Value = made.json(&json!({ "name": "hist" })).send().await.unwrap().json().await.unwrap();
        assert_eq!(self.run("CREATE TABLE b (i INTEGER, x BLOB)").await.0, 200);
        made["result"]["uuid"].as_str().unwrap().to_owned()
    }

    async fn run(&self, sql: &str) -> (u16, Value) {
        d1_query(&self.client, &format!("{}/d1/database/hist/query", self.account), sql).await
    }

    fn first_value(answer: &Value) -> &Value {
        let row = answer["result"][0]["results"][0].as_object().expect("a row");
        row.values().next().expect("a column")
    }

    async fn bookmark(&self) -> String {
        let url = format!("{}/d1/database/hist/time_travel/bookmark", self.account);
        let answer: Value = self.client.get(url).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap();
        answer["result"]["bookmark"].as_str().unwrap().to_owned()
    }

    async fn restore(&self, bookmark: &str) {
        let url = format!("{}/d1/database/hist/time_travel/restore?bookmark={bookmark}", self.account);
        let answer = self.client.post(url).bearer_auth(TOKEN).send().await.unwrap();
        assert!(answer.status().is_success(), "{}", answer.text().await.unwrap());
    }
}

/// The object `room` of the Durable Object namespace `HIST` of one server.
struct HistObject {
    client: reqwest::Client,
    namespaces: String,
    object: String,
}

impl HistObject {
    fn new(api: &str) -> HistObject {
        let namespaces = format!("{api}/accounts/{ACCOUNT}/workers/durable_objects/namespaces");
        let object = format!("{namespaces}/HIST/objects/room");
        HistObject { client: reqwest::Client::new(), namespaces, object }
    }
}

impl HistoryHolder for HistObject {
    async fn create(&self) -> String {
        let made = self.client.post(&self.namespaces).bearer_auth(TOKEN).json(&json!({ "name": "HIST" })).send().await;
        assert!(made.unwrap().status().is_success());
        let (status, made) = self.run("CREATE TABLE b (i INTEGER, x BLOB)").await;
        assert_eq!(status, 200, "{made}");
        made["result"]["id"].as_str().unwrap().to_owned()
    }

    async fn run(&self, sql: &str) -> (u16, Value) {
        let body = json!({ "operations": [{ "op": "sql", "sql": sql }] });
        let answer = self.client.post(format!("{}/batch", self.object)).bearer_auth(TOKEN).json(&body).send().await;
        let answer = answer.unwrap();
        (answer.status().as_u16(), answer.json().await.unwrap())
    }

    fn first_value(answer: &Value) -> &Value {
        &answer["result"]["results"][0]["rows"][0][0]
    }

    async fn bookmark(&self) -> String {
        let url = format!("{}/bookmark", self.object);
        let answer: Value = self.client.get(url).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap();
        answer["result"]["bookmark"].as_str().unwrap_or_else(|| panic!("a bookmark: {answer}")).to_owned()
    }

    async fn restore(&self, bookmark: &str) {
        let url = format!("{}/restore", self.object);
        let answer = self.client.post(url).bearer_auth(TOKEN).json(&json!({ "bookmark": bookmark })).send().await;
        let answer = answer.unwrap();
        assert!(answer.status().is_success(), "{}", answer.text().await.unwrap());
    }
}

/// Moves the history in `log` onto a filesystem of its own of 2 MB (the database file stays
/// where it was, with room to spare).
fn log_onto_a_small_disk(log: &Path, kept: &Path) -> Tmpfs {
    std::fs::rename(log, kept).unwrap();
    let disk = Tmpfs::mount(log, 2);
    copy_files(kept, log);
    disk
}

/// What a history that fills must do, `holder`'s history being on `disk` and holding three
/// rows, `before` their bookmark.
async fn fills_refuses_and_recovers<H: HistoryHolder>(holder: &H, disk: &Tmpfs, before: &str) {
    // Writes until the history cannot take one. The commit whose capture failed was
    // acknowledged (it is durable in the WAL, which keeps it until the log has it); every
    // write after it is refused as a full disk is, in the v4 envelope, and changes nothing. A
    // 503 says the file is reopening after the failed capture: retried, as clients do.
    let mut acknowledged = 0;
    let mut refused = 0;
    for i in 0..200 {
        let (status, answer) = holder.run(&format!("INSERT INTO b VALUES ({}, randomblob(100000))", 10 + i)).await;
        match status {
            200 => {
                assert_eq!(refused, 0, "a write was acknowledged after the history refused one");
                acknowledged += 1;
            }
            503 => {}
            _ => {
                assert_eq!(status, 507, "a history that cannot grow: {answer}");
                assert_eq!(answer["success"], false);
                refused += 1;
                if refused == 3 {
                    break;
                }
            }
        }
    }
    assert!(refused == 3 && acknowledged > 0, "the history never filled ({acknowledged} writes)");
    // Reads go on, and every acknowledged write is there.
    assert_eq!(holder.count().await, 3 + acknowledged);
    let (status, answer) = holder.run("SELECT max(i) AS top FROM b").await;
    assert_eq!((status, H::first_value(&answer)), (200, &json!(10 + acknowledged - 1)));

    // Room again: writes resume without a restart (the file reopens within a second of a
    // refused write and captures what the WAL held).
    disk.resize(64);
    let started = std::time::Instant::now();
    loop {
        let (status, answer) = holder.run("INSERT INTO b VALUES (-1, 1)").await;
        if status == 200 {
            break;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "writes never resumed: {answer}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(holder.count().await, 3 + acknowledged + 1);

    // The history kept every commit: the bookmark of now restores exactly, and so does the one
    // taken before the history was moved.
    let now = holder.bookmark().await;
    assert_eq!(holder.run("DELETE FROM b").await.0, 200);
    holder.restore(&now).await;
    assert_eq!(holder.count().await, 3 + acknowledged + 1, "the history lost a commit made while it was full");
    holder.restore(before).await;
    assert_eq!(holder.count().await, 3);
}

/// The directory named `name` somewhere under `dir`.
fn find_dir(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if entry.file_name() == name {
                return Some(path);
            }
            if let Some(found) = find_dir(&path, name) {
                return Some(found);
            }
        }
    }
    None
}

/// A database with three rows and a bookmark of them, then its history moved onto a small
/// filesystem of its own (its database file stays where it was, with room to spare), then
/// [`fills_refuses_and_recovers`], then `kura check`. `connect` reaches it on a server's API.
fn a_history_that_cannot_grow<H: HistoryHolder>(connect: fn(&str) -> H) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = KuraProcess::start_on(tempfile::tempdir().unwrap(), data.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (home, before) = runtime.block_on(async {
        let holder = connect(&server.api);
        let home = holder.create().await;
        assert_eq!(holder.run("INSERT INTO b VALUES (1, 1), (2, 2), (3, 3)").await.0, 200);
        (home, holder.bookmark().await)
    });
    let (server_dir, data) = server.stop();
    let files = find_dir(&data, &home).expect("the database's directory");
    let disk = log_onto_a_small_disk(&files.join("log"), &dir.path().join("log-before"));
    let server = KuraProcess::start_on(server_dir, data.clone());
    runtime.block_on(fills_refuses_and_recovers(&connect(&server.api), &disk, &before));
    let (_, data) = server.stop();
    let checked = crate::common::kura(dir.path(), &data, &["check"], &[]);
    assert!(checked.ok, "kura check after the history filled: {}", checked.all());
    drop(disk);
}

#[test]
fn a_history_log_that_cannot_grow_refuses_writes_clearly_and_recovers() {
    a_history_that_cannot_grow(HistDb::new);
}

/// The same for a Durable Object: its history alone on a small filesystem.
#[test]
fn an_objects_history_that_cannot_grow_refuses_writes_clearly_and_recovers() {
    a_history_that_cannot_grow(HistObject::new);
}
