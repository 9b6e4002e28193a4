//! The etcd coordinator: a small client of etcd's JSON gateway (`/v3/kv/*`, `/v3/lease/*`,
//! served by every etcd since 3.4 — no gRPC stack, no protoc), and ownership on top of it.
//!
//! Keys, under the cluster's prefix:
//! - `members/<node>` — a [`Member`], attached to the node's session lease;
//! - `owner/<resource>` — the owning node and incarnation, attached to the same lease, so a
//!   node that stops renewing loses everything at once; the ownership's epoch is the key's
//!   `create_revision` (cluster-wide, strictly increasing, surviving restarts);
//! - `manifest/<resource>/<seq>` — the epoch, then the entry; written by a transaction that
//!   compares the owner key's `create_revision` with the lease's epoch, so a replaced owner's
//!   publish cannot land.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::{
    Acquired, Coordinator, CoordinatorError, Lease, LeaseClock, Member, Owner, Published, check_resource, decode_entry,
    encode_entry, monotonic, seq_name,
};

/// How long one request to one etcd member may take before the next member is tried.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a call keeps trying members (an election takes about a second).
const CALL_DEADLINE: Duration = Duration::from_secs(8);

/// A key-value pair as etcd returns it.
#[derive(Debug, Clone)]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// The revision that created the key (since its last deletion).
    pub create_revision: i64,
    /// The revision of its last change.
    pub mod_revision: i64,
    /// The lease it is attached to (0 for none).
    pub lease: i64,
}

/// A client of etcd's JSON gateway over several members: a request that cannot reach one (or
/// finds it without a leader) goes to the next.
#[derive(Debug)]
pub struct EtcdClient {
    endpoints: Vec<String>,
    preferred: AtomicUsize,
    http: reqwest::Client,
}

#[derive(Deserialize)]
struct RawKv {
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default)]
    create_revision: Option<String>,
    #[serde(default)]
    mod_revision: Option<String>,
    #[serde(default)]
    lease: Option<String>,
}

fn number(value: &Value) -> i64 {
    match value {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn decode_kvs(value: Option<&Value>) -> Result<Vec<KeyValue>, CoordinatorError> {
    let Some(kvs) = value else { return Ok(Vec::new()) };
    let raw: Vec<RawKv> = serde_json::from_value(kvs.clone()).map_err(|e| corrupt("range", e))?;
    raw.into_iter()
        .map(|kv| {
            Ok(KeyValue {
                key: B64.decode(&kv.key).map_err(|e| corrupt("key", e))?,
                value: B64.decode(&kv.value).map_err(|e| corrupt("value", e))?,
                create_revision: kv.create_revision.and_then(|r| r.parse().ok()).unwrap_or(0),
                mod_revision: kv.mod_revision.and_then(|r| r.parse().ok()).unwrap_or(0),
                lease: kv.lease.and_then(|r| r.parse().ok()).unwrap_or(0),
            })
        })
        .collect()
}

fn corrupt(key: &str, error: impl std::fmt::Display) -> CoordinatorError {
    CoordinatorError::Corrupt { key: key.to_owned(), message: error.to_string() }
}

/// The end of the range of keys starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Operations inside a transaction, in the gateway's JSON.
pub mod op {
    use super::*;

    /// `create_revision(key) == revision` (0: the key does not exist).
    pub fn created_at(key: &[u8], revision: i64) -> Value {
        json!({"target": "CREATE", "result": "EQUAL", "key": B64.encode(key), "create_revision": revision.to_string()})
    }

    /// Puts `value` at `key`, attached to `lease` (0 for none).
    pub fn put(key: &[u8], value: &[u8], lease: i64) -> Value {
        let mut put = json!({"key": B64.encode(key), "value": B64.encode(value)});
        if lease != 0 {
            put["lease"] = json!(lease.to_string());
        }
        json!({"request_put": put})
    }

    /// Reads one key.
    pub fn get(key: &[u8]) -> Value {
        json!({"request_range": {"key": B64.encode(key)}})
    }

    /// Reads the last key (by key order) starting with `prefix`.
    pub fn last_with_prefix(prefix: &[u8]) -> Value {
        json!({"request_range": {
            "key": B64.encode(prefix), "range_end": B64.encode(prefix_end(prefix)),
            "limit": "1", "sort_order": "DESCEND", "sort_target": "KEY", "keys_only": true,
        }})
    }

    /// Deletes the keys in `[from, to)`, or `from` alone.
    pub fn delete(from: &[u8], to: Option<&[u8]>) -> Value {
        let mut delete = json!({"key": B64.encode(from)});
        if let Some(to) = to {
            delete["range_end"] = json!(B64.encode(to));
        }
        json!({"request_delete_range": delete})
    }
}

/// What a transaction answered.
#[derive(Debug)]
pub struct TxnOutcome {
    /// Whether every comparison held (so the success branch ran).
    pub succeeded: bool,
    /// The store's revision after the transaction.
    pub revision: i64,
    /// The key-values each range operation of the branch that ran returned, in order.
    pub ranges: Vec<Vec<KeyValue>>,
}

impl EtcdClient {
    /// A client of the members at `endpoints` (`http://127.0.0.1:2379`, …).
    pub fn new(endpoints: Vec<String>) -> Self {
        let endpoints = endpoints.into_iter().map(|e| e.trim_end_matches('/').to_owned()).collect();
        let http = reqwest::Client::builder().timeout(REQUEST_TIMEOUT).build().expect("a plain HTTP client builds");
        EtcdClient { endpoints, preferred: AtomicUsize::new(0), http }
    }

    /// The members this client knows.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// One gateway call, tried on each member in turn until one answers or the deadline passes.
    async fn call(&self, path: &str, body: &Value) -> Result<Value, CoordinatorError> {
        let started = Instant::now();
        let mut last = String::from("no endpoint configured");
        let mut attempt = 0usize;
        while !self.endpoints.is_empty() && (attempt == 0 || started.elapsed() < CALL_DEADLINE) {
            let index = (self.preferred.load(Ordering::Relaxed) + attempt) % self.endpoints.len();
            let endpoint = &self.endpoints[index];
            attempt += 1;
            'attempt: {
                let response = match self.http.post(format!("{endpoint}{path}")).json(body).send().await {
                    Ok(response) => response,
                    Err(error) => {
                        last = format!("{endpoint}: {error}");
                        break 'attempt;
                    }
                };
                let status = response.status();
                // An answer cut short (a timeout while it was read, a pause of this process)
                // says nothing: the request may have applied, and is asked again like one that
                // got no answer — never taken for an empty success.
                let text = match response.text().await {
                    Ok(text) => text,
                    Err(error) => {
                        last = format!("{endpoint}: reading the answer: {error}");
                        break 'attempt;
                    }
                };
                let Ok(value) = serde_json::from_str::<Value>(&text) else {
                    last = format!("{endpoint}: an answer that is not JSON ({status}): {text}");
                    break 'attempt;
                };
                if status.is_success() && value.get("error").is_none() {
                    self.preferred.store(index, Ordering::Relaxed);
                    return Ok(value);
                }
                let message = value
                    .get("message")
                    .or_else(|| value.get("error"))
                    .and_then(Value::as_str)
                    .unwrap_or(&text)
                    .to_owned();
                // A member without a leader, or one that timed out, may be healthy next time;
                // anything else is etcd refusing the request itself.
                if !(status.is_server_error() || message.contains("leader") || message.contains("timed out")) {
                    return Err(CoordinatorError::Unavailable { at: endpoint.clone(), message });
                }
                last = format!("{endpoint}: {message}");
            }
            if attempt.is_multiple_of(self.endpoints.len()) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Err(CoordinatorError::Unavailable { at: self.endpoints.join(","), message: last })
    }

    /// Grants a lease of `ttl` (whole seconds); returns its id and the TTL granted.
    pub async fn grant(&self, ttl: Duration) -> Result<(i64, Duration), CoordinatorError> {
        let answer = self.call("/v3/lease/grant", &json!({"TTL": ttl.as_secs().max(1).to_string()})).await?;
        let id = answer.get("ID").map(number).unwrap_or(0);
        let granted = answer.get("TTL").map(number).unwrap_or(0);
        if id == 0 || granted <= 0 {
            return Err(corrupt("lease", format!("a grant without an id or TTL: {answer}")));
        }
        Ok((id, Duration::from_secs(granted as u64)))
    }

    /// Renews a lease; `None` once it has expired.
    pub async fn keep_alive(&self, lease: i64) -> Result<Option<Duration>, CoordinatorError> {
        let answer = self.call("/v3/lease/keepalive", &json!({"ID": lease.to_string()})).await?;
        let result = answer.get("result").unwrap_or(&answer);
        let ttl = result.get("TTL").map(number).unwrap_or(0);
        Ok((ttl > 0).then(|| Duration::from_secs(ttl as u64)))
    }

    /// Ends a lease now, deleting the keys attached to it.
    pub async fn revoke(&self, lease: i64) -> Result<(), CoordinatorError> {
        match self.call("/v3/lease/revoke", &json!({"ID": lease.to_string()})).await {
            Err(CoordinatorError::Unavailable { message, .. }) if message.contains("not found") => Ok(()),
            other => other.map(drop),
        }
    }

    /// Every key starting with `prefix`, from `from` on (inclusive), in key order.
    pub async fn range_prefix(&self, prefix: &[u8], from: &[u8]) -> Result<Vec<KeyValue>, CoordinatorError> {
        let body = json!({"key": B64.encode(from), "range_end": B64.encode(prefix_end(prefix))});
        let answer = self.call("/v3/kv/range", &body).await?;
        decode_kvs(answer.get("kvs"))
    }

    /// One key, if it exists.
    pub async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, CoordinatorError> {
        let answer = self.call("/v3/kv/range", &json!({"key": B64.encode(key)})).await?;
        Ok(decode_kvs(answer.get("kvs"))?.into_iter().next())
    }

    /// Puts one key, attached to `lease` (0 for none).
    pub async fn put(&self, key: &[u8], value: &[u8], lease: i64) -> Result<(), CoordinatorError> {
        let body = op::put(key, value, lease)["request_put"].clone();
        self.call("/v3/kv/put", &body).await.map(drop)
    }

    /// A transaction: if every comparison holds, `success` runs, otherwise `failure`.
    pub async fn txn(
        &self,
        compare: &[Value],
        success: &[Value],
        failure: &[Value],
    ) -> Result<TxnOutcome, CoordinatorError> {
        let answer =
            self.call("/v3/kv/txn", &json!({"compare": compare, "success": success, "failure": failure})).await?;
        let succeeded = answer.get("succeeded").and_then(Value::as_bool).unwrap_or(false);
        let revision = answer.pointer("/header/revision").map(number).unwrap_or(0);
        let mut ranges = Vec::new();
        for response in answer.get("responses").and_then(Value::as_array).into_iter().flatten() {
            if let Some(range) = response.get("response_range") {
                ranges.push(decode_kvs(range.get("kvs"))?);
            }
        }
        Ok(TxnOutcome { succeeded, revision, ranges })
    }
}

/// Ownership kept in etcd. Bytes never go there: only owners, members and manifest entries
/// (small pointers to objects in the store).
#[derive(Debug)]
pub struct EtcdCoordinator {
    client: Arc<EtcdClient>,
    prefix: String,
    ttl: Duration,
    /// This node's session; its keeper holds it weakly, to open the next one should it expire.
    session: Arc<Mutex<Option<Session>>>,
}

/// What opens and renews this node's sessions: the coordinator, or the keeper of a session
/// that expired, which opens the next one itself.
#[derive(Debug, Clone)]
struct SessionHost {
    client: Arc<EtcdClient>,
    prefix: String,
    ttl: Duration,
    /// The coordinator's session; gone once the coordinator is dropped (its keeper then stops).
    slot: Weak<Mutex<Option<Session>>>,
}

#[derive(Debug)]
struct Session {
    lease: i64,
    clock: Arc<LeaseClock>,
    member: Member,
    keeper: tokio::task::JoinHandle<()>,
}

#[derive(serde::Serialize, Deserialize)]
struct OwnerValue {
    node: String,
    incarnation: String,
}

impl EtcdCoordinator {
    /// A coordinator over `client`, with keys under `prefix` (`/kura/<cluster>/`) and a session
    /// lease of `ttl`.
    pub fn new(client: EtcdClient, prefix: &str, ttl: Duration) -> Self {
        let prefix = format!("{}/", prefix.trim_end_matches('/'));
        EtcdCoordinator { client: Arc::new(client), prefix, ttl, session: Arc::new(Mutex::new(None)) }
    }

    fn session_host(&self) -> SessionHost {
        SessionHost {
            client: self.client.clone(),
            prefix: self.prefix.clone(),
            ttl: self.ttl,
            slot: Arc::downgrade(&self.session),
        }
    }

    fn key(&self, parts: &[&str]) -> Vec<u8> {
        key_under(&self.prefix, parts)
    }

    fn manifest_prefix(&self, resource: &str) -> Vec<u8> {
        self.key(&["manifest", resource, ""])
    }

    async fn session(&self) -> Result<(i64, Arc<LeaseClock>, Member), CoordinatorError> {
        let session = self.session.lock().await;
        let session = session.as_ref().ok_or_else(|| CoordinatorError::Unavailable {
            at: self.describe(),
            message: "this node has not joined the cluster".into(),
        })?;
        if !session.clock.is_valid() {
            return Err(CoordinatorError::Unavailable {
                at: self.describe(),
                message: "this node's session has expired".into(),
            });
        }
        Ok((session.lease, session.clock.clone(), session.member.clone()))
    }

    fn owner_of(kv: &KeyValue) -> Result<Owner, CoordinatorError> {
        let value: OwnerValue = serde_json::from_slice(&kv.value).map_err(|e| corrupt("owner", e))?;
        Ok(Owner { node: value.node, incarnation: value.incarnation, epoch: kv.create_revision as u64 })
    }

    async fn next_seq(&self, resource: &str) -> Result<u64, CoordinatorError> {
        let prefix = self.manifest_prefix(resource);
        let outcome = self.client.txn(&[], &[op::last_with_prefix(&prefix)], &[]).await?;
        Ok(Self::last_seq(&prefix, &outcome.ranges)? + 1)
    }

    fn last_seq(prefix: &[u8], ranges: &[Vec<KeyValue>]) -> Result<u64, CoordinatorError> {
        let Some(last) = ranges.last().and_then(|r| r.first()) else { return Ok(0) };
        let seq = last.key.strip_prefix(prefix).and_then(|s| std::str::from_utf8(s).ok()).and_then(|s| s.parse().ok());
        seq.ok_or_else(|| corrupt(&String::from_utf8_lossy(&last.key), "not a manifest position"))
    }

    /// Opens a fresh session if the current one expired (a pause longer than the TTL). The
    /// session stays locked from the check to the new session's start: requests that all find
    /// it expired at once open one session between them, not one each with the member entry
    /// left on whichever lease was granted last.
    async fn rejoin_if_expired(&self) -> Result<(), CoordinatorError> {
        let mut session = self.session.lock().await;
        let member = match session.as_ref() {
            Some(s) if !s.clock.is_valid() => s.member.clone(),
            _ => return Ok(()),
        };
        let previous = self.session_host().open_session(&mut session, member).await?;
        end_session(previous);
        Ok(())
    }
}

/// The etcd key of `parts` under `prefix` (which ends in `/`).
fn key_under(prefix: &str, parts: &[&str]) -> Vec<u8> {
    format!("{prefix}{}", parts.join("/")).into_bytes()
}

/// Stops a replaced session's renewals; the leases it carried have ended.
fn end_session(session: Option<Session>) {
    if let Some(session) = session {
        session.keeper.abort();
        session.clock.lose();
    }
}

impl SessionHost {
    /// Grants a session lease, enters `member` on it and keeps it renewed, in place of the
    /// session in `slot`, which it answers (its renewals are the caller's to stop).
    async fn open_session(
        &self,
        slot: &mut Option<Session>,
        member: Member,
    ) -> Result<Option<Session>, CoordinatorError> {
        let sent = Instant::now();
        let (lease, granted) = self.client.grant(self.ttl).await?;
        let clock = LeaseClock::new();
        clock.renewed(sent, granted);
        let value = serde_json::to_vec(&member).expect("a member serialises");
        let key = key_under(&self.prefix, &["members", &member.node]);
        if let Err(error) = self.client.put(&key, &value, lease).await {
            // Not left to run out: a retried rejoin would leave one such lease per attempt.
            let _ = self.client.revoke(lease).await;
            return Err(error);
        }
        let keeper = tokio::spawn(self.clone().keep(lease, clock.clone(), granted));
        Ok(slot.replace(Session { lease, clock, member, keeper }))
    }

    /// Renews the session every third of its TTL. On expiry, the leases it carried are gone
    /// (their clock is lost) and the keeper opens the next session itself, so a node with
    /// nothing to acquire is back among the members within a renewal (it would otherwise stay
    /// out of them until its next acquire). Boxed: the next session's keeper is this future.
    fn keep(self, lease: i64, clock: Arc<LeaseClock>, ttl: Duration) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                if self.slot.strong_count() == 0 {
                    return; // the coordinator is gone: its leases run out as a stopped node's
                }
                if !clock.is_valid() {
                    tracing::warn!(lease, "the etcd session's renewal is late: this node's leases lapsed meanwhile");
                }
                let sent = Instant::now();
                match self.client.keep_alive(lease).await {
                    Ok(Some(granted)) => clock.renewed(sent, granted),
                    Ok(None) => {
                        tracing::warn!(lease, "the etcd session expired: this node's leases have ended");
                        clock.lose();
                        return self.rejoin_after(lease).await;
                    }
                    Err(error) => tracing::warn!(%error, "renewing the etcd session failed; retrying"),
                }
            }
        })
    }

    /// Opens a new session in place of the expired `lease`, unless one already replaced it (an
    /// acquire that found it expired) or the coordinator is gone; retried until etcd answers.
    async fn rejoin_after(&self, expired: i64) {
        loop {
            let Some(slot) = self.slot.upgrade() else { return };
            let mut session = slot.lock().await;
            let member = match session.as_ref() {
                Some(s) if s.lease == expired => s.member.clone(),
                _ => return,
            };
            match self.open_session(&mut session, member).await {
                // The session replaced is this keeper's own: its clock is lost already, and the
                // keeper ends here.
                Ok(_expired) => {
                    if Arc::strong_count(&slot) > 1 {
                        tracing::info!(expired, "rejoined the cluster with a new etcd session");
                    } else if let Some(new) = session.take() {
                        // The coordinator was dropped meanwhile: a stopped node announces nothing.
                        let lease = new.lease;
                        end_session(Some(new));
                        let _ = self.client.revoke(lease).await;
                    }
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, "rejoining the cluster after the session expired failed; retrying")
                }
            }
            drop(session);
            drop(slot);
            tokio::time::sleep(self.ttl / 3).await;
        }
    }
}

impl EtcdCoordinator {
    /// The etcd lease of this node's session, for `kura node status` (and for tests that end
    /// it behind the node's back, as an etcd that lost it would).
    pub async fn session_lease(&self) -> Option<i64> {
        self.session.lock().await.as_ref().map(|s| s.lease)
    }
}

impl Drop for EtcdCoordinator {
    /// A dropped coordinator stops renewing: its leases run out as a stopped node's would.
    fn drop(&mut self) {
        // A keeper busy opening the next session holds the lock; it finds the coordinator
        // gone at its next renewal and stops.
        if let Ok(mut session) = self.session.try_lock() {
            end_session(session.take());
        }
    }
}

#[async_trait]
impl Coordinator for EtcdCoordinator {
    fn describe(&self) -> String {
        format!("etcd at {}", self.client.endpoints().join(","))
    }

    async fn join(&self, member: Member) -> Result<(), CoordinatorError> {
        let mut session = self.session.lock().await;
        let previous = self.session_host().open_session(&mut session, member).await?;
        end_session(previous);
        Ok(())
    }

    async fn members(&self) -> Result<Vec<Member>, CoordinatorError> {
        let prefix = self.key(&["members", ""]);
        let kvs = self.client.range_prefix(&prefix, &prefix).await?;
        kvs.iter().map(|kv| serde_json::from_slice(&kv.value).map_err(|e| corrupt("member", e))).collect()
    }

    async fn acquire(&self, resource: &str) -> Result<Acquired, CoordinatorError> {
        check_resource(resource)?;
        self.rejoin_if_expired().await?;
        let (session, clock, member) = self.session().await?;
        let key = self.key(&["owner", resource]);
        let value =
            serde_json::to_vec(&OwnerValue { node: member.node.clone(), incarnation: member.incarnation.clone() })
                .expect("an owner serialises");
        let prefix = self.manifest_prefix(resource);
        let outcome = self
            .client
            .txn(
                &[op::created_at(&key, 0)],
                &[op::put(&key, &value, session), op::last_with_prefix(&prefix)],
                &[op::get(&key)],
            )
            .await?;
        if outcome.succeeded {
            let next = Self::last_seq(&prefix, &outcome.ranges)? + 1;
            return Ok(Acquired::Owned(Lease::new(resource, outcome.revision as u64, next, clock)));
        }
        let Some(kv) = outcome.ranges.first().and_then(|r| r.first()) else {
            // Released between the comparison and the read: the next call will tell.
            return Err(CoordinatorError::Unavailable {
                at: self.describe(),
                message: format!("{resource} changed hands; retry"),
            });
        };
        let owner = Self::owner_of(kv)?;
        if owner.node == member.node && owner.incarnation == member.incarnation {
            // An earlier attempt of this very call landed (its answer was lost), or the key
            // hangs off a session that expired while this node was paused: it moves to the
            // current session (a put keeps its create_revision, so the epoch stays), or the old
            // session's expiry would end the ownership behind this lease's back.
            if kv.lease != session {
                let moved = self
                    .client
                    .txn(&[op::created_at(&key, owner.epoch as i64)], &[op::put(&key, &kv.value, session)], &[])
                    .await?;
                if !moved.succeeded {
                    return Err(CoordinatorError::Unavailable {
                        at: self.describe(),
                        message: format!("{resource} changed hands; retry"),
                    });
                }
            }
            let next = self.next_seq(resource).await?;
            return Ok(Acquired::Owned(Lease::new(resource, owner.epoch, next, clock)));
        }
        Ok(Acquired::Held(owner))
    }

    async fn owner(&self, resource: &str) -> Result<Option<Owner>, CoordinatorError> {
        check_resource(resource)?;
        let kv = self.client.get(&self.key(&["owner", resource])).await?;
        kv.as_ref().map(Self::owner_of).transpose()
    }

    async fn publish(&self, lease: &Lease, entry: Bytes) -> Result<u64, CoordinatorError> {
        if !lease.is_valid() {
            return Err(lease.fenced());
        }
        let owner = self.key(&["owner", lease.resource()]);
        let value = encode_entry(lease.epoch(), &entry);
        // While this lease is the ownership, only its own publishes can take a position: one
        // found taken is an earlier attempt of ours whose answer was lost, and is passed over
        // (a repeated shipment only rewrites the same bytes).
        for _ in 0..16 {
            let seq = lease.next_seq();
            let slot = self.key(&["manifest", lease.resource(), &seq_name(seq)]);
            let outcome = self
                .client
                .txn(
                    &[op::created_at(&owner, lease.epoch() as i64), op::created_at(&slot, 0)],
                    &[op::put(&slot, &value, 0)],
                    &[op::get(&owner), op::get(&slot)],
                )
                .await?;
            // Ours first: an attempt whose answer was lost (the client retried on another
            // member) may have landed while this lease was the ownership, and then it is in the
            // manifest — published — even if the ownership has moved on since.
            let ours =
                outcome.succeeded || outcome.ranges.get(1).and_then(|r| r.first()).is_some_and(|kv| kv.value == value);
            if ours {
                lease.published(seq);
                return Ok(seq);
            }
            let still_owner = outcome
                .ranges
                .first()
                .and_then(|r| r.first())
                .is_some_and(|kv| kv.create_revision as u64 == lease.epoch());
            if !still_owner {
                return Err(lease.fenced());
            }
            lease.published(seq);
        }
        Err(CoordinatorError::Unavailable {
            at: self.describe(),
            message: format!("{}: every manifest position tried was taken", lease.resource()),
        })
    }

    async fn manifest(&self, resource: &str, after: u64) -> Result<Vec<Published>, CoordinatorError> {
        check_resource(resource)?;
        let prefix = self.manifest_prefix(resource);
        let from = self.key(&["manifest", resource, &seq_name(after + 1)]);
        let kvs = self.client.range_prefix(&prefix, &from).await?;
        let entries = kvs
            .iter()
            .map(|kv| {
                let seq = Self::last_seq(&prefix, std::slice::from_ref(&vec![kv.clone()]))?;
                decode_entry(&String::from_utf8_lossy(&kv.key), seq, &kv.value)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(monotonic(entries))
    }

    async fn forget(&self, lease: &Lease, before: u64) -> Result<(), CoordinatorError> {
        if !lease.is_valid() {
            return Err(lease.fenced());
        }
        let owner = self.key(&["owner", lease.resource()]);
        let from = self.manifest_prefix(lease.resource());
        let to = self.key(&["manifest", lease.resource(), &seq_name(before)]);
        let outcome = self
            .client
            .txn(&[op::created_at(&owner, lease.epoch() as i64)], &[op::delete(&from, Some(&to))], &[])
            .await?;
        if outcome.succeeded { Ok(()) } else { Err(lease.fenced()) }
    }

    async fn release(&self, lease: &Lease) -> Result<(), CoordinatorError> {
        let owner = self.key(&["owner", lease.resource()]);
        lease.end();
        self.client.txn(&[op::created_at(&owner, lease.epoch() as i64)], &[op::delete(&owner, None)], &[]).await?;
        Ok(())
    }

    async fn leave(&self) -> Result<(), CoordinatorError> {
        let Some(session) = self.session.lock().await.take() else { return Ok(()) };
        session.keeper.abort();
        session.clock.lose();
        self.client.revoke(session.lease).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transaction whose answer is cut short after its headers (this process paused while
    /// reading it, a member dying) may have applied: it is asked again, never read as an empty
    /// "did not succeed" — which a publish would take for being fenced, and refuse a commit
    /// the manifest holds.
    #[tokio::test]
    async fn an_answer_cut_short_is_asked_again_not_taken_for_a_failure() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            for answer in [
                "HTTP/1.1 200 OK\r\ncontent-length: 200\r\n\r\n{\"header\":",
                "HTTP/1.1 200 OK\r\ncontent-length: 18\r\n\r\n{\"succeeded\":true}",
            ] {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut request = vec![0u8; 4096];
                let _ = socket.read(&mut request).await;
                socket.write_all(answer.as_bytes()).await.unwrap();
                // The first answer ends here, 180 bytes short.
            }
        });
        let outcome = EtcdClient::new(vec![endpoint]).txn(&[], &[], &[]).await.unwrap();
        assert!(outcome.succeeded, "the second, whole answer counts");
    }

    #[test]
    fn prefix_end_is_the_next_key_after_every_key_with_the_prefix() {
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
    }
}
