//! workerd's queue producer binding: `env.QUEUE.send()`, `sendBatch()` and `metrics()` arrive
//! on the Workers' socket told apart by the queue header workerd adds — `POST /message` (the
//! serialized body, its format in `X-Msg-Fmt`), `POST /batch` (base64 bodies in JSON),
//! `GET /metrics`. A send is answered once its messages are durable. Failures carry Cloudflare's
//! code and cause in `CF-Queues-Error-Code` and `CF-Queues-Error-Cause`, which workerd shows
//! as `<cause> (<code>)`.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;

use kura_catalog::Queue;
use kura_queues::{Backlog, ContentType, NewMessage, QueueError};
use kura_workers::config::headers;

use crate::error::binding::status_line_failure;
use crate::extract::read_body;
use crate::state::AppState;

/// A request carrying [`headers::QUEUE`] is a producer binding's; any other goes on.
pub async fn serve(
    State(app): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(name) = request.headers().get(headers::QUEUE).and_then(|v| v.to_str().ok()).map(str::to_owned) else {
        return next.run(request).await;
    };
    let account = match super::worker_account(&app, request.headers()) {
        Ok(account) => account,
        Err(e) => return e.into_response(),
    };
    let queue = match app.catalog.queue(&account, &name) {
        Ok(Some(queue)) if queue.name == name => queue,
        Ok(_) => return failure(&QueueError::NotFound),
        Err(e) => return crate::error::ApiError::from(e).into_response(),
    };
    answer(&app, &queue, request).await.unwrap_or_else(|e| failure(&e))
}

/// A refusal as workerd reads it: the status, the code and cause in their headers, the cause
/// as the reason phrase too (what workerd shows without `queue_expose_error_codes`).
fn failure(e: &QueueError) -> Response {
    let status = match crate::error::queue_status(e) {
        StatusCode::INTERNAL_SERVER_ERROR => {
            tracing::error!(error = %e, "a queue send failed");
            StatusCode::INTERNAL_SERVER_ERROR
        }
        status => status,
    };
    let cause = match status {
        StatusCode::INTERNAL_SERVER_ERROR => "Unknown Internal Error".to_owned(),
        _ => e.to_string(),
    };
    let mut response = status_line_failure(status, &cause);
    if let Ok(value) = HeaderValue::from_str(&cause) {
        response.headers_mut().insert("cf-queues-error-cause", value);
    }
    response.headers_mut().insert("cf-queues-error-code", HeaderValue::from(e.code()));
    response
}

fn delay_header(headers: &HeaderMap, name: &str) -> Result<Option<u32>, QueueError> {
    match headers.get(name).and_then(|v| v.to_str().ok()) {
        Some(text) => kura_queues::parse_delay(text).map(Some),
        None => Ok(None),
    }
}

#[derive(Deserialize)]
struct Batch {
    messages: Vec<BatchMessage>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BatchMessage {
    body: String,
    #[serde(default)]
    content_type: Option<String>,
    #[serde(default)]
    delay_secs: Option<u32>,
}

async fn answer(app: &AppState, queue: &Queue, request: axum::extract::Request) -> Result<Response, QueueError> {
    // The send's own delay, else the producer binding's, else the queue's.
    let binding_delay = delay_header(request.headers(), headers::QUEUE_DELAY)?;
    let default_delay =
        delay_header(request.headers(), "x-msg-delay-secs")?.or(binding_delay).unwrap_or(queue.delivery_delay);
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let backlog = match (method, path.as_str()) {
        (Method::POST, "/message") => {
            let content_type = match request.headers().get("x-msg-fmt").and_then(|v| v.to_str().ok()) {
                Some(format) => ContentType::parse(format)?,
                None => ContentType::V8,
            };
            let body = read_message(request.into_body()).await?;
            let sent = app
                .queues
                .send(&queue.id, vec![NewMessage { body, content_type, delay_seconds: None }], default_delay)
                .await?;
            notify(app, queue);
            sent
        }
        (Method::POST, "/batch") => {
            let bytes = read_body(request.into_body())
                .await
                .map_err(|_| QueueError::BatchTooLarge(kura_queues::MAX_BATCH_BYTES + 1))?;
            let batch: Batch = serde_json::from_slice(&bytes)
                .map_err(|e| QueueError::InvalidContentType(format!("(the batch is malformed: {e})")))?;
            let messages = batch
                .messages
                .into_iter()
                .map(|m| {
                    let body = base64::engine::general_purpose::STANDARD
                        .decode(m.body.as_bytes())
                        .map_err(|_| QueueError::InvalidContentType("(a body is not base64)".into()))?;
                    let content_type = m.content_type.as_deref().map_or(Ok(ContentType::V8), ContentType::parse)?;
                    Ok(NewMessage { body, content_type, delay_seconds: m.delay_secs })
                })
                .collect::<Result<Vec<_>, QueueError>>()?;
            let sent = app.queues.send(&queue.id, messages, default_delay).await?;
            notify(app, queue);
            sent
        }
        (Method::GET, "/metrics") => {
            let backlog = app.queues.totals(&queue.id).await?;
            return Ok(axum::Json(metrics(&backlog)).into_response());
        }
        _ => return Ok(status_line_failure(StatusCode::NOT_FOUND, "no such queue operation")),
    };
    Ok(axum::Json(json!({"metadata": {"metrics": metrics(&backlog)}})).into_response())
}

/// A message's serialized body, refused past the limit without reading on.
async fn read_message(body: Body) -> Result<Vec<u8>, QueueError> {
    use futures_util::StreamExt as _;
    let mut stream = body.into_data_stream();
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| QueueError::InvalidContentType(format!("(the body could not be read: {e})")))?;
        out.extend_from_slice(&chunk);
        if out.len() > kura_queues::MAX_MESSAGE_BYTES {
            crate::extract::discard_rest(&mut stream, 1 << 20).await;
            return Err(QueueError::MessageTooLarge(out.len()));
        }
    }
    Ok(out)
}

fn metrics(backlog: &Backlog) -> serde_json::Value {
    json!({
        "backlogCount": backlog.count,
        "backlogBytes": backlog.bytes,
        "oldestMessageTimestamp": backlog.oldest_ms.unwrap_or(0),
    })
}

fn notify(app: &AppState, queue: &Queue) {
    if let Some(workers) = &app.workers {
        workers.queue_sent(&queue.id);
    }
}
