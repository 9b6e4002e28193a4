//! D1's binding protocol (what workerd's `cloudflare/internal/d1-api.ts` sends): `POST /query` and `/execute` with one
//! statement `{"sql", "params"}` or an array of them, run as one transaction; an array of
//! `{"success", "meta", "results"}` back, or `{"success": false, "error"}`. Every answer
//! carries the database's bookmark in `x-cf-d1-session-commit-token`, which D1's sessions keep.

use std::collections::HashMap;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use kura_d1::wire::{JsonParams, JsonResults, RowFormat, ServedBy};
use kura_d1::{Access, Bookmark, Executed, Request, ResultMode, Statement};

use crate::auth::{Caller, Need};
use crate::error::ApiError;
use crate::extract::read_body;
use crate::state::AppState;

/// The header naming the database, for clients whose URL is fixed (workerd's shim).
pub const DATABASE_HEADER: &str = "x-kura-d1-database";

/// D1's session header: a constraint or bookmark in, the current bookmark out.
pub const SESSION_HEADER: &str = "x-cf-d1-session-commit-token";

/// A failure in the binding's shape; the shim reads `error` and ignores the status.
struct BindingError(ApiError);

impl From<ApiError> for BindingError {
    fn from(e: ApiError) -> Self {
        BindingError(e)
    }
}

impl From<kura_d1::Error> for BindingError {
    fn from(e: kura_d1::Error) -> Self {
        BindingError(e.into())
    }
}

impl IntoResponse for BindingError {
    fn into_response(self) -> Response {
        crate::error::binding::d1_error(&self.0)
    }
}

fn malformed(why: impl std::fmt::Display) -> BindingError {
    BindingError(ApiError::bad_request(format!("The request is malformed: {why}")))
}

#[derive(Deserialize)]
struct BindingStatement {
    sql: String,
    #[serde(default)]
    params: JsonParams,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum BindingBody {
    Many(Vec<BindingStatement>),
    One(BindingStatement),
}

/// `POST /query` and `POST /execute` (D1 answers `/execute`'s `NONE` with rows anyway): rows as
/// the `resultsFormat` query parameter asks.
pub async fn query(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    to_owner: Option<Extension<ToOwner>>,
    body: Body,
) -> Response {
    run(app, headers, None, query, to_owner, body).await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /binding/d1/{database}/query` and `…/execute`
pub async fn query_at(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(database): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    to_owner: Option<Extension<ToOwner>>,
    body: Body,
) -> Response {
    run(app, headers, Some(database), query, to_owner, body).await.unwrap_or_else(IntoResponse::into_response)
}

/// A session header's constraint: kura has one copy of each database, always current, so
/// every constraint is met at once; a bookmark must at least be one.
fn check_session(headers: &HeaderMap) -> Result<(), BindingError> {
    let Some(value) = headers.get(SESSION_HEADER) else { return Ok(()) };
    let value = value.to_str().map_err(|_| malformed(format!("{SESSION_HEADER} is not text")))?;
    if value == "first-primary" || value == "first-unconstrained" {
        return Ok(());
    }
    value.parse::<Bookmark>().map(|_| ()).map_err(|e| malformed(format!("{SESSION_HEADER}: {e}")))
}

async fn run(
    app: AppState,
    headers: HeaderMap,
    database: Option<String>,
    query: HashMap<String, String>,
    to_owner: Option<Extension<ToOwner>>,
    body: Body,
) -> Result<Response, BindingError> {
    let caller = Caller::from_headers(&headers, &app)?;
    let account = caller.token.account_id.clone();
    caller.require(&account, Need::D1Read)?;
    let database = match database {
        Some(database) => database,
        None => named_database(&headers)?,
    };
    let access = if caller.can_write_d1() { Access::ReadWrite } else { Access::ReadOnly };
    execute(&app, &account, access, &database, &headers, &query, to_owner, body).await
}

/// The database a header names, for the shim's fixed URLs.
fn named_database(headers: &HeaderMap) -> Result<String, BindingError> {
    headers
        .get(DATABASE_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| malformed(format!("the {DATABASE_HEADER} header names no database")))
}

/// `POST /query` from a deployed Worker's `env.DB`, on the Workers' binding socket: the
/// database and account are what its configuration says, and the Worker may write.
pub async fn query_from_worker(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    to_owner: Option<Extension<ToOwner>>,
    body: Body,
) -> Response {
    let outcome = async {
        let account = super::worker_account(&app, &headers)?;
        let database = named_database(&headers)?;
        execute(&app, &account, Access::ReadWrite, &database, &headers, &query, to_owner, body).await
    };
    outcome.await.unwrap_or_else(IntoResponse::into_response)
}

/// Runs a binding call's statements on the database, or — for a Sessions read placed on a
/// node that does not own it (`to_owner`) — on this node's copy if it holds the session's
/// position, sending the call to the owner otherwise.
#[allow(clippy::too_many_arguments)]
async fn execute(
    app: &AppState,
    account: &str,
    access: Access,
    database: &str,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
    to_owner: Option<Extension<ToOwner>>,
    body: Body,
) -> Result<Response, BindingError> {
    check_session(headers)?;
    let format = match query.get("resultsFormat").map(String::as_str) {
        Some("ROWS_AND_COLUMNS") => RowFormat::Raw,
        // ARRAY_OF_OBJECTS, the default; NONE answers rows all the same, as D1 does.
        _ => RowFormat::Objects,
    };
    let body = read_body(body).await?;
    let statements = match serde_json::from_slice::<BindingBody>(&body).map_err(malformed)? {
        BindingBody::One(s) => vec![s],
        BindingBody::Many(many) => many,
    };
    let statements = statements.into_iter().map(|s| Statement::with_params(s.sql, s.params.0)).collect();
    // Each element answers once, for its last statement, as workerd's `sql.exec` does.
    let request = Request { statements, mode: ResultMode::LastStatement, access };
    let here = app.forwarding.as_ref().map(|forwarding| forwarding.node());
    if let Some(Extension(to_owner)) = to_owner {
        return match app.d1.read_replica(account, database, request, to_owner.at_least.as_ref()).await? {
            Some(executed) => Ok(answer(&executed, format, ServedBy { primary: false, region: here })),
            None => Ok(to_owner.owner.send(app, headers.clone(), body).await),
        };
    }
    let executed = app.d1.query_with_bookmark(account, database, request).await?;
    Ok(answer(&executed, format, ServedBy { primary: true, region: here }))
}

/// A D1 Sessions read placed on a node that does not own the database (set by the cluster's
/// placement): the state a copy must hold to serve it, and the way to the owner if no copy
/// here does. Made for every such read, so it holds only what placement had at hand; what the
/// owner needs of the request is handed over only if the read is sent on.
#[derive(Clone)]
pub(crate) struct ToOwner {
    pub(crate) at_least: Option<Bookmark>,
    pub(crate) owner: std::sync::Arc<dyn SendToOwner>,
}

/// How a read that no copy here serves goes to the database's owner (the cluster's side).
pub(crate) trait SendToOwner: Send + Sync {
    /// Sends the read, with its request's headers and its body (read already), to the owner.
    fn send<'a>(
        &'a self,
        app: &'a AppState,
        headers: HeaderMap,
        body: bytes::Bytes,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send + 'a>>;
}

/// A binding call's answer: its results, and the bookmark of a state that includes them.
fn answer(executed: &Executed, format: RowFormat, served_by: ServedBy<'_>) -> Response {
    let mut response = axum::Json(JsonResults { results: &executed.results, format, served_by }).into_response();
    if let Some(value) = executed.bookmark.and_then(|b| HeaderValue::from_str(&b.to_string()).ok()) {
        response.headers_mut().insert(SESSION_HEADER, value);
    }
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
