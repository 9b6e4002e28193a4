//! The server over real HTTP: a real kura server on a free loopback port, spoken to with an
//! HTTP client, one module per topic.

mod auth;
mod binding;
mod common;
mod databases;
mod durable_objects;
mod limits;
mod patterns;
mod query;
mod time_travel;
mod transfers;
