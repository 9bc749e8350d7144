//! `dedupe`: no duplicate messages (docs/plugins.md#dedupe).
//!
//! - Consecutive messages with the same role and the same content and no tool calls keep
//!   the first; the others are removed. Tool messages are left to the next rule: removing
//!   one would leave its call without a result.
//! - A tool result whose content is byte-equal to a newer result of the same tool becomes
//!   the placeholder `[Same as the result of call ID below]` (ID: the newest such result's
//!   call id), marked `omitted`, never removed. Results shorter than `min_chars` are left.
//! - An expanded message (`expanded: true`) is never deduped; a placeholder is never
//!   replaced again.
//!
//! Each tool result's content is hashed once per message, not once per call: the hash is
//! remembered across calls by the message's address ([`memo`]), so a session resending its
//! working history every turn hashes each result once. Only results long enough to take
//! part are hashed; consecutive messages are compared directly, which stops at the first
//! difference. Each call logs at debug what it hashed (`hashed N bytes: …`), which the
//! bench's replay sums (docs/chain.md#performance).

pub mod memo;

use std::hash::{Hash, Hasher};

use plugin_api::structure::{answered_call_refs, tool_name};
use plugin_api::{
    ConfigError, ConfigTable, Content, Context, Event, EventKind, HistoryPlugin, LoadContext, Message,
    Output, RArc, Role,
};
use rustc_hash::{FxHashMap, FxHasher};

/// `min_chars` when the config does not set it.
pub const DEFAULT_MIN_CHARS: u64 = 200;

pub struct Dedupe {
    consecutive: bool,
    tool_results: bool,
    min_chars: usize,
    preserve_original: bool,
    memo: memo::HashMemo,
}

/// The placeholder of a result repeated by the result of call `id` further down.
pub fn placeholder(id: &str) -> String {
    format!("[Same as the result of call {id} below]")
}

pub(crate) fn content_hash(content: &Content) -> u64 {
    let mut hasher = FxHasher::default();
    matches!(content, Content::Text(_)).hash(&mut hasher);
    for item in content.items() {
        item.hash(&mut hasher);
    }
    hasher.finish()
}

impl Dedupe {
    fn run(&self, history: &[RArc<Message>], ctx: &Context) -> Output {
        let mut events = Vec::new();
        let mut replaced: Vec<Option<RArc<Message>>> = vec![None; history.len()];
        let mut removed = vec![false; history.len()];

        if self.tool_results {
            let answers = answered_call_refs(history);
            let candidates: Vec<usize> = (0..history.len())
                .filter(|&i| {
                    let message = &history[i];
                    message.role == Role::Tool && !message.is_shortened() && message.call_id().is_some()
                })
                .collect();
            let refs: Vec<&RArc<Message>> = candidates.iter().map(|&i| &history[i]).collect();
            // Whether a result takes part and its hash depend on its content alone, so
            // both are remembered with it.
            let (hashes, stats) = self.memo.hashes(&refs, |message| {
                (message.content.char_count() >= self.min_chars).then(|| content_hash(&message.content))
            });
            ctx.log().debug(&format!(
                "hashed {} bytes: {} tool results hashed, {} remembered from earlier calls",
                stats.bytes_hashed, stats.hashed, stats.remembered
            ));
            // Newest first: the first result seen with a (tool, content) is the newest one.
            let mut newest: FxHashMap<(Option<&str>, u64), Vec<usize>> = FxHashMap::default();
            for (&index, hash) in candidates.iter().zip(hashes).rev() {
                let message = &history[index];
                let (Some(hash), Some(call_id)) = (hash, message.call_id()) else {
                    continue;
                };
                let key = (tool_name(history, &answers, index), hash);
                let same = newest.entry(key).or_default();
                match same
                    .iter()
                    .find(|&&newer| history[newer].content == message.content)
                {
                    None => same.push(index),
                    Some(&newer) if !message.is_expanded() => {
                        let newer_id = history[newer].call_id().unwrap_or(call_id);
                        let text = placeholder(newer_id);
                        let tokenizer = ctx.model.tokenizer;
                        let saved = ctx.tokens().content(tokenizer, message) as i64
                            - ctx.tokens().text(tokenizer, &text) as i64;
                        let copy = message.omitted_copy(&text, saved, self.preserve_original);
                        events.push(
                            Event::new(
                                EventKind::MessageOmitted,
                                ctx.turn,
                                format!("same as the result of call {newer_id} (message {newer})"),
                            )
                            .at(index, message)
                            .saving(saved),
                        );
                        replaced[index] = Some(RArc::new(copy));
                    }
                    Some(_) => {}
                }
            }
        }

        if self.consecutive {
            let mut previous: Option<usize> = None;
            for (index, message) in history.iter().enumerate() {
                let duplicate = previous.is_some_and(|p| {
                    let first = &history[p];
                    message.role != Role::Tool
                        && first.role == message.role
                        && !first.has_tool_calls()
                        && message.tool_calls.is_empty()
                        && first.tool_calls.is_empty()
                        && !message.is_expanded()
                        && first.content == message.content
                });
                if duplicate {
                    let first = previous.unwrap_or(index);
                    removed[index] = true;
                    let saved = ctx.tokens().message(
                        ctx.model.tokenizer,
                        message,
                        plugin_api::DEFAULT_PER_MESSAGE_TOKENS,
                    );
                    events.push(
                        Event::new(
                            EventKind::MessageRemoved,
                            ctx.turn,
                            format!("duplicate of message {first}"),
                        )
                        .at(index, message)
                        .saving(i64::try_from(saved).unwrap_or(i64::MAX)),
                    );
                } else {
                    previous = Some(index);
                }
            }
        }

        if events.is_empty() {
            return Output::unchanged(history);
        }
        events.sort_by_key(|e| e.index.into_option());
        let out = history
            .iter()
            .zip(replaced)
            .zip(&removed)
            .filter(|(_, removed)| !**removed)
            .map(|((message, copy), _)| copy.unwrap_or_else(|| message.clone()));
        Output::new(out, events)
    }
}

impl HistoryPlugin for Dedupe {
    const NAME: &'static str = "dedupe";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const SUMMARY: &'static str =
        "no duplicates: repeated consecutive messages removed, a tool result repeated later becomes a placeholder";
    const CONFIG_KEYS: &'static [(&'static str, &'static str)] = &[
        (
            "consecutive",
            "remove consecutive messages with the same role and content (default true)",
        ),
        (
            "tool_results",
            "a result equal to a newer result of the same tool becomes a placeholder (default true)",
        ),
        (
            "min_chars",
            "results shorter than this many characters are left (default 200)",
        ),
        (
            "preserve_original",
            "keep original_content and can_expand on placeholders (default true)",
        ),
    ];

    fn new(load: &LoadContext) -> Result<Self, ConfigError> {
        let mut config = ConfigTable::parse(&load.config_json)?;
        let consecutive = config.bool("consecutive")?.unwrap_or(true);
        let tool_results = config.bool("tool_results")?.unwrap_or(true);
        let min_chars = config.u64("min_chars")?.unwrap_or(DEFAULT_MIN_CHARS);
        let preserve_original = config.bool("preserve_original")?.unwrap_or(true);
        config.finish()?;
        Ok(Dedupe {
            consecutive,
            tool_results,
            min_chars: usize::try_from(min_chars).unwrap_or(usize::MAX),
            preserve_original,
            memo: memo::HashMemo::default(),
        })
    }

    fn process(&self, history: &[RArc<Message>], ctx: &Context) -> Result<Output, String> {
        Ok(self.run(history, ctx))
    }
}

plugin_api::export_plugin!(Dedupe);
