//! The physical limit: the benchmark's statements on one in-process SQLite connection, in WAL
//! mode with `synchronous=FULL`, as durable as kura, with nothing in between.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::load::Stats;

/// A connection to `path` as a stock SQLite build gives it. The workspace builds SQLite with
/// scan counters (for D1's `rows_read`), which SQLite turns on for every connection, and which
/// then read the CPU's timestamp counter twice per instruction; kura turns them on only for
/// what it counts, and the limit does without.
pub fn connect(path: &Path) -> anyhow::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_STMT_SCANSTATUS, false)?;
    Ok(conn)
}

/// A file-backed database shaped like the benchmark's, prefilled with `rows` rows.
pub fn open(dir: &Path, rows: i64) -> anyhow::Result<Connection> {
    let conn = connect(&dir.join("limit.sqlite"))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch("CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT, version INTEGER NOT NULL DEFAULT 0)")?;
    conn.execute_batch("BEGIN")?;
    {
        let mut insert = conn.prepare("INSERT INTO kv (id, v) VALUES (?1, ?2)")?;
        for i in 0..rows {
            insert.execute((i, format!("value-{i}")))?;
        }
    }
    conn.execute_batch("COMMIT")?;
    Ok(conn)
}

fn timed(duration: Duration, mut op: impl FnMut(u64) -> anyhow::Result<u64>) -> anyhow::Result<Stats> {
    let start = Instant::now();
    let mut latencies = Vec::new();
    let mut units = 0;
    let mut n = 0;
    while start.elapsed() < duration {
        let began = Instant::now();
        units += op(n)?;
        latencies.push(began.elapsed());
        n += 1;
    }
    Ok(Stats::from_latencies(latencies, units, start.elapsed()))
}

/// Point SELECTs by primary key.
pub fn point_select(conn: &Connection, rows: i64, duration: Duration) -> anyhow::Result<Stats> {
    let mut select = conn.prepare("SELECT * FROM kv WHERE id = ?1")?;
    timed(duration, |n| {
        let id = (n as i64 * 7919) % rows;
        let mut found = select.query([id])?;
        let _ = found.next()?;
        Ok(1)
    })
}

/// Single-row INSERTs, each its own durable commit.
pub fn insert(conn: &Connection, first_id: i64, duration: Duration) -> anyhow::Result<Stats> {
    let mut insert = conn.prepare("INSERT INTO kv (id, v) VALUES (?1, ?2)")?;
    timed(duration, |n| {
        insert.execute((first_id + n as i64, "w"))?;
        Ok(1)
    })
}

/// Single-row durable INSERTs as [`insert`] makes them, each after `pause` of the CPU kept busy
/// (so the pause costs no wake-up): on a disk whose flush is slower after a pause, the time a
/// server spends between two commits costs more than itself.
pub fn insert_after_pause(conn: &Connection, pause: Duration, duration: Duration) -> anyhow::Result<CommitsAfterPause> {
    // SQLite picks each id (the largest so far, plus one): no range to collide with the other
    // loads' on the same table, however long they ran.
    let mut insert = conn.prepare("INSERT INTO kv (v) VALUES (?1)")?;
    let start = Instant::now();
    let mut latencies = Vec::new();
    while start.elapsed() < duration {
        busy_for(pause);
        let began = Instant::now();
        insert.execute(["p"])?;
        latencies.push(began.elapsed());
    }
    latencies.sort_unstable();
    let n = latencies.len().max(1);
    Ok(CommitsAfterPause {
        mean: latencies.iter().sum::<Duration>() / n as u32,
        p90: latencies.get(n * 9 / 10).copied().unwrap_or_default(),
    })
}

/// Keeps this thread's CPU busy for `pause`, as work would: a sleep would let the vCPU idle.
pub fn busy_for(pause: Duration) {
    let paused = Instant::now();
    while paused.elapsed() < pause {
        std::hint::spin_loop();
    }
}

/// What [`insert_after_pause`] measured: the commits' own time, the pauses left out.
pub struct CommitsAfterPause {
    pub mean: Duration,
    pub p90: Duration,
}

/// 100-row INSERT transactions, one durable commit each.
pub fn batch(conn: &Connection, first_id: i64, duration: Duration) -> anyhow::Result<Stats> {
    let mut insert = conn.prepare("INSERT INTO kv (id, v) VALUES (?1, ?2)")?;
    timed(duration, |n| {
        conn.execute_batch("BEGIN")?;
        for j in 0..100 {
            insert.execute((first_id + n as i64 * 100 + j, "b"))?;
        }
        conn.execute_batch("COMMIT")?;
        Ok(100)
    })
}
