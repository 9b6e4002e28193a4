//! What the R2 binding answers: a reply's JSON metadata before the object's bytes (sent with
//! its length), an object's metadata as workerd reads it, and a failure in `cf-r2-error`.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::Bytes;
use futures_util::StreamExt;
use kura_r2::{ObjectInfo, R2Error};
use serde_json::{Value as Json, json};

use crate::error;

pub(super) const METADATA_SIZE_HEADER: &str = "cf-r2-metadata-size";

/// A failure as the binding carries it.
#[derive(Debug)]
pub(super) struct BindingError {
    pub(super) status: StatusCode,
    pub(super) code: u32,
    pub(super) message: String,
    /// For a failed `get` precondition: the object, which the Worker still receives.
    pub(super) object: Option<Json>,
}

impl BindingError {
    pub(super) fn new(status: StatusCode, code: u32, message: impl Into<String>) -> Self {
        BindingError { status, code, message: message.into(), object: None }
    }

    pub(super) fn invalid(message: impl Into<String>) -> Self {
        BindingError::new(StatusCode::BAD_REQUEST, 10029, message)
    }
}

impl From<R2Error> for BindingError {
    fn from(e: R2Error) -> Self {
        let (status, code, message) = error::binding::r2_binding_failure(&e);
        BindingError::new(status, code, message)
    }
}

impl IntoResponse for BindingError {
    fn into_response(self) -> Response {
        let mut response = match self.object {
            Some(object) => metadata_reply(self.status, &object, Body::empty(), 0),
            None => self.status.into_response(),
        };
        error::binding::mark_r2_error(&mut response, self.code, &self.message);
        response
    }
}

/// A reply whose body is `metadata` (JSON) and then `rest`, `rest_len` bytes long: sent with
/// its length, not chunked.
pub(super) fn metadata_reply(status: StatusCode, metadata: &Json, rest: Body, rest_len: u64) -> Response {
    let text = Bytes::from(metadata.to_string());
    let length = text.len();
    let body = if rest_len == 0 {
        Body::from(text)
    } else {
        let stream =
            futures_util::stream::once(async move { Ok::<_, axum::Error>(text) }).chain(rest.into_data_stream());
        Body::new(SizedBody { stream: Box::pin(stream), remaining: length as u64 + rest_len })
    };
    let mut response = (status, body).into_response();
    response.headers_mut().insert(METADATA_SIZE_HEADER, HeaderValue::from(length));
    response
}

/// A streamed body whose length is known, so it goes out with `Content-Length`.
pub(super) struct SizedBody {
    pub(super) stream: std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, axum::Error>> + Send>>,
    pub(super) remaining: u64,
}

impl http_body::Body for SizedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        match self.stream.as_mut().poll_next(cx) {
            std::task::Poll::Ready(Some(Ok(chunk))) => {
                self.remaining = self.remaining.saturating_sub(chunk.len() as u64);
                std::task::Poll::Ready(Some(Ok(http_body::Frame::data(chunk))))
            }
            std::task::Poll::Ready(Some(Err(e))) => std::task::Poll::Ready(Some(Err(e))),
            std::task::Poll::Ready(None) => std::task::Poll::Ready(None),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.remaining)
    }
}

pub(super) fn head_json(info: &ObjectInfo, range: Option<(u64, u64)>, http: bool, custom: bool) -> Json {
    let mut out = json!({
        "name": info.key,
        "version": info.version,
        "size": info.size,
        "etag": info.etag,
        "uploaded": info.uploaded_ms,
        "storageClass": info.storage_class,
    });
    if http {
        let h = &info.http;
        let mut fields = serde_json::Map::new();
        for (name, value) in [
            ("contentType", &h.content_type),
            ("contentLanguage", &h.content_language),
            ("contentDisposition", &h.content_disposition),
            ("contentEncoding", &h.content_encoding),
            ("cacheControl", &h.cache_control),
        ] {
            if let Some(value) = value {
                fields.insert(name.into(), json!(value));
            }
        }
        if let Some(expiry) = h.expires.as_deref().and_then(http_date_ms) {
            fields.insert("cacheExpiry".into(), json!(expiry));
        }
        out["httpFields"] = Json::Object(fields);
    }
    if custom {
        out["customFields"] = info.custom.iter().map(|(k, v)| json!({"k": k, "v": v})).collect();
    }
    if let Some((offset, length)) = range {
        out["range"] = json!({"offset": offset, "length": length});
    }
    let mut checksums = serde_json::Map::new();
    for (index, name) in ["md5", "sha1", "sha256", "sha384", "sha512"].iter().enumerate() {
        let Some(value) = info.checksums.get(*name) else { continue };
        let hex = if *name == "md5" {
            value.clone()
        } else {
            match base64::engine::general_purpose::STANDARD.decode(value) {
                Ok(bytes) => hex::encode(bytes),
                Err(_) => continue,
            }
        };
        checksums.insert(index.to_string(), json!(hex));
    }
    out["checksums"] = Json::Object(checksums);
    out
}

pub(super) const HTTP_DATE: &str = "%a, %d %b %Y %H:%M:%S GMT";

/// The HeadResponse workerd builds an `R2Object` from (checksums in hex under `"0"`…`"4"`).
/// An HTTP date (`Expires`, as kept) in Unix milliseconds.
pub(super) fn http_date_ms(text: &str) -> Option<i64> {
    jiff::fmt::rfc2822::DateTimeParser::new().parse_timestamp(text).ok().map(|t| t.as_millisecond())
}
