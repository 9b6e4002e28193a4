//! A client for Cloudflare's v4 API, configured the way wrangler is: `CLOUDFLARE_API_BASE_URL`,
//! `CLOUDFLARE_API_TOKEN`, `CLOUDFLARE_ACCOUNT_ID` (or their `CF_` aliases). Works against kura
//! and against Cloudflare itself.

use reqwest::{Method, StatusCode};
use serde_json::Value as Json;

use crate::v4::Envelope;

const DEFAULT_BASE: &str = "https://api.cloudflare.com/client/v4";

/// Why a call to the API failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// No API token in the environment.
    #[error("--remote needs an API token: set CLOUDFLARE_API_TOKEN (kura prints one on first start)")]
    MissingToken,
    /// The token reaches no account, and none was named.
    #[error("the API token reaches no account; set CLOUDFLARE_ACCOUNT_ID")]
    NoAccount,
    /// The token reaches several accounts, and none was named.
    #[error("the API token reaches several accounts; set CLOUDFLARE_ACCOUNT_ID to one of {}", .0.join(", "))]
    SeveralAccounts(Vec<String>),
    /// The request did not get an answer.
    #[error("{what} failed")]
    Transport {
        /// The request (`GET /accounts`, or what the caller named it).
        what: String,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// The answer is not the API's JSON.
    #[error("Received a malformed response from the API ({what}, HTTP {status}): {start}")]
    Malformed {
        /// The request.
        what: String,
        /// The answer's status.
        status: StatusCode,
        /// The answer's first 200 characters.
        start: String,
    },
    /// The API refused the request: its errors (`message [code: n]`), or the status when it
    /// gave none.
    #[error("{what} failed: {reason}")]
    Refused {
        /// The request.
        what: String,
        /// The answer's status.
        status: StatusCode,
        /// The API's errors, joined.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client")]
    Build(#[source] reqwest::Error),
    /// An answer could not be read.
    #[error(transparent)]
    Http(#[from] reqwest::Error),
}

impl ClientError {
    /// Whether the API answered that what the request names does not exist (HTTP 404), as
    /// opposed to refusing the caller or failing.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ClientError::Refused { status: StatusCode::NOT_FOUND, .. })
    }
}

fn env(name: &str, alias: &str) -> Option<String> {
    std::env::var(name).ok().or_else(|| std::env::var(alias).ok()).filter(|v| !v.is_empty())
}

/// The envelope in `text`: `None` unless it is a JSON object (an array or a bare value is not
/// an envelope, though serde would read an array as one field by field).
fn read_envelope(text: &str) -> Option<Envelope<Json>> {
    match serde_json::from_str::<Json>(text).ok()? {
        object @ Json::Object(_) => serde_json::from_value(object).ok(),
        _ => None,
    }
}

/// An authenticated client bound to one account.
pub struct ApiClient {
    http: reqwest::Client,
    base: String,
    token: String,
    /// The account every `/accounts/{id}/…` path uses.
    pub account: String,
}

impl ApiClient {
    /// Builds a client from the environment, discovering the account if it is not given.
    pub async fn from_env() -> Result<Self, ClientError> {
        let base = env("CLOUDFLARE_API_BASE_URL", "CF_API_BASE_URL").unwrap_or_else(|| DEFAULT_BASE.to_owned());
        let token = env("CLOUDFLARE_API_TOKEN", "CF_API_TOKEN").ok_or(ClientError::MissingToken)?;
        let http = reqwest::Client::builder()
            .user_agent(concat!("kura/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(ClientError::Build)?;
        let mut client = ApiClient { http, base: base.trim_end_matches('/').to_owned(), token, account: String::new() };
        client.account = match env("CLOUDFLARE_ACCOUNT_ID", "CF_ACCOUNT_ID") {
            Some(id) => id,
            None => client.discover_account().await?,
        };
        Ok(client)
    }

    async fn discover_account(&self) -> Result<String, ClientError> {
        let accounts = self.call(Method::GET, "/accounts", None).await?;
        let ids: Vec<&str> = accounts.as_array().into_iter().flatten().filter_map(|a| a["id"].as_str()).collect();
        match ids.as_slice() {
            [one] => Ok(one.to_string()),
            [] => Err(ClientError::NoAccount),
            _ => Err(ClientError::SeveralAccounts(ids.iter().map(|id| id.to_string()).collect())),
        }
    }

    /// `/accounts/{account}` followed by `suffix`.
    pub fn account_path(&self, suffix: &str) -> String {
        format!("/accounts/{}{suffix}", self.account)
    }

    /// Calls the API and returns the envelope's `result`, or the envelope's errors as an error.
    pub async fn call(&self, method: Method, path: &str, body: Option<&Json>) -> Result<Json, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method.clone(), &url).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(body);
        }
        let what = format!("A request to the API ({method} {path})");
        let transport = |source| ClientError::Transport { what: what.clone(), source };
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        let text = response.text().await.map_err(transport)?;
        let envelope = read_envelope(&text).ok_or_else(|| ClientError::Malformed {
            what: format!("{method} {path}"),
            status,
            start: text.chars().take(200).collect(),
        })?;
        if !envelope.success {
            let reason = envelope.reason().unwrap_or_else(|| format!("HTTP {status}"));
            return Err(ClientError::Refused { what, status, reason });
        }
        Ok(envelope.result.unwrap_or_default())
    }

    /// Sends a request whose body or answer is not JSON (R2 objects); a failure is reported from
    /// the envelope the API answers errors with.
    pub async fn send(&self, request: reqwest::RequestBuilder, what: &str) -> Result<reqwest::Response, ClientError> {
        let response = request
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|source| ClientError::Transport { what: what.to_owned(), source })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let reason = read_envelope(&text)
            .and_then(|e| e.errors.into_iter().next())
            .map(|e| e.message)
            .filter(|message| !message.is_empty())
            .unwrap_or_else(|| format!("HTTP {status}"));
        Err(ClientError::Refused { what: what.to_owned(), status, reason })
    }

    /// A request builder for `path` under the API's base.
    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, format!("{}{path}", self.base))
    }

    /// Calls the API and returns the whole JSON body (for `/graphql`, which has no envelope).
    pub async fn call_raw(&self, method: Method, path: &str, body: &Json) -> Result<Json, ClientError> {
        let url = format!("{}{path}", self.base);
        let response = self.http.request(method, &url).bearer_auth(&self.token).json(body).send().await?;
        Ok(response.json().await?)
    }
}
