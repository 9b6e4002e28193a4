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
//!
//! Reading is lenient, field by field: a field that is missing, `null` or of another type
//! than expected reads as its default (no result, no errors, not a success), so an answer
//! whose one field kura does not use is odd still yields its errors and its result.

use serde::de::{DeserializeOwned, Deserializer};
use serde::{Deserialize, Serialize};

/// One answer of the API: a result, or the errors that stopped it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(bound(deserialize = "T: DeserializeOwned"))]
pub struct Envelope<T> {
    /// The result (`null` on a failure).
    #[serde(default = "none", deserialize_with = "lenient_option")]
    pub result: Option<T>,
    /// Whether the request succeeded.
    #[serde(default, deserialize_with = "lenient")]
    pub success: bool,
    /// Why it did not.
    #[serde(default, deserialize_with = "lenient_items")]
    pub errors: Vec<Message>,
    /// Notes beside the result, as given (Cloudflare's are objects or text; kura writes none).
    #[serde(default, deserialize_with = "lenient")]
    pub messages: Vec<serde_json::Value>,
    /// Where a listing's page stands.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "lenient_option")]
    pub result_info: Option<ResultInfo>,
}

fn none<T>() -> Option<T> {
    None
}

/// A value of the expected type, or its default when it is `null` or of another type.
fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned + Default>(d: D) -> Result<T, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    Ok(T::deserialize(value).unwrap_or_default())
}

fn lenient_option<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    Ok(T::deserialize(value).ok())
}

/// The items that read as `T`, the others left out.
fn lenient_items<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Vec<T>, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    let items = match value {
        serde_json::Value::Array(items) => items,
        _ => Vec::new(),
    };
    Ok(items.into_iter().filter_map(|item| T::deserialize(item).ok()).collect())
}

/// An error in the envelope: Cloudflare's code and its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Cloudflare's code (`10000`, `7404`, …); 0 when it gave none that is a number.
    #[serde(default, deserialize_with = "lenient")]
    pub code: u32,
    /// What it says.
    #[serde(default, deserialize_with = "lenient")]
    pub message: String,
}

/// Where a listing's page stands. Cloudflare's listings page in two ways, and each fills in
/// its own fields: by number (`page`, `per_page`, `count`, `total_count`: D1, tokens) or by
/// cursor (`cursor`, beside `per_page` for R2, `count` for Durable Objects, and for R2's
/// objects `is_truncated` and `delimited`). Fields left `None` are not written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultInfo {
    /// The page (1-based).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "lenient_option")]
    pub page: Option<u64>,
    /// Items per page.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "lenient_option")]
    pub per_page: Option<u64>,
    /// Items on this page.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "lenient_option")]
    pub count: Option<u64>,
    /// Items on all pages.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "lenient_option")]
    pub total_count: Option<u64>,
    /// Where the next page starts (empty on the last page).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "lenient_option")]
    pub cursor: Option<String>,
    /// Whether there are more items after this page.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "lenient_option")]
    pub is_truncated: Option<bool>,
    /// The common prefixes a delimiter rolled up (R2's object listing).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "lenient_option")]
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value as Json, json};

    fn read(value: Json) -> Envelope<Json> {
        serde_json::from_value(value).expect("an object always reads as an envelope")
    }

    #[test]
    fn what_kura_writes_reads_back_the_same() {
        let info =
            ResultInfo { cursor: Some("k".into()), is_truncated: Some(true), ..ResultInfo::numbered(1, 2, 2, 9) };
        let written = serde_json::to_value(Envelope::paged(json!(["a", "b"]), info.clone())).unwrap();
        let back = read(written);
        assert!(back.success);
        assert_eq!(back.result, Some(json!(["a", "b"])));
        assert_eq!(back.result_info, Some(info));
        let refusal = serde_json::to_value(Envelope::<()>::failure(10000, "Authentication error")).unwrap();
        assert_eq!(
            refusal,
            json!({"result": null, "success": false, "errors": [{"code": 10000, "message": "Authentication error"}], "messages": []})
        );
    }

    #[test]
    fn a_null_or_oddly_typed_field_reads_as_its_default_and_keeps_the_rest() {
        let odd = read(json!({
            "result": {"id": 1},
            "success": true,
            "errors": null,
            "messages": null,
            "result_info": {"cursor": "c", "is_truncated": "true", "page": -1},
        }));
        assert!(odd.success);
        assert_eq!(odd.result, Some(json!({"id": 1})));
        assert!(odd.errors.is_empty() && odd.messages.is_empty());
        let info = odd.result_info.unwrap();
        assert_eq!((info.next_cursor(), info.is_truncated, info.page), (Some("c"), None, None));

        let refused = read(json!({
            "success": null,
            "errors": [{"code": "7404", "message": null}, "not an error", {"code": 7500, "message": "full"}],
            "messages": [{"code": 1, "message": "note"}, "text"],
        }));
        assert!(!refused.success);
        assert_eq!(refused.result, None);
        assert_eq!(refused.messages.len(), 2);
        assert_eq!(refused.reason(), Some("unknown error [code: 0]; full [code: 7500]".to_owned()));
    }

    #[test]
    fn a_mistyped_result_is_none_and_a_success_has_no_reason() {
        let page: Envelope<Vec<Json>> =
            serde_json::from_value(json!({"result": {"not": "a list"}, "success": true})).unwrap();
        assert_eq!(page.result, None);
        assert_eq!(page.reason(), None);
    }
}
