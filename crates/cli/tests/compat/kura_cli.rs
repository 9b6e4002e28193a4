//! The `kura` CLI: local mode on a data directory, remote mode against a live server, the data
//! directory lock, and token management while a server runs.

use crate::common::{KuraProcess, TOKEN, kura, write_wrangler_toml};

#[test]
fn local_mode_works_without_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let (cwd, data) = (dir.path(), dir.path().join("data"));
    let ok = |args: &[&str]| kura(cwd, &data, args, &[]).expect_ok(&args.join(" "));

    let created = ok(&["d1", "create", "notes"]);
    assert!(created.stdout.contains("Successfully created DB 'notes'"), "{}", created.all());
    assert!(created.stderr.contains("admin API token"), "the first command creates the account: {}", created.all());
    let listed = ok(&["d1", "list", "--json"]).json();
    assert_eq!(listed[0]["name"], "notes");
    assert!(ok(&["d1", "list"]).stdout.contains("notes"));

    ok(&[
        "d1",
        "execute",
        "notes",
        "--command",
        "CREATE TABLE n (id INTEGER PRIMARY KEY, body TEXT); INSERT INTO n (body) VALUES ('a;b'), ('c')",
    ]);
    let rows = ok(&["d1", "execute", "notes", "--json", "--command", "SELECT body FROM n ORDER BY id"]).json();
    assert_eq!(rows[0]["results"], serde_json::json!([{"body": "a;b"}, {"body": "c"}]));
    let table = ok(&["d1", "execute", "notes", "--command", "SELECT body FROM n ORDER BY id"]);
    assert!(table.stdout.contains("Executed 1 command") && table.stdout.contains("a;b"), "{}", table.all());
    let sql_file = cwd.join("seed.sql");
    std::fs::write(&sql_file, "INSERT INTO n (body) VALUES ('from file');\nINSERT INTO n (body) VALUES ('two');\n")
        .unwrap();
    ok(&["d1", "execute", "notes", "--file", sql_file.to_str().unwrap()]);
    let failed =
        kura(cwd, &data, &["d1", "execute", "notes", "--command", "INSERT INTO n (body) VALUES ('x'); SELEKT"], &[]);
    assert!(!failed.ok && failed.stderr.contains("syntax error"), "{}", failed.all());
    let count = ok(&["d1", "execute", "notes", "--json", "--command", "SELECT count(*) AS c FROM n"]).json();
    assert_eq!(count[0]["results"][0]["c"], 4, "the failed command changed nothing");

    let info = ok(&["d1", "info", "notes", "--json"]).json();
    assert_eq!(info["num_tables"], 1);
    assert!(info["write_queries_24h"].as_u64().unwrap() >= 3);

    // Migrations, locally, from wrangler.toml.
    write_wrangler_toml(cwd, "notes", None);
    ok(&["d1", "migrations", "create", "DB", "tags"]);
    let file = cwd.join("migrations/0001_tags.sql");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, format!("{text}CREATE TABLE tags (name TEXT PRIMARY KEY);\n")).unwrap();
    ok(&["d1", "migrations", "create", "DB", "bad"]);
    std::fs::write(cwd.join("migrations/0002_bad.sql"), "CREATE TABLE partial (x);\nINSERT INTO nowhere VALUES (1);\n")
        .unwrap();
    assert!(ok(&["d1", "migrations", "list", "DB"]).stdout.contains("0002_bad.sql"));
    let applied = kura(cwd, &data, &["d1", "migrations", "apply", "DB"], &[]);
    assert!(!applied.ok && applied.stderr.contains("Migration 0002_bad.sql failed"), "{}", applied.all());
    let tables = ok(&[
        "d1",
        "execute",
        "DB",
        "--json",
        "--command",
        "SELECT name FROM sqlite_schema WHERE name IN ('tags', 'partial')",
    ])
    .json();
    assert_eq!(tables[0]["results"], serde_json::json!([{"name": "tags"}]));

    // Export and import, locally, round trip; Time Travel locally too.
    let before = ok(&["d1", "time-travel", "info", "notes", "--json"]).json()["bookmark"].as_str().unwrap().to_owned();
    let dump = cwd.join("notes.sql");
    ok(&["d1", "export", "notes", "--output", dump.to_str().unwrap()]);
    ok(&["d1", "create", "copy"]);
    let imported = ok(&["d1", "execute", "copy", "--file", dump.to_str().unwrap(), "--json"]).json();
    assert_eq!(imported[0]["success"], true);
    let select = "SELECT id, body FROM n ORDER BY id";
    let rows = |db: &str| ok(&["d1", "execute", db, "--json", "--command", select]).json()[0]["results"].clone();
    assert_eq!(rows("copy"), rows("notes"));
    ok(&["d1", "execute", "notes", "--command", "DELETE FROM n"]);
    let restored = ok(&["d1", "time-travel", "restore", "notes", &format!("--bookmark={before}"), "--json"]).json();
    assert_eq!(restored["previous_bookmark"].as_str().map(|p| p > before.as_str()), Some(true));
    assert_eq!(rows("notes"), rows("copy"), "the restore brought the rows back");

    ok(&["d1", "delete", "notes", "-y"]);
    ok(&["d1", "delete", "copy", "-y"]);
    assert_eq!(ok(&["d1", "list", "--json"]).json(), serde_json::json!([]));
}

#[test]
fn remote_mode_and_tokens_against_a_live_server() {
    let server = KuraProcess::start();
    let cwd = server.dir.path().to_owned();
    let remote = server.remote_env();
    let data = server.data.clone();
    let ok = |args: &[&str]| kura(&cwd, &data, args, &remote).expect_ok(&args.join(" "));

    ok(&["d1", "create", "remote-db", "--remote"]);
    ok(&["d1", "execute", "remote-db", "--remote", "--command", "CREATE TABLE t (x); INSERT INTO t VALUES (1), (2)"]);
    let rows =
        ok(&["d1", "execute", "remote-db", "--remote", "--json", "--command", "SELECT sum(x) AS s FROM t"]).json();
    assert_eq!(rows[0]["results"][0]["s"], 3);
    assert!(ok(&["d1", "info", "remote-db", "--remote"]).stdout.contains("remote-db"));
    let dump = cwd.join("remote.sql");
    ok(&["d1", "export", "remote-db", "--remote", "--output", dump.to_str().unwrap()]);
    assert!(std::fs::read_to_string(&dump).unwrap().contains("INSERT INTO \"t\" (\"x\") VALUES(2);"));
    ok(&["d1", "create", "remote-copy", "--remote"]);
    let imported = ok(&["d1", "execute", "remote-copy", "--remote", "--file", dump.to_str().unwrap()]);
    assert!(imported.stdout.contains("Executed 4 queries"), "{}", imported.all());
    let copied =
        ok(&["d1", "execute", "remote-copy", "--remote", "--json", "--command", "SELECT sum(x) AS s FROM t"]).json();
    assert_eq!(copied[0]["results"][0]["s"], 3);

    // Local commands refuse a directory a server holds, and say what to do instead.
    let refused = kura(&cwd, &data, &["d1", "list"], &[]);
    assert!(!refused.ok && refused.stderr.contains("in use by another kura process"), "{}", refused.all());
    assert!(refused.stderr.contains("--remote"), "{}", refused.all());
    // `kura check` has no --remote: it says to stop the server instead.
    let check = kura(&cwd, &data, &["check"], &[]);
    assert!(!check.ok && check.stderr.contains("stop it, then check"), "{}", check.all());
    assert!(!check.stderr.contains("--remote"), "{}", check.all());
    let missing = kura(&cwd, &data, &["d1", "execute", "no-such-db", "--remote", "--command", "SELECT 1"], &remote);
    assert!(!missing.ok && missing.stderr.contains("Couldn't find a D1 DB"), "{}", missing.all());

    // Tokens can be managed while the server runs; the server sees changes at once.
    let created = ok(&["tokens", "create", "--name", "reader", "--scope", "d1:read"]);
    let secret = created
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("Secret (shown only this once): "))
        .unwrap()
        .trim()
        .to_owned();
    let as_reader: Vec<(&str, String)> = remote
        .iter()
        .map(|(k, v)| if *k == "CLOUDFLARE_API_TOKEN" { (*k, secret.clone()) } else { (*k, v.clone()) })
        .collect();
    let listed = kura(&cwd, &data, &["d1", "list", "--remote", "--json"], &as_reader).expect_ok("list as reader");
    assert_eq!(listed.json()[0]["name"], "remote-db");
    let write =
        kura(&cwd, &data, &["d1", "execute", "remote-db", "--remote", "--command", "DELETE FROM t"], &as_reader);
    assert!(!write.ok && write.stderr.contains("code: 10000"), "{}", write.all());

    let tokens = ok(&["tokens", "list", "--json"]).json();
    let id =
        tokens.as_array().unwrap().iter().find(|t| t["name"] == "reader").unwrap()["id"].as_str().unwrap().to_owned();
    ok(&["tokens", "revoke", &id]);
    let revoked = kura(&cwd, &data, &["d1", "list", "--remote"], &as_reader);
    assert!(!revoked.ok && revoked.stderr.contains("Authentication error"), "{}", revoked.all());
    // A revoked token is not a missing database.
    let revoked = kura(&cwd, &data, &["d1", "execute", "remote-db", "--remote", "--command", "SELECT 1"], &as_reader);
    assert!(!revoked.ok && revoked.stderr.contains("Authentication error"), "{}", revoked.all());
    assert!(!revoked.stderr.contains("Couldn't find"), "{}", revoked.all());

    let wrong: Vec<(&str, String)> = remote
        .iter()
        .map(|(k, v)| if *k == "CLOUDFLARE_API_TOKEN" { (*k, format!("{TOKEN}x")) } else { (*k, v.clone()) })
        .collect();
    assert!(!kura(&cwd, &data, &["d1", "list", "--remote"], &wrong).ok);
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    let server = KuraProcess::start();
    let cwd = server.dir.path().to_owned();
    let remote = server.remote_env();
    let data = server.data.clone();
    kura(&cwd, &data, &["d1", "create", "durable", "--remote"], &remote).expect_ok("create");
    kura(&cwd, &data, &["d1", "execute", "durable", "--remote", "--command", "CREATE TABLE t (x)"], &remote)
        .expect_ok("table");
    for i in 0..20 {
        let sql = format!("INSERT INTO t VALUES ({i})");
        kura(&cwd, &data, &["d1", "execute", "durable", "--remote", "--command", &sql], &remote).expect_ok("insert");
    }
    let (dir, data) = server.stop(); // SIGKILL: no shutdown, no checkpoint
    let server = KuraProcess::start_on(dir, data.clone());
    let remote = server.remote_env();
    let rows = kura(
        &cwd,
        &data,
        &["d1", "execute", "durable", "--remote", "--json", "--command", "SELECT count(*) AS n, sum(x) AS s FROM t"],
        &remote,
    )
    .expect_ok("count")
    .json();
    assert_eq!(rows[0]["results"][0], serde_json::json!({"n": 20, "s": 190}));
}

#[test]
fn durable_objects_from_the_cli_locally_and_remotely() {
    let dir = tempfile::tempdir().unwrap();
    let (cwd, data) = (dir.path(), dir.path().join("data"));
    std::fs::write(
        cwd.join("wrangler.toml"),
        "name = \"chat\"\n[[durable_objects.bindings]]\nname = \"ROOMS\"\nclass_name = \"Room\"\n\
         [[durable_objects.bindings]]\nname = \"OLD\"\nclass_name = \"Legacy\"\n\
         [[migrations]]\ntag = \"v1\"\nnew_sqlite_classes = [\"Room\"]\nnew_classes = [\"Legacy\"]\n",
    )
    .unwrap();
    let run = |args: &[&str]| kura(cwd, &data, args, &[]);
    let ok = |args: &[&str]| run(args).expect_ok(&args.join(" "));

    // The binding creates the namespace on first use, keyed as Miniflare keys it.
    let schema = "CREATE TABLE member (name TEXT PRIMARY KEY)";
    ok(&["do", "sql", "ROOMS", "room:red", &format!("{schema}; INSERT INTO member VALUES ('alice')")]);
    ok(&["do", "sql", "ROOMS", "room:blue", &format!("{schema}; INSERT INTO member VALUES (?)"), "--param", "\"bob\""]);
    let namespaces = ok(&["do", "namespace", "list", "--json"]).json();
    assert_eq!(
        (namespaces[0]["name"].as_str(), namespaces[0]["unique_key"].as_str()),
        (Some("ROOMS"), Some("chat-Room"))
    );

    let red = ok(&["do", "sql", "ROOMS", "room:red", "SELECT name FROM member", "--json"]).json();
    assert_eq!(red["rows"], serde_json::json!([["alice"]]));
    let listed = ok(&["do", "list", "ROOMS", "--json"]).json();
    let mut names: Vec<&str> =
        listed["objects"].as_array().unwrap().iter().filter_map(|o| o["name"].as_str()).collect();
    names.sort();
    assert_eq!(names, ["room:blue", "room:red"]);
    assert!(listed["objects"][0]["stored_bytes"].as_u64().unwrap() > 0);
    let page = ok(&["do", "list", "ROOMS", "--limit", "1", "--json"]).json();
    assert_eq!(page["objects"].as_array().unwrap().len(), 1);
    let rest = ok(&["do", "list", "ROOMS", "--json", "--cursor", page["cursor"].as_str().unwrap()]).json();
    assert_eq!(rest["objects"].as_array().unwrap().len(), 1);
    assert_ne!(rest["objects"][0]["id"], page["objects"][0]["id"]);

    let all = ok(&["do", "query-all", "ROOMS", "SELECT name FROM member", "--json"]).json();
    assert_eq!(all["consistent_snapshot"], false);
    let mut rows: Vec<String> =
        all["objects"].as_array().unwrap().iter().map(|o| o["rows"][0][0].to_string()).collect();
    rows.sort();
    assert_eq!(rows, ["\"alice\"", "\"bob\""]);
    let only_red =
        ok(&["do", "query-all", "ROOMS", "SELECT name FROM member", "--object", "room:red", "--json"]).json();
    assert_eq!(only_red["objects"].as_array().unwrap().len(), 1);
    assert_eq!(only_red["objects"][0]["rows"], serde_json::json!([["alice"]]));
    let table = ok(&["do", "query-all", "ROOMS", "SELECT name FROM member"]);
    assert!(table.stdout.contains("room:red") && table.stdout.contains("alice"), "{}", table.all());

    let dump = cwd.join("red.sql");
    ok(&["do", "export", "ROOMS", "room:red", "--output", dump.to_str().unwrap()]);
    let text = std::fs::read_to_string(&dump).unwrap();
    assert!(text.contains("CREATE TABLE member") && text.contains("'alice'"), "{text}");

    // Bad input: a clear error, nothing changed.
    let begin = run(&["do", "sql", "ROOMS", "room:red", "INSERT INTO member VALUES ('eve'); BEGIN"]);
    assert!(!begin.ok && begin.stderr.contains("transactionSync"), "{}", begin.all());
    let red = ok(&["do", "sql", "ROOMS", "room:red", "SELECT count(*) FROM member", "--json"]).json();
    assert_eq!(red["rows"], serde_json::json!([[1]]), "the failed request changed nothing");
    let unknown = run(&["do", "list", "NOPE"]);
    assert!(!unknown.ok && unknown.stderr.contains("'NOPE' not found"), "{}", unknown.all());
    let kv_backed = run(&["do", "namespace", "create", "OLD"]);
    assert!(!kv_backed.ok && kv_backed.stderr.contains("new_sqlite_classes"), "{}", kv_backed.all());
    let writes = run(&["do", "query-all", "ROOMS", "DELETE FROM member"]);
    assert!(!writes.ok && writes.stdout.contains("read-only statements only"), "{}", writes.all());
    let bad_id = run(&["do", "sql", "ROOMS", &"f".repeat(64), "SELECT 1"]);
    assert!(!bad_id.ok && bad_id.stderr.contains("not valid for this namespace"), "{}", bad_id.all());

    // The same commands against a server.
    drop(dir);
    let server = KuraProcess::start();
    let cwd = server.dir.path().to_owned();
    let remote = server.remote_env();
    let data = server.data.clone();
    let ok = |args: &[&str]| kura(&cwd, &data, args, &remote).expect_ok(&args.join(" "));
    ok(&["do", "namespace", "create", "PLAYERS", "--class", "Player", "--script", "game", "--remote"]);
    ok(&["do", "sql", "PLAYERS", "ann", "CREATE TABLE score (n); INSERT INTO score VALUES (7)", "--remote"]);
    ok(&[
        "do",
        "sql",
        "PLAYERS",
        "ben",
        "CREATE TABLE score (n); INSERT INTO score VALUES (?)",
        "--param",
        "9",
        "--remote",
    ]);
    let listed = ok(&["do", "list", "PLAYERS", "--remote", "--json"]).json();
    assert_eq!(listed["objects"].as_array().unwrap().len(), 2);
    let total = ok(&["do", "query-all", "PLAYERS", "SELECT n FROM score", "--remote", "--json"]).json();
    let sum: i64 = total["objects"].as_array().unwrap().iter().map(|o| o["rows"][0][0].as_i64().unwrap()).sum();
    assert_eq!(sum, 16);
    let ann = ok(&["do", "sql", "PLAYERS", "ann", "SELECT n FROM score", "--remote", "--json"]).json();
    assert_eq!(ann["rows"], serde_json::json!([[7]]));
    let never_used = kura(&cwd, &data, &["do", "export", "PLAYERS", "nobody", "--remote"], &remote);
    assert!(!never_used.ok && never_used.stderr.contains("stored nothing yet"), "{}", never_used.all());
    let exported = ok(&["do", "export", "PLAYERS", "ben", "--remote"]);
    assert!(exported.stdout.contains("VALUES(9)"), "{}", exported.all());
    let namespaces = ok(&["do", "namespace", "list", "--remote", "--json"]).json();
    assert_eq!(namespaces[0]["unique_key"], "game-Player");
}
