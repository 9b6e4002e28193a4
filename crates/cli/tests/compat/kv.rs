//! Workers KV on kura, driven by real wrangler 4.85.0 and a real Worker in workerd
//! (`workers/cache`): every `wrangler kv` command against values the Worker wrote and the
//! other way round, metadata and expiry both ways, listing 2,500 keys in pages through the
//! binding and through wrangler, KV's limits at their exact boundaries, and a namespace
//! provisioned by `wrangler deploy`.

use serde_json::{Value as Json, json};

use crate::common::{KuraProcess, Run, Wrangler};
use crate::workers::{Client, Project, deploy};

/// The 32-hex namespace id in wrangler's `kv namespace create` output.
fn namespace_id(created: &Run) -> String {
    let text = created.all();
    let at = text.find("\"id\": \"").or_else(|| text.find("id = \"")).unwrap_or_else(|| panic!("no id in: {text}"));
    let start = at + text[at..].find('"').unwrap() + 1;
    let start = if text[at..].starts_with("\"id\"") { start + text[start..].find('"').unwrap() + 1 } else { start };
    let id: String = text[start..].chars().take_while(|c| c.is_ascii_hexdigit()).collect();
    assert_eq!(id.len(), 32, "{text}");
    id
}

pub(crate) fn parse_json_output(run: &Run) -> Json {
    let text = &run.stdout;
    let start = text.find(['[', '{']).unwrap_or_else(|| panic!("no JSON in: {}", run.all()));
    let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Json>();
    stream.next().unwrap().unwrap_or_else(|e| panic!("{e}: {}", run.all()))
}

#[test]
fn kv_namespaces_keys_and_bulk_through_wrangler_and_a_worker() {
    let server = KuraProcess::start();
    let w = Wrangler::new(&server);
    let project = Project::new("cache");
    let created = w.ok(project.path(), &["kv", "namespace", "create", "CACHE"]);
    let id = namespace_id(&created);
    let again = w.run(project.path(), &["kv", "namespace", "create", "CACHE"]);
    assert!(!again.ok && again.all().contains("already exists"), "{}", again.all());
    let listed = parse_json_output(&w.ok(project.path(), &["kv", "namespace", "list"]));
    assert!(listed.as_array().unwrap().iter().any(|n| n["id"] == id.as_str() && n["title"] == "CACHE"), "{listed}");
    let renamed = w.ok(project.path(), &["kv", "namespace", "rename", "CACHE", "--new-name", "STORE"]);
    assert!(renamed.all().contains("Successfully renamed namespace to \"STORE\""), "{}", renamed.all());
    project.edit("wrangler.toml", "NAMESPACE_ID", &id);
    deploy(&w, &project, &[]);
    let client = Client::new(&server);
    let ns = ["--namespace-id", id.as_str(), "--remote"];
    let kv = |args: &[&str]| -> Run {
        let mut all = vec!["kv"];
        all.extend(args);
        all.extend(ns);
        w.ok(project.path(), &all)
    };

    // The Worker writes; wrangler reads the value, its metadata and expiry.
    client.get("cache", "/put?key=greeting&value=hello%20%F0%9F%8C%8D&metadata=%7B%22lang%22%3A%22en%22%7D&ttl=3600");
    assert_eq!(kv(&["key", "get", "greeting", "--text"]).stdout.trim_end(), "hello 🌍");
    let keys = parse_json_output(&kv(&["key", "list"]));
    let greeting = &keys.as_array().unwrap()[0];
    assert_eq!((&greeting["name"], &greeting["metadata"]), (&json!("greeting"), &json!({"lang": "en"})), "{keys}");
    let expiration = greeting["expiration"].as_i64().unwrap();
    let now = jiff::Timestamp::now().as_second();
    assert!((now + 3590..=now + 3610).contains(&expiration), "{expiration} vs {now}");

    // wrangler writes; the Worker reads, as text, JSON, bytes and a stream, with metadata.
    kv(&["key", "put", "settings", r#"{"theme":"dark"}"#, "--metadata", r#"{"v":2,"who":"élodie"}"#, "--ttl", "600"]);
    assert_eq!(client.get("cache", "/get?key=settings&type=json"), json!({"value": {"theme": "dark"}}));
    assert_eq!(
        client.get("cache", "/meta?key=settings"),
        json!({"value": r#"{"theme":"dark"}"#, "metadata": {"v": 2, "who": "élodie"}})
    );
    let binary: Vec<u8> = (0..70_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let file = project.path().join("blob.bin");
    std::fs::write(&file, &binary).unwrap();
    kv(&["key", "put", "blob", "--path", file.to_str().unwrap()]);
    let sha = crate::common::sha256_hex(&binary);
    assert_eq!(client.get("cache", "/get?key=blob&type=arrayBuffer"), json!({"bytes": 70_000, "sha256": sha}));
    assert_eq!(client.get("cache", "/get?key=blob&type=stream"), json!({"bytes": 70_000, "sha256": sha}));
    // A key with characters a URL path must escape.
    let odd = "a/b?c#d%e f\\g";
    let odd_query: String = url_encode(odd);
    client.get("cache", &format!("/put?key={odd_query}&value=odd"));
    assert_eq!(kv(&["key", "get", odd, "--text"]).stdout.trim_end(), "odd");
    kv(&["key", "put", "written-by-wrangler", "yes"]);
    assert_eq!(client.get("cache", "/get?key=written-by-wrangler"), json!({"value": "yes"}));
    kv(&["key", "delete", "written-by-wrangler"]);
    assert_eq!(client.get("cache", "/get?key=written-by-wrangler"), json!({"value": null}));
    let missing =
        w.run(project.path(), &["kv", "key", "get", "written-by-wrangler", "--namespace-id", &id, "--remote"]);
    assert!(!missing.ok && missing.all().contains("404"), "{}", missing.all());

    // 2,500 keys by bulk put (three requests), listed in pages through the binding and through
    // wrangler, read back in bulk, deleted in bulk.
    let entries: Vec<Json> = (0..2500)
        .map(|i| json!({"key": format!("bulk:{i:05}"), "value": format!("v{i}"), "metadata": {"i": i}}))
        .collect();
    let bulk_file = project.path().join("bulk.json");
    std::fs::write(&bulk_file, serde_json::to_vec(&entries).unwrap()).unwrap();
    kv(&["bulk", "put", bulk_file.to_str().unwrap()]);
    let all = client.get("cache", "/list-all?prefix=bulk:");
    assert_eq!((&all["count"], &all["pages"]), (&json!(2500), &json!(3)), "{}", all["count"]);
    let names: Vec<&str> = all["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(names.windows(2).all(|p| p[0] < p[1]), "byte order");
    let page = client.get("cache", "/list?prefix=bulk:&limit=7");
    assert_eq!(page["keys"].as_array().unwrap().len(), 7);
    assert_eq!((&page["list_complete"], &page["keys"][6]["name"]), (&json!(false), &json!("bulk:00006")));
    assert_eq!(page["keys"][6]["metadata"], json!({"i": 6}), "metadata reaches the binding as JSON");
    let next = client.get("cache", &format!("/list?prefix=bulk:&limit=7&cursor={}", page["cursor"].as_str().unwrap()));
    assert_eq!(next["keys"][0]["name"], "bulk:00007");
    let listed = parse_json_output(&kv(&["key", "list", "--prefix", "bulk:"]));
    assert_eq!(listed.as_array().unwrap().len(), 2500);
    let wanted = project.path().join("wanted.json");
    std::fs::write(&wanted, r#"["bulk:00001", "bulk:02499", "nothing-here"]"#).unwrap();
    let got = parse_json_output(&kv(&["bulk", "get", wanted.to_str().unwrap()]));
    assert_eq!(got, json!({"bulk:00001": "v1", "bulk:02499": "v2499", "nothing-here": null}));
    assert_eq!(
        client.get("cache", "/bulk?key=bulk:00001&key=settings&key=none&type=text&withMetadata=1"),
        json!({"bulk:00001": {"value": "v1", "metadata": {"i": 1}}, "settings": {"value": r#"{"theme":"dark"}"#, "metadata": {"v": 2, "who": "élodie"}}, "none": null})
    );
    let doomed: Vec<String> = (0..1200).map(|i| format!("bulk:{i:05}")).collect();
    std::fs::write(&wanted, serde_json::to_vec(&doomed).unwrap()).unwrap();
    kv(&["bulk", "delete", wanted.to_str().unwrap(), "--force"]);
    assert_eq!(client.get("cache", "/list-all?prefix=bulk:")["count"], 1300);

    // KV's limits, at their exact boundaries, as the Worker sees them.
    let refused = |path: &str| -> String {
        let (status, body) = client.send(client.request(reqwest::Method::GET, "cache", path));
        assert_eq!(status, 400, "{path}: {body}");
        body["error"].as_str().unwrap().to_owned()
    };
    client.get("cache", &format!("/put?key={}&value=x", "k".repeat(512)));
    let e = refused(&format!("/put?key={}&value=x", "k".repeat(513)));
    assert!(e.contains("exceeds key length limit of 512"), "{e}");
    let meta = |n: usize| url_encode(&format!("\"{}\"", "m".repeat(n - 2)));
    client.get("cache", &format!("/put?key=m&value=x&metadata={}", meta(1024)));
    let e = refused(&format!("/put?key=m&value=x&metadata={}", meta(1025)));
    assert_eq!(e, "KV PUT failed: 413 Metadata length of 1025 exceeds limit of 1024.");
    client.get("cache", "/put?key=t&value=x&ttl=60");
    let e = refused("/put?key=t&value=x&ttl=59");
    assert_eq!(e, "KV PUT failed: 400 Invalid expiration_ttl of 59. Expiration TTL must be at least 60.");
    let soon = now + 30;
    let e = refused(&format!("/put?key=t&value=x&expiration={soon}"));
    assert!(e.contains("Expiration times must be at least 60 seconds in the future"), "{e}");
    let limit = 25 * 1024 * 1024;
    for length in ["known", "unknown"] {
        client.get("cache", &format!("/put-generated?key=big&bytes={limit}&length={length}"));
        let e = refused(&format!("/put-generated?key=big&bytes={}&length={length}", limit + 1));
        assert!(e.starts_with("KV PUT failed: 413 Value length of"), "{e}");
    }
    assert_eq!(client.get("cache", "/get?key=big&type=arrayBuffer")["bytes"], limit);
    let e = refused("/list?limit=1001");
    assert!(e.contains("Invalid key_count_limit of 1001"), "{e}");

    // A namespace deleted under a deployed Worker: its calls fail, they do not read as empty.
    w.ok(project.path(), &["kv", "namespace", "delete", "--namespace-id", &id, "-y"]);
    let e = refused("/get?key=settings");
    assert!(e.contains("namespace not found"), "{e}");
    let gone = parse_json_output(&w.ok(project.path(), &["kv", "namespace", "list"]));
    assert!(gone.as_array().unwrap().iter().all(|n| n["id"] != id.as_str()), "{gone}");
}

#[test]
fn a_kv_namespace_is_provisioned_by_wrangler_deploy() {
    let server = KuraProcess::start();
    let w = Wrangler::new(&server);
    let project = Project::new("cache");
    project.edit("wrangler.toml", "id = \"NAMESPACE_ID\"\n", "");
    deploy(&w, &project, &[]);
    let client = Client::new(&server);
    client.get("cache", "/fill?n=20");
    assert_eq!(client.get("cache", "/list-all")["count"], 20);
    let listed = parse_json_output(&w.ok(project.path(), &["kv", "namespace", "list"]));
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    // Deployed again, it binds the same namespace rather than making another.
    deploy(&w, &project, &[]);
    assert_eq!(client.get("cache", "/list-all")["count"], 20);
    let listed = parse_json_output(&w.ok(project.path(), &["kv", "namespace", "list"]));
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
}

fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
