//! The SQLite core against real files: splitting, meta counters, limits, the authorizer,
//! atomicity, group commit, the registry's lifecycle, Time Travel, and read replicas.

mod atomicity;
mod authorizer;
mod common;
mod follow;
mod fuzz;
mod limits;
mod meta;
mod registry;
mod replica;
mod splitting;
mod time_travel;
