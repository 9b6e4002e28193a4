//! The v4 API's JSON for what the engines and the catalog hold — a bucket, an R2 object, a
//! Durable Object namespace and object, a statement's cursor, a fan-out, a Worker script —
//! written once, for the handlers and for the CLI's local commands, which print what the API
//! would answer.

use serde::Serialize;
use serde::ser::SerializeStruct;
use serde_json::{Value as Json, json};

use kura_catalog::{DoNamespace, R2Bucket, WorkerSchedule, WorkerScript};
use kura_d1::wire::JsonRows;
use kura_do::{Cursor, FanOutRow, ObjectSummary};
use kura_r2::ObjectInfo;
use kura_workers::StoredVersion;

/// A bucket as the v4 API lists it.
pub fn bucket_json(bucket: &R2Bucket) -> Json {
    json!({
        "name": bucket.name,
        "creation_date": bucket.created_at,
        "location": bucket.location.as_deref().map(str::to_ascii_uppercase).unwrap_or_else(|| "ENAM".into()),
        "storage_class": bucket.storage_class,
    })
}

/// An R2 object as the v4 API shows it.
pub fn r2_object_json(info: &ObjectInfo) -> Json {
    json!({
        "key": info.key,
        "version": info.version,
        "size": info.size,
        "etag": info.etag,
        "http_etag": info.http_etag(),
        "uploaded": jiff::Timestamp::from_millisecond(info.uploaded_ms).map(|t| t.to_string()).unwrap_or_default(),
        "http_metadata": info.http,
        "custom_metadata": info.custom,
        "storage_class": info.storage_class,
    })
}

/// A namespace as the API shows it.
pub fn namespace_json(ns: &DoNamespace) -> Json {
    json!({
        "id": ns.id,
        "name": ns.name,
        "script": ns.script,
        "class": ns.class_name,
        "use_sqlite": ns.use_sqlite,
        "unique_key": ns.unique_key,
        "host": ns.host,
        "alarm_url": ns.alarm_url,
        "created_on": ns.created_at,
    })
}

/// An object as the listing shows it: Cloudflare's `{id, hasStoredData}`, its name and size.
pub fn do_object_json(o: &ObjectSummary) -> Json {
    json!({
        "id": o.entry.id,
        "name": o.entry.name,
        "hasStoredData": o.stored_bytes > 0,
        "stored_bytes": o.stored_bytes,
        "created_on": jiff::Timestamp::from_millisecond(o.entry.created_ms).map(|t| t.to_string()).unwrap_or_default(),
    })
}

/// A statement's answer: `{columns, rows, meta: {rows_read, rows_written}}`, written straight
/// from the cursor (no tree of JSON values built and dropped per request).
pub struct CursorJson<'a>(pub &'a Cursor);

impl Serialize for CursorJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Meta {
            rows_read: u64,
            rows_written: u64,
        }
        let cursor = self.0;
        let mut out = s.serialize_struct("Cursor", 3)?;
        out.serialize_field("columns", &cursor.columns)?;
        out.serialize_field("rows", &JsonRows(&cursor.rows))?;
        out.serialize_field("meta", &Meta { rows_read: cursor.rows_read, rows_written: cursor.rows_written })?;
        out.end()
    }
}

/// [`CursorJson`] as a JSON value.
pub fn cursor_json(cursor: &Cursor) -> Json {
    serde_json::to_value(CursorJson(cursor)).unwrap_or(Json::Null)
}

/// A fan-out's answer: each object's rows (or error), tagged with its id and name.
pub fn fan_out_json(rows: &[FanOutRow]) -> Json {
    let results: Vec<Json> = rows
        .iter()
        .map(|row| {
            let mut item = json!({ "id": row.object.id, "name": row.object.name });
            match &row.outcome {
                Ok(cursor) => {
                    item["columns"] = json!(cursor.columns);
                    item["rows"] = cursor_json(cursor)["rows"].take();
                }
                Err(e) => item["error"] = json!(e.to_string()),
            }
            item
        })
        .collect();
    json!({ "consistent_snapshot": false, "objects": results })
}

/// A script as `GET /workers/scripts` lists it.
pub fn script_json(script: &WorkerScript, stored: Option<&StoredVersion>) -> Json {
    let mut out = json!({
        "id": script.name,
        "tag": script.id,
        "etag": stored.map(|v| v.etag.as_str()).unwrap_or(""),
        "handlers": ["fetch"],
        "named_handlers": [],
        "created_on": script.created_on,
        "modified_on": script.modified_on,
        "usage_model": stored.map(|v| v.usage_model.as_str()).unwrap_or("standard"),
        "compatibility_date": stored.and_then(|v| v.compatibility_date.as_deref()),
        "compatibility_flags": stored.map(|v| v.compatibility_flags.clone()).unwrap_or_default(),
        "last_deployed_from": "wrangler",
        "has_assets": stored.is_some_and(|v| v.has_assets),
        "has_modules": stored.is_some_and(|v| v.main_module.is_some()),
        "logpush": false,
    });
    if let Some(tag) = &script.migration_tag {
        out["migration_tag"] = json!(tag);
    }
    out
}

/// A Cron Trigger as `…/schedules` lists it.
pub fn schedule_json(schedule: &WorkerSchedule) -> Json {
    json!({ "cron": schedule.cron, "created_on": schedule.created_on, "modified_on": schedule.modified_on })
}

/// A KV namespace as the v4 API shows it.
pub fn kv_namespace_json(ns: &kura_catalog::KvNamespace) -> Json {
    json!({"id": ns.id, "title": ns.title, "supports_url_encoding": true})
}

/// A key of a KV listing as the v4 API shows it: `expiration` in seconds and `metadata` as
/// JSON, each only when the key has one.
pub fn kv_key_json(entry: &kura_kv::Entry) -> Json {
    let mut key = json!({"name": entry.key});
    if let Some(at) = entry.expiration {
        key["expiration"] = json!(at);
    }
    if let Some(metadata) = entry.metadata.as_deref().and_then(|m| serde_json::from_str::<Json>(m).ok()) {
        key["metadata"] = metadata;
    }
    key
}

/// A KV key's metadata as JSON (`null` when it has none).
pub fn kv_metadata_json(entry: &kura_kv::Entry) -> Json {
    entry.metadata.as_deref().and_then(|m| serde_json::from_str(m).ok()).unwrap_or(Json::Null)
}

/// A KV bulk read's values by key: each value, or with metadata `{value, metadata}` (and the
/// v4 API's `expiration`, when `with_expiration`); a missing key's is `null`.
pub fn kv_bulk_values(
    found: Vec<kura_kv::BulkValue>,
    with_metadata: bool,
    with_expiration: bool,
) -> serde_json::Map<String, Json> {
    found
        .into_iter()
        .map(|(key, value)| {
            let value = match (value, with_metadata) {
                (None, _) => Json::Null,
                (Some((value, _)), false) => value,
                (Some((value, entry)), true) => {
                    let mut shaped = json!({"value": value, "metadata": kv_metadata_json(&entry)});
                    if let (true, Some(at)) = (with_expiration, entry.expiration) {
                        shaped["expiration"] = json!(at);
                    }
                    shaped
                }
            };
            (key, value)
        })
        .collect()
}

/// A queue's consumer as the v4 API shows it (wrangler reads `script`, and `type`).
pub fn queue_consumer_json(queue: &kura_catalog::Queue, consumer: &kura_catalog::QueueConsumer) -> Json {
    let settings: Json = serde_json::from_str(&consumer.settings).unwrap_or(Json::Null);
    let mut shown = json!({
        "consumer_id": consumer.id,
        "type": consumer.kind,
        "queue_id": queue.id,
        "queue_name": queue.name,
        "created_on": consumer.created_on,
        "settings": settings,
    });
    if let Some(script) = &consumer.script {
        shown["script"] = json!(script);
        shown["script_name"] = json!(script);
    }
    if let Some(dlq) = &consumer.dead_letter_queue {
        shown["dead_letter_queue"] = json!(dlq);
    }
    shown
}

/// A queue as the v4 API shows it, with its consumers and the Workers producing to it (the
/// arrays and their counts always present: wrangler reads them).
pub fn queue_json(
    queue: &kura_catalog::Queue,
    consumers: &[kura_catalog::QueueConsumer],
    producers: &[String],
) -> Json {
    json!({
        "queue_id": queue.id,
        "queue_name": queue.name,
        "created_on": queue.created_on,
        "modified_on": queue.modified_on,
        "producers": producers.iter().map(|script| json!({"type": "worker", "script": script})).collect::<Vec<_>>(),
        "producers_total_count": producers.len(),
        "consumers": consumers.iter().map(|c| queue_consumer_json(queue, c)).collect::<Vec<_>>(),
        "consumers_total_count": consumers.len(),
        "settings": {
            "delivery_delay": queue.delivery_delay,
            "delivery_paused": queue.delivery_paused,
            "message_retention_period": queue.retention_seconds,
        },
    })
}
