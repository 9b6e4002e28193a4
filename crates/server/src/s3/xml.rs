//! R2's compact error body: `<Error><Code/><Message/></Error>`, no namespace, no request id.

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::Response;

/// Escapes text for XML as R2 does (`'` as `&apos;`).
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// An S3 error response in R2's shape.
pub(crate) fn error(status: StatusCode, code: &str, message: &str) -> Response {
    error_with(status, code, message, &[])
}

/// An S3 error response in R2's shape, with extra fields after the message.
pub(crate) fn error_with(status: StatusCode, code: &str, message: &str, extra: &[(&str, String)]) -> Response {
    let fields: String = extra.iter().map(|(name, value)| format!("<{name}>{}</{name}>", escape(value))).collect();
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{}</Code><Message>{}</Message>{fields}</Error>",
        escape(code),
        escape(message)
    );
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/xml")
        .body(Body::from(body))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}
