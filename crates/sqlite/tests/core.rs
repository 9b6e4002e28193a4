//! The SQLite core against real files: splitting, meta counters, limits, the authorizer,
//! atomicity, group commit and the registry's lifecycle.

use std::sync::Arc;
use std::time::Duration;

use kura_sqlite::{
    Access, DatabaseOptions, Error, Registry, RegistrySettings, Request, ResultMode, Statement, StatementResult,
    TRANSACTION_MESSAGE, Value,
};

struct Context {
    dir: tempfile::TempDir,
    registry: Registry,
}

impl Context {
    fn new() -> Self {
        Self::with_settings(RegistrySettings::default())
    }

    fn with_settings(settings: RegistrySettings) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_owned();
        let registry = Registry::new(settings, move |key: &str| {
            Some(DatabaseOptions::new(root.join(format!("{key}.sqlite"))).create(true))
        });
        Context { dir, registry }
    }

    async fn run(&self, sql: &str) -> Result<Vec<StatementResult>, Error> {
        self.registry.execute("db", Request::new(vec![Statement::new(sql)])).await
    }

    async fn run_params(&self, sql: &str, params: Vec<Value>) -> Result<Vec<StatementResult>, Error> {
        self.registry.execute("db", Request::new(vec![Statement::with_params(sql, params)])).await
    }

    async fn ok(&self, sql: &str) -> Vec<StatementResult> {
        self.run(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn err(&self, sql: &str) -> String {
        match self.run(sql).await {
            Ok(r) => panic!("{sql} succeeded: {r:?}"),
            Err(e) => e.to_string(),
        }
    }

    async fn scalar(&self, sql: &str) -> Value {
        let results = self.ok(sql).await;
        results.last().unwrap().rows[0][0].clone()
    }
}

mod splitting {
    use super::*;

    #[tokio::test]
    async fn every_statement_gets_a_result() {
        let cx = Context::new();
        let results = cx.ok("SELECT 1 AS one; SELECT 'a;b' AS two -- ; trailing comment\n; /* ; */ SELECT 3").await;
        assert_eq!(results.len(), 3);
        assert_eq!(results[0].columns, vec!["one"]);
        assert_eq!(results[1].rows, vec![vec![Value::Text("a;b".into())]]);
        assert_eq!(results[2].rows, vec![vec![Value::Integer(3)]]);
    }

    #[tokio::test]
    async fn trigger_bodies_are_not_split() {
        let cx = Context::new();
        cx.ok("CREATE TABLE t (x INTEGER, y TEXT);
               CREATE TABLE audit (x INTEGER, kind TEXT);
               CREATE TRIGGER t_ins AFTER INSERT ON t BEGIN
                 INSERT INTO audit VALUES (new.x, CASE WHEN new.x > 1 THEN 'big' ELSE 'small' END);
               END;
               INSERT INTO t VALUES (1, 'a'), (2, 'b');")
            .await;
        assert_eq!(cx.scalar("SELECT group_concat(kind, ',') FROM audit").await, Value::Text("small,big".into()));
    }

    #[tokio::test]
    async fn only_comments_is_no_statement() {
        let cx = Context::new();
        assert_eq!(cx.err("  -- nothing here\n /* still nothing */ ").await, "No SQL statements detected.");
        assert_eq!(cx.err("").await, "No SQL statements detected.");
    }

    #[tokio::test]
    async fn last_statement_mode_returns_one_result() {
        let cx = Context::new();
        let request = Request {
            statements: vec![Statement::with_params(
                "CREATE TABLE t (x); INSERT INTO t VALUES (?)",
                vec![Value::Integer(7)],
            )],
            mode: ResultMode::LastStatement,
            access: Access::ReadWrite,
        };
        let results = cx.registry.execute("db", request).await.unwrap();
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].meta.changes, 1);
    }

    #[tokio::test]
    async fn only_the_last_statement_may_take_parameters() {
        let cx = Context::new();
        let e = cx.run_params("SELECT ?; SELECT 2", vec![Value::Integer(1)]).await.unwrap_err();
        assert!(e.to_string().contains("only the last statement can have parameters"), "{e}");
        let e = cx.run_params("SELECT ?, ?", vec![Value::Integer(1)]).await.unwrap_err();
        assert!(e.to_string().starts_with("Wrong number of parameter bindings"), "{e}");
        let ok =
            cx.run_params("SELECT 1; SELECT ?2, ?1", vec![Value::Integer(1), Value::Text("b".into())]).await.unwrap();
        assert_eq!(ok[1].rows[0], vec![Value::Text("b".into()), Value::Integer(1)]);
    }

    #[tokio::test]
    async fn errors_read_like_d1() {
        let cx = Context::new();
        assert_eq!(cx.err("SELECT * FROM nope").await, "no such table: nope: SQLITE_ERROR");
        assert_eq!(cx.err("SELEC 1").await, "near \"SELEC\": syntax error at offset 0: SQLITE_ERROR");
        cx.ok("CREATE TABLE u (email TEXT UNIQUE); INSERT INTO u VALUES ('a@b')").await;
        assert_eq!(
            cx.err("INSERT INTO u VALUES ('a@b')").await,
            "UNIQUE constraint failed: u.email: SQLITE_CONSTRAINT"
        );
    }
}

mod meta {
    use super::*;

    #[tokio::test]
    async fn counts_like_d1s_own_tests() {
        let cx = Context::new();
        let created = cx.ok("CREATE TABLE abc (a INT, b INT, c INT)").await;
        assert_eq!((created[0].meta.changes, created[0].meta.rows_read, created[0].meta.rows_written), (0, 1, 2));
        assert!(created[0].meta.changed_db);
        let inserted = cx.ok("INSERT INTO abc VALUES (1,2,3),(4,5,6)").await;
        assert_eq!((inserted[0].meta.changes, inserted[0].meta.rows_written, inserted[0].meta.last_row_id), (2, 2, 2));
        cx.ok("CREATE TABLE cde (c TEXT, d TEXT, e TEXT); INSERT INTO cde VALUES ('A','B','C'),('D','E','F'),('G','H','I')").await;
        let joined = cx.ok("SELECT * FROM abc, cde").await;
        assert_eq!(joined[0].rows.len(), 6);
        assert_eq!((joined[0].meta.rows_read, joined[0].meta.rows_written, joined[0].meta.changed_db), (8, 0, false));
        let scanned = cx.ok("SELECT * FROM cde WHERE c IN ('A','D','G')").await;
        assert_eq!(scanned[0].meta.rows_read, 3);
        // The same text again runs the cached statement; its counters start from zero.
        for _ in 0..3 {
            let again = cx.ok("SELECT * FROM cde WHERE c IN ('A','D','G')").await;
            assert_eq!(again[0].meta.rows_read, 3);
        }
    }

    #[tokio::test]
    async fn last_row_id_is_sticky_and_changes_exclude_ddl() {
        let cx = Context::new();
        cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)").await;
        cx.ok("INSERT INTO t (id, v) VALUES (5, 'x')").await;
        let ddl = cx.ok("CREATE TABLE other (x)").await;
        assert_eq!((ddl[0].meta.changes, ddl[0].meta.last_row_id), (0, 5));
        let dropped = cx.ok("DROP TABLE other").await;
        assert_eq!(dropped[0].meta.changes, 0);
        assert!(dropped[0].meta.changed_db);
    }

    #[tokio::test]
    async fn index_entries_count_as_writes() {
        let cx = Context::new();
        cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT, b TEXT); CREATE INDEX t_a ON t(a); CREATE INDEX t_b ON t(b)").await;
        let inserted = cx.ok("INSERT INTO t (a, b) VALUES ('1', '2'), ('3', '4')").await;
        assert_eq!(inserted[0].meta.rows_written, 6);
        let updated = cx.ok("UPDATE t SET a = 'z' WHERE id = 1").await;
        assert_eq!(updated[0].meta.rows_written, 2);
        assert_eq!(updated[0].meta.rows_read, 1);
        let deleted = cx.ok("DELETE FROM t").await;
        assert_eq!(deleted[0].meta.rows_written, 2);
    }

    #[tokio::test]
    async fn size_after_counts_used_pages() {
        let cx = Context::new();
        let before = cx.ok("SELECT 1").await[0].meta.size_after;
        let after = cx.ok("CREATE TABLE t (x)").await[0].meta.size_after;
        assert_eq!(after, before + 4096);
        // Inside one transaction, each statement sees the size as it stands.
        let r = cx.ok("CREATE TABLE big (v); INSERT INTO big VALUES (zeroblob(100000)); DELETE FROM big").await;
        assert_eq!(r[0].meta.size_after, after + 4096);
        assert!(r[1].meta.size_after >= r[0].meta.size_after + 90_000, "{:?}", r[1].meta);
        assert!(r[1].meta.changed_db);
        assert_eq!(r[2].meta.size_after, r[0].meta.size_after, "freed pages are not counted");
    }
}

mod limits {
    use super::*;

    #[tokio::test]
    async fn values_are_limited_in_bytes() {
        let cx = Context::new();
        cx.ok("CREATE TABLE t (v TEXT)").await;
        let three_byte = "€".repeat(700_000);
        assert_eq!(three_byte.len(), 2_100_000);
        let e = cx.run_params("INSERT INTO t VALUES (?)", vec![Value::Text(three_byte)]).await.unwrap_err();
        assert_eq!(e.to_string(), "string or blob too big: SQLITE_TOOBIG");
        let fits = "€".repeat(600_000);
        cx.run_params("INSERT INTO t VALUES (?)", vec![Value::Text(fits)]).await.unwrap();
        let e = cx.err("SELECT randomblob(2000001)").await;
        assert!(e.ends_with("SQLITE_TOOBIG"), "{e}");
    }

    #[tokio::test]
    async fn at_most_100_parameters() {
        let cx = Context::new();
        let sql = |n: usize| format!("SELECT {}", vec!["?"; n].join(", "));
        cx.run_params(&sql(100), vec![Value::Integer(1); 100]).await.unwrap();
        let e = cx.run_params(&sql(101), vec![Value::Integer(1); 101]).await.unwrap_err();
        assert!(e.to_string().starts_with("too many SQL variables at offset"), "{e}");
    }

    #[tokio::test]
    async fn statements_are_limited_to_100000_bytes_each() {
        let cx = Context::new();
        let long = format!("SELECT '{}'", "x".repeat(100_000));
        assert_eq!(cx.err(&long).await, "statement too long: SQLITE_TOOBIG");
        let short = format!("SELECT '{}'", "x".repeat(60_000));
        cx.ok(&format!("{short}; {short}")).await;
    }

    #[tokio::test]
    async fn results_are_bounded_in_memory() {
        let cx = Context::new();
        let e = cx
            .err("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT zeroblob(1000000) FROM r")
            .await;
        assert!(e.starts_with("the results are larger than") && e.ends_with("SQLITE_TOOBIG"), "{e}");
        cx.ok("SELECT zeroblob(1000000) FROM (SELECT 1 UNION ALL SELECT 2)").await;
    }

    #[tokio::test]
    async fn compound_selects_columns_and_like_patterns() {
        let cx = Context::new();
        cx.ok("SELECT 1 UNION SELECT 2 UNION SELECT 3 UNION SELECT 4 UNION SELECT 5").await;
        assert!(
            cx.err("SELECT 1 UNION SELECT 2 UNION SELECT 3 UNION SELECT 4 UNION SELECT 5 UNION SELECT 6")
                .await
                .contains("too many terms in compound SELECT")
        );
        let columns: Vec<String> = (0..101).map(|i| format!("c{i}")).collect();
        assert!(cx.err(&format!("CREATE TABLE wide ({})", columns.join(", "))).await.contains("too many columns"));
        let e = cx.err(&format!("SELECT 'a' LIKE '{}'", "%".repeat(51))).await;
        assert!(e.contains("LIKE or GLOB pattern too complex"), "{e}");
    }
}

mod authorizer {
    use super::*;

    #[tokio::test]
    async fn transactions_get_d1s_message() {
        let cx = Context::new();
        for sql in ["BEGIN", "BEGIN TRANSACTION", "COMMIT", "ROLLBACK", "SAVEPOINT x", "RELEASE x"] {
            assert_eq!(cx.err(sql).await, TRANSACTION_MESSAGE, "{sql}");
        }
    }

    #[tokio::test]
    async fn forbidden_statements_are_not_authorized() {
        let cx = Context::new();
        cx.ok("CREATE TABLE t (x)").await;
        for sql in [
            "ATTACH DATABASE '/tmp/x.sqlite' AS x",
            "CREATE TEMP TABLE tt (x)",
            "CREATE TABLE _cf_mine (x)",
            "CREATE TABLE _CF_mine (x)",
            "CREATE INDEX _cf_idx ON t(x)",
            "PRAGMA user_version",
            "PRAGMA journal_mode = delete",
            "PRAGMA table_info(_cf_KV)",
            "CREATE VIRTUAL TABLE v USING dbstat",
            "ALTER TABLE t RENAME TO _cf_t",
            "SELECT * FROM sqlite_dbpage",
            "SELECT * FROM dbstat",
        ] {
            let e = cx.err(sql).await;
            assert!(e.ends_with("SQLITE_AUTH") || e.contains("not authorized"), "{sql}: {e}");
        }
        assert_eq!(cx.scalar("SELECT count(*) FROM t").await, Value::Integer(0));
        for sql in ["PRAGMA case_sensitive_like = ON; ALTER TABLE t RENAME TO _CF_x", "ALTER TABLE t RENAME TO _cf_KV"]
        {
            let e = cx.err(sql).await;
            assert!(e.contains("not authorized"), "{sql}: {e}");
        }
        assert_eq!(cx.scalar("SELECT count(*) FROM sqlite_schema WHERE name = 't'").await, Value::Integer(1));
        let e = cx.err("SELECT sqlite_version()").await;
        assert!(e.contains("not authorized to use function: sqlite_version"), "{e}");
    }

    #[tokio::test]
    async fn allowed_features_work() {
        let cx = Context::new();
        cx.ok("CREATE VIRTUAL TABLE docs USING fts5(body)").await;
        cx.ok("INSERT INTO docs VALUES ('hello world')").await;
        assert_eq!(cx.scalar("SELECT count(*) FROM docs WHERE docs MATCH 'hello'").await, Value::Integer(1));
        assert_eq!(cx.scalar("SELECT json_extract('{\"a\":[1,2]}', '$.a[1]')").await, Value::Integer(2));
        assert_eq!(cx.scalar("SELECT sqrt(16)").await, Value::Real(4.0));
        cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, x)").await;
        let info = cx.ok("PRAGMA table_info(t)").await;
        assert_eq!(info[0].rows.len(), 2);
        cx.ok("PRAGMA table_list").await;
        cx.ok("PRAGMA defer_foreign_keys = on").await;
        cx.ok("PRAGMA foreign_key_check").await;
        cx.ok("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10) SELECT sum(i) FROM n")
            .await;
        cx.ok("ALTER TABLE t ADD COLUMN y TEXT; ALTER TABLE t RENAME COLUMN y TO z; ALTER TABLE t DROP COLUMN z").await;
    }

    #[tokio::test]
    async fn read_only_access_refuses_writes() {
        let cx = Context::new();
        cx.ok("CREATE TABLE t (x); INSERT INTO t VALUES (1)").await;
        let read = Request { access: Access::ReadOnly, ..Request::new(vec![Statement::new("SELECT x FROM t")]) };
        cx.registry.execute("db", read).await.unwrap();
        let write =
            Request { access: Access::ReadOnly, ..Request::new(vec![Statement::new("SELECT 1; DELETE FROM t")]) };
        assert!(matches!(cx.registry.execute("db", write).await, Err(Error::ReadOnly { .. })));
        assert_eq!(cx.scalar("SELECT count(*) FROM t").await, Value::Integer(1));
    }
}

mod atomicity {
    use super::*;

    #[tokio::test]
    async fn a_failing_batch_changes_nothing() {
        let cx = Context::new();
        cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY)").await;
        let batch = Request::new(vec![
            Statement::new("INSERT INTO t VALUES (1)"),
            Statement::new("INSERT INTO t VALUES (2)"),
            Statement::new("INSERT INTO nope VALUES (3)"),
        ]);
        cx.registry.execute("db", batch).await.unwrap_err();
        assert_eq!(cx.scalar("SELECT count(*) FROM t").await, Value::Integer(0));
    }

    #[tokio::test]
    async fn deferred_foreign_keys_are_checked_at_the_end() {
        let cx = Context::new();
        cx.ok("CREATE TABLE parent (id INTEGER PRIMARY KEY); CREATE TABLE child (pid INTEGER REFERENCES parent(id))")
            .await;
        assert!(cx.err("INSERT INTO child VALUES (1)").await.contains("FOREIGN KEY constraint failed"));
        cx.ok("PRAGMA defer_foreign_keys = on; INSERT INTO child VALUES (1); INSERT INTO parent VALUES (1)").await;
        let e = cx.err("PRAGMA defer_foreign_keys = on; INSERT INTO child VALUES (2)").await;
        assert!(e.contains("FOREIGN KEY constraint failed"), "{e}");
        assert_eq!(cx.scalar("SELECT count(*) FROM child").await, Value::Integer(1));
        // The pragma lasted one request only.
        assert!(cx.err("INSERT INTO child VALUES (3)").await.contains("FOREIGN KEY constraint failed"));
    }

    #[tokio::test]
    async fn group_commit_keeps_requests_independent() {
        let cx = Arc::new(Context::new());
        cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY)").await;
        let mut tasks = Vec::new();
        for i in 0..200i64 {
            let cx = Arc::clone(&cx);
            tasks.push(tokio::spawn(async move {
                // Every 10th request fails halfway (duplicate id) and must leave nothing behind.
                let sql = if i % 10 == 0 {
                    format!("INSERT INTO t VALUES ({}); INSERT INTO t VALUES ({})", 10_000 + i, 10_000 + i)
                } else {
                    format!("INSERT INTO t VALUES ({i})")
                };
                cx.run(&sql).await.is_ok()
            }));
        }
        let mut succeeded = 0;
        for t in tasks {
            succeeded += usize::from(t.await.unwrap());
        }
        assert_eq!(succeeded, 180);
        assert_eq!(cx.scalar("SELECT count(*) FROM t").await, Value::Integer(180));
        assert_eq!(cx.scalar("SELECT count(*) FROM t WHERE id >= 10000").await, Value::Integer(0));
    }

    #[tokio::test]
    async fn on_conflict_rollback_in_a_group_loses_no_other_request() {
        let cx = Arc::new(Context::new());
        cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY)").await;
        cx.ok("INSERT INTO t VALUES (0)").await;
        let mut tasks = Vec::new();
        for i in 1..100i64 {
            let cx = Arc::clone(&cx);
            let sql = if i % 7 == 0 {
                "INSERT OR ROLLBACK INTO t VALUES (0)".to_owned()
            } else {
                format!("INSERT INTO t VALUES ({i})")
            };
            tasks.push(tokio::spawn(async move { cx.run(&sql).await.is_ok() }));
        }
        let succeeded: usize = futures_sum(tasks).await;
        assert_eq!(succeeded, 99 - 14);
        assert_eq!(cx.scalar("SELECT count(*) FROM t").await, Value::Integer(1 + 99 - 14));
    }

    async fn futures_sum(tasks: Vec<tokio::task::JoinHandle<bool>>) -> usize {
        let mut n = 0;
        for t in tasks {
            n += usize::from(t.await.unwrap());
        }
        n
    }

    #[tokio::test]
    async fn acknowledged_writes_survive_reopening() {
        let cx = Context::new();
        cx.ok("CREATE TABLE t (x); INSERT INTO t VALUES ('kept')").await;
        cx.registry.close("db").await;
        assert_eq!(cx.scalar("SELECT x FROM t").await, Value::Text("kept".into()));
        assert!(cx.dir.path().join("db.sqlite").exists());
    }
}

mod registry {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_databases_close_and_reopen() {
        let cx =
            Context::with_settings(RegistrySettings { idle_timeout: Duration::from_millis(50), ..Default::default() });
        cx.ok("CREATE TABLE t (x); INSERT INTO t VALUES (1)").await;
        assert_eq!(cx.registry.open_count(), 1);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(cx.registry.open_count(), 0);
        assert_eq!(cx.scalar("SELECT count(*) FROM t").await, Value::Integer(1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_number_open_is_capped() {
        let cx = Context::with_settings(RegistrySettings { max_open: 4, ..Default::default() });
        for round in 0..3 {
            for i in 0..20 {
                let key = format!("db{i}");
                let sql = if round == 0 {
                    "CREATE TABLE t (x)".to_owned()
                } else {
                    format!("INSERT INTO t VALUES ({round})")
                };
                cx.registry.execute(&key, Request::new(vec![Statement::new(sql)])).await.unwrap();
                assert!(cx.registry.open_count() <= 4);
            }
        }
        for i in 0..20 {
            let r = cx
                .registry
                .execute(&format!("db{i}"), Request::new(vec![Statement::new("SELECT count(*) FROM t")]))
                .await
                .unwrap();
            assert_eq!(r[0].rows[0][0], Value::Integer(2));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_queue_answers_overloaded() {
        let cx = Arc::new(Context::with_settings(RegistrySettings { queue_depth: 1, ..Default::default() }));
        cx.ok("CREATE TABLE t (x)").await;
        let slow =
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000000) SELECT count(*) FROM n";
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let cx = Arc::clone(&cx);
            tasks.push(tokio::spawn(async move { cx.run(slow).await }));
        }
        let mut overloaded = 0;
        for t in tasks {
            if let Err(Error::Overloaded) = t.await.unwrap() {
                overloaded += 1;
            }
        }
        assert!(overloaded > 0);
    }
}
