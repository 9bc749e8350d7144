//! # plugin-api: everything a history plugin author needs
//!
//! A history plugin is a `cdylib` that takes a conversation history and returns a new one.
//! The host loads it at run time and runs it in a chain (see the workspace's
//! `ARCHITECTURE.md`). Writing one takes one crate, a dependency on this crate, one trait
//! and one macro call:
//!
//! ```toml
//! # Cargo.toml
//! [package]
//! name = "history_plugin_keep_last"   # the library file: libhistory_plugin_keep_last.so
//! [lib]
//! crate-type = ["cdylib", "rlib"]
//! [dependencies]
//! plugin-api = { path = "../../plugin-api" }
//! ```
//!
//! ```
//! use plugin_api::{ConfigError, ConfigTable, Context, HistoryPlugin, LoadContext, Message, Output, RArc};
//!
//! /// Keeps the newest `keep` messages.
//! pub struct KeepLast {
//!     keep: usize,
//! }
//!
//! impl HistoryPlugin for KeepLast {
//!     const NAME: &'static str = "keep_last";
//!     const VERSION: &'static str = env!("CARGO_PKG_VERSION");
//!     const SUMMARY: &'static str = "keeps the newest `keep` messages";
//!     const CONFIG_KEYS: &'static [(&'static str, &'static str)] = &[("keep", "messages kept (default 10)")];
//!
//!     fn new(load: &LoadContext) -> Result<Self, ConfigError> {
//!         let mut config = ConfigTable::parse(&load.config_json)?;
//!         let keep = config.positive("keep")?.unwrap_or(10) as usize;
//!         config.finish()?; // refuses unknown keys, naming them
//!         Ok(KeepLast { keep })
//!     }
//!
//!     fn process(&self, history: &[RArc<Message>], ctx: &Context) -> Result<Output, String> {
//!         ctx.log.debug("keep_last ran");
//!         let start = history.len().saturating_sub(self.keep);
//!         // Cloning an RArc shares the message: nothing is copied.
//!         Ok(Output::new(history[start..].iter().cloned(), Vec::new()))
//!     }
//! }
//!
//! plugin_api::export_plugin!(KeepLast);
//! ```
//!
//! (That plugin is for illustration: it can cut a tool call from its result, which the
//! host's output check refuses. Real trimming keeps whole [`structure::units`].)
//!
//! ## Rules (SPEC §3.3)
//!
//! - Never mutate the input; return a new history. Pass a message through by cloning its
//!   `RArc`; change one by cloning the [`Message`], editing the copy and wrapping it in a
//!   new `RArc`. The copy keeps the original's identity, which is how the host tells a
//!   changed message from an invented one. A new tool result is made with
//!   [`Message::placeholder_result`].
//! - Read each message's [`Message::turn`]: the host derived it once before the chain.
//! - Report what you did as [`Event`]s; log through [`Context::log`] (your plugin has its
//!   own copy of `std` and `tracing`, so only this callback reaches the host's log).
//! - Count tokens with [`Context::tokens`]: the host's real tokenizers, cached per message.
//! - A panic is caught at the boundary and becomes an error; build with
//!   `panic = "unwind"` (the default; `abort` is a compile error in [`export_plugin!`]).
//!
//! ## ABI stability
//!
//! Every type that crosses the boundary is `#[repr(C)]` and derives `StableAbi`; the host
//! checks a plugin's layout at load and refuses a mismatch in one line before any plugin
//! code runs. The rules for changing this crate:
//!
//! - The root module ([`PluginMod`]) is frozen: never add a field to it (a host whose root
//!   module grew refuses every plugin built before).
//! - Any change to a type that crosses the boundary is an ABI change: bump the minor
//!   version (0.**y**.z). abi_stable then refuses plugins built against another 0.y, and
//!   within one 0.y it requires the plugin's patch version to be at least the host's.
//! - Changes that cross nothing (helpers, [`wire`], [`structure`], [`naming`], [`echo`],
//!   docs) are patch releases.

pub mod config;
pub mod context;
pub mod echo;
pub mod event;
pub mod message;
pub mod naming;
pub mod plugin;
pub mod structure;
pub mod testing;
pub mod wire;

pub use abi_stable::std_types::{RArc, ROption, RResult, RSlice, RStr, RString, RVec};

pub use config::{ConfigError, ConfigTable};
pub use context::{
    Context, ExpirationOverride, LoadContext, LogLevel, Logger, ModelInfo, TokenCounter, Tokenizer,
};
pub use event::{Event, EventKind, Output};
pub use message::{
    CompactMode, Content, Expiration, ExpirationMode, Member, Message, Metadata, Part, Role, ToolCall,
};
pub use plugin::{
    ConfigKey, Description, HistoryPlugin, PluginBox, PluginInstance_TO, PluginMod, PluginModRef,
};

/// The per-message overhead of the token formula (`per_message_tokens + Σ tokens(item)`)
/// when nothing else is configured: what the host counts histories with, and every
/// plugin's default.
pub const DEFAULT_PER_MESSAGE_TOKENS: u64 = 3;

/// The default content of a placeholder: an omitted tool result, an emptied message, a
/// result added for a call that had none. Byte-stable, so the sent prefix stays cacheable.
pub const DEFAULT_PLACEHOLDER: &str = "[Omitted]";

/// The `abi_stable` this crate was built with, for the host's loader.
pub use abi_stable;

/// What [`export_plugin!`] expands to; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::plugin::root_module;
    pub use abi_stable::library::{__call_root_module_loader, CheckTypeLayout, LibHeader, RootModuleResult};
}
