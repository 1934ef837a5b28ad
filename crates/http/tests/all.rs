//! Integration tests of `ailab-sandbox-http`, built as one test binary: the router driven
//! in-process with `tower::ServiceExt::oneshot`, and the real server over TCP.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_methods,
    clippy::disallowed_types
)]

mod suite;
mod support;
