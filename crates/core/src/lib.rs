//! `ailab-sandbox-core`: a governed filesystem capability runtime.
//!
//! Agents submit a plan of write actions; every action passes governance, budgets and a
//! rate limit, its target is snapshotted (SHA-256) before it is touched, the mutation is
//! plain file I/O through a root directory handle, the result is checksummed, registered
//! as an artifact with lineage and appended to a tamper-evident audit trail. Writing is off
//! and dry-run on until the operator turns both.
//!
//! This crate is synchronous and knows nothing of HTTP, MCP or the command line.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod catalog;
pub mod config;
pub mod confine;
pub mod context;
pub mod hash;
pub mod policy;
pub mod reason;
pub mod workflow;

pub use reason::{ReasonCode, Refusal, Verdict};
