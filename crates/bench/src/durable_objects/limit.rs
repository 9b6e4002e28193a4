//! The physical limit the suite measures against: the same statements on one SQLite file per
//! object, as durable, with no engine in between.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::{CREATE, OBJECTS, READ, WRITE};

/// A turn's end, and where its thread answers the latencies of the requests it ran.
pub(super) type LimitTurn = (Instant, std::sync::mpsc::Sender<anyhow::Result<Vec<Duration>>>);

/// One object file for the limit, as kura keeps it: WAL, `synchronous=FULL`.
pub(super) fn limit_open(dir: &Path, object: u64) -> anyhow::Result<rusqlite::Connection> {
    let conn = crate::limit::connect(&dir.join(format!("{object}.sqlite")))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(CREATE)?;
    Ok(conn)
}

/// One request on the limit's side: the same statements in one durable transaction.
pub(super) fn limit_request(conn: &rusqlite::Connection, user: &str) -> anyhow::Result<()> {
    conn.execute_batch("BEGIN")?;
    conn.prepare_cached(WRITE)?.execute([user])?;
    let count: i64 = conn.prepare_cached(READ)?.query_row([], |r| r.get(0))?;
    anyhow::ensure!(count > 0);
    conn.execute_batch("COMMIT")?;
    Ok(())
}

/// The physical limit, run in turns with kura: `clients` threads, each owning its share of the
/// object files with a connection open on each, running the workload's requests back to back
/// whenever it is given a turn. The files are opened once, so a turn measures requests only.
pub(super) struct LimitLoad {
    pub(super) turns: Vec<std::sync::mpsc::Sender<LimitTurn>>,
    pub(super) threads: Vec<std::thread::JoinHandle<()>>,
}

impl LimitLoad {
    /// Opens (creating) the files in `dir` and waits until every thread has its connections.
    pub(super) fn open(dir: &Path, clients: usize) -> anyhow::Result<Arc<LimitLoad>> {
        // Every load's users are new to the files (which later loads open again): a user
        // already there would make its INSERT OR IGNORE write nothing, and its commit no fsync.
        static LOADS: AtomicU64 = AtomicU64::new(0);
        let generation = LOADS.fetch_add(1, Ordering::Relaxed);
        std::fs::create_dir_all(dir)?;
        let (opened, all_opened) = std::sync::mpsc::channel();
        let mut load = LimitLoad { turns: Vec::new(), threads: Vec::new() };
        for client in 0..clients {
            let (turns, turn) = std::sync::mpsc::channel::<LimitTurn>();
            let (dir, opened) = (dir.to_owned(), opened.clone());
            load.turns.push(turns);
            load.threads.push(std::thread::spawn(move || {
                let mine: Vec<u64> = (0..OBJECTS).filter(|o| *o as usize % clients == client).collect();
                let conns = match mine.iter().map(|o| limit_open(&dir, *o)).collect::<anyhow::Result<Vec<_>>>() {
                    Ok(conns) => conns,
                    Err(e) => return drop(opened.send(Err(e))),
                };
                let _ = opened.send(Ok(()));
                let mut n = 0usize;
                while let Ok((deadline, answer)) = turn.recv() {
                    let mut latencies = Vec::new();
                    let ran = (|| {
                        while Instant::now() < deadline {
                            let began = Instant::now();
                            limit_request(&conns[(n * 7_919) % conns.len()], &format!("l{generation}-{client}-{n}"))?;
                            latencies.push(began.elapsed());
                            n += 1;
                        }
                        Ok(())
                    })();
                    let _ = answer.send(ran.map(|()| latencies));
                }
            }));
        }
        // Only the threads hold senders now: one that dies before it reports ends the wait.
        drop(opened);
        for _ in 0..clients {
            all_opened.recv().context("a limit thread ended while opening its files")??;
        }
        Ok(Arc::new(load))
    }

    /// Every thread's requests for `slice`, as [`load::run_timed`] answers a load's.
    pub(super) fn turn(&self, slice: Duration) -> anyhow::Result<(Vec<Duration>, u64, Duration)> {
        let started = Instant::now();
        let (answer, answers) = std::sync::mpsc::channel();
        for turns in &self.turns {
            turns.send((started + slice, answer.clone())).context("a limit thread ended")?;
        }
        drop(answer);
        let mut all = Vec::new();
        for _ in 0..self.turns.len() {
            all.extend(answers.recv().context("a limit thread ended during its turn")??);
        }
        let units = all.len() as u64;
        Ok((all, units, started.elapsed()))
    }

    /// A turn run from async code, on a blocking thread.
    pub(super) async fn take_turn(self: &Arc<Self>, slice: Duration) -> (Vec<Duration>, u64, Duration) {
        let load = Arc::clone(self);
        tokio::task::spawn_blocking(move || load.turn(slice)).await.expect("limit turn").expect("limit requests")
    }
}

impl Drop for LimitLoad {
    fn drop(&mut self) {
        self.turns.clear();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A limit connection configured as kura configures an object's: WAL, exclusive locking, no
/// lookaside, the compact cache.
pub(super) fn limit_open_compact(dir: &Path, object: u64) -> anyhow::Result<rusqlite::Connection> {
    let conn = crate::limit::connect(&dir.join(format!("{object}.sqlite")))?;
    conn.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
    kura_sqlite::make_compact(&conn)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(CREATE)?;
    Ok(conn)
}
