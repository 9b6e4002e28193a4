//! kura's Durable Objects engine. So far: object ids ([`id`]), derived exactly as workerd derives
//! them locally, so that ids (and the files of `wrangler dev`'s local state) match Miniflare's
//! byte for byte.

#![deny(missing_docs)]

pub mod id;

pub use id::{IdError, IdFactory, ObjectId};
