//! Cloudflare's v4 REST API under `/client/v4`: the route table, the response envelope, and the
//! one place where every error becomes its wire form (status, Cloudflare code, message).

mod d1;
pub mod durable_objects;
pub(crate) mod extract;
mod graphql;
mod import_export;
pub(crate) mod r2;
mod time_travel;
mod tokens;
mod user;
pub mod workers;

use std::collections::HashMap;

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::AppState;

/// Where Cloudflare's v4 API lives.
const V4: &str = "/client/v4";

fn v4(path: &str) -> String {
    format!("{V4}{path}")
}

/// Every v4 route kura serves, at its full path. Registered flat rather than nested under
/// [`V4`]: a nested router strips the prefix from every request's URI, which rebuilds the URI
/// (7% of the server threads' time on a Durable Object batch).
pub fn routes() -> Router<AppState> {
    let no_route = || async { ApiError::new(StatusCode::NOT_FOUND, 7003, "No route for that URI") };
    Router::new()
        .route(&v4("/accounts"), get(user::list_accounts))
        .route(&v4("/memberships"), get(user::list_memberships))
        .route(&v4("/user"), get(user::user_details))
        .route(&v4("/user/tokens/verify"), get(user::verify_token))
        .route(&v4("/accounts/{account_id}/tokens/verify"), get(user::verify_account_token))
        .route(&v4("/accounts/{account_id}/tokens"), get(tokens::list).post(tokens::create))
        .route(&v4("/accounts/{account_id}/tokens/{token_id}"), axum::routing::delete(tokens::revoke))
        .route(&v4("/accounts/{account_id}/d1/database"), get(d1::list).post(d1::create))
        .route(
            &v4("/accounts/{account_id}/d1/database/{database}"),
            get(d1::details).delete(d1::delete).put(d1::update).patch(d1::update),
        )
        .route(&v4("/accounts/{account_id}/d1/database/{database}/query"), post(d1::query))
        .route(&v4("/accounts/{account_id}/d1/database/{database}/raw"), post(d1::raw))
        .route(&v4("/accounts/{account_id}/d1/database/{database}/export"), post(import_export::export))
        .route(&v4("/accounts/{account_id}/d1/database/{database}/import"), post(import_export::import))
        .route(&v4("/accounts/{account_id}/d1/database/{database}/time_travel/bookmark"), get(time_travel::bookmark))
        .route(&v4("/accounts/{account_id}/d1/database/{database}/time_travel/restore"), post(time_travel::restore))
        .route(&v4("/accounts/{account_id}/d1/database/{database}/time_travel/history"), get(time_travel::history))
        .route(&v4("/accounts/{account_id}/r2/buckets"), get(r2::list).post(r2::create))
        .route(&v4("/accounts/{account_id}/r2/buckets/{bucket}"), get(r2::details).delete(r2::delete))
        .route(&v4("/accounts/{account_id}/r2/buckets/{bucket}/objects"), get(r2::list_objects))
        .route(
            &v4("/accounts/{account_id}/r2/buckets/{bucket}/objects/{*key}"),
            get(r2::get_object)
                .put(r2::put_object)
                .delete(r2::delete_object)
                // Objects stream to and from the blob store; their size limit is R2's, not the API's.
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces"),
            get(durable_objects::list_namespaces).post(durable_objects::create_namespace),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}"),
            get(durable_objects::namespace_details).patch(durable_objects::update_namespace),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}/objects"),
            get(durable_objects::list_objects).post(durable_objects::new_unique_id),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}/query"),
            post(durable_objects::explorer_query),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}/fan_out"),
            post(durable_objects::fan_out),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}/objects/{object}/batch"),
            post(durable_objects::batch),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}/objects/{object}/query"),
            post(durable_objects::query),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}/objects/{object}/export"),
            get(durable_objects::export),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}/objects/{object}/bookmark"),
            get(durable_objects::bookmark),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}/objects/{object}/restore"),
            post(durable_objects::restore),
        )
        .route(&v4("/accounts/{account_id}/workers/scripts"), get(workers::list_scripts))
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}"),
            get(workers::get_script).put(workers::put_script).delete(workers::delete_script),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/settings"),
            get(workers::settings).patch(workers::patch_script_settings),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/script-settings"),
            get(workers::settings).patch(workers::patch_script_settings),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/subdomain"),
            get(workers::get_subdomain).post(workers::set_subdomain),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/schedules"),
            axum::routing::put(workers::put_schedules),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/deployments"),
            get(workers::list_deployments).post(workers::create_deployment),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/versions"),
            get(workers::list_versions).post(workers::upload_version),
        )
        .route(&v4("/accounts/{account_id}/workers/scripts/{name}/versions/{version}"), get(workers::get_version))
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/secrets"),
            get(workers::list_secrets).put(workers::put_secret),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/secrets/{secret}"),
            axum::routing::delete(workers::delete_secret),
        )
        .route(&v4("/accounts/{account_id}/workers/scripts/{name}/references"), get(workers::references))
        .route(&v4("/accounts/{account_id}/workers/scripts/{name}/logs"), get(workers::logs))
        .route(
            &v4("/accounts/{account_id}/workers/services/{name}"),
            get(workers::service).delete(workers::delete_script),
        )
        .route(&v4("/accounts/{account_id}/workers/subdomain"), get(workers::account_subdomain))
        .route(&v4("/accounts/{account_id}/workers/tails/by-consumer/{name}"), get(workers::tails_by_consumer))
        .route(&v4("/accounts/{account_id}/storage/kv/namespaces"), get(workers::kv_namespaces).post(workers::no_kv))
        .route(&v4("/accounts/{account_id}/workers/scripts/{name}/tails"), post(workers::no_tail))
        .route(&v4("/graphql"), post(graphql::query))
        .route(&v4("/accounts/{account_id}/kura/cluster"), get(crate::cluster::status))
        .route(&v4("/accounts/{account_id}/kura/cluster/drain"), post(crate::cluster::drain))
        .route(V4, axum::routing::any(no_route))
        .route(&v4("/"), axum::routing::any(no_route))
        .route(&v4("/{*rest}"), axum::routing::any(no_route))
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, 7001, "Method not allowed for this URI")
        })
}

/// The success envelope: `{result, success: true, errors: [], messages: [], result_info?}`.
#[derive(Serialize)]
pub struct Envelope<T: Serialize> {
    result: T,
    success: bool,
    errors: [(); 0],
    messages: [(); 0],
    #[serde(skip_serializing_if = "Option::is_none")]
    result_info: Option<ResultInfo>,
}

/// Pagination of a listing.
#[derive(Serialize, Debug, Clone, Copy)]
pub struct ResultInfo {
    /// The page (1-based).
    pub page: u64,
    /// Items per page.
    pub per_page: u64,
    /// Items on this page.
    pub count: u64,
    /// Items on all pages.
    pub total_count: u64,
}

/// Wraps a result in the success envelope.
pub fn ok<T: Serialize>(result: T) -> Response {
    json_response(&Envelope { result, success: true, errors: [], messages: [], result_info: None })
}

/// Wraps a page of results in the success envelope.
pub fn ok_paged<T: Serialize>(result: T, info: ResultInfo) -> Response {
    json_response(&Envelope { result, success: true, errors: [], messages: [], result_info: Some(info) })
}

/// A JSON answer, written into a buffer sized for a typical envelope (`axum::Json` starts at
/// 128 bytes and reallocates its way up, several times for a D1 result's `meta`).
fn json_response(value: &impl Serialize) -> Response {
    let mut body = Vec::with_capacity(512);
    match serde_json::to_writer(&mut body, value) {
        Ok(()) => ([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// An error in Cloudflare's envelope: `{result: null, success: false, errors: [{code, message}]}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: u32,
    message: String,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    result: (),
    success: bool,
    errors: [ErrorItem<'a>; 1],
    messages: [(); 0],
}

#[derive(Serialize)]
struct ErrorItem<'a> {
    code: u32,
    message: &'a str,
}

impl ApiError {
    /// An error with an explicit status, Cloudflare code and message.
    pub fn new(status: StatusCode, code: u32, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into() }
    }

    /// A malformed request (D1's code 7400).
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, 7400, message)
    }

    /// No credentials at all.
    pub fn missing_credentials() -> Self {
        ApiError::new(StatusCode::UNAUTHORIZED, 9106, "Missing X-Auth-Key, X-Auth-Email or Authorization headers")
    }

    /// An Authorization header that is not `Bearer <token>`.
    pub fn malformed_credentials() -> Self {
        ApiError::new(StatusCode::UNAUTHORIZED, 6111, "Invalid format for Authorization header")
    }

    /// A token that is unknown or revoked.
    pub fn invalid_token() -> Self {
        ApiError::new(StatusCode::UNAUTHORIZED, 10000, "Authentication error")
    }

    /// A valid token that may not do this (another account, or too narrow a scope).
    pub fn forbidden() -> Self {
        ApiError::new(StatusCode::FORBIDDEN, 10000, "Authentication error")
    }

    /// A failure that is kura's fault: logged in full, answered with a reference.
    pub fn internal(error: &dyn std::fmt::Display) -> Self {
        let reference = format!("{:016x}", jiff::Timestamp::now().as_nanosecond() as u64);
        tracing::error!(reference, error = %error, "internal error");
        if kura_sqlite::is_disk_full(&error.to_string()) {
            return ApiError::insufficient_storage();
        }
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, 7500, format!("internal error; reference = {reference}"))
    }

    /// The server's disk is full: nothing was changed, and writes succeed again once space is
    /// freed (no restart needed).
    pub fn insufficient_storage() -> Self {
        ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            7500,
            "Insufficient storage: the server's disk is full; nothing was changed. Free some space and retry.",
        )
    }

    /// A cluster that cannot serve this right now (an owner being replaced, the coordinator or
    /// the store out of reach): worth retrying in a moment.
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, 7500, message)
    }

    /// The status this error is answered with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Cloudflare's code for it.
    pub fn code(&self) -> u32 {
        self.code
    }

    /// The message, as the envelope carries it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            result: (),
            success: false,
            errors: [ErrorItem { code: self.code, message: &self.message }],
            messages: [],
        };
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<kura_d1::Error> for ApiError {
    fn from(e: kura_d1::Error) -> Self {
        use kura_d1::Error as E;
        use kura_d1::SqlError as S;
        match e {
            E::NotFound(id) => {
                ApiError::new(StatusCode::NOT_FOUND, 7404, format!("The database {id} could not be found"))
            }
            E::InvalidId(id) => ApiError::bad_request(format!("Invalid property: databaseId => Invalid uuid: {id}")),
            E::DuplicateName => {
                ApiError::new(StatusCode::BAD_REQUEST, 7502, "A database with that name already exists")
            }
            E::TooManyRestores { limit, minutes } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                7400,
                format!("too many restores: at most {limit} per {minutes} minutes for one database"),
            ),
            E::LimitReached(n) => ApiError::new(
                StatusCode::BAD_REQUEST,
                7406,
                format!("System limit reached: databases per account ({n})"),
            ),
            E::Invalid(m) => ApiError::bad_request(m),
            E::Placement(e) => ApiError::unavailable(format!("the database is {e}")),
            E::Catalog(kura_catalog::Error::Replication(m)) => ApiError::unavailable(m),
            E::Import(e) => ApiError::new(StatusCode::BAD_REQUEST, 7500, e.to_string()),
            E::Export(e) => ApiError::new(StatusCode::BAD_REQUEST, 7500, e.to_string()),
            E::Sql(sql) => match sql {
                S::InvalidBookmark { message } => ApiError::bad_request(message),
                S::HistoryDamaged { .. } => {
                    tracing::error!(error = %sql, "restore refused: damaged history");
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, 7500, sql.to_string())
                }
                S::Sql { message, .. } => ApiError::new(StatusCode::BAD_REQUEST, 7500, message),
                S::NoStatements => ApiError::new(StatusCode::BAD_REQUEST, 7500, "No SQL statements detected."),
                S::ReadOnly { sql } => ApiError::new(
                    StatusCode::FORBIDDEN,
                    10000,
                    format!(
                        "Authentication error: this token may only read (D1 Read), and this statement writes: {sql}"
                    ),
                ),
                S::Superseded { .. } => ApiError::unavailable(sql.to_string()),
                S::Overloaded => {
                    ApiError::new(StatusCode::TOO_MANY_REQUESTS, 7500, "D1 DB is overloaded. Too many requests queued.")
                }
                S::Reopening => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, 7500, S::Reopening.to_string()),
                S::Closed => ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    7500,
                    "D1 DB is closing or was deleted while the request waited; retry the operation",
                ),
                other => ApiError::internal(&other),
            },
            other => ApiError::internal(&other),
        }
    }
}

impl From<kura_catalog::Error> for ApiError {
    fn from(e: kura_catalog::Error) -> Self {
        match e {
            kura_catalog::Error::Invalid(m) => ApiError::bad_request(m),
            kura_catalog::Error::Replication(m) => ApiError::unavailable(m),
            other => ApiError::internal(&other),
        }
    }
}

/// Parses a JSON body; anything malformed is a 400 with serde's explanation.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("The request is malformed: the body must be a JSON object"));
    }
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("The request is malformed: {e}")))
}

/// Reads an optional positive integer from the query string.
pub fn query_number(query: &HashMap<String, String>, name: &str) -> Result<Option<u64>, ApiError> {
    match query.get(name) {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => v.parse::<u64>().map(Some).map_err(|_| {
            ApiError::bad_request(format!("Invalid query parameter {name}: expected a positive integer, got '{v}'"))
        }),
    }
}
