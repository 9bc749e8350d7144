//! `--explain`: per stage, messages and tokens in and out, time, `prefix_kept` and the
//! stage's events, grouped.

use std::fmt::Write;

use history_engine::echo;
use history_engine::summary::thousands;
use history_engine::ChainRun;
use plugin_api::Event;

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
                    let _ = write!(line, " (id {})", echo::bare(id));
                }
            }
            [first_index, .., last_index] => {
                let _ = write!(line, " at messages {first_index}..={last_index}");
            }
        }
        if group.iter().any(|e| e.tokens_saved.is_some()) {
            let _ = write!(line, ", {} tokens saved", thousands(saved.max(0) as u64));
        }
        let _ = write!(line, ": {}", echo::text(&first.reason));
        lines.push(line);
        i = j;
    }
    lines
}

/// The input's pinned messages, by position: `pinned[i]` when `default`'s pins keep
/// message `i` (docs/plugins.md#default).
fn pinned_line(pinned: &[bool]) -> Option<String> {
    let positions: Vec<String> = pinned
        .iter()
        .enumerate()
        .filter(|(_, &p)| p)
        .map(|(i, _)| i.to_string())
        .collect();
    match positions.as_slice() {
        [] => None,
        [one] => Some(format!(
            "pinned: message {one} (kept, and not counted against effective_ctx)"
        )),
        many => Some(format!(
            "pinned: messages {} (kept, and not counted against effective_ctx)",
            many.join(", ")
        )),
    }
}

/// The `--explain` report: per plugin, messages and tokens in and out, and its events.
/// `pinned` marks the input messages `default` pins.
pub fn explain(
    run: &ChainRun,
    model: &str,
    tokenizer: &str,
    turn: u64,
    effective_ctx: u64,
    pinned: &[bool],
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "input: {} messages, {} tokens ({tokenizer}); model {}, turn {turn}, effective_ctx {effective_ctx} (unpinned messages)",
        run.messages_in,
        thousands(run.tokens_in),
        echo::bare(model)
    );
    if let Some(line) = pinned_line(pinned) {
        let _ = writeln!(out, "  {line}");
    }
    let _ = writeln!(
        out,
        "  (\"at message N\" below is a position in the input of the plugin on that line, not in this input)"
    );
    for fault in &run.input_faults {
        let _ = writeln!(out, "  structural fault in the input: {fault}");
    }
    for line in event_lines(&run.host_events) {
        let _ = writeln!(out, "  host: {line}");
    }
    for (index, stage) in run.stages.iter().enumerate() {
        if index == 0 && stage.ingest {
            let _ = writeln!(
                out,
                "ingest: the stages below ran on the entering messages before anything was stored"
            );
        }
        if !stage.ingest && index > 0 && run.stages[index - 1].ingest {
            let _ = writeln!(out, "chain:");
        }
        if stage.view && (index == 0 || !run.stages[index - 1].view) {
            let _ = writeln!(
                out,
                "working history: {} messages (kept); the view stages below change only what is sent",
                run.working.len()
            );
        }
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
    fn pinned_messages_are_named_as_not_counted() {
        assert_eq!(pinned_line(&[false, false]), None);
        assert_eq!(
            pinned_line(&[true, false]).unwrap(),
            "pinned: message 0 (kept, and not counted against effective_ctx)"
        );
        assert_eq!(
            pinned_line(&[true, true, false]).unwrap(),
            "pinned: messages 0, 1 (kept, and not counted against effective_ctx)"
        );
    }
}
