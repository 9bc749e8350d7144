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
//!         ctx.log().debug("keep_last ran");
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
//! ## Rules (docs/abi.md#rules)
//!
//! - Never mutate the input; return a new history. Pass a message through by cloning its
//!   `RArc`; change one by cloning the [`Message`], editing the copy and wrapping it in a
//!   new `RArc`. The copy keeps the original's identity, which is how the host tells a
//!   changed message from an invented one. A new tool result is made with
//!   [`Message::placeholder_result`].
//! - Read each message's [`Message::turn`]: the host derived it once before the chain.
//! - Report what you did as [`Event`]s (`Event::of(kind, reason)`: the host fills in the
//!   turn); a plugin that rewrites text reports [`EventKind::MessageChanged`]. Log through [`Context::log`] (your plugin has its
//!   own copy of `std` and `tracing`, so only this callback reaches the host's log).
//! - Count tokens with [`Context::tokens`]: the host's real tokenizers, cached per message.
//! - Ask the host for a summary with [`Context::summarize`] (no network or provider SDK in
//!   a plugin); it may answer `Err` (no summarizer configured, a failed call, an older
//!   host), so always have a fallback.
//! - In a session, ask for the exchanges of its whole transcript that match a query with
//!   [`Context::recall`] (plugin-api 0.2.3): what an earlier turn dropped can come back,
//!   whole and under its own identity.
//! - Rewrite text with [`Message::map_text`] (and [`Content::map_text`]): it reaches every
//!   place a message carries text — content, tool-call arguments, the original kept for
//!   expansion, members the types do not model — so a redactor leaks nothing through a
//!   place it forgot (docs/abi.md#where-text-lives lists them).
//! - Test against the host's own output check: [`testing::process`] runs `process` and
//!   then [`check`] (the code the host runs between stages), so an output the host would
//!   refuse fails your `cargo test` with the host's message.
//! - A panic is caught at the boundary and becomes an error; build with
//!   `panic = "unwind"` (the default; `abort` is a compile error in [`export_plugin!`]).
//!
//! ## ABI stability
//!
//! Every type that crosses the boundary is `#[repr(C)]` and derives `StableAbi`; the host
//! checks a plugin's `plugin-api` version and layout at load and refuses a mismatch in one
//! line before any plugin code runs.
//!
//! ### What loads where
//!
//! A plugin library records the `plugin-api` version it was built against. For a plugin
//! built against 0.y.z and a host built against 0.y'.z':
//!
//! - **y ≠ y': refused** ("within 0.y the minor must match"). Each 0.y is its own ABI.
//! - **y = y', z ≤ z': loads.** The plugin sees the host services and the entry points it
//!   was built with; what the host gained since is simply unknown to it.
//! - **y = y', z > z': refused**, in one line naming both versions. abi_stable would
//!   load it safely (see below: what the plugin's newer copy adds is checked at run time),
//!   but such a plugin may rely on what the host lacks: a service of the newer release
//!   would answer "not available in this host", an entry point it implements would never
//!   be called. A clear refusal beats that silent difference: upgrade the host first, or
//!   build the plugin against the host's release (`plugin-api = "=0.y.z'"`).
//!
//! ### How the ABI grows within a 0.y
//!
//! Only behind abi_stable's prefix-type boundary (fields after the one marked
//! `#[sabi(last_prefix_field)]`), each addition a patch release (0.y.**z**):
//!
//! - **A host service**: a field appended to [`HostServices`], with a doc line naming the
//!   release that added it, and a method on [`Context`] (or [`LoadContext`]) that reads it
//!   through its accessor. The accessor returns `None` when the host's instance predates
//!   the field; the method then answers "not available in this host" in the plugin's own
//!   terms (an `Err`, a fallback). Examples: [`Context::summarize`], added in 0.2.1;
//!   [`Context::recall`], added in 0.2.3.
//! - **An optional entry point**: a method appended to [`PluginInstance`](plugin::PluginInstance)
//!   (after `on_model_switch`) **with a default body** — that body is what the host runs
//!   for a plugin whose vtable predates the method —, the same method with a default on
//!   [`HistoryPlugin`], and its forwarding in the export glue (`Guarded`).
//! - **An event kind**: a variant appended at the end of [`EventKind`], with a doc line
//!   naming the release that added it, and its name in [`EventKind::as_str`] and
//!   [`EventKind::ALL`]. Event kinds only flow out of plugins, so a plugin built before
//!   the variant, whose copy of the enum is shorter, can only send kinds the host knows;
//!   the host accepts exactly that difference for the enums it lists as outbound
//!   (`OUTBOUND_ENUMS` in the engine's `compat`: `EventKind` only). `message-changed` and
//!   `message-summarized` were added in 0.2.2, `message-recalled` in 0.2.3.
//! - Nothing else. A field anywhere else, a variant of any other enum (one the host hands
//!   to plugins, like [`Tokenizer`] or [`Role`], would reach a plugin that cannot read
//!   it), a variant inserted, reordered or removed, a changed signature or a moved
//!   `last_prefix_field` changes the layout: that is a new 0.y (bump the minor), which
//!   refuses every plugin built before it.
//! - The root module ([`PluginMod`]) is frozen, even at its end: a host whose root module
//!   grew would refuse every plugin built before it.
//! - Changes that cross nothing (helpers, [`faithful`], [`structure`], [`naming`], [`echo`],
//!   docs) are patch releases too.
//!
//! The workspace's end-to-end tests keep a plugin built against the previous release (a
//! snapshot of that release's source under `tests/fixtures/`) and run it beside the
//! current plugins; with each release, the snapshot moves on to the one before it.
//!
//! ### Why the host checks layouts itself
//!
//! abi_stable assumes a library is at least as new as the interface it is loaded against.
//! Its version check (in `init_root_module`) compares only the 0.y part; its layout check
//! accepts a prefix type with *more* trailing fields in the library than in the host and
//! refuses one with *fewer*. That suits a library that provides a module, and is the
//! opposite of what a host needs for plugins built before it gained a service or an entry
//! point. So the host's loader compares versions by the rule above, then runs abi_stable's
//! layout check, accepting a plugin whose only differences are prefix types (below the root
//! module) of which its copy lacks trailing fields, and outbound enums ([`EventKind`]) of
//! which its copy lacks trailing variants — checked once more the other way round,
//! the plugin's layout against the host's — and takes the root module without abi_stable's
//! repeated check. Reading past what an instance has is never possible: a prefix-type
//! accessor checks at run time how many fields the instance it reads was built with.

// The output check names this crate as its users do, wherever it is compiled.
extern crate self as plugin_api;

pub mod check;
pub mod config;
pub mod context;
pub mod echo;
pub mod event;
pub mod faithful;
pub mod message;
pub mod naming;
pub mod parts;
pub mod plugin;
pub mod structure;
pub mod text;

pub use abi_stable::std_types::{RArc, ROption, RResult, RSlice, RStr, RString, RVec};

pub use config::{ConfigError, ConfigTable};
pub use context::{
    Context, ExpirationOverride, HostServices, HostServicesRef, LoadContext, LogLevel, Logger, ModelInfo,
    Recalled, TokenCounter, Tokenizer,
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
