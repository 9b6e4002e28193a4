//! Export and import through the D1 engine: a dump imports back to exactly the same contents,
//! and a failing import changes nothing.

use std::sync::Arc;

use kura_catalog::Catalog;
use kura_d1::dump::DumpOptions;
use kura_d1::{CreateOptions, D1, D1Settings, Request, Statement, Value};

struct Engine {
    _dir: tempfile::TempDir,
    d1: D1,
    account: String,
}

fn engine() -> Engine {
    let dir = tempfile::tempdir().unwrap();
    let catalog = Arc::new(Catalog::open(dir.path().join("catalog.sqlite")).unwrap());
    let account = catalog.create_account(None, "a").unwrap().id;
    let d1 = D1::open(dir.path(), catalog, D1Settings::default()).unwrap();
    Engine { _dir: dir, d1, account }
}

impl Engine {
    async fn sql(&self, db: &str, sql: &str) -> Vec<Vec<Value>> {
        let results = self.d1.query(&self.account, db, Request::new(vec![Statement::new(sql)])).await.unwrap();
        results.into_iter().last().map(|r| r.rows).unwrap_or_default()
    }

    async fn export(&self, db: &str, options: DumpOptions) -> String {
        let path = self._dir.path().join(format!("{db}.sql"));
        self.d1.export(&self.account, db, options, path.clone()).await.unwrap();
        std::fs::read_to_string(path).unwrap()
    }

    async fn import(
        &self,
        db: &str,
        sql: String,
    ) -> Result<(kura_d1::import::ImportOutcome, kura_d1::Bookmark), kura_d1::Error> {
        self.d1.import(&self.account, db, Box::new(std::io::Cursor::new(sql.into_bytes()))).await
    }
}

const SCHEMA: &str = r#"
CREATE TABLE people (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, note TEXT, score REAL, photo BLOB);
CREATE TABLE "quoted table" ("odd ""col""" TEXT);
CREATE TABLE pets (id INTEGER PRIMARY KEY, owner INTEGER REFERENCES people(id), kind TEXT);
CREATE INDEX people_name ON people(name);
CREATE VIEW adults AS SELECT * FROM people WHERE score > 1;
CREATE TRIGGER people_touch AFTER UPDATE ON people BEGIN UPDATE people SET note = note WHERE id = new.id; END;
CREATE VIEW adult_names AS SELECT name FROM adults;
CREATE TRIGGER adults_insert INSTEAD OF INSERT ON adults BEGIN INSERT INTO people (name, score) VALUES (new.name, 2); END;
CREATE INDEX pets_kind ON pets(kind);
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dump_imports_back_exactly() {
    let e = engine();
    e.d1.create(&e.account, "source", CreateOptions::default()).await.unwrap();
    e.d1.create(&e.account, "copy", CreateOptions::default()).await.unwrap();
    e.sql("source", SCHEMA).await;
    let rows = [
        "INSERT INTO people (name, note, score, photo) VALUES ('O''Brien', 'line one\nline two', 2.0, X'00ff10')",
        "INSERT INTO people (name, note, score, photo) VALUES ('crlf', 'a\r\nb\\n literal', 1.5e300, NULL)",
        "INSERT INTO people (name, note, score, photo) VALUES ('unicode ✓ 東京', NULL, -0.1, zeroblob(3))",
        "INSERT INTO people (name, note, score, photo) VALUES ('big', '9007199254740993', 9007199254740993, '')",
        "INSERT INTO people (name, note) VALUES ('nul', 'a' || char(0) || 'b')",
        "INSERT INTO people (name, note) VALUES ('not utf-8', CAST(X'ff00fe' AS TEXT))",
        "INSERT INTO \"quoted table\" VALUES ('x''y')",
        "INSERT INTO pets VALUES (1, 1, 'cat')",
    ];
    for row in rows {
        e.sql("source", &format!("PRAGMA defer_foreign_keys = on; {row}")).await;
    }
    let dump = e.export("source", DumpOptions::default()).await;
    assert!(dump.starts_with("PRAGMA defer_foreign_keys=TRUE;\n"), "{dump}");
    assert!(dump.contains("CREATE TABLE IF NOT EXISTS \"quoted table\""), "{dump}");
    assert!(dump.contains("DELETE FROM sqlite_sequence;"), "{dump}");
    assert!(dump.contains("replace('line one\\nline two','\\n',char(10))"), "{dump}");
    assert!(dump.contains("X'00ff10'"), "{dump}");

    let (outcome, _) = e.import("copy", dump.clone()).await.unwrap();
    assert!(outcome.num_queries >= 10);
    assert_eq!(
        e.sql("copy", "PRAGMA defer_foreign_keys").await,
        [[Value::Integer(0)]],
        "the dump's PRAGMA ended with it"
    );
    let compare = "SELECT id, name, hex(note), typeof(note), score, typeof(score), photo, typeof(photo) \
                   FROM people ORDER BY id";
    assert_eq!(e.sql("copy", compare).await, e.sql("source", compare).await);
    assert_eq!(
        e.sql("copy", "SELECT * FROM \"quoted table\"").await,
        e.sql("source", "SELECT * FROM \"quoted table\"").await
    );
    assert_eq!(
        e.sql("copy", "SELECT * FROM sqlite_sequence").await,
        e.sql("source", "SELECT * FROM sqlite_sequence").await
    );
    let schema = "SELECT type, name, sql FROM sqlite_schema ORDER BY name";
    assert_eq!(e.sql("copy", schema).await, e.sql("source", schema).await);
    assert_eq!(e.export("copy", DumpOptions::default()).await, dump, "exporting the copy gives the same dump");

    let data_only = e.export("source", DumpOptions { no_schema: true, ..Default::default() }).await;
    assert!(!data_only.contains("CREATE") && data_only.contains("INSERT INTO \"people\""));
    let one_table = e.export("source", DumpOptions { tables: vec!["pets".into()], ..Default::default() }).await;
    assert!(one_table.contains("INSERT INTO \"pets\"") && !one_table.contains("INSERT INTO \"people\""));
    assert!(one_table.contains("pets_kind") && !one_table.contains("people_name"), "a table's indexes go with it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_import_changes_nothing() {
    let e = engine();
    e.d1.create(&e.account, "db", CreateOptions::default()).await.unwrap();
    e.sql("db", "CREATE TABLE t (x); INSERT INTO t VALUES (1)").await;
    let before = e.d1.bookmark(&e.account, "db", None).await.unwrap();
    let mut sql = String::new();
    for i in 0..500 {
        sql.push_str(&format!("INSERT INTO t VALUES ({i});\n"));
    }
    sql.push_str("CREATE TABLE made (y);\nINSERT INTO nowhere VALUES (1);\n");
    let e2 = e.import("db", sql).await.unwrap_err();
    assert!(e2.to_string().contains("no such table: nowhere"), "{e2}");
    assert_eq!(e.sql("db", "SELECT count(*) FROM t").await, vec![vec![Value::Integer(1)]]);
    assert_eq!(
        e.sql("db", "SELECT count(*) FROM sqlite_schema WHERE name = 'made'").await,
        vec![vec![Value::Integer(0)]]
    );
    assert_eq!(e.d1.bookmark(&e.account, "db", None).await.unwrap(), before);
    for refused in ["BEGIN TRANSACTION;\nINSERT INTO t VALUES (9);\nCOMMIT;\n", "ATTACH 'x' AS y;\n"] {
        assert!(e.import("db", refused.to_owned()).await.is_err(), "{refused}");
    }
    // A statement that never ends is refused once it outgrows the limit, not buffered forever.
    let endless = format!("INSERT INTO t VALUES (4);\nINSERT INTO t VALUES ('{}\n", "x\n".repeat(6_000_000));
    let too_long = e.import("db", endless).await.unwrap_err();
    assert!(too_long.to_string().contains("statement too long"), "{too_long}");
    let one_line = format!("INSERT INTO t VALUES ('{}", "y".repeat(11_000_000));
    let too_long = e.import("db", one_line).await.unwrap_err();
    assert!(too_long.to_string().contains("statement too long"), "{too_long}");
    assert_eq!(e.d1.bookmark(&e.account, "db", None).await.unwrap(), before);
    let (ok, after) =
        e.import("db", "-- a comment\nINSERT INTO t VALUES (2);\nINSERT INTO t VALUES (3)".into()).await.unwrap();
    assert_eq!(ok.num_queries, 2);
    assert!(after.to_string() > before.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virtual_tables_cannot_be_exported() {
    let e = engine();
    e.d1.create(&e.account, "fts", CreateOptions::default()).await.unwrap();
    e.sql("fts", "CREATE VIRTUAL TABLE docs USING fts5(body)").await;
    let path = e._dir.path().join("fts.sql");
    let err = e.d1.export(&e.account, "fts", DumpOptions::default(), path).await.unwrap_err();
    assert_eq!(err.to_string(), "D1 Export error: cannot export databases with Virtual Tables (fts5)");
}
