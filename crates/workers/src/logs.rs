//! Workers' logs: what their tail worker reports (console output, uncaught exceptions, failed
//! invocations, cron runs), kept per script in memory — the last [`KEPT`] events — and appended
//! to `logs/<script id>.jsonl` (one older file kept past [`FILE_BYTES`]), so they outlive the
//! server, and written to kura's own log. Live tails get every event (see [`crate::tails`]).

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value as Json;

/// Events kept per script.
pub const KEPT: usize = 1000;

/// A script's log file is rolled over past this size.
pub const FILE_BYTES: u64 = 4 * 1024 * 1024;

/// One event: a tail item as workerd serialises it (`outcome`, `logs`, `exceptions`,
/// `event.request`, `eventTimestamp`…), with `scriptName` filled in.
pub type LogEvent = Json;

/// Whether an event is kept in the log: it logged or threw something, failed, or is a cron run.
/// A request that succeeded quietly is only for live tails.
pub fn noteworthy(event: &LogEvent) -> bool {
    let listed = |key: &str| event[key].as_array().is_some_and(|items| !items.is_empty());
    listed("logs") || listed("exceptions") || event["outcome"] != "ok" || !event["event"]["cron"].is_null()
}

/// Names the script in its events (workerd leaves `scriptName` null).
pub fn name_events(events: &mut [LogEvent], script_name: &str) {
    for event in events {
        if let Some(object) = event.as_object_mut() {
            object.insert("scriptName".into(), Json::String(script_name.to_owned()));
        }
    }
}

/// Every script's log.
#[derive(Default)]
pub struct Logs {
    scripts: Mutex<HashMap<String, VecDeque<LogEvent>>>,
    dir: Option<PathBuf>,
}

fn file_of(dir: &Path, script_id: &str) -> PathBuf {
    dir.join(format!("{script_id}.jsonl"))
}

/// A script's logged events as its files hold them, oldest first (the last [`KEPT`]).
pub fn read_files(dir: &Path, script_id: &str) -> Vec<LogEvent> {
    let current = file_of(dir, script_id);
    let mut events: Vec<LogEvent> = [current.with_extension("jsonl.1"), current]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .flat_map(|text| text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect::<Vec<_>>())
        .collect();
    let skip = events.len().saturating_sub(KEPT);
    events.drain(..skip);
    events
}

impl Logs {
    /// Logs kept in memory and appended to files in `dir`.
    pub fn in_dir(dir: PathBuf) -> Logs {
        Logs { scripts: Mutex::default(), dir: Some(dir) }
    }

    fn append(&self, script_id: &str, events: &[LogEvent]) {
        let Some(dir) = &self.dir else { return };
        let path = file_of(dir, script_id);
        if std::fs::metadata(&path).is_ok_and(|m| m.len() > FILE_BYTES) {
            let _ = std::fs::rename(&path, path.with_extension("jsonl.1"));
        }
        let mut text = String::new();
        for event in events {
            text.push_str(&event.to_string());
            text.push('\n');
        }
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()));
        if let Err(e) = written {
            tracing::warn!(error = %e, path = %path.display(), "could not keep a Worker's logs");
        }
    }

    /// Records events of the script `script_id`, named already (see [`name_events`]).
    pub fn record(&self, script_id: &str, events: Vec<LogEvent>) {
        if events.is_empty() {
            return;
        }
        self.append(script_id, &events);
        let mut scripts = self.scripts.lock().unwrap_or_else(|p| p.into_inner());
        let log = scripts.entry(script_id.to_owned()).or_default();
        for event in events {
            log_to_tracing(event["scriptName"].as_str().unwrap_or(""), &event);
            if log.len() == KEPT {
                log.pop_front();
            }
            log.push_back(event);
        }
    }

    /// The script's recent events, oldest first.
    pub fn recent(&self, script_id: &str) -> Vec<LogEvent> {
        let scripts = self.scripts.lock().unwrap_or_else(|p| p.into_inner());
        scripts.get(script_id).map(|log| log.iter().cloned().collect()).unwrap_or_default()
    }

    /// Forgets a deleted script's events.
    pub fn forget(&self, script_id: &str) {
        self.scripts.lock().unwrap_or_else(|p| p.into_inner()).remove(script_id);
        if let Some(dir) = &self.dir {
            let path = file_of(dir, script_id);
            let _ = std::fs::remove_file(path.with_extension("jsonl.1"));
            let _ = std::fs::remove_file(path);
        }
    }
}

/// One line per console message and exception in kura's log.
fn log_to_tracing(script: &str, event: &LogEvent) {
    for line in event["logs"].as_array().into_iter().flatten() {
        let message = render_message(&line["message"]);
        match line["level"].as_str().unwrap_or("log") {
            "error" => tracing::error!(target: "workers", script, "{message}"),
            "warn" => tracing::warn!(target: "workers", script, "{message}"),
            _ => tracing::info!(target: "workers", script, "{message}"),
        }
    }
    for exception in event["exceptions"].as_array().into_iter().flatten() {
        tracing::warn!(
            target: "workers",
            script,
            "uncaught {}: {}",
            exception["name"].as_str().unwrap_or("Error"),
            exception["message"].as_str().unwrap_or("")
        );
    }
}

/// A console message's arguments, as `console.log` prints them: strings bare, the rest as JSON.
pub fn render_message(message: &Json) -> String {
    match message {
        Json::Array(parts) => parts
            .iter()
            .map(|p| match p {
                Json::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" "),
        Json::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_are_kept_named_and_bounded() {
        let logs = Logs::default();
        let mut events = vec![
            json!({"outcome": "ok", "scriptName": null, "logs": [{"message": ["hello", {"a": 1}], "level": "log"}], "exceptions": []}),
        ];
        name_events(&mut events, "chat");
        let event = events.remove(0);
        assert_eq!(event["scriptName"], "chat");
        logs.record("id", vec![event.clone(); KEPT + 5]);
        let recent = logs.recent("id");
        assert_eq!(recent.len(), KEPT);
        assert_eq!(recent[0]["scriptName"], "chat");
        assert_eq!(render_message(&event["logs"][0]["message"]), "hello {\"a\":1}");
        assert!(noteworthy(&event));
        assert!(!noteworthy(&json!({"outcome": "ok", "logs": [], "exceptions": [], "event": {"request": {}}})));
        assert!(noteworthy(&json!({"outcome": "exception", "logs": [], "exceptions": []})));
        assert!(noteworthy(&json!({"outcome": "ok", "logs": [], "exceptions": [], "event": {"cron": "* * * * *"}})));
        logs.forget("id");
        assert!(logs.recent("id").is_empty());
    }

    #[test]
    fn files_outlive_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let logs = Logs::in_dir(dir.path().to_owned());
        let mut events =
            vec![json!({"logs": [], "exceptions": [], "n": 1}), json!({"logs": [], "exceptions": [], "n": 2})];
        name_events(&mut events, "chat");
        logs.record("id", events);
        drop(logs);
        let read = read_files(dir.path(), "id");
        assert_eq!(read.iter().map(|e| e["n"].clone()).collect::<Vec<_>>(), [json!(1), json!(2)]);
        assert_eq!(read[0]["scriptName"], "chat");
    }
}
