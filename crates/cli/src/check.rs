//! `kura check`: an offline check of a stopped server's data directory — every SQLite file's
//! integrity, every history's checksums and positions, every bucket's (and KV namespace's) rows
//! against its blobs.
//! It only reads, and holds the directory's lock so no server starts meanwhile.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use rusqlite::{Connection, OpenFlags};
use serde::Serialize;

use crate::DataArgs;
use crate::output::{print_json, table};

#[derive(Args)]
pub struct CheckArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    data: DataArgs,
}

/// What was checked, and every problem found.
#[derive(Serialize, Default)]
struct Report {
    sqlite_files: u64,
    histories: u64,
    snapshots: u64,
    segments: u64,
    records: u64,
    /// Histories whose open segment ends in a record a crash cut short (the next open drops it
    /// and captures that transaction again from the WAL).
    torn_tails: u64,
    /// Databases whose restore a crash interrupted (finished when they next open; their
    /// integrity is checked then, not here).
    restores_pending: u64,
    buckets: u64,
    /// KV namespaces (stored as buckets: their keys count as objects).
    kv_namespaces: u64,
    objects: u64,
    blobs: u64,
    /// Blobs no row names, which the bucket's sweep removes when it next opens.
    orphan_blobs: u64,
    problems: Vec<String>,
}

pub fn run(args: CheckArgs) -> anyhow::Result<()> {
    let dir = &args.data.data;
    if !dir.join("catalog.sqlite").is_file() {
        bail!("{} is not a kura data directory (it has no catalog.sqlite)", dir.display());
    }
    crate::membership::refuse_if_clustered(dir)?;
    let _lock = match kura_server::lock_directory(dir) {
        Err(busy @ kura_server::NodeError::Busy { .. }) => bail!("{busy}: stop it, then check the directory"),
        locked => locked?,
    };
    let mut report = Report::default();
    let mut files = Vec::new();
    walk(dir, &mut files).with_context(|| format!("listing {}", dir.display()))?;
    for path in &files {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.ends_with(".sqlite") {
            report.sqlite_files += 1;
            // A restore a crash interrupted is finished (or forgotten) when the database next
            // opens; until then its file and WAL may belong to different states.
            let restoring = kura_sqlite::log_dir(path).join("restore.pending").exists();
            if restoring {
                report.restores_pending += 1;
            } else if let Err(problem) = integrity(path) {
                report.problems.push(problem);
            }
            match kura_sqlite::verify_history(path) {
                Ok(None) => {}
                Ok(Some(log)) => {
                    report.histories += 1;
                    report.snapshots += log.snapshots as u64;
                    report.segments += log.segments as u64;
                    report.records += log.records;
                    report.torn_tails += u64::from(log.torn_tail_bytes > 0);
                }
                Err(e) => report.problems.push(e.to_string()),
            }
        }
        let parent = path.parent().and_then(Path::parent);
        if name == "meta.sqlite" && (parent == Some(&dir.join("r2")) || parent == Some(&dir.join("kv"))) {
            match parent == Some(&dir.join("kv")) {
                true => report.kv_namespaces += 1,
                false => report.buckets += 1,
            }
            match kura_r2::check_bucket(path.parent().expect("a bucket directory")) {
                Ok(bucket) => {
                    report.objects += bucket.objects;
                    report.blobs += bucket.blobs;
                    report.orphan_blobs += bucket.orphans;
                }
                Err(e) => report.problems.push(e.to_string()),
            }
        }
    }
    if args.json {
        print_json(&report);
    } else {
        let rows = vec![
            vec!["SQLite files".into(), report.sqlite_files.to_string(), "integrity_check".into()],
            vec![
                "histories".into(),
                report.histories.to_string(),
                format!(
                    "{} snapshots, {} segments, {} records checked; {} torn tails, {} restores pending",
                    report.snapshots, report.segments, report.records, report.torn_tails, report.restores_pending
                ),
            ],
            vec![
                "R2 buckets, KV namespaces".into(),
                format!("{}, {}", report.buckets, report.kv_namespaces),
                format!(
                    "{} objects and keys, {} blobs; {} orphan blobs",
                    report.objects, report.blobs, report.orphan_blobs
                ),
            ],
        ];
        println!("{}", table(&["checked", "count", "what"], rows));
        for problem in &report.problems {
            println!("✘ {problem}");
        }
    }
    if !report.problems.is_empty() {
        bail!("{} problem(s) found in {}", report.problems.len(), dir.display());
    }
    if !args.json {
        println!("✔ no damage found in {}", dir.display());
    }
    Ok(())
}

/// Every file under `dir`, depth first; a database's `log` and a bucket's `blobs` are read by
/// their checks (a bucket may itself be named `log` or `blobs`).
fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries = std::fs::read_dir(dir)?.collect::<Result<Vec<_>, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    let holds_database = dir.join("db.sqlite").is_file() || dir.join("meta.sqlite").is_file();
    for entry in entries {
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            if !(holds_database && matches!(entry.file_name().to_str(), Some("log" | "blobs"))) {
                walk(&path, files)?;
            }
        } else {
            files.push(path);
        }
    }
    Ok(())
}

/// SQLite's `integrity_check` on a file opened read-only (which never checkpoints its WAL, so
/// the check changes nothing the history has not captured).
fn integrity(path: &Path) -> Result<(), String> {
    let fail = |e: rusqlite::Error| format!("{}: {e}", path.display());
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(fail)?;
    let mut statement = conn.prepare("PRAGMA integrity_check").map_err(fail)?;
    let found: Vec<String> =
        statement.query_map([], |r| r.get(0)).map_err(fail)?.collect::<Result<_, _>>().map_err(fail)?;
    match found.as_slice() {
        [ok] if ok == "ok" => Ok(()),
        _ => Err(format!("{}: {}", path.display(), found.join("; "))),
    }
}
