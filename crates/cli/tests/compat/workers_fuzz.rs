//! Hostile Worker uploads, fuzzed at the wire against the real server: the multipart form
//! (broken framing, parts missing or doubled, unknown content types), its `metadata` JSON
//! (bindings of every type with hostile names and targets, migrations, compatibility dates and
//! flags, wrong types) and its modules (valid, a syntax error, a missing import, stray bytes),
//! sent as deployments and as versions (of the fixture, which no case deploys). Every answer is
//! below 500 in the v4 envelope, some uploads are accepted (and run), and afterwards the fixture
//! Worker still serves its own answer and a new Worker deploys and serves, so no accepted upload
//! left the Workers unable to run. `KURA_FUZZ_CASES` sets the number of uploads.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};

use crate::common::{ACCOUNT, KuraProcess, TOKEN};

const FIXTURE: &str = "fuzz-fixture";

#[derive(Debug, Clone)]
struct Upload {
    method: &'static str,
    script: String,
    /// The metadata part, or `None` for none.
    metadata: Option<Vec<u8>>,
    /// (part name, content type, body).
    modules: Vec<(String, Option<String>, Vec<u8>)>,
    framing: Framing,
}

#[derive(Debug, Clone, Copy)]
enum Framing {
    Whole,
    NoClosingBoundary,
    OtherBoundary,
    NotMultipart,
}

/// Names as a user, a typo or an attacker writes them: valid ones, and ones with quotes,
/// braces, newlines, NULs, dots and slashes that must never reach workerd's configuration.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => "[A-Z][A-Z0-9_]{0,10}",
        1 => "\\PC{0,16}",
        1 => proptest::sample::select(vec![
            "\"}\n)", "a\"b", "x\\", "__proto__", "constructor", "../../etc/passwd", "", "a\u{0}b", "名前", "env",
            "DB", "FIXTURE_SECRET", "a b", "$", "kura", "x;\ny = (", "0abc",
        ])
        .prop_map(str::to_owned),
        1 => (1usize..400).prop_map(|n| "x".repeat(n)),
    ]
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        name().prop_map(Value::from),
        Just(json!([])),
        Just(json!({})),
    ]
}

fn binding(d1: String) -> impl Strategy<Value = Value> {
    let d1_id = prop_oneof![
        4 => Just(Value::from(d1)),
        1 => Just(json!("00000000-0000-0000-0000-000000000000")),
        1 => scalar()
    ];
    let bucket = prop_oneof![4 => Just(json!("open")), 1 => scalar()];
    let class = prop_oneof![4 => Just(json!("Room")), 1 => scalar()];
    let text = prop_oneof![4 => "\\PC{0,12}".prop_map(Value::from), 1 => scalar()];
    prop_oneof![
        (name(), text.clone()).prop_map(|(n, text)| json!({ "type": "plain_text", "name": n, "text": text })),
        (name(), scalar()).prop_map(|(n, value)| json!({ "type": "json", "name": n, "json": value })),
        (name(), d1_id).prop_map(|(n, id)| json!({ "type": "d1", "name": n, "id": id })),
        (name(), bucket).prop_map(|(n, b)| json!({ "type": "r2_bucket", "name": n, "bucket_name": b })),
        (name(), class, prop_oneof![4 => Just(None), 1 => scalar().prop_map(Some)]).prop_map(|(n, c, script)| {
            let mut b = json!({ "type": "durable_object_namespace", "name": n, "class_name": c });
            if let Some(s) = script {
                b["script_name"] = s;
            }
            b
        }),
        (name(), text).prop_map(|(n, text)| json!({ "type": "secret_text", "name": n, "text": text })),
        (name(), scalar()).prop_map(|(n, s)| json!({ "type": "service", "name": n, "service": s })),
        name().prop_map(|n| json!({ "type": "inherit", "name": n })),
        name().prop_map(|n| json!({ "type": "version_metadata", "name": n })),
        (scalar(), scalar()).prop_map(|(t, n)| json!({ "type": t, "name": n })),
        scalar(),
    ]
}

fn migrations() -> impl Strategy<Value = Value> {
    let classes = proptest::collection::vec(prop_oneof![Just(json!("Room")), scalar()], 0..3);
    let step = prop_oneof![
        classes.clone().prop_map(|c| json!({ "new_sqlite_classes": c })),
        classes.clone().prop_map(|c| json!({ "new_classes": c })),
        classes.clone().prop_map(|c| json!({ "deleted_classes": c })),
        (scalar(), scalar()).prop_map(|(from, to)| json!({ "renamed_classes": [{ "from": from, "to": to }] })),
        (scalar(), scalar()).prop_map(
            |(from, script)| json!({ "transferred_classes": [{ "from": from, "from_script": script, "to": from }] })
        ),
        scalar(),
    ];
    prop_oneof![
        Just(Value::Null),
        (scalar(), scalar(), proptest::collection::vec(step, 0..3))
            .prop_map(|(new_tag, old_tag, steps)| json!({ "new_tag": new_tag, "old_tag": old_tag, "steps": steps })),
        scalar(),
    ]
}

const VALID: &str = "export default { fetch() { return new Response(\"fuzzed\"); } };";
const WITH_ROOM: &str = "export class Room { fetch() { return new Response(\"room\"); } }\n\
                         export default { fetch() { return new Response(\"fuzzed\"); } };";

fn module_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => proptest::sample::select(vec![
            VALID,
            WITH_ROOM,
            "export default {",
            "",
            "import missing from \"./missing.js\"; export default { fetch() { return missing(); } };",
            "export default 42;",
            "addEventListener('fetch', e => e.respondWith(new Response('sw')));",
            "throw new Error('at startup');",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        1 => proptest::collection::vec(any::<u8>(), 0..64),
    ]
}

fn content_type() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        4 => Just(Some("application/javascript+module".to_owned())),
        1 => proptest::sample::select(vec![
            "application/javascript", "text/plain", "application/wasm", "application/json",
            "application/octet-stream", "application/source-map", "text/html", "application/javascript+module; charset=\"",
        ])
        .prop_map(|t| Some(t.to_owned())),
        1 => Just(None),
    ]
}

fn upload(d1: String) -> impl Strategy<Value = Upload> {
    let module_name = prop_oneof![3 => Just("worker.js".to_owned()), 1 => Just("lib.js".to_owned()), 1 => name()];
    let valid_module = Just(vec![(
        "worker.js".to_owned(),
        Some("application/javascript+module".to_owned()),
        WITH_ROOM.as_bytes().to_vec(),
    )]);
    let modules = prop_oneof![
        5 => valid_module,
        2 => proptest::collection::vec((module_name, content_type(), module_body()), 0..3),
    ];
    let date = prop_oneof![
        12 => Just(json!("2025-01-01")),
        1 => Just(json!("2025-13-45")),
        1 => Just(json!("9999-12-31")),
        1 => Just(json!("1999-01-01")),
        1 => scalar()
    ];
    let flags = prop_oneof![
        6 => Just(Vec::new()),
        1 => proptest::collection::vec(
            prop_oneof![Just(json!("nodejs_compat")), Just(json!("no_such_flag")), scalar()],
            0..3,
        ),
    ];
    let main = prop_oneof![8 => Just(json!("worker.js")), 1 => scalar()];
    let usage = prop_oneof![6 => Just(json!("standard")), 1 => scalar()];
    let migrations = prop_oneof![4 => Just(Value::Null), 1 => migrations()];
    let metadata = (main, proptest::collection::vec(binding(d1), 0..4), date, flags, migrations, usage).prop_map(
        |(main, bindings, date, flags, migrations, usage)| {
            json!({
                "main_module": main,
                "bindings": bindings,
                "compatibility_date": date,
                "compatibility_flags": flags,
                "migrations": migrations,
                "usage_model": usage,
            })
        },
    );
    let metadata = prop_oneof![
        24 => metadata.prop_map(|m| Some(serde_json::to_vec(&m).unwrap())),
        1 => scalar().prop_map(|v| Some(serde_json::to_vec(&v).unwrap())),
        1 => proptest::collection::vec(any::<u8>(), 0..40).prop_map(Some),
        1 => Just(None),
    ];
    let framing = prop_oneof![
        30 => Just(Framing::Whole),
        1 => Just(Framing::NoClosingBoundary),
        1 => Just(Framing::OtherBoundary),
        1 => Just(Framing::NotMultipart),
    ];
    let target = prop_oneof![
        6 => ("[a-z][a-z0-9-]{0,8}").prop_map(|n| ("PUT", format!("fuzz-{n}"))),
        1 => Just(("POST", FIXTURE.to_owned())),
        1 => name().prop_map(|n| ("PUT", n)),
    ];
    (target, metadata, modules, framing).prop_map(|((method, script), metadata, modules, framing)| Upload {
        method,
        script,
        metadata,
        modules,
        framing,
    })
}

/// The upload's body and content type, framed as `framing` says.
fn encode(upload: &Upload) -> (Vec<u8>, String) {
    let boundary = "fuzz-boundary-7c1e";
    let mut body = Vec::new();
    let mut part = |headers: String, bytes: &[u8]| {
        body.extend_from_slice(format!("--{boundary}\r\n{headers}\r\n").as_bytes());
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    };
    if let Some(metadata) = &upload.metadata {
        part(
            "content-disposition: form-data; name=\"metadata\"\r\ncontent-type: application/json\r\n".into(),
            metadata,
        );
    }
    for (name, content_type, bytes) in &upload.modules {
        let name = name.replace(['"', '\r', '\n'], "_");
        let mut headers = format!("content-disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\n");
        if let Some(t) = content_type {
            headers.push_str(&format!("content-type: {t}\r\n"));
        }
        part(headers, bytes);
    }
    if !matches!(upload.framing, Framing::NoClosingBoundary) {
        body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    }
    let content_type = match upload.framing {
        Framing::OtherBoundary => "multipart/form-data; boundary=another".to_owned(),
        Framing::NotMultipart => "application/json".to_owned(),
        _ => format!("multipart/form-data; boundary={boundary}"),
    };
    (body, content_type)
}

#[test]
fn hostile_worker_uploads_are_refused_in_shape_and_workers_keep_running() {
    // The upload strategy's values are deep in a debug build: more stack than a test thread's.
    let fuzz = std::thread::Builder::new().stack_size(64 << 20).spawn(fuzz_uploads).unwrap();
    if let Err(panic) = fuzz.join() {
        std::panic::resume_unwind(panic);
    }
}

fn fuzz_uploads() {
    let server = KuraProcess::start();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = reqwest::Client::new();
    let v4 = |p: &str| format!("{}/accounts/{ACCOUNT}{p}", server.api);
    let send = async |u: &Upload| -> Result<(u16, String), String> {
        let (body, content_type) = encode(u);
        let mut path = format!("/workers/scripts/{}", urlencoding(&u.script));
        if u.method == "POST" {
            path.push_str("/versions");
        }
        let method = reqwest::Method::from_bytes(u.method.as_bytes()).unwrap();
        let request = client.request(method, v4(&path)).bearer_auth(TOKEN).header("content-type", content_type);
        let answer = request.body(body).send().await.map_err(|e| format!("no answer: {e}"))?;
        let status = answer.status().as_u16();
        let text = answer.text().await.map_err(|e| format!("answered {status}, then broke off: {e}"))?;
        Ok((status, text))
    };
    let serves = async |script: &str, expected: &str| {
        let url = server.workers.clone();
        let answer = client.get(url).header("host", format!("{script}.localhost")).send().await;
        match answer {
            Ok(a) if a.status().is_success() => {
                let text = a.text().await.unwrap_or_default();
                (text == expected).then_some(()).ok_or(text)
            }
            Ok(a) => Err(format!("{}: {}", a.status(), a.text().await.unwrap_or_default())),
            Err(e) => Err(e.to_string()),
        }
    };
    let valid = |script: &str, text: &str| Upload {
        method: "PUT",
        script: script.to_owned(),
        metadata: Some(
            serde_json::to_vec(&json!({ "main_module": "worker.js", "compatibility_date": "2025-01-01" })).unwrap(),
        ),
        modules: vec![(
            "worker.js".into(),
            Some("application/javascript+module".into()),
            format!("export default {{ fetch() {{ return new Response({text:?}); }} }};").into_bytes(),
        )],
        framing: Framing::Whole,
    };

    let d1 = runtime.block_on(async {
        let made = client.post(v4("/d1/database")).bearer_auth(TOKEN).json(&json!({ "name": "fixture" })).send();
        let made: Value = made.await.unwrap().json().await.unwrap();
        let made_bucket = client.post(v4("/r2/buckets")).bearer_auth(TOKEN).json(&json!({ "name": "open" })).send();
        assert!(made_bucket.await.unwrap().status().is_success());
        let (status, text) = send(&valid(FIXTURE, "fixture")).await.unwrap();
        assert_eq!(status, 200, "deploying the fixture Worker: {text}");
        serves(FIXTURE, "fixture").await.expect("the fixture Worker serves");
        made["result"]["uuid"].as_str().expect("the fixture database's uuid").to_owned()
    });

    let cases = kura_testkit::count("KURA_FUZZ_CASES", 200);
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let statuses = std::cell::RefCell::new(std::collections::BTreeMap::<u16, u32>::new());
    runner
        .run(&upload(d1), |u| {
            runtime.block_on(async {
                let (status, text) =
                    send(&u).await.map_err(|e| proptest::test_runner::TestCaseError::fail(format!("{u:?}: {e}")))?;
                *statuses.borrow_mut().entry(status).or_default() += 1;
                prop_assert!(status < 500, "{u:?} answered {status}: {text}");
                if status >= 400 {
                    let shaped = serde_json::from_str::<Value>(&text)
                        .is_ok_and(|v| v["success"] == false && v["errors"][0]["message"].is_string());
                    prop_assert!(shaped, "{u:?}: {status} not in the v4 envelope: {text}");
                }
                Ok(())
            })
        })
        .unwrap();

    let accepted: u32 = statuses.borrow().iter().filter(|(s, _)| (200..300).contains(*s)).map(|(_, n)| n).sum();
    assert!(accepted > 0, "no upload was accepted: the fuzz reached no deployment ({:?})", statuses.borrow());
    // Whatever was accepted, the Workers still run: the fixture as it was, and one deployed now.
    runtime.block_on(async {
        serves(FIXTURE, "fixture").await.expect("the fixture Worker still serves after the fuzz");
        let (status, text) = send(&valid("after-the-fuzz", "after")).await.unwrap();
        assert_eq!(status, 200, "a valid Worker deployed after the fuzz: {text}");
        serves("after-the-fuzz", "after").await.expect("a Worker deployed after the fuzz serves");
    });
    eprintln!("Workers upload fuzz: {cases} hostile uploads, answers by status: {:?}", statuses.borrow());
}

/// Percent-encodes a script name for the path (hostile names included).
fn urlencoding(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Found by the fuzz: an upload that is not a multipart form was answered with the HTTP
/// framework's plain-text rejection. It is refused as Cloudflare refuses it, once the token is
/// checked.
#[test]
fn a_worker_upload_that_is_not_multipart_is_refused_with_415_in_the_envelope() {
    let server = KuraProcess::start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let url = format!("{}/accounts/{ACCOUNT}/workers/scripts/plain", server.api);
    let client = reqwest::Client::new();
    let script = "export default { fetch() { return new Response('plain'); } };";
    let (status, body, unauthenticated) = runtime.block_on(async {
        let sent = client.put(&url).bearer_auth(TOKEN).header("content-type", "application/javascript").body(script);
        let answer = sent.send().await.unwrap();
        let status = answer.status().as_u16();
        let body: Value = answer.json().await.expect("a JSON body");
        let anonymous = client.put(&url).header("content-type", "application/javascript").body(script).send();
        (status, body, anonymous.await.unwrap().status().as_u16())
    });
    assert_eq!(status, 415, "{body}");
    assert_eq!(body["success"], false, "{body}");
    assert_eq!(body["errors"][0]["code"], 10001, "{body}");
    assert_eq!(body["errors"][0]["message"], "Content-Type must be one of: multipart/form-data", "{body}");
    assert_eq!(unauthenticated, 401, "the token is checked before the body");
}
