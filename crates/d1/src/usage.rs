//! Per-database, per-hour usage counters (queries, rows read and written), counted in memory
//! on the hot path and saved to the catalog in batches; `wrangler d1 info` reads them back.

use std::collections::HashMap;
use std::sync::Mutex;

use kura_catalog::{Catalog, UsageDelta};
use kura_sqlite::StatementResult;

/// Counters for one database in one hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UsageTotals {
    /// Statements that only read.
    pub read_queries: u64,
    /// Statements that wrote.
    pub write_queries: u64,
    /// Rows read.
    pub rows_read: u64,
    /// Rows written.
    pub rows_written: u64,
}

#[derive(Default)]
pub(crate) struct UsageRecorder {
    pending: Mutex<HashMap<(String, i64), UsageTotals>>,
}

fn current_hour() -> i64 {
    jiff::Timestamp::now().as_second().div_euclid(3600) * 3600
}

impl UsageRecorder {
    pub(crate) fn record(&self, uuid: &str, results: &[StatementResult]) {
        let mut totals = UsageTotals::default();
        for r in results {
            if r.meta.wrote {
                totals.write_queries += 1;
            } else {
                totals.read_queries += 1;
            }
            totals.rows_read += r.meta.rows_read;
            totals.rows_written += r.meta.rows_written;
        }
        self.add(uuid, totals);
    }

    pub(crate) fn add(&self, uuid: &str, totals: UsageTotals) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let entry = pending.entry((uuid.to_owned(), current_hour())).or_default();
        entry.read_queries += totals.read_queries;
        entry.write_queries += totals.write_queries;
        entry.rows_read += totals.rows_read;
        entry.rows_written += totals.rows_written;
    }

    pub(crate) fn forget(&self, uuid: &str) {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).retain(|(id, _), _| id != uuid);
    }

    /// Saves and clears the pending counters; on failure they are kept for the next try.
    pub(crate) fn flush(&self, catalog: &Catalog) -> kura_catalog::Result<()> {
        let drained: Vec<((String, i64), UsageTotals)> =
            self.pending.lock().unwrap_or_else(|p| p.into_inner()).drain().collect();
        let deltas: Vec<UsageDelta<'_>> = drained
            .iter()
            .map(|((id, hour), t)| UsageDelta {
                database_id: id,
                hour: *hour,
                read_queries: t.read_queries,
                write_queries: t.write_queries,
                rows_read: t.rows_read,
                rows_written: t.rows_written,
            })
            .collect();
        if let Err(e) = catalog.add_d1_usage(&deltas) {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            for (key, t) in drained {
                let entry = pending.entry(key).or_default();
                entry.read_queries += t.read_queries;
                entry.write_queries += t.write_queries;
                entry.rows_read += t.rows_read;
                entry.rows_written += t.rows_written;
            }
            return Err(e);
        }
        Ok(())
    }
}
