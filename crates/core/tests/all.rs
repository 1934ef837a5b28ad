//! Integration tests of `ailab-sandbox-core`, built as one test binary.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_methods,
    clippy::disallowed_types
)]

mod suite;
mod support;
