//! kura's SDK: the Durable Object runtime, for object classes written in Rust and served by
//! kura's embedded engine — in-process for tests, or inside a server of your own.
//!
//! A class implements [`DurableObject`]; a [`Runtime`] registers it under a namespace; the
//! namespace hands out [`Stub`]s (`get_by_name("room:red")` always reaches the same object,
//! with the same private storage). Each call on a stub is one request to its object: requests
//! to one object run one at a time, in arrival order, and everything one request writes
//! commits together when it returns `Ok` (and nothing of it when it returns an error).
//!
//! ```no_run
//! use kura::{BoxFuture, DurableObject, Result, Runtime, State};
//!
//! struct Counter { state: State }
//!
//! impl DurableObject for Counter {
//!     type Env = ();
//!     async fn new(state: State, _env: ()) -> Result<Self> { Ok(Counter { state }) }
//! }
//!
//! impl Counter {
//!     async fn increment(&mut self) -> Result<u64> {
//!         let n: u64 = self.state.storage().get("n").await?.unwrap_or(0) + 1;
//!         self.state.storage().put("n", &n).await?;
//!         Ok(n)
//!     }
//! }
//!
//! # async fn demo() -> Result<()> {
//! let runtime = Runtime::open(".kura-sdk")?;
//! let counters = runtime.namespace::<Counter>("COUNTERS", "my-worker-Counter", ())?;
//! let n = counters.get_by_name("hits").call(|c: &mut Counter| -> BoxFuture<'_, Result<u64>> { Box::pin(c.increment()) }).await?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod durable_object;

pub use durable_object::{
    AlarmInfo, DurableObject, Error, Namespace, Request, Response, Result, Runtime, RuntimeSettings, State, Storage,
    Stub,
};
pub use kura_do::{Bookmark, Cursor, ListOptions, ObjectId, Value};

/// A boxed future, as stub calls take.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;
