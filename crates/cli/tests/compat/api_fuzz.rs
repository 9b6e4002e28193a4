//! Hostile JSON and binding frames, fuzzed at the wire against the real API listener: the v4
//! bodies of D1 queries, imports and exports, Time Travel, R2 buckets, Durable Object batches,
//! queries and fan-outs, and tokens; D1's binding protocol; the R2 binding protocol's header
//! and metadata-size framing. Bodies are JSON of the right shape with wrong types, huge and
//! negative numbers, deep nesting and stray bytes. Every answer is below 500 in its protocol's
//! shape (the v4 envelope, D1's binding error, R2's `cf-r2-error`), no request's task panics,
//! and the server and its fixtures keep answering. `KURA_FUZZ_CASES` sets the number of
//! requests. (Found: a D1_TYPE_ERROR message cut inside a character panicked its request.)

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};

use crate::common::{ACCOUNT, KuraProcess, TOKEN};

#[derive(Debug, Clone)]
struct Hostile {
    method: &'static str,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        Just(json!(u64::MAX)),
        Just(json!(-1)),
        "\\PC{0,12}".prop_map(Value::from),
        Just(json!("SELECT * FROM canary")),
        Just(json!("INSERT INTO canary VALUES (1)")),
        Just(json!("00000000-00000001-00000000-00000000000000000000000000000000")),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    proptest::sample::select(vec![
                        "sql",
                        "params",
                        "name",
                        "scope",
                        "buckets",
                        "operations",
                        "op",
                        "key",
                        "keys",
                        "value",
                        "time",
                        "action",
                        "etag",
                        "filename",
                        "output_format",
                        "dump_options",
                        "bookmark",
                        "objects",
                        "durable_object_id",
                        "durable_object_name",
                        "queries",
                        "class",
                        "alarm_url",
                        "locationHint",
                    ])
                    .prop_map(str::to_owned),
                    "[a-z_]{1,8}",
                ],
                inner,
                0..5,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        1 => proptest::collection::vec(any::<u8>(), 0..120),
        1 => (1usize..3000).prop_map(|depth| format!("{}{}", "[".repeat(depth), "]".repeat(depth)).into_bytes()),
        1 => Just(b"{\"sql\": \"SELECT 1\"".to_vec()),
    ]
}

/// One Durable Object batch operation: each kind with its own fields, their values arbitrary
/// (so most reach the object, not only the JSON parser), or an unknown kind or field.
fn operation() -> impl Strategy<Value = Value> {
    prop_oneof![
        (scalar(), value()).prop_map(|(sql, params)| json!({ "op": "sql", "sql": sql, "params": params })),
        scalar().prop_map(|key| json!({ "op": "kv_get", "key": key })),
        value().prop_map(|keys| json!({ "op": "kv_get", "keys": keys })),
        (scalar(), value()).prop_map(|(key, value)| json!({ "op": "kv_put", "key": key, "value": value })),
        value().prop_map(|entries| json!({ "op": "kv_put", "entries": entries })),
        scalar().prop_map(|key| json!({ "op": "kv_delete", "key": key })),
        value().prop_map(|keys| json!({ "op": "kv_delete", "keys": keys })),
        (scalar(), scalar(), scalar(), scalar(), value(), value()).prop_map(|(start, after, end, prefix, reverse, limit)| {
            json!({ "op": "kv_list", "start": start, "startAfter": after, "end": end, "prefix": prefix, "reverse": reverse, "limit": limit })
        }),
        scalar().prop_map(|time| json!({ "op": "set_alarm", "time": time })),
        proptest::sample::select(vec!["get_alarm", "delete_alarm", "delete_all", "database_size", "nope"])
            .prop_map(|op| json!({ "op": op })),
        (scalar(), value()).prop_map(|(field, value)| json!({ "op": "kv_get", "key": "k", "extra": field, "more": value })),
    ]
}

/// Bodies of the right shape for each endpoint, their fields arbitrary: these reach the
/// handlers behind the JSON parser.
fn shaped() -> impl Strategy<Value = (&'static str, String, Value)> {
    let v4 = |p: &str| format!("/client/v4/accounts/{ACCOUNT}{p}");
    let (d1, raw, batch, object_query, fan_out, tokens, import, restore) = (
        v4("/d1/database/fixture/query"),
        v4("/d1/database/fixture/raw"),
        v4("/workers/durable_objects/namespaces/ns/objects/obj/batch"),
        v4("/workers/durable_objects/namespaces/ns/objects/obj/query"),
        v4("/workers/durable_objects/namespaces/ns/fan_out"),
        v4("/tokens"),
        v4("/d1/database/fixture/import"),
        v4("/workers/durable_objects/namespaces/ns/objects/obj/restore"),
    );
    prop_oneof![
        (scalar(), value()).prop_map(move |(sql, params)| (
            "POST",
            d1.clone(),
            json!({ "sql": sql, "params": params })
        )),
        (scalar(), value()).prop_map(move |(sql, params)| (
            "POST",
            raw.clone(),
            json!([{ "sql": sql, "params": params }])
        )),
        proptest::collection::vec(operation(), 0..4).prop_map(move |operations| (
            "POST",
            batch.clone(),
            json!({ "operations": operations })
        )),
        (scalar(), value()).prop_map(move |(sql, params)| (
            "POST",
            object_query.clone(),
            json!({ "sql": sql, "params": params })
        )),
        (scalar(), value(), value()).prop_map(move |(sql, params, objects)| (
            "POST",
            fan_out.clone(),
            json!({ "sql": sql, "params": params, "objects": objects })
        )),
        (scalar(), proptest::sample::select(vec!["admin", "d1:read", "r2:write", "do:read", "root", ""]), value())
            .prop_map(move |(name, scope, buckets)| (
                "POST",
                tokens.clone(),
                json!({ "name": name, "scope": scope, "buckets": buckets })
            )),
        (proptest::sample::select(vec!["init", "ingest", "poll", "other"]), scalar(), scalar()).prop_map(
            move |(action, etag, filename)| (
                "POST",
                import.clone(),
                json!({ "action": action, "etag": etag, "filename": filename })
            )
        ),
        scalar().prop_map(move |bookmark| ("POST", restore.clone(), json!({ "bookmark": bookmark }))),
    ]
}

fn hostile() -> impl Strategy<Value = Hostile> {
    let v4 = |p: &str| format!("/client/v4/accounts/{ACCOUNT}{p}");
    let json_endpoints = vec![
        ("POST", v4("/d1/database/fixture/query")),
        ("POST", v4("/d1/database/fixture/raw")),
        ("POST", v4("/d1/database/fixture/import")),
        ("POST", v4("/d1/database/fixture/export")),
        ("POST", v4("/d1/database/fixture/time_travel/restore?bookmark=%ZZ")),
        ("GET", v4("/d1/database/fixture/time_travel/history?limit=-1&before=x")),
        ("POST", v4("/d1/database")),
        ("PUT", v4("/d1/database/fixture")),
        ("POST", v4("/r2/buckets")),
        ("POST", v4("/workers/durable_objects/namespaces")),
        ("POST", v4("/workers/durable_objects/namespaces/ns/objects/obj/batch")),
        ("POST", v4("/workers/durable_objects/namespaces/ns/objects/obj/query")),
        ("POST", v4("/workers/durable_objects/namespaces/ns/query")),
        ("POST", v4("/workers/durable_objects/namespaces/ns/fan_out")),
        ("POST", v4("/workers/durable_objects/namespaces/ns/objects/obj/restore")),
        ("POST", v4("/tokens")),
        ("POST", "/binding/d1/fixture/query".to_owned()),
        ("POST", "/binding/d1/fixture/execute".to_owned()),
        ("POST", "/query".to_owned()),
    ];
    let json_request = (proptest::sample::select(json_endpoints), body()).prop_map(|((method, path), body)| Hostile {
        method,
        path,
        headers: vec![("content-type".into(), "application/json".into())],
        body,
    });
    let r2_read = value().prop_map(|v| Hostile {
        method: "GET",
        path: "/binding/r2/open".into(),
        headers: vec![(
            "cf-r2-request".into(),
            v.to_string().chars().filter(|c| c.is_ascii() && !c.is_ascii_control()).collect(),
        )],
        body: Vec::new(),
    });
    let r2_write = (value(), proptest::option::of(0usize..400), proptest::collection::vec(any::<u8>(), 0..64))
        .prop_map(|(v, declared, payload)| {
            let metadata = serde_json::to_vec(&v).unwrap();
            let size = declared.unwrap_or(metadata.len());
            let mut body = metadata;
            body.extend(payload);
            Hostile {
                method: "PUT",
                path: "/binding/r2/open".into(),
                headers: vec![("cf-r2-metadata-size".into(), size.to_string())],
                body,
            }
        });
    let shaped_request = shaped().prop_map(|(method, path, body)| Hostile {
        method,
        path,
        headers: vec![("content-type".into(), "application/json".into())],
        body: serde_json::to_vec(&body).unwrap(),
    });
    let r2_shaped = (
        proptest::sample::select(vec!["head", "get", "list", "put", "delete", "createMultipartUpload", "nope"]),
        scalar(),
        scalar(),
        value(),
    )
        .prop_map(|(method, object, limit, range)| {
            let request = json!({ "version": 1, "method": method, "object": object, "limit": limit, "prefix": object, "cursor": limit, "range": range, "include": range, "delimiter": object });
            let text: String = request.to_string().chars().filter(|c| c.is_ascii() && !c.is_ascii_control()).collect();
            if matches!(method, "head" | "get" | "list") {
                Hostile { method: "GET", path: "/binding/r2/open".into(), headers: vec![("cf-r2-request".into(), text)], body: Vec::new() }
            } else {
                let size = text.len().to_string();
                Hostile { method: "PUT", path: "/binding/r2/open".into(), headers: vec![("cf-r2-metadata-size".into(), size)], body: text.into_bytes() }
            }
        });
    prop_oneof![3 => json_request, 4 => shaped_request, 1 => r2_read, 1 => r2_write, 2 => r2_shaped]
}

#[test]
fn hostile_json_and_frames_get_answers_in_shape_and_the_server_keeps_serving() {
    let server = KuraProcess::start();
    let base = server.api.trim_end_matches("/client/v4").to_owned();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = reqwest::Client::new();
    let call = async |method: &str, path: &str, body: Value| -> Value {
        let answer = client
            .request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), format!("{base}{path}"))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        answer.json().await.unwrap()
    };
    let v4 = |p: &str| format!("/client/v4/accounts/{ACCOUNT}{p}");
    let canaries = async || {
        let d1 = call(
            "POST",
            &v4("/d1/database/fixture/query"),
            json!({ "sql": "SELECT count(*) AS n, sum(x) AS s FROM canary" }),
        )
        .await;
        let durable = call(
            "POST",
            &v4("/workers/durable_objects/namespaces/ns/objects/obj/query"),
            json!({ "sql": "SELECT count(*) FROM canary" }),
        )
        .await;
        (d1["result"][0]["results"].clone(), durable["result"][0]["rows"].clone())
    };
    let before = runtime.block_on(async {
        call("POST", &v4("/d1/database"), json!({ "name": "fixture" })).await;
        call(
            "POST",
            &v4("/d1/database/fixture/query"),
            json!({ "sql": "CREATE TABLE canary (x); INSERT INTO canary VALUES (1)" }),
        )
        .await;
        call("POST", &v4("/r2/buckets"), json!({ "name": "open" })).await;
        call("POST", &v4("/workers/durable_objects/namespaces"), json!({ "name": "ns" })).await;
        call(
            "POST",
            &v4("/workers/durable_objects/namespaces/ns/objects/obj/query"),
            json!([{ "sql": "CREATE TABLE canary (x)" }, { "sql": "INSERT INTO canary VALUES (1)" }]),
        )
        .await;
        canaries().await
    });

    let cases = kura_testkit::count("KURA_FUZZ_CASES", 600);
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let statuses = std::cell::RefCell::new(std::collections::BTreeMap::<u16, u32>::new());
    runner
        .run(&hostile(), |h| {
            runtime.block_on(async {
                let mut request = client
                    .request(reqwest::Method::from_bytes(h.method.as_bytes()).unwrap(), format!("{base}{}", h.path))
                    .bearer_auth(TOKEN);
                for (name, value) in &h.headers {
                    request = request.header(name.as_str(), value.as_str());
                }
                // No answer at all means the request's task died: a panic.
                let answer = match request.body(h.body.clone()).send().await {
                    Ok(answer) => answer,
                    Err(e) => return Err(proptest::test_runner::TestCaseError::fail(format!("{h:?}: no answer: {e}"))),
                };
                let status = answer.status().as_u16();
                let r2_error = answer.headers().get("cf-r2-error").is_some();
                *statuses.borrow_mut().entry(status).or_default() += 1;
                let text = match answer.text().await {
                    Ok(text) => text,
                    Err(e) => {
                        return Err(proptest::test_runner::TestCaseError::fail(format!(
                            "{h:?}: answered {status}, then broke off: {e}"
                        )));
                    }
                };
                prop_assert!(status < 500, "{h:?} answered {status}: {text}");
                if status >= 400 {
                    let shaped = if h.path.starts_with("/client/v4/") {
                        serde_json::from_str::<Value>(&text)
                            .is_ok_and(|v| v["success"] == false && v["errors"][0]["message"].is_string())
                    } else if h.path.starts_with("/binding/r2/") {
                        r2_error
                    } else {
                        serde_json::from_str::<Value>(&text)
                            .is_ok_and(|v| v["success"] == false && v["error"].is_string())
                    };
                    prop_assert!(shaped, "{h:?}: {status} not in its protocol's shape: {text}");
                }
                Ok(())
            })
        })
        .unwrap();

    runtime.block_on(async {
        let health = client.get(format!("{base}/healthz")).send().await.unwrap();
        assert!(health.status().is_success(), "the server stopped serving");
    });
    eprintln!("API fuzz: {cases} hostile requests, answers by status: {:?}", statuses.borrow());
    // The fuzzed bodies may legitimately write (a well-formed INSERT or `delete_all` is allowed);
    // what must hold is that the database and the object still answer.
    let after = runtime.block_on(async {
        let d1 = call("POST", &v4("/d1/database/fixture/query"), json!({ "sql": "SELECT 1 AS one" })).await;
        let durable =
            call("POST", &v4("/workers/durable_objects/namespaces/ns/objects/obj/query"), json!({ "sql": "SELECT 1" }))
                .await;
        (d1, durable)
    });
    assert!(
        after.0["success"] == true && after.1["success"] == true,
        "the fixtures no longer answer: {after:?} (before: {before:?})"
    );
}
