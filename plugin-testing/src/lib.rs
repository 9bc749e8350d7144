//! Helpers for a plugin's own unit tests, without a host: a history numbered as the host
//! numbers it ([`history`]), the host's own output check ([`check`], [`process`]) and a
//! [`Context`] built from named settings ([`settings`]) and a [`LoadContext`] with
//! sensible values.
//!
//! ```
//! use plugin_api::{HistoryPlugin, LoadContext, ConfigError, Context, Message, Output, RArc};
//! # struct Mine;
//! # impl HistoryPlugin for Mine {
//! #     const NAME: &'static str = "mine";
//! #     const VERSION: &'static str = "0.1.0";
//! #     const SUMMARY: &'static str = "";
//! #     fn new(_: &LoadContext) -> Result<Self, ConfigError> { Ok(Mine) }
//! #     fn process(&self, h: &[RArc<Message>], _: &Context) -> Result<Output, String> { Ok(Output::unchanged(h)) }
//! # }
//! use plugin_testing as testing;
//! let history = testing::history(r#"[{"role":"user","content":"hi"}]"#);
//! let plugin = Mine::new(&testing::load_context("{}")).unwrap();
//! // Err (with the host's own words) for an output the host would refuse.
//! let ctx = testing::settings().effective_ctx(200).turn(1).context();
//! let output = testing::process(&plugin, &history, &ctx).unwrap();
//! ```
//! Their services count every tokenizer as `chars4`
//! (the real encodings live in the host), drop log lines and have no summarizer (so
//! `summarize` answers `Err`, as in a host without one); `recall` answers from the
//! transcript a test gives with [`with_transcript`] (nothing otherwise, as in a stateless
//! call). End-to-end tests through the host use the real ones.

use std::cell::RefCell;

use abi_stable::{
    prefix_type::WithMetadata,
    staticref,
    std_types::{RErr, ROption, RResult, RStr, RString, RVec},
};

use plugin_api::context::{
    Context, HostServices, HostServicesRef, LoadContext, LogLevel, ModelInfo, Recalled, Tokenizer,
};
use plugin_api::event::Output;
use plugin_api::message::Message;
use plugin_api::plugin::HistoryPlugin;
use plugin_api::structure::Faults;
use plugin_api::RArc;

/// A history as the host hands it to a plugin: `json` (the wire format) parsed, each
/// message given its identity (what tells the host a changed copy from an invented
/// message). Panics on JSON the host would refuse, naming the problem.
pub fn history(json: &str) -> Vec<RArc<Message>> {
    let mut history =
        history_wire::chat::history_from_str(json).unwrap_or_else(|err| panic!("testing::history: {err}"));
    for (index, message) in history.iter_mut().enumerate() {
        RArc::make_mut(message).set_origin(index as u64 + 1);
    }
    history
}

/// Runs the host's output check on `output`, a plugin's answer to `input`: its shape, no
/// structural fault the input did not have (a call left without its result, a result
/// answering no call), nothing invented, no message twice, no role changed. `Err` carries
/// the message the host would report for this plugin (`invalid output: output message 1:
/// …`). This is the host's own code (`plugin_api::check`), not a copy.
///
/// `input` must be numbered as the host numbers it: build it with [`history`].
pub fn check(input: &[RArc<Message>], output: &[RArc<Message>]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    if input.iter().any(|m| m.origin() == 0 || !seen.insert(m.origin())) {
        return Err(
            "testing::check: the input's messages have no identities; build it with \
                    plugin_testing::history (the host numbers every message before the chain)"
                .into(),
        );
    }
    let recalled = RECALLED.with(|r| r.borrow().clone());
    plugin_api::check::check_stage_recalled(input, Faults::of(input).count(), output, &recalled).map(|_| ())
}

thread_local! {
    /// The transcript of [`with_transcript`], if one is given on this thread.
    static TRANSCRIPT: RefCell<Option<Vec<RArc<Message>>>> = const { RefCell::new(None) };
    /// The messages `recall` handed out: [`check`] accepts them as the host does.
    static RECALLED: RefCell<Vec<RArc<Message>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with `transcript` as the session's transcript that `ctx.recall` searches
/// (docs/abi.md#host-services), and [`check`] accepting what it recalled, as the host
/// does. Build it with [`history`] so each message has its identity. The test services
/// split it into exchanges as the host does (a user message and what follows it up to the
/// next one) and score an exchange by how many of the query's words (lower-cased letters
/// and digits) its best message holds: simpler than the host's BM25, enough to choose.
pub fn with_transcript<R>(transcript: Vec<RArc<Message>>, f: impl FnOnce() -> R) -> R {
    let previous = TRANSCRIPT.with(|t| t.replace(Some(transcript)));
    let handed = RECALLED.with(|r| std::mem::take(&mut *r.borrow_mut()));
    let result = f();
    TRANSCRIPT.with(|t| *t.borrow_mut() = previous);
    RECALLED.with(|r| *r.borrow_mut() = handed);
    result
}

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// The test services' `recall`: see [`with_transcript`].
extern "C" fn recall_from_transcript(
    ctx: &Context,
    query: RStr<'_>,
    limit: u64,
) -> RResult<RVec<Recalled>, RString> {
    let transcript = TRANSCRIPT.with(|t| t.borrow().clone());
    let (Some(transcript), true) = (transcript, ctx.session_id.is_some()) else {
        return RResult::ROk(RVec::new());
    };
    let query: Vec<String> = words(query.as_str()).collect();
    let score = |m: &Message| -> f64 {
        let texts: Vec<String> = m.token_items().flat_map(words).collect();
        query.iter().filter(|q| texts.contains(q)).count() as f64
    };
    let mut exchanges: Vec<Recalled> = Vec::new();
    for message in transcript {
        let best = score(&message);
        match exchanges.last_mut() {
            Some(last) if message.role != plugin_api::Role::User => {
                last.score = last.score.max(best);
                last.messages.push(message);
            }
            _ => exchanges.push(Recalled {
                score: best,
                messages: vec![message].into(),
            }),
        }
    }
    exchanges.retain(|e| e.score > 0.0);
    exchanges.sort_by(|a, b| b.score.total_cmp(&a.score));
    exchanges.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    RECALLED.with(|r| {
        r.borrow_mut()
            .extend(exchanges.iter().flat_map(|e| e.messages.iter().cloned()))
    });
    RResult::ROk(exchanges.into())
}

/// Calls `plugin.process(input, ctx)` and checks its output as the host would
/// ([`check`]): `Err` with the plugin's own error, or with the host's refusal of its output.
pub fn process<P: HistoryPlugin>(
    plugin: &P,
    input: &[RArc<Message>],
    ctx: &Context,
) -> Result<Output, String> {
    let output = plugin.process(input, ctx)?;
    check(input, &output.history)?;
    Ok(output)
}

extern "C" fn chars4_text(_: Tokenizer, text: RStr<'_>) -> u64 {
    (text.as_str().chars().count() as u64).div_ceil(4)
}

/// `chars4` over what the host counts (docs/wire-format.md#part-kinds): each part by its
/// kind under OpenAI's family rules, texts and calls by ⌈characters / 4⌉.
extern "C" fn chars4_content(_: Tokenizer, message: &Message) -> u64 {
    let chars4 = |text: &str| (text.chars().count() as u64).div_ceil(4);
    let parts: u64 = match &message.content {
        plugin_api::Content::Parts(parts) => parts
            .iter()
            .map(|part| {
                let cost = part.cost(&plugin_api::parts::MediaRules::OPENAI);
                cost.tokens + cost.texts.iter().map(|t| chars4(t)).sum::<u64>()
            })
            .sum(),
        plugin_api::Content::Text(text) => chars4(text),
        plugin_api::Content::Null => 0,
    };
    let calls: u64 = message
        .tool_calls
        .iter()
        .map(|call| chars4(&call.name) + chars4(&call.arguments))
        .sum();
    parts + calls + message.reasoning_texts().map(|t| chars4(&t)).sum::<u64>()
}

extern "C" fn discard(_: LogLevel, _: RStr<'_>) {}

extern "C" fn no_summarizer(_: RStr<'_>, _: u64, _: RStr<'_>) -> RResult<RString, RString> {
    RErr("no summarizer in plugin_testing".into())
}

/// Holds the test services' static instance.
struct TestServices;

impl TestServices {
    staticref!(const INSTANCE: WithMetadata<HostServices> = WithMetadata::new(HostServices {
        count_text: chars4_text,
        count_content: chars4_content,
        log: discard,
        summarize: no_summarizer,
        recall: recall_from_transcript,
    }));
}

/// Host services for unit tests: `chars4` counting for every tokenizer, log lines dropped,
/// no summarizer, recall from [`with_transcript`]'s transcript.
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

/// A stateless call's context at `turn` with a window of `effective_ctx` messages (the
/// shorthand of [`settings`]).
pub fn context(effective_ctx: u64, turn: u64) -> Context {
    settings().effective_ctx(effective_ctx).turn(turn).context()
}

/// A test context built from named settings, each with a default: window 200 messages,
/// model `test`, turn 1, `chars4` counting.
///
/// ```
/// use plugin_api::Tokenizer;
/// use plugin_testing as testing;
/// let ctx = testing::settings().effective_ctx(16).turn(3).model("small").tokenizer(Tokenizer::O200kBase).context();
/// assert_eq!((ctx.effective_ctx, ctx.turn, ctx.model.name.as_str()), (16, 3, "small"));
/// ```
pub fn settings() -> ContextSettings {
    ContextSettings {
        effective_ctx: 200,
        agent_max_ctx: None,
        model: "test".into(),
        tokenizer: Tokenizer::Chars4,
        context_tokens: 128_000,
        turn: 1,
        session: None,
    }
}

/// The settings of a test [`Context`]; see [`settings`]. (The test services count every
/// tokenizer as `chars4`: the tokenizer set here is the one a plugin reads from the model.)
#[derive(Debug, Clone)]
pub struct ContextSettings {
    effective_ctx: u64,
    agent_max_ctx: Option<u64>,
    model: String,
    tokenizer: Tokenizer,
    context_tokens: u64,
    turn: u64,
    session: Option<String>,
}

impl ContextSettings {
    /// The window in messages (the model's `max_context` too, unless `agent_max_ctx` is set).
    pub fn effective_ctx(mut self, messages: u64) -> Self {
        self.effective_ctx = messages;
        self
    }
    /// The agent-wide ceiling (defaults to the window).
    pub fn agent_max_ctx(mut self, messages: u64) -> Self {
        self.agent_max_ctx = Some(messages);
        self
    }
    /// The model's name.
    pub fn model(mut self, name: &str) -> Self {
        self.model = name.to_string();
        self
    }
    /// The model's tokenizer.
    pub fn tokenizer(mut self, tokenizer: Tokenizer) -> Self {
        self.tokenizer = tokenizer;
        self
    }
    /// The model's context in tokens.
    pub fn context_tokens(mut self, tokens: u64) -> Self {
        self.context_tokens = tokens;
        self
    }
    /// The current turn.
    pub fn turn(mut self, turn: u64) -> Self {
        self.turn = turn;
        self
    }
    /// A session's call (the default is a stateless one): `ctx.recall` answers from
    /// [`with_transcript`]'s transcript only in one.
    pub fn session(mut self, id: &str) -> Self {
        self.session = Some(id.to_string());
        self
    }
    /// The context of a call with these settings.
    pub fn context(self) -> Context {
        let agent_max_ctx = self.agent_max_ctx.unwrap_or(self.effective_ctx);
        Context {
            session_id: self.session.map(RString::from).into(),
            model: ModelInfo {
                name: self.model.into(),
                max_context: self.effective_ctx,
                context_tokens: self.context_tokens,
                tokenizer: self.tokenizer,
                effective_ctx: self.effective_ctx,
            },
            agent_max_ctx,
            effective_ctx: self.effective_ctx,
            turn: self.turn,
            last_active: ROption::RNone,
            expiration_override: ROption::RNone,
            services: SERVICES,
        }
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
    use super::*;
    use plugin_api::{ConfigError, Content, Role};

    /// A plugin that makes one mistake the host refuses, for the tests below.
    #[derive(Clone, Copy)]
    enum Mistake {
        Invent,
        Duplicate,
        SwapRole,
        Orphan,
    }

    struct Misbehaving(Mistake);

    impl HistoryPlugin for Misbehaving {
        const NAME: &'static str = "misbehaving";
        const VERSION: &'static str = "0.0.0";
        const SUMMARY: &'static str = "makes one mistake";

        fn new(_: &LoadContext) -> Result<Self, ConfigError> {
            Ok(Misbehaving(Mistake::Invent))
        }

        fn process(&self, history: &[RArc<Message>], _: &Context) -> Result<Output, String> {
            let mut out: Vec<RArc<Message>> = history.to_vec();
            match self.0 {
                Mistake::Invent => out.push(RArc::new(Message::new(Role::User, Content::Text("new".into())))),
                Mistake::Duplicate => out.push(history[0].clone()),
                Mistake::SwapRole => {
                    let mut copy = (*history[0]).clone();
                    copy.role = Role::Assistant;
                    out[0] = RArc::new(copy);
                }
                // Drops the call, keeps its result.
                Mistake::Orphan => drop(out.remove(1)),
            };
            Ok(Output::new(out, Vec::new()))
        }
    }

    const HISTORY: &str = r#"[{"role":"user","content":"task"},
        {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
        {"role":"tool","tool_call_id":"c1","content":"r"},
        {"role":"assistant","content":"done"}]"#;

    fn refusal(mistake: Mistake) -> String {
        let history = history(HISTORY);
        process(&Misbehaving(mistake), &history, &context(200, 1)).unwrap_err()
    }

    #[test]
    fn the_hosts_check_catches_each_mistake_with_the_hosts_message() {
        assert_eq!(
            refusal(Mistake::Invent),
            "invalid output: output message 4: invented (it is neither an input message nor made from one)"
        );
        assert_eq!(
            refusal(Mistake::Duplicate),
            "invalid output: output message 4: duplicated (the same input message appears twice)"
        );
        assert_eq!(
            refusal(Mistake::SwapRole),
            "invalid output: output message 0: role changed from user to assistant"
        );
        let orphan = refusal(Mistake::Orphan);
        assert!(
            orphan
                .starts_with("invalid output: output has 1 structural faults where its input had 0; first:")
                && orphan.contains("\"c1\""),
            "{orphan}"
        );
    }

    #[test]
    fn a_correct_output_passes_and_an_unnumbered_input_is_named() {
        let numbered = history(HISTORY);
        let unit_dropped = [numbered[0].clone(), numbered[3].clone()];
        assert!(check(&numbered, &unit_dropped).is_ok(), "a whole unit dropped");
        assert!(check(&numbered, &numbered).is_ok());
        let unnumbered = history_wire::chat::history_from_str(HISTORY).unwrap();
        assert!(check(&unnumbered, &unnumbered)
            .unwrap_err()
            .contains("testing::history"));
    }

    #[test]
    fn named_settings_make_the_context_they_name() {
        let ctx = settings()
            .effective_ctx(16)
            .agent_max_ctx(40)
            .model("small")
            .tokenizer(Tokenizer::Cl100kBase)
            .turn(7)
            .context();
        assert_eq!((ctx.effective_ctx, ctx.agent_max_ctx, ctx.turn), (16, 40, 7));
        assert_eq!(ctx.model.name.as_str(), "small");
        assert_eq!(ctx.model.tokenizer, Tokenizer::Cl100kBase);
        let short = super::context(10, 2);
        assert_eq!(
            (short.effective_ctx, short.agent_max_ctx, short.turn),
            (10, 10, 2)
        );
        assert_eq!(short.model.name.as_str(), "test");
    }

    #[test]
    fn the_test_context_counts_chars4_and_has_no_summarizer() {
        let ctx = super::context(10, 1);
        assert_eq!(ctx.tokens().text(Tokenizer::O200kBase, "héllo"), 2);
        ctx.log().info("dropped");
        assert_eq!(
            ctx.summarize("text", 2, "test"),
            Err("no summarizer in plugin_testing".to_string())
        );
    }
}
