//! Jetstream v1: the JSON event stream that most atproto consumers read.
//!
//! Why this crate exists: Jetstream's `/subscribe` wire format is a contract thousands of clients
//! depend on (`shared/docs/jetstream-protocol.md`). This crate owns that format; the server, the
//! `riptide jetstream` command and the clients all go through it, so there is one definition.
//!
//! Today it holds the projection of relay frames to v1 events ([`project`]) and to Jetstream v2
//! archive rows ([`rows`]), and the rows a repository lands as over earlier rows
//! ([`replace`]). The server, filters
//! and zstd framing will live beside it.

pub mod project;
pub mod replace;
pub mod rows;

pub use project::{
    write_record_json, DropReason, EventKind, EventRowKind, Projection, Projector, RowError,
    StoredRow,
};
