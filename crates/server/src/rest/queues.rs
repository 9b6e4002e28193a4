//! Queues' v4 endpoints, as wrangler's `queues` commands, `wrangler deploy` and Cloudflare's
//! SDKs call them: queues (create, list with name filters, info, update, delete, purge), their
//! consumer (a Worker's or an HTTP pull consumer), and messages over HTTP (send, send a batch,
//! pull with a visibility timeout, acknowledge and retry by lease).

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value as Json, json};

use kura_catalog::{ConsumerSettings, DeadLetter, Queue, QueueConsumer, spent, spent_on_lease};
use kura_queues::{ContentType, DeadLetterTo, NewMessage, QueueError};

use crate::auth::{Caller, Need};
use crate::error::{ApiError, ResultInfo, ok, ok_paged};
use crate::extract::{V4Path, parse_json, read_body};
use crate::render::queue_json;
use crate::state::AppState;

fn not_found() -> ApiError {
    QueueError::NotFound.into()
}

/// The account's queue `id`, for a caller that may do `need` there.
fn reach(app: &AppState, caller: &Caller, account_id: &str, id: &str, need: Need) -> Result<Queue, ApiError> {
    caller.require(account_id, need)?;
    app.catalog.queue(account_id, id)?.filter(|q| q.id == id.to_ascii_lowercase()).ok_or_else(not_found)
}

fn catalog_error(e: kura_catalog::Error) -> ApiError {
    match e {
        kura_catalog::Error::Duplicate { .. } => {
            ApiError::new(StatusCode::CONFLICT, 11009, "A queue with this name already exists")
        }
        kura_catalog::Error::Invalid(m) => ApiError::new(StatusCode::BAD_REQUEST, 100128, m),
        kura_catalog::Error::Conflict(m) => ApiError::new(StatusCode::CONFLICT, 100127, m),
        kura_catalog::Error::LimitReached { .. } => {
            ApiError::new(StatusCode::BAD_REQUEST, 10253, "too many queues in this account")
        }
        other => other.into(),
    }
}

/// For each queue of the account, the Workers that produce to it.
fn producers(app: &AppState, account_id: &str) -> Result<HashMap<String, Vec<String>>, ApiError> {
    match &app.workers {
        Some(workers) => Ok(workers.queue_producers(account_id)?),
        None => Ok(HashMap::new()),
    }
}

/// The queue as the API shows it, with its consumer and the Workers that produce to it.
fn shown_with(app: &AppState, queue: &Queue, producers: &HashMap<String, Vec<String>>) -> Result<Json, ApiError> {
    let consumers = app.catalog.queue_consumers(&queue.id)?;
    Ok(queue_json(queue, &consumers, producers.get(&queue.name).map_or(&[], Vec::as_slice)))
}

/// One queue as the API shows it.
fn shown(app: &AppState, queue: &Queue) -> Result<Json, ApiError> {
    shown_with(app, queue, &producers(app, &queue.account_id)?)
}

/// `GET /accounts/{a}/queues`: `page`, `per_page` and any number of `name` filters.
pub async fn list(
    State(app): State<AppState>,
    caller: Caller,
    V4Path(account_id): V4Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::QueuesRead)?;
    let pairs = crate::s3::url::query_pairs(query.as_deref().unwrap_or(""), true);
    let number = |name: &str, default: u64| -> Result<u64, ApiError> {
        match pairs.iter().find(|(k, _)| k == name) {
            Some((_, v)) => v.parse().map_err(|_| ApiError::bad_request(format!("invalid {name} '{v}'"))),
            None => Ok(default),
        }
    };
    let page = number("page", 1)?.max(1);
    let per_page = number("per_page", 20)?.clamp(1, 1000);
    let names: Vec<&str> = pairs.iter().filter(|(k, _)| k == "name").map(|(_, v)| v.as_str()).collect();
    let all: Vec<Queue> = app
        .catalog
        .list_queues(&account_id)?
        .into_iter()
        .filter(|q| names.is_empty() || names.contains(&q.name.as_str()))
        .collect();
    let total = all.len() as u64;
    let producers = producers(&app, &account_id)?;
    let shown_page = all
        .iter()
        .skip(usize::try_from((page - 1).saturating_mul(per_page)).unwrap_or(usize::MAX))
        .take(per_page as usize)
        .map(|q| shown_with(&app, q, &producers))
        .collect::<Result<Vec<_>, _>>()?;
    let info = ResultInfo::numbered(page, per_page, shown_page.len() as u64, total);
    Ok(ok_paged(shown_page, info))
}

#[derive(Deserialize)]
struct QueueSettings {
    delivery_delay: Option<u32>,
    delivery_paused: Option<bool>,
    message_retention_period: Option<u32>,
}

#[derive(Deserialize)]
struct CreateBody {
    queue_name: String,
    #[serde(default)]
    settings: Option<QueueSettings>,
}

fn check_settings(settings: &QueueSettings) -> Result<(), ApiError> {
    let invalid = |m: &str| {
        ApiError::new(StatusCode::BAD_REQUEST, 100128, format!("The specified queue settings are invalid: {m}"))
    };
    if settings.delivery_delay.is_some_and(|d| d > kura_queues::MAX_DELAY_SECONDS) {
        return Err(invalid("delivery_delay must be from 0 to 43200"));
    }
    if settings.message_retention_period.is_some_and(|r| !(60..=1_209_600).contains(&r)) {
        return Err(invalid("message_retention_period must be from 60 to 1209600"));
    }
    Ok(())
}

/// `POST /accounts/{a}/queues` with `{queue_name, settings?}`.
pub async fn create(
    State(app): State<AppState>,
    caller: Caller,
    V4Path(account_id): V4Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::QueuesWrite)?;
    let body: CreateBody = parse_json(&read_body(body).await?)?;
    let settings = body.settings.unwrap_or(QueueSettings {
        delivery_delay: None,
        delivery_paused: None,
        message_retention_period: None,
    });
    check_settings(&settings)?;
    let queue = app
        .catalog
        .create_queue(
            &account_id,
            &body.queue_name,
            settings.delivery_delay.unwrap_or(0),
            settings.message_retention_period.unwrap_or(345_600),
        )
        .map_err(catalog_error)?;
    if let Err(e) = app.queues.create_queue(&queue.id).await {
        let _ = app.catalog.delete_queue(&account_id, &queue.id);
        return Err(e.into());
    }
    Ok(ok(shown(&app, &queue)?))
}

/// `GET /accounts/{a}/queues/{queue_id}`
pub async fn details(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let queue = reach(&app, &caller, &account_id, &id, Need::QueuesRead)?;
    let mut shown = shown(&app, &queue)?;
    let backlog = app.queues.backlog(&queue.id).await?;
    shown["backlog"] = json!({
        "count": backlog.count,
        "bytes": backlog.bytes,
        "oldest_message_timestamp_ms": backlog.oldest_ms,
        "in_flight": backlog.in_flight,
        "delayed": backlog.delayed,
    });
    Ok(ok(shown))
}

#[derive(Deserialize)]
struct UpdateBody {
    #[serde(default)]
    queue_name: Option<String>,
    #[serde(default)]
    settings: Option<QueueSettings>,
}

/// `PATCH` or `PUT /accounts/{a}/queues/{queue_id}` with `{queue_name?, settings}` (wrangler's
/// `queues update`, `pause-delivery`, `resume-delivery`). A queue keeps its name.
pub async fn update(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    let queue = reach(&app, &caller, &account_id, &id, Need::QueuesWrite)?;
    let body: UpdateBody = parse_json(&read_body(body).await?)?;
    if body.queue_name.as_deref().is_some_and(|n| n != queue.name) {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, 100128, "kura cannot rename a queue"));
    }
    let settings = body.settings.unwrap_or(QueueSettings {
        delivery_delay: None,
        delivery_paused: None,
        message_retention_period: None,
    });
    check_settings(&settings)?;
    let updated = app
        .catalog
        .update_queue(
            &account_id,
            &queue.id,
            settings.delivery_delay.unwrap_or(queue.delivery_delay),
            settings.message_retention_period.unwrap_or(queue.retention_seconds),
            settings.delivery_paused.unwrap_or(queue.delivery_paused),
        )?
        .ok_or_else(not_found)?;
    if let Some(workers) = &app.workers {
        workers.queues_changed();
    }
    Ok(ok(shown(&app, &updated)?))
}

/// `DELETE /accounts/{a}/queues/{queue_id}`: the catalog forgets it, then its messages go.
pub async fn delete(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let queue = reach(&app, &caller, &account_id, &id, Need::QueuesWrite)?;
    if !app.catalog.delete_queue(&account_id, &queue.id)? {
        return Err(not_found());
    }
    if let Some(workers) = &app.workers {
        workers.queues_changed();
    }
    if let Err(e) = app.queues.delete_queue(&queue.id).await {
        tracing::warn!(queue = queue.name, error = %e, "could not remove a deleted queue's file");
    }
    Ok(ok(Json::Null))
}

/// `POST /accounts/{a}/queues/{queue_id}/purge`: every message goes.
pub async fn purge(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let queue = reach(&app, &caller, &account_id, &id, Need::QueuesWrite)?;
    app.queues.purge(&queue.id).await?;
    Ok(ok(shown(&app, &queue)?))
}

#[derive(Deserialize)]
struct ConsumerBody {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    script_name: Option<String>,
    #[serde(default)]
    script: Option<String>,
    #[serde(default)]
    service: Option<String>,
    #[serde(default)]
    settings: Option<Json>,
    #[serde(default)]
    dead_letter_queue: Option<String>,
}

async fn set_consumer(
    app: &AppState,
    queue: &Queue,
    replacing: Option<&str>,
    body: Body,
) -> Result<QueueConsumer, ApiError> {
    let body: ConsumerBody = parse_json(&read_body(body).await?)?;
    let kind = body.kind.as_deref().unwrap_or("worker");
    if !matches!(kind, "worker" | "http_pull") {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            100127,
            format!("kura has no '{kind}' consumers: use worker or http_pull"),
        ));
    }
    let script = body.script_name.or(body.script).or(body.service).filter(|s| !s.is_empty());
    if kind == "worker" && script.is_none() {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, 100127, "a worker consumer names its script (script_name)"));
    }
    let settings = ConsumerSettings::parse(kind, body.settings.as_ref())
        .map_err(|m| ApiError::new(StatusCode::BAD_REQUEST, 100127, m))?;
    let dead_letter_queue = body.dead_letter_queue.filter(|d| !d.is_empty());
    if dead_letter_queue.as_deref() == Some(queue.name.as_str()) {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, 100127, "a queue cannot be its own dead-letter queue"));
    }
    if let Some(name) = &dead_letter_queue
        && app.catalog.queue(&queue.account_id, name)?.is_none_or(|q| q.name != *name)
    {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            100127,
            format!(
                "The dead letter queue \"{name}\" does not exist. To create it, run: wrangler queues create {name}"
            ),
        ));
    }
    let consumer = app
        .catalog
        .set_queue_consumer(
            &queue.id,
            replacing,
            kind,
            script.as_deref().filter(|_| kind == "worker"),
            &settings.to_json(kind).to_string(),
            dead_letter_queue.as_deref(),
        )
        .map_err(catalog_error)?;
    if let Some(workers) = &app.workers {
        workers.queues_changed();
    }
    Ok(consumer)
}

/// `POST /accounts/{a}/queues/{queue_id}/consumers`: a Worker's consumer or an HTTP pull one.
pub async fn add_consumer(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    let queue = reach(&app, &caller, &account_id, &id, Need::QueuesWrite)?;
    let consumer = set_consumer(&app, &queue, None, body).await?;
    Ok(ok(crate::render::queue_consumer_json(&queue, &consumer)))
}

/// `GET /accounts/{a}/queues/{queue_id}/consumers`
pub async fn list_consumers(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let queue = reach(&app, &caller, &account_id, &id, Need::QueuesRead)?;
    let consumers = app.catalog.queue_consumers(&queue.id)?;
    Ok(ok(consumers.iter().map(|c| crate::render::queue_consumer_json(&queue, c)).collect::<Vec<_>>()))
}

/// `PUT /accounts/{a}/queues/{queue_id}/consumers/{consumer_id}`: the consumer's new settings.
pub async fn replace_consumer(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id, consumer_id)): V4Path<(String, String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    let queue = reach(&app, &caller, &account_id, &id, Need::QueuesWrite)?;
    let consumer = set_consumer(&app, &queue, Some(&consumer_id), body).await?;
    Ok(ok(crate::render::queue_consumer_json(&queue, &consumer)))
}

/// `DELETE /accounts/{a}/queues/{queue_id}/consumers/{consumer_id}`
pub async fn delete_consumer(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id, consumer_id)): V4Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let queue = reach(&app, &caller, &account_id, &id, Need::QueuesWrite)?;
    if !app.catalog.delete_queue_consumer(&queue.id, &consumer_id)? {
        return Err(ApiError::new(StatusCode::NOT_FOUND, 100127, "the queue has no such consumer"));
    }
    if let Some(workers) = &app.workers {
        workers.queues_changed();
    }
    Ok(ok(Json::Null))
}

/// `GET /accounts/{a}/queues/{queue_id}/messages?limit=N` (kura's own, for the console): up
/// to 100 messages, oldest first, as they wait — read without leasing or counting them.
pub async fn peek(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
    crate::extract::V4Query(query): crate::extract::V4Query,
) -> Result<Response, ApiError> {
    let queue = reach(&app, &caller, &account_id, &id, Need::QueuesRead)?;
    let limit = crate::extract::query_number(&query, "limit")?.unwrap_or(20).clamp(1, 100) as usize;
    let messages = app.queues.peek(&queue.id, limit).await?;
    let shown: Vec<Json> = messages
        .iter()
        .map(|m| {
            let body = match m.content_type {
                ContentType::Text | ContentType::Json => String::from_utf8_lossy(&m.body).into_owned(),
                _ => base64::engine::general_purpose::STANDARD.encode(&m.body),
            };
            json!({
                "id": m.id,
                "body": body,
                "content_type": m.content_type.as_str(),
                "timestamp_ms": m.sent_ms,
                "attempts": m.attempts,
                "visible_at_ms": m.visible_ms,
                "in_flight": m.in_flight,
            })
        })
        .collect();
    Ok(ok(shown))
}

#[derive(Deserialize)]
struct HttpMessage {
    body: Json,
    #[serde(default)]
    content_type: Option<String>,
    #[serde(default)]
    delay_seconds: Option<u32>,
}

#[derive(Deserialize)]
struct HttpBatch {
    messages: Vec<HttpMessage>,
    #[serde(default)]
    delay_seconds: Option<u32>,
}

/// A message sent over HTTP: `text` takes a string, `json` (the default) any JSON value.
fn http_message(message: HttpMessage) -> Result<NewMessage, ApiError> {
    let content_type = ContentType::parse(message.content_type.as_deref().unwrap_or("json"))?;
    let body = match (content_type, message.body) {
        (ContentType::Text, Json::String(text)) => text.into_bytes(),
        (ContentType::Text, _) => {
            return Err(QueueError::InvalidContentType("text (the body is not a string)".into()).into());
        }
        (ContentType::Json, value) => value.to_string().into_bytes(),
        (other, _) => return Err(QueueError::InvalidContentType(other.as_str().into()).into()),
    };
    Ok(NewMessage { body, content_type, delay_seconds: message.delay_seconds })
}

fn metrics_json(backlog: &kura_queues::Backlog) -> Json {
    json!({"metadata": {"metrics": {
        "backlog_count": backlog.count,
        "backlog_bytes": backlog.bytes,
        "oldest_message_timestamp_ms": backlog.oldest_ms.unwrap_or(0),
    }}})
}

/// `POST /accounts/{a}/queues/{queue_id}/messages`: one message, `{body, content_type?,
/// delay_seconds?}`, durable when answered.
pub async fn send(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    let queue = reach(&app, &caller, &account_id, &id, Need::QueuesWrite)?;
    let message = http_message(parse_json(&read_body(body).await?)?)?;
    let backlog = app.queues.send(&queue.id, vec![message], queue.delivery_delay).await?;
    notify(&app, &queue);
    Ok(ok(metrics_json(&backlog)))
}

/// `POST /accounts/{a}/queues/{queue_id}/messages/batch`: up to 100 messages at once.
pub async fn send_batch(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    let queue = reach(&app, &caller, &account_id, &id, Need::QueuesWrite)?;
    let batch: HttpBatch = parse_json(&read_body(body).await?)?;
    let default_delay = batch.delay_seconds.unwrap_or(queue.delivery_delay);
    let messages = batch.messages.into_iter().map(http_message).collect::<Result<Vec<_>, _>>()?;
    let backlog = app.queues.send(&queue.id, messages, default_delay).await?;
    notify(&app, &queue);
    Ok(ok(metrics_json(&backlog)))
}

/// Spent messages to the consumer's dead-letter queue, or dropped.
async fn dead_letter(
    app: &AppState,
    queue: &Queue,
    consumer: &QueueConsumer,
    spent: Vec<kura_queues::Message>,
) -> Result<(), ApiError> {
    let target = app.catalog.dead_letter_target(queue, consumer)?;
    let to = match &target {
        DeadLetter::Dropped => DeadLetterTo::Drop,
        DeadLetter::Queue(target) => DeadLetterTo::Queue(&target.id),
        DeadLetter::Missing(name) => DeadLetterTo::Missing(name),
    };
    app.queues.dead_letter(&queue.id, to, spent).await?;
    Ok(())
}

fn notify(app: &AppState, queue: &Queue) {
    if let Some(workers) = &app.workers {
        workers.queue_sent(&queue.id);
    }
}

fn pull_consumer(app: &AppState, queue: &Queue) -> Result<QueueConsumer, ApiError> {
    app.catalog.queue_consumers(&queue.id)?.into_iter().find(|c| c.kind == "http_pull").ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            100127,
            format!(
                "Queue \"{}\" has no HTTP pull consumer: add one with `wrangler queues consumer http add`",
                queue.name
            ),
        )
    })
}

#[derive(Deserialize, Default)]
struct PullBody {
    #[serde(default)]
    batch_size: Option<u32>,
    #[serde(default)]
    visibility_timeout_ms: Option<u32>,
}

/// `POST /accounts/{a}/queues/{queue_id}/messages/pull`: up to `batch_size` messages, each
/// leased for `visibility_timeout_ms`. `text` bodies come as text, others base64. A message
/// past its retries goes to the dead-letter queue instead.
pub async fn pull(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    let queue = reach(&app, &caller, &account_id, &id, Need::QueuesWrite)?;
    let consumer = pull_consumer(&app, &queue)?;
    let settings = ConsumerSettings::of(&consumer);
    let bytes = read_body(body).await?;
    let asked: PullBody =
        if bytes.iter().all(u8::is_ascii_whitespace) { PullBody::default() } else { parse_json(&bytes)? };
    let batch_size = asked.batch_size.unwrap_or(settings.batch_size);
    let visibility = asked.visibility_timeout_ms.unwrap_or(settings.visibility_timeout_ms);
    if !(1..=100).contains(&batch_size) || !(1..=43_200_000).contains(&visibility) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            100127,
            "batch_size must be from 1 to 100 and visibility_timeout_ms from 1 to 43200000",
        ));
    }
    let leased = app.queues.lease(&queue.id, batch_size as usize, i64::from(visibility)).await?;
    let (spent_ones, delivered): (Vec<_>, Vec<_>) =
        leased.into_iter().partition(|m| spent_on_lease(m.attempts, &settings));
    dead_letter(&app, &queue, &consumer, spent_ones).await?;
    let backlog = app.queues.totals(&queue.id).await?;
    let messages: Vec<Json> = delivered
        .iter()
        .map(|m| {
            let body = match m.content_type {
                ContentType::Text => String::from_utf8_lossy(&m.body).into_owned(),
                _ => base64::engine::general_purpose::STANDARD.encode(&m.body),
            };
            json!({
                "id": m.id,
                "body": body,
                "timestamp_ms": m.sent_ms,
                "attempts": m.attempts,
                "lease_id": m.lease_id,
                "metadata": {"CF-sourceMessageSource": "api", "CF-Content-Type": m.content_type.as_str()},
            })
        })
        .collect();
    Ok(ok(json!({"messages": messages, "message_backlog_count": backlog.count})))
}

#[derive(Deserialize)]
struct Lease {
    lease_id: String,
    #[serde(default)]
    delay_seconds: Option<u32>,
}

#[derive(Deserialize)]
struct AckBody {
    #[serde(default)]
    acks: Vec<Lease>,
    #[serde(default)]
    retries: Vec<Lease>,
}

/// `POST /accounts/{a}/queues/{queue_id}/messages/ack`: acknowledges and retries pulled
/// messages by lease. A retry of a message that had its last delivery dead-letters it.
pub async fn ack(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, id)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    let queue = reach(&app, &caller, &account_id, &id, Need::QueuesWrite)?;
    let consumer = pull_consumer(&app, &queue)?;
    let settings = ConsumerSettings::of(&consumer);
    let asked: AckBody = parse_json(&read_body(body).await?)?;
    for delay in asked.retries.iter().filter_map(|r| r.delay_seconds) {
        if delay > kura_queues::MAX_DELAY_SECONDS {
            return Err(QueueError::InvalidDelay(delay.to_string()).into());
        }
    }
    let retry_leases: Vec<String> = asked.retries.iter().map(|r| r.lease_id.clone()).collect();
    let held = app.queues.held(&queue.id, retry_leases).await?;
    let (spent_ones, retried): (Vec<_>, Vec<_>) = held.into_iter().partition(|m| spent(m.attempts, &settings));
    let spent_count = spent_ones.len();
    dead_letter(&app, &queue, &consumer, spent_ones).await?;
    let retries: Vec<(String, u32)> = retried
        .iter()
        .map(|m| {
            let delay = asked.retries.iter().find(|r| r.lease_id == m.lease_id).and_then(|r| r.delay_seconds);
            (m.lease_id.clone(), delay.unwrap_or(settings.retry_delay))
        })
        .collect();
    let acks = asked.acks.into_iter().map(|a| a.lease_id).collect();
    let (acked, retried) = app.queues.settle(&queue.id, acks, retries).await?;
    let mut warnings = Vec::new();
    if spent_count > 0 {
        warnings.push(format!("{spent_count} message(s) had their last retry and left the queue"));
    }
    Ok(ok(json!({"ackCount": acked, "retryCount": retried + spent_count, "warnings": warnings})))
}
