//! The seed's rooms as a server binary of your own, built on kura: each request to
//! `/rooms/{name}` goes to that room's Durable Object (`fetch`), wherever it is; `/rooms` asks
//! every room at once (a fan-out, not one snapshot).
//!
//! ```text
//! cargo run -p kura --example room_server -- 127.0.0.1:8790 ./rooms-data
//! curl -X POST 127.0.0.1:8790/rooms/red -d alice      # add a member
//! curl 127.0.0.1:8790/rooms/red                       # ["alice"]
//! curl 127.0.0.1:8790/rooms                           # {"room:red":["alice"]}
//! ```

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State as AxumState};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response as AxumResponse};
use axum::routing::get;
use kura::{Namespace, Runtime, Value};

/// The seed's `Room`, whose `fetch` serves its members.
#[allow(dead_code)]
#[path = "room.rs"]
pub mod room;
pub use room::Room;

#[derive(Clone)]
pub struct App {
    runtime: Runtime,
    rooms: Namespace<Room>,
}

/// Hands the request to the room's object.
async fn room(AxumState(app): AxumState<App>, Path(name): Path<String>, method: Method, body: Bytes) -> AxumResponse {
    let request = http::Request::builder().method(method).uri(format!("/rooms/{name}")).body(body);
    let Ok(request) = request else { return StatusCode::BAD_REQUEST.into_response() };
    match app.rooms.get_by_name(&format!("room:{name}")).fetch(request).await {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            (parts.status, [("content-type", "application/json")], body).into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Every room's members: one read-only query per object, each at its own moment.
async fn all_rooms(AxumState(app): AxumState<App>) -> AxumResponse {
    let rows = app
        .runtime
        .engine()
        .fan_out(app.rooms.engine_namespace(), None, "SELECT name FROM members ORDER BY name", vec![])
        .await;
    let Ok(rows) = rows else { return StatusCode::INTERNAL_SERVER_ERROR.into_response() };
    let mut rooms = serde_json::Map::new();
    for row in rows {
        let names: Vec<String> = match row.outcome {
            Ok(cursor) => cursor
                .rows
                .into_iter()
                .filter_map(|r| match r.into_iter().next() {
                    Some(Value::Text(name)) => Some(name),
                    _ => None,
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        rooms.insert(row.object.name.unwrap_or(row.object.id), names.into());
    }
    axum::Json(rooms).into_response()
}

/// The server's routes over a runtime and its rooms.
pub fn router(runtime: Runtime, rooms: Namespace<Room>) -> Router {
    Router::new()
        .route("/rooms", get(all_rooms))
        .route("/rooms/{name}", get(room).post(room))
        .with_state(App { runtime, rooms })
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:8790".into());
    let dir = args.next().unwrap_or_else(|| "rooms-data".into());
    let runtime = Runtime::open(&dir).map_err(std::io::Error::other)?;
    let rooms = runtime.namespace::<Room>("ROOMS", "chat-Room", ()).map_err(std::io::Error::other)?;
    let router = router(runtime.clone(), rooms);
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("rooms on http://{}", listener.local_addr()?);
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    runtime.shutdown().await;
    Ok(())
}
