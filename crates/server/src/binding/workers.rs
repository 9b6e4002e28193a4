//! What the workerd kura supervises tells kura about its Workers: Durable Objects as they
//! start (so kura lists them by name), the events of their tail workers (their logs), and
//! their `env.ASSETS` requests.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use kura_workers::config::headers;

use crate::error::ApiError;
use crate::extract::read_body;
use crate::state::AppState;

#[derive(Deserialize)]
struct Announcement {
    class: String,
    id: String,
    #[serde(default)]
    name: Option<String>,
}

fn script_of(app: &AppState, request: &HeaderMap) -> Result<kura_catalog::WorkerScript, ApiError> {
    let workers = super::from_workerd(app, request)?;
    let id = request.get(headers::SCRIPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    workers.script_by_id(id).map_err(ApiError::from)
}

/// `POST /objects`: a Durable Object of a deployed class is starting. It joins its
/// namespace's index (with its name, when it was reached by one) before its first request.
pub async fn announce(State(app): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let outcome = async {
        let script = script_of(&app, &headers)?;
        let body = read_body(body).await?;
        let announced: Announcement = crate::extract::parse_json(&body)?;
        let workers = app.workers.as_ref().expect("checked");
        let namespace = workers.class_namespace(&script, &announced.class)?.ok_or_else(|| {
            ApiError::bad_request(format!("'{}' is no Durable Object class of '{}'", announced.class, script.name))
        })?;
        let engine_namespace = crate::resources::engine_namespace(&namespace)?;
        let id = engine_namespace.id_from_string(&announced.id).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let id = match announced.name {
            Some(name) if engine_namespace.id_from_name(&name) == id => engine_namespace.id_from_name(&name),
            Some(_) => return Err(ApiError::bad_request("the name does not derive the id")),
            None => id,
        };
        app.durable_objects.register(&engine_namespace, &id).await?;
        Ok::<_, ApiError>(StatusCode::NO_CONTENT.into_response())
    };
    outcome.await.unwrap_or_else(IntoResponse::into_response)
}

/// `env.ASSETS.fetch()`: a request carrying [`headers::ASSETS`] is answered by that script's
/// deployed assets, whatever its path; any other goes on to the routes.
pub async fn assets(
    State(app): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(script_id) = request.headers().get(headers::ASSETS).and_then(|v| v.to_str().ok()).map(str::to_owned)
    else {
        return next.run(request).await;
    };
    let workers = match super::from_workerd(&app, request.headers()) {
        Ok(workers) => workers,
        Err(e) => return e.into_response(),
    };
    match workers.served_assets(&script_id) {
        Some(assets) => assets.answer(request.method(), request.uri(), request.headers()).await,
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `POST /logs`: a tail worker's events; `x-kura-tailing: 1` tells it a live tail listens.
pub async fn logs(State(app): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let outcome = async {
        let script = script_of(&app, &headers)?;
        let body = read_body(body).await?;
        let events: Vec<serde_json::Value> = crate::extract::parse_json(&body)?;
        let workers = app.workers.as_ref().expect("checked");
        // In a cluster, live tails opened on other nodes hear this node's invocations too.
        if let Some(forwarding) = &app.forwarding {
            let listeners = workers.tails().remote_listeners(&script.id);
            if !listeners.is_empty() {
                forwarding.push_tail_events(listeners, &script.id, &events);
            }
        }
        let tailing = workers.record_logs(&script.id, events)?;
        Ok::<_, ApiError>(
            (StatusCode::NO_CONTENT, [("x-kura-tailing", if tailing { "1" } else { "0" })]).into_response(),
        )
    };
    outcome.await.unwrap_or_else(IntoResponse::into_response)
}
