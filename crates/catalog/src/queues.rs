//! The registry of Queues: which account owns which queue, under which id (also its storage
//! id), its settings, and its consumer.

use rusqlite::OptionalExtension;
use serde::Deserialize;
use serde_json::{Value as Json, json};

use crate::{Catalog, Error, Result, now_iso, random_hex};

/// Most queues an account may hold (Cloudflare's limit).
pub const MAX_QUEUES: u64 = 10_000;

/// A queue as the catalog records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queue {
    /// 32 hex characters: the API's `queue_id` and its storage's name.
    pub id: String,
    /// The owning account.
    pub account_id: String,
    /// The name, unique within the account.
    pub name: String,
    /// ISO 8601 creation time.
    pub created_on: String,
    /// ISO 8601 time of the last change to its settings or consumers.
    pub modified_on: String,
    /// Seconds every message waits before delivery, unless its send says otherwise.
    pub delivery_delay: u32,
    /// Seconds a message is kept undelivered.
    pub retention_seconds: u32,
    /// Whether deliveries are paused.
    pub delivery_paused: bool,
}

/// How a queue's messages are consumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConsumer {
    /// 32 hex characters.
    pub id: String,
    /// The queue.
    pub queue_id: String,
    /// `worker` (pushed to a Worker's `queue` handler) or `http_pull`.
    pub kind: String,
    /// The Worker, for a `worker` consumer.
    pub script: Option<String>,
    /// The settings as the API shows them (`batch_size`, `max_retries`, `max_wait_time_ms`,
    /// `max_concurrency`, `retry_delay`, `visibility_timeout_ms`), as JSON text.
    pub settings: String,
    /// The queue that takes messages past their retries, by name.
    pub dead_letter_queue: Option<String>,
    /// ISO 8601 creation time.
    pub created_on: String,
}

/// A consumer's settings, as the API takes and shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerSettings {
    /// Most messages in one delivery (1–100).
    pub batch_size: u32,
    /// Retries before a message is dead-lettered (0–100).
    pub max_retries: u32,
    /// Longest a push waits to fill a batch, in ms (0–60,000).
    pub max_wait_time_ms: u32,
    /// Most deliveries in flight at once to a Worker (1–250; unset: kura's default).
    pub max_concurrency: Option<u32>,
    /// Seconds a retried message waits (0–43,200).
    pub retry_delay: u32,
    /// How long a pulled message is leased, in ms (1–43,200,000).
    pub visibility_timeout_ms: u32,
}

/// Settings as sent: numbers, possibly fractional (wrangler sends `max_wait_time_ms` as 1,000 ×
/// `max_batch_timeout`, which may be 1.1), rounded here.
#[derive(Deserialize, Default)]
struct RawSettings {
    batch_size: Option<f64>,
    max_retries: Option<f64>,
    max_wait_time_ms: Option<f64>,
    max_concurrency: Option<f64>,
    retry_delay: Option<f64>,
    visibility_timeout_ms: Option<f64>,
}

/// A sent number as a whole one (out of range stays out of range: negative to 0 is refused
/// below as below its floor only when the floor is above 0).
fn whole(value: Option<f64>) -> Option<u32> {
    value.map(|v| if v.is_finite() { v.round().clamp(0.0, f64::from(u32::MAX)) as u32 } else { u32::MAX })
}

/// Concurrent deliveries to one Worker when its consumer sets no `max_concurrency`.
pub const DEFAULT_CONCURRENCY: u32 = 16;

impl ConsumerSettings {
    /// Reads settings from the API's JSON (`null` or absent fields take Cloudflare's defaults
    /// for `kind`), refusing values out of bounds.
    pub fn parse(kind: &str, settings: Option<&Json>) -> Result<ConsumerSettings, String> {
        let raw: RawSettings = match settings {
            None | Some(Json::Null) => RawSettings::default(),
            Some(value) => {
                serde_json::from_value(value.clone()).map_err(|e| format!("invalid consumer settings: {e}"))?
            }
        };
        let pull = kind == "http_pull";
        if [
            raw.batch_size,
            raw.max_retries,
            raw.max_wait_time_ms,
            raw.max_concurrency,
            raw.retry_delay,
            raw.visibility_timeout_ms,
        ]
        .iter()
        .flatten()
        .any(|v| *v < 0.0)
        {
            return Err("The specified consumer settings are invalid: settings must not be negative".into());
        }
        let settings = ConsumerSettings {
            batch_size: whole(raw.batch_size).unwrap_or(if pull { 5 } else { 10 }),
            max_retries: whole(raw.max_retries).unwrap_or(3),
            max_wait_time_ms: whole(raw.max_wait_time_ms).unwrap_or(5_000),
            max_concurrency: whole(raw.max_concurrency),
            retry_delay: whole(raw.retry_delay).unwrap_or(0),
            visibility_timeout_ms: whole(raw.visibility_timeout_ms).unwrap_or(30_000),
        };
        let bounds = [
            ("batch_size", settings.batch_size, 1, 100),
            ("max_retries", settings.max_retries, 0, 100),
            ("max_wait_time_ms", settings.max_wait_time_ms, 0, 60_000),
            ("max_concurrency", settings.max_concurrency.unwrap_or(1), 1, 250),
            ("retry_delay", settings.retry_delay, 0, 43_200),
            ("visibility_timeout_ms", settings.visibility_timeout_ms, 1, 43_200_000),
        ];
        for (name, value, low, high) in bounds {
            if !(low..=high).contains(&value) {
                return Err(format!(
                    "The specified consumer settings are invalid: {name} must be from {low} to {high}"
                ));
            }
        }
        Ok(settings)
    }

    /// The settings as stored and shown.
    pub fn to_json(&self, kind: &str) -> Json {
        match kind {
            "http_pull" => json!({
                "batch_size": self.batch_size,
                "max_retries": self.max_retries,
                "retry_delay": self.retry_delay,
                "visibility_timeout_ms": self.visibility_timeout_ms,
            }),
            _ => json!({
                "batch_size": self.batch_size,
                "max_retries": self.max_retries,
                "max_wait_time_ms": self.max_wait_time_ms,
                "max_concurrency": self.max_concurrency,
                "retry_delay": self.retry_delay,
            }),
        }
    }

    /// The settings a stored consumer has.
    pub fn of(consumer: &QueueConsumer) -> ConsumerSettings {
        let stored = serde_json::from_str::<Json>(&consumer.settings).ok();
        ConsumerSettings::parse(&consumer.kind, stored.as_ref())
            .unwrap_or_else(|_| ConsumerSettings::parse(&consumer.kind, None).expect("the defaults are in bounds"))
    }
}

/// Whether a message delivered `attempts` times has had every delivery `settings` allows.
pub fn spent(attempts: u32, settings: &ConsumerSettings) -> bool {
    attempts > settings.max_retries
}

/// Whether a message just leased for its `attempts`th delivery is past them all: its earlier
/// deliveries ended without a verdict (their leases ran out, or their process died), so it is
/// dead-lettered rather than delivered.
pub fn spent_on_lease(attempts: u32, settings: &ConsumerSettings) -> bool {
    spent(attempts.saturating_sub(1), settings)
}

/// Where a consumer's spent messages go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetter {
    /// The consumer names no dead-letter queue: they are dropped.
    Dropped,
    /// Into this queue.
    Queue(Queue),
    /// The consumer names a queue that does not exist (any more): they are kept until it does.
    Missing(String),
}

/// Cloudflare's rule for queue names: 1 to 63 of `a-z`, `0-9` and `-`, not starting or
/// ending with `-`.
pub fn is_valid_queue_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

const COLUMNS: &str =
    "id, account_id, name, created_on, modified_on, delivery_delay, retention_seconds, delivery_paused";

fn queue_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Queue> {
    Ok(Queue {
        id: row.get(0)?,
        account_id: row.get(1)?,
        name: row.get(2)?,
        created_on: row.get(3)?,
        modified_on: row.get(4)?,
        delivery_delay: row.get(5)?,
        retention_seconds: row.get(6)?,
        delivery_paused: row.get(7)?,
    })
}

const CONSUMER_COLUMNS: &str = "id, queue_id, kind, script, settings, dead_letter_queue, created_on";

fn consumer_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<QueueConsumer> {
    Ok(QueueConsumer {
        id: row.get(0)?,
        queue_id: row.get(1)?,
        kind: row.get(2)?,
        script: row.get(3)?,
        settings: row.get(4)?,
        dead_letter_queue: row.get(5)?,
        created_on: row.get(6)?,
    })
}

impl Catalog {
    /// Registers a new queue for an account.
    pub fn create_queue(
        &self,
        account_id: &str,
        name: &str,
        delivery_delay: u32,
        retention_seconds: u32,
    ) -> Result<Queue> {
        if !is_valid_queue_name(name) {
            return Err(Error::Invalid(format!(
                "invalid queue name '{name}': use 1 to 63 lowercase letters, digits or '-', not starting or ending with '-'"
            )));
        }
        let now = now_iso();
        let queue = Queue {
            id: random_hex(16),
            account_id: account_id.to_owned(),
            name: name.to_owned(),
            created_on: now.clone(),
            modified_on: now,
            delivery_delay,
            retention_seconds,
            delivery_paused: false,
        };
        self.write_checked(|tx| {
            let storage = |e| self.storage(e);
            let count: u64 = tx
                .query_row("SELECT count(*) FROM queues WHERE account_id = ?1", [account_id], |r| r.get(0))
                .map_err(storage)?;
            if count >= MAX_QUEUES {
                return Err(Error::LimitReached { what: "queues per account", limit: MAX_QUEUES });
            }
            let taken = tx
                .query_row("SELECT 1 FROM queues WHERE account_id = ?1 AND name = ?2", [account_id, name], |_| Ok(()))
                .optional()
                .map_err(storage)?;
            if taken.is_some() {
                return Err(Error::Duplicate { kind: "queue" });
            }
            tx.execute(
                &format!("INSERT INTO queues ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
                (
                    &queue.id,
                    &queue.account_id,
                    &queue.name,
                    &queue.created_on,
                    &queue.modified_on,
                    queue.delivery_delay,
                    queue.retention_seconds,
                    queue.delivery_paused,
                ),
            )
            .map_err(storage)?;
            Ok(())
        })?;
        Ok(queue)
    }

    /// The account's queue with this id, or else with this name.
    pub fn queue(&self, account_id: &str, id_or_name: &str) -> Result<Option<Queue>> {
        self.remembered(&self.queues_seen, format!("{account_id}\0{id_or_name}"), || {
            self.read_found(|c| {
                c.prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM queues WHERE account_id = ?1 AND (id = lower(?2) OR name = ?2) \
                     ORDER BY id = lower(?2) DESC LIMIT 1"
                ))?
                .query_row([account_id, id_or_name], queue_from_row)
                .optional()
            })
        })
    }

    /// The account's queues by name.
    pub fn list_queues(&self, account_id: &str) -> Result<Vec<Queue>> {
        self.read_current(|c| {
            c.prepare_cached(&format!("SELECT {COLUMNS} FROM queues WHERE account_id = ?1 ORDER BY name"))?
                .query_map([account_id], queue_from_row)?
                .collect()
        })
    }

    /// Every queue of every account (for the start-up sweep and the deliveries).
    pub fn all_queues(&self) -> Result<Vec<Queue>> {
        self.read(|c| {
            c.prepare_cached(&format!("SELECT {COLUMNS} FROM queues ORDER BY id"))?
                .query_map([], queue_from_row)?
                .collect()
        })
    }

    /// Changes a queue's settings; `None` if the account has no such queue.
    pub fn update_queue(
        &self,
        account_id: &str,
        id: &str,
        delivery_delay: u32,
        retention_seconds: u32,
        delivery_paused: bool,
    ) -> Result<Option<Queue>> {
        let changed = self.write(|tx| {
            tx.execute(
                "UPDATE queues SET delivery_delay = ?3, retention_seconds = ?4, delivery_paused = ?5, modified_on = ?6 \
                 WHERE account_id = ?1 AND id = ?2",
                (account_id, id, delivery_delay, retention_seconds, delivery_paused, now_iso()),
            )
        })?;
        if changed == 0 {
            return Ok(None);
        }
        self.queue(account_id, id)
    }

    /// Forgets a queue and its consumer; false if the account had no such queue.
    pub fn delete_queue(&self, account_id: &str, id: &str) -> Result<bool> {
        let changed = self.write(|tx| {
            tx.execute(
                "DELETE FROM queue_consumers WHERE queue_id = (SELECT id FROM queues WHERE account_id = ?1 AND id = ?2)",
                [account_id, id],
            )?;
            tx.execute("DELETE FROM queues WHERE account_id = ?1 AND id = ?2", [account_id, id])
        })?;
        Ok(changed == 1)
    }

    /// The queue's consumers (at most one).
    pub fn queue_consumers(&self, queue_id: &str) -> Result<Vec<QueueConsumer>> {
        self.read(|c| {
            c.prepare_cached(&format!(
                "SELECT {CONSUMER_COLUMNS} FROM queue_consumers WHERE queue_id = ?1 ORDER BY created_on"
            ))?
            .query_map([queue_id], consumer_from_row)?
            .collect()
        })
    }

    /// Every queue's consumer, of every account (for the delivery loops).
    pub fn all_queue_consumers(&self) -> Result<Vec<QueueConsumer>> {
        self.read(|c| {
            c.prepare_cached(&format!("SELECT {CONSUMER_COLUMNS} FROM queue_consumers ORDER BY id"))?
                .query_map([], consumer_from_row)?
                .collect()
        })
    }

    /// Sets the queue's consumer: replaces `replacing` (a consumer id), or adds one if the queue
    /// has none. A queue has one consumer at a time.
    pub fn set_queue_consumer(
        &self,
        queue_id: &str,
        replacing: Option<&str>,
        kind: &str,
        script: Option<&str>,
        settings: &str,
        dead_letter_queue: Option<&str>,
    ) -> Result<QueueConsumer> {
        let consumer = QueueConsumer {
            id: replacing.map_or_else(|| random_hex(16), str::to_owned),
            queue_id: queue_id.to_owned(),
            kind: kind.to_owned(),
            script: script.map(str::to_owned),
            settings: settings.to_owned(),
            dead_letter_queue: dead_letter_queue.map(str::to_owned),
            created_on: now_iso(),
        };
        self.write_checked(|tx| {
            let storage = |e| self.storage(e);
            let existing: Option<String> = tx
                .query_row("SELECT id FROM queue_consumers WHERE queue_id = ?1", [queue_id], |r| r.get(0))
                .optional()
                .map_err(storage)?;
            match (&existing, replacing) {
                (Some(found), Some(asked)) if found == asked => {}
                (None, None) => {}
                (Some(_), _) => {
                    return Err(Error::Conflict("the queue already has a consumer; remove it first".into()));
                }
                (None, Some(_)) => return Err(Error::Invalid("the queue has no such consumer".into())),
            }
            tx.execute("DELETE FROM queue_consumers WHERE queue_id = ?1", [queue_id]).map_err(storage)?;
            tx.execute(
                &format!("INSERT INTO queue_consumers ({CONSUMER_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
                (
                    &consumer.id,
                    &consumer.queue_id,
                    &consumer.kind,
                    &consumer.script,
                    &consumer.settings,
                    &consumer.dead_letter_queue,
                    &consumer.created_on,
                ),
            )
            .map_err(storage)?;
            tx.execute("UPDATE queues SET modified_on = ?2 WHERE id = ?1", (queue_id, now_iso())).map_err(storage)?;
            Ok(())
        })?;
        Ok(consumer)
    }

    /// Where `consumer`'s spent messages go.
    pub fn dead_letter_target(&self, queue: &Queue, consumer: &QueueConsumer) -> Result<DeadLetter> {
        let Some(name) = consumer.dead_letter_queue.as_deref() else { return Ok(DeadLetter::Dropped) };
        Ok(match self.queue(&queue.account_id, name)? {
            Some(target) if target.name == name => DeadLetter::Queue(target),
            _ => DeadLetter::Missing(name.to_owned()),
        })
    }

    /// Removes a queue's consumer; false if it had no such consumer.
    pub fn delete_queue_consumer(&self, queue_id: &str, consumer_id: &str) -> Result<bool> {
        let changed = self.write(|tx| {
            tx.execute("DELETE FROM queue_consumers WHERE queue_id = ?1 AND id = ?2", [queue_id, consumer_id])
        })?;
        Ok(changed == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_and_their_one_consumer() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path().join("catalog.sqlite")).unwrap();
        let account = catalog.create_account(None, "me").unwrap();
        let queue = catalog.create_queue(&account.id, "jobs", 0, 345_600).unwrap();
        assert!(matches!(catalog.create_queue(&account.id, "jobs", 0, 60), Err(Error::Duplicate { .. })));
        assert!(matches!(catalog.create_queue(&account.id, "Jobs", 0, 60), Err(Error::Invalid(_))));
        assert_eq!(catalog.queue(&account.id, "jobs").unwrap().unwrap().id, queue.id);
        assert_eq!(catalog.queue(&account.id, &queue.id).unwrap().unwrap().name, "jobs");
        let consumer = catalog.set_queue_consumer(&queue.id, None, "http_pull", None, "{}", None).unwrap();
        assert_eq!(ConsumerSettings::of(&consumer).visibility_timeout_ms, 30_000);
        assert!(ConsumerSettings::parse("worker", Some(&json!({"batch_size": 101}))).is_err());
        let fractional = ConsumerSettings::parse("worker", Some(&json!({"max_wait_time_ms": 1100.0000000000002})));
        assert_eq!(fractional.unwrap().max_wait_time_ms, 1100);
        assert!(ConsumerSettings::parse("worker", Some(&json!({"max_retries": -1}))).is_err());
        assert!(matches!(
            catalog.set_queue_consumer(&queue.id, None, "worker", Some("w"), "{}", None),
            Err(Error::Conflict(_))
        ));
        let replaced =
            catalog.set_queue_consumer(&queue.id, Some(&consumer.id), "worker", Some("w"), "{}", Some("dlq")).unwrap();
        assert_eq!((replaced.id.as_str(), replaced.kind.as_str()), (consumer.id.as_str(), "worker"));
        assert_eq!(catalog.queue_consumers(&queue.id).unwrap().len(), 1);
        assert!(catalog.delete_queue(&account.id, &queue.id).unwrap());
        assert!(catalog.queue_consumers(&queue.id).unwrap().is_empty());
        assert!(!catalog.delete_queue(&account.id, &queue.id).unwrap());
    }
}
