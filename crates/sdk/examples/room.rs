//! The seed's experiment as a Rust program: per-room state moves out of one D1 database into
//! one Durable Object per room. Run with `cargo run -p kura --example room`.

use kura::{BoxFuture, DurableObject, Request, Response, Result, Runtime, State, Value};

/// One chat room: its members, in the room's own private SQLite.
pub struct Room {
    state: State,
}

impl DurableObject for Room {
    type Env = ();

    async fn new(state: State, _env: ()) -> Result<Self> {
        state.storage().exec("CREATE TABLE IF NOT EXISTS members (name TEXT PRIMARY KEY)", vec![]).await?;
        Ok(Room { state })
    }

    /// Over HTTP: `POST` with a name in the body adds that member; `GET` and `POST` answer the
    /// members, as JSON.
    async fn fetch(&mut self, request: Request) -> Result<Response> {
        let reply = |status: u16, body: String| {
            http::Response::builder().status(status).body(body.into()).map_err(kura::Error::msg)
        };
        if request.method() == http::Method::POST {
            let name = String::from_utf8_lossy(request.body()).trim().to_owned();
            if name.is_empty() {
                return reply(400, "a member needs a name".into());
            }
            self.add(&name).await?;
        }
        reply(200, serde_json::to_string(&self.members().await?).map_err(kura::Error::msg)?)
    }
}

impl Room {
    /// Adds a member (idempotent).
    pub async fn add(&mut self, name: &str) -> Result<()> {
        let name = Value::Text(name.to_owned());
        self.state.storage().exec("INSERT OR IGNORE INTO members VALUES (?)", vec![name]).await?;
        Ok(())
    }

    /// The members, in name order.
    pub async fn members(&mut self) -> Result<Vec<String>> {
        let cursor = self.state.storage().exec("SELECT name FROM members ORDER BY name", vec![]).await?;
        Ok(cursor
            .rows
            .into_iter()
            .filter_map(|row| match row.into_iter().next() {
                Some(Value::Text(name)) => Some(name),
                _ => None,
            })
            .collect())
    }
}

/// `room.add(name)` through a stub.
pub fn add(name: &str) -> impl for<'a> FnOnce(&'a mut Room) -> BoxFuture<'a, Result<()>> + Send + 'static {
    let name = name.to_owned();
    move |room: &mut Room| -> BoxFuture<'_, Result<()>> { Box::pin(async move { room.add(&name).await }) }
}

/// `room.members()` through a stub.
pub fn members() -> impl for<'a> FnOnce(&'a mut Room) -> BoxFuture<'a, Result<Vec<String>>> + Send + 'static {
    |room: &mut Room| -> BoxFuture<'_, Result<Vec<String>>> { Box::pin(room.members()) }
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> Result<()> {
    let dir = std::env::temp_dir().join("kura-room-example");
    let runtime = Runtime::open(&dir)?;
    let rooms = runtime.namespace::<Room>("ROOMS", "chat-Room", ())?;
    rooms.get_by_name("room:red").call(add("alice")).await?;
    rooms.get_by_name("room:blue").call(add("bob")).await?;
    println!("room:red  → {:?}", rooms.get_by_name("room:red").call(members()).await?);
    println!("room:blue → {:?}", rooms.get_by_name("room:blue").call(members()).await?);
    let fresh = rooms.get(rooms.new_unique_id());
    println!("a new unique room ({}) → {:?}", fresh.id(), fresh.call(members()).await?);
    let everyone = runtime.engine().fan_out(rooms.engine_namespace(), None, "SELECT name FROM members", vec![]).await?;
    for row in everyone {
        println!("fan-out: {} {:?} → {:?}", row.object.id, row.object.name, row.outcome.map(|c| c.rows));
    }
    runtime.shutdown().await;
    Ok(())
}
