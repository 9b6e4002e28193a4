//! Finding what a request names, for the caller that names it: an R2 bucket its token
//! reaches, a Durable Object or KV namespace of its account. Shared by the v4 API and the
//! bindings.

use axum::http::StatusCode;
use kura_catalog::{DoNamespace, KvNamespace, R2Bucket};
use kura_do::{DoError, Namespace};
use kura_r2::R2Error;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;

/// Refuses a token whose bucket limit leaves out `name` (whether or not that bucket exists).
pub fn require_reach(app: &AppState, caller: &Caller, name: &str) -> Result<(), ApiError> {
    let reaches = app
        .catalog
        .s3_credential(&caller.token.id)
        .map_err(|e| ApiError::internal(&e))?
        .is_some_and(|c| c.reaches(name));
    if !reaches {
        return Err(ApiError::forbidden());
    }
    Ok(())
}

/// The caller's bucket `name`, if its token reaches it.
pub fn find_bucket(app: &AppState, caller: &Caller, account_id: &str, name: &str) -> Result<R2Bucket, ApiError> {
    require_reach(app, caller, name)?;
    app.catalog
        .r2_bucket(account_id, name)
        .map_err(|e| ApiError::internal(&e))?
        .ok_or_else(|| R2Error::NoSuchBucket.into())
}

/// The engine's view of a namespace: objects workerd runs are read, never written, by kura.
pub fn engine_namespace(ns: &DoNamespace) -> Result<Namespace, DoError> {
    let engine_ns = Namespace::new(&ns.id, &ns.unique_key)?;
    Ok(if ns.hosted_by_workerd() { engine_ns.hosted_elsewhere() } else { engine_ns })
}

/// The caller's namespace (by id or name) and the engine's view of it.
pub fn find_namespace(
    app: &AppState,
    account_id: &str,
    id_or_name: &str,
) -> Result<(DoNamespace, Namespace), ApiError> {
    let ns = app.catalog.do_namespace(account_id, id_or_name)?.ok_or_else(|| {
        ApiError::new(StatusCode::NOT_FOUND, 10066, format!("Durable Object namespace '{id_or_name}' not found"))
    })?;
    let engine_ns = engine_namespace(&ns)?;
    Ok((ns, engine_ns))
}

/// The account's KV namespace with this id.
pub fn find_kv_namespace(app: &AppState, account_id: &str, id: &str) -> Result<KvNamespace, ApiError> {
    app.catalog.kv_namespace(account_id, id)?.ok_or_else(|| kura_kv::KvError::NamespaceNotFound.into())
}
