//! D1 Time Travel's v4 endpoints: the bookmark for now or for a time, and restore.

use axum::extract::State;
use axum::response::Response;
use serde_json::json;

use kura_d1::{RestoreTarget, parse_timestamp};

use crate::auth::{Caller, Need};
use crate::error::{ApiError, ok};
use crate::extract::{V4Path, V4Query};
use crate::state::AppState;

/// `GET …/{database}/time_travel/bookmark[?timestamp=]`
pub async fn bookmark(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, database)): V4Path<(String, String)>,
    V4Query(query): V4Query,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::D1Read)?;
    let at = match query.get("timestamp").filter(|t| !t.is_empty()) {
        Some(t) => Some(parse_timestamp(t).map_err(ApiError::bad_request)?),
        None => None,
    };
    let bookmark = app.d1.bookmark(&account_id, &database, at).await?;
    Ok(ok(json!({ "bookmark": bookmark.to_string() })))
}

/// `POST …/{database}/time_travel/restore?bookmark=|timestamp=`
pub async fn restore(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, database)): V4Path<(String, String)>,
    V4Query(query): V4Query,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::D1Write)?;
    let bookmark = query.get("bookmark").filter(|b| !b.is_empty());
    let timestamp = query.get("timestamp").filter(|t| !t.is_empty());
    let target = match (bookmark, timestamp) {
        (Some(b), None) => RestoreTarget::Bookmark(b.clone()),
        (None, Some(t)) => RestoreTarget::Time(parse_timestamp(t).map_err(ApiError::bad_request)?),
        (Some(_), Some(_)) => return Err(ApiError::bad_request("Give either bookmark or timestamp, not both")),
        (None, None) => return Err(ApiError::bad_request("A restore needs a bookmark or a timestamp")),
    };
    let restored = app.d1.restore(&account_id, &database, target).await?;
    Ok(ok(kura_d1::wire::restored(&restored)))
}

/// Most entries one history page holds.
const HISTORY_PAGE: u64 = 1000;

/// `GET …/{database}/time_travel/history[?limit=&before=]` (kura's own): the newest commits
/// and restores still restorable, newest first, each with its bookmark and time. `before` (a
/// bookmark) pages further back. The console draws its timeline from this.
pub async fn history(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, database)): V4Path<(String, String)>,
    V4Query(query): V4Query,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::D1Read)?;
    let limit = crate::extract::query_number(&query, "limit")?.unwrap_or(100);
    if limit == 0 || limit > HISTORY_PAGE {
        return Err(ApiError::bad_request(format!("limit must be 1 to {HISTORY_PAGE}")));
    }
    let before = query.get("before").filter(|b| !b.is_empty()).cloned();
    let moments = app.d1.timeline(&account_id, &database, limit as usize, before).await?;
    let entries: Vec<_> = moments
        .iter()
        .map(|m| {
            json!({
                "bookmark": m.bookmark.to_string(),
                "timestamp": jiff::Timestamp::from_millisecond(m.time_ms).map(|t| t.to_string()).unwrap_or_default(),
                "kind": if m.restore { "restore" } else { "commit" },
            })
        })
        .collect();
    let current = app.d1.bookmark(&account_id, &database, None).await?;
    Ok(ok(json!({ "current": current.to_string(), "entries": entries })))
}
