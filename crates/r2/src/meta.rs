//! A bucket's metadata file: the objects, multipart uploads and parts, and the SQL that reads
//! and changes them. Everything here runs on the bucket's actor.

use std::collections::{BTreeMap, HashSet};

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{R2Error, Result};
use crate::object::{HttpMetadata, ObjectInfo};

/// The schema; keys are BLOBs so that ordering is UTF-8 byte order and listing bounds may be
/// any byte string.
const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS objects (
        key           BLOB PRIMARY KEY,
        version       TEXT NOT NULL,
        size          INTEGER NOT NULL,
        etag          TEXT NOT NULL,
        uploaded      INTEGER NOT NULL,
        blob          TEXT,
        inline        BLOB,
        upload_id     TEXT,
        part_count    INTEGER,
        http_metadata TEXT NOT NULL,
        custom        TEXT NOT NULL,
        checksums     TEXT NOT NULL,
        storage_class TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS uploads (
        upload_id     TEXT PRIMARY KEY,
        key           BLOB NOT NULL,
        created       INTEGER NOT NULL,
        state         INTEGER NOT NULL,
        http_metadata TEXT NOT NULL,
        custom        TEXT NOT NULL,
        storage_class TEXT NOT NULL,
        checksum      TEXT
    );
    CREATE INDEX IF NOT EXISTS uploads_by_key ON uploads (key, created) WHERE state = 0;
    CREATE TABLE IF NOT EXISTS bucket_state (
        name  TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS parts (
        upload_id   TEXT NOT NULL,
        part_number INTEGER NOT NULL,
        blob        TEXT NOT NULL,
        size        INTEGER NOT NULL,
        md5         TEXT NOT NULL,
        uploaded    INTEGER NOT NULL,
        checksums   TEXT,
        PRIMARY KEY (upload_id, part_number)
    ) WITHOUT ROWID;
";

/// Columns added after a table was first made: (table, column, declaration).
const ADDED_COLUMNS: [(&str, &str, &str); 2] = [("uploads", "checksum", "TEXT"), ("parts", "checksums", "TEXT")];

/// Upload states.
pub(crate) const IN_PROGRESS: i64 = 0;
pub(crate) const COMPLETED: i64 = 1;
pub(crate) const ABORTED: i64 = 2;

pub(crate) fn ensure_schema(conn: &Connection) -> Result<()> {
    conn.execute_batch(SCHEMA)?;
    for (table, column, declaration) in ADDED_COLUMNS {
        let present: bool = conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2)",
            [table, column],
            |r| r.get(0),
        )?;
        if !present {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {declaration}"))?;
        }
    }
    Ok(())
}

pub(crate) const OBJECT_COLUMNS: &str =
    "key, version, size, etag, uploaded, http_metadata, custom, checksums, storage_class, part_count, blob, upload_id";

/// An object row with where its bytes are.
pub(crate) struct StoredObject {
    pub info: ObjectInfo,
    pub blob: Option<String>,
    pub upload_id: Option<String>,
}

fn json_error(column: usize, e: serde_json::Error) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, Box::new(e))
}

pub(crate) fn key_text(bytes: Vec<u8>) -> rusqlite::Result<String> {
    String::from_utf8(bytes)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Blob, Box::new(e)))
}

pub(crate) fn object_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<StoredObject> {
    let http: String = row.get(5)?;
    let custom: String = row.get(6)?;
    let checksums: String = row.get(7)?;
    Ok(StoredObject {
        info: ObjectInfo {
            key: key_text(row.get(0)?)?,
            version: row.get(1)?,
            size: row.get::<_, i64>(2)? as u64,
            etag: row.get(3)?,
            uploaded_ms: row.get(4)?,
            http: serde_json::from_str(&http).map_err(|e| json_error(5, e))?,
            custom: serde_json::from_str(&custom).map_err(|e| json_error(6, e))?,
            checksums: serde_json::from_str(&checksums).map_err(|e| json_error(7, e))?,
            storage_class: row.get(8)?,
            parts: row.get::<_, Option<i64>>(9)?.map(|n| n as u32),
        },
        blob: row.get(10)?,
        upload_id: row.get(11)?,
    })
}

pub(crate) fn get_object(conn: &Connection, key: &str) -> Result<Option<StoredObject>> {
    Ok(conn
        .prepare_cached(&format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE key = ?1"))?
        .query_row([key.as_bytes()], object_from_row)
        .optional()?)
}

/// Removes the object at `key` (if any) and returns the blobs it used.
pub(crate) fn remove_object(conn: &Connection, key: &str) -> Result<Vec<String>> {
    let Some(old) = get_object(conn, key)? else { return Ok(Vec::new()) };
    conn.prepare_cached("DELETE FROM objects WHERE key = ?1")?.execute([key.as_bytes()])?;
    let mut blobs: Vec<String> = old.blob.into_iter().collect();
    if let Some(upload_id) = old.upload_id {
        blobs.extend(remove_parts(conn, &upload_id)?);
    }
    Ok(blobs)
}

/// Removes every part of an upload and returns their blobs.
pub(crate) fn remove_parts(conn: &Connection, upload_id: &str) -> Result<Vec<String>> {
    let blobs = conn
        .prepare_cached("DELETE FROM parts WHERE upload_id = ?1 RETURNING blob")?
        .query_map([upload_id], |r| r.get(0))?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    Ok(blobs)
}

/// Where an object's bytes are.
pub(crate) enum Data<'a> {
    /// In a blob file.
    Blob(&'a str),
    /// In the row itself.
    Inline(&'a [u8]),
    /// In the parts of a completed multipart upload.
    Parts(&'a str),
}

/// The bytes of an object kept in its row.
pub(crate) fn inline_data(conn: &Connection, key: &str) -> Result<Option<Vec<u8>>> {
    Ok(conn
        .prepare_cached("SELECT inline FROM objects WHERE key = ?1")?
        .query_row([key.as_bytes()], |r| r.get(0))
        .optional()?
        .flatten())
}

/// Writes `info` at its key, with its bytes where `data` says.
pub(crate) fn insert_object(conn: &Connection, info: &ObjectInfo, data: Data<'_>) -> Result<()> {
    let json = |v: &dyn erased::Json| v.to_json();
    let (blob, inline, upload_id) = match data {
        Data::Blob(b) => (Some(b), None, None),
        Data::Inline(bytes) => (None, Some(bytes), None),
        Data::Parts(u) => (None, None, Some(u)),
    };
    conn.prepare_cached(&format!(
        "INSERT INTO objects ({OBJECT_COLUMNS}, inline) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
    ))?
    .execute(params![
        info.key.as_bytes(),
        info.version,
        info.size as i64,
        info.etag,
        info.uploaded_ms,
        json(&info.http),
        json(&info.custom),
        json(&info.checksums),
        info.storage_class,
        info.parts.map(i64::from),
        blob,
        upload_id,
        inline,
    ])?;
    Ok(())
}

mod erased {
    /// Serialises the metadata maps; they hold only strings, so this cannot fail.
    pub(crate) trait Json {
        fn to_json(&self) -> String;
    }
    impl<T: serde::Serialize> Json for T {
        fn to_json(&self) -> String {
            serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
        }
    }
}

/// An upload row.
pub(crate) struct Upload {
    pub key: String,
    pub created_ms: i64,
    pub state: i64,
    pub http: HttpMetadata,
    pub custom: BTreeMap<String, String>,
    pub storage_class: String,
    /// The checksum the completed object carries (`x-amz-checksum-algorithm` at creation).
    pub checksum: Option<crate::object::DeclaredChecksum>,
}

pub(crate) fn get_upload(conn: &Connection, upload_id: &str) -> Result<Option<Upload>> {
    let row = conn
        .prepare_cached(
            "SELECT key, created, state, http_metadata, custom, storage_class, checksum FROM uploads \
             WHERE upload_id = ?1",
        )?
        .query_row([upload_id], |r| {
            let http: String = r.get(3)?;
            let custom: String = r.get(4)?;
            Ok(Upload {
                key: key_text(r.get(0)?)?,
                created_ms: r.get(1)?,
                state: r.get(2)?,
                http: serde_json::from_str(&http).map_err(|e| json_error(3, e))?,
                custom: serde_json::from_str(&custom).map_err(|e| json_error(4, e))?,
                storage_class: r.get(5)?,
                checksum: r
                    .get::<_, Option<String>>(6)?
                    .as_deref()
                    .and_then(crate::object::DeclaredChecksum::from_text),
            })
        })
        .optional()?;
    Ok(row)
}

pub(crate) fn insert_upload(conn: &Connection, upload_id: &str, upload: &Upload) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO uploads (upload_id, key, created, state, http_metadata, custom, storage_class, checksum) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        upload_id,
        upload.key.as_bytes(),
        upload.created_ms,
        upload.state,
        serde_json::to_string(&upload.http).unwrap_or_default(),
        serde_json::to_string(&upload.custom).unwrap_or_default(),
        upload.storage_class,
        upload.checksum.map(|c| c.to_text()),
    ])?;
    Ok(())
}

pub(crate) fn set_upload_state(conn: &Connection, upload_id: &str, state: i64) -> Result<()> {
    conn.prepare_cached("UPDATE uploads SET state = ?2 WHERE upload_id = ?1")?.execute(params![upload_id, state])?;
    Ok(())
}

/// A stored part.
#[derive(Debug, Clone)]
pub(crate) struct Part {
    pub number: u32,
    pub blob: String,
    pub size: u64,
    pub md5: String,
    pub uploaded_ms: i64,
    /// The checksums it was sent or computed with (name to base64).
    pub checksums: BTreeMap<String, String>,
}

pub(crate) fn parts(conn: &Connection, upload_id: &str) -> Result<Vec<Part>> {
    Ok(conn
        .prepare_cached(
            "SELECT part_number, blob, size, md5, uploaded, checksums FROM parts WHERE upload_id = ?1 \
             ORDER BY part_number",
        )?
        .query_map([upload_id], |r| {
            let checksums: Option<String> = r.get(5)?;
            Ok(Part {
                number: r.get::<_, i64>(0)? as u32,
                blob: r.get(1)?,
                size: r.get::<_, i64>(2)? as u64,
                md5: r.get(3)?,
                uploaded_ms: r.get(4)?,
                checksums: match checksums {
                    Some(text) => serde_json::from_str(&text).map_err(|e| json_error(5, e))?,
                    None => BTreeMap::new(),
                },
            })
        })?
        .collect::<rusqlite::Result<_>>()?)
}

/// Stores a part, returning the blob of the part it replaces.
pub(crate) fn put_part(conn: &Connection, upload_id: &str, part: &Part) -> Result<Option<String>> {
    let old: Option<String> = conn
        .prepare_cached("SELECT blob FROM parts WHERE upload_id = ?1 AND part_number = ?2")?
        .query_row(params![upload_id, part.number], |r| r.get(0))
        .optional()?;
    conn.prepare_cached(
        "INSERT OR REPLACE INTO parts (upload_id, part_number, blob, size, md5, uploaded, checksums) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        upload_id,
        part.number,
        part.blob,
        part.size as i64,
        part.md5,
        part.uploaded_ms,
        (!part.checksums.is_empty()).then(|| serde_json::to_string(&part.checksums).unwrap_or_default()),
    ])?;
    Ok(old)
}

pub(crate) fn delete_part(conn: &Connection, upload_id: &str, number: u32) -> Result<()> {
    conn.prepare_cached("DELETE FROM parts WHERE upload_id = ?1 AND part_number = ?2")?
        .execute(params![upload_id, number])?;
    Ok(())
}

/// Every blob any row points at (for the sweep).
pub(crate) fn referenced_blobs(conn: &Connection) -> Result<HashSet<String>> {
    let mut out = HashSet::new();
    for sql in ["SELECT blob FROM objects WHERE blob IS NOT NULL", "SELECT blob FROM parts"] {
        let mut stmt = conn.prepare(sql)?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            out.insert(row.get::<_, String>(0)?);
        }
    }
    Ok(out)
}

/// Fails with NoSuchBucket once the bucket is marked deleted.
pub(crate) fn check_live(conn: &Connection) -> Result<()> {
    let deleted: Option<i64> = conn
        .prepare_cached("SELECT value FROM bucket_state WHERE name = 'deleted'")?
        .query_row([], |r| r.get(0))
        .optional()?;
    if deleted == Some(1) {
        return Err(R2Error::NoSuchBucket);
    }
    Ok(())
}

/// Marks the bucket deleted (or not).
pub(crate) fn set_deleted(conn: &Connection, deleted: bool) -> Result<()> {
    conn.prepare_cached("INSERT OR REPLACE INTO bucket_state (name, value) VALUES ('deleted', ?1)")?
        .execute([i64::from(deleted)])?;
    Ok(())
}

/// Whether the bucket holds any object.
pub(crate) fn has_objects(conn: &Connection) -> Result<bool> {
    Ok(conn.query_row("SELECT EXISTS (SELECT 1 FROM objects)", [], |r| r.get(0))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_made_before_multipart_checksums_gains_their_columns() {
        let conn = Connection::open_in_memory().unwrap();
        let before: String = SCHEMA.replace("checksum      TEXT", "").replace("checksums   TEXT,", "");
        let before =
            before.replace("storage_class TEXT NOT NULL,\n        \n    );", "storage_class TEXT NOT NULL\n    );");
        conn.execute_batch(&before).unwrap();
        let columns = |table: &str| -> Vec<String> {
            let mut statement = conn.prepare("SELECT name FROM pragma_table_info(?1)").unwrap();
            statement.query_map([table], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
        };
        assert!(!columns("parts").contains(&"checksums".to_owned()), "the old schema: {:?}", columns("parts"));
        assert!(!columns("uploads").contains(&"checksum".to_owned()), "the old schema: {:?}", columns("uploads"));
        ensure_schema(&conn).unwrap();
        ensure_schema(&conn).unwrap();
        assert!(columns("uploads").contains(&"checksum".to_owned()));
        assert!(columns("parts").contains(&"checksums".to_owned()));
        let upload = Upload {
            key: "k".into(),
            created_ms: 1,
            state: IN_PROGRESS,
            http: HttpMetadata::default(),
            custom: BTreeMap::new(),
            storage_class: "Standard".into(),
            checksum: crate::object::DeclaredChecksum::new(crate::object::ChecksumAlgorithm::Sha256, None),
        };
        insert_upload(&conn, "u", &upload).unwrap();
        assert_eq!(get_upload(&conn, "u").unwrap().unwrap().checksum, upload.checksum);
    }
}
