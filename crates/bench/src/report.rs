//! Prints each workload beside the peer and the limit, with the ratios.

use crate::load::Stats;

/// One row of the report.
pub struct Row {
    pub workload: String,
    pub clients: usize,
    pub unit: &'static str,
    pub kura: Stats,
    pub peer: Option<f64>,
    pub limit: Option<Stats>,
    pub target: Option<f64>,
}

/// A duration in microseconds, for the lines printed beside the table.
pub fn micros(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ms(d: std::time::Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn ratio(a: f64, b: Option<f64>) -> String {
    match b {
        Some(b) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "–".into(),
    }
}

pub fn print(title: &str, rows: &[Row], peer_note: &str) {
    println!();
    println!("{title}");
    println!("peer: {peer_note}");
    println!(
        "HTTP floor: the same client and server answering GET /healthz (no auth, no SQL): what HTTP alone costs here"
    );
    println!(
        "{:<36} {:>3} {:>12} {:>8} {:>8} {:>12} {:>9} {:>12} {:>9} {:>9}",
        "workload", "c", "kura/s", "p50 ms", "p99 ms", "peer/s", "vs peer", "limit/s", "vs limit", "target"
    );
    for r in rows {
        let kura = r.kura.rate();
        let target = match r.target {
            Some(t) if kura >= t => format!("{t:.0} ✓"),
            Some(t) => format!("{t:.0} ✗"),
            None => "–".into(),
        };
        println!(
            "{:<36} {:>3} {:>12.0} {:>8} {:>8} {:>12} {:>9} {:>12} {:>9} {:>9}",
            format!("{} ({})", r.workload, r.unit),
            r.clients,
            kura,
            ms(r.kura.p50),
            ms(r.kura.p99),
            r.peer.map(|p| format!("{p:.0}")).unwrap_or_else(|| "–".into()),
            ratio(kura, r.peer),
            r.limit.map(|l| format!("{:.0}", l.rate())).unwrap_or_else(|| "–".into()),
            ratio(kura, r.limit.map(|l| l.rate())),
            target,
        );
    }
}
