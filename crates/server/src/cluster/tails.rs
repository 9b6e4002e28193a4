//! `wrangler tail` across a cluster. A tail is opened on one node, but every node runs every
//! Worker: so while a tail listens to a script, its node tells every other node so (again every
//! few seconds, and at once when a tail connects), and each of them sends that node the events
//! of the script's invocations it runs ([`crate::forward::Forwarding::push_tail_events`]),
//! which the node hands to its tails as if its own Worker had run them. Both requests are
//! nodes' own: stamped, and refused to anyone else.

use std::future::Future;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, Wire};
use crate::extract::{parse_json, read_body};
use crate::forward::TAIL_EVENTS_PATH;
use crate::routing::{Routes, Touches};
use crate::state::AppState;

/// Where a node says it listens to a script: `POST <path>/<script id>` with `{"api": <its API's
/// URL>}`.
const TAIL_LISTENERS_PATH: &str = "/kura/tail-listeners";

/// How long a node's word that it listens lasts, unless it says so again.
const LISTENING_FOR: Duration = Duration::from_secs(10);

/// How often a node with tails says so again.
const SAY_AGAIN_EVERY: Duration = Duration::from_secs(3);

/// The two routes, on the API listener.
pub(crate) fn routes() -> Routes {
    Routes::default()
        .route(&format!("{TAIL_LISTENERS_PATH}/{{script}}"), Touches::Anywhere, axum::routing::post(listening))
        .route(&format!("{TAIL_EVENTS_PATH}/{{script}}"), Touches::Anywhere, axum::routing::post(events))
}

/// The request's body, if another node sent it (its stamp checks out).
async fn from_a_node(app: &AppState, request: Request) -> Result<(bytes::Bytes, &kura_workers::Workers), ApiError> {
    let (Some(forwarding), Some(workers)) = (&app.forwarding, &app.workers) else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, 7003, "No route for that URI"));
    };
    if !forwarding.is_forwarded(&request) {
        return Err(ApiError::forbidden());
    }
    Ok((read_body(request.into_body()).await?, workers))
}

/// `POST /kura/tail-listeners/{script}`: another node listens to the script.
async fn listening(State(app): State<AppState>, Path(script): Path<String>, request: Request) -> Response {
    let outcome = async {
        let (body, workers) = from_a_node(&app, request).await?;
        let said: serde_json::Value = parse_json(&body)?;
        let api = said["api"].as_str().ok_or_else(|| ApiError::bad_request("`api` names no node"))?;
        workers.tails().listened_from(&script, api, LISTENING_FOR);
        Ok::<_, ApiError>(StatusCode::NO_CONTENT.into_response())
    };
    outcome.await.unwrap_or_else(|e| Wire::V4.refuse(e))
}

/// `POST /kura/tail-events/{script}`: events of the script another node ran, for this node's
/// tails.
async fn events(State(app): State<AppState>, Path(script): Path<String>, request: Request) -> Response {
    let outcome = async {
        let (body, workers) = from_a_node(&app, request).await?;
        let events: Vec<serde_json::Value> = parse_json(&body)?;
        workers.record_remote_logs(&script, events)?;
        Ok::<_, ApiError>(StatusCode::NO_CONTENT.into_response())
    };
    outcome.await.unwrap_or_else(|e| Wire::V4.refuse(e))
}

/// On a cluster node with Workers, until `stop`: tells the other nodes which scripts this
/// node's tails listen to (see the module's documentation).
pub(crate) async fn share(app: AppState, stop: impl Future<Output = ()>) {
    let (Some(forwarding), Some(workers)) = (app.forwarding.clone(), app.workers.clone()) else { return };
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(SAY_AGAIN_EVERY) => {}
            _ = workers.tails().connected() => {}
        }
        let scripts = workers.tails().tailed_here();
        if scripts.is_empty() {
            continue;
        }
        let members = forwarding.status().members().await;
        let Some(own_api) = members.iter().find(|(node, _)| node == forwarding.node()).map(|(_, api)| api.clone())
        else {
            continue;
        };
        let body = serde_json::to_vec(&serde_json::json!({ "api": own_api })).expect("JSON");
        for (_, api) in members.iter().filter(|(node, _)| node != forwarding.node()) {
            for script in &scripts {
                let path = format!("{TAIL_LISTENERS_PATH}/{script}");
                if !forwarding.post_to_node(api, &path, body.clone()).await {
                    tracing::debug!(node = api, "could not tell a node of this node's tails");
                }
            }
        }
    }
}
