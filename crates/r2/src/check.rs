//! An offline check of a stopped server's bucket directory, as `kura check` runs it: every
//! object row's bytes are where the row says, at the size it says (a row never points at a
//! missing or short blob), and blobs no row names are counted (the sweep removes them when the
//! bucket next opens). Reads only.

use std::collections::HashSet;
use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use crate::blob::{is_blob_id, shard_dir};

/// What a bucket holds, once checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketCheck {
    /// Object rows, each checked.
    pub objects: u64,
    /// Blob files some row names.
    pub blobs: u64,
    /// Blob files no row names.
    pub orphans: u64,
}

/// Damage found in a bucket.
#[derive(Debug, thiserror::Error)]
pub enum BucketDamage {
    /// A row names bytes that are missing or of another size.
    #[error("{0}")]
    Damaged(String),
    /// The metadata could not be read.
    #[error("reading {0}: {1}")]
    Sqlite(String, rusqlite::Error),
    /// A directory could not be listed.
    #[error("listing {0}: {1}")]
    Io(String, std::io::Error),
}

/// Checks the bucket whose metadata and blobs are in `bucket_dir` (`<data>/r2/<bucket>`).
pub fn check_bucket(bucket_dir: &Path) -> Result<BucketCheck, BucketDamage> {
    let meta = bucket_dir.join("meta.sqlite");
    let sql = |e| BucketDamage::Sqlite(meta.display().to_string(), e);
    let conn = Connection::open_with_flags(&meta, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(sql)?;
    let blob_size = |id: &str| -> Option<u64> {
        let path = is_blob_id(id).then(|| shard_dir(bucket_dir, id).join(id))?;
        std::fs::metadata(path).ok().map(|m| m.len())
    };
    let mut check = BucketCheck::default();
    let mut named = HashSet::new();
    let mut parts = conn.prepare("SELECT blob, size, part_number FROM parts WHERE upload_id = ?1").map_err(sql)?;
    let mut objects = conn.prepare("SELECT key, size, blob, length(inline), upload_id FROM objects").map_err(sql)?;
    let mut rows = objects.query([]).map_err(sql)?;
    while let Some(row) = rows.next().map_err(sql)? {
        let key = String::from_utf8_lossy(&row.get::<_, Vec<u8>>(0).map_err(sql)?).into_owned();
        let size: u64 = row.get::<_, i64>(1).map_err(sql)? as u64;
        let (blob, inline, upload): (Option<String>, Option<i64>, Option<String>) =
            (row.get(2).map_err(sql)?, row.get(3).map_err(sql)?, row.get(4).map_err(sql)?);
        check.objects += 1;
        let found = match (blob, inline, upload) {
            (Some(blob), _, _) => {
                let found = blob_size(&blob);
                named.insert(blob);
                found
            }
            (None, Some(len), _) => Some(len as u64),
            (None, None, Some(upload)) => {
                let mut total = Some(0u64);
                let mut rows = parts.query([&upload]).map_err(sql)?;
                while let Some(part) = rows.next().map_err(sql)? {
                    let (blob, part_size, number): (String, i64, i64) =
                        (part.get(0).map_err(sql)?, part.get(1).map_err(sql)?, part.get(2).map_err(sql)?);
                    if blob_size(&blob) != Some(part_size as u64) {
                        return Err(BucketDamage::Damaged(format!(
                            "{}: part {number} of object {key:?} is missing or not {part_size} bytes",
                            bucket_dir.display()
                        )));
                    }
                    named.insert(blob);
                    total = total.map(|t| t + part_size as u64);
                }
                total
            }
            (None, None, None) => Some(0),
        };
        if found != Some(size) {
            return Err(BucketDamage::Damaged(format!(
                "{}: object {key:?} is {size} bytes, its data {}",
                bucket_dir.display(),
                found.map_or("is missing".to_owned(), |n| format!("has {n}"))
            )));
        }
    }
    // Parts of uploads still in progress name their blobs too.
    let mut all_parts = conn.prepare("SELECT blob FROM parts").map_err(sql)?;
    let mut rows = all_parts.query([]).map_err(sql)?;
    while let Some(row) = rows.next().map_err(sql)? {
        named.insert(row.get::<_, String>(0).map_err(sql)?);
    }
    let blobs = bucket_dir.join("blobs");
    let io = |e| BucketDamage::Io(blobs.display().to_string(), e);
    let shards = match std::fs::read_dir(&blobs) {
        Ok(shards) => shards.collect::<Result<Vec<_>, _>>().map_err(io)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io(e)),
    };
    for shard in shards {
        for file in std::fs::read_dir(shard.path()).map_err(io)? {
            let name = file.map_err(io)?.file_name();
            match named.contains(name.to_string_lossy().as_ref()) {
                true => check.blobs += 1,
                false => check.orphans += 1,
            }
        }
    }
    Ok(check)
}
