//! Cloudflare's v4 envelope, as kura writes it and any client reads it (from kura or from
//! Cloudflare): `{result, success, errors: [{code, message}], messages, result_info?}`.
//!
//! ```
//! use kura_client::v4::{Envelope, ResultInfo};
//!
//! let page = Envelope::paged(vec!["a", "b"], ResultInfo { cursor: Some("b".into()), ..ResultInfo::default() });
//! let text = serde_json::to_string(&page).unwrap();
//! assert_eq!(text, r#"{"result":["a","b"],"success":true,"errors":[],"messages":[],"result_info":{"cursor":"b"}}"#);
//!
//! let refused: Envelope<serde_json::Value> =
//!     serde_json::from_str(r#"{"result":null,"success":false,"errors":[{"code":7404,"message":"gone"}],"messages":[]}"#)
//!         .unwrap();
//! assert_eq!(refused.reason(), Some("gone [code: 7404]".to_owned()));
//! ```

use serde::{Deserialize, Serialize};

/// One answer of the API: a result, or the errors that stopped it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope<T> {
    /// The result (`null` on a failure).
    #[serde(default = "none")]
    pub result: Option<T>,
    /// Whether the request succeeded.
    #[serde(default)]
    pub success: bool,
    /// Why it did not.
    #[serde(default)]
    pub errors: Vec<Message>,
    /// Notes beside the result (kura writes none).
    #[serde(default)]
    pub messages: Vec<serde_json::Value>,
    /// Where a listing's page stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_info: Option<ResultInfo>,
}

fn none<T>() -> Option<T> {
    None
}

/// An error (or a message) in the envelope: Cloudflare's code and its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Cloudflare's code (`10000`, `7404`, …).
    #[serde(default)]
    pub code: u32,
    /// What it says.
    #[serde(default)]
    pub message: String,
}

/// Where a listing's page stands. Cloudflare's listings page in two ways, and each fills in
/// its own fields: by number (`page`, `per_page`, `count`, `total_count`: D1, tokens) or by
/// cursor (`cursor`, and for R2's objects `is_truncated` and `delimited`). Fields left `None`
/// are not written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultInfo {
    /// The page (1-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page: Option<u64>,
    /// Items per page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_page: Option<u64>,
    /// Items on this page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Items on all pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_count: Option<u64>,
    /// Where the next page starts (empty on the last page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// Whether there are more items after this page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_truncated: Option<bool>,
    /// The common prefixes a delimiter rolled up (R2's object listing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delimited: Option<Vec<String>>,
}

impl ResultInfo {
    /// A page counted by number: page `page` of `per_page`, holding `count` of `total_count`.
    pub fn numbered(page: u64, per_page: u64, count: u64, total_count: u64) -> Self {
        ResultInfo {
            page: Some(page),
            per_page: Some(per_page),
            count: Some(count),
            total_count: Some(total_count),
            ..ResultInfo::default()
        }
    }

    /// The next page's cursor, when there is one (an empty cursor means there is none).
    pub fn next_cursor(&self) -> Option<&str> {
        self.cursor.as_deref().filter(|c| !c.is_empty())
    }
}

impl<T> Envelope<T> {
    /// A success.
    pub fn success(result: T) -> Self {
        Envelope { result: Some(result), success: true, errors: Vec::new(), messages: Vec::new(), result_info: None }
    }

    /// A page of a listing.
    pub fn paged(result: T, info: ResultInfo) -> Self {
        Envelope { result_info: Some(info), ..Envelope::success(result) }
    }

    /// A failure, with `result: null`.
    pub fn failure(code: u32, message: impl Into<String>) -> Self {
        Envelope {
            result: None,
            success: false,
            errors: vec![Message { code, message: message.into() }],
            messages: Vec::new(),
            result_info: None,
        }
    }

    /// Why a failure failed, as wrangler shows it (`message [code: n]`, joined by `; `); `None`
    /// for a success, or a failure that gave no errors.
    pub fn reason(&self) -> Option<String> {
        if self.success || self.errors.is_empty() {
            return None;
        }
        let each = self.errors.iter().map(|e| {
            let message = if e.message.is_empty() { "unknown error" } else { &e.message };
            format!("{message} [code: {}]", e.code)
        });
        Some(each.collect::<Vec<_>>().join("; "))
    }
}
