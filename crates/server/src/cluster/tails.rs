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
use crate::forward::{Forwarding, TAIL_EVENTS_PATH};
use crate::routing::{Routes, Touches};
use crate::state::AppState;

/// Where a node says which scripts its tails listen to: `POST <path>` with `{"scripts": [<script
/// id>…]}`; the node is the one that stamped the request, reached at its member URL.
const TAIL_LISTENERS_PATH: &str = "/kura/tail-listeners";

/// How long a node's word that it listens lasts, unless it says so again.
const LISTENING_FOR: Duration = Duration::from_secs(10);

/// How often a node with tails says so again.
const SAY_AGAIN_EVERY: Duration = Duration::from_secs(3);

/// The two routes, on the API listener.
pub(crate) fn routes() -> Routes {
    Routes::default().route(TAIL_LISTENERS_PATH, Touches::Anywhere, axum::routing::post(listening)).route(
        &format!("{TAIL_EVENTS_PATH}/{{script}}"),
        Touches::Anywhere,
        axum::routing::post(events),
    )
}

/// What another node sent: the node that stamped it and the body, once the stamp checks out.
async fn from_a_node(
    app: &AppState,
    request: Request,
) -> Result<(String, bytes::Bytes, &Forwarding, &kura_workers::Workers), ApiError> {
    let (Some(forwarding), Some(workers)) = (&app.forwarding, &app.workers) else {
        return Err(ApiError::no_route());
    };
    if !forwarding.is_forwarded(&request) {
        return Err(ApiError::forbidden());
    }
    let node = Forwarding::stamped_by(&request).unwrap_or_default().to_owned();
    Ok((node, read_body(request.into_body()).await?, forwarding, workers))
}

/// `POST /kura/tail-listeners`: the scripts the stamping node's tails listen to.
async fn listening(State(app): State<AppState>, request: Request) -> Response {
    let outcome = async {
        let (node, body, forwarding, workers) = from_a_node(&app, request).await?;
        let said: serde_json::Value = parse_json(&body)?;
        // Sent where the cluster says the node is, whatever the request says.
        let Some(api) = forwarding.status().member_api(&node).await else {
            return Err(ApiError::unavailable(format!("node {node} is not a live member")));
        };
        for script in said["scripts"].as_array().into_iter().flatten().filter_map(|s| s.as_str()) {
            workers.tails().listened_from(script, &api, LISTENING_FOR);
        }
        Ok::<_, ApiError>(StatusCode::NO_CONTENT.into_response())
    };
    outcome.await.unwrap_or_else(|e| Wire::V4.refuse(e))
}

/// `POST /kura/tail-events/{script}`: events of the script another node ran, for this node's
/// tails.
async fn events(State(app): State<AppState>, Path(script): Path<String>, request: Request) -> Response {
    let outcome = async {
        let (_, body, _, workers) = from_a_node(&app, request).await?;
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
        // One request per node, all at once: a node that stopped answering delays no other.
        let body = serde_json::to_vec(&serde_json::json!({ "scripts": scripts })).expect("JSON");
        let members = forwarding.status().members().await;
        let told = members.iter().filter(|(node, _)| node != forwarding.node()).map(|(_, api)| {
            let (forwarding, body) = (&forwarding, body.clone());
            async move {
                if !forwarding.post_to_node(api, TAIL_LISTENERS_PATH, body).await {
                    tracing::debug!(node = api, "could not tell a node of this node's tails");
                }
            }
        });
        futures_util::future::join_all(told).await;
    }
}
