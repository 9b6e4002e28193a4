//! The authorization matrix: every surface's endpoints (the v4 API with its Workers and cluster
//! routes, the D1 and R2 binding protocols, S3, a deployed Worker, the console and the open
//! endpoints) against every kind of credential (none, malformed, unknown, revoked, each scope,
//! a bucket-limited token, the admin, another account's admin), on the real server. What each
//! credential may do is written once, as data ([`allowed`]); every cell is checked against it,
//! and every denied write is checked to have changed nothing. The Workers' binding socket,
//! whose one credential is this run's secret, is checked to refuse everyone else.

use std::fmt;

use reqwest::Method;
use serde_json::{Value, json};

use crate::common::{ACCOUNT, KuraProcess, TOKEN, kura};

const OTHER_ACCOUNT: &str = "other-account";
/// The bucket the bucket-limited token reaches; [`CLOSED`] is another of the same account.
const OPEN: &str = "open";
const CLOSED: &str = "closed";
/// An empty bucket, for the bucket deletion.
const SPARE: &str = "spare";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Credential {
    None,
    Malformed,
    Unknown,
    Revoked,
    D1Read,
    D1Write,
    R2Read,
    R2Write,
    DoRead,
    DoWrite,
    KvRead,
    KvWrite,
    QueuesRead,
    QueuesWrite,
    /// `r2:write` limited to [`OPEN`].
    BucketLimited,
    /// `admin` limited to [`OPEN`]: everything but other buckets, tokens, Workers (whose R2
    /// bindings would reach every bucket) and the cluster.
    BucketLimitedAdmin,
    Admin,
    OtherAccountAdmin,
}

const CREDENTIALS: [Credential; 18] = [
    Credential::None,
    Credential::Malformed,
    Credential::Unknown,
    Credential::Revoked,
    Credential::D1Read,
    Credential::D1Write,
    Credential::R2Read,
    Credential::R2Write,
    Credential::DoRead,
    Credential::DoWrite,
    Credential::KvRead,
    Credential::KvWrite,
    Credential::QueuesRead,
    Credential::QueuesWrite,
    Credential::BucketLimited,
    Credential::BucketLimitedAdmin,
    Credential::Admin,
    Credential::OtherAccountAdmin,
];

/// What an endpoint needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    Open,
    D1Read,
    D1Write,
    /// R2 reads; `Some` names the bucket, `None` is account-wide (the list of buckets).
    R2Read(Option<&'static str>),
    R2Write(Option<&'static str>),
    DoRead,
    DoWrite,
    KvRead,
    KvWrite,
    QueuesRead,
    QueuesWrite,
    /// Managing tokens: an admin token with no bucket limit.
    TokenAdmin,
    /// Workers and the cluster: an admin token.
    Admin,
    /// Any valid token, of any account: it answers about the token's own account.
    AnyToken,
    /// Any valid token of this account.
    AccountToken,
}

/// The matrix, written once. Surfaces that do not name the account in their path (S3, the
/// binding protocols) act in the credential's own account: there another account's admin may
/// list and make buckets of its own, and never reaches this account's.
fn allowed(credential: Credential, need: Need, surface: Surface) -> bool {
    use Credential as C;
    let valid = !matches!(credential, C::None | C::Malformed | C::Unknown | C::Revoked);
    match need {
        Need::Open => true,
        Need::AnyToken => valid,
        Need::AccountToken => valid && credential != C::OtherAccountAdmin,
        Need::R2Read(None) | Need::R2Write(None) if credential == C::OtherAccountAdmin => surface != Surface::V4,
        _ if credential == C::Admin => true,
        Need::D1Read
        | Need::D1Write
        | Need::DoRead
        | Need::DoWrite
        | Need::KvRead
        | Need::KvWrite
        | Need::QueuesRead
        | Need::QueuesWrite
            if credential == C::BucketLimitedAdmin =>
        {
            true
        }
        Need::D1Read => matches!(credential, C::D1Read | C::D1Write),
        Need::D1Write => credential == C::D1Write,
        Need::R2Read(bucket) => match credential {
            C::R2Read | C::R2Write => true,
            C::BucketLimited | C::BucketLimitedAdmin => bucket.is_none_or(|b| b == OPEN),
            _ => false,
        },
        // A bucket-limited token writes objects in its buckets only; it makes no buckets.
        Need::R2Write(bucket) => match credential {
            C::R2Write => true,
            C::BucketLimited | C::BucketLimitedAdmin => bucket == Some(OPEN),
            _ => false,
        },
        Need::DoRead => matches!(credential, C::DoRead | C::DoWrite),
        Need::DoWrite => credential == C::DoWrite,
        Need::KvRead => matches!(credential, C::KvRead | C::KvWrite),
        Need::KvWrite => credential == C::KvWrite,
        Need::QueuesRead => matches!(credential, C::QueuesRead | C::QueuesWrite),
        Need::QueuesWrite => credential == C::QueuesWrite,
        Need::TokenAdmin | Need::Admin => false,
    }
}

/// The credentials an allowed write is sent with, narrowest first: every valid credential of
/// this account (checked in the test).
const NARROWEST_FIRST: [Credential; 13] = [
    Credential::BucketLimited,
    Credential::D1Read,
    Credential::D1Write,
    Credential::R2Read,
    Credential::R2Write,
    Credential::DoRead,
    Credential::DoWrite,
    Credential::KvRead,
    Credential::KvWrite,
    Credential::QueuesRead,
    Credential::QueuesWrite,
    Credential::BucketLimitedAdmin,
    Credential::Admin,
];

/// What an allowed answer must hold beyond its status: a listing names what the credential may
/// see and nothing else (a bucket-limited token sees its bucket alone; another account's admin
/// sees none of this account's), and a read answers the fixture. `Err` says what is wrong.
fn shows(e: &Endpoint, c: Credential, body: &str) -> Result<(), String> {
    let limited = matches!(c, Credential::BucketLimited | Credential::BucketLimitedAdmin);
    let bucket = |name: &str| match e.surface {
        Surface::S3 => format!("<Name>{name}</Name>"),
        _ => format!("\"name\":\"{name}\""),
    };
    let (must, must_not): (Vec<String>, Vec<String>) = match e.name {
        "r2 buckets" | "s3 list buckets" if c == Credential::OtherAccountAdmin => {
            (vec![], vec![bucket(OPEN), bucket(CLOSED), bucket(SPARE)])
        }
        "r2 buckets" | "s3 list buckets" if limited => (vec![bucket(OPEN)], vec![bucket(CLOSED), bucket(SPARE)]),
        "r2 buckets" | "s3 list buckets" => (vec![bucket(OPEN), bucket(CLOSED), bucket(SPARE)], vec![]),
        "r2 list open" | "r2 list closed" => (vec!["\"key\":\"k\"".into()], vec![]),
        "r2 binding list closed" => (vec!["\"name\":\"k\"".into()], vec![]),
        "s3 list closed" => (vec!["<Key>k</Key>".into()], vec![]),
        "r2 get closed" | "s3 get closed" | "s3 get open" | "r2 binding get closed" => (vec!["fixture".into()], vec![]),
        "d1 list" | "d1 details" => (vec!["\"name\":\"fixture\"".into()], vec![]),
        "d1 select" | "d1 binding select" => (vec!["\"x\":1".into()], vec![]),
        "d1 raw select" => (vec!["[1]".into()], vec![]),
        "do namespaces" | "do namespace details" => (vec!["\"name\":\"ns\"".into()], vec![]),
        "do select" | "do explorer select" => (vec!["[1]".into()], vec![]),
        "do fan-out" => (vec!["\"name\":\"obj\"".into(), "\"rows\":[[2]]".into()], vec![]),
        "tokens list" => (vec!["\"name\":\"D1Read\"".into()], vec![]),
        "kv namespaces" | "kv namespace details" => (vec!["\"title\":\"fixture\"".into()], vec![]),
        "kv keys" => (vec!["\"name\":\"k\"".into()], vec![]),
        "kv get value" | "kv bulk get" => (vec!["fixture".into()], vec![]),
        "queues" | "queue details" => (vec!["\"queue_name\":\"fixture\"".into()], vec![]),
        "workers scripts" => (vec![WORKER.into()], vec![]),
        "workers script" => (vec!["the fixture".into()], vec![]),
        "worker fetch" => (vec!["the fixture".into()], vec![]),
        _ => (vec![], vec![]),
    };
    if let Some(missing) = must.iter().find(|m| !body.contains(m.as_str())) {
        return Err(format!("it does not show {missing}"));
    }
    if let Some(shown) = must_not.iter().find(|m| body.contains(m.as_str())) {
        return Err(format!("it shows {shown}"));
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Surface {
    V4,
    D1Binding,
    R2Binding,
    S3,
    Plain,
    /// The Workers listener, reaching a deployed Worker by its host name.
    Worker,
}

/// What an allowed request answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admitted {
    Success,
    /// Past authorization, a node that runs alone says so: 404 with code 7404.
    RunsAlone,
}

impl Admitted {
    fn holds(self, status: u16, body: &str) -> bool {
        match self {
            Admitted::Success => (200..300).contains(&status),
            Admitted::RunsAlone => status == 404 && body.contains("7404"),
        }
    }
}

/// One request of the matrix, with how to tell that a denied one changed nothing.
#[derive(Clone)]
struct Endpoint {
    name: &'static str,
    surface: Surface,
    method: Method,
    path: String,
    body: Option<Vec<u8>>,
    headers: Vec<(&'static str, String)>,
    need: Need,
    admitted: Admitted,
    /// A probe (run with the admin token) whose answer must be the same before and after a
    /// denied request.
    unchanged: Option<Probe>,
}

#[derive(Clone)]
struct Probe {
    method: Method,
    path: String,
    body: Option<Value>,
    /// Asked of S3 with the admin's key (what only S3 shows, as multipart uploads), not of
    /// the v4 API.
    s3: bool,
}

impl Probe {
    fn v4(method: Method, path: String, body: Option<Value>) -> Probe {
        Probe { method, path, body, s3: false }
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:?} {} {})", self.name, self.surface, self.method, self.path)
    }
}

struct Secrets {
    api: Vec<(Credential, String)>,
    /// S3 key pairs (id, secret) by credential.
    s3: Vec<(Credential, (String, String))>,
}

impl Secrets {
    fn api(&self, c: Credential) -> Option<&str> {
        self.api.iter().find(|(k, _)| *k == c).map(|(_, s)| s.as_str())
    }

    fn s3(&self, c: Credential) -> Option<&(String, String)> {
        self.s3.iter().find(|(k, _)| *k == c).map(|(_, s)| s)
    }
}

fn sha256_hex(text: &str) -> String {
    crate::common::sha256_hex(text.as_bytes())
}

async fn admin(
    client: &reqwest::Client,
    server: &KuraProcess,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Value {
    let url = format!("{}{path}", server.api);
    let mut request = client.request(method.clone(), &url).bearer_auth(TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let answer = request.send().await.unwrap();
    let status = answer.status();
    let text = answer.text().await.unwrap();
    assert!(status.is_success(), "{method} {path}: {status} {text}");
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

async fn probe(client: &reqwest::Client, server: &KuraProcess, secrets: &Secrets, p: &Probe) -> Value {
    if p.s3 {
        let (id, secret) = secrets.s3(Credential::Admin).expect("the admin's S3 key");
        let url = format!("{}{}", server.s3, p.path);
        let host = kura_client::sigv4::host_of(&url).to_owned();
        let mut request = client.request(p.method.clone(), &url);
        for (name, value) in
            kura_client::sigv4::signed_headers(p.method.as_str(), &url, &[("host", &host)], id, secret).unwrap()
        {
            request = request.header(name, value);
        }
        let answer = request.send().await.unwrap();
        let status = answer.status();
        let text = answer.text().await.unwrap();
        assert!(status.is_success(), "S3 {} {}: {status} {text}", p.method, p.path);
        return Value::String(text);
    }
    let mut answer = admin(client, server, p.method.clone(), &p.path, p.body.clone()).await;
    // Timings and bookmarks move with every read; what a probe compares is the data.
    strip_volatile(&mut answer);
    answer
}

fn strip_volatile(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for key in ["meta", "duration", "served_by", "timings"] {
                map.remove(key);
            }
            map.values_mut().for_each(strip_volatile);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_volatile),
        _ => {}
    }
}

fn v4(path: &str) -> String {
    format!("/accounts/{ACCOUNT}{path}")
}

fn binding_r2_write(method: &str, key: &str) -> (Vec<u8>, Vec<(&'static str, String)>) {
    let metadata = serde_json::to_vec(&json!({ "version": 1, "method": method, "object": key })).unwrap();
    let size = metadata.len().to_string();
    let mut body = metadata;
    body.extend_from_slice(b"written by the matrix");
    (body, vec![("cf-r2-metadata-size", size)])
}

/// The Worker the Workers endpoints act on, deployed with the fixtures.
const WORKER: &str = "fixture-worker";

/// An upload of a Worker answering `text`, with its headers.
fn worker_upload(text: &str) -> (Vec<u8>, Vec<(&'static str, String)>) {
    let metadata = json!({ "main_module": "worker.js", "compatibility_date": "2025-01-01" });
    let module = format!("export default {{ fetch() {{ return new Response({text:?}); }} }};");
    let (body, content_type) = crate::common::worker_upload(&metadata, &[("worker.js", &module)]);
    (body, vec![("content-type", content_type)])
}

/// The bookmarks the restores go back to: the fixture database's and the object's, as they
/// were once the fixtures were made (a row was added to each since, so a restore shows).
struct Bookmarks {
    d1: String,
    object: String,
    /// An import of the fixture database uploaded and waiting for its ingest: its etag and
    /// file name.
    import: (String, String),
    /// The version the fixture Worker runs, for the deployment.
    worker_version: String,
    /// The fixture KV namespace's id, and that of one to delete.
    kv: (String, String),
    /// The fixture queue's id (it has an HTTP pull consumer), and that of one to delete.
    queue: (String, String),
}

fn endpoints(bookmarks: &Bookmarks) -> Vec<Endpoint> {
    let count = |table: &str| {
        let sql = format!("SELECT count(*) AS n FROM {table}");
        Probe::v4(Method::POST, v4("/d1/database/fixture/query"), Some(json!({ "sql": sql })))
    };
    let d1_list = Probe::v4(Method::GET, v4("/d1/database"), None);
    let buckets = Probe::v4(Method::GET, v4("/r2/buckets"), None);
    let objects = |bucket: &str| Probe::v4(Method::GET, v4(&format!("/r2/buckets/{bucket}/objects")), None);
    // Multipart uploads in progress, which no object listing shows.
    let uploads = |bucket: &str| Probe { s3: true, ..Probe::v4(Method::GET, format!("/{bucket}?uploads"), None) };
    let do_rows = Probe::v4(
        Method::POST,
        v4("/workers/durable_objects/namespaces/ns/objects/obj/query"),
        Some(json!({ "sql": "SELECT count(*) FROM t" })),
    );
    let tokens = Probe::v4(Method::GET, v4("/tokens"), None);
    let kv_namespaces = Probe::v4(Method::GET, v4("/storage/kv/namespaces"), None);
    let kv = |tail: &str| v4(&format!("/storage/kv/namespaces/{}{tail}", bookmarks.kv.0));
    let kv_keys = Probe::v4(Method::GET, kv("/keys"), None);
    let queue_list = Probe::v4(Method::GET, v4("/queues"), None);
    let queue = |tail: &str| v4(&format!("/queues/{}{tail}", bookmarks.queue.0));
    let queue_details = Probe::v4(Method::GET, queue(""), None);
    let scripts = Probe::v4(Method::GET, v4("/workers/scripts"), None);
    let script = |tail: &str| v4(&format!("/workers/scripts/{WORKER}{tail}"));
    let script_probe = |tail: &str| Probe::v4(Method::GET, script(tail), None);
    let (upload, upload_headers) = worker_upload("made by the matrix");
    let (version, version_headers) = worker_upload("a version made by the matrix");
    let json_body = |v: Value| Some(serde_json::to_vec(&v).unwrap());
    let e = |name, surface, method, path: String, body, need, unchanged| Endpoint {
        name,
        surface,
        method,
        path,
        body,
        headers: Vec::new(),
        need,
        admitted: Admitted::Success,
        unchanged,
    };
    let (r2_put_open, r2_put_open_headers) = binding_r2_write("put", "binding-new");
    let (r2_put_closed, r2_put_closed_headers) = binding_r2_write("put", "binding-new");
    let binding_read = |method: &str| {
        let mut request = json!({ "version": 1, "method": method });
        if method != "list" {
            request["object"] = json!("k");
        }
        vec![("cf-r2-request", request.to_string())]
    };
    let (r2_delete_closed, r2_delete_closed_headers) = binding_r2_write("delete", "k-binding");
    let delete_xml = "<Delete><Object><Key>k-batch</Key></Object></Delete>";
    let delete_md5 = {
        use base64::Engine as _;
        use md5::Digest as _;
        base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(delete_xml.as_bytes()))
    };
    let select = json_body(json!({ "sql": "SELECT * FROM t" }));
    let insert = json_body(json!({ "sql": "INSERT INTO t VALUES (99)" }));
    vec![
        e("queues", Surface::V4, Method::GET, v4("/queues"), None, Need::QueuesRead, None),
        e(
            "queue create",
            Surface::V4,
            Method::POST,
            v4("/queues"),
            json_body(json!({ "queue_name": "made-by-the-matrix" })),
            Need::QueuesWrite,
            Some(queue_list.clone()),
        ),
        e("queue details", Surface::V4, Method::GET, queue(""), None, Need::QueuesRead, None),
        e("queue consumers", Surface::V4, Method::GET, queue("/consumers"), None, Need::QueuesRead, None),
        e(
            "queue send",
            Surface::V4,
            Method::POST,
            queue("/messages"),
            json_body(json!({ "body": "x", "content_type": "text" })),
            Need::QueuesWrite,
            Some(queue_details.clone()),
        ),
        e(
            "queue send batch",
            Surface::V4,
            Method::POST,
            queue("/messages/batch"),
            json_body(json!({ "messages": [{ "body": 1 }] })),
            Need::QueuesWrite,
            Some(queue_details.clone()),
        ),
        e(
            "queue pull",
            Surface::V4,
            Method::POST,
            queue("/messages/pull"),
            json_body(json!({ "batch_size": 1 })),
            Need::QueuesWrite,
            Some(queue_details.clone()),
        ),
        e(
            "queue update",
            Surface::V4,
            Method::PATCH,
            queue(""),
            json_body(json!({ "settings": { "delivery_delay": 7 } })),
            Need::QueuesWrite,
            Some(queue_details.clone()),
        ),
        e(
            "queue purge",
            Surface::V4,
            Method::POST,
            queue("/purge"),
            None,
            Need::QueuesWrite,
            Some(queue_details.clone()),
        ),
        e(
            "queue delete",
            Surface::V4,
            Method::DELETE,
            v4(&format!("/queues/{}", bookmarks.queue.1)),
            None,
            Need::QueuesWrite,
            Some(queue_list.clone()),
        ),
        e("kv namespaces", Surface::V4, Method::GET, v4("/storage/kv/namespaces"), None, Need::KvRead, None),
        e(
            "kv create namespace",
            Surface::V4,
            Method::POST,
            v4("/storage/kv/namespaces"),
            json_body(json!({ "title": "made-by-the-matrix" })),
            Need::KvWrite,
            Some(kv_namespaces.clone()),
        ),
        e("kv namespace details", Surface::V4, Method::GET, kv(""), None, Need::KvRead, None),
        e(
            "kv rename namespace",
            Surface::V4,
            Method::PUT,
            v4(&format!("/storage/kv/namespaces/{}", bookmarks.kv.1)),
            json_body(json!({ "title": "renamed-by-the-matrix" })),
            Need::KvWrite,
            Some(kv_namespaces.clone()),
        ),
        e("kv keys", Surface::V4, Method::GET, kv("/keys"), None, Need::KvRead, None),
        e("kv get value", Surface::V4, Method::GET, kv("/values/k"), None, Need::KvRead, None),
        e(
            "kv put value",
            Surface::V4,
            Method::PUT,
            kv("/values/v4-new"),
            Some(b"x".to_vec()),
            Need::KvWrite,
            Some(kv_keys.clone()),
        ),
        e(
            "kv delete value",
            Surface::V4,
            Method::DELETE,
            kv("/values/k-del"),
            None,
            Need::KvWrite,
            Some(kv_keys.clone()),
        ),
        e(
            "kv bulk put",
            Surface::V4,
            Method::PUT,
            kv("/bulk"),
            json_body(json!([{ "key": "bulk-new", "value": "x" }])),
            Need::KvWrite,
            Some(kv_keys.clone()),
        ),
        e(
            "kv bulk get",
            Surface::V4,
            Method::POST,
            kv("/bulk/get"),
            json_body(json!({ "keys": ["k"] })),
            Need::KvRead,
            None,
        ),
        e(
            "kv bulk delete",
            Surface::V4,
            Method::POST,
            kv("/bulk/delete"),
            json_body(json!(["k-bulk-del"])),
            Need::KvWrite,
            Some(kv_keys.clone()),
        ),
        e(
            "kv delete namespace",
            Surface::V4,
            Method::DELETE,
            v4(&format!("/storage/kv/namespaces/{}", bookmarks.kv.1)),
            None,
            Need::KvWrite,
            Some(kv_namespaces.clone()),
        ),
        e("healthz", Surface::Plain, Method::GET, "/healthz".into(), None, Need::Open, None),
        e("metrics", Surface::Plain, Method::GET, "/metrics".into(), None, Need::Open, None),
        e("console", Surface::Plain, Method::GET, "/console/".into(), None, Need::Open, None),
        e("d1 list", Surface::V4, Method::GET, v4("/d1/database"), None, Need::D1Read, None),
        e("d1 details", Surface::V4, Method::GET, v4("/d1/database/fixture"), None, Need::D1Read, None),
        e(
            "d1 create",
            Surface::V4,
            Method::POST,
            v4("/d1/database"),
            json_body(json!({ "name": "made-by-the-matrix" })),
            Need::D1Write,
            Some(d1_list.clone()),
        ),
        e("d1 select", Surface::V4, Method::POST, v4("/d1/database/fixture/query"), select.clone(), Need::D1Read, None),
        e(
            "d1 raw select",
            Surface::V4,
            Method::POST,
            v4("/d1/database/fixture/raw"),
            select.clone(),
            Need::D1Read,
            None,
        ),
        e(
            "d1 insert",
            Surface::V4,
            Method::POST,
            v4("/d1/database/fixture/query"),
            insert.clone(),
            Need::D1Write,
            Some(count("t")),
        ),
        e(
            "d1 bookmark",
            Surface::V4,
            Method::GET,
            v4("/d1/database/fixture/time_travel/bookmark"),
            None,
            Need::D1Read,
            None,
        ),
        e(
            "d1 history",
            Surface::V4,
            Method::GET,
            v4("/d1/database/fixture/time_travel/history"),
            None,
            Need::D1Read,
            None,
        ),
        e(
            "d1 export",
            Surface::V4,
            Method::POST,
            v4("/d1/database/fixture/export"),
            json_body(json!({ "output_format": "polling" })),
            Need::D1Read,
            None,
        ),
        e(
            "d1 delete",
            Surface::V4,
            Method::DELETE,
            v4("/d1/database/doomed"),
            None,
            Need::D1Write,
            Some(d1_list.clone()),
        ),
        e("r2 buckets", Surface::V4, Method::GET, v4("/r2/buckets"), None, Need::R2Read(None), None),
        e(
            "r2 create bucket",
            Surface::V4,
            Method::POST,
            v4("/r2/buckets"),
            json_body(json!({ "name": "made-by-the-matrix" })),
            Need::R2Write(None),
            Some(buckets.clone()),
        ),
        e(
            "r2 list open",
            Surface::V4,
            Method::GET,
            v4(&format!("/r2/buckets/{OPEN}/objects")),
            None,
            Need::R2Read(Some(OPEN)),
            None,
        ),
        e(
            "r2 list closed",
            Surface::V4,
            Method::GET,
            v4(&format!("/r2/buckets/{CLOSED}/objects")),
            None,
            Need::R2Read(Some(CLOSED)),
            None,
        ),
        e(
            "r2 get closed",
            Surface::V4,
            Method::GET,
            v4(&format!("/r2/buckets/{CLOSED}/objects/k")),
            None,
            Need::R2Read(Some(CLOSED)),
            None,
        ),
        e(
            "r2 put closed",
            Surface::V4,
            Method::PUT,
            v4(&format!("/r2/buckets/{CLOSED}/objects/v4-new")),
            Some(b"x".to_vec()),
            Need::R2Write(Some(CLOSED)),
            Some(objects(CLOSED)),
        ),
        e(
            "r2 put open",
            Surface::V4,
            Method::PUT,
            v4(&format!("/r2/buckets/{OPEN}/objects/v4-new")),
            Some(b"x".to_vec()),
            Need::R2Write(Some(OPEN)),
            Some(objects(OPEN)),
        ),
        e(
            "r2 delete closed",
            Surface::V4,
            Method::DELETE,
            v4(&format!("/r2/buckets/{CLOSED}/objects/k-v4")),
            None,
            Need::R2Write(Some(CLOSED)),
            Some(objects(CLOSED)),
        ),
        e(
            "do namespaces",
            Surface::V4,
            Method::GET,
            v4("/workers/durable_objects/namespaces"),
            None,
            Need::DoRead,
            None,
        ),
        e(
            "do objects",
            Surface::V4,
            Method::GET,
            v4("/workers/durable_objects/namespaces/ns/objects"),
            None,
            Need::DoRead,
            None,
        ),
        e(
            "do select",
            Surface::V4,
            Method::POST,
            v4("/workers/durable_objects/namespaces/ns/objects/obj/query"),
            json_body(json!({ "sql": "SELECT * FROM t" })),
            Need::DoRead,
            None,
        ),
        e(
            "do write",
            Surface::V4,
            Method::POST,
            v4("/workers/durable_objects/namespaces/ns/objects/obj/batch"),
            json_body(json!({ "operations": [{ "op": "sql", "sql": "INSERT INTO t VALUES (99)" }] })),
            Need::DoWrite,
            Some(do_rows.clone()),
        ),
        e(
            "do fan-out",
            Surface::V4,
            Method::POST,
            v4("/workers/durable_objects/namespaces/ns/fan_out"),
            json_body(json!({ "sql": "SELECT count(*) FROM t" })),
            Need::DoRead,
            None,
        ),
        e(
            "do create namespace",
            Surface::V4,
            Method::POST,
            v4("/workers/durable_objects/namespaces"),
            json_body(json!({ "name": "made-by-the-matrix" })),
            Need::DoWrite,
            Some(Probe::v4(Method::GET, v4("/workers/durable_objects/namespaces"), None)),
        ),
        e("workers scripts", Surface::V4, Method::GET, v4("/workers/scripts"), None, Need::Admin, None),
        e("tokens list", Surface::V4, Method::GET, v4("/tokens"), None, Need::TokenAdmin, None),
        e(
            "tokens create",
            Surface::V4,
            Method::POST,
            v4("/tokens"),
            json_body(json!({ "name": "made-by-the-matrix", "scope": "admin" })),
            Need::TokenAdmin,
            Some(tokens.clone()),
        ),
        e(
            "tokens revoke",
            Surface::V4,
            Method::DELETE,
            v4("/tokens/the-victim"),
            None,
            Need::TokenAdmin,
            Some(tokens.clone()),
        ),
        e(
            "d1 binding select",
            Surface::D1Binding,
            Method::POST,
            "/binding/d1/fixture/query".into(),
            select,
            Need::D1Read,
            None,
        ),
        e(
            "d1 binding insert",
            Surface::D1Binding,
            Method::POST,
            "/binding/d1/fixture/query".into(),
            insert,
            Need::D1Write,
            Some(count("t")),
        ),
        Endpoint {
            headers: vec![("cf-r2-request", json!({ "version": 1, "method": "head", "object": "k" }).to_string())],
            ..e(
                "r2 binding head closed",
                Surface::R2Binding,
                Method::GET,
                format!("/binding/r2/{CLOSED}"),
                None,
                Need::R2Read(Some(CLOSED)),
                None,
            )
        },
        Endpoint {
            headers: r2_put_closed_headers,
            ..e(
                "r2 binding put closed",
                Surface::R2Binding,
                Method::PUT,
                format!("/binding/r2/{CLOSED}"),
                Some(r2_put_closed),
                Need::R2Write(Some(CLOSED)),
                Some(objects(CLOSED)),
            )
        },
        Endpoint {
            headers: r2_put_open_headers,
            ..e(
                "r2 binding put open",
                Surface::R2Binding,
                Method::PUT,
                format!("/binding/r2/{OPEN}"),
                Some(r2_put_open),
                Need::R2Write(Some(OPEN)),
                Some(objects(OPEN)),
            )
        },
        e("s3 list buckets", Surface::S3, Method::GET, "/".into(), None, Need::R2Read(None), None),
        e("s3 get closed", Surface::S3, Method::GET, format!("/{CLOSED}/k"), None, Need::R2Read(Some(CLOSED)), None),
        e("s3 get open", Surface::S3, Method::GET, format!("/{OPEN}/k"), None, Need::R2Read(Some(OPEN)), None),
        e(
            "s3 put closed",
            Surface::S3,
            Method::PUT,
            format!("/{CLOSED}/s3-new"),
            Some(b"x".to_vec()),
            Need::R2Write(Some(CLOSED)),
            Some(objects(CLOSED)),
        ),
        e(
            "s3 put open",
            Surface::S3,
            Method::PUT,
            format!("/{OPEN}/s3-new"),
            Some(b"x".to_vec()),
            Need::R2Write(Some(OPEN)),
            Some(objects(OPEN)),
        ),
        e(
            "s3 delete closed",
            Surface::S3,
            Method::DELETE,
            format!("/{CLOSED}/k-s3"),
            None,
            Need::R2Write(Some(CLOSED)),
            Some(objects(CLOSED)),
        ),
        e(
            "s3 create bucket",
            Surface::S3,
            Method::PUT,
            "/made-by-s3".into(),
            None,
            Need::R2Write(None),
            Some(buckets.clone()),
        ),
        e(
            "s3 head closed bucket",
            Surface::S3,
            Method::HEAD,
            format!("/{CLOSED}"),
            None,
            Need::R2Read(Some(CLOSED)),
            None,
        ),
        e(
            "s3 list closed",
            Surface::S3,
            Method::GET,
            format!("/{CLOSED}?list-type=2"),
            None,
            Need::R2Read(Some(CLOSED)),
            None,
        ),
        e(
            "s3 start an upload in closed",
            Surface::S3,
            Method::POST,
            format!("/{CLOSED}/multipart?uploads"),
            None,
            Need::R2Write(Some(CLOSED)),
            Some(uploads(CLOSED)),
        ),
        Endpoint {
            headers: vec![("x-amz-copy-source", format!("/{OPEN}/k"))],
            ..e(
                "s3 copy into closed",
                Surface::S3,
                Method::PUT,
                format!("/{CLOSED}/copied"),
                None,
                Need::R2Write(Some(CLOSED)),
                Some(objects(CLOSED)),
            )
        },
        Endpoint {
            headers: vec![("content-md5", delete_md5)],
            ..e(
                "s3 delete objects in closed",
                Surface::S3,
                Method::POST,
                format!("/{CLOSED}?delete"),
                Some(delete_xml.as_bytes().to_vec()),
                Need::R2Write(Some(CLOSED)),
                Some(objects(CLOSED)),
            )
        },
        e(
            "d1 restore",
            Surface::V4,
            Method::POST,
            v4(&format!("/d1/database/fixture/time_travel/restore?bookmark={}", bookmarks.d1)),
            None,
            Need::D1Write,
            Some(count("t")),
        ),
        e(
            "d1 import init",
            Surface::V4,
            Method::POST,
            v4("/d1/database/fixture/import"),
            json_body(json!({ "action": "init", "etag": "0123456789abcdef0123456789abcdef" })),
            Need::D1Write,
            None,
        ),
        e(
            "d1 import",
            Surface::V4,
            Method::POST,
            v4("/d1/database/fixture/import"),
            json_body(json!({ "action": "ingest", "etag": bookmarks.import.0, "filename": bookmarks.import.1 })),
            Need::D1Write,
            Some(count("t")),
        ),
        e(
            "r2 bucket details closed",
            Surface::V4,
            Method::GET,
            v4(&format!("/r2/buckets/{CLOSED}")),
            None,
            Need::R2Read(Some(CLOSED)),
            None,
        ),
        e(
            "r2 delete bucket",
            Surface::V4,
            Method::DELETE,
            v4(&format!("/r2/buckets/{SPARE}")),
            None,
            Need::R2Write(Some(SPARE)),
            Some(buckets),
        ),
        e(
            "do namespace details",
            Surface::V4,
            Method::GET,
            v4("/workers/durable_objects/namespaces/ns"),
            None,
            Need::DoRead,
            None,
        ),
        e(
            "do export",
            Surface::V4,
            Method::GET,
            v4("/workers/durable_objects/namespaces/ns/objects/obj/export"),
            None,
            Need::DoRead,
            None,
        ),
        e(
            "do bookmark",
            Surface::V4,
            Method::GET,
            v4("/workers/durable_objects/namespaces/ns/objects/obj/bookmark"),
            None,
            Need::DoRead,
            None,
        ),
        e(
            "do restore",
            Surface::V4,
            Method::POST,
            v4("/workers/durable_objects/namespaces/ns/objects/obj/restore"),
            json_body(json!({ "bookmark": bookmarks.object })),
            Need::DoWrite,
            Some(do_rows.clone()),
        ),
        Endpoint {
            headers: binding_read("get"),
            ..e(
                "r2 binding get closed",
                Surface::R2Binding,
                Method::GET,
                format!("/binding/r2/{CLOSED}"),
                None,
                Need::R2Read(Some(CLOSED)),
                None,
            )
        },
        Endpoint {
            headers: binding_read("list"),
            ..e(
                "r2 binding list closed",
                Surface::R2Binding,
                Method::GET,
                format!("/binding/r2/{CLOSED}"),
                None,
                Need::R2Read(Some(CLOSED)),
                None,
            )
        },
        Endpoint {
            headers: r2_delete_closed_headers,
            ..e(
                "r2 binding delete closed",
                Surface::R2Binding,
                Method::PUT,
                format!("/binding/r2/{CLOSED}"),
                Some(r2_delete_closed),
                Need::R2Write(Some(CLOSED)),
                Some(objects(CLOSED)),
            )
        },
        e("accounts", Surface::V4, Method::GET, "/accounts".into(), None, Need::AnyToken, None),
        e("memberships", Surface::V4, Method::GET, "/memberships".into(), None, Need::AnyToken, None),
        e("token verify", Surface::V4, Method::GET, "/user/tokens/verify".into(), None, Need::AnyToken, None),
        e("account token verify", Surface::V4, Method::GET, v4("/tokens/verify"), None, Need::AccountToken, None),
        e(
            "d1 analytics",
            Surface::V4,
            Method::POST,
            "/graphql".into(),
            json_body(json!({
                "query": "query ($accountTag: string) { viewer { accounts(filter: { accountTag: $accountTag }) { d1AnalyticsAdaptiveGroups(limit: 10) { sum { readQueries } } } } }",
                "variables": { "accountTag": ACCOUNT },
            })),
            Need::D1Read,
            None,
        ),
        e(
            "do explorer select",
            Surface::V4,
            Method::POST,
            v4("/workers/durable_objects/namespaces/ns/query"),
            json_body(json!({ "durable_object_name": "obj", "queries": [{ "sql": "SELECT * FROM t" }] })),
            Need::DoRead,
            None,
        ),
        e(
            "do explorer write",
            Surface::V4,
            Method::POST,
            v4("/workers/durable_objects/namespaces/ns/query"),
            json_body(json!({ "durable_object_name": "obj", "queries": [{ "sql": "INSERT INTO t VALUES (98)" }] })),
            Need::DoWrite,
            Some(do_rows.clone()),
        ),
        e("worker fetch", Surface::Worker, Method::GET, "/".into(), None, Need::Open, None),
        e("workers script", Surface::V4, Method::GET, script(""), None, Need::Admin, None),
        e(
            "workers service",
            Surface::V4,
            Method::GET,
            v4(&format!("/workers/services/{WORKER}")),
            None,
            Need::Admin,
            None,
        ),
        e("workers settings", Surface::V4, Method::GET, script("/settings"), None, Need::Admin, None),
        e("workers subdomain", Surface::V4, Method::GET, script("/subdomain"), None, Need::Admin, None),
        e("workers account subdomain", Surface::V4, Method::GET, v4("/workers/subdomain"), None, Need::Admin, None),
        e("workers versions", Surface::V4, Method::GET, script("/versions"), None, Need::Admin, None),
        e("workers deployments", Surface::V4, Method::GET, script("/deployments"), None, Need::Admin, None),
        e("workers secrets", Surface::V4, Method::GET, script("/secrets"), None, Need::Admin, None),
        e("workers logs", Surface::V4, Method::GET, script("/logs"), None, Need::Admin, None),
        e("workers references", Surface::V4, Method::GET, script("/references"), None, Need::Admin, None),
        e("workers tails", Surface::V4, Method::GET, script("/tails"), None, Need::Admin, None),
        e(
            "workers tail open",
            Surface::V4,
            Method::POST,
            script("/tails"),
            json_body(json!({ "filters": [] })),
            Need::Admin,
            None,
        ),
        e(
            "workers assets upload session",
            Surface::V4,
            Method::POST,
            script("/assets-upload-session"),
            json_body(json!({ "manifest": {} })),
            Need::Admin,
            None,
        ),
        e("workers schedules", Surface::V4, Method::GET, script("/schedules"), None, Need::Admin, None),
        e(
            "workers schedules change",
            Surface::V4,
            Method::PUT,
            script("/schedules"),
            json_body(json!([{ "cron": "*/5 * * * *" }])),
            Need::Admin,
            Some(script_probe("/schedules")),
        ),
        // Settings are echoed, not kept: nothing a denied PATCH could change.
        e(
            "workers settings change",
            Surface::V4,
            Method::PATCH,
            script("/settings"),
            json_body(json!({ "logpush": true })),
            Need::Admin,
            None,
        ),
        e(
            "workers subdomain change",
            Surface::V4,
            Method::POST,
            script("/subdomain"),
            json_body(json!({ "enabled": true })),
            Need::Admin,
            Some(script_probe("/subdomain")),
        ),
        e(
            "workers deploy a version",
            Surface::V4,
            Method::POST,
            script("/deployments"),
            json_body(json!({
                "strategy": "percentage",
                "versions": [{ "version_id": bookmarks.worker_version, "percentage": 100 }],
            })),
            Need::Admin,
            Some(script_probe("/deployments")),
        ),
        Endpoint {
            headers: upload_headers,
            ..e(
                "workers upload",
                Surface::V4,
                Method::PUT,
                v4("/workers/scripts/made-by-the-matrix"),
                Some(upload),
                Need::Admin,
                Some(scripts.clone()),
            )
        },
        Endpoint {
            headers: version_headers,
            ..e(
                "workers version upload",
                Surface::V4,
                Method::POST,
                script("/versions"),
                Some(version),
                Need::Admin,
                Some(script_probe("/versions")),
            )
        },
        e(
            "workers secret put",
            Surface::V4,
            Method::PUT,
            script("/secrets"),
            json_body(json!({ "name": "MADE_BY_THE_MATRIX", "text": "s", "type": "secret_text" })),
            Need::Admin,
            Some(script_probe("/secrets")),
        ),
        e(
            "workers secret delete",
            Surface::V4,
            Method::DELETE,
            script("/secrets/FIXTURE_SECRET"),
            None,
            Need::Admin,
            Some(script_probe("/secrets")),
        ),
        Endpoint {
            admitted: Admitted::RunsAlone,
            ..e("cluster status", Surface::V4, Method::GET, v4("/kura/cluster"), None, Need::Admin, None)
        },
        Endpoint {
            admitted: Admitted::RunsAlone,
            ..e("cluster drain", Surface::V4, Method::POST, v4("/kura/cluster/drain"), None, Need::Admin, None)
        },
        // Last: the allowed writes run in this order, and the ones above use the Worker.
        e("workers delete", Surface::V4, Method::DELETE, script(""), None, Need::Admin, Some(scripts.clone())),
    ]
}

/// Sends one cell's request; answers its status and body.
async fn send(
    client: &reqwest::Client,
    server: &KuraProcess,
    secrets: &Secrets,
    e: &Endpoint,
    c: Credential,
) -> (u16, String) {
    let base = match e.surface {
        Surface::V4 => server.api.clone(),
        Surface::S3 => server.s3.clone(),
        Surface::Worker => server.workers.clone(),
        _ => server.api.trim_end_matches("/client/v4").to_owned(),
    };
    let url = format!("{base}{}", e.path);
    let mut request = client.request(e.method.clone(), &url);
    if e.surface == Surface::Worker {
        request = request.header("host", format!("{WORKER}.localhost"));
    }
    for (name, value) in &e.headers {
        request = request.header(*name, value);
    }
    if e.surface == Surface::S3 {
        match c {
            Credential::None => {}
            Credential::Malformed => request = request.header("authorization", "AWS4-HMAC-SHA256 nonsense"),
            _ => {
                let (id, secret) = secrets.s3(c).expect("every signed credential has an S3 key pair");
                let host = kura_client::sigv4::host_of(&url).to_owned();
                for (name, value) in
                    kura_client::sigv4::signed_headers(e.method.as_str(), &url, &[("host", &host)], id, secret).unwrap()
                {
                    request = request.header(name, value);
                }
            }
        }
    } else {
        match c {
            Credential::None => {}
            Credential::Malformed => request = request.header("authorization", "Basic bm90IGEgdG9rZW4="),
            _ => request = request.bearer_auth(secrets.api(c).expect("every bearer credential has a secret")),
        }
    }
    if let Some(body) = &e.body {
        request = request.body(body.clone());
    }
    let answer = request.send().await.unwrap();
    let status = answer.status().as_u16();
    (status, answer.text().await.unwrap_or_default())
}

#[test]
fn every_endpoint_against_every_credential() {
    let server = KuraProcess::start();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let client = reqwest::Client::new();

    // Another account, with its own admin token, database, bucket and namespace.
    let other = kura(server.dir.path(), &server.data, &["accounts", "create", "--id", OTHER_ACCOUNT], &[])
        .expect_ok("kura accounts create");
    let other_admin = other
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("Admin API token (shown only this once): "))
        .expect("the other account's token")
        .trim()
        .to_owned();

    let secrets = runtime.block_on(async {
        // Fixtures of the account under test.
        admin(&client, &server, Method::POST, &v4("/d1/database"), Some(json!({ "name": "fixture" }))).await;
        admin(&client, &server, Method::POST, &v4("/d1/database"), Some(json!({ "name": "doomed" }))).await;
        admin(
            &client,
            &server,
            Method::POST,
            &v4("/d1/database/fixture/query"),
            Some(json!({ "sql": "CREATE TABLE t (x); INSERT INTO t VALUES (1)" })),
        )
        .await;
        admin(&client, &server, Method::POST, &v4("/r2/buckets"), Some(json!({ "name": SPARE }))).await;
        for bucket in [OPEN, CLOSED] {
            admin(&client, &server, Method::POST, &v4("/r2/buckets"), Some(json!({ "name": bucket }))).await;
        }
        // Each delete has a key of its own, so each allowed one is seen to delete.
        let fixtures = [
            (OPEN, "k"),
            (CLOSED, "k"),
            (CLOSED, "k-v4"),
            (CLOSED, "k-s3"),
            (CLOSED, "k-batch"),
            (CLOSED, "k-binding"),
        ];
        for (bucket, key) in fixtures {
            let url = format!("{}{}", server.api, v4(&format!("/r2/buckets/{bucket}/objects/{key}")));
            assert!(client.put(url).bearer_auth(TOKEN).body("fixture").send().await.unwrap().status().is_success());
        }
        admin(
            &client,
            &server,
            Method::POST,
            &v4("/workers/durable_objects/namespaces"),
            Some(json!({ "name": "ns" })),
        )
        .await;
        admin(
            &client,
            &server,
            Method::POST,
            &v4("/workers/durable_objects/namespaces/ns/objects/obj/query"),
            Some(json!([{ "sql": "CREATE TABLE t (x)" }, { "sql": "INSERT INTO t VALUES (1)" }])),
        )
        .await;

        let (upload, headers) = worker_upload("the fixture");
        let mut request =
            client.put(format!("{}{}", server.api, v4(&format!("/workers/scripts/{WORKER}")))).bearer_auth(TOKEN);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let deployed = request.body(upload).send().await.unwrap();
        assert!(deployed.status().is_success(), "deploying the fixture Worker: {}", deployed.text().await.unwrap());
        admin(
            &client,
            &server,
            Method::PUT,
            &v4(&format!("/workers/scripts/{WORKER}/secrets")),
            Some(json!({ "name": "FIXTURE_SECRET", "text": "s", "type": "secret_text" })),
        )
        .await;

        let mut api = vec![(Credential::Admin, TOKEN.to_owned()), (Credential::OtherAccountAdmin, other_admin.clone())];
        let mut s3 = Vec::new();
        let scoped = [
            (Credential::D1Read, "d1:read", None),
            (Credential::D1Write, "d1:write", None),
            (Credential::R2Read, "r2:read", None),
            (Credential::R2Write, "r2:write", None),
            (Credential::DoRead, "do:read", None),
            (Credential::DoWrite, "do:write", None),
            (Credential::KvRead, "kv:read", None),
            (Credential::KvWrite, "kv:write", None),
            (Credential::QueuesRead, "queues:read", None),
            (Credential::QueuesWrite, "queues:write", None),
            (Credential::BucketLimited, "r2:write", Some(json!([OPEN]))),
            (Credential::BucketLimitedAdmin, "admin", Some(json!([OPEN]))),
            (Credential::Revoked, "admin", None),
        ];
        for (credential, scope, buckets) in scoped {
            let mut body = json!({ "name": format!("{credential:?}"), "scope": scope });
            if let Some(b) = buckets {
                body["buckets"] = b;
            }
            let made = admin(&client, &server, Method::POST, &v4("/tokens"), Some(body)).await;
            let (id, secret) = (
                made["result"]["id"].as_str().unwrap().to_owned(),
                made["result"]["value"].as_str().unwrap().to_owned(),
            );
            if credential == Credential::Revoked {
                admin(&client, &server, Method::DELETE, &v4(&format!("/tokens/{id}")), None).await;
            }
            s3.push((credential, (id, sha256_hex(&secret))));
            api.push((credential, secret));
        }
        api.push((Credential::Unknown, "an-unknown-token-0123456789abcdefghijklmn".to_owned()));
        s3.push((Credential::Unknown, ("0123456789abcdef0123456789abcdef".to_owned(), sha256_hex("unknown"))));
        // The admin's S3 key is the one R2 derives from its token; the other account's too.
        let id_of = async |secret: &str| -> String {
            let answer =
                client.get(format!("{}/user/tokens/verify", server.api)).bearer_auth(secret).send().await.unwrap();
            answer.json::<Value>().await.unwrap()["result"]["id"].as_str().unwrap().to_owned()
        };
        s3.push((Credential::Admin, (id_of(TOKEN).await, sha256_hex(TOKEN))));
        s3.push((Credential::OtherAccountAdmin, (id_of(&other_admin).await, sha256_hex(&other_admin))));
        Secrets { api, s3 }
    });

    let bookmarks = runtime.block_on(async {
        let d1 = admin(&client, &server, Method::GET, &v4("/d1/database/fixture/time_travel/bookmark"), None).await;
        let object = v4("/workers/durable_objects/namespaces/ns/objects/obj/bookmark");
        let object = admin(&client, &server, Method::GET, &object, None).await;
        let deployments = v4(&format!("/workers/scripts/{WORKER}/deployments"));
        let deployments = admin(&client, &server, Method::GET, &deployments, None).await;
        // A row more in each since the bookmarks, so a restore to them changes what a probe sees.
        let insert = json!({ "sql": "INSERT INTO t VALUES (2)" });
        admin(&client, &server, Method::POST, &v4("/d1/database/fixture/query"), Some(insert.clone())).await;
        let object_query = v4("/workers/durable_objects/namespaces/ns/objects/obj/query");
        admin(&client, &server, Method::POST, &object_query, Some(insert)).await;
        // An import uploaded, its ingest left to the matrix.
        let sql = "INSERT INTO t VALUES (3);\n";
        let etag = {
            use md5::Digest as _;
            hex::encode(md5::Md5::digest(sql.as_bytes()))
        };
        let init = json!({ "action": "init", "etag": etag });
        let init = admin(&client, &server, Method::POST, &v4("/d1/database/fixture/import"), Some(init)).await;
        let upload_url = init["result"]["upload_url"].as_str().expect("an import's upload URL");
        let uploaded = client.put(upload_url).body(sql).send().await.unwrap();
        assert!(uploaded.status().is_success(), "uploading the import: {}", uploaded.status());
        let filename = init["result"]["filename"].as_str().expect("an import's file name").to_owned();
        let namespace = async |title: &str| -> String {
            let path = v4("/storage/kv/namespaces");
            let made = admin(&client, &server, Method::POST, &path, Some(json!({"title": title}))).await;
            made["result"]["id"].as_str().expect("a KV namespace's id").to_owned()
        };
        let kv = (namespace("fixture").await, namespace("doomed").await);
        for key in ["k", "k-del", "k-bulk-del"] {
            let url = format!("{}{}", server.api, v4(&format!("/storage/kv/namespaces/{}/values/{key}", kv.0)));
            assert!(client.put(url).bearer_auth(TOKEN).body("fixture").send().await.unwrap().status().is_success());
        }
        let queue = async |name: &str| -> String {
            let made = admin(&client, &server, Method::POST, &v4("/queues"), Some(json!({"queue_name": name}))).await;
            made["result"]["queue_id"].as_str().expect("a queue's id").to_owned()
        };
        let queue = (queue("fixture").await, queue("doomed").await);
        let consumers = v4(&format!("/queues/{}/consumers", queue.0));
        admin(&client, &server, Method::POST, &consumers, Some(json!({"type": "http_pull"}))).await;
        let messages = v4(&format!("/queues/{}/messages/batch", queue.0));
        let many: Vec<Value> = (0..40).map(|i| json!({"body": i})).collect();
        admin(&client, &server, Method::POST, &messages, Some(json!({"messages": many}))).await;
        Bookmarks {
            queue,
            kv,
            d1: d1["result"]["bookmark"].as_str().unwrap().to_owned(),
            object: object["result"]["bookmark"].as_str().unwrap().to_owned(),
            import: (etag, filename),
            worker_version: deployments["result"]["deployments"][0]["versions"][0]["version_id"]
                .as_str()
                .expect("the fixture Worker's version")
                .to_owned(),
        }
    });
    let endpoints = endpoints(&bookmarks);
    use Credential as C;
    let valid_here: Vec<Credential> = CREDENTIALS
        .into_iter()
        .filter(|c| !matches!(c, C::None | C::Malformed | C::Unknown | C::Revoked | C::OtherAccountAdmin))
        .collect();
    let mut narrowest = NARROWEST_FIRST.to_vec();
    narrowest.sort_by_key(|c| CREDENTIALS.iter().position(|k| k == c));
    assert_eq!(narrowest, valid_here, "NARROWEST_FIRST ranks every valid credential of this account");
    let mut failures = Vec::new();
    let mut cells = 0;
    runtime.block_on(async {
        for e in &endpoints {
            for c in CREDENTIALS {
                // The victim of "tokens revoke" must exist: the revoked token's id stands in.
                let e = &match e.name {
                    "tokens revoke" => Endpoint {
                        path: v4(&format!("/tokens/{}", secrets.s3(Credential::D1Read).unwrap().0)),
                        ..e.clone()
                    },
                    _ => e.clone(),
                };
                let should = allowed(c, e.need, e.surface);
                // A write that is allowed would change the state the next cells are checked
                // against; its allowance is seen on its own fixture below, so here only denials
                // of writes are sent (reads are sent for every cell), and another account's
                // writes in its own account, which must leave this one as it was.
                let foreign = c == Credential::OtherAccountAdmin;
                let before = match &e.unchanged {
                    Some(p) if !should || foreign => Some(probe(&client, &server, &secrets, p).await),
                    Some(_) => continue,
                    None => None,
                };
                cells += 1;
                let (status, body) = send(&client, &server, &secrets, e, c).await;
                let denied = matches!(status, 401 | 403)
                    // S3 refuses an unsigned or malformed request in its own words, as R2 does:
                    // 400 InvalidArgument "Authorization" or InvalidRequest.
                    || (e.surface == Surface::S3 && status == 400 && matches!(c, Credential::None | Credential::Malformed))
                    // Another account's credential looks in its own account, where these do not exist.
                    || (foreign && e.surface != Surface::V4 && status == 404);
                if should && !e.admitted.holds(status, &body) {
                    failures.push(format!("{e:?} with {c:?}: expected allowed, got {status} {}", cut(&body)));
                } else if should && let Err(wrong) = shows(e, c, &body) {
                    failures.push(format!("{e:?} with {c:?}: allowed, but {wrong}: {}", cut(&body)));
                } else if !should && !denied {
                    failures.push(format!("{e:?} with {c:?}: expected denied, got {status} {}", cut(&body)));
                }
                if let (Some(p), Some(before)) = (&e.unchanged, before) {
                    let after = probe(&client, &server, &secrets, p).await;
                    if after != before {
                        failures.push(format!("{e:?} with {c:?}: a denied request changed {} {}", p.method, p.path));
                    }
                }
                if foreign && (200..300).contains(&status) && body.contains(ACCOUNT) {
                    failures.push(format!("{e:?} with {c:?}: another account's admin was told of this account"));
                }
            }
        }
        // The allowed writes, each once, with the narrowest credential the matrix allows (a
        // bucket-limited token's where it may), each seen to change what its probe shows.
        for e in endpoints.iter().filter(|e| e.unchanged.is_some()) {
            let c = NARROWEST_FIRST.into_iter().find(|c| allowed(*c, e.need, e.surface)).expect("someone may write");
            let e = match e.name {
                "tokens revoke" => Endpoint { path: v4(&format!("/tokens/{}", secrets.s3(Credential::D1Read).unwrap().0)), ..e.clone() },
                _ => e.clone(),
            };
            let p = e.unchanged.as_ref().expect("a write's probe");
            let before = probe(&client, &server, &secrets, p).await;
            cells += 1;
            let (status, body) = send(&client, &server, &secrets, &e, c).await;
            if !e.admitted.holds(status, &body) {
                failures.push(format!("{e:?} with {c:?}: expected allowed, got {status} {}", cut(&body)));
            } else if probe(&client, &server, &secrets, p).await == before {
                failures.push(format!("{e:?} with {c:?}: allowed, but {} {} shows no change", p.method, p.path));
            }
        }
        cells += binding_socket_refuses_outsiders(&client, &server, &secrets, &mut failures).await;
    });
    assert!(
        failures.is_empty(),
        "{} of {cells} cells differ from the matrix:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!(
        "authorization matrix: {} endpoints × {} credentials, {cells} cells checked",
        endpoints.len(),
        CREDENTIALS.len()
    );
}

/// The Workers' binding socket serves the workerd kura runs, which sends this run's secret with
/// every request; D1, R2, KV, queue producers, Durable Object announcements and logs there refuse anyone else — no
/// secret, an API token, a wrong secret — and change nothing. Answers the cells checked.
async fn binding_socket_refuses_outsiders(
    client: &reqwest::Client,
    server: &KuraProcess,
    secrets: &Secrets,
    failures: &mut Vec<String>,
) -> usize {
    use kura_workers::config::headers;
    // The socket and the secret, as the configuration kura wrote for workerd names them.
    let config = find_file(&server.data, "workerd.capnp").expect("kura wrote workerd's configuration");
    let config = std::fs::read_to_string(config).unwrap();
    let marker = format!("\"{}\", value = \"", headers::SECRET);
    let secret =
        config.split(&marker).nth(1).and_then(|rest| rest.split('"').next()).expect("the secret in the configuration");
    let socket = std::path::PathBuf::from(
        config
            .split('"')
            .find_map(|s| s.strip_prefix("unix:").filter(|p| p.ends_with("bindings.sock")))
            .expect("the binding socket's address in workerd's configuration"),
    );
    let details = admin(client, server, Method::GET, &v4("/d1/database/fixture"), None).await;
    let uuid = details["result"]["uuid"].as_str().expect("the fixture's uuid").to_owned();
    let rows = Probe::v4(
        Method::POST,
        v4("/d1/database/fixture/query"),
        Some(json!({ "sql": "SELECT count(*) AS n FROM t" })),
    );
    let objects = Probe::v4(Method::GET, v4(&format!("/r2/buckets/{CLOSED}/objects")), None);
    let namespaces = admin(client, server, Method::GET, &v4("/storage/kv/namespaces"), None).await;
    let kv_namespace = namespaces["result"]
        .as_array()
        .and_then(|all| all.iter().find(|n| n["title"] == "fixture"))
        .and_then(|n| n["id"].as_str())
        .expect("the fixture KV namespace")
        .to_owned();
    let kv_keys = Probe::v4(Method::GET, v4(&format!("/storage/kv/namespaces/{kv_namespace}/keys")), None);
    let fixture_queue = admin(client, server, Method::GET, &v4("/queues?name=fixture"), None).await;
    let fixture_queue = fixture_queue["result"][0]["queue_id"].as_str().expect("the fixture queue").to_owned();
    // Its details show its backlog, which a refused send must leave as it was.
    let queues = Probe::v4(Method::GET, v4(&format!("/queues/{fixture_queue}")), None);
    let (put, put_headers) = binding_r2_write("put", "made-through-the-socket");
    let insert = serde_json::to_vec(&json!({ "sql": "INSERT INTO t VALUES (97)" })).unwrap();
    let get = json!({ "version": 1, "method": "get", "object": "k" }).to_string();
    // (method, path, headers, body)
    type SocketRequest<'a> = (&'a str, &'a str, Vec<(&'a str, String)>, Vec<u8>);
    let requests: Vec<SocketRequest> = vec![
        ("POST", "/query", vec![(headers::D1_DATABASE, uuid.clone())], insert),
        ("GET", "/", vec![(headers::R2_BUCKET, CLOSED.into()), ("cf-r2-request", get)], Vec::new()),
        ("PUT", "/", [vec![(headers::R2_BUCKET, CLOSED.to_owned())], put_headers].concat(), put),
        ("POST", "/objects", vec![(headers::SCRIPT, WORKER.into())], br#"{"class":"C","id":"00"}"#.to_vec()),
        ("POST", "/logs", vec![(headers::SCRIPT, WORKER.into())], b"[]".to_vec()),
        ("GET", "/k?urlencoded=true", vec![(headers::KV_NAMESPACE, kv_namespace.clone())], Vec::new()),
        ("PUT", "/socket-new?urlencoded=true", vec![(headers::KV_NAMESPACE, kv_namespace.clone())], b"x".to_vec()),
        ("GET", "/", vec![(headers::KV_NAMESPACE, kv_namespace.clone())], Vec::new()),
        ("POST", "/message", vec![(headers::QUEUE, "fixture".into()), ("x-msg-fmt", "text".into())], b"x".to_vec()),
    ];
    let outsiders: [(&str, Option<(&str, String)>); 3] = [
        ("no secret", None),
        ("an API token", Some(("authorization", format!("Bearer {TOKEN}")))),
        ("a wrong secret", Some((headers::SECRET, "0".repeat(64)))),
    ];
    // The control: with the secret, the socket serves (so a refusal below is the secret's).
    let select = serde_json::to_vec(&json!({ "sql": "SELECT count(*) AS n FROM t" })).unwrap();
    let with_secret = [
        (headers::ACCOUNT, ACCOUNT.to_owned()),
        (headers::D1_DATABASE, uuid.clone()),
        (headers::SECRET, secret.to_owned()),
    ];
    let (status, answer) = unix_request(&socket, "POST", "/query", &with_secret, &select).await;
    assert_eq!(status, 200, "the binding socket with this run's secret: {answer}");
    let (rows_before, objects_before, keys_before, queues_before) = (
        probe(client, server, secrets, &rows).await,
        probe(client, server, secrets, &objects).await,
        probe(client, server, secrets, &kv_keys).await,
        probe(client, server, secrets, &queues).await,
    );
    let mut cells = 0;
    for (method, path, fields, body) in &requests {
        for (who, credential) in &outsiders {
            cells += 1;
            let mut sent = vec![(headers::ACCOUNT, ACCOUNT.to_owned())];
            sent.extend(fields.iter().cloned());
            sent.extend(credential.iter().cloned());
            let (status, answer) = unix_request(&socket, method, path, &sent, body).await;
            if status != 403 || answer.contains("fixture") {
                failures.push(format!(
                    "binding socket {method} {path} with {who}: expected 403, got {status} {}",
                    cut(&answer)
                ));
            }
        }
    }
    if probe(client, server, secrets, &rows).await != rows_before
        || probe(client, server, secrets, &objects).await != objects_before
        || probe(client, server, secrets, &kv_keys).await != keys_before
        || probe(client, server, secrets, &queues).await != queues_before
    {
        failures.push(
            "a refused request on the binding socket changed the database, the bucket, the namespace or the queue"
                .into(),
        );
    }
    cells
}

fn find_file(dir: &std::path::Path, name: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
        if entry.file_type().is_ok_and(|t| t.is_dir())
            && let Some(found) = find_file(&path, name)
        {
            return Some(found);
        }
    }
    None
}

/// One HTTP/1.1 request over a Unix socket; answers its status and body.
async fn unix_request(
    socket: &std::path::Path,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::UnixStream::connect(socket).await.expect("the binding socket accepts");
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nhost: bindings\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    // A refusal may come, and the connection close, before the body is read.
    let _ = stream.write_all(body).await;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            // A server that answers before reading the body closes a socket with bytes unread,
            // which the kernel reports here as a reset once the answer has been read.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !answer.is_empty() => break,
            Err(e) => panic!("reading the answer to {method} {path}: {e}"),
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    let status = answer.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

fn cut(body: &str) -> String {
    body.chars().take(200).collect()
}
