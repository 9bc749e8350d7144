//! `tool_result_filter`: placeholders, never removal (docs/plugins.md#tool_result_filter).
//!
//! Old tool results are the bulk of an agent's history and rarely read again. Deleting
//! them breaks the call/result structure providers demand, so this plugin keeps every
//! message and replaces the *content* of old results with a short, byte-stable
//! placeholder. The original stays in `metadata.original_content` (unless
//! `preserve_original = false`) so the agent can ask for it back (docs/plugins.md#expansion).

mod cut;

use std::collections::{HashMap, HashSet};

use plugin_api::structure::{answered_call_refs, tool_name, CallRef};
use plugin_api::{
    ConfigError, ConfigTable, Content, Context, Event, EventKind, HistoryPlugin, LoadContext, Message,
    Output, RArc, ToolCall,
};

// docs/plugins.md#token_budget's per-message overhead, which docs/plugins.md#tool_result_filter fixes at 3 for `trigger_tokens`.
use plugin_api::DEFAULT_PER_MESSAGE_TOKENS as PER_MESSAGE_TOKENS;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    /// The newest `keep` counted results keep their content.
    KeepLast(usize),
    DropAll,
    KeepAll,
}

pub struct ToolResultFilter {
    strategy: Strategy,
    placeholder: String,
    exclude_tools: HashSet<String>,
    min_chars: usize,
    trigger_tokens: u64,
    clear_at_least: u64,
    clear_tool_inputs: bool,
    preserve_original: bool,
    /// `max_result_tokens`: a longer result is cut to its head and tail (`cut`).
    max_result_tokens: Option<u64>,
}

impl ToolResultFilter {
    /// Whether the result at `index` takes part at all: not already a placeholder, not
    /// expanded, not of an excluded tool, and longer than `min_chars`. Results that do not take part are
    /// never replaced and do not count toward `keep`.
    fn counted(&self, history: &[RArc<Message>], answers: &[Option<CallRef>], index: usize) -> bool {
        let message = &history[index];
        // An expanded result was asked for on purpose: it keeps its content and does not
        // push another result out of `keep`.
        if message.meta().is_some_and(|m| m.omitted() || m.expanded()) {
            return false;
        }
        // A result that already is exactly the placeholder (e.g. role_pair's result for a
        // call that had none, sent back on the next turn) has nothing to save; replacing it
        // would only add metadata and change its bytes.
        if matches!(&message.content, Content::Text(text) if text.as_str() == self.placeholder_text(message))
        {
            return false;
        }
        if let Some(name) = tool_name(history, answers, index) {
            if self.exclude_tools.contains(name) {
                return false;
            }
        }
        // Longer than min_chars: look at no more than min_chars + 1 characters, so an
        // old, huge result costs nothing to measure on every turn.
        message
            .content
            .items()
            .flat_map(str::chars)
            .nth(self.min_chars)
            .is_some()
    }

    fn describe_strategy(&self) -> String {
        match self.strategy {
            Strategy::KeepLast(keep) => format!("keep_last, keep {keep}"),
            Strategy::DropAll => "drop_all".to_string(),
            Strategy::KeepAll => "keep_all".to_string(),
        }
    }

    /// The message that replaces the result `message`: the placeholder as content, the
    /// lifecycle metadata of docs/plugins.md#tool_result_filter, and no `retention_policy` (the parts it described are
    /// gone, and a policy of the wrong length would only draw warnings from `retention`).
    fn placeholder_for(&self, message: &Message, tokens_saved: i64) -> Message {
        message.omitted_copy(
            &self.placeholder_text(message),
            tokens_saved,
            self.preserve_original,
        )
    }

    /// The placeholder for `message`: `{id}` stands for its identity, the id the recall
    /// tools take (docs/mcp.md#placeholders); stable from turn to turn, so the sent prefix
    /// stays cacheable.
    fn placeholder_text(&self, message: &Message) -> String {
        if self.placeholder.contains("{id}") {
            self.placeholder.replace("{id}", &message.identity())
        } else {
            self.placeholder.clone()
        }
    }
}

impl HistoryPlugin for ToolResultFilter {
    const NAME: &'static str = "tool_result_filter";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const SUMMARY: &'static str =
        "replaces old tool results with a byte-stable placeholder; never removes a message";
    const CONFIG_KEYS: &'static [(&'static str, &'static str)] = &[
        ("strategy", "keep_last (default) | drop_all | keep_all"),
        (
            "keep",
            "keep_last: the newest N counted tool results keep their content (default 4)",
        ),
        (
            "placeholder",
            "the replacement content (default \"[Omitted]\"); {id} stands for the message's id, e.g. \"[Omitted: call expand_message with id {id} to read it]\"",
        ),
        (
            "exclude_tools",
            "tool names whose results are never replaced and not counted",
        ),
        (
            "min_chars",
            "results of at most this many characters are left alone and not counted (default 0)",
        ),
        (
            "trigger_tokens",
            "act only when the history is over this many tokens (default 0 = always)",
        ),
        (
            "clear_at_least",
            "apply only if the replacements save at least this many tokens (default 0)",
        ),
        (
            "clear_tool_inputs",
            "also replace each replaced result's call arguments with \"{}\" (default false)",
        ),
        (
            "preserve_original",
            "keep original_content and can_expand for expansion (default true)",
        ),
        (
            "max_result_tokens",
            "a kept tool result over this many tokens is cut to its head and tail (default: none)",
        ),
    ];

    fn new(load: &LoadContext) -> Result<Self, ConfigError> {
        let mut config = ConfigTable::parse(&load.config_json)?;
        #[derive(Clone, Copy)]
        enum Name {
            KeepLast,
            DropAll,
            KeepAll,
        }
        let strategy = config.one_of(
            "strategy",
            &[
                ("keep_last", Name::KeepLast),
                ("drop_all", Name::DropAll),
                ("keep_all", Name::KeepAll),
            ],
        )?;
        let keep = config.u64("keep")?;
        let strategy = match strategy.unwrap_or(Name::KeepLast) {
            Name::KeepLast => Strategy::KeepLast(usize::try_from(keep.unwrap_or(4)).unwrap_or(usize::MAX)),
            other => {
                // `keep` left over from an earlier keep_last is harmless: say so rather
                // than refuse the whole configuration.
                if keep.is_some() {
                    load.log().warn("[plugin.tool_result_filter] keep only applies with strategy = \"keep_last\"; ignored");
                }
                match other {
                    Name::DropAll => Strategy::DropAll,
                    _ => Strategy::KeepAll,
                }
            }
        };
        let placeholder = config
            .string("placeholder")?
            .unwrap_or_else(|| plugin_api::DEFAULT_PLACEHOLDER.to_string());
        let exclude_tools = config
            .strings("exclude_tools")?
            .unwrap_or_default()
            .into_iter()
            .collect();
        let min_chars = usize::try_from(config.u64("min_chars")?.unwrap_or(0)).unwrap_or(usize::MAX);
        let trigger_tokens = config.u64("trigger_tokens")?.unwrap_or(0);
        let clear_at_least = config.u64("clear_at_least")?.unwrap_or(0);
        let clear_tool_inputs = config.bool("clear_tool_inputs")?.unwrap_or(false);
        let preserve_original = config.bool("preserve_original")?.unwrap_or(true);
        let max_result_tokens = config.positive("max_result_tokens")?;
        config.finish()?;
        Ok(ToolResultFilter {
            strategy,
            placeholder,
            exclude_tools,
            min_chars,
            trigger_tokens,
            clear_at_least,
            clear_tool_inputs,
            preserve_original,
            max_result_tokens,
        })
    }

    fn process(&self, history: &[RArc<Message>], ctx: &Context) -> Result<Output, String> {
        let output = self.replace_old(history, ctx)?;
        let Some(max) = self.max_result_tokens else {
            return Ok(output);
        };
        let mut out: Vec<RArc<Message>> = output.history.into_iter().collect();
        let mut events: Vec<Event> = output.events.into_iter().collect();
        cut::cut_oversized(&mut out, &mut events, ctx, max, self.preserve_original);
        Ok(Output::new(out, events))
    }
}

impl ToolResultFilter {
    /// The placeholders of old results by `strategy` (all but `max_result_tokens`).
    fn replace_old(&self, history: &[RArc<Message>], ctx: &Context) -> Result<Output, String> {
        let tokenizer = ctx.model.tokenizer;
        let tool_total = history
            .iter()
            .filter(|m| m.role == plugin_api::Role::Tool)
            .count();
        let already = history
            .iter()
            .filter(|m| m.role == plugin_api::Role::Tool && m.meta().is_some_and(|meta| meta.omitted()))
            .count();
        // An empty result is never replaced (there is nothing to save), and is not "kept"
        // either: it is counted on its own.
        let empty = history
            .iter()
            .filter(|m| {
                m.role == plugin_api::Role::Tool
                    && m.content.char_count() == 0
                    && !m.meta().is_some_and(|meta| meta.omitted())
            })
            .count();
        let log_line = |replaced: usize| {
            let empty_part = if empty > 0 {
                format!(", {empty} empty")
            } else {
                String::new()
            };
            ctx.log().info(&format!(
                "tool results: {tool_total} total, {} kept, {replaced} replaced with placeholders{empty_part}",
                tool_total.saturating_sub(replaced + empty)
            ));
        };

        if self.trigger_tokens > 0 {
            let total: u64 = history
                .iter()
                .map(|m| ctx.tokens().message(tokenizer, m, PER_MESSAGE_TOKENS))
                .sum();
            if total <= self.trigger_tokens {
                ctx.log().debug(&format!(
                    "tool_result_filter: history has {total} tokens, not over trigger_tokens {}; nothing replaced",
                    self.trigger_tokens
                ));
                log_line(already);
                return Ok(Output::unchanged(history));
            }
        }

        let answers = answered_call_refs(history);
        let counted: Vec<usize> = (0..history.len())
            .filter(|&i| history[i].role == plugin_api::Role::Tool && self.counted(history, &answers, i))
            .collect();
        let replace: &[usize] = match self.strategy {
            Strategy::KeepAll => &[],
            Strategy::DropAll => &counted,
            Strategy::KeepLast(keep) => &counted[..counted.len().saturating_sub(keep)],
        };
        if replace.is_empty() {
            log_line(already);
            return Ok(Output::unchanged(history));
        }

        // Arguments cleared per assistant message: (assistant index) -> call ids, and the
        // tokens each replaced result saves, its cleared arguments included. Sets and maps,
        // not scans: one assistant message may have thousands of calls and results.
        let mut cleared: HashMap<usize, HashSet<&str>> = HashMap::new();
        if self.clear_tool_inputs {
            for &index in replace {
                if let (Some(at), Some(id)) = (answers[index], history[index].call_id()) {
                    cleared.entry(at.message).or_default().insert(id);
                }
            }
        }
        // What clearing saves per (assistant index, call id), over every call with that id.
        let empty_args_tokens = ctx.tokens().text(tokenizer, "{}") as i64;
        let mut arguments_saved: HashMap<(usize, &str), i64> = HashMap::new();
        for (&call, ids) in &cleared {
            for tool_call in history[call].tool_calls.iter() {
                let id = tool_call.id.as_str();
                // Already "{}": nothing to clear, nothing saved (keeps a second run a no-op).
                if ids.contains(id) && clearable(tool_call) {
                    *arguments_saved.entry((call, id)).or_default() +=
                        ctx.tokens().text(tokenizer, &tool_call.arguments) as i64 - empty_args_tokens;
                }
            }
        }
        let savings: Vec<i64> = replace
            .iter()
            .map(|&index| {
                let message = &history[index];
                let arguments = match (answers[index], message.call_id()) {
                    (Some(at), Some(id)) => arguments_saved.get(&(at.message, id)).copied(),
                    _ => None,
                };
                let placeholder_tokens = ctx.tokens().text(tokenizer, &self.placeholder_text(message)) as i64;
                ctx.tokens().content(tokenizer, message) as i64 - placeholder_tokens + arguments.unwrap_or(0)
            })
            .collect();
        let total_saved: i64 = savings.iter().sum();
        if total_saved < i64::try_from(self.clear_at_least).unwrap_or(i64::MAX) {
            ctx.log().info(&format!(
                "tool_result_filter: replacing {} results would save {total_saved} tokens, less than clear_at_least {}; nothing replaced",
                replace.len(),
                self.clear_at_least
            ));
            log_line(already);
            return Ok(Output::unchanged(history));
        }

        let mut out: Vec<RArc<Message>> = history.to_vec();
        let mut events = Vec::with_capacity(replace.len());
        let reason = format!(
            "tool result replaced with a placeholder (strategy {})",
            self.describe_strategy()
        );
        for (&index, &saved) in replace.iter().zip(&savings) {
            out[index] = RArc::new(self.placeholder_for(&history[index], saved));
            events.push(
                Event::new(EventKind::MessageOmitted, ctx.turn, reason.as_str())
                    .at(index, &history[index])
                    .saving(saved),
            );
        }
        // The calls' arguments live on the assistant message: change a copy of it, once,
        // however many of its results were replaced.
        let mut calls: Vec<(usize, HashSet<&str>)> = cleared.into_iter().collect();
        calls.sort_unstable_by_key(|(index, _)| *index);
        for (index, ids) in calls {
            let original = &history[index];
            let needs_change = original
                .tool_calls
                .iter()
                .any(|c| ids.contains(c.id.as_str()) && clearable(c));
            if !needs_change {
                continue;
            }
            let mut copy = (**original).clone();
            for call in copy.tool_calls.iter_mut() {
                if ids.contains(call.id.as_str()) && clearable(call) {
                    call.arguments = "{}".into();
                    call.arguments_is_json = false;
                }
            }
            out[index] = RArc::new(copy);
        }
        log_line(already + replace.len());
        Ok(Output::new(out, events))
    }
}

/// Whether `clear_tool_inputs` replaces this call's arguments with `"{}"`: a call with the
/// usual `function` object whose arguments are not `"{}"` already. A `function` of
/// another shape is kept as it came (its arguments are not a field to set).
fn clearable(call: &ToolCall) -> bool {
    call.has_function && call.arguments.as_str() != "{}"
}

plugin_api::export_plugin!(ToolResultFilter);

#[cfg(test)]
mod tests {
    use super::*;
    use history_wire::chat::{history_from_str, history_to_string};
    use plugin_testing::{context, load_context};

    fn run(config: &str, history: &str) -> String {
        let plugin = ToolResultFilter::new(&load_context(config)).unwrap();
        let history = history_from_str(history).unwrap();
        let output = plugin.process(&history, &context(200, 1)).unwrap();
        history_to_string(&output.history)
    }

    #[test]
    fn bad_config_names_the_key() {
        let err = |config: &str| {
            ToolResultFilter::new(&load_context(config))
                .err()
                .unwrap()
                .to_string()
        };
        assert!(err(r#"{"strategy":"some"}"#).starts_with("strategy:"));
        assert!(err(r#"{"keep":-1}"#).starts_with("keep:"));
        assert!(ToolResultFilter::new(&load_context(r#"{"strategy":"drop_all","keep":2}"#)).is_ok());
        assert!(err(r#"{"exclude_tools":"x"}"#).starts_with("exclude_tools:"));
        assert!(err(r#"{"kep":2}"#).starts_with("kep: unknown key"));
    }

    #[test]
    fn drop_all_replaces_and_keeps_the_original() {
        let out = run(
            r#"{"strategy":"drop_all"}"#,
            r#"[{"role":"user","content":"u"},
                {"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},
                {"role":"tool","tool_call_id":"c","content":"a long result"}]"#,
        );
        assert!(
            out.contains(r#""content":"[Omitted]","tool_call_id":"c""#),
            "{out}"
        );
        assert!(out.contains(r#""can_expand":true,"omitted":true"#), "{out}");
        assert!(out.contains(r#""original_content":"a long result""#), "{out}");
    }

    #[test]
    fn a_placeholder_names_each_result_by_its_id_and_a_second_run_changes_nothing() {
        let plugin = ToolResultFilter::new(&load_context(
            r#"{"strategy":"drop_all","placeholder":"[Omitted: call expand_message with id \"{id}\" to read it]"}"#,
        ))
        .unwrap();
        let history = plugin_testing::history(
            r#"[{"role":"user","content":"u"},
                {"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}},
                                                   {"id":"d","type":"function","function":{"name":"f","arguments":"{}"}}]},
                {"role":"tool","tool_call_id":"c","content":"a long result, longer than the placeholder that replaces it, many words"},
                {"role":"tool","tool_call_id":"d","content":"another long result, longer than the placeholder that replaces it too","metadata":{"id":"result-d"}},
                {"role":"assistant","content":"done"}]"#,
        );
        let once = plugin_testing::process(&plugin, &history, &context(200, 1)).unwrap();
        let out = history_to_string(&once.history);
        assert!(
            out.contains(r##""content":"[Omitted: call expand_message with id \"#3\" to read it]""##),
            "{out}"
        );
        assert!(
            out.contains(r#""content":"[Omitted: call expand_message with id \"result-d\" to read it]""#),
            "{out}"
        );
        let twice = plugin_testing::process(&plugin, &once.history, &context(200, 2)).unwrap();
        assert_eq!(history_to_string(&twice.history), out);
    }
}
