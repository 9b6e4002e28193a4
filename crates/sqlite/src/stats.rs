//! What a registry's databases did, for an operator's metrics: commits, how many requests
//! each group commit carried, how long each commit took (COMMIT's fsync, capturing it into the
//! history, shipping it), and per database its commits and history bytes. Counted with atomics
//! on the commit path; read whenever the metrics are scraped.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A histogram of fixed buckets, counted with atomics.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One per bound, then one for what lies past the last.
    buckets: Vec<AtomicU64>,
    /// Sum of the observations, in millionths.
    sum_micros: AtomicU64,
}

/// A histogram as read: cumulative counts per upper bound, the total and the sum.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// `(upper bound, observations at or below it)`, the last bound infinite.
    pub buckets: Vec<(f64, u64)>,
    /// How many observations.
    pub count: u64,
    /// Their sum.
    pub sum: f64,
}

impl Histogram {
    /// A histogram with these upper bounds (increasing).
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    /// Counts one observation.
    pub fn observe(&self, value: f64) {
        let index = self.bounds.iter().position(|b| value <= *b).unwrap_or(self.bounds.len());
        self.buckets[index].fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add((value.max(0.0) * 1e6) as u64, Ordering::Relaxed);
    }

    /// The histogram as it stands.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut total = 0;
        let mut buckets = Vec::with_capacity(self.buckets.len());
        for (i, bucket) in self.buckets.iter().enumerate() {
            total += bucket.load(Ordering::Relaxed);
            buckets.push((self.bounds.get(i).copied().unwrap_or(f64::INFINITY), total));
        }
        HistogramSnapshot { buckets, count: total, sum: self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6 }
    }
}

/// Seconds a commit may take, from a page cache's fsync to a replicated shipment.
const COMMIT_SECONDS: &[f64] = &[0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
/// Requests one group commit may carry.
const GROUP_SIZES: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// One database's figures, kept while the process runs (across closing and reopening it).
#[derive(Debug, Default)]
pub struct DatabaseFigures {
    /// Transactions committed.
    pub commits: AtomicU64,
    /// Bytes its history log and snapshots took when last measured (at open and at each
    /// checkpoint).
    pub history_bytes: AtomicU64,
}

/// A registry's figures.
#[derive(Debug)]
pub struct Stats {
    /// Transactions committed.
    pub commits: AtomicU64,
    /// Commits that failed (their requests got an error).
    pub failed_commits: AtomicU64,
    /// Requests per group commit.
    pub group_sizes: Histogram,
    /// Seconds from COMMIT to the end of its history capture and shipment.
    pub commit_seconds: Histogram,
    databases: Mutex<BTreeMap<String, Arc<DatabaseFigures>>>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            commits: AtomicU64::new(0),
            failed_commits: AtomicU64::new(0),
            group_sizes: Histogram::new(GROUP_SIZES),
            commit_seconds: Histogram::new(COMMIT_SECONDS),
            databases: Mutex::default(),
        }
    }
}

impl Stats {
    /// The figures of the database `key`, made on first use.
    pub(crate) fn database(&self, key: &str) -> Arc<DatabaseFigures> {
        let mut databases = self.databases.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(databases.entry(key.to_owned()).or_default())
    }

    /// Forgets a database's figures (it was deleted).
    pub(crate) fn forget(&self, key: &str) {
        self.databases.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }

    /// Every database's figures, by key.
    pub fn databases(&self) -> Vec<(String, u64, u64)> {
        let databases = self.databases.lock().unwrap_or_else(|p| p.into_inner());
        databases
            .iter()
            .map(|(k, f)| (k.clone(), f.commits.load(Ordering::Relaxed), f.history_bytes.load(Ordering::Relaxed)))
            .collect()
    }

    /// Counts a commit of `database` that took `took`.
    pub(crate) fn committed(&self, database: &DatabaseFigures, took: Duration) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        database.commits.fetch_add(1, Ordering::Relaxed);
        self.commit_seconds.observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_count_cumulatively_and_sum() {
        let histogram = Histogram::new(&[1.0, 10.0]);
        for value in [0.5, 1.0, 3.0, 20.0] {
            histogram.observe(value);
        }
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.buckets, vec![(1.0, 2), (10.0, 3), (f64::INFINITY, 4)]);
        assert_eq!(snapshot.count, 4);
        assert!((snapshot.sum - 24.5).abs() < 1e-6);
    }
}
