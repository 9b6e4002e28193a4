//! The S3 listener. R2's S3 API arrives with the R2 engine; until then every request gets S3's
//! own `NotImplemented` error, so clients fail clearly rather than hang or misparse.

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;

/// The S3 listener's routes.
pub fn routes() -> Router {
    Router::new().fallback(|| async {
        let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>NotImplemented</Code>\
                    <Message>kura does not serve the S3 API yet.</Message></Error>";
        (StatusCode::NOT_IMPLEMENTED, [(header::CONTENT_TYPE, "application/xml")], body).into_response()
    })
}
