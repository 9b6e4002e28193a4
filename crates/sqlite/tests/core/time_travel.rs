//! Time Travel: bookmarks, restore and undo, timestamps, recovery of a torn or lost log tail,
//! damage detection, and a randomized check that every recorded bookmark restores exactly.

use std::path::PathBuf;

use crate::common::*;

fn small() -> HistorySettings {
    HistorySettings {
        checkpoint_frames: 6,
        segment_bytes: 24 * 1024,
        snapshot_log_bytes: 48 * 1024,
        ..HistorySettings::default()
    }
}

async fn bookmark(cx: &Context) -> Bookmark {
    cx.registry.with_database("db", |db| db.bookmark()).await.unwrap().unwrap()
}

/// Runs one write and answers the bookmark it was answered with.
async fn write_answered(cx: &Context, sql: &str) -> Bookmark {
    let executed = cx.registry.execute_with_bookmark("db", Request::new(vec![Statement::new(sql)])).await.unwrap();
    executed.bookmark.expect("a write is answered with its bookmark")
}

async fn restore(cx: &Context, b: Bookmark) -> Result<Restored, Error> {
    cx.registry.with_database("db", move |db| db.restore(&b)).await.unwrap()
}

async fn checkpoint(cx: &Context) {
    cx.registry.with_database("db", |db| db.checkpoint()).await.unwrap().unwrap();
}

async fn rows(cx: &Context) -> Vec<Vec<Value>> {
    cx.ok("SELECT id, v FROM t ORDER BY id").await.pop().unwrap().rows
}

fn ids(rows: &[Vec<Value>]) -> Vec<i64> {
    rows.iter().map(|r| if let Value::Integer(i) = r[0] { i } else { -1 }).collect()
}

fn log_files(cx: &Context, suffix: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(cx.dir.path().join("db/log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    files.sort();
    files
}

/// A database closed after `n` commits of a row each, all in its open segment (no snapshot
/// after the first), with each commit's bookmark.
async fn commits_in_one_segment(n: i64) -> (Context, Vec<Bookmark>) {
    let cx =
        Context::with_history(HistorySettings { segment_bytes: u64::MAX, snapshot_log_bytes: u64::MAX, ..small() });
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)").await;
    let mut marks = Vec::new();
    for i in 0..n {
        cx.ok(&format!("INSERT INTO t VALUES ({i}, '{}')", "z".repeat(900))).await;
        marks.push(bookmark(&cx).await);
    }
    cx.registry.close("db").await;
    (cx, marks)
}

/// Flips a byte of the open segment: the one `at` picks given the segment's length.
fn damage_open_segment(cx: &Context, at: impl FnOnce(usize) -> usize) {
    let open = log_files(cx, ".open").pop().unwrap();
    let mut bytes = std::fs::read(&open).unwrap();
    let at = at(bytes.len());
    bytes[at] ^= 0x5a;
    std::fs::write(&open, bytes).unwrap();
}

/// Removes the note a clean close leaves beside the open segment, as if the server had died
/// instead of closing.
fn forget_clean_close(cx: &Context) {
    let notes = log_files(cx, ".checked");
    assert_eq!(notes.len(), 1, "a clean close notes what it checked");
    std::fs::remove_file(&notes[0]).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_undo_timestamps_and_order() {
    let cx = Context::with_history(small());
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)").await;
    cx.ok("INSERT INTO t VALUES (1, 'one')").await;
    let b1 = bookmark(&cx).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let after_b1 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    tokio::time::sleep(Duration::from_millis(20)).await;
    cx.ok("INSERT INTO t VALUES (2, 'two'); INSERT INTO t VALUES (3, 'three')").await;
    let b2 = bookmark(&cx).await;
    assert!(b2.to_string() > b1.to_string());

    let by_time = cx.registry.with_database("db", move |db| db.bookmark_for_time(after_b1)).await.unwrap().unwrap();
    assert_eq!(by_time, b1, "the bookmark for a time is the last commit at or before it");

    let r = restore(&cx, b1).await.unwrap();
    assert_eq!(ids(&rows(&cx).await), [1]);
    assert_eq!(r.previous, b2);
    assert!(r.bookmark.to_string() > b2.to_string(), "a restore is a new, later entry");
    assert_eq!(bookmark(&cx).await, r.bookmark);

    let undo = restore(&cx, r.previous).await.unwrap();
    assert_eq!(ids(&rows(&cx).await), [1, 2, 3], "restoring the previous bookmark undoes a restore");
    cx.ok("INSERT INTO t VALUES (4, 'four')").await;
    let b4 = bookmark(&cx).await;
    assert!(b4.to_string() > undo.bookmark.to_string());

    // Older than an earlier restore, and the restore points themselves, stay restorable.
    restore(&cx, b1).await.unwrap();
    assert_eq!(ids(&rows(&cx).await), [1]);
    restore(&cx, r.bookmark).await.unwrap();
    assert_eq!(ids(&rows(&cx).await), [1]);
    restore(&cx, b4).await.unwrap();
    assert_eq!(ids(&rows(&cx).await), [1, 2, 3, 4]);
    cx.ok("INSERT INTO t VALUES (5, 'five')").await;
    assert_eq!(ids(&rows(&cx).await), [1, 2, 3, 4, 5], "writes go on after a restore");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bookmarks_and_timestamps_are_refused() {
    let cx = Context::with_history(small());
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'x')").await;
    let current = bookmark(&cx).await;
    let future = Bookmark { seq: current.seq + 10, ..current };
    assert!(matches!(restore(&cx, future).await, Err(Error::InvalidBookmark { .. })));
    let foreign = "00000000-00000001-00000000-00000000000000000000000000000000".parse::<Bookmark>().unwrap();
    assert!(matches!(restore(&cx, foreign).await, Err(Error::InvalidBookmark { .. })));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    for t in [now + 3_600_000, now - 31 * 86_400_000, 0] {
        let r = cx.registry.with_database("db", move |db| db.bookmark_for_time(t)).await.unwrap();
        assert!(matches!(r, Err(Error::InvalidBookmark { .. })), "{t}: {r:?}");
    }
    assert!("not-a-bookmark".parse::<Bookmark>().is_err());
    assert_eq!(ids(&rows(&cx).await), [1], "refused restores change nothing");
}

/// A database with small segments and snapshots after 60 commits of a row each, with each
/// commit's bookmark and the rows it leaves.
async fn sixty_commits_over_segments() -> (Context, Vec<(Bookmark, usize)>) {
    let cx = Context::with_history(small());
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)").await;
    let mut marks = Vec::new();
    for i in 0..60 {
        // Random, so that packing the commits cannot shrink them below a few segments.
        cx.ok(&format!("INSERT INTO t VALUES ({i}, hex(randomblob(450)))")).await;
        marks.push((bookmark(&cx).await, i + 1));
    }
    (cx, marks)
}

/// Copies `from`'s history log to `to`, as another node fetches it from shared storage.
fn copy_log(from: &Context, to: &Context) {
    let log = to.dir.path().join("db/log");
    std::fs::create_dir_all(&log).unwrap();
    for entry in std::fs::read_dir(from.dir.path().join("db/log")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, log.join(path.file_name().unwrap())).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_survives_reopening_and_segments_roll() {
    let (cx, marks) = sixty_commits_over_segments().await;
    assert!(log_files(&cx, ".seg").len() >= 2, "small segments were sealed");
    assert!(log_files(&cx, ".snap").len() >= 2, "snapshots were taken");
    cx.registry.close("db").await;
    let checked = kura_sqlite::verify_history(&cx.dir.path().join("db/db.sqlite")).unwrap().unwrap();
    assert_eq!(checked.segments, log_files(&cx, ".seg").len() + 1);
    assert_eq!(checked.snapshots, log_files(&cx, ".snap").len());
    assert_eq!(checked.torn_tail_bytes, 0);
    assert_eq!(checked.last_seq, Some(61), "the table and 60 rows");
    // As an older version could leave it: a crash after starting a segment, before sealing the
    // previous one. Opening seals it again.
    let last_sealed = log_files(&cx, ".seg").pop().unwrap();
    let first = last_sealed.file_name().unwrap().to_string_lossy()[..16].to_owned();
    std::fs::rename(&last_sealed, last_sealed.with_file_name(format!("{first}.open"))).unwrap();
    assert_eq!(log_files(&cx, ".open").len(), 2);
    assert_eq!(rows(&cx).await.len(), 60);
    assert_eq!(log_files(&cx, ".open").len(), 1);
    for (b, n) in marks.iter().rev().step_by(7) {
        restore(&cx, *b).await.unwrap();
        assert_eq!(rows(&cx).await.len(), *n, "bookmark {b}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_or_lost_log_tail_is_dropped_and_recaptured_from_the_wal() {
    // Records recaptured from the WAL carry its last modification as their time (the answer
    // times went with the lost records), and a bookmark's time is in whole seconds: start at a
    // second's beginning, so the commits and that modification fall in the same second.
    let into_second = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    tokio::time::sleep(std::time::Duration::from_nanos(u64::from(1_000_000_000 - into_second))).await;
    let cx = Context::with_history(HistorySettings { checkpoint_frames: 1_000_000, ..small() });
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)").await;
    let mut marks = Vec::new();
    for i in 0..8 {
        cx.ok(&format!("INSERT INTO t VALUES ({i}, 'v{i}')")).await;
        marks.push(bookmark(&cx).await);
    }
    cx.registry.close("db").await;
    let open = log_files(&cx, ".open").pop().unwrap();
    let starts = record_starts(&std::fs::read(&open).unwrap());
    assert!(starts.len() >= 3, "the commits took more than one record");
    // Lose the last record (never synced), and leave half of the one before it (a torn write).
    let torn = starts[starts.len() - 3];
    let half = (starts[starts.len() - 2] - torn) / 2;
    std::fs::OpenOptions::new().write(true).open(&open).unwrap().set_len((torn + half) as u64).unwrap();
    let checked = kura_sqlite::verify_history(&cx.dir.path().join("db/db.sqlite")).unwrap().unwrap();
    assert_eq!(checked.torn_tail_bytes, half as u64, "the offline check counts the torn tail and accepts it");

    assert_eq!(ids(&rows(&cx).await), (0..8).collect::<Vec<_>>(), "the database itself lost nothing");
    assert_eq!(bookmark(&cx).await, *marks.last().unwrap(), "the WAL gave the lost records back");
    for (i, b) in marks.iter().enumerate() {
        restore(&cx, *b).await.unwrap();
        assert_eq!(ids(&rows(&cx).await), (0..=i as i64).collect::<Vec<_>>());
    }
}

/// Where each record of a segment's bytes starts (each begins with its length; the segment with
/// 16 bytes), and where the last ends.
fn record_starts(bytes: &[u8]) -> Vec<usize> {
    let mut starts = vec![16usize];
    while *starts.last().unwrap() < bytes.len() {
        let at = *starts.last().unwrap();
        starts.push(at + u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize);
    }
    starts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_is_reported_and_never_applied() {
    let cx = Context::with_history(HistorySettings { snapshot_log_bytes: u64::MAX, ..small() });
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)").await;
    let mut marks = Vec::new();
    for i in 0..40 {
        cx.ok(&format!("INSERT INTO t VALUES ({i}, hex(randomblob(450)))")).await;
        marks.push(bookmark(&cx).await);
    }
    let sealed = log_files(&cx, ".seg");
    assert!(!sealed.is_empty());
    let victim = &sealed[0];
    let mut bytes = std::fs::read(victim).unwrap();
    // A byte of the pages (the last before the CRC) of the record in the middle of the segment:
    // the header stays readable, so the damage is found by the checksum.
    let starts = record_starts(&bytes);
    let middle = bytes.len() / 2;
    let end = *starts.iter().find(|&&end| end > middle).unwrap();
    bytes[end - 5] ^= 0x5a;
    std::fs::write(victim, bytes).unwrap();
    let found = kura_sqlite::verify_history(&cx.dir.path().join("db/db.sqlite")).unwrap_err().to_string();
    assert!(found.contains("fails its checksum"), "the offline check finds the damage: {found}");
    let before = rows(&cx).await;
    let e = restore(&cx, marks[35]).await.unwrap_err();
    let message = e.to_string();
    assert!(matches!(e, Error::HistoryDamaged { .. }), "{message}");
    assert!(
        message.contains(&victim.file_name().unwrap().to_string_lossy().to_string()),
        "the damage is named: {message}"
    );
    assert_eq!(rows(&cx).await, before, "a failed restore changes nothing");
    cx.ok("INSERT INTO t VALUES (1000, 'still writable')").await;
}

/// A restore reads only the segments between its snapshot and its target: a header damaged in
/// an older segment stops the restores that need it, and only those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_in_a_segment_a_restore_does_not_need_does_not_stop_it() {
    let (cx, marks) = sixty_commits_over_segments().await;
    let sealed = log_files(&cx, ".seg");
    let snapshots = log_files(&cx, ".snap");
    assert!(sealed.len() >= 2 && snapshots.len() >= 2, "segments were sealed and snapshots taken");
    let oldest = &sealed[0];
    let oldest_last = u64::from_str_radix(&oldest.file_name().unwrap().to_string_lossy()[17..33], 16).unwrap();
    let mut bytes = std::fs::read(oldest).unwrap();
    bytes[16 + 8] = 0x7f; // the first record's kind: no kind at all
    std::fs::write(oldest, bytes).unwrap();

    let before = rows(&cx).await;
    let (early, _) = marks[0];
    let e = restore(&cx, early).await.unwrap_err();
    assert!(matches!(e, Error::HistoryDamaged { .. }), "a restore through the damage is refused: {e}");
    assert_eq!(rows(&cx).await, before, "a failed restore changes nothing");
    let (late, n) = *marks.last().unwrap();
    assert!(late.seq > oldest_last, "the last bookmark lies past the damaged segment");
    let (middle, m) = marks[40];
    restore(&cx, middle).await.unwrap();
    assert_eq!(rows(&cx).await.len(), m);
    restore(&cx, late).await.unwrap();
    assert_eq!(rows(&cx).await.len(), n);

    // Another node building the file from the log alone starts at its newest snapshot too.
    cx.registry.close("db").await;
    let other = Context::with_history(small());
    copy_log(&cx, &other);
    assert!(kura_sqlite::materialize(&other.dir.path().join("db/db.sqlite")).unwrap().is_some());
    assert_eq!(rows(&other).await.len(), n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_interrupted_before_its_entry_is_forgotten() {
    let cx = Context::with_history(small());
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'a')").await;
    cx.ok("INSERT INTO t VALUES (2, 'b')").await;
    let current = bookmark(&cx).await;
    cx.registry.close("db").await;
    // As if the server had died after the restore's snapshot and marker, before its entry.
    let log = cx.dir.path().join("db/log");
    let stray = log.join(format!("{:016x}.snap", current.seq + 1));
    std::fs::copy(log_files(&cx, ".snap").remove(0), &stray).unwrap();
    std::fs::write(log.join("restore.pending"), format!("{:016x}\n", current.seq + 1)).unwrap();
    std::fs::write(cx.dir.path().join("db/db.restore.tmp"), b"half an image").unwrap();

    assert_eq!(ids(&rows(&cx).await), [1, 2], "the restore did not happen");
    assert_eq!(bookmark(&cx).await, current);
    for leftover in [stray, log.join("restore.pending"), cx.dir.path().join("db/db.restore.tmp")] {
        assert!(!leftover.exists(), "{} was cleaned up", leftover.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_inside_the_open_segment_keeps_what_is_sound_and_never_reuses_a_position() {
    let (cx, marks) = commits_in_one_segment(40).await;
    // Damage a record the log synced long ago (checkpoints every few frames since, so the WAL
    // no longer holds it), in a log a crash left: without the note a clean close leaves, the
    // next open checks the whole open segment. (After a clean close it checks only what was
    // appended since; damage at rest before that is found by `kura check` and by a restore
    // that reads it, as in a sealed segment.)
    forget_clean_close(&cx);
    damage_open_segment(&cx, |len| len / 3);
    let db_path = cx.dir.path().join("db/db.sqlite");
    let found = kura_sqlite::verify_history(&db_path).unwrap_err().to_string();
    assert!(found.contains("fails its checksum"), "damage inside the open segment is no torn tail: {found}");

    assert_eq!(ids(&rows(&cx).await), (0..40).collect::<Vec<_>>(), "the database itself lost nothing");
    let after = bookmark(&cx).await;
    cx.registry.close("db").await;
    let repaired = kura_sqlite::verify_history(&db_path).unwrap().unwrap();
    assert_eq!(repaired.last_seq, Some(after.seq), "the repaired log, from its new base, checks sound");
    assert!(after.seq > marks.last().unwrap().seq + 1, "the damaged positions are skipped, never reused");
    assert_eq!(log_files(&cx, ".damaged").len(), 1, "the damaged bytes are kept aside");
    let mut sound = 0;
    for (i, b) in marks.iter().enumerate() {
        match restore(&cx, *b).await {
            Ok(_) => {
                assert_eq!(sound, i, "only a prefix of the history survives");
                assert_eq!(ids(&rows(&cx).await), (0..=i as i64).collect::<Vec<_>>());
                sound += 1;
            }
            Err(e) => assert!(matches!(e, Error::HistoryDamaged { .. }), "bookmark #{i}: {e}"),
        }
    }
    assert!(sound > 0 && sound < marks.len(), "{sound} of {} bookmarks survived", marks.len());
    restore(&cx, after).await.unwrap();
    assert_eq!(ids(&rows(&cx).await), (0..40).collect::<Vec<_>>(), "the new base restores");
    cx.ok("INSERT INTO t VALUES (100, 'later')").await;
    let later = bookmark(&cx).await;
    restore(&cx, marks[0]).await.unwrap();
    restore(&cx, later).await.unwrap();
    assert_eq!(ids(&rows(&cx).await).last(), Some(&100), "history goes on after the damage");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_at_rest_after_a_clean_close_is_found_by_the_check_and_by_a_restore_across_it() {
    let (cx, marks) = commits_in_one_segment(20).await;
    damage_open_segment(&cx, |len| len * 2 / 3);

    // The open trusts what the clean close noted: nothing is cut, no new base is taken.
    assert_eq!(ids(&rows(&cx).await), (0..20).collect::<Vec<_>>());
    assert_eq!(bookmark(&cx).await, *marks.last().unwrap());
    cx.registry.close("db").await;
    let found = kura_sqlite::verify_history(&cx.dir.path().join("db/db.sqlite")).unwrap_err().to_string();
    assert!(found.contains("fails its checksum"), "kura check finds it: {found}");
    // A restore that reads the damaged record refuses; one before it restores.
    let refused = restore(&cx, *marks.last().unwrap()).await.unwrap_err();
    assert!(matches!(refused, Error::HistoryDamaged { .. }), "{refused}");
    restore(&cx, marks[0]).await.unwrap();
    assert_eq!(ids(&rows(&cx).await), [0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kura_check_calls_a_bad_last_record_damage_when_a_clean_close_noted_it() {
    let (cx, _) = commits_in_one_segment(5).await;
    damage_open_segment(&cx, |len| len - 1);
    let db_path = cx.dir.path().join("db/db.sqlite");
    let found = kura_sqlite::verify_history(&db_path).unwrap_err().to_string();
    assert!(found.contains("fails its checksum"), "a noted record cannot be a torn append: {found}");
    // Without the note (a crash, not a close) the same bytes may be a torn append.
    forget_clean_close(&cx);
    let check = kura_sqlite::verify_history(&db_path).unwrap().unwrap();
    assert!(check.torn_tail_bytes > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_base_decided_before_a_crash_is_taken_on_the_next_open() {
    let cx = Context::with_history(small());
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'a')").await;
    let b1 = bookmark(&cx).await;
    cx.ok("INSERT INTO t VALUES (2, 'b')").await;
    let b2 = bookmark(&cx).await;
    cx.registry.close("db").await;
    // As if recovery had cut damage out of the log and died before taking the new base.
    let base = b2.seq + 1000;
    std::fs::write(cx.dir.path().join("db/log/rebase.pending"), format!("{base:016x}\n")).unwrap();

    assert_eq!(ids(&rows(&cx).await), [1, 2]);
    assert_eq!(bookmark(&cx).await.seq, base, "the new base takes the position decided before the crash");
    assert!(!cx.dir.path().join("db/log/rebase.pending").exists());
    cx.ok("INSERT INTO t VALUES (3, 'c')").await;
    restore(&cx, b1).await.unwrap();
    assert_eq!(ids(&rows(&cx).await), [1], "history before the base still restores");
    cx.registry.close("db").await;
    assert_eq!(ids(&rows(&cx).await), [1], "and reopening does not take the base again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_restore_entry_is_damage_not_a_torn_append() {
    let cx = Context::with_history(small());
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'a')").await;
    let b1 = bookmark(&cx).await;
    cx.ok("INSERT INTO t VALUES (2, 'b')").await;
    let restored = restore(&cx, b1).await.unwrap();
    cx.registry.close("db").await;
    // The restore finished; then its entry, the log's last record, rots (in a log a crash
    // left: see the test above).
    forget_clean_close(&cx);
    let open = log_files(&cx, ".open").pop().unwrap();
    let mut bytes = std::fs::read(&open).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&open, bytes).unwrap();

    assert_eq!(ids(&rows(&cx).await), [1], "the restored file stays");
    assert!(bookmark(&cx).await.seq > restored.bookmark.seq, "the restore's position is not reused");
    assert_eq!(log_files(&cx, ".damaged").len(), 1);
    cx.ok("INSERT INTO t VALUES (3, 'c')").await;
    let later = bookmark(&cx).await;
    restore(&cx, restored.previous).await.unwrap();
    assert_eq!(ids(&rows(&cx).await), [1, 2], "the state before the restore still restores");
    restore(&cx, later).await.unwrap();
    assert_eq!(ids(&rows(&cx).await), [1, 3]);
}

/// A small deterministic generator, so a failure can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_recorded_bookmark_restores_exactly() {
    for seed in [0x9e37_79b9_7f4a_7c15u64, 0x1234_5678_9abc_def1] {
        let cx = Context::with_history(small());
        let mut rng = Rng(seed);
        cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); CREATE INDEX t_v ON t(v)").await;
        let mut recorded: Vec<(Bookmark, Vec<Vec<Value>>)> = Vec::new();
        for step in 0..160 {
            match rng.below(20) {
                0 => checkpoint(&cx).await,
                1 if recorded.len() > 2 => {
                    let (b, _) = recorded[rng.below(recorded.len() as u64) as usize].clone();
                    restore(&cx, b).await.unwrap_or_else(|e| panic!("seed {seed:#x} step {step}: {e}"));
                }
                2 => cx.registry.close("db").await,
                3..=5 => {
                    let id = rng.below(40);
                    cx.ok(&format!("DELETE FROM t WHERE id = {id}")).await;
                }
                6..=9 => {
                    let (id, len) = (rng.below(40), rng.below(3000));
                    cx.ok(&format!("UPDATE t SET v = '{}' WHERE id = {id}", "u".repeat(len as usize))).await;
                }
                _ => {
                    let (id, len) = (rng.below(40), rng.below(5000));
                    cx.ok(&format!("INSERT OR REPLACE INTO t VALUES ({id}, '{}{step}')", "i".repeat(len as usize)))
                        .await;
                }
            }
            recorded.push((bookmark(&cx).await, rows(&cx).await));
        }
        for (i, (b, expected)) in recorded.iter().enumerate().rev().step_by(3) {
            restore(&cx, *b).await.unwrap_or_else(|e| panic!("seed {seed:#x} bookmark #{i} {b}: {e}"));
            assert!(rows(&cx).await == *expected, "seed {seed:#x}: bookmark #{i} {b} restored a different state");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_interrupted_before_its_swap_is_finished_on_open() {
    let cx = Context::with_history(small());
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'a')").await;
    let b1 = bookmark(&cx).await;
    cx.ok("INSERT INTO t VALUES (2, 'b'), (3, 'c')").await;
    cx.registry.close("db").await;
    let dir = cx.dir.path().join("db");
    let saved: Vec<(PathBuf, Vec<u8>)> = ["db.sqlite", "db.sqlite-wal"]
        .iter()
        .filter_map(|n| std::fs::read(dir.join(n)).ok().map(|b| (dir.join(n), b)))
        .collect();
    let restored = restore(&cx, b1).await.unwrap();
    cx.registry.close("db").await;
    // As if the server had died after recording the restore but before replacing the file.
    let _ = std::fs::remove_file(dir.join("db.sqlite-wal"));
    for (path, bytes) in &saved {
        std::fs::write(path, bytes).unwrap();
    }
    std::fs::write(dir.join("log/restore.pending"), format!("{:016x}\n", restored.bookmark.seq)).unwrap();
    assert_eq!(ids(&rows(&cx).await), [1], "opening finished the restore");
    assert_eq!(bookmark(&cx).await, restored.bookmark);
    cx.ok("INSERT INTO t VALUES (4, 'd')").await;
    cx.registry.close("db").await;
    assert_eq!(ids(&rows(&cx).await), [1, 4], "and writes after it are not undone by a later open");
}

/// Another node takes a database over from its log alone (snapshots and segments, as fetched
/// from shared storage): the file it builds holds the last state, every earlier bookmark still
/// restores, and new commits continue the positions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_is_materialized_from_its_log_alone() {
    let first = Context::with_history(small());
    first.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)").await;
    let mut marks = Vec::new();
    for i in 1..=40 {
        first.run_params("INSERT INTO t VALUES (?1, hex(randomblob(600)))", vec![Value::Integer(i)]).await.unwrap();
        if i % 10 == 0 {
            marks.push((bookmark(&first).await, i));
        }
    }
    restore(&first, marks[1].0).await.unwrap();
    first.ok("INSERT INTO t VALUES (100, 'after the restore')").await;
    let last = bookmark(&first).await;
    let expected = rows(&first).await;
    first.registry.close("db").await;
    assert!(log_files(&first, ".seg").len() > 1, "the history spans several segments");

    let second = Context::with_history(small());
    copy_log(&first, &second);
    let db = second.dir.path().join("db/db.sqlite");
    assert_eq!(kura_sqlite::materialize(&db).unwrap(), Some(last.seq));
    assert!(kura_sqlite::materialize(&db).is_err(), "an existing file is never replaced");

    assert_eq!(rows(&second).await, expected);
    assert_eq!(bookmark(&second).await, last);
    for (mark, count) in &marks {
        restore(&second, *mark).await.unwrap();
        assert_eq!(ids(&rows(&second).await), (1..=*count).collect::<Vec<_>>());
    }
    second.ok("INSERT INTO t VALUES (200, 'on the new node')").await;
    assert!(bookmark(&second).await.seq > last.seq + marks.len() as u64);
    let continued = bookmark(&second).await;
    second.registry.close("db").await;
    assert_eq!(ids(&rows(&second).await).last(), Some(&200), "reopened as after a clean close");
    assert_eq!(bookmark(&second).await, continued);
    restore(&second, last).await.unwrap();
    assert_eq!(rows(&second).await, expected, "the last state the first node served restores too");
    let third = tempfile::tempdir().unwrap();
    assert_eq!(kura_sqlite::materialize(&third.path().join("db.sqlite")).unwrap(), None, "no log, nothing to build");
}

/// A shipper that can be told to refuse, recording how much of the log it was shown.
#[derive(Debug, Default)]
struct Refusing {
    refuse: std::sync::atomic::AtomicBool,
    shipped: std::sync::Mutex<u64>,
}

impl kura_sqlite::LogShipper for Refusing {
    fn ship(&self, log: &kura_sqlite::LogView) -> Result<(), kura_sqlite::ShipError> {
        if self.refuse.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(kura_sqlite::ShipError::new("the store is away"));
        }
        *self.shipped.lock().unwrap() = log.segments.iter().map(|s| s.len).sum();
        Ok(())
    }
}

/// With a shipper, a commit is answered only once shipped; after a failed shipment nothing is
/// served until what the log holds has shipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_unshipped_is_served() {
    let shipper = Arc::new(Refusing::default());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db/db.sqlite");
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    let for_opener = shipper.clone();
    let registry = Registry::new(RegistrySettings::default(), move |_| {
        Some(DatabaseOptions::new(&db).create(true).history(small(), "db").shipper(for_opener.clone()))
    });
    let run = |sql: &'static str| registry.execute("db", Request::new(vec![Statement::new(sql)]));
    run("CREATE TABLE t (id INTEGER PRIMARY KEY)").await.unwrap();
    run("INSERT INTO t VALUES (1)").await.unwrap();
    let before = *shipper.shipped.lock().unwrap();

    shipper.refuse.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(run("INSERT INTO t VALUES (2)").await.is_err(), "an unshipped commit is not acknowledged");
    assert!(run("SELECT count(*) FROM t").await.is_err(), "nor is anything served while it cannot ship");
    assert_eq!(*shipper.shipped.lock().unwrap(), before);

    shipper.refuse.store(false, std::sync::atomic::Ordering::SeqCst);
    let count = run("SELECT count(*) FROM t").await.unwrap();
    assert!(*shipper.shipped.lock().unwrap() > before, "the log was shipped before the read was served");
    // The refused commit was in the WAL: it is shipped now, and so it shows.
    assert_eq!(count[0].rows[0][0], Value::Integer(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeline_lists_commits_and_restores_newest_first_across_segments() {
    let cx = Context::with_history(small());
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)").await;
    let mut commits = vec![bookmark(&cx).await];
    // Enough commits of 1 KiB (random: packed commits shrink what repeats) to seal several
    // 24 KiB segments.
    for i in 0..60 {
        cx.ok(&format!("INSERT INTO t VALUES ({i}, hex(randomblob(500)))")).await;
        commits.push(bookmark(&cx).await);
    }
    assert!(log_files(&cx, ".seg").len() > 1, "the log has sealed segments");
    let restored = restore(&cx, commits[10]).await.unwrap();
    let timeline = |limit: usize, before: Option<Bookmark>| {
        cx.registry.with_database("db", move |db| db.timeline(limit, before.as_ref()))
    };

    let newest = timeline(5, None).await.unwrap().unwrap();
    assert_eq!(newest.len(), 5);
    assert_eq!(newest[0].bookmark, restored.bookmark);
    assert!(newest[0].restore, "the restore is the newest entry, marked as one");
    let listed: Vec<Bookmark> = newest[1..].iter().map(|m| m.bookmark).collect();
    assert_eq!(listed, [commits[60], commits[59], commits[58], commits[57]]);
    assert!(newest[1..].iter().all(|m| !m.restore));
    assert!(newest.windows(2).all(|w| w[0].time_ms >= w[1].time_ms));

    // Paging back with `before` meets every commit once, to the first.
    let mut all = Vec::new();
    let mut before = None;
    loop {
        let page = timeline(7, before).await.unwrap().unwrap();
        if page.is_empty() {
            break;
        }
        before = page.last().map(|m| m.bookmark);
        all.extend(page.into_iter().map(|m| m.bookmark));
    }
    let mut expected: Vec<Bookmark> = commits.iter().rev().copied().collect();
    expected.insert(0, restored.bookmark);
    // Anything older than the first bookmark taken (the file's creation) may follow.
    assert_eq!(&all[..expected.len()], &expected[..]);
}

/// A lone write is answered before the history captures it, with the bookmark its commit
/// takes; the capture follows on its own, with no other request, and the answer's bookmark
/// is then the database's and restores exactly that write's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_write_answered_first_is_captured_after_without_another_request() {
    let cx = Context::with_history(HistorySettings::default());
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)").await;
    // A registry counts as serving several clients for a moment after it starts.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut answered = Vec::new();
    for id in 0..3 {
        answered.push(write_answered(&cx, &format!("INSERT INTO t VALUES ({id}, 'v')")).await);
    }
    assert!(answered.windows(2).all(|w| w[1].seq == w[0].seq + 1), "{answered:?}");
    // Read off the files: a read through the database would capture what is owed itself.
    let db_path = cx.dir.path().join("db/db.sqlite");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while kura_sqlite::verify_history(&db_path).unwrap().unwrap().last_seq != Some(answered[2].seq) {
        assert!(std::time::Instant::now() < deadline, "the last write was never captured");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(bookmark(&cx).await, answered[2]);
    restore(&cx, answered[1]).await.unwrap();
    assert_eq!(ids(&rows(&cx).await), [0, 1]);
}

/// Commits that need no shipping are captured in batches after their answer: a few lone writes
/// are not in the log at first, are there within about a second with no other request (the
/// registry's own thread captures them), and `capture_histories` writes what is owed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_are_captured_in_batches_within_about_a_second() {
    let cx = Context::with_history(HistorySettings::default());
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)").await;
    let db_path = cx.dir.path().join("db/db.sqlite");
    let logged = || kura_sqlite::verify_history(&db_path).unwrap().unwrap().last_seq;
    cx.registry.capture_histories().await;
    let created = logged().expect("the table's commit is in the log");
    let write = async |id: i64| write_answered(&cx, &format!("INSERT INTO t VALUES ({id}, 'v')")).await;
    let sent = std::time::Instant::now();
    let mut answered = Vec::new();
    for id in 0..3 {
        answered.push(write(id).await);
    }
    assert_eq!(answered.iter().map(|b| b.seq).collect::<Vec<_>>(), [created + 1, created + 2, created + 3]);
    let logged_at_first = logged();
    if sent.elapsed() < Duration::from_millis(500) {
        assert_eq!(logged_at_first, Some(created), "captured before a batch was due");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while logged() != Some(created + 3) {
        assert!(std::time::Instant::now() < deadline, "owed commits were never captured");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(sent.elapsed() >= Duration::from_millis(900), "captured {:?} after the first answer", sent.elapsed());

    let more = [write(3).await, write(4).await];
    cx.registry.capture_histories().await;
    assert_eq!(logged(), Some(more[1].seq), "capture_histories left commits owed");
    for (i, b) in answered.iter().chain(&more).enumerate() {
        restore(&cx, *b).await.unwrap();
        assert_eq!(ids(&rows(&cx).await), (0..=i as i64).collect::<Vec<_>>());
    }
}

/// Commits captured together go to the log in runs that end where a segment is full: forty
/// writes of 3,000 bytes with 24 KiB segments (a batch of 32 captured once due, the rest on
/// request) leave several sealed segments, and every bookmark restores exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_commits_spans_segments_and_every_bookmark_restores() {
    let cx = Context::with_history(HistorySettings { checkpoint_frames: 1_000_000, ..small() });
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)").await;
    let mut marks = Vec::new();
    for id in 0..40 {
        marks.push(write_answered(&cx, &format!("INSERT INTO t VALUES ({id}, randomblob(3000))")).await);
    }
    cx.registry.capture_histories().await;
    let checked = kura_sqlite::verify_history(&cx.dir.path().join("db/db.sqlite")).unwrap().unwrap();
    assert_eq!(checked.last_seq, Some(marks[39].seq), "every commit is in the log");
    assert_eq!(checked.torn_tail_bytes, 0);
    let sealed = log_files(&cx, ".seg");
    assert!(sealed.len() >= 3, "40 records of 3 KB in 24 KiB segments: {sealed:?}");
    for (i, b) in marks.iter().enumerate().rev() {
        restore(&cx, *b).await.unwrap();
        assert_eq!(ids(&rows(&cx).await), (0..=i as i64).collect::<Vec<_>>(), "bookmark {b}");
    }
}

/// Lone writes (each answered before its capture, on the caller's thread) that take the WAL
/// past the history's checkpoint mark: the mark makes their capture due, and the actor
/// checkpoints after it, with no other request, so the database file comes to hold what they
/// wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lone_writes_past_the_checkpoint_mark_are_checkpointed_without_another_request() {
    let cx = Context::with_history(HistorySettings { checkpoint_frames: 6, ..HistorySettings::default() });
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)").await;
    // A registry counts as serving several clients for a moment after it starts.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let db_path = cx.dir.path().join("db/db.sqlite");
    let before = std::fs::metadata(&db_path).unwrap().len();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut answered = None;
    for id in 0..8 {
        answered = Some(write_answered(&cx, &format!("INSERT INTO t VALUES ({id}, zeroblob(3000))")).await);
    }
    let last = answered.unwrap();
    while kura_sqlite::verify_history(&db_path).unwrap().unwrap().last_seq != Some(last.seq) {
        assert!(std::time::Instant::now() < deadline, "the last write was never captured");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Eight rows of 3,000 bytes need at least five more pages of 4 KiB in the file itself.
    while std::fs::metadata(&db_path).unwrap().len() < before + 5 * 4096 {
        assert!(std::time::Instant::now() < deadline, "the WAL was never checkpointed into the file");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ids(&rows(&cx).await), (0..8).collect::<Vec<_>>());
}

/// Waits (up to two seconds) for the WAL at `path` to reach `len` bytes: a lone write's
/// capture, which writes ahead, runs just after its answer.
async fn wal_reaches(path: &std::path::Path, len: u64) -> u64 {
    let mut now = 0;
    for _ in 0..200 {
        now = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        if now >= len {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    now
}

/// A growing WAL has zeros written past its last frame, so its commits overwrite blocks the
/// file already has; a clean close cuts them off, and a WAL a crash left with them opens with
/// every commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growing_wal_is_written_ahead_and_cut_at_a_clean_close() {
    let cx = Context::with_history(HistorySettings::default());
    let wal = cx.dir.path().join("db/db.sqlite-wal");
    cx.ok("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)").await;
    // A few commits first: a WAL of fewer frames than a handful of commits is left alone.
    cx.ok("INSERT INTO t VALUES (1, 'one')").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let young = std::fs::metadata(&wal).unwrap().len();
    assert!(young < 64 * 1024, "a young WAL was written ahead: {young} bytes");
    // One frame each: past 16 frames, and still few enough (24) that a clean close keeps the WAL.
    for i in 2..=18 {
        cx.ok(&format!("INSERT INTO t VALUES ({i}, '{i}')")).await;
    }
    let ahead = wal_reaches(&wal, 128 * 1024).await;
    assert!(ahead >= 128 * 1024, "nothing was written ahead: the WAL is {ahead} bytes");
    cx.registry.close("db").await;
    let closed = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    assert!(closed < 128 * 1024, "a clean close left {closed} bytes of WAL");
    assert_eq!(ids(&rows(&cx).await), (1..=18).collect::<Vec<_>>());

    for i in 19..=40 {
        cx.ok(&format!("INSERT INTO t VALUES ({i}, '{i}')")).await;
    }
    assert!(wal_reaches(&wal, 128 * 1024).await >= 128 * 1024);
    // The files as a crash would leave them, the WAL's zeros included, opened elsewhere.
    let crashed = tempfile::tempdir().unwrap();
    let copy = |from: &std::path::Path, to: &std::path::Path| {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_file() {
                std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
            }
        }
    };
    copy(&cx.dir.path().join("db"), crashed.path());
    copy(&cx.dir.path().join("db/log"), &crashed.path().join("log"));
    let options = DatabaseOptions::new(crashed.path().join("db.sqlite")).history(HistorySettings::default(), "db");
    let mut db = kura_sqlite::Database::open(&options).unwrap();
    let read = db.execute(&Request::new(vec![Statement::new("SELECT id FROM t ORDER BY id")])).unwrap();
    assert_eq!(ids(&read[0].rows), (1..=40).collect::<Vec<_>>());
}
