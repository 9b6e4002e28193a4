//! A client for Cloudflare's v4 API, configured the way wrangler is: `CLOUDFLARE_API_BASE_URL`,
//! `CLOUDFLARE_API_TOKEN`, `CLOUDFLARE_ACCOUNT_ID` (or their `CF_` aliases).

use anyhow::{Context, anyhow, bail};
use reqwest::Method;
use serde_json::Value as Json;

const DEFAULT_BASE: &str = "https://api.cloudflare.com/client/v4";

fn env(name: &str, alias: &str) -> Option<String> {
    std::env::var(name).ok().or_else(|| std::env::var(alias).ok()).filter(|v| !v.is_empty())
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
    pub async fn from_env() -> anyhow::Result<Self> {
        let base = env("CLOUDFLARE_API_BASE_URL", "CF_API_BASE_URL").unwrap_or_else(|| DEFAULT_BASE.to_owned());
        let token = env("CLOUDFLARE_API_TOKEN", "CF_API_TOKEN")
            .context("--remote needs an API token: set CLOUDFLARE_API_TOKEN (kura prints one on first start)")?;
        let http = reqwest::Client::builder()
            .user_agent(concat!("kura/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("cannot build the HTTP client")?;
        let mut client = ApiClient { http, base: base.trim_end_matches('/').to_owned(), token, account: String::new() };
        client.account = match env("CLOUDFLARE_ACCOUNT_ID", "CF_ACCOUNT_ID") {
            Some(id) => id,
            None => client.discover_account().await?,
        };
        Ok(client)
    }

    async fn discover_account(&self) -> anyhow::Result<String> {
        let accounts = self.call(Method::GET, "/accounts", None).await?;
        let ids: Vec<&str> = accounts.as_array().into_iter().flatten().filter_map(|a| a["id"].as_str()).collect();
        match ids.as_slice() {
            [one] => Ok(one.to_string()),
            [] => bail!("the API token reaches no account; set CLOUDFLARE_ACCOUNT_ID"),
            _ => {
                bail!("the API token reaches several accounts; set CLOUDFLARE_ACCOUNT_ID to one of {}", ids.join(", "))
            }
        }
    }

    /// `/accounts/{account}` followed by `suffix`.
    pub fn account_path(&self, suffix: &str) -> String {
        format!("/accounts/{}{suffix}", self.account)
    }

    /// Calls the API and returns the envelope's `result`, or the envelope's errors as an error.
    pub async fn call(&self, method: Method, path: &str, body: Option<&Json>) -> anyhow::Result<Json> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method.clone(), &url).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(body);
        }
        let what = format!("{method} {path}");
        let response = request.send().await.with_context(|| format!("A request to the API ({what}) failed"))?;
        let status = response.status();
        let text = response.text().await.with_context(|| format!("A request to the API ({what}) failed"))?;
        let envelope: Json = serde_json::from_str(&text).map_err(|_| {
            anyhow!(
                "Received a malformed response from the API ({what}, HTTP {status}): {}",
                text.chars().take(200).collect::<String>()
            )
        })?;
        if envelope["success"].as_bool() != Some(true) {
            let errors: Vec<String> = envelope["errors"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| format!("{} [code: {}]", e["message"].as_str().unwrap_or("unknown error"), e["code"]))
                .collect();
            bail!(
                "A request to the API ({what}) failed: {}",
                if errors.is_empty() { format!("HTTP {status}") } else { errors.join("; ") }
            );
        }
        Ok(envelope["result"].clone())
    }

    /// Sends a request whose body or answer is not JSON (R2 objects); a failure is reported from
    /// the envelope the API answers errors with.
    pub async fn send(&self, request: reqwest::RequestBuilder, what: &str) -> anyhow::Result<reqwest::Response> {
        let response = request.bearer_auth(&self.token).send().await.with_context(|| format!("{what} failed"))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let message = serde_json::from_str::<Json>(&text)
            .ok()
            .and_then(|e| e["errors"][0]["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| format!("HTTP {status}"));
        bail!("{what} failed: {message}")
    }

    /// A request builder for `path` under the API's base.
    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, format!("{}{path}", self.base))
    }

    /// Calls the API and returns the whole JSON body (for `/graphql`, which has no envelope).
    pub async fn call_raw(&self, method: Method, path: &str, body: &Json) -> anyhow::Result<Json> {
        let url = format!("{}{path}", self.base);
        let response = self.http.request(method, &url).bearer_auth(&self.token).json(body).send().await?;
        Ok(response.json().await?)
    }
}
