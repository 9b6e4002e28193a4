//! A server binary of one's own built on kura (`examples/room_server.rs`): HTTP requests reach
//! each room's object through `fetch`, and `/rooms` fans out over all of them.

#[path = "../examples/room_server.rs"]
mod room_server;

use kura::Runtime;
use room_server::{Room, router};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rooms_are_served_over_http_by_their_objects() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::open(dir.path()).unwrap();
    let rooms = runtime.namespace::<Room>("ROOMS", "chat-Room", ()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, router(runtime.clone(), rooms)).into_future());
    let http = reqwest::Client::new();
    let post = |room: &str, name: &str| http.post(format!("{base}/rooms/{room}")).body(name.to_owned()).send();
    assert_eq!(post("red", "alice").await.unwrap().text().await.unwrap(), r#"["alice"]"#);
    assert_eq!(post("blue", "bob").await.unwrap().text().await.unwrap(), r#"["bob"]"#);
    assert_eq!(post("red", "carol").await.unwrap().text().await.unwrap(), r#"["alice","carol"]"#);
    let empty = post("red", " ").await.unwrap();
    assert_eq!(empty.status(), 400, "a member needs a name, and nothing is added");
    let red = http.get(format!("{base}/rooms/red")).send().await.unwrap().text().await.unwrap();
    assert_eq!(red, r#"["alice","carol"]"#);
    let all: serde_json::Value = http.get(format!("{base}/rooms")).send().await.unwrap().json().await.unwrap();
    assert_eq!(all, serde_json::json!({ "room:red": ["alice", "carol"], "room:blue": ["bob"] }));
}
