//! HTTP face (in progress).
