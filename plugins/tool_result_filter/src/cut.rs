//! `max_result_tokens`: a tool result over it is cut to its head and tail with a marker
//! line saying how much was cut, the original kept for expansion
//! (docs/plugins.md#tool_result_filter), so one huge result does not crowd out the turn.

use plugin_api::{Content, Context, Event, EventKind, Message, RArc, Role, Tokenizer};

/// Share of the kept tokens that goes to the head; the rest is the tail.
const HEAD_SHARE: f64 = 0.7;
/// Most tries at fitting the cut under the limit (each shrinks the kept text).
const FIT_TRIES: usize = 8;

/// Cuts every tool result of `history` over `max` tokens (its content, by the call's
/// tokenizer); the events say which, each a `message-compacted` with what it saved.
pub(crate) fn cut_oversized(
    history: &mut [RArc<Message>],
    events: &mut Vec<Event>,
    ctx: &Context,
    max: u64,
    keep_original: bool,
) {
    let tokenizer = ctx.model.tokenizer;
    for (index, slot) in history.iter_mut().enumerate() {
        let message = &*slot;
        if message.role != Role::Tool || message.is_expanded() || message.is_shortened() {
            continue;
        }
        // Only a result that is all text is cut: an image or another part is not text to
        // cut in the middle of.
        let Some(text) = plain_text(&message.content) else {
            continue;
        };
        let tokens = ctx.tokens().content(tokenizer, message);
        if tokens <= max {
            continue;
        }
        let Some(cut) = fit(ctx, tokenizer, &text, tokens, max) else {
            continue;
        };
        let original_length = text.chars().count() as u64;
        let copy = message.compacted_copy(cut, original_length, keep_original, |copy| {
            tokens as i64 - ctx.tokens().content(tokenizer, copy) as i64
        });
        let saved = copy
            .meta()
            .and_then(|m| m.tokens_saved.into_option())
            .unwrap_or(0);
        events.push(
            Event::new(
                EventKind::MessageCompacted,
                ctx.turn,
                format!("tool result of {tokens} tokens cut to its head and tail (max_result_tokens {max})"),
            )
            .at(index, message)
            .saving(saved),
        );
        *slot = RArc::new(copy);
    }
}

/// The content's text when every part is text.
fn plain_text(content: &Content) -> Option<String> {
    match content {
        Content::Text(text) => Some(text.to_string()),
        Content::Parts(parts) if parts.iter().all(|p| matches!(p, plugin_api::Part::Text { .. })) => {
            Some(content.text())
        }
        _ => None,
    }
}

/// The text cut to fit `max` tokens: head, marker line, tail. `None` when even the marker
/// alone does not fit.
fn fit(ctx: &Context, tokenizer: Tokenizer, text: &str, tokens: u64, max: u64) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let per_token = chars.len() as f64 / tokens.max(1) as f64;
    let mut budget = max as f64;
    for _ in 0..FIT_TRIES {
        let marker_probe = marker(chars.len(), tokens);
        let marker_tokens = ctx.tokens().text(tokenizer, &marker_probe) as f64 + 2.0;
        let keep_tokens = (budget - marker_tokens).max(0.0);
        let keep_chars = ((keep_tokens * per_token) as usize).min(chars.len());
        let head = (keep_chars as f64 * HEAD_SHARE) as usize;
        let tail = keep_chars - head;
        let head_text: String = chars[..head].iter().collect();
        let tail_text: String = chars[chars.len() - tail..].iter().collect();
        let kept = ctx.tokens().text(tokenizer, &head_text) + ctx.tokens().text(tokenizer, &tail_text);
        let cut_tokens = tokens.saturating_sub(kept);
        let line = marker(chars.len() - head - tail, cut_tokens);
        let out = format!("{head_text}\n{line}\n{tail_text}");
        if ctx.tokens().text(tokenizer, &out) <= max {
            return Some(out);
        }
        if keep_chars == 0 {
            return None;
        }
        budget *= 0.9;
    }
    None
}

/// The marker line in the middle of a cut result.
fn marker(chars_cut: usize, tokens_cut: u64) -> String {
    format!(
        "[… {tokens_cut} tokens ({chars_cut} characters) cut from the middle of this result by tool_result_filter; the original can be expanded …]"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use history_wire::chat::history_from_str;
    use plugin_testing::settings;

    #[test]
    fn a_result_over_the_limit_keeps_its_head_and_tail_and_the_original() {
        let body: String = (0..2000)
            .map(|i| format!("line {i}: value {}\n", i * 7))
            .collect();
        let history = history_from_str(&format!(
            r#"[{{"role":"user","content":"go"}},
                {{"role":"assistant","tool_calls":[{{"id":"c","type":"function","function":{{"name":"f","arguments":"{{}}"}}}}]}},
                {{"role":"tool","tool_call_id":"c","content":"{}"}}]"#,
            body.replace('\n', "\\n")
        ))
        .unwrap();
        let ctx = settings().context();
        let before = ctx.tokens().content(ctx.model.tokenizer, &history[2]);
        assert!(before > 500);
        let mut out: Vec<RArc<Message>> = history.to_vec();
        let mut events = Vec::new();
        cut_oversized(&mut out, &mut events, &ctx, 500, true);
        let cut = &out[2];
        let after = ctx.tokens().content(ctx.model.tokenizer, cut);
        assert!(after <= 500 && after > 400, "{after}");
        let text = cut.content.text();
        assert!(text.starts_with("line 0: value 0\n"), "{text}");
        assert!(text.trim_end().ends_with("line 1999: value 13993"), "{text}");
        assert!(text.contains("cut from the middle of this result"), "{text}");
        let meta = cut.meta().unwrap();
        assert!(meta.was_compacted() && meta.can_expand());
        assert_eq!(cut.restored_copy().unwrap().content.text(), body);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].kind, EventKind::MessageCompacted);
        // Under the limit: nothing changes.
        let mut again: Vec<RArc<Message>> = history.to_vec();
        cut_oversized(&mut again, &mut Vec::new(), &ctx, before, true);
        assert!(std::ptr::eq(&*again[2], &*history[2]));
    }
}
