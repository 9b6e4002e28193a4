//! Live tails (`wrangler tail`, the console's live log): who listens to which script with which
//! filters, and each invocation's event handed to every listener whose filters it passes —
//! dropped, never waited for, when a listener falls behind, which then hears how many it missed.
//! In a cluster, a node also keeps which other nodes listen to which scripts, so that its
//! Workers' events reach a tail opened on another node.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value as Json, json};
use tokio::sync::mpsc;

use crate::error::{Result, WorkersError};
use crate::logs::{LogEvent, render_message};

/// Tails a script may have at once (Cloudflare's limit).
pub const MAX_PER_SCRIPT: usize = 10;

/// How long a tail lasts (wrangler prints when it expires).
pub const LIFETIME: Duration = Duration::from_secs(6 * 3600);

/// How long a created tail waits for its listener before it is forgotten.
const UNCLAIMED: Duration = Duration::from_secs(60);

/// Events a listener may have waiting; past that they are dropped.
const QUEUED: usize = 256;

/// Bytes of events a listener may have waiting (a Worker's logs can be large); past that they
/// are dropped too.
const QUEUED_BYTES: usize = 8 * 1024 * 1024;

/// What a tail passes: every filter given must hold (wrangler's `--status`, `--method`,
/// `--header`, `--ip`, `--search`, `--sampling-rate`, `--version-id`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filters {
    sampling_rate: Option<f64>,
    outcomes: Option<Vec<String>>,
    methods: Option<Vec<String>>,
    header: Option<(String, Option<String>)>,
    client_ips: Option<Vec<String>>,
    query: Option<String>,
    script_version: Option<String>,
}

impl Filters {
    /// Reads wrangler's `{"filters": [{"outcome": […]}, {"method": […]}, …]}`; `self` among
    /// the client IPs is `caller_ip`, the address that created the tail. An empty body passes
    /// everything.
    pub fn parse(body: &[u8], caller_ip: Option<&str>) -> Result<Filters> {
        let invalid = |m: String| WorkersError::InvalidTail(m);
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Filters::default());
        }
        let message: Json =
            serde_json::from_slice(body).map_err(|e| invalid(format!("the tail's filters are not JSON: {e}")))?;
        let list = match &message["filters"] {
            Json::Null => return Ok(Filters::default()),
            Json::Array(list) => list,
            _ => return Err(invalid("`filters` must be a list".into())),
        };
        let strings = |value: &Json, name: &str| -> Result<Vec<String>> {
            value
                .as_array()
                .and_then(|items| items.iter().map(|i| i.as_str().map(str::to_owned)).collect::<Option<Vec<_>>>())
                .ok_or_else(|| invalid(format!("`{name}` must be a list of strings")))
        };
        let mut filters = Filters::default();
        for filter in list {
            let Some((name, value)) = filter.as_object().filter(|o| o.len() == 1).and_then(|o| o.iter().next()) else {
                return Err(invalid(format!("a tail filter is one named condition, not {filter}")));
            };
            match name.as_str() {
                "sampling_rate" => {
                    let rate = value
                        .as_f64()
                        .filter(|r| *r > 0.0 && *r <= 1.0)
                        .ok_or_else(|| invalid("a sampling rate must be a number above 0 and at most 1".into()))?;
                    filters.sampling_rate = Some(rate);
                }
                "outcome" => filters.outcomes = Some(strings(value, name)?),
                "method" => {
                    filters.methods = Some(strings(value, name)?.iter().map(|m| m.to_ascii_uppercase()).collect())
                }
                "header" => {
                    let key = value["key"].as_str().filter(|k| !k.is_empty());
                    let key = key.ok_or_else(|| invalid("a header filter needs a `key`".into()))?;
                    let query = value["query"].as_str().filter(|q| !q.is_empty()).map(str::to_owned);
                    filters.header = Some((key.to_ascii_lowercase(), query));
                }
                "client_ip" => {
                    let ips = strings(value, name)?;
                    filters.client_ips = Some(
                        ips.into_iter()
                            .map(|ip| if ip == "self" { caller_ip.unwrap_or("self").to_owned() } else { ip })
                            .collect(),
                    );
                }
                "query" => filters.query = value.as_str().map(str::to_owned),
                "scriptVersion" => filters.script_version = value.as_str().map(str::to_owned),
                other => return Err(invalid(format!("kura does not know the tail filter `{other}`"))),
            }
        }
        Ok(filters)
    }

    /// Whether `event` passes. Filters on a request (method, header, IP) pass no other event.
    fn pass(&self, event: &LogEvent) -> bool {
        let request = &event["event"]["request"];
        let header = |name: &str| {
            request["headers"].as_object().and_then(|headers| {
                headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).and_then(|(_, v)| v.as_str())
            })
        };
        if let Some(outcomes) = &self.outcomes
            && !event["outcome"].as_str().is_some_and(|o| outcomes.iter().any(|want| want == o))
        {
            return false;
        }
        if let Some(methods) = &self.methods
            && !request["method"].as_str().is_some_and(|m| methods.iter().any(|want| want.eq_ignore_ascii_case(m)))
        {
            return false;
        }
        if let Some((key, query)) = &self.header {
            match (header(key), query) {
                (None, _) => return false,
                (Some(value), Some(query)) if value != query => return false,
                _ => {}
            }
        }
        if let Some(ips) = &self.client_ips
            && !header("cf-connecting-ip").is_some_and(|ip| ips.iter().any(|want| want == ip))
        {
            return false;
        }
        if let Some(query) = &self.query {
            let logged = event["logs"].as_array().into_iter().flatten();
            if !logged.map(|line| render_message(&line["message"])).any(|text| text.contains(query.as_str())) {
                return false;
            }
        }
        if let Some(version) = &self.script_version
            && event["scriptVersion"]["id"].as_str() != Some(version)
        {
            return false;
        }
        if let Some(rate) = self.sampling_rate {
            let mut bytes = [0u8; 4];
            getrandom::fill(&mut bytes).expect("the operating system's random source failed");
            return f64::from(u32::from_le_bytes(bytes)) / f64::from(u32::MAX) < rate;
        }
        true
    }
}

/// A tail as the API answers it.
#[derive(Debug, Clone)]
pub struct TailInfo {
    /// Its id, which is also the capability its stream is reached by.
    pub id: String,
    /// When it ends.
    pub expires_at: SystemTime,
}

impl TailInfo {
    /// When it ends, as the API writes times (`2026-01-01T00:00:00.000Z`).
    pub fn expires_at_iso(&self) -> String {
        let ms = self.expires_at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
            .unwrap_or_default()
    }
}

struct Listener {
    /// Events as the socket sends them: JSON text, serialised once.
    sender: mpsc::Sender<String>,
    /// Bytes waiting in the channel.
    queued: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Which connection this is (a reconnect replaces the listener).
    connection: u64,
    /// Events dropped since the listener last kept up.
    dropped: u64,
}

struct Tail {
    script_id: String,
    script_name: String,
    filters: Filters,
    created: Instant,
    expires_at: SystemTime,
    listener: Option<Listener>,
}

/// Every open tail, by id.
#[derive(Default)]
pub struct Tails {
    tails: Mutex<HashMap<String, Tail>>,
    connections: std::sync::atomic::AtomicU64,
    /// In a cluster: the other nodes listening to a script, by script id, each with its API's
    /// URL and until when (renewed while its tail lives).
    remote: Mutex<HashMap<String, HashMap<String, Instant>>>,
    /// Told when a tail connects, so the other nodes hear of it at once.
    connected: tokio::sync::Notify,
}

/// A tail's stream: events as they arrive, until the tail is closed, expires or is taken over
/// by a newer connection.
pub struct TailStream {
    /// The tailed script's id.
    pub script_id: String,
    events: mpsc::Receiver<String>,
    queued: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// When the tail ends.
    pub expires_at: SystemTime,
    connection: u64,
    id: String,
}

impl TailStream {
    /// The next event (its JSON text), once there is one; `None` once the tail has ended.
    pub async fn next(&mut self) -> Option<String> {
        let event = self.events.recv().await?;
        self.queued.fetch_sub(event.len(), std::sync::atomic::Ordering::Relaxed);
        Some(event)
    }

    /// The next event if one is waiting.
    pub fn try_next(&mut self) -> Option<String> {
        let event = self.events.try_recv().ok()?;
        self.queued.fetch_sub(event.len(), std::sync::atomic::Ordering::Relaxed);
        Some(event)
    }
}

impl Listener {
    /// Queues an event unless the listener has no room for it (by count or by bytes).
    fn offer(&self, event: String) -> std::result::Result<(), mpsc::error::TrySendError<String>> {
        let len = event.len();
        if self.queued.load(std::sync::atomic::Ordering::Relaxed) + len > QUEUED_BYTES {
            return Err(mpsc::error::TrySendError::Full(event));
        }
        self.sender.try_send(event)?;
        self.queued.fetch_add(len, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

impl Tails {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Tail>> {
        self.tails.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn purge(tails: &mut HashMap<String, Tail>) {
        let now = SystemTime::now();
        tails.retain(|_, t| t.expires_at > now && (t.listener.is_some() || t.created.elapsed() < UNCLAIMED));
    }

    /// Opens a tail on a script; it streams once [`Tails::connect`]ed.
    pub fn create(&self, script_id: &str, script_name: &str, filters: Filters) -> Result<TailInfo> {
        let mut tails = self.lock();
        Self::purge(&mut tails);
        if tails.values().filter(|t| t.script_id == script_id).count() >= MAX_PER_SCRIPT {
            return Err(WorkersError::InvalidTail(format!(
                "'{script_name}' already has {MAX_PER_SCRIPT} tails, the most a Worker may have; close one first"
            )));
        }
        let id = crate::random_hex(16);
        let expires_at = SystemTime::now() + LIFETIME;
        tails.insert(
            id.clone(),
            Tail {
                script_id: script_id.to_owned(),
                script_name: script_name.to_owned(),
                filters,
                created: Instant::now(),
                expires_at,
                listener: None,
            },
        );
        Ok(TailInfo { id, expires_at })
    }

    /// Whether the tail `id` is open.
    pub fn is_open(&self, id: &str) -> bool {
        let mut tails = self.lock();
        Self::purge(&mut tails);
        tails.contains_key(id)
    }

    /// The stream of the tail `id`, if it is open; a listener already there is let go.
    pub fn connect(&self, id: &str) -> Option<TailStream> {
        let mut tails = self.lock();
        Self::purge(&mut tails);
        let tail = tails.get_mut(id)?;
        let (sender, events) = mpsc::channel(QUEUED);
        let connection = self.connections.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let queued = std::sync::Arc::default();
        tail.listener = Some(Listener { sender, queued: std::sync::Arc::clone(&queued), connection, dropped: 0 });
        // A permit kept if nobody waits right now: the next wait ends at once.
        self.connected.notify_one();
        Some(TailStream {
            script_id: tail.script_id.clone(),
            events,
            queued,
            expires_at: tail.expires_at,
            connection,
            id: id.to_owned(),
        })
    }

    /// Ends a stream: its tail closes, unless a newer connection took it over.
    pub fn disconnect(&self, stream: &TailStream) {
        let mut tails = self.lock();
        if tails.get(&stream.id).and_then(|t| t.listener.as_ref()).is_some_and(|l| l.connection == stream.connection) {
            tails.remove(&stream.id);
        }
    }

    /// Closes the tail `id` of `script_id`; false if it was not open.
    pub fn close(&self, script_id: &str, id: &str) -> bool {
        let mut tails = self.lock();
        if tails.get(id).is_some_and(|t| t.script_id == script_id) {
            tails.remove(id);
            return true;
        }
        false
    }

    /// Closes every tail of a deleted script.
    pub fn close_all(&self, script_id: &str) {
        self.lock().retain(|_, t| t.script_id != script_id);
    }

    /// The script's open tails.
    pub fn list(&self, script_id: &str) -> Vec<TailInfo> {
        let mut tails = self.lock();
        Self::purge(&mut tails);
        tails
            .iter()
            .filter(|(_, t)| t.script_id == script_id)
            .map(|(id, t)| TailInfo { id: id.clone(), expires_at: t.expires_at })
            .collect()
    }

    /// Whether anyone listens to the script now, here or (in a cluster) on another node.
    pub fn tailing(&self, script_id: &str) -> bool {
        self.lock().values().any(|t| t.script_id == script_id && t.listener.is_some())
            || !self.remote_listeners(script_id).is_empty()
    }

    /// The scripts someone listens to on this node now.
    pub fn tailed_here(&self) -> Vec<String> {
        let mut tails = self.lock();
        Self::purge(&mut tails);
        let mut scripts: Vec<String> =
            tails.values().filter(|t| t.listener.is_some()).map(|t| t.script_id.clone()).collect();
        scripts.sort();
        scripts.dedup();
        scripts
    }

    /// Waits until a tail connects here.
    pub async fn connected(&self) {
        self.connected.notified().await
    }

    /// Notes that the node whose API is `node_api` listens to `script_id` for `lasting`.
    pub fn listened_from(&self, script_id: &str, node_api: &str, lasting: Duration) {
        let mut remote = self.remote.lock().unwrap_or_else(|p| p.into_inner());
        remote.entry(script_id.to_owned()).or_default().insert(node_api.to_owned(), Instant::now() + lasting);
    }

    /// The API URLs of the other nodes listening to `script_id` now.
    pub fn remote_listeners(&self, script_id: &str) -> Vec<String> {
        let mut remote = self.remote.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        remote.retain(|_, nodes| {
            nodes.retain(|_, until| *until > now);
            !nodes.is_empty()
        });
        remote.get(script_id).map(|nodes| nodes.keys().cloned().collect()).unwrap_or_default()
    }

    /// Hands a script's events to its listeners. A listener with no room (256 events, or 8 MiB)
    /// loses the event; the next one it gets is marked `truncated` and preceded by a notice
    /// saying how many it lost.
    pub fn publish(&self, script_id: &str, events: &[LogEvent]) {
        let mut tails = self.lock();
        let now = SystemTime::now();
        for tail in tails.values_mut().filter(|t| t.script_id == script_id && t.expires_at > now) {
            let Some(listener) = &mut tail.listener else { continue };
            for event in events.iter().filter(|e| tail.filters.pass(e)) {
                let mut event = event.clone();
                if listener.dropped > 0 {
                    if listener.sender.capacity() < 2 {
                        listener.dropped += 1;
                        continue;
                    }
                    let notice = overload_notice(&tail.script_name, listener.dropped);
                    if listener.offer(notice.to_string()).is_err() {
                        listener.dropped += 1;
                        continue;
                    }
                    event["truncated"] = Json::Bool(true);
                    listener.dropped = 0;
                }
                match listener.offer(event.to_string()) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => listener.dropped += 1,
                    Err(mpsc::error::TrySendError::Closed(_)) => break,
                }
            }
        }
    }
}

/// The event wrangler prints (in red) when a tail could not keep up: a `TailInfo` of type
/// `overload`, as Cloudflare sends when it starts sampling.
fn overload_notice(script_name: &str, dropped: u64) -> LogEvent {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    json!({
        "outcome": "ok",
        "scriptName": script_name,
        "exceptions": [],
        "logs": [],
        "diagnosticsChannelEvents": [],
        "eventTimestamp": now,
        "event": {
            "type": "overload",
            "message": format!("This tail fell behind and dropped {dropped} events; filters (--status, --method, --search, --sampling-rate) lower the volume."),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, outcome: &str, log: &str) -> LogEvent {
        json!({
            "outcome": outcome,
            "logs": [{"message": [log], "level": "log", "timestamp": 1}],
            "exceptions": [],
            "event": {"request": {"url": "http://chat.localhost/", "method": method, "headers": {"x-user": "ann", "cf-connecting-ip": "10.0.0.7"}}},
        })
    }

    fn filters(json: &str) -> Filters {
        Filters::parse(json.as_bytes(), Some("10.0.0.7")).unwrap()
    }

    #[test]
    fn filters_pass_what_wrangler_asked_for() {
        let get = request("GET", "ok", "hello world");
        let failed = request("POST", "exception", "boom");
        let cron =
            json!({"outcome": "ok", "logs": [], "exceptions": [], "event": {"cron": "* * * * *", "scheduledTime": 0}});
        let all = filters(r#"{"filters":[]}"#);
        assert!(all.pass(&get) && all.pass(&failed) && all.pass(&cron));
        let errors = filters(r#"{"filters":[{"outcome":["exception","exceededCpu"]}]}"#);
        assert!(!errors.pass(&get) && errors.pass(&failed) && !errors.pass(&cron));
        let posts = filters(r#"{"filters":[{"method":["post"]}]}"#);
        assert!(!posts.pass(&get) && posts.pass(&failed) && !posts.pass(&cron));
        assert!(filters(r#"{"filters":[{"header":{"key":"X-User"}}]}"#).pass(&get));
        assert!(filters(r#"{"filters":[{"header":{"key":"x-user","query":"ann"}}]}"#).pass(&get));
        assert!(!filters(r#"{"filters":[{"header":{"key":"x-user","query":"bob"}}]}"#).pass(&get));
        assert!(filters(r#"{"filters":[{"client_ip":["self"]}]}"#).pass(&get));
        assert!(!filters(r#"{"filters":[{"client_ip":["10.0.0.8"]}]}"#).pass(&get));
        assert!(filters(r#"{"filters":[{"query":"world"}]}"#).pass(&get));
        assert!(!filters(r#"{"filters":[{"query":"world"}]}"#).pass(&failed));
        assert!(filters(r#"{"filters":[{"sampling_rate":1}]}"#).pass(&get));
        for bad in [r#"{"filters":[{"nope":1}]}"#, r#"{"filters":[{"sampling_rate":0}]}"#, "[", r#"{"filters":3}"#] {
            assert!(matches!(Filters::parse(bad.as_bytes(), None), Err(WorkersError::InvalidTail(_))), "{bad}");
        }
    }

    #[test]
    fn a_slow_listener_loses_events_and_hears_how_many() {
        let tails = Tails::default();
        let info = tails.create("id", "chat", Filters::default()).unwrap();
        assert!(!tails.tailing("id"));
        let mut stream = tails.connect(&info.id).unwrap();
        assert!(tails.tailing("id"));
        let event = request("GET", "ok", "x");
        for _ in 0..QUEUED + 10 {
            tails.publish("id", std::slice::from_ref(&event));
        }
        let mut received = 0;
        while stream.try_next().is_some() {
            received += 1;
        }
        assert_eq!(received, QUEUED);
        tails.publish("id", std::slice::from_ref(&event));
        let json = |text: Option<String>| serde_json::from_str::<Json>(&text.unwrap()).unwrap();
        let notice = json(stream.try_next());
        assert_eq!(notice["event"]["type"], "overload");
        assert!(notice["event"]["message"].as_str().unwrap().contains("dropped 10 events"));
        assert_eq!(json(stream.try_next())["truncated"], true);

        // By bytes as well: a few large events fill a listener's room.
        let big = request("GET", "ok", &"x".repeat(3 * 1024 * 1024));
        tails.publish("id", &[big.clone(), big.clone(), big.clone(), big]);
        let mut received = Vec::new();
        while let Some(text) = stream.try_next() {
            received.push(serde_json::from_str::<Json>(&text).unwrap());
        }
        assert_eq!(received.len(), 3, "8 MiB holds two 3 MiB events, then the notice of the third's loss");
        assert_eq!(received[2]["event"]["type"], "overload");
        tails.disconnect(&stream);
        assert!(!tails.tailing("id"));
        assert!(tails.connect(&info.id).is_none(), "a tail whose listener left is closed");
    }

    #[test]
    fn a_script_has_at_most_ten_tails_and_a_reconnect_takes_over() {
        let tails = Tails::default();
        let ids: Vec<_> =
            (0..MAX_PER_SCRIPT).map(|_| tails.create("id", "chat", Filters::default()).unwrap().id).collect();
        assert!(matches!(tails.create("id", "chat", Filters::default()), Err(WorkersError::InvalidTail(_))));
        assert!(tails.create("other", "other", Filters::default()).is_ok());
        let first = tails.connect(&ids[0]).unwrap();
        let second = tails.connect(&ids[0]).unwrap();
        tails.disconnect(&first);
        assert!(tails.tailing("id"), "the older connection's end leaves the newer one");
        assert!(!tails.close("other", &ids[0]), "closed only under its own script");
        assert!(tails.close("id", &ids[0]));
        drop(second);
        tails.close_all("id");
        assert!(tails.create("id", "chat", Filters::default()).is_ok());
    }
}
