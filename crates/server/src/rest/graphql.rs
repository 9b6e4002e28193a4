//! `POST /graphql`, for the one query wrangler sends: D1's hourly analytics
//! (`d1AnalyticsAdaptiveGroups`), answered from kura's own usage counters.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value as Json, json};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::parse_json;
use crate::extract::read_body;
use crate::state::AppState;
use axum::body::Body;

#[derive(Deserialize)]
struct GraphqlBody {
    #[serde(default)]
    query: String,
    #[serde(default)]
    variables: Json,
}

/// The first string found under `key` anywhere in `value`.
fn find_string<'a>(value: &'a Json, key: &str) -> Option<&'a str> {
    match value {
        Json::Object(map) => {
            map.get(key).and_then(Json::as_str).or_else(|| map.values().find_map(|v| find_string(v, key)))
        }
        Json::Array(items) => items.iter().find_map(|v| find_string(v, key)),
        _ => None,
    }
}

fn parse_time(text: Option<&str>) -> Option<i64> {
    let text = text?;
    text.parse::<jiff::Timestamp>()
        .ok()
        .or_else(|| {
            text.parse::<jiff::civil::DateTime>()
                .ok()
                .and_then(|d| jiff::tz::TimeZone::UTC.to_ambiguous_zoned_datetime(d).compatible().ok())
                .map(|z| z.timestamp())
        })
        .map(|t| t.as_second())
}

fn graphql_error(message: &str) -> Response {
    axum::Json(json!({ "data": null, "errors": [{ "message": message }] })).into_response()
}

/// `POST /graphql`
pub async fn query(State(app): State<AppState>, caller: Caller, body: Body) -> Result<Response, ApiError> {
    let body: GraphqlBody = parse_json(&read_body(body).await?)?;
    if !body.query.contains("d1AnalyticsAdaptiveGroups") {
        return Ok(graphql_error("kura answers only D1 analytics queries (d1AnalyticsAdaptiveGroups)"));
    }
    let account = find_string(&body.variables, "accountTag").unwrap_or(&caller.token.account_id).to_owned();
    if account != caller.token.account_id || !caller.scope().can_read_d1() {
        return Err(ApiError::forbidden());
    }
    let now = jiff::Timestamp::now().as_second();
    let from = parse_time(find_string(&body.variables, "datetimeHour_geq")).unwrap_or(now - 24 * 3600);
    let to = parse_time(find_string(&body.variables, "datetimeHour_leq")).unwrap_or(now);
    let mut groups = Vec::new();
    if let Some(id) = find_string(&body.variables, "databaseId") {
        // Only the caller's own databases are reported; others look empty.
        if let Ok(database) = app.d1.get(&account, id) {
            // Reading usage first saves pending counters: catalog writes stay off the runtime.
            let d1 = std::sync::Arc::clone(&app.d1);
            let usage = tokio::task::spawn_blocking(move || d1.usage(&database.uuid, from, to))
                .await
                .map_err(|e| ApiError::internal(&e))??;
            for usage in usage {
                let hour = jiff::Timestamp::from_second(usage.hour).map(|t| t.to_string()).unwrap_or_default();
                groups.push(json!({
                    "sum": {
                        "readQueries": usage.read_queries,
                        "writeQueries": usage.write_queries,
                        "rowsRead": usage.rows_read,
                        "rowsWritten": usage.rows_written,
                    },
                    "dimensions": { "datetimeHour": hour },
                }));
            }
        }
    }
    let data = json!({ "viewer": { "accounts": [{ "d1AnalyticsAdaptiveGroups": groups }] } });
    Ok(axum::Json(json!({ "data": data, "errors": null })).into_response())
}
