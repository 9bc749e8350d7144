//! Conversations in providers' formats (docs/wire-format.md): one module per wire, each
//! reading a provider's request history into the host's messages ([`plugin_api::Message`])
//! and writing the chain's output back in the same shape, a message the chain did not
//! change byte for byte as it came.
//!
//! No I/O: the server reads bodies and talks to upstreams; this crate only converts.
//! The OpenAI chat format still lives in `plugin_api::wire` while it moves here
//! (issue #25 item 2).

pub mod anthropic;
