//! An account's API tokens over the v4 API (`/accounts/{id}/tokens`, where Cloudflare keeps
//! account-owned tokens): list, create with a scope and an optional bucket limit, revoke. Only
//! an admin token of the account may use them. A token's secret, and the S3 key pair R2 derives
//! from it, are in the creation's answer only: the catalog keeps a hash.

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use kura_catalog::{Scope, Token};
use serde::Deserialize;
use serde_json::{Value as Json, json};

use crate::auth::Caller;
use crate::error::{ApiError, ResultInfo, ok, ok_paged};
use crate::extract::parse_json;
use crate::extract::{V4Path, read_body};
use crate::state::AppState;

/// Tokens are managed by the account's unlimited admin tokens only: an admin token limited to
/// some buckets could otherwise mint itself an unlimited one.
fn require_admin(caller: &Caller, account_id: &str) -> Result<(), ApiError> {
    caller.require_unlimited_admin(account_id)
}

/// A token as the API shows it: Cloudflare's fields (`status`, `issued_on`) and kura's single
/// scope and bucket limit in place of Cloudflare's policies.
pub(crate) fn token_json(token: &Token) -> Json {
    json!({
        "id": token.id,
        "name": token.name,
        "status": if token.revoked_at.is_some() { "revoked" } else { "active" },
        "issued_on": token.created_at,
        "revoked_on": token.revoked_at,
        "scope": token.scope.to_string(),
        "buckets": token.buckets,
    })
}

/// `GET /accounts/{account_id}/tokens`: every token, revoked ones included, oldest first.
pub async fn list(
    State(app): State<AppState>,
    caller: Caller,
    V4Path(account_id): V4Path<String>,
) -> Result<Response, ApiError> {
    require_admin(&caller, &account_id)?;
    let tokens: Vec<Json> = app.catalog.tokens(&account_id)?.iter().map(token_json).collect();
    let count = tokens.len() as u64;
    Ok(ok_paged(tokens, ResultInfo::numbered(1, count.max(1), count, count)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    name: String,
    scope: String,
    #[serde(default)]
    buckets: Option<Vec<String>>,
}

/// `POST /accounts/{account_id}/tokens` with `{"name", "scope", "buckets"?}`: the new token
/// with its secret (`value`) and, when it reaches R2, its S3 key pair.
pub async fn create(
    State(app): State<AppState>,
    caller: Caller,
    V4Path(account_id): V4Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    require_admin(&caller, &account_id)?;
    let body: CreateBody = parse_json(&read_body(body).await?)?;
    let name = body.name.trim();
    if name.is_empty() || name.chars().count() > 120 {
        return Err(ApiError::bad_request("A token's name is 1 to 120 characters"));
    }
    let scope: Scope = body.scope.parse()?;
    let buckets = body.buckets.filter(|b| !b.is_empty());
    if buckets.is_some() && !scope.can_read_r2() {
        return Err(ApiError::bad_request(format!("A bucket limit needs a token that reaches R2; '{scope}' does not")));
    }
    if let Some(names) = &buckets
        && let Some(bad) = names.iter().find(|n| !kura_catalog::is_valid_bucket_name(n))
    {
        return Err(ApiError::bad_request(format!("'{bad}' is not a valid bucket name")));
    }
    let (token, secret) = app.catalog.create_limited_token(&account_id, name, scope, None, buckets.as_deref())?;
    let mut answer = token_json(&token);
    // Derived from the secret in hand: the token is committed, so nothing may fail after this.
    if token.scope.can_read_r2() {
        answer["s3"] = json!({ "access_key_id": token.id, "secret_access_key": kura_catalog::s3_secret_for(&secret) });
    }
    answer["value"] = json!(secret);
    Ok(ok(answer))
}

/// `DELETE /accounts/{account_id}/tokens/{token_id}`: revokes it; a token that is unknown or
/// already revoked is a 404.
pub async fn revoke(
    State(app): State<AppState>,
    caller: Caller,
    V4Path((account_id, token_id)): V4Path<(String, String)>,
) -> Result<Response, ApiError> {
    require_admin(&caller, &account_id)?;
    if !app.catalog.revoke_token(&account_id, &token_id)? {
        return Err(ApiError::new(StatusCode::NOT_FOUND, 1003, "Invalid API Token: no such live token"));
    }
    Ok(ok(json!({ "id": token_id })))
}
