//! The process's resident memory, from /proc (Linux).

/// Resident bytes now and at the process's peak (0 where /proc cannot say).
pub fn resident_bytes() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resident MiB now and at the process's peak.
pub fn resident_mib() -> (f64, f64) {
    let (now, peak) = resident_bytes();
    let mib = |b: u64| b as f64 / 1024.0 / 1024.0;
    (mib(now), mib(peak))
}
