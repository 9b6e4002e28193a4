//! Who is calling: the bearer token of each v4 API request, checked against the catalog, and
//! what it may do in which account.

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

use kura_catalog::{Scope, Token};

use crate::error::ApiError;
use crate::state::AppState;

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The token that authenticated the request.
    pub token: Token,
}

/// What an endpoint needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Read D1 databases.
    D1Read,
    /// Change D1 databases.
    D1Write,
    /// Read R2 buckets and objects.
    R2Read,
    /// Change R2 buckets and objects.
    R2Write,
    /// Read Durable Objects.
    DoRead,
    /// Change Durable Object namespaces and storage.
    DoWrite,
    /// Read KV namespaces, keys and values.
    KvRead,
    /// Change KV namespaces, keys and values.
    KvWrite,
    /// Read queues.
    QueuesRead,
    /// Change queues and their messages.
    QueuesWrite,
}

impl Caller {
    /// Checks that the caller acts for `account_id` and may do `need` there. A token of another
    /// account gets the same answer whether or not the account exists.
    pub fn require(&self, account_id: &str, need: Need) -> Result<(), ApiError> {
        let allowed = match need {
            Need::D1Read => self.token.scope.can_read_d1(),
            Need::D1Write => self.token.scope.can_write_d1(),
            Need::R2Read => self.token.scope.can_read_r2(),
            Need::R2Write => self.token.scope.can_write_r2(),
            Need::DoRead => self.token.scope.can_read_do(),
            Need::DoWrite => self.token.scope.can_write_do(),
            Need::KvRead => self.token.scope.can_read_kv(),
            Need::KvWrite => self.token.scope.can_write_kv(),
            Need::QueuesRead => self.token.scope.can_read_queues(),
            Need::QueuesWrite => self.token.scope.can_write_queues(),
        };
        if self.token.account_id != account_id || !allowed {
            return Err(ApiError::forbidden());
        }
        Ok(())
    }

    /// Whether the caller may run statements that write.
    pub fn can_write_d1(&self) -> bool {
        self.token.scope.can_write_d1()
    }

    /// The caller's scope.
    pub fn scope(&self) -> Scope {
        self.token.scope
    }

    /// Checks that the caller is an admin of `account_id` with no bucket limit: what managing
    /// tokens (a limited admin could mint itself an unlimited one), Workers (whose R2 bindings
    /// reach any bucket of the account) and the cluster's own routes need.
    pub fn require_unlimited_admin(&self, account_id: &str) -> Result<(), ApiError> {
        if self.token.account_id != account_id || self.token.scope != Scope::Admin || self.token.buckets.is_some() {
            return Err(ApiError::forbidden());
        }
        Ok(())
    }
}

/// The secret of a request's `Authorization: Bearer` header (an API token, or another
/// credential an endpoint takes in its place, such as an asset upload session's token).
pub fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let header = headers.get(AUTHORIZATION).ok_or_else(ApiError::missing_credentials)?;
    let header = header.to_str().map_err(|_| ApiError::malformed_credentials())?;
    match header.split_once(' ') {
        Some((scheme, secret)) if scheme.eq_ignore_ascii_case("bearer") && !secret.trim().is_empty() => {
            Ok(secret.trim())
        }
        _ => Err(ApiError::malformed_credentials()),
    }
}

impl Caller {
    /// Authenticates a request by its `Authorization: Bearer` header.
    pub fn from_headers(headers: &HeaderMap, state: &AppState) -> Result<Caller, ApiError> {
        match state.catalog.authenticate(bearer(headers)?) {
            Ok(Some(token)) => Ok(Caller { token }),
            Ok(None) => Err(ApiError::invalid_token()),
            Err(e) => Err(ApiError::internal(&e)),
        }
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        Caller::from_headers(&parts.headers, state)
    }
}
