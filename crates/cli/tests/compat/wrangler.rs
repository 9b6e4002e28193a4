//! Real wrangler 4.85.0, unmodified, against a live kura server.

use serde_json::Value as Json;

use crate::common::{KuraProcess, Wrangler, write_wrangler_toml};

fn names(list: &Json) -> Vec<String> {
    list.as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn d1_create_list_info_execute_delete() {
    let server = KuraProcess::start();
    let w = Wrangler::new(&server);
    let cwd = tempfile::tempdir().unwrap();
    let cwd = cwd.path();

    let created = w.ok(cwd, &["d1", "create", "compat-db"]);
    assert!(created.stdout.contains("Successfully created DB 'compat-db'"), "{}", created.all());
    let dup = w.run(cwd, &["d1", "create", "compat-db"]);
    assert!(!dup.ok && dup.all().contains("A database with that name already exists"), "{}", dup.all());

    let listed = w.ok(cwd, &["d1", "list", "--json"]).json();
    assert_eq!(names(&listed), ["compat-db"]);
    let discovered =
        w.run_with(cwd, &["d1", "list", "--json"], false).expect_ok("d1 list without CLOUDFLARE_ACCOUNT_ID");
    assert_eq!(
        names(&discovered.json()),
        ["compat-db"],
        "the account is discovered through /accounts and /memberships"
    );
    let whoami = w.run_with(cwd, &["whoami"], false).expect_ok("whoami");
    assert!(whoami.all().contains(crate::common::ACCOUNT), "{}", whoami.all());
    let uuid = listed[0]["uuid"].as_str().unwrap().to_owned();
    let table = w.ok(cwd, &["d1", "list"]);
    assert!(table.stdout.contains("compat-db") && table.stdout.contains(&uuid), "{}", table.all());

    write_wrangler_toml(cwd, "compat-db", Some(&uuid));
    let executed = w.ok(cwd, &["d1", "execute", "DB", "--remote", "--command",
        "CREATE TABLE docs (id INTEGER PRIMARY KEY, body TEXT, version INTEGER NOT NULL DEFAULT 1); INSERT INTO docs (body) VALUES ('hello'), ('world');"]);
    assert!(executed.all().contains("Executed 2 commands"), "{}", executed.all());
    let rows = w
        .ok(cwd, &["d1", "execute", "DB", "--remote", "--json", "--command", "SELECT id, body FROM docs ORDER BY id"])
        .json();
    assert_eq!(rows[0]["results"], serde_json::json!([{"id": 1, "body": "hello"}, {"id": 2, "body": "world"}]));
    assert_eq!(rows[0]["success"], true);
    assert!(rows[0]["meta"]["rows_read"].as_u64().unwrap() >= 2);
    let failed = w.run(cwd, &["d1", "execute", "DB", "--remote", "--command", "SELECT * FROM missing"]);
    assert!(!failed.ok && failed.all().contains("no such table: missing: SQLITE_ERROR"), "{}", failed.all());

    let info = w.ok(cwd, &["d1", "info", "DB", "--json"]).json();
    assert_eq!((info["uuid"].as_str(), info["num_tables"].as_u64()), (Some(uuid.as_str()), Some(1)));
    assert!(info["read_queries_24h"].as_u64().unwrap() >= 1, "{info}");
    assert!(info["rows_written_24h"].as_u64().unwrap() >= 2, "{info}");
    let info_table = w.ok(cwd, &["d1", "info", "DB"]);
    assert!(info_table.stdout.contains("database_size"), "{}", info_table.all());

    w.ok(cwd, &["d1", "delete", "compat-db", "-y"]);
    assert_eq!(names(&w.ok(cwd, &["d1", "list", "--json"]).json()), Vec::<String>::new());
}

#[test]
fn d1_migrations_apply_and_roll_back_a_failing_one_whole() {
    let server = KuraProcess::start();
    let w = Wrangler::new(&server);
    let cwd = tempfile::tempdir().unwrap();
    let cwd = cwd.path();
    w.ok(cwd, &["d1", "create", "migrated"]);
    let uuid = w.ok(cwd, &["d1", "list", "--json"]).json()[0]["uuid"].as_str().unwrap().to_owned();
    write_wrangler_toml(cwd, "migrated", Some(&uuid));

    w.ok(cwd, &["d1", "migrations", "create", "DB", "create users"]);
    w.ok(cwd, &["d1", "migrations", "create", "DB", "add posts"]);
    let dir = cwd.join("migrations");
    let append = |file: &str, sql: &str| {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("{text}{sql}")).unwrap();
    };
    append(
        "0001_create_users.sql",
        "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL);\nINSERT INTO users (name) VALUES ('ada');\n",
    );
    append(
        "0002_add_posts.sql",
        "CREATE TABLE posts (id INTEGER PRIMARY KEY, user_id INTEGER REFERENCES users(id));\n",
    );

    let pending = w.ok(cwd, &["d1", "migrations", "list", "DB", "--remote"]);
    assert!(
        pending.stdout.contains("0001_create_users.sql") && pending.stdout.contains("0002_add_posts.sql"),
        "{}",
        pending.all()
    );
    w.ok(cwd, &["d1", "migrations", "apply", "DB", "--remote"]);
    let none = w.ok(cwd, &["d1", "migrations", "list", "DB", "--remote"]);
    assert!(none.all().contains("No migrations to apply"), "{}", none.all());

    // A migration that fails halfway: its first statement must not survive, the earlier ones stay.
    w.ok(cwd, &["d1", "migrations", "create", "DB", "broken"]);
    append(
        "0003_broken.sql",
        "CREATE TABLE half (x);\nINSERT INTO users (name) VALUES ('grace');\nINSERT INTO nowhere VALUES (1);\n",
    );
    w.ok(cwd, &["d1", "migrations", "create", "DB", "after"]);
    append("0004_after.sql", "CREATE TABLE after_broken (x);\n");
    let failed = w.run(cwd, &["d1", "migrations", "apply", "DB", "--remote"]);
    assert!(!failed.ok, "{}", failed.all());
    assert!(
        failed.all().contains("Migration 0003_broken.sql failed") && failed.all().contains("no such table: nowhere"),
        "{}",
        failed.all()
    );

    let state = w
        .ok(cwd, &["d1", "execute", "DB", "--remote", "--json", "--command",
            "SELECT name FROM d1_migrations ORDER BY id; SELECT count(*) AS n FROM sqlite_schema WHERE name IN ('half', 'after_broken'); SELECT count(*) AS n FROM users"])
        .json();
    let applied: Vec<&str> =
        state[0]["results"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(applied, ["0001_create_users.sql", "0002_add_posts.sql"]);
    assert_eq!(state[1]["results"][0]["n"], 0, "nothing of the failed migration, nothing after it");
    assert_eq!(state[2]["results"][0]["n"], 1);
}

#[test]
fn d1_time_travel_info_and_restore() {
    let server = KuraProcess::start();
    let w = Wrangler::new(&server);
    let cwd = tempfile::tempdir().unwrap();
    let cwd = cwd.path();
    w.ok(cwd, &["d1", "create", "travel"]);
    w.ok(cwd, &["d1", "execute", "travel", "--remote", "--command", "CREATE TABLE t (x); INSERT INTO t VALUES (1)"]);
    let info = w.ok(cwd, &["d1", "time-travel", "info", "travel"]);
    assert!(info.stdout.contains("The current bookmark is '"), "{}", info.all());
    let first =
        w.ok(cwd, &["d1", "time-travel", "info", "travel", "--json"]).json()["bookmark"].as_str().unwrap().to_owned();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let between = jiff::Timestamp::now().as_second().to_string();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    w.ok(cwd, &["d1", "execute", "travel", "--remote", "--command", "INSERT INTO t VALUES (2)"]);
    let at = w.ok(cwd, &["d1", "time-travel", "info", "travel", &format!("--timestamp={between}"), "--json"]).json();
    assert_eq!(at["bookmark"], first, "the timestamp's bookmark is the last commit at or before it");
    let second =
        w.ok(cwd, &["d1", "time-travel", "info", "travel", "--json"]).json()["bookmark"].as_str().unwrap().to_owned();

    let restored = w.ok(cwd, &["d1", "time-travel", "restore", "travel", &format!("--bookmark={first}")]);
    assert!(
        restored.stdout.contains("restored back to bookmark") && restored.stdout.contains(&second),
        "{}",
        restored.all()
    );
    let count = |w: &Wrangler| {
        w.ok(cwd, &["d1", "execute", "travel", "--remote", "--json", "--command", "SELECT count(*) AS n FROM t"]).json()
            [0]["results"][0]["n"]
            .as_u64()
    };
    assert_eq!(count(&w), Some(1));
    let undo = w.ok(cwd, &["d1", "time-travel", "restore", "travel", &format!("--bookmark={second}"), "--json"]).json();
    assert_eq!(undo["previous_bookmark"].as_str().map(|b| b > second.as_str()), Some(true), "{undo}");
    assert_eq!(count(&w), Some(2));
    w.ok(cwd, &["d1", "time-travel", "restore", "travel", &format!("--timestamp={between}")]);
    assert_eq!(count(&w), Some(1));
    let bad = w.run(
        cwd,
        &[
            "d1",
            "time-travel",
            "restore",
            "travel",
            "--bookmark=00000000-00000001-00000000-00000000000000000000000000000000",
        ],
    );
    assert!(!bad.ok && bad.all().contains("unknown bookmark"), "{}", bad.all());
}

#[test]
fn d1_export_and_import_round_trip() {
    let server = KuraProcess::start();
    let w = Wrangler::new(&server);
    let cwd = tempfile::tempdir().unwrap();
    let cwd = cwd.path();
    w.ok(cwd, &["d1", "create", "source"]);
    w.ok(cwd, &["d1", "create", "copy"]);
    let seed = cwd.join("seed.sql");
    std::fs::write(
        &seed,
        "CREATE TABLE notes (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT, raw BLOB, score REAL);\n\
         CREATE INDEX notes_body ON notes(body);\n\
         INSERT INTO notes (body, raw, score) VALUES ('it''s \"quoted\"', X'00ff', 2.0);\n\
         INSERT INTO notes (body, raw, score) VALUES ('two\nlines\r\nand CRLF', NULL, -1.5);\n\
         INSERT INTO notes (body, raw, score) VALUES ('unicode ✓', zeroblob(2), NULL);\n",
    )
    .unwrap();
    let imported = w.ok(cwd, &["d1", "execute", "source", "--remote", "--file", seed.to_str().unwrap(), "-y"]);
    assert!(imported.all().contains("Executed 5 queries"), "{}", imported.all());

    let dump = cwd.join("dump.sql");
    let exported = w.ok(cwd, &["d1", "export", "source", "--remote", "--output", dump.to_str().unwrap(), "-y"]);
    assert!(exported.all().contains("Downloaded to"), "{}", exported.all());
    let text = std::fs::read_to_string(&dump).unwrap();
    assert!(text.starts_with("PRAGMA defer_foreign_keys=TRUE;") && text.contains("char(10)"), "{text}");
    w.ok(cwd, &["d1", "execute", "copy", "--remote", "--file", dump.to_str().unwrap(), "-y"]);
    let select = "SELECT id, body, hex(raw) AS raw, typeof(score) AS t, score FROM notes ORDER BY id";
    let rows = |db: &str| {
        w.ok(cwd, &["d1", "execute", db, "--remote", "--json", "--command", select]).json()[0]["results"].clone()
    };
    assert_eq!(rows("copy"), rows("source"));
    assert_eq!(rows("copy")[1]["body"], "two\nlines\r\nand CRLF");

    // A failing import changes nothing.
    let bad = cwd.join("bad.sql");
    std::fs::write(&bad, "INSERT INTO notes (body) VALUES ('new');\nINSERT INTO missing VALUES (1);\n").unwrap();
    let failed = w.run(cwd, &["d1", "execute", "copy", "--remote", "--file", bad.to_str().unwrap(), "-y"]);
    assert!(!failed.ok && failed.all().contains("no such table: missing"), "{}", failed.all());
    assert_eq!(rows("copy").as_array().unwrap().len(), 3);
}

#[test]
fn r2_buckets_and_objects() {
    let server = KuraProcess::start();
    let w = Wrangler::new(&server);
    let cwd = tempfile::tempdir().unwrap();
    let cwd = cwd.path();

    w.ok(cwd, &["r2", "bucket", "create", "wrangler-photos"]);
    let again = w.run(cwd, &["r2", "bucket", "create", "wrangler-photos"]);
    let said = format!("{}{}", again.stdout, again.stderr);
    assert!(!again.ok && said.contains("already exists"), "{said}");
    assert!(w.ok(cwd, &["r2", "bucket", "list"]).stdout.contains("name:           wrangler-photos"));

    let file = cwd.join("cat.txt");
    std::fs::write(&file, "a cat, in text\n").unwrap();
    w.ok(
        cwd,
        &[
            "r2",
            "object",
            "put",
            "wrangler-photos/2026/cat.txt",
            "--file",
            file.to_str().unwrap(),
            "--remote",
            "--content-type",
            "text/plain",
        ],
    );
    let got = w.ok(cwd, &["r2", "object", "get", "wrangler-photos/2026/cat.txt", "--remote", "--pipe"]);
    assert!(got.stdout.contains("a cat, in text"), "{}", got.stdout);
    let out = cwd.join("back.txt");
    w.ok(cwd, &["r2", "object", "get", "wrangler-photos/2026/cat.txt", "--remote", "--file", out.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "a cat, in text\n");

    // The object is the same one S3 clients see.
    let delete_bucket = w.run(cwd, &["r2", "bucket", "delete", "wrangler-photos"]);
    assert!(!delete_bucket.ok, "a bucket holding objects is not deleted");
    w.ok(cwd, &["r2", "object", "delete", "wrangler-photos/2026/cat.txt", "--remote"]);
    let gone = w.run(cwd, &["r2", "object", "get", "wrangler-photos/2026/cat.txt", "--remote", "--pipe"]);
    let said = format!("{}{}", gone.stdout, gone.stderr);
    assert!(!gone.ok && said.contains("The specified key does not exist"), "{said}");
    w.ok(cwd, &["r2", "bucket", "delete", "wrangler-photos"]);
    assert!(!w.ok(cwd, &["r2", "bucket", "list"]).stdout.contains("wrangler-photos"));
}
