//! kura's client side, with no server or engine inside: [`v4`] is the API's envelope (which the
//! server writes with these same types), [`ApiClient`] speaks Cloudflare's v4 API (to kura or to
//! Cloudflare), and [`sigv4`] signs and presigns S3 requests as R2 checks them.
//! The `kura` CLI's remote commands, the server (reading a copy's source from another node),
//! the benchmarks and the tests all use it.

#![deny(missing_docs)]

mod api;
pub mod sigv4;
pub mod v4;

pub use api::{ApiClient, ClientError};
