//! D1's v4 endpoints: list, create, details, update, delete, `/query` and `/raw`.

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use serde::Deserialize;

use kura_d1::wire::{
    JsonParams, JsonResults, RowFormat, ServedBy, created_database, database_details, database_list_item,
};
use kura_d1::{Access, CreateOptions, Request, Statement};

use crate::auth::{Caller, Need};
use crate::error::{ApiError, ResultInfo, ok, ok_paged};
use crate::extract::{V4Path, V4Query, read_body};
use crate::extract::{parse_json, query_number};
use crate::state::AppState;

const LOCATION_HINTS: &[&str] = &["wnam", "enam", "weur", "eeur", "apac", "oc"];
const JURISDICTIONS: &[&str] = &["eu", "fedramp", "us"];

/// `GET /accounts/{account_id}/d1/database`
pub async fn list(
    State(app): State<AppState>,
    caller: Caller,
    V4Path(account_id): V4Path<String>,
    V4Query(query): V4Query,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::D1Read)?;
    let page = query_number(&query, "page")?.unwrap_or(1).max(1);
    let per_page = query_number(&query, "per_page")?.unwrap_or(1000).clamp(10, 10_000);
    let name = query.get("name").map(String::as_str).filter(|n| !n.is_empty());
    let listing = app.d1.list(&account_id, name, page, per_page)?;
    let items: Vec<serde_json::Value> = listing.databases.iter().map(database_list_item).collect();
    let info = ResultInfo::numbered(page, per_page, items.len() as u64, listing.total);
    Ok(ok_paged(items, info))
}

#[derive(Deserialize)]
struct CreateBody {
    name: String,
    primary_location_hint: Option<String>,
    jurisdiction: Option<String>,
}

fn check_choice(field: &str, value: &Option<String>, choices: &[&str]) -> Result<(), ApiError> {
    match value {
        Some(v) if !choices.contains(&v.as_str()) => Err(ApiError::bad_request(format!(
            "Invalid property: {field} => '{v}' is not one of {}",
            choices.join(", ")
        ))),
        _ => Ok(()),
    }
}

/// `POST /accounts/{account_id}/d1/database`
pub async fn create(
    State(app): State<AppState>,
    caller: Caller,
    V4Path(account_id): V4Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::D1Write)?;
    let body: CreateBody = parse_json(&read_body(body).await?)?;
    check_choice("primary_location_hint", &body.primary_location_hint, LOCATION_HINTS)?;
    check_choice("jurisdiction", &body.jurisdiction, JURISDICTIONS)?;
    let options = CreateOptions {
        primary_location_hint: body.primary_location_hint.clone(),
        jurisdiction: body.jurisdiction.clone(),
    };
    let db = app.d1.create(&account_id, &body.name, options).await?;
    Ok(ok(created_database(&db)))
}

/// `GET /accounts/{account_id}/d1/database/{database}`; `?fields=a,b` keeps only those fields.
pub async fn details(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, database)): V4Path<(String, String)>,
    V4Query(query): V4Query,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::D1Read)?;
    let details = app.d1.details(&account_id, &database).await?;
    let mut result = database_details(&details);
    if let Some(fields) = query.get("fields").filter(|f| !f.is_empty()) {
        let wanted: Vec<&str> = fields.split(',').map(str::trim).collect();
        result.retain(|k, _| wanted.contains(&k.as_str()));
    }
    Ok(ok(result))
}

#[derive(Deserialize)]
struct UpdateBody {
    read_replication: Option<ReadReplication>,
}

#[derive(Deserialize)]
struct ReadReplication {
    mode: String,
}

/// `PUT` and `PATCH /accounts/{account_id}/d1/database/{database}`: read replication mode.
pub async fn update(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, database)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::D1Write)?;
    let body: UpdateBody = parse_json(&read_body(body).await?)?;
    let Some(replication) = body.read_replication else {
        return Err(ApiError::bad_request("Invalid property: read_replication is required"));
    };
    app.d1.set_read_replication(&account_id, &database, &replication.mode)?;
    let details = app.d1.details(&account_id, &database).await?;
    Ok(ok(database_details(&details)))
}

/// `DELETE /accounts/{account_id}/d1/database/{database}`
pub async fn delete(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, database)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::D1Write)?;
    app.d1.delete(&account_id, &database).await?;
    Ok(ok(()))
}

#[derive(Deserialize)]
struct QueryBody {
    sql: Option<String>,
    #[serde(default)]
    params: JsonParams,
    batch: Option<Vec<BatchItem>>,
}

#[derive(Deserialize)]
struct BatchItem {
    sql: String,
    #[serde(default)]
    params: JsonParams,
}

fn statement(sql: String, params: JsonParams) -> Statement {
    Statement::with_params(sql, params.0)
}

/// Turns a `/query` or `/raw` body into a request: one `sql` (maybe several statements) with
/// `params`, or a `batch` of them.
fn parse_request(body: &[u8], caller: &Caller) -> Result<Request, ApiError> {
    let body: QueryBody = parse_json(body)?;
    let statements = match (body.sql, body.batch) {
        (Some(sql), None) => vec![statement(sql, body.params)],
        (None, Some(batch)) => batch.into_iter().map(|i| statement(i.sql, i.params)).collect(),
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request("The request is malformed: give either 'sql' or 'batch', not both"));
        }
        (None, None) => return Err(ApiError::bad_request("The request is malformed: the body needs 'sql' or 'batch'")),
    };
    let access = if caller.can_write_d1() { Access::ReadWrite } else { Access::ReadOnly };
    Ok(Request { statements, access, ..Request::default() })
}

async fn run(
    app: AppState,
    caller: Caller,
    account_id: String,
    database: String,
    body: Body,
    format: RowFormat,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::D1Read)?;
    let request = parse_request(&read_body(body).await?, &caller)?;
    let results = app.d1.query(&account_id, &database, request).await?;
    Ok(ok(JsonResults { results: &results, format, served_by: ServedBy::PRIMARY }))
}

/// `POST …/{database}/query`: rows as objects.
pub async fn query(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, database)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    run(app, caller, account_id, database, body, RowFormat::Objects).await
}

/// `POST …/{database}/raw`: rows as arrays, with the column names.
pub async fn raw(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, database)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    run(app, caller, account_id, database, body, RowFormat::Raw).await
}
