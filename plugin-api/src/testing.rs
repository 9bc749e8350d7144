//! Helpers for a plugin's own unit tests, without a host: a [`Context`] and a
//! [`LoadContext`] with sensible values. Their services count every tokenizer as `chars4`
//! (the real encodings live in the host), drop log lines and have no summarizer (so
//! `summarize` answers `Err`, as in a host without one); end-to-end tests through the host
//! use the real ones.

use abi_stable::{
    prefix_type::WithMetadata,
    staticref,
    std_types::{RErr, ROption, RResult, RStr, RString, RVec},
};

use crate::context::{Context, HostServices, HostServicesRef, LoadContext, LogLevel, ModelInfo, Tokenizer};
use crate::message::Message;

extern "C" fn chars4_text(_: Tokenizer, text: RStr<'_>) -> u64 {
    (text.as_str().chars().count() as u64).div_ceil(4)
}

extern "C" fn chars4_content(_: Tokenizer, message: &Message) -> u64 {
    message
        .token_items()
        .map(|item| (item.chars().count() as u64).div_ceil(4))
        .sum()
}

extern "C" fn discard(_: LogLevel, _: RStr<'_>) {}

extern "C" fn no_summarizer(_: RStr<'_>, _: u64, _: RStr<'_>) -> RResult<RString, RString> {
    RErr("no summarizer in plugin_api::testing".into())
}

/// Holds the test services' static instance.
struct TestServices;

impl TestServices {
    staticref!(const INSTANCE: WithMetadata<HostServices> = WithMetadata::new(HostServices {
        count_text: chars4_text,
        count_content: chars4_content,
        log: discard,
        summarize: no_summarizer,
    }));
}

/// Host services for unit tests: `chars4` counting for every tokenizer, log lines dropped,
/// no summarizer.
pub const SERVICES: HostServicesRef = HostServicesRef(TestServices::INSTANCE.as_prefix());

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
        services: SERVICES,
    }
}

/// What `new` gets for the config table `config_json`, with one test model.
pub fn load_context(config_json: &str) -> LoadContext {
    LoadContext {
        config_json: config_json.into(),
        agent_max_ctx: 200,
        models: RVec::from(vec![model(200)]),
        services: SERVICES,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_test_context_counts_chars4_and_has_no_summarizer() {
        let ctx = super::context(10, 1);
        assert_eq!(ctx.tokens().text(super::Tokenizer::O200kBase, "héllo"), 2);
        ctx.log().info("dropped");
        assert_eq!(
            ctx.summarize("text", 2, "test"),
            Err("no summarizer in plugin_api::testing".to_string())
        );
    }
}
