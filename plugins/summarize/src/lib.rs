//! `summarize`: a running summary (docs/plugins.md#summarize).
//!
//! When the history's tokens exceed `trigger_tokens`, the oldest unpinned units beyond the
//! newest `keep_tokens` (whole units, start rule) are replaced by one summary message
//! placed where they were: role `user` (or `system`), content
//! `[Summary of N earlier messages]\n\n` + the summary, `metadata.summary_of` naming the
//! messages it replaces ([`Message::identity`]: their `metadata.id`, else `#` and the
//! host's identity). An earlier summary in the replaced range is folded in, so there is
//! one summary at most and it runs forward. The summary comes from the host's summarizer
//! (`ctx.summarize`); without one, or when it fails, it is an extractive digest.

use std::hash::{Hash, Hasher};

use history_trim::Pins;
use plugin_api::structure::answered_call_refs;
use plugin_api::{
    ConfigError, ConfigTable, Content, Context, Event, EventKind, HistoryPlugin, LoadContext, Message,
    Output, RArc, ROption, RString, Role, DEFAULT_PER_MESSAGE_TOKENS,
};
use rustc_hash::FxHasher;

/// `target_chars` when the config does not set it.
pub const DEFAULT_TARGET_CHARS: u64 = 2000;
/// A tool call's arguments in the digest are cut to this many characters.
const ARGS_CHARS: usize = 80;
/// A user message's first sentence in the digest is cut to this many characters.
const SENTENCE_CHARS: usize = 200;
/// What the summarizer is asked for (its cache tells purposes apart).
const PURPOSE: &str = "running summary of the earlier conversation";

pub struct Summarize {
    trigger_tokens: Option<u64>,
    keep_tokens: Option<u64>,
    target_chars: usize,
    role: Role,
}

/// Whether `message` is a summary this plugin (or another) made.
pub fn is_summary(message: &Message) -> bool {
    message.meta().and_then(|m| m.summary_of()).is_some()
}

/// The header of a summary of `n` messages.
pub fn header(n: usize) -> String {
    format!("[Summary of {n} earlier messages]\n\n")
}

/// How many original messages a summary stands for (from its header), else 1.
fn represented(message: &Message) -> usize {
    if !is_summary(message) {
        return 1;
    }
    let text = message.content.text();
    text.strip_prefix("[Summary of ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

/// The body of a summary (its content after the header).
fn body(message: &Message) -> String {
    let text = message.content.text();
    match text.split_once("\n\n") {
        Some((head, rest)) if head.starts_with("[Summary of ") => rest.to_string(),
        _ => text,
    }
}

fn cut(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// The first sentence of `text` (up to `.`, `!` or `?` followed by a space or the end, or
/// the first line), cut to [`SENTENCE_CHARS`].
fn first_sentence(text: &str) -> String {
    let line = text.trim().lines().next().unwrap_or("").trim();
    let mut end = line.len();
    let bytes = line.as_bytes();
    for (i, c) in line.char_indices() {
        if matches!(c, '.' | '!' | '?') && bytes.get(i + 1).is_none_or(|b| b.is_ascii_whitespace()) {
            end = i + 1;
            break;
        }
    }
    cut(&line[..end], SENTENCE_CHARS)
}

/// Keeps the last lines of `lines` that fit `chars` characters (the newest matter most in
/// a summary that runs forward); `…` marks a cut.
fn newest_within(lines: &[String], chars: usize) -> String {
    let mut used = 0;
    let mut from = lines.len();
    while from > 0 {
        let next = lines[from - 1].chars().count() + 1;
        if used + next > chars {
            break;
        }
        used += next;
        from -= 1;
    }
    let mut text = lines[from..].join("\n");
    if from > 0 {
        let room = chars.saturating_sub(used + 2);
        let partial = lines[from - 1].chars().rev().take(room).collect::<Vec<_>>();
        let partial: String = partial.into_iter().rev().collect();
        text = if text.is_empty() {
            format!("…{partial}")
        } else {
            format!("…{partial}\n{text}")
        };
    }
    text
}

impl Summarize {
    fn trigger(&self, ctx: &Context) -> u64 {
        self.trigger_tokens
            .unwrap_or(ctx.model.context_tokens.saturating_mul(3) / 4)
    }

    fn keep(&self, ctx: &Context) -> u64 {
        self.keep_tokens.unwrap_or(self.trigger(ctx) / 2)
    }

    fn run(&self, history: &[RArc<Message>], ctx: &Context) -> Output {
        let tokenizer = ctx.model.tokenizer;
        let costs: Vec<u64> = history
            .iter()
            .map(|m| ctx.tokens().message(tokenizer, m, DEFAULT_PER_MESSAGE_TOKENS))
            .collect();
        let total: u64 = costs.iter().sum();
        if total <= self.trigger(ctx) {
            return Output::unchanged(history);
        }
        // Pins: the leading system messages and the first user message, never a summary
        // (a summary must stay foldable).
        let mut pinned = history_trim::pinned_messages(
            history,
            Pins {
                system: true,
                first_user: false,
            },
        );
        if let Some(task) = history
            .iter()
            .position(|m| m.role == Role::User && !is_summary(m))
        {
            pinned[task] = true;
        }
        for (flag, message) in pinned.iter_mut().zip(history) {
            if is_summary(message) {
                *flag = false;
            }
        }
        let units = history_trim::unpinned_units(history, &pinned);
        if units.len() < 2 {
            return Output::unchanged(history);
        }
        // The newest units within keep_tokens (at least the newest one).
        let keep = self.keep(ctx);
        let mut first_kept = units.len() - 1;
        let mut used: u64 = units[first_kept].iter().map(|&i| costs[i]).sum();
        while first_kept > 0 {
            let cost: u64 = units[first_kept - 1].iter().map(|&i| costs[i]).sum();
            if used + cost > keep {
                break;
            }
            used += cost;
            first_kept -= 1;
        }
        // Start rule: the kept part starts with a user message unless a user message
        // precedes it (the pinned task, or a user-role summary).
        let pinned_user = (0..history.len()).find(|&i| pinned[i] && history[i].role == Role::User);
        let user_precedes =
            |u: usize| self.role == Role::User || pinned_user.is_some_and(|p| p < units[u][0]);
        while first_kept < units.len()
            && history[units[first_kept][0]].role != Role::User
            && !user_precedes(first_kept)
        {
            first_kept += 1;
        }
        if first_kept == units.len() {
            return Output::unchanged(history);
        }
        let replaced: Vec<usize> = units[..first_kept].iter().flatten().copied().collect();
        if replaced.is_empty() || (replaced.len() == 1 && is_summary(&history[replaced[0]])) {
            return Output::unchanged(history);
        }

        let n: usize = replaced.iter().map(|&i| represented(&history[i])).sum();
        let (summary_text, how) = self.summary_text(history, &replaced, ctx);
        let ids: Vec<String> = replaced.iter().map(|&i| history[i].identity()).collect();
        let mut summary = Message::new(
            self.role,
            Content::Text(format!("{}{summary_text}", header(n)).into()),
        );
        summary.turn = history[*replaced.last().unwrap_or(&0)].turn;
        let mut hasher = FxHasher::default();
        ids.hash(&mut hasher);
        let meta = summary.meta_mut();
        meta.id = ROption::RSome(RString::from(format!("summary-{:016x}", hasher.finish())));
        meta.set_summary_of(&ids);
        let summary_tokens = ctx
            .tokens()
            .message(tokenizer, &summary, DEFAULT_PER_MESSAGE_TOKENS);
        let replaced_tokens: u64 = replaced.iter().map(|&i| costs[i]).sum();
        let saved = replaced_tokens as i64 - summary_tokens as i64;

        let mut events = Vec::new();
        for &i in &replaced {
            events.push(
                Event::new(
                    EventKind::MessageSummarized,
                    ctx.turn,
                    format!("summarized: replaced by one summary of {n} earlier messages ({how})"),
                )
                .at(i, &history[i])
                .saving(costs[i] as i64),
            );
        }
        ctx.log().info(&format!(
            "summarize: {} messages ({n} originally) replaced by one summary, {saved} tokens saved ({how})",
            replaced.len()
        ));
        let first = replaced[0];
        let mut is_replaced = vec![false; history.len()];
        for &i in &replaced {
            is_replaced[i] = true;
        }
        let mut out = Vec::with_capacity(history.len() - replaced.len() + 1);
        let mut summary = Some(RArc::new(summary));
        for (i, message) in history.iter().enumerate() {
            if i == first {
                out.extend(summary.take());
            }
            if !is_replaced[i] {
                out.push(message.clone());
            }
        }
        Output::new(out, events)
    }

    /// The summary's body: the host's summarizer's answer, or the extractive digest with
    /// the reason the summarizer gave.
    fn summary_text(&self, history: &[RArc<Message>], replaced: &[usize], ctx: &Context) -> (String, String) {
        let mut transcript = String::new();
        for &i in replaced {
            let m = &history[i];
            if is_summary(m) {
                transcript.push_str(&format!("(earlier summary) {}\n", body(m)));
                continue;
            }
            transcript.push_str(&format!("{}: {}\n", m.role.as_str(), m.content.text()));
            for call in m.tool_calls.iter() {
                transcript.push_str(&format!("  call {}({})\n", call.name, call.arguments));
            }
        }
        match ctx.summarize(&transcript, self.target_chars, PURPOSE) {
            Ok(text) => (cut(&text, self.target_chars), "summarizer".into()),
            Err(reason) => (
                self.digest(history, replaced),
                format!("extractive digest: {}", cut(&reason, 120)),
            ),
        }
    }

    /// Per replaced user message its first sentence, per tool call
    /// `name(args cut to 80 chars) → first line of its result`, an earlier summary's body
    /// first; the newest lines within `target_chars`.
    fn digest(&self, history: &[RArc<Message>], replaced: &[usize]) -> String {
        let refs = answered_call_refs(history);
        let mut lines = Vec::new();
        for &i in replaced {
            let m = &history[i];
            if is_summary(m) {
                lines.extend(body(m).lines().map(str::to_string));
            } else if m.role == Role::User {
                lines.push(format!("user: {}", first_sentence(&m.content.text())));
            } else if m.has_tool_calls() {
                for (c, call) in m.tool_calls.iter().enumerate() {
                    let result = replaced
                        .iter()
                        .find(|&&r| refs[r].is_some_and(|at| at.message == i && at.call == c))
                        .map(|&r| history[r].content.text())
                        .map(|t| cut(t.trim().lines().next().unwrap_or(""), SENTENCE_CHARS))
                        .unwrap_or_else(|| "(no result)".into());
                    lines.push(format!(
                        "{}({}) → {result}",
                        call.name,
                        cut(call.arguments.as_str(), ARGS_CHARS)
                    ));
                }
            }
        }
        newest_within(&lines, self.target_chars)
    }
}

impl HistoryPlugin for Summarize {
    const NAME: &'static str = "summarize";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const SUMMARY: &'static str =
        "running summary: over trigger_tokens, the oldest units beyond keep_tokens become one summary message";
    const CONFIG_KEYS: &'static [(&'static str, &'static str)] = &[
        (
            "trigger_tokens",
            "summarize when the history is over this many tokens (default: 3/4 of the model's context_tokens)",
        ),
        (
            "keep_tokens",
            "the newest units within this many tokens stay as they are (default: half of trigger_tokens)",
        ),
        (
            "target_chars",
            "the summary's length in characters (default 2000)",
        ),
        ("role", "user | system: the summary message's role (default user)"),
    ];

    fn new(load: &LoadContext) -> Result<Self, ConfigError> {
        let mut config = ConfigTable::parse(&load.config_json)?;
        let trigger_tokens = config.positive("trigger_tokens")?;
        let keep_tokens = config.u64("keep_tokens")?;
        let target_chars = config.positive("target_chars")?.unwrap_or(DEFAULT_TARGET_CHARS);
        let role = config
            .one_of("role", &[("user", Role::User), ("system", Role::System)])?
            .unwrap_or(Role::User);
        if let (Some(trigger), Some(keep)) = (trigger_tokens, keep_tokens) {
            if keep >= trigger {
                return Err(config.invalid(
                    "keep_tokens",
                    format!("{keep} is not below trigger_tokens ({trigger})"),
                ));
            }
        }
        config.finish()?;
        Ok(Summarize {
            trigger_tokens,
            keep_tokens,
            target_chars: usize::try_from(target_chars).unwrap_or(usize::MAX),
            role,
        })
    }

    fn process(&self, history: &[RArc<Message>], ctx: &Context) -> Result<Output, String> {
        Ok(self.run(history, ctx))
    }
}

plugin_api::export_plugin!(Summarize);
