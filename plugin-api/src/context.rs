//! What the host hands a plugin: the per-call [`Context`] (docs/abi.md#the-root-module), the
//! [`LoadContext`] of `new`, and the host services inside them (logging, token counting,
//! summarizing, recalling from the session's transcript).

use abi_stable::{
    std_types::{RArc, ROption, RResult, RStr, RString, RVec},
    StableAbi,
};

use crate::message::{CompactMode, ExpirationMode, Message};

/// A tokenizer the host can count with (docs/plugins.md#token_budget).
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tokenizer {
    /// tiktoken's `o200k_base` (GPT-4o family).
    O200kBase,
    /// tiktoken's `cl100k_base` (GPT-4, GPT-3.5).
    Cl100kBase,
    /// `ceil(characters / 4)` per item: the documents' heuristic.
    Chars4,
}

impl Tokenizer {
    pub const ALL: [Tokenizer; 3] = [Self::O200kBase, Self::Cl100kBase, Self::Chars4];

    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "o200k_base" => Self::O200kBase,
            "cl100k_base" => Self::Cl100kBase,
            "chars4" => Self::Chars4,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::O200kBase => "o200k_base",
            Self::Cl100kBase => "cl100k_base",
            Self::Chars4 => "chars4",
        }
    }
    /// Index of this tokenizer's slot in a message's token cache.
    pub fn slot(self) -> usize {
        self as usize
    }
}

/// A model's settings (`[models.NAME]`, docs/configuration.md) and the window it gets.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    pub name: RString,
    /// The model's preferred window, in messages.
    pub max_context: u64,
    /// The model's window, in tokens.
    pub context_tokens: u64,
    pub tokenizer: Tokenizer,
    /// `min(agent_max_ctx, max_context)` (docs/configuration.md#effective_ctx).
    pub effective_ctx: u64,
}

/// A session's expiration override (docs/plugins.md#retention, docs/sessions.md): each set field wins over the
/// message's own `expiration` and its tool's defaults.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Default)]
pub struct ExpirationOverride {
    pub turns: ROption<u64>,
    pub mode: ROption<ExpirationMode>,
    pub compact_mode: ROption<CompactMode>,
    pub compact_length: ROption<u64>,
    pub disable_expiration: bool,
}

/// Severity of a plugin's log line.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
}

/// The services the host offers plugins, reached through [`Context`] and [`LoadContext`]
/// ([`Context::tokens`], [`Context::log`], [`Context::summarize`]).
///
/// This is an abi_stable *prefix type*: it crosses the boundary as [`HostServicesRef`], a
/// pointer to the host's instance together with the number of fields that instance has.
/// The fields up to `log` (marked `last_prefix_field`) are the ones every host of this
/// `0.y` has. A service added later goes **after** them, in a patch release; its accessor
/// returns `None` when the host that built the instance predates it, so a plugin built
/// against an older `plugin-api` of the same `0.y` still loads in a newer host (it simply
/// does not know the new service), and the plugin-side method of a new service answers
/// "not available in this host" instead of reading past the host's instance.
///
/// Made by the host (one process-wide instance); plugins use the methods of the contexts,
/// never these fields.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = HostServicesRef)))]
pub struct HostServices {
    /// Tokens of one text (see [`TokenCounter::text`]).
    pub count_text: extern "C" fn(Tokenizer, RStr<'_>) -> u64,
    /// Σ tokens(item) over a message's items, cached on the message
    /// (see [`TokenCounter::content`]).
    pub count_content: extern "C" fn(Tokenizer, &Message) -> u64,
    /// Writes a plugin's log line into the host's log (see [`Logger`]).
    #[sabi(last_prefix_field)]
    pub log: extern "C" fn(LogLevel, RStr<'_>),
    // New services go below, each with a line saying which release added it.
    /// Summarizes `text` (the first `RStr`) in about the target number of characters, for
    /// the purpose (the second `RStr`); see [`Context::summarize`]. Added in 0.2.1.
    pub summarize: extern "C" fn(RStr<'_>, u64, RStr<'_>) -> RResult<RString, RString>,
    /// The best-matching exchanges of the call's session transcript for a query (the
    /// `RStr`), at most the `u64` of them; see [`Context::recall`]. Added in 0.2.3.
    pub recall: extern "C" fn(&Context, RStr<'_>, u64) -> RResult<RVec<Recalled>, RString>,
}

/// One exchange of the session's transcript that [`Context::recall`] found
/// (docs/abi.md#host-services): the user message that opened it and every message up to
/// the next user message, as they entered the transcript (each with its identity, its
/// transcript position, and its turn), so it is whole: a tool call comes with its results.
///
/// A plugin may put these messages, unchanged or changed, into its output: the host's
/// output check accepts a message recalled in this run as it accepts an input message
/// (docs/chain.md#the-output-check).
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct Recalled {
    /// The exchange's BM25 score against the query: its best message's.
    pub score: f64,
    /// The exchange's messages, in transcript order.
    pub messages: RVec<RArc<Message>>,
}

impl std::fmt::Debug for HostServicesRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostServices")
    }
}

/// The host's log, for a plugin's log lines. A plugin has its own copy of `std` and
/// `tracing`, so its log lines reach the host's log only through this.
#[derive(Clone, Copy)]
pub struct Logger {
    services: HostServicesRef,
}

impl Logger {
    pub fn log(&self, level: LogLevel, message: &str) {
        (self.services.log())(level, message.into());
    }
    pub fn error(&self, message: &str) {
        self.log(LogLevel::Error, message);
    }
    pub fn warn(&self, message: &str) {
        self.log(LogLevel::Warn, message);
    }
    pub fn info(&self, message: &str) {
        self.log(LogLevel::Info, message);
    }
    pub fn debug(&self, message: &str) {
        self.log(LogLevel::Debug, message);
    }
}

impl std::fmt::Debug for Logger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Logger")
    }
}

/// The host's token counter: real tiktoken encodings loaded once in the host, with each
/// message's count remembered on the message so nothing is tokenized twice (docs/plugins.md#token_budget, docs/chain.md#performance).
#[derive(Clone, Copy)]
pub struct TokenCounter {
    services: HostServicesRef,
}

impl TokenCounter {
    /// Tokens of one piece of text (ordinary encoding, no special tokens).
    pub fn text(&self, tokenizer: Tokenizer, text: &str) -> u64 {
        (self.services.count_text())(tokenizer, text.into())
    }

    /// Σ tokens(item) over a message's items (docs/plugins.md#token_budget), without the per-message
    /// overhead. Cached on the message.
    pub fn content(&self, tokenizer: Tokenizer, message: &Message) -> u64 {
        (self.services.count_content())(tokenizer, message)
    }

    /// A message's tokens by docs/plugins.md#token_budget: `per_message_tokens + Σ tokens(item)`.
    pub fn message(&self, tokenizer: Tokenizer, message: &Message, per_message_tokens: u64) -> u64 {
        per_message_tokens + self.content(tokenizer, message)
    }
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenCounter")
    }
}

/// What a plugin gets with every call (docs/abi.md#the-root-module).
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct Context {
    /// The session id, or none for a stateless call.
    pub session_id: ROption<RString>,
    /// The model of this call and its settings.
    pub model: ModelInfo,
    pub agent_max_ctx: u64,
    /// `min(agent_max_ctx, model.max_context)`.
    pub effective_ctx: u64,
    /// The current turn (docs/wire-format.md#turns).
    pub turn: u64,
    /// The session's last activity (RFC 3339), if any.
    pub last_active: ROption<RString>,
    /// The session's expiration override (docs/plugins.md#retention), if any.
    pub expiration_override: ROption<ExpirationOverride>,
    /// The host's services: use [`Context::tokens`], [`Context::log`].
    pub services: HostServicesRef,
}

impl Context {
    /// The host's token counter.
    pub fn tokens(&self) -> TokenCounter {
        TokenCounter {
            services: self.services,
        }
    }

    /// The host's log, for this plugin's log lines.
    pub fn log(&self) -> Logger {
        Logger {
            services: self.services,
        }
    }

    /// Asks the host's summarizer for a plain-text summary of `text` in at most about
    /// `target_chars` characters (a character is a `char`). `purpose` says what the summary
    /// is for, in a few words (e.g. `"old tool result"`); the host's prompt uses it, and
    /// its cache tells summaries of one text for different purposes apart.
    ///
    /// The answer is `Err` when the host has no summarizer configured, when the call fails
    /// or times out, and when the host predates this service (plugin-api 0.2.1): always
    /// have a fallback (e.g. the text's first characters) and report the reason.
    pub fn summarize(&self, text: &str, target_chars: usize, purpose: &str) -> Result<String, String> {
        let Some(summarize) = self.services.summarize() else {
            return Err(
                "summarize is not available in this host (it needs a host built with plugin-api 0.2.1 \
                 or newer)"
                    .to_string(),
            );
        };
        summarize(text.into(), target_chars as u64, purpose.into())
            .into_result()
            .map(RString::into_string)
            .map_err(RString::into_string)
    }

    /// Asks the host for the `limit` exchanges of this session's whole transcript that
    /// best match `query` (BM25, as `search_history` over MCP scores, docs/mcp.md), best
    /// first: what the chain may have dropped on an earlier turn. Each is whole (see
    /// [`Recalled`]) and its messages keep their identities, so the output check accepts
    /// them back into the history.
    ///
    /// A stateless call (no session: `process`, a stateless proxy request) has no
    /// transcript beyond its input: the answer is empty. The answer is `Err` when the
    /// store cannot be read, and when the host predates this service (plugin-api 0.2.3):
    /// a plugin then keeps to its input.
    pub fn recall(&self, query: &str, limit: usize) -> Result<Vec<Recalled>, String> {
        let Some(recall) = self.services.recall() else {
            return Err(
                "recall is not available in this host (it needs a host built with plugin-api 0.2.3 or newer)"
                    .to_string(),
            );
        };
        recall(self, query.into(), limit as u64)
            .into_result()
            .map(RVec::into_vec)
            .map_err(RString::into_string)
    }
}

/// What `new` gets: the plugin's own config table and what it may be checked against.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct LoadContext {
    /// The plugin's `[plugin.NAME]` table as JSON text (`{}` when there is none).
    pub config_json: RString,
    /// `agent_max_ctx` of the configuration.
    pub agent_max_ctx: u64,
    /// Every listed model, so values that depend on a model (a budget ≤ 0, a target not
    /// below its limit) are checked at load (docs/configuration.md).
    pub models: RVec<ModelInfo>,
    /// The host's services: use [`LoadContext::log`], [`LoadContext::tokens`].
    pub services: HostServicesRef,
}

impl LoadContext {
    /// The host's log, for this plugin's log lines.
    pub fn log(&self) -> Logger {
        Logger {
            services: self.services,
        }
    }

    /// The host's token counter (e.g. to count a fixed text once, at load).
    pub fn tokens(&self) -> TokenCounter {
        TokenCounter {
            services: self.services,
        }
    }
}
