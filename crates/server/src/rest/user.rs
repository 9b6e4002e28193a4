//! Who the token is: `/accounts`, `/memberships` and token verification, which wrangler calls
//! to discover the account when `CLOUDFLARE_ACCOUNT_ID` is not set.

use axum::extract::State;
use axum::response::Response;
use serde_json::json;

use crate::auth::Caller;
use crate::error::{ApiError, ResultInfo, ok, ok_paged};
use crate::extract::V4Path;
use crate::state::AppState;

fn one_page() -> ResultInfo {
    ResultInfo::numbered(1, 20, 1, 1)
}

fn account_name(app: &AppState, id: &str) -> Result<String, ApiError> {
    Ok(app.catalog.account(id)?.map(|a| a.name).unwrap_or_else(|| id.to_owned()))
}

/// `GET /accounts`: the caller's account.
pub async fn list_accounts(State(app): State<AppState>, caller: Caller) -> Result<Response, ApiError> {
    let id = &caller.token.account_id;
    let name = account_name(&app, id)?;
    Ok(ok_paged(json!([{ "id": id, "name": name, "type": "standard", "settings": {} }]), one_page()))
}

/// `GET /memberships`: the caller's membership of its account.
pub async fn list_memberships(State(app): State<AppState>, caller: Caller) -> Result<Response, ApiError> {
    let id = &caller.token.account_id;
    let name = account_name(&app, id)?;
    let membership = json!([{
        "id": caller.token.id,
        "account": { "id": id, "name": name },
        "status": "accepted",
        "roles": [caller.scope().to_string()],
    }]);
    Ok(ok_paged(membership, one_page()))
}

/// `GET /user`: kura's tokens belong to accounts, not users, so this answers as Cloudflare does
/// for an account token without user permissions (wrangler's `whoami` then says so and goes on
/// to list the account).
pub async fn user_details(_caller: Caller) -> Result<Response, ApiError> {
    Err(ApiError::new(axum::http::StatusCode::FORBIDDEN, 9109, "Unauthorized to access requested resource"))
}

/// `GET /user/tokens/verify`
/// Cloudflare answers `id` and `status`; kura adds what the token may do (its scope, bucket
/// limit and account), which the console reads to show a read-only token a read-only console.
pub async fn verify_token(caller: Caller) -> Result<Response, ApiError> {
    let mut answer = super::tokens::token_json(&caller.token);
    answer["account_id"] = json!(caller.token.account_id);
    Ok(ok(answer))
}

/// `GET /accounts/{account_id}/tokens/verify`
pub async fn verify_account_token(caller: Caller, V4Path(account_id): V4Path<String>) -> Result<Response, ApiError> {
    if caller.token.account_id != account_id {
        return Err(ApiError::forbidden());
    }
    Ok(ok(json!({ "id": caller.token.id, "status": "active" })))
}
