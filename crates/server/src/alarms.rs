//! Durable Object alarms for objects served over HTTP: when an object's alarm is due, kura
//! POSTs it to the alarm URL configured on its namespace. A 2xx answer is success; anything
//! else (or no answer within 15 minutes) is a failed attempt, retried with DO's backoff.
//!
//! The body: `{"namespace", "namespace_id", "id", "name", "scheduledTime", "retryCount",
//! "isRetry"}`; the same fields travel as `kura-alarm-*` headers.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kura_catalog::{Catalog, DoNamespace};
use kura_do::alarm::{AlarmInvocation, AlarmRunner, BoxFuture, Deliver, DeliveryError};
use kura_do::{DurableObjects, Namespace};
use serde_json::json;

/// How long a handler may take (Durable Objects' alarm wall-time limit).
const HANDLER_LIMIT: Duration = Duration::from_secs(15 * 60);

struct HttpDeliver {
    client: reqwest::Client,
    /// Namespaces by storage id, refreshed from the catalog each round.
    namespaces: Mutex<HashMap<String, DoNamespace>>,
}

impl Deliver for HttpDeliver {
    fn deliver(&self, ns: &Namespace, alarm: AlarmInvocation) -> BoxFuture<'static, Result<(), DeliveryError>> {
        let known = self.namespaces.lock().unwrap_or_else(|p| p.into_inner()).get(ns.storage_id()).cloned();
        let client = self.client.clone();
        Box::pin(async move {
            let namespace = known.ok_or(DeliveryError::NoHandler("the namespace no longer exists"))?;
            let url =
                namespace.alarm_url.as_deref().ok_or(DeliveryError::NoHandler("the namespace has no alarm URL"))?;
            let body = json!({
                "namespace": namespace.name,
                "namespace_id": namespace.id,
                "id": alarm.id.to_string(),
                "name": alarm.id.name(),
                "scheduledTime": alarm.scheduled_ms,
                "retryCount": alarm.retry_count,
                "isRetry": alarm.is_retry(),
            });
            let response = client
                .post(url)
                .timeout(HANDLER_LIMIT)
                .header("kura-alarm-namespace", &namespace.name)
                .header("kura-alarm-id", alarm.id.to_string())
                .header("kura-alarm-retry-count", alarm.retry_count.to_string())
                .json(&body)
                .send()
                .await
                .map_err(|e| DeliveryError::Unreachable { url: url.to_owned(), source: Box::new(e) })?;
            if response.status().is_success() {
                Ok(())
            } else {
                Err(DeliveryError::Answered { url: url.to_owned(), status: response.status().to_string() })
            }
        })
    }
}

/// How often a cluster node looks for namespaces with alarms that no node serves.
const ADOPT_EVERY: Duration = Duration::from_secs(5);

/// Whether the periodic cluster work is due now (last done `ADOPT_EVERY` ago or never).
fn adopt_due(last: &Mutex<Option<std::time::Instant>>) -> bool {
    last.lock().unwrap_or_else(|p| p.into_inner()).is_none_or(|at| at.elapsed() >= ADOPT_EVERY)
}

/// As [`adopt_due`], and marks it done now if it was.
fn take_turn(last: &Mutex<Option<std::time::Instant>>) -> bool {
    let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
    let due = last.is_none_or(|at| at.elapsed() >= ADOPT_EVERY);
    if due {
        *last = Some(std::time::Instant::now());
    }
    due
}

/// Delivers the alarms of every namespace with an alarm URL until `stop` resolves. In a
/// cluster, of the namespaces this node serves; and every few seconds it takes over those no
/// node serves whose home it is, so a namespace's alarms keep firing after its node died even
/// when no request reaches it — the namespaces of deployed classes too, whose alarms workerd
/// runs (their alarms, as captured, go into their indexes each round).
pub(crate) async fn run(catalog: Arc<Catalog>, engine: DurableObjects, stop: impl Future<Output = ()>) {
    let deliver = Arc::new(HttpDeliver { client: reqwest::Client::new(), namespaces: Mutex::new(HashMap::new()) });
    let runner = AlarmRunner::new(engine.clone(), Arc::clone(&deliver) as Arc<dyn Deliver>);
    let adopted_at = Arc::new(Mutex::new(None::<std::time::Instant>));
    let namespaces = move || {
        let (catalog, deliver, engine, adopted_at) =
            (Arc::clone(&catalog), Arc::clone(&deliver), engine.clone(), Arc::clone(&adopted_at));
        async move {
            let all = tokio::task::spawn_blocking(move || catalog.all_do_namespaces()).await;
            let all = match all {
                Ok(Ok(all)) => all,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot list namespaces for alarms");
                    return Vec::new();
                }
                Err(_) => return Vec::new(),
            };
            // Alarms of objects workerd runs, as captured, into their namespaces' indexes.
            if let Err(e) = engine.record_hosted_alarms(None).await {
                tracing::warn!(error = %e, "cannot record the alarms of objects workerd runs; retrying");
            }
            if adopt_due(&adopted_at) {
                // Objects of namespaces another node serves now go to it.
                for ns in &all {
                    engine.give_up_unserved(&ns.id).await;
                }
            }
            let adopt = take_turn(&adopted_at);
            if adopt {
                // A namespace of a deployed class that was ever served, with no node serving it
                // now, is adopted by its home node, whose workerd then runs its alarms.
                for ns in all.iter().filter(|n| n.hosted_by_workerd() && !engine.serves_namespace(&n.id)) {
                    if engine.is_home(&ns.id).await && engine.has_history(&ns.id).await {
                        let _ = engine.claim_namespace(&ns.id).await;
                    }
                }
            }
            let mut with_url: Vec<DoNamespace> = all.into_iter().filter(|n| n.alarm_url.is_some()).collect();
            let mut served = Vec::with_capacity(with_url.len());
            for ns in with_url.drain(..) {
                if engine.serves_namespace(&ns.id)
                    || (adopt && engine.is_home(&ns.id).await && engine.claim_namespace(&ns.id).await.is_ok())
                {
                    served.push(ns);
                }
            }
            let with_url = served;
            let engine_view = with_url.iter().filter_map(|n| Namespace::new(&n.id, &n.unique_key).ok()).collect();
            *deliver.namespaces.lock().unwrap_or_else(|p| p.into_inner()) =
                with_url.into_iter().map(|n| (n.id.clone(), n)).collect();
            engine_view
        }
    };
    runner.run(namespaces, stop).await;
}
