//! A script's Cron Triggers as the v4 API keeps them: wrangler's `PUT …/schedules` replaces
//! them (every expression checked first, so a bad one changes nothing), `GET` reads them back.

use kura_catalog::WorkerSchedule;

use crate::Workers;
use crate::cron::Schedule;
use crate::error::{Result, WorkersError};

impl Workers {
    /// Replaces the script's schedules with `crons` (an empty list clears them).
    pub async fn set_schedules(&self, account_id: &str, name: &str, crons: &[String]) -> Result<Vec<WorkerSchedule>> {
        for cron in crons {
            Schedule::parse(cron)?;
        }
        let _changes = self.inner.changes.lock().await;
        let script = self.inner.catalog.worker_script(account_id, name)?.ok_or(WorkersError::ScriptNotFound)?;
        Ok(self.inner.catalog.set_worker_schedules(&script.id, crons)?)
    }

    /// The script's schedules.
    pub fn schedules(&self, account_id: &str, name: &str) -> Result<Vec<WorkerSchedule>> {
        let script = self.inner.catalog.worker_script(account_id, name)?.ok_or(WorkersError::ScriptNotFound)?;
        Ok(self.inner.catalog.worker_schedules(&script.id)?)
    }
}

/// What a Cron Trigger's run came to, as workerd reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct CronRun {
    /// `ok`, `exception`, `exceededCpu`, …
    pub outcome: String,
    /// Whether the handler called `controller.noRetry()`.
    #[serde(rename = "noRetry")]
    pub no_retry: bool,
}

impl Workers {
    /// Runs the deployed `name`'s `scheduled` handler now, as its schedule `cron` would at
    /// `scheduled_ms` (Unix milliseconds): `kura workers trigger`, and tests.
    pub async fn trigger(&self, account_id: &str, name: &str, cron: &str, scheduled_ms: i64) -> Result<CronRun> {
        let script = self.inner.catalog.worker_script(account_id, name)?.ok_or(WorkersError::ScriptNotFound)?;
        if script.deployed_version.is_none() {
            return Err(WorkersError::ScriptNotFound);
        }
        self.fire(&script.id, cron, scheduled_ms).await
    }

    /// Has workerd run the script's `scheduled` handler with `controller.cron = cron` and
    /// `controller.scheduledTime = scheduled_ms`, through the script's cron trigger Worker;
    /// waits, as a request does, while workerd restarts.
    pub(crate) async fn fire(&self, script_id: &str, cron: &str, scheduled_ms: i64) -> Result<CronRun> {
        let body = serde_json::json!({ "cron": cron, "scheduledTime": scheduled_ms });
        self.call_trigger(script_id, "/", &body, "firing a Cron Trigger").await
    }

    /// Posts `body` to the script's handler trigger Worker at `path` and reads its JSON answer;
    /// waits, as a request does, while workerd restarts. `doing` names the work in errors.
    pub(crate) async fn call_trigger<T: serde::de::DeserializeOwned>(
        &self,
        script_id: &str,
        path: &str,
        body: &serde_json::Value,
        doing: &str,
    ) -> Result<T> {
        let key = crate::config::cron_trigger(script_id);
        let failed = |why: String| WorkersError::Runtime(format!("{doing}: {why}"));
        // The pass keeps workerd from restarting under the run.
        let Some((_pass, _socket)) = self.runtime_enter(&key).await else {
            return Err(failed("workerd does not run this Worker now".into()));
        };
        let request = axum::http::Request::post(format!("http://{key}{path}"))
            .header(axum::http::header::CONTENT_TYPE, "application/json")
            .body(axum::body::Body::from(body.to_string()))
            .map_err(|e| failed(e.to_string()))?;
        let response = self.upstream().request(request).await.map_err(|e| failed(e.to_string()))?;
        let status = response.status();
        let answer = axum::body::to_bytes(axum::body::Body::new(response.into_body()), 1024 * 1024)
            .await
            .map_err(|e| failed(e.to_string()))?;
        if !status.is_success() {
            return Err(failed(format!("{status}: {}", String::from_utf8_lossy(&answer))));
        }
        serde_json::from_slice(&answer).map_err(|e| failed(format!("{e}: {}", String::from_utf8_lossy(&answer))))
    }

    /// Fires every deployed script's schedules at each minute they name, until `shutdown`: at
    /// the minute's start, with `scheduledTime` the minute itself. A minute is claimed in the
    /// catalog before its run, so it fires at most once across restarts and redeploys; minutes
    /// that passed while kura was down are not replayed (as on Cloudflare).
    pub async fn run_schedules(self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            let before = now_ms();
            let next_minute = (before / 60_000 + 1) * 60_000;
            let wait = std::time::Duration::from_millis((next_minute - before).max(0) as u64);
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(wait) => {}
            }
            // A host that slept (suspended, or stopped) woke long past the minute: that minute
            // is one of those that passed while kura was not running, and is not fired.
            if now_ms() - next_minute > 60_000 {
                continue;
            }
            self.fire_due(next_minute);
        }
    }

    /// Starts the runs due at `minute_ms`.
    fn fire_due(&self, minute_ms: i64) {
        let schedules = match self.inner.catalog.deployed_worker_schedules() {
            Ok(schedules) => schedules,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the Cron Triggers; this minute fires none");
                return;
            }
        };
        for schedule in schedules {
            let parsed = match Schedule::parse(&schedule.cron) {
                Ok(parsed) => parsed,
                Err(e) => {
                    tracing::warn!(script = schedule.script_id, error = %e, "a stored Cron Trigger does not parse");
                    continue;
                }
            };
            // Claimed already, by this node or (in a cluster) another: the catalog's write would
            // find it so too, but costs a publish.
            if !parsed.fires_at(minute_ms) || schedule.fired_minute.is_some_and(|m| m >= minute_ms / 1000) {
                continue;
            }
            match self.inner.catalog.claim_worker_schedule_minute(&schedule.script_id, &schedule.cron, minute_ms / 1000)
            {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    tracing::error!(script = schedule.script_id, cron = schedule.cron, error = %e, "cannot claim a Cron Trigger's minute; not fired");
                    continue;
                }
            }
            self.inner.cron_runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let workers = self.clone();
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let late_ms = now_ms() - minute_ms;
                match workers.fire(&schedule.script_id, &schedule.cron, minute_ms).await {
                    Ok(run) => tracing::info!(
                        script = schedule.script_id,
                        cron = schedule.cron,
                        outcome = run.outcome,
                        late_ms,
                        duration_ms = started.elapsed().as_millis() as u64,
                        "fired a Cron Trigger"
                    ),
                    Err(e) => {
                        tracing::warn!(script = schedule.script_id, cron = schedule.cron, error = %e, "a Cron Trigger did not run")
                    }
                }
            });
        }
    }
}

/// Now, in Unix milliseconds.
fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}
