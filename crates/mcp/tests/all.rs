//! Integration tests of the MCP face: the server driven in-process by rmcp's own client
//! over an in-memory duplex pipe (one test binary; the cases live in `suite/`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_methods,
    clippy::disallowed_types
)]

mod suite;
