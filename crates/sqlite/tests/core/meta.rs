//! D1's per-statement meta: changes, last_row_id, rows read and written, size after; and the
//! columns a statement kept prepared answers.

use crate::common::*;

#[tokio::test]
async fn counts_like_d1s_own_tests() {
    let cx = Context::new();
    let created = cx.ok("CREATE TABLE abc (a INT, b INT, c INT)").await;
    assert_eq!((created[0].meta.changes, created[0].meta.rows_read, created[0].meta.rows_written), (0, 1, 2));
    assert!(created[0].meta.changed_db);
    let inserted = cx.ok("INSERT INTO abc VALUES (1,2,3),(4,5,6)").await;
    assert_eq!((inserted[0].meta.changes, inserted[0].meta.rows_written, inserted[0].meta.last_row_id), (2, 2, 2));
    cx.ok(
        "CREATE TABLE cde (c TEXT, d TEXT, e TEXT); INSERT INTO cde VALUES ('A','B','C'),('D','E','F'),('G','H','I')",
    )
    .await;
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
    cx.ok(
        "CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT, b TEXT); CREATE INDEX t_a ON t(a); CREATE INDEX t_b ON t(b)",
    )
    .await;
    let inserted = cx.ok("INSERT INTO t (a, b) VALUES ('1', '2'), ('3', '4')").await;
    assert_eq!(inserted[0].meta.rows_written, 6);
    let updated = cx.ok("UPDATE t SET a = 'z' WHERE id = 1").await;
    assert_eq!(updated[0].meta.rows_written, 2);
    assert_eq!(updated[0].meta.rows_read, 1);
    let deleted = cx.ok("DELETE FROM t").await;
    assert_eq!(deleted[0].meta.rows_written, 2);
}

#[tokio::test]
async fn index_writes_follow_without_rowid_tables_expression_indexes_and_quoted_names() {
    let cx = Context::new();
    cx.ok("CREATE TABLE w (a, b, c, PRIMARY KEY (a, b)) WITHOUT ROWID; CREATE INDEX w_c ON w(c)").await;
    // The primary key is the table itself: the row, and its entry in w_c.
    assert_eq!(cx.ok("INSERT INTO w VALUES (1, 2, 3)").await[0].meta.rows_written, 2);
    cx.ok(r#"CREATE TABLE "it's" (id INTEGER PRIMARY KEY, a TEXT UNIQUE, b TEXT); CREATE INDEX lower_b ON "it's"(lower(b))"#)
        .await;
    // The row, the UNIQUE constraint's index and the expression index.
    assert_eq!(cx.ok(r#"INSERT INTO "it's" (a, b) VALUES ('x', 'Y')"#).await[0].meta.rows_written, 3);
    // An expression may read any column, so every update touches its index; a's only when a changes.
    assert_eq!(cx.ok(r#"UPDATE "it's" SET b = 'z'"#).await[0].meta.rows_written, 2);
    assert_eq!(cx.ok(r#"UPDATE "it's" SET a = 'w'"#).await[0].meta.rows_written, 3);
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

#[tokio::test]
async fn a_kept_statement_answers_a_tables_new_columns() {
    let cx = Context::new();
    cx.ok("CREATE TABLE u (k TEXT)").await;
    cx.ok("INSERT INTO u VALUES ('one')").await;
    assert_eq!(cx.ok("SELECT * FROM u").await[0].columns, ["k"]);
    cx.ok("ALTER TABLE u ADD COLUMN extra INTEGER DEFAULT 7").await;
    // The same text runs the statement kept from before, which SQLite prepares again.
    let reshaped = cx.ok("SELECT * FROM u").await;
    assert_eq!(reshaped[0].columns, ["k", "extra"]);
    assert_eq!(reshaped[0].rows, [[Value::Text("one".into()), Value::Integer(7)]]);
    cx.ok("ALTER TABLE u DROP COLUMN extra").await;
    assert_eq!(cx.ok("SELECT * FROM u").await[0].columns, ["k"]);
    // An empty answer names its columns too.
    cx.ok("DELETE FROM u").await;
    assert_eq!(cx.ok("SELECT * FROM u").await[0].columns, ["k"]);
}
