//! Helpers for a plugin's own unit tests, without a host: a [`Context`] and a
//! [`LoadContext`] with sensible values. The token counter here counts every tokenizer
//! as `chars4` (the real encodings live in the host); end-to-end tests through the host
//! use the real ones.

use std::ffi::c_void;

use abi_stable::std_types::{ROption, RStr, RVec};

use crate::context::{Context, LoadContext, Logger, ModelInfo, TokenCounter, Tokenizer};
use crate::message::Message;

unsafe extern "C" fn chars4_text(_: *const c_void, _: Tokenizer, text: RStr<'_>) -> u64 {
    (text.as_str().chars().count() as u64).div_ceil(4)
}

unsafe extern "C" fn chars4_content(_: *const c_void, _: Tokenizer, message: &Message) -> u64 {
    message
        .token_items()
        .map(|item| (item.chars().count() as u64).div_ceil(4))
        .sum()
}

/// A test model with the given window in messages.
pub fn model(effective_ctx: u64) -> ModelInfo {
    ModelInfo {
        name: "test".into(),
        max_context: effective_ctx,
        context_tokens: 128_000,
        tokenizer: Tokenizer::Chars4,
        effective_ctx,
    }
}

/// A stateless call's context at `turn` with a window of `effective_ctx` messages.
pub fn context(effective_ctx: u64, turn: u64) -> Context {
    Context {
        session_id: ROption::RNone,
        model: model(effective_ctx),
        agent_max_ctx: effective_ctx,
        effective_ctx,
        turn,
        last_active: ROption::RNone,
        expiration_override: ROption::RNone,
        // SAFETY: the state pointer is never dereferenced.
        tokens: unsafe { TokenCounter::new(std::ptr::null(), chars4_text, chars4_content) },
        log: Logger::discard(),
    }
}

/// What `new` gets for the config table `config_json`, with one test model.
pub fn load_context(config_json: &str) -> LoadContext {
    LoadContext {
        config_json: config_json.into(),
        agent_max_ctx: 200,
        models: RVec::from(vec![model(200)]),
        log: Logger::discard(),
    }
}
