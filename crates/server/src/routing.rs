//! The API listener's route table, written once: each route is registered with the handler
//! axum runs and with what it touches (one database, bucket or namespace, or nothing in
//! particular), and the cluster's placement reads the second half. So a route added to the
//! router is placed by the same line that adds it.

use axum::Router;
use axum::routing::MethodRouter;

use crate::error::Wire;
use crate::state::AppState;

/// What a route touches, as far as the cluster's placement goes. The path parameters named
/// here are the ones the route's pattern must use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touches {
    /// The catalog, or nothing node-specific: any node serves it.
    Anywhere,
    /// One D1 database: `{database}` (an id, or a name within `{account_id}` or the token's
    /// account), answered in the protocol `Wire` speaks.
    Database(Wire),
    /// One D1 database named by the binding's database header (workerd's `/query`).
    DatabaseByHeader,
    /// One R2 bucket of `{account_id}`, by the name `{bucket}`.
    Bucket,
    /// One R2 bucket of the token's account, by the name `{bucket}` (the R2 binding).
    BindingBucket,
    /// One Durable Object namespace of `{account_id}`, by the id or name `{namespace}`.
    Namespace,
    /// One Workers KV namespace of `{account_id}`, by the id `{namespace}`.
    KvNamespace,
    /// One queue of `{account_id}`, by the id `{queue}`.
    Queue,
    /// A D1 export's download or import's upload: the node its `{token}` names holds it.
    Transfer,
    /// A surface a cluster does not serve yet, by its name.
    NotClustered(&'static str),
}

/// Routes with what each touches; [`Routes::split`] gives axum's router and the table.
pub struct Routes {
    router: Router<AppState>,
    touches: Vec<(String, Touches)>,
}

impl Default for Routes {
    fn default() -> Self {
        Routes { router: Router::new(), touches: Vec::new() }
    }
}

impl Touches {
    /// The path parameters the placement reads for this kind of route.
    fn parameters(self) -> &'static [&'static str] {
        match self {
            Touches::Database(Wire::D1Binding) => &["database"],
            Touches::Database(_) => &["account_id", "database"],
            Touches::Bucket => &["account_id", "bucket"],
            Touches::BindingBucket => &["bucket"],
            Touches::Namespace | Touches::KvNamespace => &["account_id", "namespace"],
            Touches::Queue => &["account_id", "queue"],
            Touches::Transfer => &["token"],
            Touches::Anywhere | Touches::DatabaseByHeader | Touches::NotClustered(_) => &[],
        }
    }
}

impl Routes {
    /// Adds `path`, served by `handler`, touching `touches`. A route whose pattern lacks a
    /// parameter its placement reads is a programming error, refused when the routes are built.
    pub fn route(mut self, path: &str, touches: Touches, handler: MethodRouter<AppState>) -> Self {
        for parameter in touches.parameters() {
            assert!(
                path.contains(&format!("{{{parameter}}}")),
                "{path} is placed as {touches:?} but has no {{{parameter}}}"
            );
        }
        self.router = self.router.route(path, handler);
        self.touches.push((path.to_owned(), touches));
        self
    }

    /// Adds every route of `other`.
    pub fn merge(mut self, other: Routes) -> Self {
        self.router = self.router.merge(other.router);
        self.touches.extend(other.touches);
        self
    }

    /// Changes the router itself, for what the placement never needs to see: fallbacks, the
    /// catch-all "no route" answers, routers merged whole (the console). It touches nothing.
    pub fn with_router(mut self, change: impl FnOnce(Router<AppState>) -> Router<AppState>) -> Self {
        self.router = change(self.router);
        self
    }

    /// The router, and the table the placement reads.
    pub fn split(self) -> (Router<AppState>, RouteTable) {
        let mut table = matchit::Router::new();
        for (path, touches) in self.touches {
            if touches != Touches::Anywhere {
                // The router above has accepted the same pattern, so the table does too.
                table.insert(path, touches).expect("every route's pattern is one axum accepted");
            }
        }
        (self.router, RouteTable(table))
    }
}

/// What each route touches, looked up by a request's path.
pub struct RouteTable(matchit::Router<Touches>);

/// A path's route: what it touches, and its parameters.
pub struct Found<'path> {
    /// What the route touches.
    pub touches: Touches,
    params: matchit::Params<'path, 'path>,
}

impl<'path> Found<'path> {
    /// The path parameter `name` (one the route's pattern declares).
    pub fn param(&self, name: &str) -> Option<&'path str> {
        self.params.get(name)
    }
}

impl RouteTable {
    /// What the route serving `path` touches; a path no route serves touches nothing.
    pub fn find<'path>(&'path self, path: &'path str) -> Option<Found<'path>> {
        let matched = self.0.at(path).ok()?;
        Some(Found { touches: *matched.value, params: matched.params })
    }
}
