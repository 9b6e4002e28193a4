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

/// Rows spread over many pages, so a state rebuilt on the wrong base shows.
fn insert_many(w: &Connection, from: usize, n: usize) {
    for i in from..from + n {
        w.execute("INSERT INTO t (v) VALUES (?1)", [format!("{i}-{}", "y".repeat(900))]).unwrap();
    }
}

#[test]
fn a_wal_that_did_not_continue_gets_a_new_base_and_older_bookmarks_still_restore() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("object.sqlite");
    let w = writer(&db);
    insert_many(&w, 0, 50);
    let mut follower = Follower::new("ns/object", &db, &dir.path().join("history"), HistorySettings::default());
    let first = follower.bookmark().unwrap();
    // Let go while the writer still has frames it may checkpoint: no marker, no continuity.
    insert_many(&w, 50, 10);
    follower.capture().unwrap();
    let second = follower.bookmark().unwrap();
    assert_eq!(second.seq, first.seq + 10, "one position per commit");
    follower.detach().unwrap();
    // While nobody follows: commits, a full checkpoint and two restarts of the WAL.
    insert_many(&w, 60, 20);
    w.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
    insert_many(&w, 80, 20);
    w.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
    insert_many(&w, 100, 5);
    let rebased = follower.bookmark().unwrap();
    assert_eq!(rebased.seq, second.seq + 1, "a new base, holding all that was committed meanwhile");
    drop(w);
    follower.detach().unwrap();
    follower.restore(&first).unwrap();
    assert_eq!(count(&db), 50);
    follower.restore(&second).unwrap();
    assert_eq!(count(&db), 60);
    follower.restore(&rebased).unwrap();
    assert_eq!(count(&db), 105, "the new base holds what was committed meanwhile");
}

#[test]
fn letting_go_with_everything_checkpointed_continues_into_the_next_wal() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("object.sqlite");
    let w = writer(&db);
    insert_many(&w, 0, 20);
    let mut follower = Follower::new("ns/object", &db, &dir.path().join("history"), HistorySettings::default());
    let before = follower.bookmark().unwrap();
    // Nobody else reads, so the follower's checkpoint on letting go reaches the end: the
    // writer's next commit starts the WAL over, right after what was captured.
    follower.detach().unwrap();
    insert_many(&w, 20, 7);
    let after = follower.bookmark().unwrap();
    assert_eq!(after.seq, before.seq + 7, "every commit of the new WAL captured, no new base");
    drop(w);
    follower.detach().unwrap();
    follower.restore(&before).unwrap();
    assert_eq!(count(&db), 20);
    follower.restore(&after).unwrap();
    assert_eq!(count(&db), 27);
}

#[test]
fn a_restored_database_is_followed_from_its_first_new_commit() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("object.sqlite");
    let w = writer(&db);
    insert_many(&w, 0, 10);
    let mut follower = Follower::new("ns/object", &db, &dir.path().join("history"), HistorySettings::default());
    let ten = follower.bookmark().unwrap();
    insert_many(&w, 10, 10);
    follower.capture().unwrap();
    drop(w);
    follower.detach().unwrap();
    let restored = follower.restore(&ten).unwrap();
    assert_eq!(count(&db), 10);
    // The writer comes back to the restored file; the follower pinned it before.
    let w = writer(&db);
    insert_many(&w, 100, 3);
    let now = follower.bookmark().unwrap();
    assert_eq!(now.seq, restored.bookmark.seq + 3);
    drop(w);
    follower.detach().unwrap();
    follower.restore(&restored.previous).unwrap();
    assert_eq!(count(&db), 20, "the restore is undoable");
}
