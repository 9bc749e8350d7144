//! Surgery on a TOML array of plugin names (`chain`, `view`) that keeps its layout: a
//! one-line array stays on one line; one entry per line keeps its indentation, its
//! trailing comma or not, and the comments around entries (a moved entry takes its
//! same-line comment along; a removed entry's comment lines above it stay).

use toml_edit::{Array, RawString, Value};

/// How a chain array is laid out, taken before an edit.
pub(super) struct Layout {
    /// One entry per line (at least one line break between entries or before `]`).
    multiline: bool,
    /// The indentation of an entry on its own line.
    indent: String,
    /// What separates entries on one line (after the comma).
    separator: String,
    /// The entries are 'literal strings'.
    literal: bool,
}

fn raw(text: Option<&RawString>) -> String {
    text.and_then(RawString::as_str).unwrap_or("").to_string()
}

fn prefix(array: &Array, index: usize) -> String {
    array
        .get(index)
        .map(|v| raw(v.decor().prefix()))
        .unwrap_or_default()
}

fn suffix(array: &Array, index: usize) -> String {
    array
        .get(index)
        .map(|v| raw(v.decor().suffix()))
        .unwrap_or_default()
}

fn set_prefix(array: &mut Array, index: usize, text: String) {
    if let Some(value) = array.get_mut(index) {
        value.decor_mut().set_prefix(text);
    }
}

fn set_suffix(array: &mut Array, index: usize, text: String) {
    if let Some(value) = array.get_mut(index) {
        value.decor_mut().set_suffix(text);
    }
}

impl Layout {
    pub(super) fn of(array: &Array) -> Layout {
        let prefixes: Vec<String> = (0..array.len()).map(|i| prefix(array, i)).collect();
        let last_suffix = array
            .len()
            .checked_sub(1)
            .map(|i| suffix(array, i))
            .unwrap_or_default();
        let trailing = raw(Some(array.trailing()));
        let multiline = prefixes.iter().any(|p| p.contains('\n'))
            || trailing.contains('\n')
            || last_suffix.contains('\n');
        let indent = prefixes
            .iter()
            .rev()
            .find_map(|p| p.rfind('\n').map(|i| p[i + 1..].to_string()))
            .unwrap_or_else(|| "    ".to_string());
        let separator = prefixes
            .iter()
            .skip(1)
            .find(|p| !p.contains('\n'))
            .cloned()
            .unwrap_or_else(|| " ".to_string());
        let literal = match array.get(0) {
            Some(Value::String(s)) => s
                .as_repr()
                .and_then(|r| r.as_raw().as_str())
                .is_some_and(|raw| raw.starts_with('\'')),
            _ => false,
        };
        Layout {
            multiline,
            indent,
            separator,
            literal,
        }
    }
}

/// Splits a gap between entries into the rest of the current line (a comment trailing
/// the entry before, without the line ending) and the remainder from the line ending.
fn split_first_line(gap: &str) -> (&str, &str) {
    match gap.find('\n') {
        Some(i) => {
            let end = if i > 0 && gap.as_bytes()[i - 1] == b'\r' {
                i - 1
            } else {
                i
            };
            (&gap[..end], &gap[end..])
        }
        None => (gap, ""),
    }
}

/// `text` without its last line (from its last line ending on).
fn before_last_line(text: &str) -> &str {
    match text.rfind('\n') {
        Some(i) if i > 0 && text.as_bytes()[i - 1] == b'\r' => &text[..i - 1],
        Some(i) => &text[..i],
        None => "",
    }
}

/// Makes sure a same-line comment is followed by a line ending.
fn after_comment(comment: &str, rest: &str, newline: &str, indent: &str) -> String {
    if comment.trim().is_empty() || rest.starts_with('\n') || rest.starts_with("\r\n") {
        format!("{comment}{rest}")
    } else {
        format!("{comment}{newline}{indent}{rest}")
    }
}

/// Inserts `name` at `index` in a plugin list, laid out like its neighbours; `comment` is
/// a same-line comment that travels with a moved entry.
pub(super) fn insert_entry(
    array: &mut Array,
    index: usize,
    name: &str,
    comment: &str,
    layout: &Layout,
    newline: &str,
) {
    // Quoted like the other entries: 'literal' or "basic" (names need no escaping).
    let mut value = if layout.literal {
        format!("'{name}'").parse().unwrap_or_else(|_| Value::from(name))
    } else {
        Value::from(name)
    };
    if array.is_empty() {
        value.decor_mut().set_prefix("");
        value.decor_mut().set_suffix("");
        array.push_formatted(value);
    } else if index == 0 && !prefix(array, 0).contains('\n') {
        // A new first entry on a one-line list: the old first one moves behind a separator.
        value.decor_mut().set_prefix(prefix(array, 0));
        value.decor_mut().set_suffix("");
        set_prefix(array, 0, layout.separator.clone());
        array.insert_formatted(0, value);
    } else if index < array.len() {
        // The entry now at `index` gives up the start of its gap: the comment trailing the
        // entry before stays on that entry's line; the new entry gets its own line.
        let gap = prefix(array, index);
        let (first, rest) = split_first_line(&gap);
        if gap.contains('\n') {
            value
                .decor_mut()
                .set_prefix(format!("{first}{newline}{}", layout.indent));
            set_prefix(
                array,
                index,
                after_comment(comment, rest, newline, &layout.indent),
            );
        } else {
            value.decor_mut().set_prefix(gap.clone());
            if !comment.trim().is_empty() {
                set_prefix(array, index, format!("{comment}{newline}{}{gap}", layout.indent));
            }
        }
        value.decor_mut().set_suffix("");
        array.insert_formatted(index, value);
    } else {
        // Appending: the gap after the last entry (before `]`, or after the trailing comma)
        // keeps its first line with the old last entry and closes the array after the new one.
        let last = array.len() - 1;
        let trailing_comma = array.trailing_comma();
        let gap = if trailing_comma {
            raw(Some(array.trailing()))
        } else {
            suffix(array, last)
        };
        let (first, rest) = split_first_line(&gap);
        let (new_prefix, after) = if gap.contains('\n') {
            (format!("{first}{newline}{}", layout.indent), rest.to_string())
        } else if layout.multiline {
            (format!("{newline}{}", layout.indent), gap.clone())
        } else {
            (layout.separator.clone(), gap.clone())
        };
        let after = after_comment(comment, &after, newline, "");
        value.decor_mut().set_prefix(new_prefix);
        if trailing_comma {
            value.decor_mut().set_suffix("");
            array.set_trailing(after);
        } else {
            set_suffix(array, last, String::new());
            value.decor_mut().set_suffix(after);
        }
        array.push_formatted(value);
    }
}

/// Removes the entry at `index` with its line, keeping the comment that trails the
/// entry before it and any comment lines above it. Returns the removed entry's own
/// same-line comment (for a move).
pub(super) fn remove_entry(array: &mut Array, index: usize) -> String {
    if array.len() == 1 {
        // The list becomes empty: `[]`, whatever its layout was.
        let own_comment = split_first_line(&suffix(array, 0)).0.to_string();
        array.clear();
        array.set_trailing("");
        array.set_trailing_comma(false);
        return own_comment;
    }
    let gap = prefix(array, index);
    let (first, rest) = split_first_line(&gap);
    let kept_before = if gap.contains('\n') {
        format!("{first}{}", before_last_line(rest))
    } else {
        String::new()
    };
    let last = array.len() - 1;
    let own_comment;
    if index < last {
        let next = prefix(array, index + 1);
        let (next_first, next_rest) = split_first_line(&next);
        let new_next = if next.contains('\n') {
            own_comment = next_first.to_string();
            format!("{kept_before}{next_rest}")
        } else {
            own_comment = String::new();
            gap.clone()
        };
        set_prefix(array, index + 1, new_next);
    } else {
        let trailing_comma = array.trailing_comma();
        let after_gap = if trailing_comma {
            raw(Some(array.trailing()))
        } else {
            suffix(array, index)
        };
        let (gap_first, gap_rest) = split_first_line(&after_gap);
        let after = if after_gap.contains('\n') {
            own_comment = gap_first.to_string();
            gap_rest.to_string()
        } else {
            own_comment = String::new();
            after_gap.clone()
        };
        if trailing_comma {
            array.set_trailing(format!("{kept_before}{after}"));
        } else {
            let previous = suffix(array, index - 1);
            set_suffix(array, index - 1, format!("{previous}{kept_before}{after}"));
        }
    }
    array.remove(index);
    own_comment
}
