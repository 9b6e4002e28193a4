//! Cloudflare's v4 REST API under `/client/v4`: its route table, each route with what it
//! touches (see [`crate::routing`]). The handlers live in one file per service; the envelope
//! they answer in and their errors' wire form are [`crate::error`]'s.

mod d1;
pub mod durable_objects;
mod graphql;
mod import_export;
mod kv;
mod queues;
pub(crate) mod r2;
mod time_travel;
mod tokens;
mod user;
pub mod workers;

use axum::routing::{get, post};

use crate::error::{ApiError, Wire};
use crate::routing::{Routes, Touches};

/// Where Cloudflare's v4 API lives.
const V4: &str = "/client/v4";

fn v4(path: &str) -> String {
    format!("{V4}{path}")
}

/// Every v4 route kura serves, at its full path. Registered flat rather than nested under
/// [`V4`]: a nested router strips the prefix from every request's URI, which rebuilds the URI
/// (7% of the server threads' time on a Durable Object batch).
pub fn routes() -> Routes {
    let no_route = || async { ApiError::no_route() };
    Routes::default()
        .route(&v4("/accounts"), Touches::Anywhere, get(user::list_accounts))
        .route(&v4("/memberships"), Touches::Anywhere, get(user::list_memberships))
        .route(&v4("/user"), Touches::Anywhere, get(user::user_details))
        .route(&v4("/user/tokens/verify"), Touches::Anywhere, get(user::verify_token))
        .route(&v4("/accounts/{account_id}/tokens/verify"), Touches::Anywhere, get(user::verify_account_token))
        .route(&v4("/accounts/{account_id}/tokens"), Touches::Anywhere, get(tokens::list).post(tokens::create))
        .route(
            &v4("/accounts/{account_id}/tokens/{token_id}"),
            Touches::Anywhere,
            axum::routing::delete(tokens::revoke),
        )
        .route(&v4("/accounts/{account_id}/d1/database"), Touches::Anywhere, get(d1::list).post(d1::create))
        .route(
            &v4("/accounts/{account_id}/d1/database/{database}"),
            Touches::Database(Wire::V4),
            get(d1::details).delete(d1::delete).put(d1::update).patch(d1::update),
        )
        .route(&v4("/accounts/{account_id}/d1/database/{database}/query"), Touches::Database(Wire::V4), post(d1::query))
        .route(&v4("/accounts/{account_id}/d1/database/{database}/raw"), Touches::Database(Wire::V4), post(d1::raw))
        .route(
            &v4("/accounts/{account_id}/d1/database/{database}/export"),
            Touches::Database(Wire::V4),
            post(import_export::export),
        )
        .route(
            &v4("/accounts/{account_id}/d1/database/{database}/import"),
            Touches::Database(Wire::V4),
            post(import_export::import),
        )
        .route(
            &v4("/accounts/{account_id}/d1/database/{database}/time_travel/bookmark"),
            Touches::Database(Wire::V4),
            get(time_travel::bookmark),
        )
        .route(
            &v4("/accounts/{account_id}/d1/database/{database}/time_travel/restore"),
            Touches::Database(Wire::V4),
            post(time_travel::restore),
        )
        .route(
            &v4("/accounts/{account_id}/d1/database/{database}/time_travel/history"),
            Touches::Database(Wire::V4),
            get(time_travel::history),
        )
        .route(&v4("/accounts/{account_id}/r2/buckets"), Touches::Anywhere, get(r2::list).post(r2::create))
        .route(&v4("/accounts/{account_id}/r2/buckets/{bucket}"), Touches::Bucket, get(r2::details).delete(r2::delete))
        .route(&v4("/accounts/{account_id}/r2/buckets/{bucket}/objects"), Touches::Bucket, get(r2::list_objects))
        .route(
            &v4("/accounts/{account_id}/r2/buckets/{bucket}/objects/{*key}"),
            Touches::Bucket,
            get(r2::get_object)
                .put(r2::put_object)
                .delete(r2::delete_object)
                // Objects stream to and from the blob store; their size limit is R2's, not the API's.
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces"),
            Touches::Anywhere,
            get(durable_objects::list_namespaces).post(durable_objects::create_namespace),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}"),
            Touches::Namespace,
            get(durable_objects::namespace_details).patch(durable_objects::update_namespace),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}/objects"),
            Touches::Namespace,
            get(durable_objects::list_objects).post(durable_objects::new_unique_id),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}/query"),
            Touches::Namespace,
            post(durable_objects::explorer_query),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}/fan_out"),
            Touches::Namespace,
            post(durable_objects::fan_out),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}/objects/{object}/batch"),
            Touches::Namespace,
            post(durable_objects::batch),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}/objects/{object}/query"),
            Touches::Namespace,
            post(durable_objects::query),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}/objects/{object}/export"),
            Touches::Namespace,
            get(durable_objects::export),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}/objects/{object}/bookmark"),
            Touches::Namespace,
            get(durable_objects::bookmark),
        )
        .route(
            &v4("/accounts/{account_id}/workers/durable_objects/namespaces/{namespace}/objects/{object}/restore"),
            Touches::Namespace,
            post(durable_objects::restore),
        )
        .route(&v4("/accounts/{account_id}/workers/scripts"), Touches::Anywhere, get(workers::list_scripts))
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}"),
            Touches::Anywhere,
            get(workers::get_script).put(workers::put_script).delete(workers::delete_script),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/settings"),
            Touches::Anywhere,
            get(workers::settings).patch(workers::patch_script_settings),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/script-settings"),
            Touches::Anywhere,
            get(workers::settings).patch(workers::patch_script_settings),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/subdomain"),
            Touches::Anywhere,
            get(workers::get_subdomain).post(workers::set_subdomain),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/schedules"),
            Touches::Anywhere,
            axum::routing::put(workers::put_schedules).get(workers::get_schedules),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/schedules/trigger"),
            Touches::Anywhere,
            axum::routing::post(workers::trigger_schedule),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/deployments"),
            Touches::Anywhere,
            get(workers::list_deployments).post(workers::create_deployment),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/versions"),
            Touches::Anywhere,
            get(workers::list_versions).post(workers::upload_version),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/versions/{version}"),
            Touches::Anywhere,
            get(workers::get_version),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/secrets"),
            Touches::Anywhere,
            get(workers::list_secrets).put(workers::put_secret),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/secrets/{secret}"),
            Touches::Anywhere,
            axum::routing::delete(workers::delete_secret),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/references"),
            Touches::Anywhere,
            get(workers::references),
        )
        .route(&v4("/accounts/{account_id}/workers/scripts/{name}/logs"), Touches::Anywhere, get(workers::logs))
        .route(
            &v4("/accounts/{account_id}/workers/services/{name}"),
            Touches::Anywhere,
            get(workers::service).delete(workers::delete_script),
        )
        .route(&v4("/accounts/{account_id}/workers/subdomain"), Touches::Anywhere, get(workers::account_subdomain))
        .route(
            &v4("/accounts/{account_id}/workers/tails/by-consumer/{name}"),
            Touches::Anywhere,
            get(workers::tails_by_consumer),
        )
        .route(
            &v4("/accounts/{account_id}/storage/kv/namespaces"),
            Touches::Anywhere,
            get(kv::list_namespaces).post(kv::create_namespace),
        )
        .route(
            &v4("/accounts/{account_id}/storage/kv/namespaces/{namespace}"),
            Touches::KvNamespace,
            get(kv::namespace).put(kv::rename_namespace).delete(kv::delete_namespace),
        )
        .route(
            &v4("/accounts/{account_id}/storage/kv/namespaces/{namespace}/keys"),
            Touches::KvNamespace,
            get(kv::list_keys),
        )
        .route(
            &v4("/accounts/{account_id}/storage/kv/namespaces/{namespace}/values/{*key}"),
            Touches::KvNamespace,
            // A value's limit is KV's (25 MiB), checked as it streams.
            get(kv::get_value)
                .put(kv::put_value)
                .delete(kv::delete_value)
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route(
            &v4("/accounts/{account_id}/storage/kv/namespaces/{namespace}/metadata/{*key}"),
            Touches::KvNamespace,
            get(kv::get_metadata),
        )
        .route(
            &v4("/accounts/{account_id}/storage/kv/namespaces/{namespace}/bulk"),
            Touches::KvNamespace,
            axum::routing::put(kv::bulk_put).delete(kv::bulk_delete),
        )
        .route(
            &v4("/accounts/{account_id}/storage/kv/namespaces/{namespace}/bulk/delete"),
            Touches::KvNamespace,
            post(kv::bulk_delete),
        )
        .route(
            &v4("/accounts/{account_id}/storage/kv/namespaces/{namespace}/bulk/get"),
            Touches::KvNamespace,
            post(kv::bulk_get),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/tails"),
            Touches::Anywhere,
            get(workers::list_tails).post(workers::create_tail),
        )
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/assets-upload-session"),
            Touches::Anywhere,
            post(workers::assets_upload_session),
        )
        .route(&v4("/accounts/{account_id}/workers/assets/upload"), Touches::Anywhere, post(workers::assets_upload))
        .route(
            &v4("/accounts/{account_id}/workers/scripts/{name}/tails/{tail}"),
            Touches::Anywhere,
            axum::routing::delete(workers::delete_tail),
        )
        .route(&v4("/accounts/{account_id}/queues"), Touches::Anywhere, get(queues::list).post(queues::create))
        .route(
            &v4("/accounts/{account_id}/queues/{queue}"),
            Touches::Queue,
            get(queues::details).patch(queues::update).put(queues::update).delete(queues::delete),
        )
        .route(&v4("/accounts/{account_id}/queues/{queue}/purge"), Touches::Queue, post(queues::purge))
        .route(
            &v4("/accounts/{account_id}/queues/{queue}/consumers"),
            Touches::Queue,
            get(queues::list_consumers).post(queues::add_consumer),
        )
        .route(
            &v4("/accounts/{account_id}/queues/{queue}/consumers/{consumer}"),
            Touches::Queue,
            axum::routing::put(queues::replace_consumer).delete(queues::delete_consumer),
        )
        .route(
            &v4("/accounts/{account_id}/queues/{queue}/messages"),
            Touches::Queue,
            get(queues::peek).post(queues::send),
        )
        .route(&v4("/accounts/{account_id}/queues/{queue}/messages/batch"), Touches::Queue, post(queues::send_batch))
        .route(&v4("/accounts/{account_id}/queues/{queue}/messages/pull"), Touches::Queue, post(queues::pull))
        .route(&v4("/accounts/{account_id}/queues/{queue}/messages/ack"), Touches::Queue, post(queues::ack))
        .route(&v4("/graphql"), Touches::Anywhere, post(graphql::query))
        .with_router(|router| {
            router
                .route(V4, axum::routing::any(no_route))
                .route(&v4("/"), axum::routing::any(no_route))
                .route(&v4("/{*rest}"), axum::routing::any(no_route))
                .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        })
}
