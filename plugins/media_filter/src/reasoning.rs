//! `keep_thinking_turns`: the reasoning of older assistant turns cleared, like Anthropic's
//! `clear_thinking` (docs/plugins.md#media_filter). Never the reasoning of the current tool
//! loop: Anthropic requires its thinking block, signature intact, while the loop goes on.

use std::collections::BTreeSet;

use plugin_api::parts::{PartKind, REASONING_MEMBERS};
use plugin_api::{Content, Context, Event, EventKind, Message, Part, RArc, ROption, Role};

/// Whether a message carries reasoning: a reasoning part or a reasoning member.
fn has_reasoning(message: &Message) -> bool {
    message.role == Role::Assistant
        && (message
            .content
            .to_parts()
            .iter()
            .any(|p| p.kind() == PartKind::Reasoning)
            || message
                .extra
                .iter()
                .any(|m| REASONING_MEMBERS.contains(&m.key.as_str())))
}

/// Index of the first message of the current tool loop: the messages after the last
/// user message (an assistant's calls and their results, the model's turn going on).
fn current_loop_start(history: &[RArc<Message>]) -> usize {
    history
        .iter()
        .rposition(|m| m.role == Role::User)
        .map_or(0, |i| i + 1)
}

/// Clears the reasoning of assistant messages older than the newest `keep` turns that
/// have any; `keep = None` keeps all.
pub(crate) fn clear(
    out: &mut [RArc<Message>],
    events: &mut Vec<Event>,
    ctx: &Context,
    keep: usize,
    keep_original: bool,
) {
    let open = current_loop_start(out);
    // A turn: a user message and what follows it, counted here from the user messages
    // (the same on every call, whatever the host's turn numbers).
    let turn_of: Vec<usize> = out
        .iter()
        .scan(0usize, |turn, m| {
            *turn += usize::from(m.role == Role::User);
            Some(*turn)
        })
        .collect();
    let turns: BTreeSet<usize> = (0..out.len())
        .filter(|&i| has_reasoning(&out[i]))
        .map(|i| turn_of[i])
        .collect();
    let kept: BTreeSet<usize> = turns.iter().rev().take(keep).copied().collect();
    for index in 0..open.min(out.len()) {
        let message = &out[index];
        if !has_reasoning(message) || kept.contains(&turn_of[index]) || message.is_expanded() {
            continue;
        }
        let mut copy = (**message).clone();
        if let Content::Parts(parts) = &message.content {
            let rest: Vec<Part> = parts
                .iter()
                .filter(|p| p.kind() != PartKind::Reasoning)
                .cloned()
                .collect();
            copy.content = if !rest.is_empty() {
                Content::Parts(rest.into())
            } else if message.has_tool_calls() {
                Content::Null
            } else {
                Content::Text("[reasoning cleared]".into())
            };
        }
        copy.extra
            .retain(|m| !REASONING_MEMBERS.contains(&m.key.as_str()));
        let tokenizer = ctx.model.tokenizer;
        let saved =
            ctx.tokens().content(tokenizer, message) as i64 - ctx.tokens().content(tokenizer, &copy) as i64;
        let meta = copy.meta_mut();
        meta.tokens_saved = ROption::RSome(saved);
        meta.retention_policy = ROption::RNone;
        if keep_original && copy.content != message.content {
            let meta = copy.meta_mut();
            meta.can_expand = ROption::RSome(true);
            if meta.original_content.is_none() {
                meta.original_content = ROption::RSome(message.content.clone());
            }
        }
        events.push(
            Event::new(
                EventKind::MessageChanged,
                ctx.turn,
                "reasoning of an older turn cleared (keep_thinking_turns)",
            )
            .at(index, message)
            .saving(saved),
        );
        out[index] = RArc::new(copy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_testing as testing;

    #[test]
    fn older_reasoning_goes_the_current_loops_block_stays_byte_for_byte() {
        let thinking = |t: &str| format!(r#"{{"type":"thinking","thinking":"{t}","signature":"sig-{t}"}}"#);
        let history = testing::history(&format!(
            r#"[{{"role":"user","content":"one"}},
                {{"role":"assistant","content":"a1","reasoning_content":"old reasoning"}},
                {{"role":"user","content":"two"}},
                {{"role":"assistant","content":[{},{{"type":"text","text":"a2"}}]}},
                {{"role":"user","content":"three"}},
                {{"role":"assistant","content":[{}],"tool_calls":[{{"id":"c","type":"function","function":{{"name":"f","arguments":"{{}}"}}}}]}},
                {{"role":"tool","tool_call_id":"c","content":"r"}}]"#,
            thinking("t2"),
            thinking("t3")
        ));
        let ctx = testing::settings().context();
        let mut out = history.clone();
        let mut events = Vec::new();
        clear(&mut out, &mut events, &ctx, 0, true);
        testing::check(&history, &out).unwrap();
        assert!(out[1].extra.iter().all(|m| m.key.as_str() != "reasoning_content"));
        assert_eq!(out[3].content.text(), "a2");
        assert!(
            std::ptr::eq(&*out[5], &*history[5]),
            "the open tool loop's block untouched"
        );
        assert_eq!(events.len(), 2);
        // keep 2: the open loop's turn and the one before keep theirs.
        let mut out = history.clone();
        clear(&mut out, &mut Vec::new(), &ctx, 2, true);
        assert!(
            std::ptr::eq(&*out[3], &*history[3]),
            "the two newest turns keep theirs"
        );
        assert!(!std::ptr::eq(&*out[1], &*history[1]));
    }
}
