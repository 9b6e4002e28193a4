//! `kura import wrangler-state DIR`: a `wrangler dev` project's local state
//! (`.wrangler/state/v3`, Miniflare's layout) into
//! the data directory — its D1 databases (as SQL, through D1's import, so Time Travel starts
//! with them), its R2 buckets (objects with their metadata, bytes from Miniflare's blob store),
//! its KV namespaces (under the ids the configuration names, so its bindings need no change;
//! keys with their metadata and expiry) and its Durable Objects (each object's SQLite file, copied consistently with SQLite's backup,
//! into a namespace workerd will run once the Worker is deployed). Idempotent: what is already
//! here is left alone. Refuses a state directory a running `wrangler dev` holds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use rusqlite::{Connection, OpenFlags, OptionalExtension};

use kura_catalog::HOST_WORKERD;
use kura_do::IdFactory;
use kura_r2::{HttpMetadata, PutOptions};

use crate::config::WranglerConfig;
use crate::local::Local;

/// Miniflare's unique keys for its own D1 and R2 objects.
const D1_KEY: &str = "miniflare-D1DatabaseObject";
const R2_KEY: &str = "miniflare-R2BucketObject";
const KV_KEY: &str = "miniflare-KVNamespaceObject";

/// What one import did.
#[derive(Default, Debug)]
struct Report {
    databases: usize,
    databases_skipped: usize,
    objects: usize,
    objects_skipped: usize,
    kv_keys: usize,
    kv_keys_skipped: usize,
    durable_objects: usize,
    durable_objects_skipped: usize,
}

fn open_read_only(path: &Path) -> anyhow::Result<Connection> {
    Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .with_context(|| format!("cannot open {}", path.display()))
}

/// The `*.sqlite` files of a directory (object files: 64 hex digits), sorted.
fn object_files(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let id = name.strip_suffix(".sqlite")?.to_owned();
            (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| (id, e.path()))
        })
        .collect();
    found.sort();
    found
}

/// The directories of `dir` that hold a `blobs` directory (Miniflare's buckets and
/// namespaces, each named by its local id), sorted.
fn with_blobs(dir: &Path) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("blobs").is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    found
}

fn refuse_if_running(state: &Path) -> anyhow::Result<()> {
    let mut dirs = vec![
        state.join("d1/miniflare-D1DatabaseObject"),
        state.join("r2/miniflare-R2BucketObject"),
        state.join("kv").join(KV_KEY),
    ];
    dirs.extend(std::fs::read_dir(state.join("do")).into_iter().flatten().flatten().map(|e| e.path()));
    for dir in dirs {
        // A running wrangler dev keeps each namespace's metadata.sqlite open for as long as it runs.
        let files = object_files(&dir).into_iter().map(|(_, p)| p).chain([dir.join("metadata.sqlite")]);
        for path in files {
            if let Some(pid) = kura_sqlite::open_elsewhere(&path) {
                bail!(
                    "{} is in use by a running process (pid {pid}), probably `wrangler dev`: stop it, then import",
                    state.display()
                );
            }
        }
    }
    Ok(())
}

pub async fn run(state: &Path, config: Option<WranglerConfig>, local: &Local) -> anyhow::Result<()> {
    if !["d1", "r2", "kv", "do"].iter().any(|d| state.join(d).is_dir()) {
        bail!(
            "{} holds no wrangler state (no d1/, r2/, kv/ or do/): pass the project's .wrangler/state/v3",
            state.display()
        );
    }
    refuse_if_running(state)?;
    let mut report = Report::default();
    import_d1(state, config.as_ref(), local, &mut report).await?;
    import_r2(state, local, &mut report).await?;
    import_kv(state, config.as_ref(), local, &mut report).await?;
    import_durable_objects(state, local, &mut report).await?;
    println!(
        "Imported {} D1 database(s) ({} already here), {} R2 object(s) ({} already here), {} KV key(s) ({} already here), {} Durable Object(s) ({} already here).",
        report.databases,
        report.databases_skipped,
        report.objects,
        report.objects_skipped,
        report.kv_keys,
        report.kv_keys_skipped,
        report.durable_objects,
        report.durable_objects_skipped
    );
    Ok(())
}

/// D1: each database file, named as the configuration binds it (wrangler's local id is
/// `preview_database_id ?? database_id ?? binding`), else `imported-<id>`.
async fn import_d1(
    state: &Path,
    config: Option<&WranglerConfig>,
    local: &Local,
    report: &mut Report,
) -> anyhow::Result<()> {
    let ids = IdFactory::new(D1_KEY);
    let mut names = BTreeMap::new();
    for binding in config.map(|c| c.d1_databases.as_slice()).unwrap_or_default() {
        let local_id =
            binding.preview_database_id.as_ref().or(binding.database_id.as_ref()).unwrap_or(&binding.binding);
        let name = binding.database_name.clone().unwrap_or_else(|| binding.binding.clone());
        names.insert(ids.id_from_name(local_id).to_string(), name);
    }
    let d1 = local.node.d1();
    for (id, path) in object_files(&state.join("d1").join(D1_KEY)) {
        let name = names.get(&id).cloned().unwrap_or_else(|| format!("imported-{}", id.get(..12).unwrap_or(&id)));
        if local.node.catalog().d1_database(&local.account, &name)?.is_some() {
            println!("D1 database {name}: already here, left alone");
            report.databases_skipped += 1;
            continue;
        }
        let sql = dump_file(&path)?;
        d1.create(&local.account, &name, Default::default()).await?;
        if sql.trim().is_empty() {
            println!("D1 database {name}: empty");
            report.databases += 1;
            continue;
        }
        let statements = sql.lines().count();
        let (outcome, bookmark) = d1
            .import(&local.account, &name, Box::new(std::io::Cursor::new(sql.into_bytes())))
            .await
            .with_context(|| format!("importing the D1 database {name}"))?;
        println!("D1 database {name}: {} statements ({statements} lines), bookmark {bookmark}", outcome.num_queries);
        report.databases += 1;
    }
    Ok(())
}

/// A Miniflare D1 file as SQL: its tables and rows, without Miniflare's (`__miniflare_*`)
/// and workerd's (`_cf_*`) own.
fn dump_file(path: &Path) -> anyhow::Result<String> {
    let tables: Vec<String> = open_read_only(path)?
        .prepare(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE '\\_\\_miniflare\\_%' ESCAPE '\\'",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    if tables.is_empty() {
        return Ok(String::new());
    }
    let mut options = kura_sqlite::DatabaseOptions::new(path).read_only(true);
    options.limits = kura_sqlite::Limits::durable_object();
    let mut db = kura_sqlite::Database::open(&options)?;
    let mut out = Vec::new();
    let dump = kura_sqlite::dump::DumpOptions { tables, ..Default::default() };
    kura_sqlite::dump::dump(&mut db, &dump, &mut out)?;
    String::from_utf8(out).context("the dump is not UTF-8")
}

/// R2: each bucket with a blob directory (`r2/<bucket>/blobs`), its objects read from the
/// bucket's metadata file (`r2/miniflare-R2BucketObject/<idFromName(bucket)>.sqlite`).
async fn import_r2(state: &Path, local: &Local, report: &mut Report) -> anyhow::Result<()> {
    let ids = IdFactory::new(R2_KEY);
    let r2 = local.node.r2();
    for name in with_blobs(&state.join("r2")) {
        let meta = state.join("r2").join(R2_KEY).join(format!("{}.sqlite", ids.id_from_name(&name)));
        if !meta.is_file() {
            continue;
        }
        let bucket = match local.node.catalog().r2_bucket(&local.account, &name)? {
            Some(bucket) => bucket,
            None => kura_server::buckets::create(local.node.catalog(), r2, &local.account, &name, None, None).await?,
        };
        let blobs = state.join("r2").join(&name).join("blobs");
        let conn = open_read_only(&meta)?;
        let objects = read_objects(&conn)?;
        let bar = crate::progress::count(&format!("R2 bucket {name}"), objects.len() as u64);
        let (mut imported, mut skipped) = (0, 0);
        for object in objects {
            bar.inc(1);
            if let Some(existing) = r2.head_object(&bucket.id, &object.key).await?
                && existing.size == object.size
            {
                skipped += 1;
                continue;
            }
            let bytes = match &object.blob {
                Some(blob) => {
                    std::fs::read(blobs.join(blob)).with_context(|| format!("reading the blob of {}", object.key))?
                }
                None => {
                    let mut all = Vec::new();
                    for blob in parts(&conn, &object.key)? {
                        all.extend(
                            std::fs::read(blobs.join(&blob))
                                .with_context(|| format!("reading a part of {}", object.key))?,
                        );
                    }
                    all
                }
            };
            let options = PutOptions {
                http: object.http,
                custom: object.custom,
                size: Some(bytes.len() as u64),
                ..Default::default()
            };
            let body = futures_util::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from(bytes))]);
            r2.put_object(&bucket.id, &object.key, body, options).await?;
            imported += 1;
        }
        bar.finish_and_clear();
        println!("R2 bucket {name}: {imported} object(s) imported, {skipped} already here");
        report.objects += imported;
        report.objects_skipped += skipped;
    }
    Ok(())
}

/// KV: each namespace `wrangler dev` kept (its local id is the binding's `id`, else the
/// binding's name). A local id that is a namespace id (32 hex characters) is kept, so the
/// configuration's binding reaches the imported namespace unchanged; another gets a new id,
/// printed. Titled by the binding's name where the configuration binds it. Expired keys are
/// left behind.
async fn import_kv(
    state: &Path,
    config: Option<&WranglerConfig>,
    local: &Local,
    report: &mut Report,
) -> anyhow::Result<()> {
    let ids = IdFactory::new(KV_KEY);
    let bindings = config.map(|c| c.kv_namespaces.as_slice()).unwrap_or_default();
    let kv = local.node.kv();
    let catalog = local.node.catalog();
    let local_ids = with_blobs(&state.join("kv"));
    let now_ms = jiff::Timestamp::now().as_millisecond();
    for local_id in local_ids {
        let entries_file = state.join("kv").join(KV_KEY).join(format!("{}.sqlite", ids.id_from_name(&local_id)));
        if !entries_file.is_file() {
            continue;
        }
        let title = bindings
            .iter()
            .find(|b| b.id.as_deref().unwrap_or(&b.binding) == local_id)
            .map_or_else(|| local_id.clone(), |b| b.binding.clone());
        let is_id = local_id.len() == 32 && local_id.bytes().all(|b| b.is_ascii_hexdigit());
        let existing = match is_id {
            true => catalog.kv_namespace(&local.account, &local_id)?,
            false => None,
        };
        let namespace = match existing {
            Some(namespace) => namespace,
            None => {
                let made = match is_id {
                    true => catalog.create_kv_namespace_with_id(&local.account, &local_id, &title),
                    false => catalog.create_kv_namespace(&local.account, &title),
                }
                .with_context(|| format!("creating the KV namespace {title}"))?;
                if let Err(e) = kv.create_namespace(&made.id).await {
                    let _ = catalog.delete_kv_namespace(&local.account, &made.id);
                    return Err(e.into());
                }
                made
            }
        };
        let blobs = state.join("kv").join(&local_id).join("blobs");
        let conn = open_read_only(&entries_file)?;
        let mut statement = conn.prepare("SELECT key, blob_id, expiration, metadata FROM _mf_entries ORDER BY key")?;
        let entries = statement
            .query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, Option<i64>>(2)?, r.get(3)?))
            })?
            .collect::<rusqlite::Result<Vec<(String, String, Option<i64>, Option<String>)>>>()?;
        let bar = crate::progress::count(&format!("KV namespace {title}"), entries.len() as u64);
        let (mut imported, mut skipped) = (0, 0);
        for (key, blob, expiration_ms, metadata) in entries {
            bar.inc(1);
            if expiration_ms.is_some_and(|at| at <= now_ms) {
                continue;
            }
            let bytes = std::fs::read(blobs.join(&blob)).with_context(|| format!("reading the value of {key}"))?;
            if kv.head(&namespace.id, &key).await?.is_some_and(|e| e.size == bytes.len() as u64) {
                skipped += 1;
                continue;
            }
            let options = kura_kv::PutOptions {
                expiration: expiration_ms.map(|ms| ms / 1000),
                metadata,
                size: Some(bytes.len() as u64),
            };
            let body = futures_util::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from(bytes))]);
            kv.put(&namespace.id, &key, body, options).await.with_context(|| format!("importing the key {key}"))?;
            imported += 1;
        }
        bar.finish_and_clear();
        println!(
            "KV namespace {} (id {}): {imported} key(s) imported, {skipped} already here",
            namespace.title, namespace.id
        );
        report.kv_keys += imported;
        report.kv_keys_skipped += skipped;
    }
    Ok(())
}

struct MiniflareObject {
    key: String,
    blob: Option<String>,
    size: u64,
    http: HttpMetadata,
    custom: BTreeMap<String, String>,
}

fn read_objects(conn: &Connection) -> anyhow::Result<Vec<MiniflareObject>> {
    let mut statement =
        conn.prepare("SELECT key, blob_id, size, http_metadata, custom_metadata FROM _mf_objects ORDER BY key")?;
    let rows = statement.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, Option<String>>(1)?,
            r.get::<_, i64>(2)?,
            r.get::<_, String>(3)?,
            r.get::<_, String>(4)?,
        ))
    })?;
    let mut objects = Vec::new();
    for row in rows {
        let (key, blob, size, http, custom) = row?;
        let http: serde_json::Value = serde_json::from_str(&http).unwrap_or_default();
        let text = |field: &str| http.get(field).and_then(|v| v.as_str()).map(str::to_owned);
        let expires = http
            .get("cacheExpiry")
            .and_then(|v| v.as_str().map(str::to_owned).or_else(|| v.as_i64().map(|ms| ms.to_string())));
        objects.push(MiniflareObject {
            key,
            blob,
            size: size.max(0) as u64,
            http: HttpMetadata {
                content_type: text("contentType"),
                content_language: text("contentLanguage"),
                content_disposition: text("contentDisposition"),
                content_encoding: text("contentEncoding"),
                cache_control: text("cacheControl"),
                expires,
            },
            custom: serde_json::from_str(&custom).unwrap_or_default(),
        });
    }
    Ok(objects)
}

/// The blobs of a completed multipart object, in part order.
fn parts(conn: &Connection, key: &str) -> anyhow::Result<Vec<String>> {
    let mut statement =
        conn.prepare("SELECT blob_id FROM _mf_multipart_parts WHERE object_key = ?1 ORDER BY part_number")?;
    let blobs = statement.query_map([key], |r| r.get(0))?.collect::<Result<Vec<String>, _>>()?;
    Ok(blobs)
}

/// Durable Objects: `do/<script>-<class>/<id>.sqlite` into the namespace `<script>_<class>`
/// (created for workerd to run), each object copied with SQLite's backup and listed by the
/// name Miniflare's wrapper recorded (`__miniflare_do_name`), if any.
async fn import_durable_objects(state: &Path, local: &Local, report: &mut Report) -> anyhow::Result<()> {
    let catalog = local.node.catalog();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(state.join("do"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    for dir in dirs {
        let unique_key = dir.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let (script, class) = match unique_key.rsplit_once('-') {
            Some((script, class)) if kura_catalog::is_valid_script_name(script) => {
                (script.to_owned(), class.to_owned())
            }
            _ => {
                println!("Durable Objects in {}: no Worker name in the key '{unique_key}'; skipped", dir.display());
                continue;
            }
        };
        let files = object_files(&dir);
        if files.is_empty() {
            continue;
        }
        let namespace = match catalog.do_namespace(&local.account, &format!("{script}_{class}"))? {
            Some(ns) => ns,
            None => catalog.create_hosted_do_namespace(&local.account, &script, &class, &unique_key)?,
        };
        if namespace.host != HOST_WORKERD || namespace.unique_key != unique_key {
            println!(
                "Durable Objects of {script}'s {class}: the namespace {} is kura's own or keyed otherwise; skipped",
                namespace.name
            );
            continue;
        }
        let target = local.node.dir().join("do").join(&namespace.id).join("workerd");
        std::fs::create_dir_all(&target)?;
        let ids = IdFactory::new(&unique_key);
        let engine = kura_server::engine_namespace(&namespace)?;
        let (mut imported, mut skipped) = (0, 0);
        for (id, path) in files {
            let copy = target.join(format!("{id}.sqlite"));
            if copy.exists() {
                skipped += 1;
                continue;
            }
            let source = open_read_only(&path)?;
            let name: Option<String> = source
                .query_row("SELECT name FROM __miniflare_do_name WHERE id = 1", [], |r| r.get(0))
                .optional()
                .unwrap_or(None);
            // A consistent copy (the WAL folded in), made whole before it takes its name.
            let partial = target.join(format!("{id}.sqlite.import"));
            let _ = std::fs::remove_file(&partial);
            source.backup(rusqlite::MAIN_DB, &partial, None::<fn(rusqlite::backup::Progress)>)?;
            Connection::open(&partial)?.pragma_update(None, "journal_mode", "WAL")?;
            std::fs::rename(&partial, &copy)?;
            let object = match name.as_deref() {
                Some(name) if ids.id_from_name(name).to_string() == id => engine.id_from_name(name),
                _ => engine.id_from_string(&id)?,
            };
            local.node.durable_objects().register(&engine, &object).await?;
            imported += 1;
        }
        let metadata = dir.join("metadata.sqlite");
        if metadata.is_file() && !target.join("metadata.sqlite").exists() {
            open_read_only(&metadata)?.backup(
                rusqlite::MAIN_DB,
                target.join("metadata.sqlite"),
                None::<fn(rusqlite::backup::Progress)>,
            )?;
        }
        println!(
            "Durable Objects of {script}'s {class} (namespace {}): {imported} imported, {skipped} already here",
            namespace.name
        );
        report.durable_objects += imported;
        report.durable_objects_skipped += skipped;
    }
    Ok(())
}
