//! `retention`: block retention and expiration, both driven by message metadata
//! (docs/plugins.md#retention).
//!
//! - **Block retention**: `metadata.retention_policy` has one entry per content part. A
//!   part with policy `N` lives while `N > idx`, `idx` being the message's position from
//!   the newest among the user/tool messages that carry a policy. This is how context
//!   injected for one turn (seed 000) disappears from later turns.
//! - **Expiration**: `metadata.expiration` (or per-tool defaults and overrides from the
//!   config and the session) removes or compacts a user/tool message once it is older than
//!   `turns` turns (seed 001). Compaction keeps the original for expansion (docs/plugins.md#expansion).
//!
//! Both only ever shorten or drop messages; removing a message that would break the
//! structure (a tool result, the task) leaves a placeholder instead.

use std::collections::HashMap;

use plugin_api::structure::{answered_call_refs, tool_name};
use plugin_api::{
    CompactMode, ConfigError, ConfigTable, Content, Context, Event, EventKind, Expiration, ExpirationMode,
    HistoryPlugin, LoadContext, Message, Output, RArc, ROption, RVec, Role, Tokenizer,
};

// docs/plugins.md#token_budget's default per-message overhead, as the host counts a history's tokens.
use plugin_api::DEFAULT_PER_MESSAGE_TOKENS as PER_MESSAGE_TOKENS;

/// Expiration settings, every field optional; merged field by field (docs/plugins.md#retention).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Settings {
    turns: Option<u64>,
    mode: Option<ExpirationMode>,
    compact_mode: Option<CompactMode>,
    compact_length: Option<u64>,
}

impl Settings {
    /// `self`'s fields, each falling back to `other`'s.
    fn or(self, other: Settings) -> Settings {
        Settings {
            turns: self.turns.or(other.turns),
            mode: self.mode.or(other.mode),
            compact_mode: self.compact_mode.or(other.compact_mode),
            compact_length: self.compact_length.or(other.compact_length),
        }
    }

    fn of_expiration(expiration: &Expiration) -> Settings {
        Settings {
            turns: expiration.turns.into_option(),
            mode: expiration.mode.into_option(),
            compact_mode: expiration.compact_mode.into_option(),
            compact_length: expiration.compact_length.into_option(),
        }
    }

    /// Reads `turns`, `mode`, `compact_mode`, `compact_length` from a config table.
    fn read(table: &mut ConfigTable) -> Result<Settings, ConfigError> {
        Ok(Settings {
            turns: table.u64("turns")?,
            mode: table.one_of(
                "mode",
                &[
                    ("none", ExpirationMode::None),
                    ("remove", ExpirationMode::Remove),
                    ("compact", ExpirationMode::Compact),
                ],
            )?,
            compact_mode: table.one_of(
                "compact_mode",
                &[
                    ("first_n_chars", CompactMode::FirstNChars),
                    ("ai_summary", CompactMode::AiSummary),
                ],
            )?,
            compact_length: table.u64("compact_length")?,
        })
    }
}

pub struct Retention {
    preserve_original: bool,
    placeholder: String,
    /// The notes of a compaction (`annotation`, `summary_annotation`).
    annotation: String,
    summary_annotation: String,
    /// `[plugin.retention.tools.NAME]`: defaults for the results of tool NAME.
    tools: HashMap<String, Settings>,
    /// `[plugin.retention.override]`.
    overrides: Settings,
    disable_expiration: bool,
}

/// Content tokens of a message with the model's tokenizer (cached on the message).
fn content_tokens(ctx: &Context, tokenizer: Tokenizer, message: &Message) -> i64 {
    ctx.tokens().content(tokenizer, message) as i64
}

/// What removing a whole message saves: its content and docs/plugins.md#token_budget's per-message overhead, so
/// the events add up to the token change the host reports for the plugin.
fn removed_tokens(ctx: &Context, tokenizer: Tokenizer, message: &Message) -> i64 {
    ctx.tokens().message(tokenizer, message, PER_MESSAGE_TOKENS) as i64
}

/// The note `first_n_chars` compaction appends when `annotation` is not set (seed 001's
/// words). `{shown}`, `{total}` and `{id}` stand for the characters kept, the characters
/// there were and the message's identity (docs/plugins.md#retention).
pub const DEFAULT_ANNOTATION: &str =
    "[Compacted: showing first {shown} of {total} characters. Agent can request expansion if needed.]";

/// The note an `ai_summary` compaction starts with when `summary_annotation` is not set.
pub const DEFAULT_SUMMARY_ANNOTATION: &str =
    "[AI Summary of {total} characters. Agent can request expansion if needed.]";

/// `template` with `{shown}`, `{total}` and `{id}` filled in.
fn fill(template: &str, shown: u64, total: u64, id: &str) -> String {
    template
        .replace("{shown}", &shown.to_string())
        .replace("{total}", &total.to_string())
        .replace("{id}", id)
}

/// The `first_n_chars` compaction of `text` to `length` characters with the default
/// annotation, and the characters `text` had; `None` when it is no longer than `length`.
pub fn first_n_chars(text: &str, length: u64) -> Option<(String, u64)> {
    first_n_chars_noted(text, length, DEFAULT_ANNOTATION, "")
}

/// [`first_n_chars`] with the note `annotation` for the message `id`.
pub fn first_n_chars_noted(text: &str, length: u64, annotation: &str, id: &str) -> Option<(String, u64)> {
    let total = text.chars().count() as u64;
    if total <= length {
        return None;
    }
    // Cut on a char boundary: a cut never splits a Unicode scalar value (docs/wire-format.md#messages).
    let cut = text
        .char_indices()
        .nth(length as usize)
        .map_or(text.len(), |(byte, _)| byte);
    Some((
        format!("{}...\n\n{}", &text[..cut], fill(annotation, length, total, id)),
        total,
    ))
}

/// The `ai_summary` compaction of a text of `total` characters (docs/plugins.md#retention),
/// with the default annotation.
pub fn ai_summary(summary: &str, total: u64) -> String {
    ai_summary_noted(summary, total, DEFAULT_SUMMARY_ANNOTATION, "")
}

/// [`ai_summary`] with the note `annotation` for the message `id`.
pub fn ai_summary_noted(summary: &str, total: u64, annotation: &str, id: &str) -> String {
    format!("{}\n\n{summary}", fill(annotation, 0, total, id))
}

/// What happens to one message slot of the output.
enum Slot {
    Keep(RArc<Message>),
    Removed,
}

impl Retention {
    /// A placeholder copy of `message`: content replaced, policy gone, marked `omitted` so
    /// nothing expires or replaces it again.
    fn placeholder(&self, message: &Message, tokens_saved: i64) -> Message {
        message.omitted_copy(&self.placeholder_text(message), tokens_saved, false)
    }

    /// The placeholder for `message`: `{id}` stands for its identity, the id the recall
    /// tools take (docs/mcp.md#placeholders).
    fn placeholder_text(&self, message: &Message) -> String {
        if self.placeholder.contains("{id}") {
            self.placeholder.replace("{id}", &message.identity())
        } else {
            self.placeholder.clone()
        }
    }

    /// The tokens of `message`'s placeholder.
    fn placeholder_tokens(&self, message: &Message, ctx: &Context) -> i64 {
        ctx.tokens()
            .text(ctx.model.tokenizer, &self.placeholder_text(message)) as i64
    }

    /// The expiration settings of a message, or `None` when it never expires.
    fn settings(
        &self,
        session: Option<&plugin_api::ExpirationOverride>,
        message: &Message,
        tool: Option<&str>,
    ) -> Option<Settings> {
        let own = message.meta().and_then(|m| m.expiration.as_ref().into_option());
        // The override applies to every tool message and to every message with an
        // expiration; a plain user message keeps living.
        let overridden = message.role == Role::Tool || own.is_some();
        let tool_defaults = tool
            .filter(|_| message.role == Role::Tool)
            .and_then(|name| self.tools.get(name))
            .copied()
            .unwrap_or_default();
        let own = own.map(Settings::of_expiration).unwrap_or_default();
        if !overridden {
            return Some(own.or(tool_defaults));
        }
        if self.disable_expiration || session.is_some_and(|s| s.disable_expiration) {
            return None;
        }
        // The session's override is the more specific, runtime one: it wins over the
        // operator's `[plugin.retention.override]`.
        let session = session
            .map(|s| Settings {
                turns: s.turns.into_option(),
                mode: s.mode.into_option(),
                compact_mode: s.compact_mode.into_option(),
                compact_length: s.compact_length.into_option(),
            })
            .unwrap_or_default();
        Some(session.or(self.overrides).or(own).or(tool_defaults))
    }
}

impl Retention {
    /// The compacted content of `message` (longer than `length` characters), its length
    /// in characters and how it was made, for the event; `None` when it is short enough.
    /// `ai_summary` asks the host's summarizer and falls back to the first characters,
    /// saying why in the log and the event. After one failure (`failed`) the rest of the
    /// call falls back without asking: a summarizer that is down or slow costs one
    /// `timeout_ms` per call, not one per message.
    fn compact(
        &self,
        message: &Message,
        tool: Option<&str>,
        length: u64,
        ai_summary: bool,
        failed: &mut Option<String>,
        ctx: &Context,
    ) -> Option<(String, u64, String)> {
        let text = message.content.text();
        let id = message.identity();
        let (first, total) = first_n_chars_noted(&text, length, &self.annotation, &id)?;
        let first_how = format!("compacted to the first {length} characters");
        if !ai_summary {
            return Some((first, total, first_how));
        }
        let purpose = match tool {
            Some(tool) => format!("the expired result of tool {tool}, kept for the agent's later turns"),
            None => format!(
                "an expired {} message, kept for the agent's later turns",
                message.role.as_str()
            ),
        };
        let target = usize::try_from(length).unwrap_or(usize::MAX);
        let answer = match failed {
            Some(reason) => Err(format!("{reason} (an earlier call in this turn)")),
            None => ctx.summarize(&text, target, &purpose),
        };
        match answer {
            Ok(summary) => Some((
                ai_summary_noted(&summary, total, &self.summary_annotation, &id),
                total,
                format!("summarized by the host's summarizer (ai_summary, at most {length} characters)"),
            )),
            Err(reason) => {
                ctx.log().warn(&format!(
                    "retention: ai_summary fell back to first_n_chars: {reason}"
                ));
                let how = format!("{first_how} (ai_summary failed: {reason})");
                failed.get_or_insert(reason);
                Some((first, total, how))
            }
        }
    }
}

impl HistoryPlugin for Retention {
    const NAME: &'static str = "retention";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const SUMMARY: &'static str =
        "block retention by retention_policy, then expiration (remove or compact) of old user/tool messages";
    const CONFIG_KEYS: &'static [(&'static str, &'static str)] = &[
        (
            "preserve_original",
            "keep original_content and can_expand on compaction (default true)",
        ),
        (
            "placeholder",
            "content of the placeholders it leaves (default \"[Omitted]\"); {id} stands for the message's id",
        ),
        (
            "annotation",
            "the note after a first_n_chars compaction; {shown}, {total}, {id} stand for the characters kept, the characters there were, the message's id",
        ),
        (
            "summary_annotation",
            "the note before an ai_summary compaction; {total}, {id} as for annotation",
        ),
        (
            "tools.NAME",
            "table: default turns, mode, compact_mode, compact_length for results of tool NAME",
        ),
        (
            "override",
            "table: turns, mode, compact_mode, compact_length, disable_expiration over every message",
        ),
    ];

    fn new(load: &LoadContext) -> Result<Self, ConfigError> {
        let mut config = ConfigTable::parse(&load.config_json)?;
        let preserve_original = config.bool("preserve_original")?.unwrap_or(true);
        let placeholder = config
            .string("placeholder")?
            .unwrap_or_else(|| plugin_api::DEFAULT_PLACEHOLDER.to_string());
        let annotation = config
            .string("annotation")?
            .unwrap_or_else(|| DEFAULT_ANNOTATION.to_string());
        let summary_annotation = config
            .string("summary_annotation")?
            .unwrap_or_else(|| DEFAULT_SUMMARY_ANNOTATION.to_string());
        let mut tools = HashMap::new();
        for (name, mut table) in config.tables("tools")? {
            let settings = Settings::read(&mut table)?;
            table.finish()?;
            tools.insert(name, settings);
        }
        let (overrides, disable_expiration) = match config.table("override")? {
            None => (Settings::default(), false),
            Some(mut table) => {
                let settings = Settings::read(&mut table)?;
                let disable = table.bool("disable_expiration")?.unwrap_or(false);
                table.finish()?;
                (settings, disable)
            }
        };
        config.finish()?;
        Ok(Retention {
            preserve_original,
            placeholder,
            annotation,
            summary_annotation,
            tools,
            overrides,
            disable_expiration,
        })
    }

    fn process(&self, history: &[RArc<Message>], ctx: &Context) -> Result<Output, String> {
        let tokenizer = ctx.model.tokenizer;
        let answers = answered_call_refs(history);
        // The first user message of the history is the task (docs/plugins.md#shared-trimming-rules): never removed, only
        // replaced by a placeholder, so the history still starts with the user.
        let first_user = history.iter().position(|m| m.role == Role::User);
        let mut slots: Vec<Slot> = history.iter().cloned().map(Slot::Keep).collect();
        let mut events: Vec<Event> = Vec::new();

        // Block retention, newest first: idx counts the managed messages that carry a
        // policy, a wrong-length one included.
        let mut idx: u64 = 0;
        for index in (0..history.len()).rev() {
            let message = &history[index];
            if !matches!(message.role, Role::User | Role::Tool) {
                continue;
            }
            let Some(policy) = message
                .meta()
                .and_then(|m| m.retention_policy.as_ref().into_option())
            else {
                continue;
            };
            let position = idx;
            idx += 1;
            // A placeholder is final (docs/plugins.md#retention: nothing replaces it again); it still carries
            // a policy here only if something else left one, and it still counts.
            // An expanded message was asked for on purpose: never pruned again.
            if message.meta().is_some_and(|m| m.omitted() || m.expanded()) {
                continue;
            }
            let parts = message.content.part_count();
            if policy.len() != parts {
                events.push(
                    Event::new(
                        EventKind::Warning,
                        ctx.turn,
                        format!(
                            "retention_policy has {} entries for {parts} content parts; message left unchanged",
                            policy.len()
                        ),
                    )
                    .at(index, message),
                );
                continue;
            }
            let keep: Vec<bool> = policy
                .iter()
                .map(|entry| match entry.into_option() {
                    None => true,
                    Some(n) => n > position,
                })
                .collect();
            if parts == 0 || keep.iter().all(|&k| k) {
                continue;
            }
            let before = content_tokens(ctx, tokenizer, message);
            let remaining: RVec<_> = message
                .content
                .to_parts()
                .into_iter()
                .zip(&keep)
                .filter(|(_, &k)| k)
                .map(|(part, _)| part)
                .collect();
            if remaining.is_empty() {
                if message.role == Role::User && Some(index) != first_user {
                    slots[index] = Slot::Removed;
                    events.push(
                        Event::new(
                            EventKind::MessageRemoved,
                            ctx.turn,
                            "retention_policy pruned every part; user message removed",
                        )
                        .at(index, message)
                        .saving(removed_tokens(ctx, tokenizer, message)),
                    );
                } else {
                    let saved = before - self.placeholder_tokens(message, ctx);
                    slots[index] = Slot::Keep(RArc::new(self.placeholder(message, saved)));
                    events.push(
                        Event::new(
                            EventKind::MessageOmitted,
                            ctx.turn,
                            "retention_policy pruned every part; placeholder kept",
                        )
                        .at(index, message)
                        .saving(saved),
                    );
                }
                continue;
            }
            let pruned = parts - remaining.len();
            let mut copy = (**message).clone();
            copy.content = Content::Parts(remaining);
            copy.meta_mut().retention_policy = ROption::RSome(
                policy
                    .iter()
                    .zip(&keep)
                    .filter(|(_, &k)| k)
                    .map(|(entry, _)| *entry)
                    .collect(),
            );
            let saved = before - content_tokens(ctx, tokenizer, &copy);
            events.push(
                Event::new(
                    EventKind::MessageCompacted,
                    ctx.turn,
                    format!("retention_policy pruned {pruned} of {parts} parts"),
                )
                .at(index, message)
                .saving(saved),
            );
            slots[index] = Slot::Keep(RArc::new(copy));
        }
        // Block retention's events were made newest first; report them in history order.
        events.reverse();

        // Expiration, on what block retention left.
        let session = ctx.expiration_override.as_ref().into_option();
        let mut summarizer_failed: Option<String> = None;
        for (index, slot) in slots.iter_mut().enumerate() {
            let Slot::Keep(message) = slot else { continue };
            if !matches!(message.role, Role::User | Role::Tool)
                || message.is_shortened()
                || message.is_expanded()
            {
                continue;
            }
            let tool = tool_name(history, &answers, index);
            let Some(settings) = self.settings(session, message, tool) else {
                continue;
            };
            let (Some(turns), Some(mode)) = (settings.turns, settings.mode) else {
                continue;
            };
            // Not clamped: a message from a later turn than the current one is young.
            let age = i128::from(ctx.turn) - i128::from(message.turn);
            if age <= i128::from(turns) {
                continue;
            }
            let original = &history[index];
            match mode {
                ExpirationMode::None => {}
                ExpirationMode::Remove => {
                    let before = content_tokens(ctx, tokenizer, message);
                    let reason = format!("expired: {age} turns old, turns = {turns}");
                    if message.role == Role::User && Some(index) != first_user {
                        events.push(
                            Event::new(EventKind::MessageRemoved, ctx.turn, format!("{reason}; removed"))
                                .at(index, original)
                                .saving(removed_tokens(ctx, tokenizer, message)),
                        );
                        *slot = Slot::Removed;
                    } else {
                        let saved = before - self.placeholder_tokens(message, ctx);
                        let mut copy = self.placeholder(message, saved);
                        copy.meta_mut().is_expired = ROption::RSome(true);
                        events.push(
                            Event::new(
                                EventKind::MessageExpired,
                                ctx.turn,
                                format!("{reason}; placeholder kept"),
                            )
                            .at(index, original)
                            .saving(saved),
                        );
                        *slot = Slot::Keep(RArc::new(copy));
                    }
                }
                ExpirationMode::Compact => {
                    let length = settings.compact_length.unwrap_or(500);
                    let expired = format!("expired: {age} turns old, turns = {turns}");
                    let ai_summary = settings.compact_mode == Some(CompactMode::AiSummary);
                    let compacted =
                        self.compact(message, tool, length, ai_summary, &mut summarizer_failed, ctx);
                    let Some((text, total, how)) = compacted else {
                        continue;
                    };
                    let before = content_tokens(ctx, tokenizer, message);
                    let copy = message.compacted_copy(text, total, self.preserve_original, |copy| {
                        before - content_tokens(ctx, tokenizer, copy)
                    });
                    let saved = copy.meta().map_or(0, |m| m.tokens_saved.unwrap_or(0));
                    events.push(
                        Event::new(EventKind::MessageCompacted, ctx.turn, format!("{expired}; {how}"))
                            .at(index, original)
                            .saving(saved),
                    );
                    *slot = Slot::Keep(RArc::new(copy));
                }
            }
        }

        for warning in events.iter().filter(|e| e.kind == EventKind::Warning) {
            let at = warning.index.into_option().unwrap_or_default();
            ctx.log()
                .warn(&format!("retention: message {at}: {}", warning.reason));
        }
        if events.iter().all(|e| e.kind == EventKind::Warning) {
            // Nothing changed: pass the very same messages on.
            return Ok(Output::new(history.iter().cloned(), events));
        }
        let out = slots.into_iter().filter_map(|slot| match slot {
            Slot::Keep(message) => Some(message),
            Slot::Removed => None,
        });
        Ok(Output::new(out, events))
    }
}

plugin_api::export_plugin!(Retention);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_n_chars_cuts_characters_not_bytes() {
        assert_eq!(first_n_chars("héllo", 5), None);
        let (text, total) = first_n_chars("héllo wörld", 4).unwrap();
        assert_eq!(total, 11);
        assert_eq!(
            text,
            "héll...\n\n[Compacted: showing first 4 of 11 characters. Agent can request expansion if needed.]"
        );
        let (text, _) = first_n_chars("ab", 0).unwrap();
        assert!(text.starts_with("...\n\n[Compacted: showing first 0 of 2"));
    }

    #[test]
    fn bad_config_names_the_key() {
        let err = |config: &str| {
            Retention::new(&plugin_testing::load_context(config))
                .err()
                .unwrap()
                .to_string()
        };
        assert!(err(r#"{"tools":{"search":{"mode":"later"}}}"#).starts_with("tools.search.mode:"));
        assert!(err(r#"{"tools":{"search":{"turn":2}}}"#).starts_with("tools.search.turn: unknown key"));
        assert!(err(r#"{"override":{"disable_expiration":1}}"#).starts_with("override.disable_expiration:"));
        assert!(err(r#"{"placeholder":3}"#).starts_with("placeholder:"));
        assert!(err(r#"{"tools":{"x":3}}"#).starts_with("tools.x:"));
    }

    #[test]
    fn the_annotation_and_the_placeholder_name_the_message_and_the_tool() {
        // A session's history: the tool results of turn 1 have expired by turn 5.
        let history = plugin_testing::history(
            r#"[
              {"role":"user","content":"Task: find the bug.","metadata":{"turn_added":1}},
              {"role":"assistant","content":null,"tool_calls":[
                {"id":"c1","type":"function","function":{"name":"read_log","arguments":"{}"}},
                {"id":"c2","type":"function","function":{"name":"grep","arguments":"{}"}}],
               "metadata":{"turn_added":1}},
              {"role":"tool","tool_call_id":"c1","content":"a long log line that goes on and on","metadata":{"id":"s1-3","turn_added":1}},
              {"role":"tool","tool_call_id":"c2","content":"grep output","metadata":{"turn_added":1}},
              {"role":"user","content":"And now?","metadata":{"turn_added":5}}
            ]"#,
        );
        let retention = Retention::new(&plugin_testing::load_context(
            r#"{"annotation":"[Compacted: {shown} of {total} characters shown; call expand_message with id \"{id}\" to read it]",
                "placeholder":"[Omitted: call expand_message with id \"{id}\" to read it]",
                "tools":{"read_log":{"turns":2,"mode":"compact","compact_length":6},
                         "grep":{"turns":2,"mode":"remove"}}}"#,
        ))
        .unwrap();
        let ctx = plugin_testing::settings().turn(5).context();
        let output = plugin_testing::process(&retention, &history, &ctx).unwrap();
        assert_eq!(
            output.history[2].content.text(),
            "a long...\n\n[Compacted: 6 of 35 characters shown; call expand_message with id \"s1-3\" to read it]"
        );
        // Without a metadata id, the identity is `#` and the host's number.
        assert_eq!(
            output.history[3].content.text(),
            "[Omitted: call expand_message with id \"#4\" to read it]"
        );
        // The defaults are seed 001's words.
        let plain = Retention::new(&plugin_testing::load_context(
            r#"{"tools":{"read_log":{"turns":2,"mode":"compact","compact_length":6}}}"#,
        ))
        .unwrap();
        let output = plugin_testing::process(&plain, &history, &ctx).unwrap();
        assert!(output.history[2].content.text().ends_with(
            "[Compacted: showing first 6 of 35 characters. Agent can request expansion if needed.]"
        ));
    }
}
