//! The Time Travel suite: what restoring costs beside copying the database file once, and how
//! much log a small transaction leaves behind. (The log's cost on durable INSERTs over HTTP is
//! in the D1 suite, measured against the same server with capture switched off.)

use std::time::{Duration, Instant};

use kura_sqlite::{Database, DatabaseOptions, HistorySettings, Request, Statement, Value};

use crate::Settings;

fn history(snapshot_log_bytes: u64, snapshot_age: Duration) -> HistorySettings {
    HistorySettings { snapshot_log_bytes, snapshot_age, ..HistorySettings::default() }
}

const NEVER: Duration = Duration::from_secs(365 * 86_400);

fn open_with(path: &std::path::Path, settings: HistorySettings) -> anyhow::Result<Database> {
    Ok(Database::open(&DatabaseOptions::new(path).create(true).history(settings, "bench"))?)
}

fn open(path: &std::path::Path, snapshot_log_bytes: u64) -> anyhow::Result<Database> {
    open_with(path, history(snapshot_log_bytes, NEVER))
}

fn run(db: &mut Database, sql: &str, params: Vec<Value>) -> anyhow::Result<()> {
    db.execute_alone(&Request::new(vec![Statement::with_params(sql, params)]))?;
    Ok(())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

pub fn run_suite(settings: &Settings, gib: f64, transactions: u64) -> anyhow::Result<()> {
    let scratch = settings.scratch_dir()?;
    let dir = scratch.path().join("db");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("db.sqlite");
    let rows = (gib * 1024.0 * 1024.0 * 1024.0 / 4096.0) as i64;

    eprintln!("filling a {gib} GiB database ({rows} rows of 4 KiB)…");
    let started = Instant::now();
    {
        // Every checkpoint snapshots here, so the fill ends with a snapshot of the full database.
        let mut db = open(&path, 0)?;
        run(&mut db, "CREATE TABLE blobs (id INTEGER PRIMARY KEY, body BLOB)", vec![])?;
        let per_txn = 2_000;
        for first in (0..rows).step_by(per_txn) {
            let last = (first + per_txn as i64).min(rows);
            run(
                &mut db,
                "INSERT INTO blobs SELECT value, randomblob(4000) FROM generate_series(?1, ?2)",
                vec![Value::Integer(first), Value::Integer(last - 1)],
            )
            .or_else(|_| fill_slowly(&mut db, first, last))?;
        }
        db.checkpoint()?;
    }
    let fill = started.elapsed();
    {
        // One more commit and a checkpoint that must snapshot: the history's last snapshot is
        // now the full database, and only the small transactions below come after it.
        let mut db = open_with(&path, history(u64::MAX, Duration::ZERO))?;
        run(&mut db, "UPDATE blobs SET body = zeroblob(40) WHERE id = 0", vec![])?;
        db.checkpoint()?;
    }
    let db_bytes = std::fs::metadata(&path)?.len();

    eprintln!("running {transactions} small transactions after the last snapshot…");
    let mut db = open(&path, u64::MAX)?;
    let history_before = db.history_bytes();
    let started = Instant::now();
    for i in 0..transactions {
        let id = (i as i64 * 7919) % rows;
        run(&mut db, "UPDATE blobs SET body = zeroblob(40) WHERE id = ?1", vec![Value::Integer(id)])?;
    }
    let small = started.elapsed();
    db.checkpoint()?;
    let per_txn = (db.history_bytes() - history_before) as f64 / transactions as f64;
    let target = db.bookmark()?;

    eprintln!("restoring…");
    let started = Instant::now();
    let restored = db.restore(&target)?;
    let restore = started.elapsed();
    drop(db);

    let copy_dir = scratch.path().join("copy");
    std::fs::create_dir_all(&copy_dir)?;
    let copy_to = copy_dir.join("db.sqlite");
    let started = Instant::now();
    std::fs::copy(&path, &copy_to)?;
    std::fs::File::open(&copy_to)?.sync_all()?;
    let copy = started.elapsed();

    // A file without history opens with a snapshot of every page, read through SQLite.
    let started = Instant::now();
    drop(open(&copy_to, u64::MAX)?);
    let snapshot = started.elapsed();

    println!();
    println!("Time Travel: restore and log space (in-process, WAL + synchronous=FULL, history on)");
    println!("database: {:.0} MiB, filled in {:.1} s", mib(db_bytes), fill.as_secs_f64());
    println!(
        "{transactions} single-row transactions after the last snapshot: {:.0}/s, {per_txn:.0} log bytes per committed row",
        transactions as f64 / small.as_secs_f64()
    );
    println!(
        "restore to the newest bookmark (snapshot + {transactions} records): {:.2} s; copying the file once: {:.2} s; ratio {:.2}×",
        restore.as_secs_f64(),
        copy.as_secs_f64(),
        restore.as_secs_f64() / copy.as_secs_f64()
    );
    println!(
        "snapshot of the whole database (first open with history): {:.2} s; ratio to the copy {:.2}×",
        snapshot.as_secs_f64(),
        snapshot.as_secs_f64() / copy.as_secs_f64()
    );
    println!("restored to {} (undo point {})", restored.bookmark, restored.previous);
    Ok(())
}

/// Without `generate_series`, one row per statement in one transaction.
fn fill_slowly(db: &mut Database, first: i64, last: i64) -> anyhow::Result<()> {
    let statements = (first..last)
        .map(|id| Statement::with_params("INSERT INTO blobs VALUES (?1, randomblob(4000))", vec![Value::Integer(id)]))
        .collect();
    db.execute_alone(&Request::new(statements))?;
    Ok(())
}
