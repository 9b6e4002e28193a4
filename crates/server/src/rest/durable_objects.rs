//! Durable Objects over HTTP, under `/accounts/{account}/workers/durable_objects/namespaces`:
//! Cloudflare's namespace and object listings (objects here also carry their names and sizes),
//! Miniflare's local-explorer query endpoint, and kura's own: atomic batches of SQL, KV and
//! alarm operations on one object, export, bookmarks and restore, and fan-out queries.
//! docs/durable-objects.md describes every endpoint.

use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json, json};

use kura_catalog::NewDoNamespace;
use kura_d1::wire::JsonParams;
use kura_do::{Cursor, DoError, ListOptions, Namespace, ObjectId, Storage};

use crate::auth::{Caller, Need};
use crate::error::{ApiError, ResultInfo, ok, ok_paged};
use crate::extract::{V4Path, V4Query, read_body};
use crate::extract::{parse_json, query_number};
use crate::render::{CursorJson, do_object_json, fan_out_json, namespace_json};
use crate::resources::find_namespace;
use crate::state::AppState;

/// Checks the caller may do `need` in the account, and finds the namespace.
fn reach_namespace(
    app: &AppState,
    caller: &Caller,
    need: Need,
    account_id: &str,
    namespace: &str,
) -> Result<Namespace, ApiError> {
    caller.require(account_id, need)?;
    Ok(find_namespace(app, account_id, namespace)?.1)
}

/// As [`reach_namespace`], and the object addressed by `object`.
fn reach_object(
    app: &AppState,
    caller: &Caller,
    need: Need,
    account_id: &str,
    namespace: &str,
    object: &str,
) -> Result<(Namespace, ObjectId), ApiError> {
    let ns = reach_namespace(app, caller, need, account_id, namespace)?;
    let id = object_id(&ns, object)?;
    Ok((ns, id))
}

/// `GET /accounts/{account_id}/workers/durable_objects/namespaces`
pub async fn list_namespaces(
    State(app): State<AppState>,
    caller: Caller,
    V4Path(account_id): V4Path<String>,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::DoRead)?;
    let namespaces = app.catalog.list_do_namespaces(&account_id)?;
    Ok(ok(namespaces.iter().map(namespace_json).collect::<Vec<_>>()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateNamespace {
    name: String,
    #[serde(default, alias = "class_name")]
    class: Option<String>,
    #[serde(default)]
    script: Option<String>,
    #[serde(default)]
    unique_key: Option<String>,
    #[serde(default)]
    alarm_url: Option<String>,
}

/// `POST /accounts/{account_id}/workers/durable_objects/namespaces`
pub async fn create_namespace(
    State(app): State<AppState>,
    caller: Caller,
    V4Path(account_id): V4Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::DoWrite)?;
    let body: CreateNamespace = parse_json(&read_body(body).await?)?;
    let new = NewDoNamespace {
        name: body.name,
        class_name: body.class,
        script: body.script,
        unique_key: body.unique_key,
        alarm_url: body.alarm_url,
    };
    let ns = app.catalog.create_do_namespace(&account_id, &new).map_err(|e| match e {
        kura_catalog::Error::Duplicate { .. } => {
            ApiError::new(StatusCode::CONFLICT, 10065, "A Durable Object namespace with that name already exists")
        }
        kura_catalog::Error::Conflict(m) => ApiError::new(StatusCode::CONFLICT, 10065, m),
        other => other.into(),
    })?;
    Ok(ok(namespace_json(&ns)))
}

/// `GET …/namespaces/{namespace}`
pub async fn namespace_details(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, namespace)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::DoRead)?;
    let (ns, engine_ns) = find_namespace(&app, &account_id, &namespace)?;
    let mut body = namespace_json(&ns);
    body["object_count"] = json!(app.durable_objects.count(&engine_ns).await?);
    Ok(ok(body))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateNamespace {
    alarm_url: Option<String>,
}

/// `PATCH …/namespaces/{namespace}`: sets or clears the alarm URL.
pub async fn update_namespace(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, namespace)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::DoWrite)?;
    let (ns, _) = find_namespace(&app, &account_id, &namespace)?;
    let body: UpdateNamespace = parse_json(&read_body(body).await?)?;
    app.catalog.set_do_alarm_url(&account_id, &ns.id, body.alarm_url.as_deref())?;
    let (ns, _) = find_namespace(&app, &account_id, &ns.id)?;
    Ok(ok(namespace_json(&ns)))
}

/// `GET …/namespaces/{namespace}/objects[?cursor=&limit=]`: Cloudflare's `{id, hasStoredData}`,
/// plus each object's name and size.
pub async fn list_objects(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, namespace)): V4Path<(String, String)>,
    V4Query(query): V4Query,
) -> Result<Response, ApiError> {
    let ns = reach_namespace(&app, &caller, Need::DoRead, &account_id, &namespace)?;
    let limit = query_number(&query, "limit")?.unwrap_or(1000).clamp(1, 10_000);
    let cursor = query.get("cursor").cloned().unwrap_or_default();
    let page = app.durable_objects.list(&ns, &cursor, limit + 1).await?;
    let more = page.len() as u64 > limit;
    let objects: Vec<Json> = page.iter().take(limit as usize).map(do_object_json).collect();
    let next = if more { page.get(limit as usize - 1).map(|o| o.entry.id.clone()) } else { None };
    let info = ResultInfo {
        count: Some(objects.len() as u64),
        cursor: Some(next.unwrap_or_default()),
        ..ResultInfo::default()
    };
    Ok(ok_paged(objects, info))
}

/// `POST …/namespaces/{namespace}/objects`: a new unique id (the object is created on first use).
pub async fn new_unique_id(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, namespace)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let ns = reach_namespace(&app, &caller, Need::DoWrite, &account_id, &namespace)?;
    Ok(ok(json!({ "id": ns.new_unique_id(None)?.to_string() })))
}

/// An object addressed by 64 hex digits (an id) or anything else (a name).
fn object_id(ns: &Namespace, object: &str) -> Result<ObjectId, ApiError> {
    if object.is_empty() {
        return Err(ApiError::bad_request("An object needs a name or an id"));
    }
    Ok(ns.id_from_name_or_string(object)?)
}

/// One operation of a batch.
#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Operation {
    Sql {
        sql: String,
        #[serde(default)]
        params: JsonParams,
    },
    KvGet {
        #[serde(default)]
        key: Option<String>,
        #[serde(default)]
        keys: Option<Vec<String>>,
    },
    KvPut {
        #[serde(default)]
        key: Option<String>,
        #[serde(default)]
        value: Option<Json>,
        #[serde(default)]
        entries: Option<Map<String, Json>>,
    },
    KvDelete {
        #[serde(default)]
        key: Option<String>,
        #[serde(default)]
        keys: Option<Vec<String>>,
    },
    KvList {
        #[serde(default)]
        start: Option<String>,
        #[serde(default, rename = "startAfter", alias = "start_after")]
        start_after: Option<String>,
        #[serde(default)]
        end: Option<String>,
        #[serde(default)]
        prefix: Option<String>,
        #[serde(default)]
        reverse: bool,
        #[serde(default)]
        limit: Option<u64>,
    },
    GetAlarm,
    SetAlarm {
        time: i64,
    },
    DeleteAlarm,
    DeleteAll,
    DatabaseSize,
}

/// One operation's result: a statement's cursor, or a KV or alarm answer.
enum OpResult {
    Cursor(Cursor),
    Json(Json),
}

impl Serialize for OpResult {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            OpResult::Cursor(cursor) => CursorJson(cursor).serialize(s),
            OpResult::Json(json) => json.serialize(s),
        }
    }
}

/// KV values travel as JSON and are stored as its text.
fn kv_value(bytes: &[u8]) -> Json {
    serde_json::from_slice(bytes).unwrap_or_else(|_| Json::String(String::from_utf8_lossy(bytes).into_owned()))
}

fn kv_entries(entries: Vec<(String, Vec<u8>)>) -> Json {
    Json::Object(entries.into_iter().map(|(k, v)| (k, kv_value(&v))).collect())
}

fn invalid(message: &str) -> DoError {
    DoError::Invalid(message.to_owned())
}

fn apply(storage: &mut Storage<'_>, op: Operation) -> kura_do::Result<OpResult> {
    Ok(OpResult::Json(match op {
        Operation::Sql { sql, params } => return Ok(OpResult::Cursor(storage.exec(&sql, params.0)?)),
        Operation::KvGet { key: Some(key), keys: None } => storage.kv_get(&key)?.map_or(Json::Null, |v| kv_value(&v)),
        Operation::KvGet { key: None, keys: Some(keys) } => kv_entries(storage.kv_get_many(&keys)?),
        Operation::KvGet { .. } => return Err(invalid("kv_get takes either key or keys")),
        Operation::KvPut { key: Some(key), value: Some(value), entries: None } => {
            storage.kv_put(&key, value.to_string().as_bytes())?;
            Json::Null
        }
        Operation::KvPut { key: None, value: None, entries: Some(entries) } => {
            let entries: Vec<(String, Vec<u8>)> =
                entries.into_iter().map(|(k, v)| (k, v.to_string().into_bytes())).collect();
            storage.kv_put_many(&entries)?;
            Json::Null
        }
        Operation::KvPut { key: Some(_), value: None, entries: None } => {
            return Err(invalid("put() called with undefined value."));
        }
        Operation::KvPut { .. } => {
            return Err(invalid(
                "put() may only be called with a single key-value pair and optional options as put(key, value, options) \
             or with multiple key-value pairs and optional options as put(entries, options)",
            ));
        }
        Operation::KvDelete { key: Some(key), keys: None } => json!(storage.kv_delete(&key)?),
        Operation::KvDelete { key: None, keys: Some(keys) } => json!(storage.kv_delete_many(&keys)?),
        Operation::KvDelete { .. } => return Err(invalid("kv_delete takes either key or keys")),
        Operation::KvList { start, start_after, end, prefix, reverse, limit } => {
            let options = ListOptions { start, start_after, end, prefix, reverse, limit };
            kv_entries(storage.kv_list(&options)?)
        }
        Operation::GetAlarm => json!(storage.get_alarm()?),
        Operation::SetAlarm { time } => {
            storage.set_alarm(time)?;
            Json::Null
        }
        Operation::DeleteAlarm => {
            storage.delete_alarm()?;
            Json::Null
        }
        Operation::DeleteAll => {
            storage.delete_all()?;
            Json::Null
        }
        Operation::DatabaseSize => json!(storage.database_size()?),
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch {
    operations: Vec<Operation>,
}

/// `POST …/namespaces/{namespace}/objects/{object}/batch`: operations run in order as one
/// request, all or nothing; the answer holds one result per operation.
pub async fn batch(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, namespace, object)): V4Path<(String, String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    let (ns, id) = reach_object(&app, &caller, Need::DoWrite, &account_id, &namespace, &object)?;
    let batch: Batch = parse_json(&read_body(body).await?)?;
    if batch.operations.is_empty() {
        return Err(ApiError::bad_request("A batch needs at least one operation"));
    }
    let results = app
        .durable_objects
        .run(&ns, &id, move |storage| {
            batch.operations.into_iter().map(|op| apply(storage, op)).collect::<kura_do::Result<Vec<_>>>()
        })
        .await?;
    Ok(ok(BatchAnswer { id: id.to_string(), name: id.name(), results }))
}

/// A batch's answer: the object, and one result per operation.
#[derive(Serialize)]
struct BatchAnswer<'a> {
    id: String,
    name: Option<&'a str>,
    results: Vec<OpResult>,
}

#[derive(Deserialize)]
struct SqlQuery {
    sql: String,
    #[serde(default)]
    params: JsonParams,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Queries {
    One(SqlQuery),
    Many(Vec<SqlQuery>),
}

fn nothing_stored() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, 10067, "The object has stored nothing yet")
}

/// Runs queries on one object as one request (all or nothing).
async fn run_queries(
    app: &AppState,
    caller: &Caller,
    ns: &Namespace,
    id: &ObjectId,
    queries: Vec<SqlQuery>,
) -> Result<Vec<OpResult>, ApiError> {
    if queries.is_empty() {
        return Err(ApiError::bad_request("No SQL statements detected."));
    }
    let read_only = !caller.token.scope.can_write_do();
    if read_only && !app.durable_objects.exists(ns, id).await? {
        return Err(nothing_stored());
    }
    let results = app
        .durable_objects
        .run(ns, id, move |storage| {
            queries
                .into_iter()
                .map(|q| {
                    let cursor = if read_only {
                        storage.exec_read_only(&q.sql, q.params.0)?
                    } else {
                        storage.exec(&q.sql, q.params.0)?
                    };
                    Ok(OpResult::Cursor(cursor))
                })
                .collect::<kura_do::Result<Vec<_>>>()
        })
        .await?;
    Ok(results)
}

/// `POST …/namespaces/{namespace}/objects/{object}/query` with `{sql, params}` or a list of them.
pub async fn query(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, namespace, object)): V4Path<(String, String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    let (ns, id) = reach_object(&app, &caller, Need::DoRead, &account_id, &namespace, &object)?;
    let queries = match parse_json::<Queries>(&read_body(body).await?)? {
        Queries::One(q) => vec![q],
        Queries::Many(qs) => qs,
    };
    Ok(ok(run_queries(&app, &caller, &ns, &id, queries).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExplorerQuery {
    #[serde(default)]
    durable_object_id: Option<String>,
    #[serde(default)]
    durable_object_name: Option<String>,
    queries: Vec<SqlQuery>,
}

/// `POST …/namespaces/{namespace}/query`: Miniflare's local-explorer shape,
/// `{durable_object_id | durable_object_name, queries: [{sql, params}]}`.
pub async fn explorer_query(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, namespace)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    let ns = reach_namespace(&app, &caller, Need::DoRead, &account_id, &namespace)?;
    let body: ExplorerQuery = parse_json(&read_body(body).await?)?;
    let id = match (body.durable_object_id, body.durable_object_name) {
        (Some(id), None) => ns.id_from_string(&id)?,
        (None, Some(name)) => ns.id_from_name(&name),
        _ => return Err(ApiError::bad_request("Give either durable_object_id or durable_object_name")),
    };
    Ok(ok(run_queries(&app, &caller, &ns, &id, body.queries).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FanOut {
    sql: String,
    #[serde(default)]
    params: JsonParams,
    /// Names or ids; every object of the namespace when absent.
    #[serde(default)]
    objects: Option<Vec<String>>,
}

/// `POST …/namespaces/{namespace}/fan_out`: one read-only statement on each object given (or
/// on all), rows tagged with each object's id and name. Not one snapshot: each object answers
/// at its own moment, and an object's error is reported beside it.
pub async fn fan_out(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, namespace)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    let ns = reach_namespace(&app, &caller, Need::DoRead, &account_id, &namespace)?;
    let body: FanOut = parse_json(&read_body(body).await?)?;
    let objects = match body.objects {
        Some(list) => Some(list.iter().map(|o| object_id(&ns, o)).collect::<Result<Vec<_>, _>>()?),
        None => None,
    };
    let rows = app.durable_objects.fan_out(&ns, objects, &body.sql, body.params.0).await?;
    Ok(ok(fan_out_json(&rows)))
}

/// `GET …/namespaces/{namespace}/objects/{object}/export`: the object's storage as SQL.
pub async fn export(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, namespace, object)): V4Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let (ns, id) = reach_object(&app, &caller, Need::DoRead, &account_id, &namespace, &object)?;
    if !app.durable_objects.exists(&ns, &id).await? {
        return Err(nothing_stored());
    }
    let dump = app.durable_objects.export(&ns, &id).await?;
    Ok(([(header::CONTENT_TYPE, "application/sql; charset=utf-8")], dump).into_response())
}

/// `GET …/namespaces/{namespace}/objects/{object}/bookmark[?timestamp=]`
pub async fn bookmark(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, namespace, object)): V4Path<(String, String, String)>,
    V4Query(query): V4Query,
) -> Result<Response, ApiError> {
    let (ns, id) = reach_object(&app, &caller, Need::DoRead, &account_id, &namespace, &object)?;
    let bookmark = match query.get("timestamp").filter(|t| !t.is_empty()) {
        Some(t) => {
            let at = kura_d1::parse_timestamp(t).map_err(ApiError::bad_request)?;
            app.durable_objects.bookmark_for_time(&ns, &id, at).await?
        }
        None => app.durable_objects.bookmark(&ns, &id).await?,
    };
    Ok(ok(json!({ "bookmark": bookmark.to_string() })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RestoreBody {
    bookmark: String,
}

/// `POST …/namespaces/{namespace}/objects/{object}/restore` with `{bookmark}`: applied
/// between the object's requests; answers the new bookmark and the undo point.
pub async fn restore(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, namespace, object)): V4Path<(String, String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    let (ns, id) = reach_object(&app, &caller, Need::DoWrite, &account_id, &namespace, &object)?;
    let body: RestoreBody = parse_json(&read_body(body).await?)?;
    let bookmark = body.bookmark.parse::<kura_do::Bookmark>().map_err(|e| ApiError::bad_request(e.to_string()))?;
    let restored = if ns.is_hosted_elsewhere() && app.forwarding.is_some() {
        // Refused by the engine, before any workerd is stopped for it.
        app.durable_objects.restore(&ns, &id, &bookmark).await?
    } else if ns.is_hosted_elsewhere() {
        // workerd runs the object: it is stopped while its file is replaced.
        let workers = app.workers.as_ref().ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                10026,
                "this server does not run Workers, whose object this is",
            )
        })?;
        workers.with_workerd_stopped(app.durable_objects.restore(&ns, &id, &bookmark)).await??
    } else {
        app.durable_objects.restore(&ns, &id, &bookmark).await?
    };
    Ok(ok(json!({
        "bookmark": restored.bookmark.to_string(),
        "previous_bookmark": restored.previous.to_string(),
    })))
}
