//! Differential tests against the oracle: the same SQL run in Miniflare (real workerd, as
//! `scripts/test` installs it with wrangler) and on kura, in the same order on a fresh object or
//! database each: on a SQLite-backed Durable Object against kura's batch endpoint, and through
//! a D1 binding against kura's D1 `/query`. Rows and error texts must be identical;
//! `rows_read`/`rows_written` (and D1's `changes`) too, except in the cases marked here, which
//! docs/compatibility.md lists with the reason (workerd counts rows in a patched SQLite virtual
//! machine; kura derives them from stock SQLite's interfaces).

use serde_json::{Value as Json, json};

use crate::common::{ACCOUNT, KuraProcess, TOKEN, installed, run};

/// One SQL text and its parameters; `counts` says whether kura's counters must match.
struct Case {
    sql: &'static str,
    params: Json,
    counts: bool,
}

const fn case(sql: &'static str) -> Case {
    Case { sql, params: Json::Null, counts: true }
}

fn with(sql: &'static str, params: Json) -> Case {
    Case { sql, params, counts: true }
}

/// Counted differently: see docs/compatibility.md ("How rows_read and rows_written are counted").
fn uncounted(mut c: Case) -> Case {
    c.counts = false;
    c
}

fn cases() -> Vec<Case> {
    vec![
        case("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT UNIQUE, n INTEGER NOT NULL DEFAULT 0)"),
        // An explicit rowid is looked up first: workerd counts the lookup as a read.
        uncounted(with("INSERT INTO t (id, v) VALUES (1, ?)", json!(["a"]))),
        with("INSERT INTO t (v) VALUES (?)", json!(["b"])),
        with("INSERT INTO t (v) VALUES (?)", json!(["a"])),
        uncounted(with("INSERT INTO t (id, v) VALUES (1, ?)", json!(["z"]))),
        with("INSERT INTO t (v, n) VALUES (?, NULL)", json!(["c"])),
        case("SELECT id, v FROM t ORDER BY id"),
        with("SELECT v FROM t WHERE id = ?", json!([2])),
        with("UPDATE t SET n = n + 1 WHERE v = ?", json!(["a"])),
        // RETURNING reads its rows back from a scratch table, which workerd counts.
        uncounted(with("INSERT INTO t (v) VALUES (?) RETURNING id, v", json!(["d"]))),
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
        uncounted(case("INSERT INTO a VALUES (3); SELECT x FROM a ORDER BY x")),
        case("DELETE FROM a WHERE x = 1"),
        // count(*) without a WHERE reads no rows in SQLite; workerd counts the table's rows.
        uncounted(case("SELECT count(*) FROM a")),
        // DDL: workerd's writes are counted alike; its reads of the schema and table are not.
        uncounted(case("CREATE INDEX a_x ON a (x)")),
        uncounted(case("CREATE INDEX a_partial ON a (x) WHERE x > 2")),
        case("CREATE VIEW a_view AS SELECT x FROM a"),
        case("CREATE VIEW IF NOT EXISTS a_view AS SELECT x FROM a"),
        case("CREATE TABLE IF NOT EXISTS a (x UNIQUE)"),
        uncounted(case("CREATE INDEX a_newline ON a (x)\nWHERE x > 1")),
        case("CREATE TRIGGER a_trigger AFTER INSERT ON a BEGIN SELECT 1; END"),
        uncounted(case("DROP INDEX a_x")),
        uncounted(case("DROP TABLE a")),
        case("BEGIN"),
        case("SELECT * FROM _cf_KV"),
        case("CREATE TEMP TABLE tmp (x)"),
        case("ATTACH DATABASE 'x' AS x"),
        case("PRAGMA foreign_keys"),
        case("CREATE TABLE parent (id INTEGER PRIMARY KEY)"),
        case("CREATE TABLE child (id INTEGER PRIMARY KEY, p INTEGER REFERENCES parent (id))"),
        uncounted(case("INSERT INTO child VALUES (1, 99)")),
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

/// Each case's outcome as kura answers it over the batch endpoint, shaped as the oracle's.
fn on_kura(cases: &[Case]) -> Vec<Json> {
    let server = KuraProcess::start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let http = reqwest::Client::new();
        let namespaces = format!("{}/accounts/{ACCOUNT}/workers/durable_objects/namespaces", server.api);
        let created = http.post(&namespaces).bearer_auth(TOKEN).json(&json!({ "name": "PROBE" })).send().await.unwrap();
        assert!(created.status().is_success());
        let mut outcomes = Vec::new();
        for c in cases {
            outcomes.push({
                let params = if c.params.is_null() { json!([]) } else { c.params.clone() };
                let operations = json!({ "operations": [{ "op": "sql", "sql": c.sql, "params": params }] });
                let answer: Json = http
                    .post(format!("{namespaces}/PROBE/objects/probe/batch"))
                    .bearer_auth(TOKEN)
                    .json(&operations)
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                let result = &answer["result"]["results"][0];
                match answer["success"] == true {
                    false => json!({ "error": answer["errors"][0]["message"] }),
                    true => json!({
                        "rows": result["rows"],
                        "rowsRead": result["meta"]["rows_read"],
                        "rowsWritten": result["meta"]["rows_written"],
                    }),
                }
            });
        }
        outcomes
    })
}

/// Each case's outcome in Miniflare, as the oracle script `script` (beside this file) reports it.
fn on_workerd(script: &str, cases: &[Case]) -> Vec<Json> {
    let dir = tempfile::tempdir().unwrap();
    let input: Vec<Json> = cases
        .iter()
        .map(|c| json!({ "sql": c.sql, "params": if c.params.is_null() { json!([]) } else { c.params.clone() } }))
        .collect();
    let cases_path = dir.path().join("cases.json");
    std::fs::write(&cases_path, serde_json::to_vec(&input).unwrap()).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat/fidelity").join(script);
    let miniflare = installed("node_modules/miniflare/dist/src/index.js");
    let args = [script.to_str().unwrap(), miniflare.to_str().unwrap(), cases_path.to_str().unwrap()];
    let node = run(std::path::Path::new("node"), &args, dir.path(), &[]).expect_ok("Miniflare");
    serde_json::from_str(&node.stdout).unwrap_or_else(|e| panic!("Miniflare's answer ({e}): {}", node.stdout))
}

#[test]
fn durable_object_sql_matches_workerd() {
    let cases = cases();
    let oracle = on_workerd("do_sql.mjs", &cases);
    let kura = on_kura(&cases);
    let mut differences = Vec::new();
    for ((c, want), got) in cases.iter().zip(&oracle).zip(&kura) {
        let same = match (want.get("error"), got.get("error")) {
            (Some(a), Some(b)) => a == b,
            (None, None) => {
                want["rows"] == got["rows"]
                    && (!c.counts || (want["rowsRead"] == got["rowsRead"] && want["rowsWritten"] == got["rowsWritten"]))
            }
            _ => false,
        };
        if !same {
            differences.push(format!("{}\n    workerd: {want}\n    kura:    {got}", c.sql));
        }
    }
    assert!(differences.is_empty(), "kura differs from workerd in:\n  {}", differences.join("\n  "));
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
        cases.push(Case {
            sql: Box::leak(format!("PRAGMA {pragma}").into_boxed_str()),
            params: Json::Null,
            counts: true,
        });
    }
    // SQLite's checks read rows; D1 counts them.
    cases.push(uncounted(case("PRAGMA quick_check")));
    cases.push(uncounted(case("PRAGMA optimize")));
    cases
}

/// Each case's outcome through kura's D1 `/query`, shaped as the oracle's.
fn d1_on_kura(cases: &[Case]) -> Vec<Json> {
    let server = KuraProcess::start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let http = reqwest::Client::new();
        let databases = format!("{}/accounts/{ACCOUNT}/d1/database", server.api);
        let created: Json = http
            .post(&databases)
            .bearer_auth(TOKEN)
            .json(&json!({ "name": "probe" }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let query = format!("{databases}/{}/query", created["result"]["uuid"].as_str().unwrap());
        let mut outcomes = Vec::new();
        for c in cases {
            let params = if c.params.is_null() { json!([]) } else { c.params.clone() };
            let answer: Json = http
                .post(&query)
                .bearer_auth(TOKEN)
                .json(&json!({ "sql": c.sql, "params": params }))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let result = &answer["result"][0];
            outcomes.push(match answer["success"] == true {
                false => json!({ "error": answer["errors"][0]["message"] }),
                true => json!({
                    "rows": result["results"].as_array().unwrap().iter()
                        .map(|row| Json::Array(row.as_object().unwrap().values().cloned().collect()))
                        .collect::<Vec<_>>(),
                    "rows_read": result["meta"]["rows_read"],
                    "rows_written": result["meta"]["rows_written"],
                    "changes": result["meta"]["changes"],
                }),
            });
        }
        outcomes
    })
}

#[test]
fn d1_sql_matches_workerd() {
    let cases = d1_cases();
    let oracle = on_workerd("d1_sql.mjs", &cases);
    let kura = d1_on_kura(&cases);
    let mut differences = Vec::new();
    for ((c, want), got) in cases.iter().zip(&oracle).zip(&kura) {
        let same = match (want.get("error"), got.get("error")) {
            (Some(a), Some(b)) => a == b,
            (None, None) => {
                want["rows"] == got["rows"]
                    && want["changes"] == got["changes"]
                    && (!c.counts
                        || (want["rows_read"] == got["rows_read"] && want["rows_written"] == got["rows_written"]))
            }
            _ => false,
        };
        if !same {
            differences.push(format!("{}\n    workerd: {want}\n    kura:    {got}", c.sql));
        }
    }
    assert!(differences.is_empty(), "kura's D1 differs from Miniflare's in:\n  {}", differences.join("\n  "));
}
