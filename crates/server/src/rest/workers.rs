//! Workers in the v4 API, as `wrangler deploy`, `versions`, `deployments`, `secret` and
//! `delete` call it (wrangler 4.85's calls, as docs/workers.md lists them): script uploads (multipart: metadata + modules),
//! versions and deployments, settings, secrets, the subdomain calls wrangler makes on its way,
//! and kura's own `logs`. Every call needs an admin token.

use std::collections::HashMap;

use axum::extract::multipart::MultipartRejection;
use axum::extract::{ConnectInfo, Multipart, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use kura_catalog::{WorkerDeployment, WorkerScript, WorkerVersion};
use kura_workers::{
    ModuleKind, StoredVersion, Upload, UploadMetadata, UploadOptions, UploadedModule, Workers, WorkersError,
};
use serde::Deserialize;
use serde_json::{Value as Json, json};

use crate::auth::Caller;
use crate::error::{ApiError, ResultInfo, ok, ok_paged};
use crate::extract::parse_json;
use crate::extract::{V4Path, V4Query, read_body};
use crate::render::{schedule_json, script_json};
use crate::state::AppState;

/// The Workers layer, for an admin of the account with no bucket limit: a Worker's R2 bindings
/// reach any bucket.
fn workers<'a>(app: &'a AppState, caller: &Caller, account_id: &str) -> Result<&'a Workers, ApiError> {
    caller.require_unlimited_admin(account_id)?;
    app.workers.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            10021,
            "this kura server does not run Workers (it was started without a Workers listener)",
        )
    })
}

fn script_of(workers: &Workers, account_id: &str, name: &str) -> Result<WorkerScript, ApiError> {
    workers.catalog().worker_script(account_id, name)?.ok_or_else(|| WorkersError::ScriptNotFound.into())
}

fn deployed_version(
    workers: &Workers,
    script: &WorkerScript,
) -> Result<Option<(WorkerVersion, StoredVersion)>, ApiError> {
    let Some(id) = &script.deployed_version else { return Ok(None) };
    let Some(version) = workers.catalog().worker_version(&script.id, id)? else { return Ok(None) };
    let stored = workers.stored_version(&version)?;
    Ok(Some((version, stored)))
}

/// The bindings as the settings API shows them: the version's, then each secret by name.
fn settings_bindings(
    workers: &Workers,
    script: &WorkerScript,
    stored: Option<&StoredVersion>,
) -> Result<Json, ApiError> {
    let mut bindings: Vec<Json> = stored
        .map(|v| v.bindings.iter().map(|b| serde_json::to_value(b).expect("bindings serialise")).collect())
        .unwrap_or_default();
    for name in workers.secret_names(&script.account_id, &script.name)? {
        bindings.push(json!({"type": "secret_text", "name": name}));
    }
    Ok(Json::Array(bindings))
}

fn annotations(raw: &Option<String>) -> Json {
    raw.as_deref().and_then(|a| serde_json::from_str(a).ok()).unwrap_or_else(|| json!({}))
}

fn version_json(workers: &Workers, script: &WorkerScript, version: &WorkerVersion) -> Result<Json, ApiError> {
    let stored = workers.stored_version(version)?;
    Ok(json!({
        "id": version.id,
        "number": version.number,
        "metadata": {
            "created_on": version.created_on,
            "modified_on": version.created_on,
            "source": version.source,
            "author_id": "",
            "author_email": "kura@localhost",
            "has_preview": false,
        },
        "annotations": annotations(&version.annotations),
        "resources": {
            "bindings": settings_bindings(workers, script, Some(&stored))?,
            "script": {"etag": stored.etag, "handlers": ["fetch"], "last_deployed_from": "wrangler"},
            "script_runtime": {
                "compatibility_date": stored.compatibility_date,
                "compatibility_flags": stored.compatibility_flags,
                "usage_model": stored.usage_model,
                "limits": {"cpu_ms": 30000},
            },
        },
        "startup_time_ms": 0,
    }))
}

fn deployment_json(deployment: &WorkerDeployment) -> Json {
    json!({
        "id": deployment.id,
        "source": deployment.source,
        "strategy": "percentage",
        "author_email": "kura@localhost",
        "annotations": annotations(&deployment.annotations),
        "created_on": deployment.created_on,
        "versions": [{"version_id": deployment.version_id, "percentage": 100.0}],
    })
}

/// Reads a script upload: the `metadata` part and one part per module.
async fn read_upload(mut form: Multipart) -> Result<Upload, ApiError> {
    let malformed = |e: axum::extract::multipart::MultipartError| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            10021,
            format!("the upload is not a readable multipart form: {}", e.body_text()),
        )
    };
    let mut metadata = None;
    let mut modules = Vec::new();
    while let Some(field) = form.next_field().await.map_err(malformed)? {
        let name = field.name().unwrap_or("").to_owned();
        let content_type = field.content_type().map(str::to_owned);
        let bytes: Bytes = field.bytes().await.map_err(malformed)?;
        if name == "metadata" && content_type.as_deref().is_none_or(|t| t.starts_with("application/json")) {
            let parsed: UploadMetadata = serde_json::from_slice(&bytes).map_err(|e| {
                ApiError::new(StatusCode::BAD_REQUEST, 10021, format!("the metadata part is malformed: {e}"))
            })?;
            metadata = Some(parsed);
            continue;
        }
        let content_type = content_type.unwrap_or_default();
        let kind = ModuleKind::from_content_type(&content_type).ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                10021,
                format!("part '{name}' has the content type '{content_type}', which is no module type"),
            )
        })?;
        modules.push(UploadedModule { name, kind, bytes });
    }
    let metadata =
        metadata.ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, 10021, "the upload has no `metadata` part"))?;
    Ok(Upload { metadata, modules })
}

fn upload_result(uploaded: &kura_workers::Uploaded) -> Json {
    let mut result = script_json(&uploaded.script, Some(&uploaded.stored));
    result["deployment_id"] = json!(uploaded.version.id);
    result["startup_time_ms"] = json!(0);
    result
}

/// Receives an upload of `name` and hands it to the Workers layer.
async fn receive<'a>(
    app: &'a AppState,
    caller: &Caller,
    (account_id, name): (&str, &str),
    query: &HashMap<String, String>,
    form: Result<Multipart, MultipartRejection>,
    deploy: bool,
) -> Result<(&'a Workers, kura_workers::Uploaded), ApiError> {
    let workers = workers(app, caller, account_id)?;
    // Cloudflare also takes a bare script as application/javascript; kura, modules only.
    let form = form.map_err(|_| {
        ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, 10001, "Content-Type must be one of: multipart/form-data")
    })?;
    let upload = read_upload(form).await?;
    let strict_inherit = query.get("bindings_inherit").is_some_and(|v| v == "strict");
    let options = UploadOptions { deploy, strict_inherit, source: "wrangler".into() };
    Ok((workers, workers.upload(account_id, name, upload, options).await?))
}

/// `PUT /accounts/{a}/workers/scripts/{name}`: upload and deploy.
pub async fn put_script(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
    V4Query(query): V4Query,
    form: Result<Multipart, MultipartRejection>,
) -> Result<Response, ApiError> {
    let (_, uploaded) = receive(&app, &caller, (&account_id, &name), &query, form, true).await?;
    Ok(ok(upload_result(&uploaded)))
}

/// `POST /accounts/{a}/workers/scripts/{name}/versions`: upload a version, deploy nothing.
pub async fn upload_version(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
    V4Query(query): V4Query,
    form: Result<Multipart, MultipartRejection>,
) -> Result<Response, ApiError> {
    let (workers, uploaded) = receive(&app, &caller, (&account_id, &name), &query, form, false).await?;
    Ok(ok(version_json(workers, &uploaded.script, &uploaded.version)?))
}

/// `GET /accounts/{a}/workers/scripts`
pub async fn list_scripts(
    State(app): State<AppState>,
    caller: Caller,
    V4Path(account_id): V4Path<String>,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let mut out = Vec::new();
    for script in workers.catalog().list_worker_scripts(&account_id)? {
        let stored = deployed_version(workers, &script)?.map(|(_, s)| s);
        out.push(script_json(&script, stored.as_ref()));
    }
    Ok(ok(out))
}

/// `GET /accounts/{a}/workers/scripts/{name}`: the entry module's source.
pub async fn get_script(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let script = script_of(workers, &account_id, &name)?;
    let (_, stored) = deployed_version(workers, &script)?.ok_or(WorkersError::ScriptNotFound)?;
    let source = workers.module_source(&script, &stored)?;
    let content_type = stored.modules.first().map_or("application/javascript", |m| m.kind.content_type());
    Ok(axum::response::IntoResponse::into_response(([(axum::http::header::CONTENT_TYPE, content_type)], source)))
}

/// `GET /accounts/{a}/workers/services/{name}`: what wrangler checks first.
pub async fn service(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let Some(script) = workers.catalog().worker_script(&account_id, &name)? else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, 10090, "This Worker does not exist on your account."));
    };
    let stored = deployed_version(workers, &script)?.map(|(_, s)| s);
    Ok(ok(json!({
        "id": script.name,
        "default_environment": {
            "environment": "production",
            "created_on": script.created_on,
            "modified_on": script.modified_on,
            "script": script_json(&script, stored.as_ref()),
        },
        "created_on": script.created_on,
        "modified_on": script.modified_on,
    })))
}

/// `DELETE /accounts/{a}/workers/services/{name}` and `…/scripts/{name}`
pub async fn delete_script(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    if !workers.delete(&account_id, &name).await? {
        return Err(WorkersError::ScriptNotFound.into());
    }
    Ok(ok(Json::Null))
}

/// `GET /accounts/{a}/workers/scripts/{name}/settings` (and `script-settings`)
pub async fn settings(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let script = script_of(workers, &account_id, &name)?;
    let stored = deployed_version(workers, &script)?.map(|(_, s)| s);
    let mut out = json!({
        "bindings": settings_bindings(workers, &script, stored.as_ref())?,
        "compatibility_date": stored.as_ref().and_then(|v| v.compatibility_date.clone()),
        "compatibility_flags": stored.as_ref().map(|v| v.compatibility_flags.clone()).unwrap_or_default(),
        "usage_model": stored.as_ref().map_or("standard".to_owned(), |v| v.usage_model.clone()),
        "logpush": false,
        "placement": {},
        "tail_consumers": [],
        "observability": {"enabled": false},
        "tags": [],
    });
    if let Some(tag) = &script.migration_tag {
        out["migrations"] = json!({"tag": tag});
    }
    Ok(ok(out))
}

/// `PATCH …/script-settings`: logpush, tail consumers, observability, tags — accepted, and
/// kura keeps none of them (nothing it runs uses them).
pub async fn patch_script_settings(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    script_of(workers, &account_id, &name)?;
    Ok(ok(json!({"logpush": false, "tail_consumers": [], "observability": {"enabled": false}, "tags": []})))
}

#[derive(Deserialize)]
struct SubdomainBody {
    enabled: bool,
    #[serde(default)]
    previews_enabled: Option<bool>,
}

/// `GET /accounts/{a}/workers/scripts/{name}/subdomain`
pub async fn get_subdomain(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let script = script_of(workers, &account_id, &name)?;
    Ok(ok(json!({"enabled": script.subdomain_enabled, "previews_enabled": script.previews_enabled})))
}

/// `POST /accounts/{a}/workers/scripts/{name}/subdomain`: recorded; a deployed Worker is served
/// on the Workers listener either way.
pub async fn set_subdomain(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let script = script_of(workers, &account_id, &name)?;
    let body: SubdomainBody = parse_json(&read_body(body).await?)?;
    let previews = body.previews_enabled.unwrap_or(script.previews_enabled);
    workers.catalog().set_worker_subdomain(&script.id, body.enabled, previews)?;
    Ok(ok(json!({"enabled": body.enabled, "previews_enabled": previews})))
}

/// `GET /accounts/{a}/workers/subdomain`: the account's workers.dev-style subdomain.
pub async fn account_subdomain(
    State(app): State<AppState>,
    caller: Caller,
    V4Path(account_id): V4Path<String>,
) -> Result<Response, ApiError> {
    workers(&app, &caller, &account_id)?;
    Ok(ok(json!({"subdomain": "kura"})))
}

#[derive(Deserialize)]
struct ScheduleBody {
    cron: String,
}

/// `PUT /accounts/{a}/workers/scripts/{name}/schedules` (`[{"cron": "…"}]`): replaces the
/// script's Cron Triggers; `[]` clears them. An expression that does not parse changes nothing.
pub async fn put_schedules(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let body: Vec<ScheduleBody> = parse_json(&read_body(body).await?)?;
    let crons: Vec<String> = body.into_iter().map(|s| s.cron).collect();
    let schedules = workers.set_schedules(&account_id, &name, &crons).await?;
    Ok(ok(json!({ "schedules": schedules.iter().map(schedule_json).collect::<Vec<_>>() })))
}

#[derive(Deserialize)]
struct TriggerBody {
    cron: String,
    #[serde(default, rename = "scheduledTime")]
    scheduled_time: Option<i64>,
}

/// `POST /accounts/{a}/workers/scripts/{name}/schedules/trigger` (kura's own; `kura workers
/// trigger`): runs the Worker's `scheduled` handler now with `{cron, scheduledTime}` (default:
/// this minute), whether or not it is one of its schedules, and answers `{outcome, noRetry}`.
pub async fn trigger_schedule(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let body: TriggerBody = parse_json(&read_body(body).await?)?;
    let scheduled = body.scheduled_time.unwrap_or_else(|| jiff::Timestamp::now().as_millisecond() / 60_000 * 60_000);
    let run = workers.trigger(&account_id, &name, &body.cron, scheduled).await?;
    Ok(ok(run))
}

/// `GET /accounts/{a}/workers/scripts/{name}/schedules`
pub async fn get_schedules(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let schedules = workers.schedules(&account_id, &name)?;
    Ok(ok(json!({ "schedules": schedules.iter().map(schedule_json).collect::<Vec<_>>() })))
}

/// `GET /accounts/{a}/workers/scripts/{name}/deployments`
pub async fn list_deployments(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let script = script_of(workers, &account_id, &name)?;
    let deployments: Vec<Json> =
        workers.catalog().worker_deployments(&script.id)?.iter().map(deployment_json).collect();
    Ok(ok(json!({"deployments": deployments})))
}

#[derive(Deserialize)]
struct DeploymentBody {
    #[serde(default)]
    strategy: Option<String>,
    versions: Vec<DeploymentVersion>,
    #[serde(default)]
    annotations: Option<serde_json::Map<String, Json>>,
}

#[derive(Deserialize)]
struct DeploymentVersion {
    version_id: String,
    percentage: f64,
}

/// `POST /accounts/{a}/workers/scripts/{name}/deployments`: one version at 100% (kura serves
/// one version of a script at a time).
pub async fn create_deployment(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let body: DeploymentBody = parse_json(&read_body(body).await?)?;
    let single = match body.versions.as_slice() {
        [only] if (only.percentage - 100.0).abs() < f64::EPSILON => only,
        _ => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                10021,
                "kura serves one version of a Worker at a time: deploy a single version at 100%",
            ));
        }
    };
    if body.strategy.as_deref().is_some_and(|s| s != "percentage") {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, 10021, "the only deployment strategy is 'percentage'"));
    }
    let annotations = body.annotations.map(|a| Json::Object(a).to_string());
    let deployment = workers.deploy_version(&account_id, &name, &single.version_id, annotations.as_deref()).await?;
    Ok(ok(deployment_json(&deployment)))
}

/// `GET /accounts/{a}/workers/scripts/{name}/versions`
pub async fn list_versions(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let script = script_of(workers, &account_id, &name)?;
    let mut items = Vec::new();
    for version in workers.catalog().worker_versions(&script.id)? {
        items.push(version_json(workers, &script, &version)?);
    }
    let count = items.len() as u64;
    Ok(ok_paged(json!({"items": items}), ResultInfo::numbered(1, count.max(1), count, count)))
}

/// `GET /accounts/{a}/workers/scripts/{name}/versions/{id}`
pub async fn get_version(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name, version_id)): V4Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let script = script_of(workers, &account_id, &name)?;
    let version = workers
        .catalog()
        .worker_version(&script.id, &version_id)?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, 10007, format!("no version '{version_id}' of '{name}'")))?;
    Ok(ok(version_json(workers, &script, &version)?))
}

#[derive(Deserialize)]
struct SecretBody {
    name: String,
    text: String,
    #[serde(default, rename = "type")]
    kind: Option<String>,
}

/// `PUT /accounts/{a}/workers/scripts/{name}/secrets`
pub async fn put_secret(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let body: SecretBody = parse_json(&read_body(body).await?)?;
    if body.kind.as_deref().is_some_and(|k| k != "secret_text") {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, 10021, "only secrets of type secret_text are supported"));
    }
    workers.set_secret(&account_id, &name, &body.name, &body.text).await?;
    Ok(ok(json!({"name": body.name, "type": "secret_text"})))
}

/// `GET /accounts/{a}/workers/scripts/{name}/secrets`
pub async fn list_secrets(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let names = workers.secret_names(&account_id, &name)?;
    Ok(ok(names.into_iter().map(|n| json!({"name": n, "type": "secret_text"})).collect::<Vec<_>>()))
}

/// `DELETE /accounts/{a}/workers/scripts/{name}/secrets/{secret}`
pub async fn delete_secret(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name, secret)): V4Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    if !workers.delete_secret(&account_id, &name, &secret).await? {
        return Err(ApiError::new(StatusCode::NOT_FOUND, 10056, format!("The secret '{secret}' does not exist")));
    }
    Ok(ok(Json::Null))
}

/// `GET /accounts/{a}/workers/scripts/{name}/references`: what `wrangler delete` checks.
pub async fn references(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    script_of(workers, &account_id, &name)?;
    Ok(ok(json!({"services": {"incoming": [], "outgoing": []}, "durable_objects": [], "dispatch_outbounds": []})))
}

/// `GET /accounts/{a}/workers/tails/by-consumer/{name}`: kura has no tail consumers.
pub async fn tails_by_consumer(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, _name)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    workers(&app, &caller, &account_id)?;
    Ok(ok(json!([])))
}

fn tail_json(headers: &HeaderMap, tail: &kura_workers::tails::TailInfo) -> Json {
    let origin = crate::transfer::origin(headers);
    let origin = origin.replacen("https://", "wss://", 1).replacen("http://", "ws://", 1);
    json!({"id": tail.id, "url": format!("{origin}/workers-tails/{}", tail.id), "expires_at": tail.expires_at_iso()})
}

/// `POST /accounts/{a}/workers/scripts/{name}/tails` (`wrangler tail`): opens a tail with the
/// body's filters; its events stream from the answer's `url`, a WebSocket reached with no
/// other credential than the tail's id.
pub async fn create_tail(
    State(app): State<AppState>,
    caller: Caller,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    headers: HeaderMap,
    V4Path((account_id, name)): V4Path<(String, String)>,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let script = script_of(workers, &account_id, &name)?;
    let body = read_body(body).await?;
    let filters = kura_workers::tails::Filters::parse(&body, Some(&peer.ip().to_string()))?;
    let tail = workers.tails().create(&script.id, &script.name, filters)?;
    Ok(ok(tail_json(&headers, &tail)))
}

/// `GET /accounts/{a}/workers/scripts/{name}/tails`: the script's open tails.
pub async fn list_tails(
    State(app): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    V4Path((account_id, name)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let script = script_of(workers, &account_id, &name)?;
    let tails: Vec<Json> = workers.tails().list(&script.id).iter().map(|t| tail_json(&headers, t)).collect();
    Ok(ok(tails))
}

/// `DELETE /accounts/{a}/workers/scripts/{name}/tails/{id}` (wrangler, on its way out, after it
/// has closed the socket — which already closed the tail): succeeds whether or not the tail is
/// still open.
pub async fn delete_tail(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name, id)): V4Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let script = script_of(workers, &account_id, &name)?;
    workers.tails().close(&script.id, &id);
    Ok(ok(Json::Null))
}

/// `POST /accounts/{a}/workers/scripts/{name}/assets-upload-session` (wrangler, before the
/// script upload: the script may not exist yet): the manifest's hashes kura lacks, in buckets,
/// and the session's token — or, lacking none, the completion token.
pub async fn assets_upload_session(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    if !kura_catalog::is_valid_script_name(&name) {
        return Err(WorkersError::invalid_upload(format!("'{name}' is not a valid Worker name")).into());
    }
    let body: Json = parse_json(&read_body(body).await?)?;
    let workers = workers.clone();
    // Up to 100,000 files looked up on disk: off the runtime's threads.
    let started = tokio::task::spawn_blocking(move || workers.assets().start_session(&account_id, &body["manifest"]))
        .await
        .map_err(|e| ApiError::internal_text(&e))??;
    Ok(created(json!({"jwt": started.jwt, "buckets": started.buckets})))
}

/// `POST /accounts/{a}/workers/assets/upload?base64=true`, authorized by the session's token
/// instead of an API token: one bucket of files, a part per hash. The request that completes
/// the session answers the completion token.
pub async fn assets_upload(
    State(app): State<AppState>,
    headers: HeaderMap,
    V4Path(_account_id): V4Path<String>,
    V4Query(query): V4Query,
    form: Result<Multipart, MultipartRejection>,
) -> Result<Response, ApiError> {
    let Some(workers) = app.workers.as_ref() else { return Err(ApiError::forbidden()) };
    let jwt = crate::auth::bearer(&headers)?.to_owned();
    let mut form = form.map_err(|_| {
        ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, 10001, "Content-Type must be one of: multipart/form-data")
    })?;
    // A stranger's upload is refused before its body is read, and no part may be larger
    // than the largest file's base64.
    let refused = || WorkersError::InvalidAssets("the asset upload token is unknown or has expired".into());
    if !workers.assets().expects(&jwt, None) {
        return Err(refused().into());
    }
    let largest = kura_workers::assets::MAX_ASSET_BYTES as usize / 3 * 4 + 8;
    let mut files = Vec::new();
    while let Some(mut field) = form.next_field().await.map_err(|e| ApiError::bad_request(e.body_text()))? {
        let hash = field.name().unwrap_or("").to_owned();
        if !workers.assets().expects(&jwt, Some(&hash)) {
            return Err(WorkersError::InvalidAssets(format!("{hash} is not a file of this upload session")).into());
        }
        let content_type = field.content_type().map(str::to_owned);
        let mut bytes = Vec::new();
        while let Some(chunk) = field.chunk().await.map_err(|e| ApiError::bad_request(e.body_text()))? {
            if bytes.len() + chunk.len() > largest {
                return Err(
                    WorkersError::InvalidAssets(format!("the part {hash} is larger than any asset may be")).into()
                );
            }
            bytes.extend_from_slice(&chunk);
        }
        files.push((hash, content_type, bytes));
    }
    let base64 = query.get("base64").is_some_and(|v| v == "true");
    let workers = workers.clone();
    // Hashing, decoding and syncing files: off the runtime's threads.
    let completed = tokio::task::spawn_blocking(move || workers.assets().upload(&jwt, files, base64))
        .await
        .map_err(|e| ApiError::internal_text(&e))??;
    Ok(match completed {
        Some(jwt) => created(json!({"jwt": jwt})),
        None => {
            let mut response = ok(json!({}));
            *response.status_mut() = StatusCode::ACCEPTED;
            response
        }
    })
}

fn created(result: Json) -> Response {
    let mut response = ok(result);
    *response.status_mut() = StatusCode::CREATED;
    response
}

/// `GET /accounts/{a}/workers/scripts/{name}/logs` (kura's own): the script's recent console
/// output and exceptions, oldest first.
pub async fn logs(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, name)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    let workers = workers(&app, &caller, &account_id)?;
    let script = script_of(workers, &account_id, &name)?;
    Ok(ok(workers.logs().recent(&script.id)))
}
