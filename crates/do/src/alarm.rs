//! Alarms: each object's one alarm lives in its own file (`_cf_METADATA`, as workerd keeps it)
//! and is authoritative; each namespace's index keeps a schedule that may run early but never
//! late. The [`AlarmRunner`] watches the schedules, checks each due alarm against its object,
//! hands it to a [`Deliver`] (an HTTP POST, or a Rust object's `alarm()`), and on failure
//! retries with Durable Objects' backoff: 2 s, 4 s, 8 s… up to six retries, then gives up.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::Result;
use crate::index::{self, DueAlarm};
use crate::{DurableObjects, Namespace, ObjectId, now_ms};

/// Retries after the first failure before an alarm is given up.
pub const MAX_RETRIES: u32 = 6;
/// The first retry's delay; each later one doubles it.
pub const FIRST_RETRY: Duration = Duration::from_secs(2);

/// What an alarm handler is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlarmInvocation {
    /// The object.
    pub id: ObjectId,
    /// When it was scheduled to run, Unix milliseconds.
    pub scheduled_ms: i64,
    /// How many attempts failed before this one.
    pub retry_count: u32,
}

impl AlarmInvocation {
    /// Whether an earlier attempt failed.
    pub fn is_retry(&self) -> bool {
        self.retry_count > 0
    }
}

pub use crate::BoxFuture;

/// Why an alarm's delivery failed; the alarm is retried.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeliveryError {
    /// There is no handler to deliver to (the namespace is gone, or names none).
    #[error("{0}")]
    NoHandler(&'static str),
    /// The handler's URL could not be reached, or did not answer in time.
    #[error("POST {url}: {source}")]
    Unreachable {
        /// The handler's URL.
        url: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The handler's URL answered with a failure.
    #[error("POST {url} answered {status}")]
    Answered {
        /// The handler's URL.
        url: String,
        /// Its status, as HTTP words it.
        status: String,
    },
    /// The handler ran and failed (it threw).
    #[error("{0}")]
    Handler(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Runs an alarm's handler. `Err` is a failed attempt (retried), with why.
pub trait Deliver: Send + Sync + 'static {
    /// Delivers one alarm of the namespace `ns` (its storage id given) and reports the outcome.
    fn deliver(
        &self,
        ns: &Namespace,
        alarm: AlarmInvocation,
    ) -> BoxFuture<'static, std::result::Result<(), DeliveryError>>;
}

/// Watches the schedules of a set of namespaces and delivers their alarms.
pub struct AlarmRunner {
    engine: DurableObjects,
    deliver: Arc<dyn Deliver>,
    in_flight: Arc<Mutex<HashSet<String>>>,
}

impl AlarmRunner {
    /// A runner delivering through `deliver`.
    pub fn new(engine: DurableObjects, deliver: Arc<dyn Deliver>) -> Self {
        AlarmRunner { engine, deliver, in_flight: Arc::new(Mutex::new(HashSet::new())) }
    }

    /// Runs until `stop` resolves, asking `namespaces` for the current set on each round.
    pub async fn run<F, Fut>(self, namespaces: F, stop: impl Future<Output = ()>)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Vec<Namespace>>,
    {
        tokio::pin!(stop);
        loop {
            let mut next = now_ms() + 1000;
            for ns in namespaces().await {
                match self.round(&ns).await {
                    Ok(Some(at)) => next = next.min(at),
                    Ok(None) => {}
                    Err(e) => tracing::warn!(namespace = ns.storage_id(), error = %e, "alarm round failed"),
                }
            }
            let wait = Duration::from_millis((next - now_ms()).clamp(1, 1000) as u64);
            tokio::select! {
                _ = &mut stop => return,
                _ = self.engine.alarm_changed() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Starts every due alarm of one namespace; answers when the next one is due.
    async fn round(&self, ns: &Namespace) -> Result<Option<i64>> {
        if !self.engine.inner.root.join(ns.storage_id()).exists() {
            return Ok(None);
        }
        let now = now_ms();
        let due = self.engine.index_write(ns, move |c| index::due(c, now, 256)).await?;
        for alarm in due {
            let key = format!("{}/{}", ns.storage_id(), alarm.id);
            if !self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone()) {
                continue;
            }
            let (engine, deliver, in_flight, ns) =
                (self.engine.clone(), Arc::clone(&self.deliver), Arc::clone(&self.in_flight), ns.clone());
            tokio::spawn(async move {
                if let Err(e) = fire(&engine, deliver.as_ref(), &ns, alarm).await {
                    tracing::warn!(namespace = ns.storage_id(), error = %e, "alarm delivery failed");
                }
                in_flight.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
            });
        }
        self.engine.index_write(ns, index::next).await
    }
}

/// What alarm deliveries came to since the engine started, for the metrics.
#[derive(Debug, Default)]
pub struct AlarmFigures {
    /// Deliveries the handler accepted.
    pub delivered: AtomicU64,
    /// Deliveries that failed (each is retried, up to six times).
    pub failed: AtomicU64,
    /// Alarms given up after their last retry failed.
    pub given_up: AtomicU64,
}

impl AlarmFigures {
    fn record(&self, outcome: &std::result::Result<(), DeliveryError>, last_try: bool) {
        let counter = match (outcome, last_try) {
            (Ok(()), _) => &self.delivered,
            (Err(_), false) => &self.failed,
            (Err(_), true) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                &self.given_up
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// One due alarm: check it against its object, deliver it, and record the outcome.
async fn fire(engine: &DurableObjects, deliver: &dyn Deliver, ns: &Namespace, due: DueAlarm) -> Result<()> {
    let mut id = ns.id_from_string(&due.id)?;
    if let Some(name) = &due.name {
        let named = ns.id_from_name(name);
        if named == id {
            id = named;
        }
    }
    let (hex, name) = (due.id.clone(), due.name.clone());
    // The object's own alarm is the truth: the schedule may be early, or stale.
    let actual = if engine.has_files(ns, &id).await? { engine.run(ns, &id, |s| s.get_alarm()).await? } else { None };
    match actual {
        None => {
            return engine.index_write(ns, move |c| index::schedule(c, &hex, name.as_deref(), None, 0)).await;
        }
        Some(at) if at > now_ms() && due.retries == 0 => {
            return engine.index_write(ns, move |c| index::schedule(c, &hex, name.as_deref(), Some(at), 0)).await;
        }
        Some(_) => {}
    }
    let scheduled = actual.unwrap_or(due.scheduled_ms);
    let invocation = AlarmInvocation { id: id.clone(), scheduled_ms: scheduled, retry_count: due.retries };
    let delivered = deliver.deliver(ns, invocation).await;
    let figures = &engine.inner.alarm_figures;
    figures.record(&delivered, due.retries + 1 > MAX_RETRIES);
    match delivered {
        Ok(()) => {
            // Done, unless the handler set a new alarm meanwhile (then that one stands).
            let remaining = engine
                .run(ns, &id, move |s| {
                    if s.get_alarm()? == Some(scheduled) {
                        s.delete_alarm()?;
                    }
                    s.get_alarm()
                })
                .await?;
            engine.index_write(ns, move |c| index::schedule(c, &hex, name.as_deref(), remaining, 0)).await
        }
        Err(why) => {
            let retries = due.retries + 1;
            if retries > MAX_RETRIES {
                tracing::warn!(namespace = ns.storage_id(), object = %id, %why, "alarm failed {retries} times; giving up");
                engine
                    .run(ns, &id, move |s| {
                        if s.get_alarm()? == Some(scheduled) {
                            s.delete_alarm()?;
                        }
                        Ok(())
                    })
                    .await?;
                return engine.index_write(ns, move |c| index::schedule(c, &hex, name.as_deref(), None, 0)).await;
            }
            let delay = FIRST_RETRY.as_millis() as i64 * (1 << (retries - 1).min(9));
            tracing::info!(namespace = ns.storage_id(), object = %id, %why, retries, delay_ms = delay, "alarm failed; retrying");
            let at = now_ms() + delay;
            engine.index_write(ns, move |c| index::schedule(c, &hex, name.as_deref(), Some(at), retries)).await
        }
    }
}
