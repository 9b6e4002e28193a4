//! Memory: resident bytes per idle open object and with 100,000 objects on disk, measured in
//! child processes of this program so nothing else is resident.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kura::{Runtime, RuntimeSettings};
use kura_sqlite::COMPACT_CACHE_KIB;
use serde_json::{Value as Json, json};

use super::limit::{limit_open_compact, limit_request};
use super::{OBJECTS, Room, add, add_to_all, room_name, tokio_runtime};

/// What the memory measurement found.
pub struct Footprint {
    pub(super) objects: u64,
    pub(super) write_rate: f64,
    pub(super) disk_bytes: u64,
    pub(super) report: Json,
    /// Resident bytes per open file with nothing but a bare SQLite connection on it.
    pub(super) limit_per_file: f64,
}

impl Footprint {
    pub(super) fn print(&self) {
        let r = &self.report;
        let mib = |k: &str| r[k].as_f64().unwrap_or(0.0) / 1024.0 / 1024.0;
        let idle = r["idle_objects"].as_u64().unwrap_or(1).max(1);
        let per_idle =
            (r["idle_rss"].as_f64().unwrap_or(0.0) - r["baseline_rss"].as_f64().unwrap_or(0.0)) / idle as f64;
        println!();
        println!(
            "Memory (a fresh process; resident set from /proc): {} objects on disk, written at {:.0} objects/s, \
             {:.1} KiB of disk each",
            self.objects,
            self.write_rate,
            self.disk_bytes as f64 / self.objects.max(1) as f64 / 1024.0
        );
        println!("  runtime open, nothing touched:              {:>8.1} MiB", mib("baseline_rss"));
        println!(
            "  {idle} objects touched, idle in memory:      {:>8.1} MiB  → {:.1} KiB per idle object (instance + open file)",
            mib("idle_rss"),
            per_idle / 1024.0
        );
        println!(
            "  limit: {idle} bare SQLite connections, one per file, configured as kura's (WAL, exclusive, no lookaside, \
             {COMPACT_CACHE_KIB} KiB cache, no bulk page reservation), after the same request: {:.1} KiB per open file → kura {:.2}× the limit",
            self.limit_per_file / 1024.0,
            per_idle / self.limit_per_file.max(1.0)
        );
        println!(
            "  all {} touched once, {:.0} first requests/s: {:>8.1} MiB now, {:.1} MiB at peak; {} instances and {} files \
             open (caps {} and {})",
            self.objects,
            r["touch_rate"].as_f64().unwrap_or(0.0),
            mib("all_rss"),
            mib("peak_rss"),
            r["instances"],
            r["open_files"],
            r["max_instances"],
            r["max_open"],
        );
        let instances = r["instances"].as_u64().unwrap_or(1).max(1);
        println!(
            "  files idle {}s and closed ({} open), instances kept:  {:>8.1} MiB  → {:.1} KiB per known object (instance only)",
            FILE_IDLE.as_secs() * 3,
            r["closed_files"],
            mib("closed_rss"),
            (r["closed_rss"].as_f64().unwrap_or(0.0) - r["baseline_rss"].as_f64().unwrap_or(0.0))
                / instances as f64
                / 1024.0
        );
    }
}

/// Writes `objects` objects (the 1,000 of the workload's first, one row each) with the engine,
/// then measures a fresh process touching them.
pub(super) fn measure_footprint(dir: &Path, objects: u64, rt: &tokio::runtime::Runtime) -> anyhow::Result<Footprint> {
    let started = Instant::now();
    rt.block_on(async {
        let runtime = Runtime::open_with(dir, RuntimeSettings::default())?;
        let rooms = runtime.namespace::<Room>("ROOMS", "bench-Room", ())?;
        add_to_all(&rooms, objects, "seed", 1).await?;
        runtime.shutdown().await;
        anyhow::Ok(())
    })?;
    let write_rate = objects as f64 / started.elapsed().as_secs_f64();
    let disk_bytes = disk_usage(dir);
    let output = Command::new(std::env::current_exe()?)
        .arg("do-footprint")
        .arg(dir)
        .arg(objects.to_string())
        .output()
        .context("running the footprint process")?;
    if !output.status.success() {
        bail!("the footprint process failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let report: Json = serde_json::from_slice(&output.stdout).context("the footprint process's answer")?;
    let limit_dir = dir.with_extension("limit");
    std::fs::create_dir_all(&limit_dir)?;
    for object in 0..OBJECTS {
        limit_request(&limit_open_compact(&limit_dir, object)?, "seed")?;
    }
    let output = Command::new(std::env::current_exe()?)
        .arg("do-footprint-limit")
        .arg(&limit_dir)
        .output()
        .context("running the footprint limit's process")?;
    if !output.status.success() {
        bail!("the footprint limit's process failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let limit: Json = serde_json::from_slice(&output.stdout).context("the footprint limit's answer")?;
    let limit_per_file = limit["per_file"].as_f64().unwrap_or(0.0);
    Ok(Footprint { objects, write_rate, disk_bytes, report, limit_per_file })
}

/// The memory limit's side: in a fresh process, a bare connection on each of the [`OBJECTS`]
/// files written before, configured as kura configures an object's (and the process as kura
/// configures its own), each after the workload's
/// request; prints the resident bytes per open file.
pub fn footprint_limit_child(dir: &Path) -> anyhow::Result<()> {
    // As kura's process is configured: no page-cache pages reserved up front per connection.
    kura_sqlite::configure_process();
    let baseline_rss = crate::memory::resident_bytes().0;
    let mut conns = Vec::new();
    for object in 0..OBJECTS {
        let conn = limit_open_compact(dir, object)?;
        limit_request(&conn, "idle")?;
        conns.push(conn);
    }
    let open_rss = crate::memory::resident_bytes().0;
    let per_file = open_rss.saturating_sub(baseline_rss) as f64 / OBJECTS as f64;
    println!("{}", json!({ "baseline_rss": baseline_rss, "open_rss": open_rss, "per_file": per_file }));
    drop(conns);
    Ok(())
}

/// Bytes of disk the files under `dir` take.
pub(super) fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut pending = vec![dir.to_owned()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => pending.push(entry.path()),
                Ok(m) => total += m.blocks() * 512,
                Err(_) => {}
            }
        }
    }
    total
}

/// How long an idle object's file stays open in the memory measurement.
pub(super) const FILE_IDLE: Duration = Duration::from_secs(2);

/// The child process's side: open a runtime on `dir`, touch the first 1,000 objects and keep
/// them idle, then touch all `objects`; print what was resident at each step as JSON.
pub fn footprint_child(dir: PathBuf, objects: u64) -> anyhow::Result<()> {
    let rt = tokio_runtime("footprint")?;
    let mut settings = RuntimeSettings::default();
    // Files close after 30 s idle by default; sooner here, so the run need not wait for it.
    settings.engine.registry.idle_timeout = FILE_IDLE;
    let report = rt.block_on(async {
        let runtime = Runtime::open_with(&dir, settings.clone())?;
        let rooms = runtime.namespace::<Room>("ROOMS", "bench-Room", ())?;
        let baseline_rss = crate::memory::resident_bytes().0;
        let idle_objects = OBJECTS.min(objects);
        for object in 0..idle_objects {
            rooms.get_by_name(&room_name(object)).call(add("idle".into())).await?;
        }
        let idle_rss = crate::memory::resident_bytes().0;
        let started = Instant::now();
        // Every object still answers with its data: the seed row, the idle one and this one.
        add_to_all(&rooms, objects, "again", 2).await?;
        let touch_rate = objects as f64 / started.elapsed().as_secs_f64();
        let (all_rss, _) = crate::memory::resident_bytes();
        let open_files = runtime.engine().open_objects();
        // Idle objects close their files; their instances stay (up to the cap).
        tokio::time::sleep(FILE_IDLE * 3).await;
        // SAFETY: malloc_trim only returns free memory to the system.
        unsafe { libc::malloc_trim(0) };
        let (closed_rss, peak_rss) = crate::memory::resident_bytes();
        let report = json!({
            "baseline_rss": baseline_rss,
            "idle_objects": idle_objects,
            "idle_rss": idle_rss,
            "all_rss": all_rss,
            "closed_rss": closed_rss,
            "closed_files": runtime.engine().open_objects(),
            "peak_rss": peak_rss,
            "touch_rate": touch_rate,
            "instances": rooms.instances(),
            "open_files": open_files,
            "max_instances": settings.max_instances,
            "max_open": settings.engine.registry.max_open,
        });
        runtime.shutdown().await;
        anyhow::Ok(report)
    })?;
    println!("{report}");
    Ok(())
}
