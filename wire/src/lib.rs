//! Conversations in providers' formats (docs/wire-format.md): one module per wire, each
//! reading a provider's request history into the host's messages ([`plugin_api::Message`])
//! and writing the chain's output back in the same shape, a message the chain did not
//! change byte for byte as it came.
//!
//! No I/O: the server reads bodies and talks to upstreams; this crate only converts.
//!
//! - [`chat`]: the OpenAI chat format, which is also the host's own format (documents,
//!   the session API, the transcript);
//! - [`anthropic`]: Anthropic's Messages API request (`system`, `messages` of blocks);
//! - [`responses`]: OpenAI's Responses API request (`instructions`, `input` items).

pub mod anthropic;
pub mod chat;
pub mod responses;
