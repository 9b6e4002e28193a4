//! kura's Queues engine: each queue is one SQLite file (`<root>/<queue id>/queue.sqlite`) of
//! messages, owned by one actor of a [`kura_sqlite::Registry`].
//!
//! - A send is answered once its messages are committed (`synchronous=FULL`): an acknowledged
//!   message survives a crash.
//! - A delivery leases messages: in one commit, before anyone sees them, each gets a new lease
//!   id, its `attempts` counted, and a time until which no one else is given it. An
//!   acknowledgement (by lease id) deletes the message; a retry makes it visible again after
//!   its delay; a lease that runs out makes it visible again by itself. So every message is
//!   delivered at least once, through crashes of kura and of the consumer, and `attempts` counts
//!   deliveries. A late acknowledgement is still taken while no one else holds the message.
//! - Messages are delivered oldest first among those visible (a delayed or retried message
//!   when its time comes).

#![deny(missing_docs)]

mod error;

use std::path::PathBuf;
use std::sync::Arc;

use kura_sqlite::{DatabaseOptions, HistorySettings, Placement, PlacementError, Registry, RegistrySettings};
use rusqlite::{Connection, OptionalExtension};

pub use crate::error::{QueueError, Result};

/// Largest message body, in bytes (Cloudflare counts 1 KB as 1,000 bytes).
pub const MAX_MESSAGE_BYTES: usize = 128_000;
/// Largest batch, in bytes.
pub const MAX_BATCH_BYTES: usize = 256_000;
/// Most messages in one batch (a send, a delivery, a pull).
pub const MAX_BATCH_MESSAGES: usize = 100;
/// Longest delay, in seconds (12 hours).
pub const MAX_DELAY_SECONDS: u32 = 43_200;

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS messages (
        seq          INTEGER PRIMARY KEY,
        id           TEXT NOT NULL,
        body         BLOB NOT NULL,
        content_type TEXT NOT NULL,
        sent_ms      INTEGER NOT NULL,
        visible_ms   INTEGER NOT NULL,
        attempts     INTEGER NOT NULL DEFAULT 0,
        lease        TEXT
    );
    CREATE INDEX IF NOT EXISTS messages_by_visibility ON messages (visible_ms, seq);
    -- How many messages and bytes the queue holds, kept by the triggers below: a send answers
    -- with them, and counting the rows each time cost a scan of the whole queue per send.
    CREATE TABLE IF NOT EXISTS totals (
        id    INTEGER PRIMARY KEY CHECK (id = 1),
        count INTEGER NOT NULL,
        bytes INTEGER NOT NULL
    );
    INSERT OR IGNORE INTO totals
        SELECT 1, count(*), coalesce(sum(length(body)), 0) FROM messages;
    CREATE TRIGGER IF NOT EXISTS totals_on_insert AFTER INSERT ON messages BEGIN
        UPDATE totals SET count = count + 1, bytes = bytes + length(NEW.body) WHERE id = 1;
    END;
    CREATE TRIGGER IF NOT EXISTS totals_on_delete AFTER DELETE ON messages BEGIN
        UPDATE totals SET count = count - 1, bytes = bytes - length(OLD.body) WHERE id = 1;
    END;
";

/// The time in milliseconds since the Unix epoch, as this engine sees it.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// How a message's body is encoded, as the producer said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentType {
    /// UTF-8 text.
    Text,
    /// JSON text.
    Json,
    /// Raw bytes.
    Bytes,
    /// V8's serialization (only a Worker can read it).
    V8,
}

impl ContentType {
    /// Parses a content type (case-insensitively, as workerd does).
    pub fn parse(text: &str) -> Result<ContentType> {
        match text.to_ascii_lowercase().as_str() {
            "text" => Ok(ContentType::Text),
            "json" => Ok(ContentType::Json),
            "bytes" => Ok(ContentType::Bytes),
            "v8" => Ok(ContentType::V8),
            _ => Err(QueueError::InvalidContentType(text.to_owned())),
        }
    }

    /// The name Cloudflare uses.
    pub fn as_str(self) -> &'static str {
        match self {
            ContentType::Text => "text",
            ContentType::Json => "json",
            ContentType::Bytes => "bytes",
            ContentType::V8 => "v8",
        }
    }
}

/// A message to send.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// Its body, encoded as `content_type` says.
    pub body: Vec<u8>,
    /// How the body is encoded.
    pub content_type: ContentType,
    /// Seconds before it may be delivered; `None` takes the send's default.
    pub delay_seconds: Option<u32>,
}

/// A message being delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// 32 hex characters.
    pub id: String,
    /// Its body.
    pub body: Vec<u8>,
    /// How the body is encoded.
    pub content_type: ContentType,
    /// When it was sent, in milliseconds since the Unix epoch.
    pub sent_ms: i64,
    /// Deliveries so far, this one included.
    pub attempts: u32,
    /// This delivery's lease: what acknowledges or retries it.
    pub lease_id: String,
}

/// Where spent messages go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterTo<'a> {
    /// Nowhere: they are dropped (and logged).
    Drop,
    /// Into this queue (its id).
    Queue(&'a str),
    /// Into the queue of this name, which does not exist (any more): they stay, visible again
    /// every [`KEEP_SPENT_MS`] until it does.
    Missing(&'a str),
}

/// How long spent messages whose dead-letter queue is missing wait before they are looked at
/// again.
pub const KEEP_SPENT_MS: i64 = 60_000;

/// A message as it waits in its queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peeked {
    /// 32 hex characters.
    pub id: String,
    /// Its body.
    pub body: Vec<u8>,
    /// How the body is encoded.
    pub content_type: ContentType,
    /// When it was sent (ms).
    pub sent_ms: i64,
    /// Deliveries so far.
    pub attempts: u32,
    /// When it may next be delivered (ms).
    pub visible_ms: i64,
    /// Whether a consumer holds it now.
    pub in_flight: bool,
}

/// What a queue holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Backlog {
    /// Messages not yet acknowledged.
    pub count: u64,
    /// Their bodies' bytes.
    pub bytes: u64,
    /// When the oldest was sent (ms), if any.
    pub oldest_ms: Option<i64>,
    /// Messages leased to a consumer now.
    pub in_flight: u64,
    /// Messages waiting out a delay (a send's or a retry's).
    pub delayed: u64,
}

/// Checks a message against the limits.
pub fn check_message(message: &NewMessage) -> Result<()> {
    if message.body.len() > MAX_MESSAGE_BYTES {
        return Err(QueueError::MessageTooLarge(message.body.len()));
    }
    if let Some(delay) = message.delay_seconds.filter(|d| *d > MAX_DELAY_SECONDS) {
        return Err(QueueError::InvalidDelay(delay.to_string()));
    }
    Ok(())
}

/// Parses a delay in seconds as a client sent it.
pub fn parse_delay(text: &str) -> Result<u32> {
    match text.trim().parse::<u32>() {
        Ok(delay) if delay <= MAX_DELAY_SECONDS => Ok(delay),
        _ => Err(QueueError::InvalidDelay(text.to_owned())),
    }
}

fn new_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the operating system's random source failed");
    hex::encode(bytes)
}

fn valid_queue_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

fn system_clock() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

/// The Queues engine of one data directory.
#[derive(Clone)]
pub struct Queues {
    registry: Registry,
    root: PathBuf,
    clock: Clock,
    /// In a cluster, which node owns each queue's file (`None` alone).
    placement: Option<Arc<dyn Placement>>,
    /// Queues this node took over whose leases nobody has released since ([`Queues::took_over`]).
    taken_over: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    /// Queues whose file this process has brought to the current schema.
    current: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl Queues {
    /// Opens the engine over `root` (created if missing); in a cluster, `placement` says which
    /// queues this node owns, and each commit to one ships before it is acknowledged.
    pub fn open(
        root: PathBuf,
        settings: RegistrySettings,
        placement: Option<Arc<dyn Placement>>,
    ) -> std::io::Result<Queues> {
        std::fs::create_dir_all(&root)?;
        let opener_root = root.clone();
        let opener_placement = placement.clone();
        let registry = Registry::new(settings, move |queue: &str| {
            let dir = opener_root.join(queue);
            if !valid_queue_id(queue) || !dir.is_dir() {
                return None;
            }
            let options = DatabaseOptions::new(dir.join("queue.sqlite")).create(true);
            match &opener_placement {
                // A queue this node does not own (any more) is not opened here.
                Some(placement) => placement
                    .shipper(queue)
                    .map(|shipper| options.history(HistorySettings::shipped_only(), queue).shipper(shipper)),
                None => Some(options),
            }
        });
        Ok(Queues {
            registry,
            root,
            clock: Arc::new(system_clock),
            placement,
            taken_over: Arc::default(),
            current: Arc::default(),
        })
    }

    /// In a cluster, makes sure this node may serve the queue — it owns it, its file holding
    /// everything the store does — or says where it is served. Alone, a no-op.
    pub async fn claim(&self, queue: &str) -> std::result::Result<(), PlacementError> {
        let Some(placement) = &self.placement else { return Ok(()) };
        if !valid_queue_id(queue) || placement.is_current(queue) {
            return Ok(());
        }
        std::fs::create_dir_all(self.root.join(queue))
            .map_err(|e| PlacementError::Unavailable(format!("creating the queue's directory: {e}")))?;
        // Whatever an earlier ownership left open goes before the file is rebuilt.
        let (registry, key) = (self.registry.clone(), queue.to_owned());
        let release_file = Box::pin(async move { registry.close(&key).await });
        placement.claim(queue, &self.root.join(queue).join("queue.sqlite"), release_file).await?;
        self.current.lock().unwrap_or_else(|p| p.into_inner()).remove(queue);
        self.taken_over.lock().unwrap_or_else(|p| p.into_inner()).insert(queue.to_owned());
        Ok(())
    }

    /// Whether this node took the queue over (or made it) since this was last asked: the leases
    /// it holds were then made by deliveries of the node that had it, which died or gave it up,
    /// and are the new owner's to release ([`Queues::release_leases`]).
    pub fn took_over(&self, queue: &str) -> bool {
        self.taken_over.lock().unwrap_or_else(|p| p.into_inner()).remove(queue)
    }

    /// In a cluster: the node last named as the queue's owner did not serve it; look again
    /// next time.
    pub fn forget_owner(&self, queue: &str) {
        if let Some(placement) = &self.placement {
            placement.forget_owner(queue);
        }
    }

    /// Why a queue's file could not be opened: it is gone, or (in a cluster) this node's
    /// ownership of it ended since the request was placed.
    fn missing(&self, queue: &str) -> QueueError {
        match self.owns(queue) {
            true => QueueError::NotFound,
            false => QueueError::Unavailable("this node's ownership of the queue ended; retry shortly".into()),
        }
    }

    /// Whether this node serves the queue now (always, alone).
    pub fn owns(&self, queue: &str) -> bool {
        self.placement.as_ref().is_none_or(|p| p.is_current(queue))
    }

    /// The same engine, telling time by `clock` (tests move it).
    pub fn with_clock(self, clock: Clock) -> Queues {
        Queues { clock, ..self }
    }

    /// Now, in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        (self.clock)()
    }

    /// The storage's figures, for `/metrics`.
    pub fn stats(&self) -> &kura_sqlite::Stats {
        self.registry.stats()
    }

    /// Queue files open now.
    pub fn open_queues(&self) -> usize {
        self.registry.open_count()
    }

    /// Creates a queue's file.
    pub async fn create_queue(&self, queue: &str) -> Result<()> {
        if !valid_queue_id(queue) {
            return Err(QueueError::NotFound);
        }
        std::fs::create_dir_all(self.root.join(queue)).map_err(QueueError::Io)?;
        self.claim(queue).await.map_err(|e| QueueError::Unavailable(e.to_string()))?;
        self.make_current(queue).await
    }

    /// Removes a queue's file and every message in it.
    pub async fn delete_queue(&self, queue: &str) -> Result<()> {
        self.current.lock().unwrap_or_else(|p| p.into_inner()).remove(queue);
        self.registry.retire(queue).await;
        if let Some(placement) = &self.placement {
            placement.release(queue).await;
        }
        match std::fs::remove_dir_all(self.root.join(queue)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(QueueError::Io(e)),
            _ => Ok(()),
        }
    }

    /// The queues that have a file here.
    pub fn queue_dirs(&self) -> Vec<String> {
        std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| valid_queue_id(name))
            .collect()
    }

    /// Removes the files of the queues of `dirs` not in `known` (left by a deletion a crash cut
    /// short). List `dirs` before reading `known` from the catalog: a queue created in between
    /// is then in neither, not taken for the leftover of a deleted one.
    pub async fn remove_unknown(&self, dirs: Vec<String>, known: &std::collections::HashSet<String>) -> usize {
        let mut removed = 0;
        for name in dirs.into_iter().filter(|d| !known.contains(d)) {
            if self.delete_queue(&name).await.is_ok() {
                removed += 1;
            }
        }
        removed
    }

    /// Brings a queue's file to the current schema, once per process (a file made by an
    /// earlier kura may lack what came since).
    async fn make_current(&self, queue: &str) -> Result<()> {
        if self.current.lock().unwrap_or_else(|p| p.into_inner()).contains(queue) {
            return Ok(());
        }
        self.write_unchecked(queue, |tx| Ok(tx.execute_batch(SCHEMA)?)).await?;
        self.current.lock().unwrap_or_else(|p| p.into_inner()).insert(queue.to_owned());
        Ok(())
    }

    async fn write<T, F>(&self, queue: &str, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&Connection) -> Result<T> + Send + 'static,
    {
        self.make_current(queue).await?;
        self.write_unchecked(queue, f).await
    }

    async fn write_unchecked<T, F>(&self, queue: &str, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&Connection) -> Result<T> + Send + 'static,
    {
        if !valid_queue_id(queue) {
            return Err(QueueError::NotFound);
        }
        match self.registry.write_grouped(queue, f).await {
            Ok(outcome) => outcome,
            // No such file (the opener found none), or a queue deleted under the request.
            Err(kura_sqlite::Error::Closed) => Err(self.missing(queue)),
            Err(e @ kura_sqlite::Error::Superseded { .. }) => Err(QueueError::Unavailable(format!(
                "another node took this queue over; the request did not take effect ({e})"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Sends messages, each delayed by its own delay or else `default_delay` seconds; answers
    /// once they are durable, with the queue's totals after them ([`Queues::totals`]).
    pub async fn send(&self, queue: &str, messages: Vec<NewMessage>, default_delay: u32) -> Result<Backlog> {
        if messages.is_empty() || messages.len() > MAX_BATCH_MESSAGES {
            return Err(QueueError::BatchCount(messages.len()));
        }
        for message in &messages {
            check_message(message)?;
        }
        let total: usize = messages.iter().map(|m| m.body.len()).sum();
        if total > MAX_BATCH_BYTES {
            return Err(QueueError::BatchTooLarge(total));
        }
        let now = self.now_ms();
        let rows: Vec<(String, NewMessage)> = messages.into_iter().map(|m| (new_id(), m)).collect();
        self.write(queue, move |tx| {
            let mut insert = tx.prepare_cached(
                "INSERT INTO messages (id, body, content_type, sent_ms, visible_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for (id, m) in &rows {
                let visible = now + i64::from(m.delay_seconds.unwrap_or(default_delay)) * 1000;
                insert.execute((id, &m.body, m.content_type.as_str(), now, visible))?;
            }
            totals(tx)
        })
        .await
    }

    /// Leases up to `max` visible messages, oldest first, for `lease_ms`: they are not given to
    /// anyone else until acknowledged, retried or the lease runs out.
    pub async fn lease(&self, queue: &str, max: usize, lease_ms: i64) -> Result<Vec<Message>> {
        let now = self.now_ms();
        let max = max.clamp(1, MAX_BATCH_MESSAGES) as i64;
        self.write(queue, move |tx| {
            let picked: Vec<(i64, String, Vec<u8>, String, i64, u32)> = tx
                .prepare_cached(
                    "SELECT seq, id, body, content_type, sent_ms, attempts FROM messages \
                     WHERE visible_ms <= ?1 ORDER BY visible_ms, seq LIMIT ?2",
                )?
                .query_map((now, max), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)))?
                .collect::<rusqlite::Result<_>>()?;
            let mut update = tx.prepare_cached(
                "UPDATE messages SET attempts = attempts + 1, visible_ms = ?2, lease = ?3 WHERE seq = ?1",
            )?;
            let mut leased = Vec::with_capacity(picked.len());
            for (seq, id, body, content_type, sent_ms, attempts) in picked {
                let lease_id = lease_id(seq);
                update.execute((seq, now + lease_ms, &lease_id))?;
                let content_type = ContentType::parse(&content_type).unwrap_or(ContentType::Bytes);
                leased.push(Message { id, body, content_type, sent_ms, attempts: attempts + 1, lease_id });
            }
            Ok(leased)
        })
        .await
    }

    /// Settles deliveries by lease: each acknowledged one is deleted, each retried one is
    /// visible again after its delay. A lease no longer held (its message was given to another
    /// since, or is gone) is skipped. Answers how many were acknowledged and retried.
    pub async fn settle(&self, queue: &str, acks: Vec<String>, retries: Vec<(String, u32)>) -> Result<(usize, usize)> {
        let now = self.now_ms();
        self.write(queue, move |tx| {
            let mut acked = 0;
            let mut delete = tx.prepare_cached("DELETE FROM messages WHERE seq = ?1 AND lease = ?2")?;
            for (seq, lease) in acks.iter().filter_map(|l| lease_seq(l)) {
                acked += delete.execute((seq, lease))?;
            }
            let mut retried = 0;
            let mut retry =
                tx.prepare_cached("UPDATE messages SET visible_ms = ?3, lease = NULL WHERE seq = ?1 AND lease = ?2")?;
            for (lease, delay) in &retries {
                if let Some((seq, lease)) = lease_seq(lease) {
                    retried += retry.execute((seq, lease, now + i64::from(*delay) * 1000))?;
                }
            }
            Ok((acked, retried))
        })
        .await
    }

    /// Gives leased messages back without counting the delivery (it never reached a consumer:
    /// workerd was not running, say), visible again after `delay_ms`.
    pub async fn unlease(&self, queue: &str, leases: Vec<String>, delay_ms: i64) -> Result<usize> {
        let now = self.now_ms();
        self.write(queue, move |tx| {
            let mut update = tx.prepare_cached(
                "UPDATE messages SET attempts = max(attempts - 1, 0), visible_ms = ?3, lease = NULL WHERE seq = ?1 AND lease = ?2",
            )?;
            let mut released = 0;
            for (seq, lease) in leases.iter().filter_map(|l| lease_seq(l)) {
                released += update.execute((seq, lease, now + delay_ms))?;
            }
            Ok(released)
        })
        .await
    }

    /// Takes leased messages out of the queue (to be dead-lettered), answering those still
    /// held by the leases given.
    pub async fn take(&self, queue: &str, leases: Vec<String>) -> Result<Vec<Message>> {
        self.write(queue, move |tx| {
            let mut taken = Vec::new();
            let mut delete = tx.prepare_cached("DELETE FROM messages WHERE seq = ?1 AND lease = ?2")?;
            for lease in &leases {
                if let Some(message) = held_by(tx, lease)? {
                    let (seq, held) = lease_seq(lease).expect("a held lease parses");
                    delete.execute((seq, held))?;
                    taken.push(message);
                }
            }
            Ok(taken)
        })
        .await
    }

    /// Puts messages into this queue as they were (their ids and send times), visible now and
    /// with no delivery counted: a dead-letter queue receiving another queue's spent messages.
    pub async fn requeue(&self, queue: &str, messages: Vec<Message>) -> Result<()> {
        let now = self.now_ms();
        self.write(queue, move |tx| {
            let mut insert = tx.prepare_cached(
                "INSERT INTO messages (id, body, content_type, sent_ms, visible_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for m in &messages {
                insert.execute((&m.id, &m.body, m.content_type.as_str(), m.sent_ms, now))?;
            }
            Ok(())
        })
        .await
    }

    /// Messages that had their last delivery leave `queue` as `to` says: into a dead-letter
    /// queue (written there first, so a crash between leaves a copy in both, never a loss), or
    /// dropped and logged — or they stay, visible again later (their dead-letter queue is gone).
    pub async fn dead_letter(&self, queue: &str, to: DeadLetterTo<'_>, messages: Vec<Message>) -> Result<()> {
        if messages.is_empty() {
            return Ok(());
        }
        match to {
            DeadLetterTo::Queue(target) => self.requeue(target, messages.clone()).await?,
            DeadLetterTo::Missing(name) => {
                tracing::warn!(
                    queue,
                    dead_letter_queue = name,
                    "the dead-letter queue does not exist; its messages wait for it"
                );
                let leases = messages.into_iter().map(|m| m.lease_id).collect();
                self.unlease(queue, leases, KEEP_SPENT_MS).await?;
                return Ok(());
            }
            DeadLetterTo::Drop => {
                for message in &messages {
                    tracing::warn!(
                        queue,
                        message = message.id,
                        attempts = message.attempts,
                        "dropped a message after its last retry (the consumer has no dead-letter queue)"
                    );
                }
            }
        }
        self.take(queue, messages.into_iter().map(|m| m.lease_id).collect()).await?;
        Ok(())
    }

    /// The messages the leases given still hold, as they are.
    pub async fn held(&self, queue: &str, leases: Vec<String>) -> Result<Vec<Message>> {
        self.read(queue, move |conn| {
            let mut held = Vec::new();
            for lease in &leases {
                held.extend(held_by(conn, lease)?);
            }
            Ok(held)
        })
        .await
    }

    /// Up to `limit` messages, oldest first, as they are (nothing leased or counted): what an
    /// operator looks at.
    pub async fn peek(&self, queue: &str, limit: usize) -> Result<Vec<Peeked>> {
        let now = self.now_ms();
        self.read(queue, move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT id, body, content_type, sent_ms, attempts, visible_ms, lease IS NOT NULL FROM messages \
                     ORDER BY seq LIMIT ?1",
                )?
                .query_map([limit as i64], |r| {
                    let content_type: String = r.get(2)?;
                    let visible_ms: i64 = r.get(5)?;
                    let leased: bool = r.get(6)?;
                    Ok(Peeked {
                        id: r.get(0)?,
                        body: r.get(1)?,
                        content_type: ContentType::parse(&content_type).unwrap_or(ContentType::Bytes),
                        sent_ms: r.get(3)?,
                        attempts: r.get(4)?,
                        in_flight: leased && visible_ms > now,
                        visible_ms,
                    })
                })?
                .collect::<rusqlite::Result<_>>()?)
        })
        .await
    }

    /// Makes every leased message visible again now (a delivery that died with the process
    /// that made it is not waited out).
    pub async fn release_leases(&self, queue: &str) -> Result<usize> {
        let now = self.now_ms();
        self.write(queue, move |tx| {
            Ok(tx.execute("UPDATE messages SET visible_ms = ?1, lease = NULL WHERE lease IS NOT NULL", [now])?)
        })
        .await
    }

    /// Deletes every message.
    pub async fn purge(&self, queue: &str) -> Result<usize> {
        self.write(queue, |tx| Ok(tx.execute("DELETE FROM messages", [])?)).await
    }

    /// How many messages and bytes the queue holds, and when its oldest was sent: cheap (kept
    /// as messages come and go), for every send's answer and every delivery's metadata.
    pub async fn totals(&self, queue: &str) -> Result<Backlog> {
        self.read(queue, totals).await
    }

    /// What the queue holds now, with what is in flight and delayed (a scan of the queue: for
    /// operators, not for every request).
    pub async fn backlog(&self, queue: &str) -> Result<Backlog> {
        let now = self.now_ms();
        self.read(queue, move |conn| backlog(conn, now)).await
    }

    /// How many messages could be delivered now, counting up to `up_to`, and the earliest
    /// moment (ms) any message became or becomes visible: a delivery loop's two questions.
    pub async fn ready(&self, queue: &str, up_to: usize) -> Result<(usize, Option<i64>)> {
        let now = self.now_ms();
        self.read(queue, move |conn| {
            let visible: usize = conn.query_row(
                "SELECT count(*) FROM (SELECT 1 FROM messages WHERE visible_ms <= ?1 LIMIT ?2)",
                (now, up_to as i64),
                |r| r.get(0),
            )?;
            let earliest: Option<i64> = conn.query_row("SELECT min(visible_ms) FROM messages", [], |r| r.get(0))?;
            Ok((visible, earliest))
        })
        .await
    }

    async fn read<T, F>(&self, queue: &str, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        self.make_current(queue).await?;
        match self.registry.with_database(queue, move |db| db.with_internal(f)).await {
            Ok(outcome) => outcome,
            // No such file (the opener found none), or a queue deleted under the request.
            Err(kura_sqlite::Error::Closed) => Err(self.missing(queue)),
            Err(e @ kura_sqlite::Error::Superseded { .. }) => Err(QueueError::Unavailable(format!(
                "another node took this queue over; the request did not take effect ({e})"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Closes every queue file.
    pub async fn shutdown(&self) {
        self.registry.shutdown().await;
    }
}

/// A lease id: the message's row and a random part, so a settlement finds the row by its key.
fn lease_id(seq: i64) -> String {
    format!("{seq:x}-{}", new_id())
}

/// The row a lease id names, and the id itself (as stored); `None` for what no lease looks like.
fn lease_seq(lease: &str) -> Option<(i64, &str)> {
    let (seq, _) = lease.split_once('-')?;
    Some((i64::from_str_radix(seq, 16).ok()?, lease))
}

/// The message `lease` holds now, if it still does.
fn held_by(conn: &Connection, lease: &str) -> Result<Option<Message>> {
    let Some((seq, lease)) = lease_seq(lease) else { return Ok(None) };
    let found = conn
        .prepare_cached("SELECT id, body, content_type, sent_ms, attempts FROM messages WHERE seq = ?1 AND lease = ?2")?
        .query_row((seq, lease), |r| {
            Ok((r.get::<_, String>(0)?, r.get(1)?, r.get::<_, String>(2)?, r.get(3)?, r.get(4)?))
        })
        .optional()?;
    Ok(found.map(|(id, body, content_type, sent_ms, attempts)| Message {
        id,
        body,
        content_type: ContentType::parse(&content_type).unwrap_or(ContentType::Bytes),
        sent_ms,
        attempts,
        lease_id: lease.to_owned(),
    }))
}

fn totals(conn: &Connection) -> Result<Backlog> {
    let (count, bytes) = conn
        .prepare_cached("SELECT count, bytes FROM totals WHERE id = 1")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
        .unwrap_or((0, 0));
    let oldest_ms = conn
        .prepare_cached("SELECT sent_ms FROM messages ORDER BY seq LIMIT 1")?
        .query_row([], |r| r.get(0))
        .optional()?;
    Ok(Backlog { count, bytes, oldest_ms, ..Backlog::default() })
}

fn backlog(conn: &Connection, now: i64) -> Result<Backlog> {
    Ok(conn.query_row(
        "SELECT count(*), coalesce(sum(length(body)), 0), min(sent_ms), \
         count(*) FILTER (WHERE lease IS NOT NULL AND visible_ms > ?1), \
         count(*) FILTER (WHERE lease IS NULL AND visible_ms > ?1) FROM messages",
        [now],
        |r| {
            Ok(Backlog {
                count: r.get(0)?,
                bytes: r.get(1)?,
                oldest_ms: r.get(2)?,
                in_flight: r.get(3)?,
                delayed: r.get(4)?,
            })
        },
    )?)
}

#[cfg(test)]
mod tests;
