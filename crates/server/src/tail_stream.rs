//! A live tail's stream (`wrangler tail`'s WebSocket, subprotocol `trace-v1`): one JSON text
//! message per event, pongs to wrangler's pings, and the tail closed when the socket ends.
//! wrangler sends its first frame unmasked, which RFC 6455 forbids a client; it is accepted.

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use kura_workers::Workers;
use kura_workers::tails::TailStream;

use crate::state::AppState;

/// The subprotocol wrangler asks for, and Cloudflare answers with.
const TRACE: &str = "trace-v1";

/// `GET /workers-tails/{id}` (a WebSocket upgrade): the events of the tail `id`. Its id is its
/// only credential, as on Cloudflare: the API call that opened it was authorized.
pub async fn stream(State(app): State<AppState>, UrlPath(id): UrlPath<String>, upgrade: WebSocketUpgrade) -> Response {
    let Some(workers) = app.workers.clone().filter(|w| w.tails().is_open(&id)) else {
        let text = "This tail is unknown or has expired; open another with `wrangler tail`.\n";
        return (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response();
    };
    upgrade.protocols([TRACE]).accept_unmasked_frames(true).on_upgrade(move |socket| async move {
        if let Some(stream) = workers.tails().connect(&id) {
            relay(&workers, stream, socket).await;
        }
    })
}

async fn relay(workers: &Workers, mut stream: TailStream, mut socket: WebSocket) {
    let lasts = stream.expires_at.duration_since(std::time::SystemTime::now()).unwrap_or_default();
    let expiry = tokio::time::sleep(lasts);
    tokio::pin!(expiry);
    loop {
        tokio::select! {
            () = &mut expiry => {
                let close = CloseFrame { code: 1000, reason: "the tail expired".into() };
                let _ = socket.send(Message::Close(Some(close))).await;
                break;
            }
            event = stream.next() => {
                let Some(event) = event else {
                    // Closed through the API, or taken over by a newer connection.
                    let close = CloseFrame { code: 1000, reason: "the tail was closed".into() };
                    let _ = socket.send(Message::Close(Some(close))).await;
                    break;
                };
                if socket.send(Message::Text(event.into())).await.is_err() {
                    break;
                }
            }
            message = socket.recv() => match message {
                // Pings are answered as they are read; the client's own messages (wrangler's
                // `{"debug": false}`) ask for nothing kura does.
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                Some(Ok(_)) => {}
            },
        }
    }
    workers.tails().disconnect(&stream);
}
