//! Differential tests against the oracle: the same SQL run in Miniflare (real workerd, as
//! `scripts/test` installs it with wrangler) and on kura, in the same order on a fresh object or
//! database each: on a SQLite-backed Durable Object against kura's batch endpoint, and through
//! a D1 binding against kura's D1 `/query`. Rows and error texts must be identical;
//! `rows_read`, `rows_written` (and D1's `changes`) too, except where a case says otherwise,
//! each listed in docs/compatibility.md with the reason (workerd counts rows in a patched SQLite
//! virtual machine; kura derives them from stock SQLite's interfaces).

use serde_json::{Value as Json, json};

use crate::common::{ACCOUNT, KuraProcess, installed, post_json, run};

/// Which of a case's counters kura must report as workerd does.
#[derive(Clone, Copy, PartialEq)]
enum Counts {
    Both,
    /// `rows_written` only: workerd counts reads kura cannot see.
    Writes,
    /// Neither (FTS5's shadow tables).
    Neither,
}

/// One SQL text and its parameters.
struct Case {
    sql: String,
    params: Json,
    counts: Counts,
}

fn case(sql: &str) -> Case {
    with(sql, json!([]))
}

fn with(sql: &str, params: Json) -> Case {
    Case { sql: sql.to_owned(), params, counts: Counts::Both }
}

fn reads_differ(c: Case) -> Case {
    Case { counts: Counts::Writes, ..c }
}

fn uncounted(c: Case) -> Case {
    Case { counts: Counts::Neither, ..c }
}

fn cases() -> Vec<Case> {
    vec![
        case("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT UNIQUE, n INTEGER NOT NULL DEFAULT 0)"),
        // An explicit rowid is looked up first: workerd counts the lookup as a read.
        reads_differ(with("INSERT INTO t (id, v) VALUES (1, ?)", json!(["a"]))),
        with("INSERT INTO t (v) VALUES (?)", json!(["b"])),
        with("INSERT INTO t (v) VALUES (?)", json!(["a"])),
        reads_differ(with("INSERT INTO t (id, v) VALUES (1, ?)", json!(["z"]))),
        with("INSERT INTO t (v, n) VALUES (?, NULL)", json!(["c"])),
        case("SELECT id, v FROM t ORDER BY id"),
        with("SELECT v FROM t WHERE id = ?", json!([2])),
        with("UPDATE t SET n = n + 1 WHERE v = ?", json!(["a"])),
        // RETURNING reads its rows back from a scratch table, which workerd counts.
        reads_differ(with("INSERT INTO t (v) VALUES (?) RETURNING id, v", json!(["d"]))),
        case("SELECT * FROM nope"),
        case("SELEC 1"),
        case("SELECT 1; -- a trailing comment"),
        case("SELECT 1; ;"),
        case("SELECT 1;   \n"),
        case("SELECT 1 /* inside */"),
        case("-- only a comment"),
        case(" ; "),
        with("SELECT ?", json!([1, 2])),
        with("SELECT ?, ?", json!([1])),
        with("SELECT 1; SELECT ?", json!([5])),
        with("SELECT ?; SELECT 1", json!([5])),
        // Several statements: the cursor is the last one's, rows and counts.
        case("CREATE TABLE a (x); INSERT INTO a VALUES (1); INSERT INTO a VALUES (2)"),
        // workerd's counters for a last statement that reads after others ran are its own.
        reads_differ(case("INSERT INTO a VALUES (3); SELECT x FROM a ORDER BY x")),
        case("DELETE FROM a WHERE x = 1"),
        // count(*) without a WHERE reads no rows in SQLite; workerd counts the table's rows.
        reads_differ(case("SELECT count(*) FROM a")),
        // DDL: workerd's writes are counted alike; its reads of the schema and table are not.
        reads_differ(case("CREATE INDEX a_x ON a (x)")),
        reads_differ(case("CREATE INDEX a_partial ON a (x) WHERE x > 2")),
        case("CREATE VIEW a_view AS SELECT x FROM a"),
        case("CREATE VIEW IF NOT EXISTS a_view AS SELECT x FROM a"),
        case("CREATE TABLE IF NOT EXISTS a (x UNIQUE)"),
        reads_differ(case("CREATE INDEX a_newline ON a (x)\nWHERE x > 1")),
        case("CREATE TRIGGER a_trigger AFTER INSERT ON a BEGIN SELECT 1; END"),
        reads_differ(case("DROP INDEX a_x")),
        reads_differ(case("DROP TABLE a")),
        case("BEGIN"),
        case("SELECT * FROM _cf_KV"),
        case("CREATE TEMP TABLE tmp (x)"),
        case("ATTACH DATABASE 'x' AS x"),
        case("PRAGMA foreign_keys"),
        case("CREATE TABLE parent (id INTEGER PRIMARY KEY)"),
        case("CREATE TABLE child (id INTEGER PRIMARY KEY, p INTEGER REFERENCES parent (id))"),
        reads_differ(case("INSERT INTO child VALUES (1, 99)")),
        case("CREATE TABLE c (x INTEGER CHECK (x > 0))"),
        case("INSERT INTO c VALUES (-1)"),
        case("SELECT 1 / 0, abs(-9223372036854775807 - 1)"),
        case("SELECT x'00ff', 1.5, NULL, 'text'"),
        // FTS5: workerd counts only the statement's own virtual-table write, not its shadow tables'.
        uncounted(case("CREATE VIRTUAL TABLE f USING fts5 (body)")),
        uncounted(with("INSERT INTO f VALUES (?)", json!(["hello world"]))),
        with("SELECT body FROM f WHERE f MATCH ?", json!(["hello"])),
    ]
}

/// D1 cases: triggers' writes and changes, the PRAGMAs D1 allows and refuses, errors.
fn d1_cases() -> Vec<Case> {
    let mut cases = vec![
        case("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT UNIQUE)"),
        case("CREATE TABLE log (id INTEGER PRIMARY KEY, msg TEXT)"),
        case(
            "CREATE TRIGGER t_log AFTER INSERT ON t BEGIN INSERT INTO log (msg) VALUES (new.v); INSERT INTO log (msg) VALUES (new.v); END",
        ),
        with("INSERT INTO t (v) VALUES (?)", json!(["a"])),
        with("UPDATE t SET v = ? WHERE id = 1", json!(["b"])),
        case("SELECT id, msg FROM log ORDER BY id"),
        with("INSERT INTO t (v) VALUES (?)", json!(["b"])),
        case("DELETE FROM log WHERE id > 1"),
        case("SELECT * FROM nope"),
        case("SELEC 1"),
        case("SELECT * FROM _cf_KV"),
        case("CREATE TEMP TABLE tmp (x)"),
        case("BEGIN TRANSACTION"),
        case("SELECT 1 / 0, x'00ff' IS NOT NULL, 1.5, NULL, 'text'"),
    ];
    // Every PRAGMA here is answered (allowed) or refused with `not authorized: SQLITE_AUTH` alike.
    for pragma in [
        "foreign_keys",
        "table_info(t)",
        "table_xinfo(t)",
        "index_list(t)",
        "journal_mode",
        "cache_size",
        "user_version",
        "user_version = 3",
        "recursive_triggers",
        "defer_foreign_keys = ON",
        "legacy_alter_table",
        "case_sensitive_like = 1",
        "integrity_check",
        "database_list",
        "compile_options",
        "page_count",
        "reverse_unordered_selects",
        "data_version",
        "function_list",
        "foreign_key_check",
        "schema_version",
        "encoding",
        "busy_timeout",
        "ignore_check_constraints",
    ] {
        cases.push(case(&format!("PRAGMA {pragma}")));
    }
    // SQLite's checks read rows; D1 counts them.
    cases.push(reads_differ(case("PRAGMA quick_check")));
    cases.push(reads_differ(case("PRAGMA optimize")));
    cases
}

/// Each case's outcome in Miniflare, as the oracle script `script` (beside this file) reports it.
fn on_workerd(script: &str, cases: &[Case]) -> Vec<Json> {
    let dir = tempfile::tempdir().unwrap();
    let input: Vec<Json> = cases.iter().map(|c| json!({ "sql": c.sql, "params": c.params })).collect();
    let cases_path = dir.path().join("cases.json");
    std::fs::write(&cases_path, serde_json::to_vec(&input).unwrap()).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat/fidelity").join(script);
    let miniflare = installed("node_modules/miniflare/dist/src/index.js");
    let args = [script.to_str().unwrap(), miniflare.to_str().unwrap(), cases_path.to_str().unwrap()];
    let node = run(std::path::Path::new("node"), &args, dir.path(), &[]).expect_ok("Miniflare");
    serde_json::from_str(&node.stdout).unwrap_or_else(|e| panic!("Miniflare's answer ({e}): {}", node.stdout))
}

/// Posts each body to `url` with the admin token: the v4 envelopes, in order.
async fn post_each(url: &str, bodies: impl Iterator<Item = Json>) -> Vec<Json> {
    let http = reqwest::Client::new();
    let mut answers = Vec::new();
    for body in bodies {
        answers.push(post_json(&http, url, &body).await);
    }
    answers
}

/// An answer shaped as the oracle's: its rows and counters, or its error message.
fn outcome(answer: &Json, result: &Json, rows: Json) -> Json {
    match answer["success"] == true {
        false => json!({ "error": answer["errors"][0]["message"] }),
        true => json!({
            "rows": rows,
            "rows_read": result["meta"]["rows_read"],
            "rows_written": result["meta"]["rows_written"],
            "changes": result["meta"]["changes"],
        }),
    }
}

/// Each case's outcome on a Durable Object through kura's batch endpoint.
fn on_kura_object(cases: &[Case]) -> Vec<Json> {
    let server = KuraProcess::start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let namespaces = format!("{}/accounts/{ACCOUNT}/workers/durable_objects/namespaces", server.api);
    runtime.block_on(async {
        post_each(&namespaces, [json!({ "name": "PROBE" })].into_iter()).await;
        let operations =
            cases.iter().map(|c| json!({ "operations": [{ "op": "sql", "sql": c.sql, "params": c.params }] }));
        let answers = post_each(&format!("{namespaces}/PROBE/objects/probe/batch"), operations).await;
        answers
            .iter()
            .map(|a| {
                let result = &a["result"]["results"][0];
                outcome(a, result, result["rows"].clone())
            })
            .collect()
    })
}

/// Each case's outcome through kura's D1 `/query`, rows as arrays in column order.
fn on_kura_database(cases: &[Case]) -> Vec<Json> {
    let server = KuraProcess::start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let databases = format!("{}/accounts/{ACCOUNT}/d1/database", server.api);
    runtime.block_on(async {
        let created = post_each(&databases, [json!({ "name": "probe" })].into_iter()).await;
        let query = format!("{databases}/{}/query", created[0]["result"]["uuid"].as_str().unwrap());
        let answers = post_each(&query, cases.iter().map(|c| json!({ "sql": c.sql, "params": c.params }))).await;
        answers
            .iter()
            .map(|a| {
                let result = &a["result"][0];
                let rows = result["results"].as_array().map(|rows| {
                    rows.iter().map(|row| Json::Array(row.as_object().unwrap().values().cloned().collect())).collect()
                });
                outcome(a, result, rows.map_or(Json::Null, Json::Array))
            })
            .collect()
    })
}

/// Where kura's outcomes differ from the oracle's, as the cases allow.
fn differences(cases: &[Case], oracle: &[Json], kura: &[Json]) -> Vec<String> {
    assert_eq!((oracle.len(), kura.len()), (cases.len(), cases.len()), "one outcome per case");
    let mut found = Vec::new();
    for ((c, want), got) in cases.iter().zip(oracle).zip(kura) {
        let field = |name: &str| want[name] == got[name];
        let same = match (want.get("error"), got.get("error")) {
            (Some(a), Some(b)) => a == b,
            (None, None) => {
                field("rows")
                    && field("changes")
                    && (c.counts != Counts::Both || field("rows_read"))
                    && (c.counts == Counts::Neither || field("rows_written"))
            }
            _ => false,
        };
        if !same {
            found.push(format!("{}\n    workerd: {want}\n    kura:    {got}", c.sql));
        }
    }
    found
}

#[test]
fn durable_object_sql_matches_workerd() {
    let cases = cases();
    let found = differences(&cases, &on_workerd("do_sql.mjs", &cases), &on_kura_object(&cases));
    assert!(found.is_empty(), "kura differs from workerd in:\n  {}", found.join("\n  "));
}

#[test]
fn d1_sql_matches_workerd() {
    let cases = d1_cases();
    let found = differences(&cases, &on_workerd("d1_sql.mjs", &cases), &on_kura_database(&cases));
    assert!(found.is_empty(), "kura's D1 differs from Miniflare's in:\n  {}", found.join("\n  "));
}
