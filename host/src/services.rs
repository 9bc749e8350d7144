//! The services the host offers plugins through their contexts (token counting, logging):
//! one process-wide [`plugin_api::HostServices`] instance, built at compile time. What
//! varies per call lives elsewhere: the plugin that is running (for its log lines) in
//! [`logging`], the counts on the messages themselves.

use abi_stable::{prefix_type::WithMetadata, staticref, std_types::RStr};
use plugin_api::{HostServices, HostServicesRef, Message, Tokenizer};

use crate::{logging, tokens};

extern "C" fn count_text(tokenizer: Tokenizer, text: RStr<'_>) -> u64 {
    tokens::count_text(tokenizer, text.as_str())
}

extern "C" fn count_content(tokenizer: Tokenizer, message: &Message) -> u64 {
    tokens::content_tokens(tokenizer, message)
}

/// Holds the static instance.
struct Instance;

impl Instance {
    staticref!(const SERVICES: WithMetadata<HostServices> = WithMetadata::new(HostServices {
        count_text,
        count_content,
        log: logging::plugin_log,
    }));
}

/// The host's services, handed to every plugin in its [`plugin_api::Context`] and
/// [`plugin_api::LoadContext`].
pub const SERVICES: HostServicesRef = HostServicesRef(Instance::SERVICES.as_prefix());
