//! Helpers for the end-to-end tests (see `tests/*.rs`).
