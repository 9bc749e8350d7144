//! The services the host offers plugins through their contexts (token counting, logging,
//! summarizing, recalling from a session's transcript in [`crate::recall`]):
//! one process-wide [`plugin_api::HostServices`] instance, built at compile time. What
//! varies per call lives elsewhere: the plugin that is running (for its log lines) in
//! [`logging`], the counts on the messages themselves, the configured summarizer in
//! [`summarizer`].

use abi_stable::{
    prefix_type::WithMetadata,
    staticref,
    std_types::{RErr, ROk, RResult, RStr, RString},
};
use plugin_api::{HostServices, HostServicesRef, Message, Tokenizer};

use crate::{logging, summarizer, tokens};

pub(crate) extern "C" fn count_text(tokenizer: Tokenizer, text: RStr<'_>) -> u64 {
    tokens::count_item(tokenizer, text.as_str())
}

pub(crate) extern "C" fn count_content(tokenizer: Tokenizer, message: &Message) -> u64 {
    tokens::content_tokens(tokenizer, message)
}

pub use summarizer::NO_SUMMARIZER;

pub(crate) extern "C" fn summarize(
    text: RStr<'_>,
    target_chars: u64,
    purpose: RStr<'_>,
) -> RResult<RString, RString> {
    match summarize_text(text.as_str(), target_chars, purpose.as_str()) {
        Ok(summary) => ROk(summary.into()),
        Err(reason) => RErr(reason.into()),
    }
}

/// The host's answer to a plugin's `summarize`, in-process or sent by an isolated
/// plugin's worker (docs/chain.md#isolation): the configured summarizer and its cache.
pub(crate) fn summarize_text(text: &str, target_chars: u64, purpose: &str) -> Result<String, String> {
    let target_chars = usize::try_from(target_chars).unwrap_or(usize::MAX);
    // No panic crosses back into the plugin: a bug here is one more error it falls back from.
    std::panic::catch_unwind(|| summarizer::summarize(text, target_chars, purpose))
        .unwrap_or_else(|_| Err("the host's summarizer failed (a bug: see the log)".to_string()))
}

/// Holds the static instance.
struct Instance;

impl Instance {
    staticref!(const SERVICES: WithMetadata<HostServices> = WithMetadata::new(HostServices {
        count_text,
        count_content,
        log: logging::plugin_log,
        summarize,
        recall: crate::recall::recall_service,
    }));
}

/// The host's services, handed to every plugin in its [`plugin_api::Context`] and
/// [`plugin_api::LoadContext`].
pub const SERVICES: HostServicesRef = HostServicesRef(Instance::SERVICES.as_prefix());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summarize_answers_that_no_summarizer_is_configured() {
        let summarize = SERVICES.summarize().expect("this host has the summarize service");
        let answer = summarize("some text".into(), 10, "test".into()).into_result();
        assert_eq!(answer.unwrap_err().as_str(), NO_SUMMARIZER);
    }

    #[test]
    fn the_services_count_and_log_through_the_host() {
        assert_eq!(
            (SERVICES.count_text())(Tokenizer::O200kBase, "hello world".into()),
            2
        );
        (SERVICES.log())(plugin_api::LogLevel::Debug, "a line from no plugin".into());
    }
}
