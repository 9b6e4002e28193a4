//! What every handler shares: the engines of one data directory, the cluster's forwarding,
//! and the figures, behind one reference count.

use std::sync::Arc;

use kura_catalog::Catalog;
use kura_d1::D1;

use crate::{forward, observe, transfer};

/// Largest request body accepted, in bytes: room for a batch of statements with 2 MB values.
pub const MAX_BODY_BYTES: usize = 100 * 1024 * 1024;

/// What every handler shares. One allocation behind one reference count: axum clones the state
/// for every extractor and layer of every request, and cloning each engine's handle instead
/// cost about 2% of a point SELECT's CPU time (measured with perf).
#[derive(Clone)]
pub struct AppState(pub(crate) Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The engines and settings behind [`AppState`].
pub struct Shared {
    /// Accounts and tokens.
    pub catalog: Arc<Catalog>,
    /// The D1 engine.
    pub d1: Arc<D1>,
    /// Export downloads and import uploads.
    pub transfers: Arc<transfer::Transfers>,
    /// The R2 engine.
    pub r2: Arc<kura_r2::R2>,
    /// The KV engine.
    pub kv: kura_kv::Kv,
    /// The Queues engine.
    pub queues: kura_queues::Queues,
    /// The Durable Objects engine.
    pub durable_objects: kura_do::DurableObjects,
    /// The Workers layer, when this server runs Workers.
    pub workers: Option<kura_workers::Workers>,
    /// In a cluster, how requests reach the node that owns what they touch.
    pub forwarding: Option<forward::Forwarding>,
    /// Requests answered, for `/metrics`.
    pub http: Arc<observe::HttpFigures>,
    /// Where this server's S3 listener is, for the console's presigned URLs.
    pub s3_address: Option<std::net::SocketAddr>,
}

impl axum::extract::FromRef<AppState> for Arc<transfer::Transfers> {
    fn from_ref(app: &AppState) -> Self {
        Arc::clone(&app.transfers)
    }
}
