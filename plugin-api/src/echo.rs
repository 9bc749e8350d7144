//! Echoing text in an error or log line. What a user or a plugin supplied — a role, a key,
//! a chain entry, a plugin's error message — can hold a newline that would split the line,
//! or an escape sequence that would reach the operator's terminal, and can be megabytes
//! long. Every echo goes through these functions: control characters (and the invisible
//! characters that reorder or hide text) become `\n`, `\u{1b}`-style escapes, and the
//! echo is cut with `…`. Not part of the ABI.
//!
//! A value (a role, a key, a name: [`quoted`], [`bare`], [`json`]) is cut to
//! [`VALUE_CHARS`] characters, free text (a plugin's message: [`text`]) to
//! [`TEXT_CHARS`]; [`line`] escapes a whole line and cuts nothing.

use std::fmt::Write;

/// How many characters of a value an echo shows ([`quoted`], [`json`]).
pub const VALUE_CHARS: usize = 80;

/// How many characters of free text — a plugin's error, panic or log message — a line
/// shows ([`text`]).
pub const TEXT_CHARS: usize = 400;

/// Whether `c` is shown as an escape: control characters (C0, DEL, C1), line and
/// paragraph separators, and the zero-width and bidirectional formatting characters.
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}'
                | '\u{feff}'
        )
}

fn push_escaped(out: &mut String, c: char, quotes: bool) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '"' | '\\' if quotes => {
            out.push('\\');
            out.push(c);
        }
        c if is_unsafe(c) => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
        c => out.push(c),
    }
}

/// `text` escaped, and cut so that at most `max` characters are shown, then `…`.
fn escaped(text: &str, max: usize, quotes: bool) -> String {
    let mut out = String::with_capacity(text.len().min(max) + 2);
    let mut shown = 0;
    let mut piece = String::new();
    for c in text.chars() {
        piece.clear();
        push_escaped(&mut piece, c, quotes);
        let width = piece.chars().count();
        if shown + width > max {
            out.push('…');
            return out;
        }
        shown += width;
        out.push_str(&piece);
    }
    out
}

/// A value in quotes, as `unknown role "robot"` shows it: `"`, `\` and unsafe characters
/// escaped, cut to [`VALUE_CHARS`] characters with `…`.
///
/// ```
/// use plugin_api::echo::quoted;
/// assert_eq!(quoted("robot"), "\"robot\"");
/// assert_eq!(quoted("ro\nbot\u{1b}[31m"), r#""ro\nbot\u{1b}[31m""#);
/// assert_eq!(quoted(&"x".repeat(1000)).chars().count(), 80 + 3);
/// ```
pub fn quoted(value: &str) -> String {
    format!("\"{}\"", escaped(value, VALUE_CHARS, true))
}

/// A value without quotes (a key shown as `` `key` ``, a name after `model`): unsafe
/// characters escaped, cut to [`VALUE_CHARS`] characters with `…`.
pub fn bare(value: &str) -> String {
    escaped(value, VALUE_CHARS, false)
}

/// A JSON value as written (`found "abc"`, `found 1.5`), unsafe characters escaped, cut
/// to [`VALUE_CHARS`] characters with `…`.
pub fn json(value: &serde_json::Value) -> String {
    // Strings only need their start: never serialize a huge one whole.
    match value {
        serde_json::Value::String(s) => quoted(s),
        other => escaped(&other.to_string(), VALUE_CHARS, false),
    }
}

/// Free text (a plugin's error or log message) on one line: unsafe characters escaped,
/// quotes kept as they are, cut to [`TEXT_CHARS`] characters with `…`.
pub fn text(text: &str) -> String {
    escaped(text, TEXT_CHARS, false)
}

/// A whole line, unsafe characters escaped and nothing cut: the last guard before a line
/// is written, for what its parts did not escape (a file path, say).
pub fn line(line: &str) -> String {
    if line.chars().any(is_unsafe) {
        escaped(line, usize::MAX, false)
    } else {
        line.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_become_visible_escapes() {
        assert_eq!(quoted("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(
            text("plugin \"x\"\r\n\u{7}\u{9b}2J"),
            r#"plugin "x"\r\n\u{7}\u{9b}2J"#
        );
        assert_eq!(line("a\u{202e}b\u{2028}"), r"a\u{202e}b\u{2028}");
        assert_eq!(bare("key\"\n"), r#"key"\n"#);
        assert_eq!(
            line("plain ünïcode, quotes \" and \\"),
            "plain ünïcode, quotes \" and \\"
        );
    }

    #[test]
    fn long_values_are_cut_with_an_ellipsis() {
        let exact = "y".repeat(VALUE_CHARS);
        assert_eq!(quoted(&exact), format!("\"{exact}\""), "nothing to cut");
        let long = "y".repeat(5_000_000);
        assert_eq!(quoted(&long), format!("\"{exact}…\""));
        // An escape is never split.
        let escapes = "\u{1b}".repeat(100);
        let shown = quoted(&escapes);
        assert!(shown.ends_with("\\u{1b}…\""), "{shown}");
        assert!(shown.chars().count() <= VALUE_CHARS + 3, "{shown}");
        assert_eq!(text(&"z".repeat(10_000)).chars().count(), TEXT_CHARS + 1);
    }

    #[test]
    fn json_values_are_shown_as_written() {
        assert_eq!(json(&serde_json::json!(1.5)), "1.5");
        assert_eq!(json(&serde_json::json!("a\u{1b}")), r#""a\u{1b}""#);
        assert_eq!(json(&serde_json::json!({"k": "\u{9b}"})), r#"{"k":"\u{9b}"}"#);
        let big = serde_json::json!(vec![1; 100_000]);
        assert_eq!(json(&big).chars().count(), VALUE_CHARS + 1);
    }
}
