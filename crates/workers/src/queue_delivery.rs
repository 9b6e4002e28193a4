//! Pushing queues' messages to their consumer Workers: one loop per queue whose consumer is a
//! deployed Worker, which leases a batch once `batch_size` messages are ready or the oldest has
//! waited `max_wait_time_ms`, has workerd run the Worker's `queue` handler with it (through the
//! script's handler trigger and `Fetcher.queue()`), and settles each message as the handler's
//! result says: acknowledged ones deleted, retried ones visible again after their delay, spent
//! ones to the dead-letter queue. Up to `max_concurrency` batches are in flight per queue.
//!
//! A message is deleted only once its acknowledgement is in: a batch cut short by a crash (of
//! kura or of workerd) is delivered again, its `attempts` counted. When kura starts, the leases
//! a previous process held are released at once rather than waited out.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{Notify, Semaphore};

use kura_catalog::{ConsumerSettings, DEFAULT_CONCURRENCY, DeadLetter, Queue, QueueConsumer, spent, spent_on_lease};
use kura_queues::{DeadLetterTo, Message, Queues};

use crate::version::Binding;
use crate::{Result, Workers};

/// How long a pushed batch is leased: Cloudflare's longest consumer invocation (15 minutes).
const PUSH_LEASE_MS: i64 = 15 * 60 * 1000;

/// How often the consumers are looked at again even with no change announced.
const RESCAN: Duration = Duration::from_secs(30);

/// How often a node that does not own a queue with a consumer looks whether it should.
const OWNER_POLL: Duration = Duration::from_secs(2);

/// How long a handler may run on a batch before the batch is retried (a little under its lease,
/// so no one else is given the batch meanwhile).
const HANDLER_LIMIT: Duration = Duration::from_millis(PUSH_LEASE_MS as u64 - 30_000);

/// How long a batch that could not reach workerd (not running, restarting) waits, uncounted.
const UNDELIVERED_BACKOFF_MS: i64 = 1_000;

/// What wakes the delivery loops: a change to queues or consumers, or a send to a queue.
#[derive(Default)]
pub(crate) struct Signals {
    changed: Notify,
    sent: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Signals {
    fn for_queue(&self, queue_id: &str) -> Arc<Notify> {
        let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(sent.entry(queue_id.to_owned()).or_default())
    }
}

/// What a consumer's `queue` handler answered (workerd's `FetcherQueueResult`).
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Outcome {
    outcome: String,
    #[serde(default)]
    ack_all: bool,
    #[serde(default)]
    retry_batch: RetryBatch,
    #[serde(default)]
    explicit_acks: Vec<String>,
    #[serde(default)]
    retry_messages: Vec<RetryMessage>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RetryBatch {
    #[serde(default)]
    retry: bool,
    #[serde(default)]
    delay_seconds: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RetryMessage {
    msg_id: String,
    #[serde(default)]
    delay_seconds: Option<u32>,
}

/// What becomes of each message of a batch: acknowledged, or retried after a delay.
enum Verdict {
    Ack,
    Retry(u32),
}

impl Outcome {
    /// A message-level call wins over a batch-level one; explicitly acknowledged messages are
    /// kept even when the handler throws (Cloudflare's documented rule); otherwise a handler
    /// that returned acknowledges the batch and one that failed retries it.
    fn verdict(&self, id: &str, retry_delay: u32) -> Verdict {
        if let Some(retry) = self.retry_messages.iter().find(|r| r.msg_id == id) {
            return Verdict::Retry(retry.delay_seconds.or(self.retry_batch.delay_seconds).unwrap_or(retry_delay));
        }
        if self.explicit_acks.iter().any(|a| a == id) || self.ack_all {
            return Verdict::Ack;
        }
        if self.retry_batch.retry || self.outcome != "ok" {
            return Verdict::Retry(self.retry_batch.delay_seconds.unwrap_or(retry_delay));
        }
        Verdict::Ack
    }
}

/// One consumer the loops serve.
#[derive(Clone)]
struct Consumer {
    queue: Queue,
    consumer: QueueConsumer,
    script_id: String,
}

impl Consumer {
    /// What, if it changes, restarts the queue's loop.
    fn signature(&self) -> String {
        format!(
            "{}|{}|{}|{:?}|{:?}|{}",
            self.consumer.id,
            self.script_id,
            self.consumer.settings,
            self.consumer.script,
            self.consumer.dead_letter_queue,
            self.queue.delivery_paused
        )
    }
}

impl Workers {
    /// Queues or their consumers changed: the delivery loops look again.
    pub fn queues_changed(&self) {
        self.inner.deliveries.changed.notify_one();
    }

    /// Messages were sent to the queue: its delivery loop wakes.
    pub fn queue_sent(&self, queue_id: &str) {
        self.inner.deliveries.for_queue(queue_id).notify_one();
    }

    /// For each queue of the account, by name, the deployed Workers with a producer binding to
    /// it, by name (each deployed version read once, however many queues are shown).
    pub fn queue_producers(&self, account_id: &str) -> Result<HashMap<String, Vec<String>>> {
        let mut producers: HashMap<String, Vec<String>> = HashMap::new();
        for script in self.served_scripts()?.into_iter().filter(|s| s.account_id == account_id) {
            for binding in &script.version.bindings {
                if let Binding::Queue { queue_name, .. } = binding {
                    let names = producers.entry(queue_name.clone()).or_default();
                    if !names.contains(&script.name) {
                        names.push(script.name.clone());
                    }
                }
            }
        }
        producers.values_mut().for_each(|names| names.sort());
        Ok(producers)
    }

    /// Delivers the queues' messages to their consumer Workers until `shutdown`.
    pub async fn run_queue_consumers(self, queues: Queues, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut running: HashMap<String, (String, tokio::task::JoinHandle<()>)> = HashMap::new();
        let mut released: HashSet<String> = HashSet::new();
        loop {
            let wanted = match self.worker_consumers() {
                Ok(wanted) => wanted,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the queues' consumers");
                    Vec::new()
                }
            };
            let wanted_ids: HashSet<String> = wanted.iter().map(|c| c.queue.id.clone()).collect();
            running.retain(|queue_id, (_, task)| {
                let keep = wanted_ids.contains(queue_id) && !task.is_finished();
                if !keep {
                    task.abort();
                }
                keep
            });
            for consumer in wanted {
                let signature = consumer.signature();
                if running.get(&consumer.queue.id).is_some_and(|(s, _)| *s == signature) {
                    continue;
                }
                if let Some((_, task)) = running.remove(&consumer.queue.id) {
                    task.abort();
                }
                // The leases of a process that died (this one's predecessor) are not waited out.
                let release = released.insert(consumer.queue.id.clone());
                let queue_id = consumer.queue.id.clone();
                let task = tokio::spawn(self.clone().consume(queues.clone(), consumer, release));
                running.insert(queue_id, (signature, task));
            }
            tokio::select! {
                _ = &mut shutdown => break,
                _ = self.inner.deliveries.changed.notified() => {}
                _ = tokio::time::sleep(RESCAN) => {}
            }
        }
        for (_, (_, task)) in running {
            task.abort();
        }
    }

    /// Every queue whose consumer is a deployed Worker of the queue's account.
    fn worker_consumers(&self) -> Result<Vec<Consumer>> {
        let catalog = &self.inner.catalog;
        let queues: HashMap<String, Queue> = catalog.all_queues()?.into_iter().map(|q| (q.id.clone(), q)).collect();
        let mut found = Vec::new();
        for consumer in catalog.all_queue_consumers()?.into_iter().filter(|c| c.kind == "worker") {
            let (Some(queue), Some(script)) = (queues.get(&consumer.queue_id), consumer.script.as_deref()) else {
                continue;
            };
            let Some(deployed) =
                catalog.worker_script(&queue.account_id, script)?.filter(|s| s.deployed_version.is_some())
            else {
                continue;
            };
            found.push(Consumer { queue: queue.clone(), consumer, script_id: deployed.id });
        }
        Ok(found)
    }

    /// One queue's loop. In a cluster the queue's owner delivers: the loop waits until this
    /// node is it (taking the queue over when no live node has it), and waits again if that
    /// ends.
    async fn consume(self, queues: Queues, consumer: Consumer, mut release: bool) {
        let queue_id = consumer.queue.id.clone();
        loop {
            if let Err(e) = queues.claim(&queue_id).await {
                tracing::debug!(queue = consumer.queue.name, error = %e, "not delivering: the queue is served elsewhere");
                tokio::time::sleep(OWNER_POLL).await;
                continue;
            }
            // The leases of deliveries that died with the process or the node that made them
            // (this one's predecessor, or the queue's last owner) are not waited out: at start,
            // and after each takeover ([`Queues::took_over`]), not when a loop restarts here
            // (new settings, a pause lifted) with batches of its own out. A node that lost the
            // queue a moment and took it back releases its own batches too: they come again,
            // as at least once allows.
            if (std::mem::take(&mut release) | queues.took_over(&queue_id))
                && let Err(e) = queues.release_leases(&queue_id).await
            {
                tracing::warn!(queue = consumer.queue.name, error = %e, "cannot release the previous deliveries' leases");
            }
            if consumer.queue.delivery_paused {
                return;
            }
            self.deliver_while_owner(&queues, &consumer).await;
        }
    }

    /// Delivers the queue's messages for as long as this node owns it.
    async fn deliver_while_owner(&self, queues: &Queues, consumer: &Consumer) {
        let queue_id = consumer.queue.id.clone();
        let settings = ConsumerSettings::of(&consumer.consumer);
        let batch_size = settings.batch_size as usize;
        let wait_ms = i64::from(settings.max_wait_time_ms);
        let slots = Arc::new(Semaphore::new(settings.max_concurrency.unwrap_or(DEFAULT_CONCURRENCY) as usize));
        let sent = self.inner.deliveries.for_queue(&queue_id);
        loop {
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
            let (ready, earliest) = match queues.ready(&queue_id, batch_size).await {
                Ok(found) => found,
                Err(_) if !queues.owns(&queue_id) => return,
                Err(e) => {
                    tracing::warn!(queue = consumer.queue.name, error = %e, "cannot read the queue; retrying");
                    drop(slot);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            let now = queues.now_ms();
            // A full batch goes at once; a partial one once its oldest message has waited.
            let due = match earliest {
                Some(_) if ready >= batch_size => Some(now),
                Some(earliest) if ready > 0 => Some(earliest + wait_ms),
                Some(earliest) => Some(earliest),
                None => None,
            };
            if ready > 0 && due.is_some_and(|d| d <= now) {
                match queues.lease(&queue_id, batch_size, PUSH_LEASE_MS).await {
                    Ok(leased) if !leased.is_empty() => {
                        let (workers, queues, consumer, settings) =
                            (self.clone(), queues.clone(), consumer.clone(), settings.clone());
                        tokio::spawn(async move {
                            workers.deliver(&queues, &consumer, &settings, leased).await;
                            drop(slot);
                        });
                    }
                    Ok(_) => drop(slot),
                    Err(_) if !queues.owns(&queue_id) => return,
                    Err(e) => {
                        tracing::warn!(queue = consumer.queue.name, error = %e, "cannot lease a batch; retrying");
                        drop(slot);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
                continue;
            }
            drop(slot);
            let sleep =
                due.map_or(Duration::from_secs(3600), |d| Duration::from_millis((d - now).clamp(1, 3_600_000) as u64));
            tokio::select! {
                _ = sent.notified() => {}
                _ = tokio::time::sleep(sleep) => {}
            }
        }
    }

    /// Runs the consumer's `queue` handler with one leased batch and settles it.
    async fn deliver(&self, queues: &Queues, consumer: &Consumer, settings: &ConsumerSettings, leased: Vec<Message>) {
        let queue = &consumer.queue;
        let (spent_already, batch): (Vec<Message>, Vec<Message>) =
            leased.into_iter().partition(|m| spent_on_lease(m.attempts, settings));
        self.dead_letter(queues, consumer, spent_already).await;
        if batch.is_empty() {
            return;
        }
        let backlog = queues.backlog(&queue.id).await.unwrap_or_default();
        let body = json!({
            "queue": queue.name,
            "messages": batch.iter().map(|m| json!({
                "id": m.id,
                "timestamp": m.sent_ms,
                "attempts": m.attempts,
                "contentType": m.content_type.as_str(),
                "body": base64::engine::general_purpose::STANDARD.encode(&m.body),
            })).collect::<Vec<_>>(),
            "metrics": {
                "backlogCount": backlog.count,
                "backlogBytes": backlog.bytes,
                "oldestMessageTimestamp": backlog.oldest_ms.unwrap_or(0),
            },
        });
        let started = Instant::now();
        let call = self.call_trigger(&consumer.script_id, "/queue", &body, "delivering a batch");
        let outcome: Outcome = match tokio::time::timeout(HANDLER_LIMIT, call).await {
            Ok(Ok(outcome)) => outcome,
            // The handler ran past its limit: the batch is retried, the delivery counted.
            Err(_) => {
                tracing::warn!(queue = queue.name, "a queue handler ran past its limit; the batch is retried");
                Outcome { outcome: "exceededWallTime".into(), ..Default::default() }
            }
            // It never reached the handler: the messages go back uncounted, a little later.
            Ok(Err(e)) => {
                tracing::warn!(queue = queue.name, error = %e, "a batch could not reach its consumer; it waits");
                let leases = batch.into_iter().map(|m| m.lease_id).collect();
                if let Err(e) = queues.unlease(&queue.id, leases, UNDELIVERED_BACKOFF_MS).await {
                    tracing::warn!(queue = queue.name, error = %e, "cannot give a batch back; its lease will run out");
                }
                return;
            }
        };
        let (mut acks, mut retries, mut spent_now) = (Vec::new(), Vec::new(), Vec::new());
        for message in batch {
            match outcome.verdict(&message.id, settings.retry_delay) {
                Verdict::Ack => acks.push(message.lease_id),
                Verdict::Retry(_) if spent(message.attempts, settings) => spent_now.push(message),
                Verdict::Retry(delay) => retries.push((message.lease_id, delay)),
            }
        }
        let total = acks.len() + retries.len() + spent_now.len();
        let acked = acks.len();
        self.dead_letter(queues, consumer, spent_now).await;
        if let Err(e) = queues.settle(&queue.id, acks, retries).await {
            tracing::warn!(queue = queue.name, error = %e, "cannot settle a batch; its messages will be delivered again");
        }
        tracing::info!(
            queue = queue.name,
            outcome = outcome.outcome,
            duration_ms = started.elapsed().as_millis() as u64,
            "QUEUE {} {acked}/{total}",
            queue.name
        );
        self.queue_sent(&queue.id);
    }

    async fn dead_letter(&self, queues: &Queues, consumer: &Consumer, spent: Vec<Message>) {
        if spent.is_empty() {
            return;
        }
        let target = match self.inner.catalog.dead_letter_target(&consumer.queue, &consumer.consumer) {
            Ok(target) => target,
            Err(e) => {
                // Left leased: they come back when the lease runs out.
                tracing::warn!(queue = consumer.queue.name, error = %e, "cannot find the dead-letter queue; retrying later");
                return;
            }
        };
        let to = match &target {
            DeadLetter::Dropped => DeadLetterTo::Drop,
            DeadLetter::Queue(target) => DeadLetterTo::Queue(&target.id),
            DeadLetter::Missing(name) => DeadLetterTo::Missing(name),
        };
        match queues.dead_letter(&consumer.queue.id, to, spent).await {
            Ok(()) => {
                if let DeadLetter::Queue(target) = &target {
                    self.queue_sent(&target.id);
                }
            }
            Err(e) => tracing::warn!(queue = consumer.queue.name, error = %e, "cannot dead-letter spent messages"),
        }
    }
}
