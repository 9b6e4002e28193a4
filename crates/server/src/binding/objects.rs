//! In a cluster, a JavaScript Durable Object stub's call (`fetch()` or RPC), as the stub
//! binding sends it to kura: the placement has brought it to the node serving the object's
//! namespace, which claims the object's file (rebuilt from the store when first reached here),
//! makes the call through its workerd's door to the class, and answers only once what the call
//! committed is in the store — so an answered call is never lost with this node.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use kura_workers::config::headers;

use crate::error::{ApiError, Wire};
use crate::state::AppState;

fn header<'a>(request: &'a HeaderMap, name: &str) -> Option<&'a str> {
    request.get(name).and_then(|v| v.to_str().ok())
}

/// `POST /objects/call` on the binding socket, carrying [`headers::DO_NAMESPACE`].
pub async fn call(State(app): State<AppState>, request: Request) -> Response {
    match serve(&app, request).await {
        Ok(response) => response,
        Err(e) => Wire::StatusLine.refuse(e),
    }
}

async fn serve(app: &AppState, mut request: Request) -> Result<Response, ApiError> {
    let workers = super::from_workerd(app, request.headers())?;
    let account = super::worker_account(app, request.headers())?;
    let (namespace_id, object) =
        match (header(request.headers(), headers::DO_NAMESPACE), header(request.headers(), headers::DO_OBJECT)) {
            (Some(namespace), Some(object)) => (namespace.to_owned(), object.to_owned()),
            _ => return Err(ApiError::bad_request("a Durable Object call names its namespace and its object")),
        };
    let namespace = app
        .catalog
        .do_namespace(&account, &namespace_id)
        .map_err(|e| ApiError::internal(&e))?
        .filter(|n| n.hosted_by_workerd())
        .ok_or_else(|| {
            ApiError::new(StatusCode::NOT_FOUND, 10007, "no such Durable Object namespace of a deployed class")
        })?;
    let script = namespace
        .script
        .as_deref()
        .and_then(|name| app.catalog.worker_script(&account, name).ok().flatten())
        .ok_or_else(|| {
            ApiError::new(StatusCode::NOT_FOUND, 10007, "the Durable Object class's Worker is not deployed")
        })?;
    let engine_namespace = crate::resources::engine_namespace(&namespace)?;
    let name = header(request.headers(), headers::DO_NAME)
        .map(|n| percent_encoding::percent_decode_str(n).decode_utf8_lossy().into_owned());
    let id = match &name {
        Some(name) => engine_namespace.id_from_name(name),
        None => engine_namespace.id_from_string(&object)?,
    };
    if id.to_string() != object {
        return Err(ApiError::bad_request("the name does not derive the object's id"));
    }
    // Held until the call has run and shipped: the file is not rebuilt under it meanwhile.
    let _call = app.durable_objects.claim_hosted(&engine_namespace, &id).await?;
    // What the door must not see: this run's secret, and kura's own routing.
    for name in [headers::SECRET, headers::ACCOUNT, headers::DO_NAMESPACE] {
        request.headers_mut().remove(name);
    }
    let class = axum::http::HeaderValue::from_str(&namespace.class_name)
        .map_err(|_| ApiError::bad_request("the class's name cannot be sent in a header"))?;
    request.headers_mut().insert(headers::DO_CLASS, class);
    let response = workers.call_door(&script.id, request).await?;
    // The call ran: a failure from here on leaves what it wrote unknown (it may still ship
    // later, or be lost with this node), so it is no "retry", which promises nothing happened.
    app.durable_objects.ship_hosted(&engine_namespace, &id).await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            10001,
            format!("the call ran, but what it wrote is not in the cluster's store yet, and may not be kept: {e}"),
        )
    })?;
    Ok(response)
}
