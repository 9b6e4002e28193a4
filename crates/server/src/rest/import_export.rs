//! D1's export and import flows (`POST …/export`, `POST …/import`), polling protocol included.
//! kura runs each to completion within the call, so the first answer is already final; the
//! files travel through [`crate::transfer`]'s URLs.

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value as Json, json};

use kura_d1::dump::DumpOptions;

use crate::auth::{Caller, Need};
use crate::error::{ApiError, ok};
use crate::extract::parse_json;
use crate::extract::{V4Path, read_body};
use crate::state::AppState;
use crate::transfer;

#[derive(Deserialize, Default)]
struct DumpOptionsBody {
    #[serde(default)]
    no_schema: bool,
    #[serde(default)]
    no_data: bool,
    #[serde(default)]
    tables: Vec<String>,
}

#[derive(Deserialize)]
struct ExportBody {
    #[serde(default)]
    output_format: Option<String>,
    #[serde(default)]
    dump_options: Option<DumpOptionsBody>,
}

/// `POST …/{database}/export`
pub async fn export(
    State(app): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    V4Path((account_id, database)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::D1Read)?;
    let body: ExportBody = parse_json(&read_body(body).await?)?;
    if body.output_format.as_deref().is_some_and(|f| f != "polling") {
        return Err(ApiError::bad_request("Invalid property: output_format => only \"polling\" is supported"));
    }
    let options = body.dump_options.unwrap_or_default();
    if options.no_schema && options.no_data {
        return Err(ApiError::bad_request(
            "Invalid property: dump_options => no_schema and no_data cannot both be set",
        ));
    }
    let db = app.d1.get(&account_id, &database)?;
    let (token, path) = app.transfers.reserve_download();
    let options = DumpOptions {
        no_schema: options.no_schema,
        no_data: options.no_data,
        tables: options.tables,
        ..Default::default()
    };
    match app.d1.export(&account_id, &db.uuid, options, path.clone()).await {
        Ok((bookmark, stats)) => {
            app.transfers.publish_download(&token, path);
            Ok(ok(json!({
                "success": true,
                "type": "export",
                "at_bookmark": bookmark.to_string(),
                "status": "complete",
                "messages": [format!("Exported {} rows in {} statements", stats.rows, stats.statements)],
                "result": {
                    "filename": format!("{}-{}.sql", db.name, bookmark),
                    "signed_url": transfer::url(&headers, &token),
                },
            })))
        }
        Err(kura_d1::Error::Export(e)) => {
            let _ = std::fs::remove_file(&path);
            Ok(ok(
                json!({ "success": true, "type": "export", "status": "error", "error": e.to_string(), "messages": [] }),
            ))
        }
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            Err(e.into())
        }
    }
}

#[derive(Deserialize)]
struct ImportBody {
    action: String,
    #[serde(default)]
    etag: Option<String>,
    #[serde(default)]
    filename: Option<String>,
}

/// `POST …/{database}/import` with `action` `init`, `ingest` or `poll`.
pub async fn import(
    State(app): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    V4Path((account_id, database)): V4Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    caller.require(&account_id, Need::D1Write)?;
    let body: ImportBody = parse_json(&read_body(body).await?)?;
    let db = app.d1.get(&account_id, &database)?;
    match body.action.as_str() {
        "init" => {
            let etag = body
                .etag
                .filter(|e| !e.is_empty())
                .ok_or_else(|| ApiError::bad_request("Invalid property: etag is required"))?;
            let token = app.transfers.expect_upload(&account_id, &db.uuid, &etag);
            Ok(ok(json!({ "success": true, "filename": token, "upload_url": transfer::url(&headers, &token) })))
        }
        "ingest" => {
            let token = body.filename.ok_or_else(|| ApiError::bad_request("Invalid property: filename is required"))?;
            let upload = app
                .transfers
                .upload(&token, &account_id, &db.uuid)
                .ok_or_else(|| ApiError::bad_request("Not currently importing anything."))?;
            if !matches!(upload.state, transfer::UploadState::Received { .. }) {
                return Ok(ok(json!({ "success": false, "error": "The file was not uploaded." })));
            }
            let Some((upload, md5)) = app.transfers.take_received(&token) else {
                return Err(ApiError::bad_request("Not currently importing anything."));
            };
            if body.etag.as_deref().is_some_and(|e| e != md5) || md5 != upload.etag {
                let _ = std::fs::remove_file(&upload.path);
                return Ok(ok(json!({ "success": false, "error": "The uploaded file does not match its etag." })));
            }
            let outcome = ingest(&app, &account_id, &db.uuid, &upload.path).await;
            let _ = std::fs::remove_file(&upload.path);
            let outcome = outcome?;
            app.transfers.record_import(&db.uuid, outcome.clone());
            Ok(ok(outcome))
        }
        "poll" => match app.transfers.last_import(&db.uuid) {
            Some(outcome) => Ok(ok(outcome)),
            None => Ok(ok(json!({ "success": false, "error": "Not currently importing anything." }))),
        },
        other => {
            Err(ApiError::bad_request(format!("Invalid property: action => '{other}' is not init, ingest or poll")))
        }
    }
}

/// Runs an uploaded file; SQL failures become an `error` poll object (the import changed
/// nothing), anything else an API error.
async fn ingest(app: &AppState, account_id: &str, uuid: &str, path: &std::path::Path) -> Result<Json, ApiError> {
    let file = std::fs::File::open(path).map_err(|e| ApiError::internal(&e))?;
    let input = Box::new(std::io::BufReader::with_capacity(256 * 1024, file));
    match app.d1.import(account_id, uuid, input).await {
        Ok((outcome, bookmark)) => Ok(json!({
            "success": true,
            "type": "import",
            "at_bookmark": bookmark.to_string(),
            "status": "complete",
            "messages": [format!("Imported {} statements", outcome.num_queries)],
            "result": kura_d1::wire::imported(&outcome, &bookmark),
        })),
        Err(kura_d1::Error::Import(e)) => Ok(json!({
            "success": true,
            "type": "import",
            "status": "error",
            "errors": [e.to_string()],
            "error": e.to_string(),
            "messages": ["The import failed and changed nothing: your database is as it was before."],
        })),
        Err(e) => Err(e.into()),
    }
}
