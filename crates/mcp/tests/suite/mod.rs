//! Test cases, by theme.

mod support;

mod errors;
mod handshake;
mod reads;
mod rollback;
mod writes;
