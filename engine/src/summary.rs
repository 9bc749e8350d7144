//! The per-turn summary log line of a chain run (`chain: 412 -> 57 messages, …`).

use std::fmt::Write;

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
}
