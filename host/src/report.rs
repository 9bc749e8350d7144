//! Human-readable reports of a chain run: the per-turn summary log line (SPEC §4.5) and
//! `--explain` (SPEC §6.1).

use std::fmt::Write;

use plugin_api::{Event, Message, RArc};

use crate::chain::ChainRun;

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn signed(delta: i64) -> String {
    let sign = if delta < 0 { "-" } else { "+" };
    format!("{sign}{}", thousands(delta.unsigned_abs()))
}

/// `chain: 412 -> 57 messages, 96,120 -> 7,840 tokens (token_budget -80,210; tool_result_filter -8,070)`
pub fn summary_line(run: &ChainRun) -> String {
    let mut line = format!(
        "chain: {} -> {} messages, {} -> {} tokens",
        run.messages_in,
        run.history.len(),
        thousands(run.tokens_in),
        thousands(run.tokens_out)
    );
    let changes: Vec<String> = run
        .stages
        .iter()
        .filter(|s| s.tokens_out != s.tokens_in)
        .map(|s| {
            format!(
                "{} {}",
                s.plugin,
                signed(s.tokens_out as i64 - s.tokens_in as i64)
            )
        })
        .collect();
    if !changes.is_empty() {
        let _ = write!(line, " ({})", changes.join("; "));
    }
    let skipped: Vec<&str> = run
        .stages
        .iter()
        .filter(|s| s.skipped.is_some())
        .map(|s| s.plugin.as_str())
        .collect();
    if !skipped.is_empty() {
        let _ = write!(line, " [skipped: {}]", skipped.join(", "));
    }
    line
}

/// `prefix_kept` (§5.2): the index of the first message of `history` whose bytes (compact
/// JSON, [`plugin_api::wire::message_to_string`]) differ from `previous` (the previous
/// output, already serialized). A message past either end differs; two equal histories
/// give their length.
pub fn prefix_kept(previous: &[String], history: &[RArc<Message>]) -> usize {
    history
        .iter()
        .zip(previous)
        .take_while(|(message, bytes)| plugin_api::wire::message_to_string(message) == **bytes)
        .count()
}

fn prefix_line(kept: usize, len: usize) -> String {
    if kept == len {
        format!("prefix_kept {kept}: all {len} messages as in the previous output")
    } else {
        format!("prefix_kept {kept}: first difference from the previous output at message {kept}")
    }
}

/// Groups runs of events of the same kind and reason: one line per group.
fn event_lines(events: &[Event]) -> Vec<String> {
    let mut lines = Vec::new();
    let mut i = 0;
    while i < events.len() {
        let first = &events[i];
        let mut j = i + 1;
        while j < events.len() && events[j].kind == first.kind && events[j].reason == first.reason {
            j += 1;
        }
        let group = &events[i..j];
        let saved: i64 = group.iter().filter_map(|e| e.tokens_saved.into_option()).sum();
        let mut line = first.kind.as_str().to_string();
        if group.len() > 1 {
            let _ = write!(line, " ×{}", group.len());
        }
        let indices: Vec<u64> = group.iter().filter_map(|e| e.index.into_option()).collect();
        match indices.as_slice() {
            [] => {}
            [one] => {
                let _ = write!(line, " at message {one}");
                if let Some(id) = first.id.as_ref().into_option() {
                    let _ = write!(line, " (id {id})");
                }
            }
            [first_index, .., last_index] => {
                let _ = write!(line, " at messages {first_index}..={last_index}");
            }
        }
        if group.iter().any(|e| e.tokens_saved.is_some()) {
            let _ = write!(line, ", {} tokens saved", thousands(saved.max(0) as u64));
        }
        let _ = write!(line, ": {}", first.reason);
        lines.push(line);
        i = j;
    }
    lines
}

/// The `--explain` report: per plugin, messages and tokens in and out, and its events.
pub fn explain(run: &ChainRun, model: &str, tokenizer: &str, turn: u64, effective_ctx: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "input: {} messages, {} tokens ({tokenizer}); model {model}, turn {turn}, effective_ctx {effective_ctx}",
        run.messages_in,
        thousands(run.tokens_in)
    );
    for fault in &run.input_faults {
        let _ = writeln!(out, "  structural fault in the input: {fault}");
    }
    for stage in &run.stages {
        let _ = writeln!(
            out,
            "{:<20} {:>6} -> {:<6} messages {:>10} -> {:<10} tokens {:>8.2} ms",
            stage.plugin,
            stage.messages_in,
            stage.messages_out,
            thousands(stage.tokens_in),
            thousands(stage.tokens_out),
            stage.elapsed.as_secs_f64() * 1000.0
        );
        if let Some(kept) = stage.prefix_kept {
            let _ = writeln!(out, "  {}", prefix_line(kept, stage.messages_out));
        }
        if let Some(why) = &stage.skipped {
            let _ = writeln!(out, "  skipped (history passed on unchanged): {why}");
        }
        for line in event_lines(&stage.events) {
            let _ = writeln!(out, "  {line}");
        }
    }
    let _ = writeln!(
        out,
        "output: {} messages, {} tokens",
        run.history.len(),
        thousands(run.tokens_out)
    );
    if let Some(kept) = run.prefix_kept {
        let _ = writeln!(out, "  {}", prefix_line(kept, run.history.len()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_get_thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(96120), "96,120");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(signed(-80210), "-80,210");
    }

    #[test]
    fn prefix_kept_is_the_first_index_whose_bytes_differ() {
        let history = plugin_api::wire::history_from_str(
            r#"[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]"#,
        )
        .unwrap();
        let bytes: Vec<String> = history
            .iter()
            .map(|m| plugin_api::wire::message_to_string(m))
            .collect();
        assert_eq!(prefix_kept(&bytes, &history), 3);
        assert_eq!(
            prefix_kept(&bytes[..2], &history),
            2,
            "new messages after the previous ones"
        );
        assert_eq!(prefix_kept(&bytes, &history[..1]), 1, "the output is shorter");
        let mut changed = bytes.clone();
        changed[1] = r#"{"role":"assistant","content":"B"}"#.to_string();
        assert_eq!(prefix_kept(&changed, &history), 1);
        assert_eq!(prefix_kept(&[], &history), 0);
    }
}
