//! Following a database another connection writes: every commit captured while the writer's
//! WAL checkpoints and restarts under it, bookmarks restorable once the writer has gone, and a
//! new base when the WAL did not continue while nobody followed.

use kura_sqlite::{Follower, HistorySettings};
use rusqlite::Connection;

fn writer(path: &std::path::Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.execute_batch("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT)").unwrap();
    conn
}

fn count(path: &std::path::Path) -> i64 {
    Connection::open(path).unwrap().query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap()
}

#[test]
fn every_commit_is_captured_across_checkpoints_and_restores_after_the_writer_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("object.sqlite");
    let w = writer(&db);
    let settings = HistorySettings { checkpoint_frames: 200, ..HistorySettings::default() };
    let mut follower = Follower::new("ns/object", &db, &dir.path().join("history"), settings);
    assert!(follower.attach().unwrap());
    let mut marks = Vec::new();
    for i in 0..3000 {
        // Rows big enough that the WAL passes its checkpoint size many times over.
        w.execute("INSERT INTO t (v) VALUES (?1)", [format!("{i}-{}", "x".repeat(500))]).unwrap();
        if i % 37 == 0 {
            follower.capture().unwrap();
        }
        if i % 300 == 299 {
            // A quiet moment: the WAL, all captured and checkpointed, may start over.
            follower.capture().unwrap();
            follower.capture().unwrap();
        }
        if i % 1000 == 999 {
            marks.push((i + 1, follower.bookmark().unwrap()));
        }
    }
    follower.capture().unwrap();
    let wal = std::fs::metadata(dir.path().join("object.sqlite-wal")).unwrap().len();
    assert!(wal < 3 * 1024 * 1024, "the WAL starts over once captured and checkpointed ({wal} bytes)");
    drop(w);
    follower.detach().unwrap();
    for (rows, bookmark) in marks.iter().rev() {
        follower.restore(bookmark).unwrap();
        assert_eq!(count(&db), *rows as i64, "bookmark {bookmark}");
    }
    // The restore itself is undoable: history kept everything.
    let latest = follower.bookmark().unwrap();
    assert!(latest > marks[2].1);
}

#[test]
fn a_wal_that_did_not_continue_gets_a_new_base_and_older_bookmarks_still_restore() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("object.sqlite");
    let w = writer(&db);
    w.execute("INSERT INTO t (v) VALUES ('one')", []).unwrap();
    let mut follower = Follower::new("ns/object", &db, &dir.path().join("history"), HistorySettings::default());
    let first = follower.bookmark().unwrap();
    follower.detach().unwrap();
    // While nobody follows: commits, a full checkpoint and a restart of the WAL.
    w.execute("INSERT INTO t (v) VALUES ('two')", []).unwrap();
    w.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
    w.execute("INSERT INTO t (v) VALUES ('three')", []).unwrap();
    let rebased = follower.bookmark().unwrap();
    assert!(rebased > first);
    drop(w);
    follower.detach().unwrap();
    follower.restore(&first).unwrap();
    assert_eq!(count(&db), 1);
    follower.restore(&rebased).unwrap();
    assert_eq!(count(&db), 3, "the new base holds what was committed meanwhile");
}
