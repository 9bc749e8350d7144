//! Reading a few members of an opaque part's compact JSON text without parsing all of it
//! (docs/wire-format.md#part-kinds): a part can hold a megabyte of base64, and counting
//! it must cost a header read. The members before the first long string are read from the
//! head, the members after it from the tail, walking backwards; the long string itself
//! (the payload) is only located, never copied.

/// A string member found: its depth (1 = a member of the part object itself), its key and
/// its raw (still escaped) value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Found<'a> {
    pub depth: usize,
    pub key: &'a str,
    pub value: &'a str,
}

/// What a scan saw: the short string members, and the long string (the payload) if any.
#[derive(Debug, Default)]
pub(crate) struct Scan<'a> {
    pub members: Vec<Found<'a>>,
    /// The long string: its key, its depth, and its raw text (between the quotes).
    pub long: Option<Found<'a>>,
    /// The walk could not make sense of the text (not compact JSON of an object).
    pub broken: bool,
}

impl<'a> Scan<'a> {
    /// The first short string member `key` at `depth`.
    pub fn get(&self, depth: usize, key: &str) -> Option<&'a str> {
        self.members
            .iter()
            .find(|f| f.depth == depth && f.key == key)
            .map(|f| f.value)
    }

    /// Member `key` at `depth`, short or the long one.
    pub fn string(&self, depth: usize, key: &str) -> Option<&'a str> {
        self.get(depth, key).or_else(|| {
            self.long
                .filter(|l| l.depth == depth && l.key == key)
                .map(|l| l.value)
        })
    }
}

/// Strings longer than this are the payload: the forward walk stops in them.
const LONG: usize = 4096;
/// How far the backward walk searches for a string's opening quote before it decides it
/// is in the long string.
const BACK_LIMIT: usize = LONG;

/// Scans `json` (a compact JSON object, as the parsers keep an opaque part).
pub(crate) fn scan(json: &str) -> Scan<'_> {
    let bytes = json.as_bytes();
    let mut out = Scan::default();
    let mut fwd = Forward {
        text: json,
        bytes,
        at: 0,
        depth: 0,
        key: None,
    };
    match fwd.walk(&mut out) {
        Ok(Stop::End) => {}
        Ok(Stop::Long { key, depth, start }) => match backward(json, start, depth, &mut out.members) {
            Some(end) => {
                out.long = Some(Found {
                    depth,
                    key,
                    value: &json[start..end],
                })
            }
            None => out.broken = true,
        },
        Err(()) => out.broken = true,
    }
    out
}

enum Stop<'a> {
    End,
    Long {
        key: &'a str,
        depth: usize,
        start: usize,
    },
}

struct Forward<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
    /// Depth of objects (arrays do not count: a member's depth is its object's).
    depth: usize,
    /// The key whose value comes next (inside an object).
    key: Option<&'a str>,
}

impl<'a> Forward<'a> {
    fn walk(&mut self, out: &mut Scan<'a>) -> Result<Stop<'a>, ()> {
        // A stack of containers: true = object.
        let mut stack: Vec<bool> = Vec::new();
        let mut expect_key = false;
        while self.at < self.bytes.len() {
            let b = self.bytes[self.at];
            match b {
                b'{' => {
                    stack.push(true);
                    self.depth += 1;
                    expect_key = true;
                    self.key = None;
                    self.at += 1;
                }
                b'[' => {
                    stack.push(false);
                    expect_key = false;
                    self.at += 1;
                }
                b'}' | b']' => {
                    self.depth -= usize::from(stack.pop() == Some(true));
                    if stack.is_empty() {
                        return Ok(Stop::End);
                    }
                    self.at += 1;
                }
                b',' => {
                    expect_key = stack.last() == Some(&true);
                    self.key = None;
                    self.at += 1;
                }
                b':' => self.at += 1,
                b'"' => {
                    let start = self.at + 1;
                    let Some(end) = string_end(self.bytes, start, LONG) else {
                        if expect_key || stack.last() != Some(&true) {
                            return Err(());
                        }
                        let key = self.key.ok_or(())?;
                        return Ok(Stop::Long {
                            key,
                            depth: self.depth,
                            start,
                        });
                    };
                    let value = &self.text[start..end];
                    self.at = end + 1;
                    if expect_key {
                        self.key = Some(value);
                        expect_key = false;
                    } else if let (Some(key), Some(true)) = (self.key, stack.last()) {
                        out.members.push(Found {
                            depth: self.depth,
                            key,
                            value,
                        });
                    }
                }
                _ => self.at += 1,
            }
        }
        Err(())
    }
}

/// The index of the quote closing the string whose text starts at `start`, looking at most
/// `limit` bytes; `None` past the limit or the end.
fn string_end(bytes: &[u8], start: usize, limit: usize) -> Option<usize> {
    let mut i = start;
    let stop = bytes.len().min(start.saturating_add(limit));
    while i < stop {
        match bytes[i] {
            b'"' => return Some(i),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    None
}

/// Walks `json` backwards from its end down to the long string that starts at
/// `long_start` (at `long_depth`), adding the short string members met, and returns the
/// index of the long string's closing quote; `None` when the tail does not make sense.
fn backward<'a>(
    json: &'a str,
    long_start: usize,
    long_depth: usize,
    out: &mut Vec<Found<'a>>,
) -> Option<usize> {
    let bytes = json.as_bytes();
    let mut i = bytes.len();
    // Depth counted from the outside in: the final `}` closes depth 1.
    let mut depth = 0usize;
    // Stack of containers met while walking back: true = object.
    let mut stack: Vec<bool> = Vec::new();
    // A string value met, whose key (the string before the `:`) comes next.
    let mut pending: Option<&'a str> = None;
    let mut after_colon = false;
    let floor = long_start;
    while i > floor {
        i -= 1;
        match bytes[i] {
            b'}' => {
                stack.push(true);
                depth += 1;
                pending = None;
            }
            b']' => {
                stack.push(false);
                pending = None;
            }
            b'{' | b'[' => {
                depth = depth.checked_sub(usize::from(stack.pop() == Some(true)))?;
            }
            b':' => after_colon = true,
            b',' => {
                pending = None;
                after_colon = false;
            }
            b'"' => {
                let end = i;
                let start = string_start(bytes, end, floor)?;
                if start == usize::MAX {
                    // No opening quote within reach: this is the long string's end.
                    return (depth == long_depth && end >= long_start).then_some(end);
                }
                let text = &json[start..end];
                i = start - 1;
                if after_colon {
                    if let (Some(value), Some(true)) = (pending.take(), stack.last()) {
                        out.push(Found {
                            depth,
                            key: text,
                            value,
                        });
                    }
                    after_colon = false;
                } else {
                    pending = Some(text);
                }
            }
            _ => {}
        }
    }
    None
}

/// The index just after the quote opening the string that ends at `end`, searching back
/// at most [`BACK_LIMIT`] bytes and never below `floor`; `usize::MAX` when none is found
/// within the limit (the long string).
fn string_start(bytes: &[u8], end: usize, floor: usize) -> Option<usize> {
    let lowest = end.saturating_sub(BACK_LIMIT).max(floor);
    let mut j = end;
    while j > lowest {
        j -= 1;
        if bytes[j] == b'"' {
            // Escaped when preceded by an odd number of backslashes.
            let slashes = bytes[..j].iter().rev().take_while(|b| **b == b'\\').count();
            if slashes % 2 == 0 {
                return Some(j + 1);
            }
        }
    }
    Some(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_parts_are_read_whole_and_long_ones_from_both_ends() {
        let short = r#"{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"low"}}"#;
        let s = scan(short);
        assert!(!s.broken);
        assert_eq!(s.get(1, "type"), Some("image_url"));
        assert_eq!(s.get(2, "url"), Some("https://x/y.png"));
        assert_eq!(s.get(2, "detail"), Some("low"));
        let data = "A".repeat(100_000);
        let long = format!(
            r#"{{"image_url":{{"url":"data:image/png;base64,{data}","detail":"high"}},"type":"image_url"}}"#
        );
        let s = scan(&long);
        assert!(!s.broken);
        assert_eq!(s.get(1, "type"), Some("image_url"));
        assert_eq!(s.get(2, "detail"), Some("high"));
        let l = s.long.unwrap();
        assert_eq!((l.depth, l.key), (2, "url"));
        assert_eq!(l.value.len(), data.len() + "data:image/png;base64,".len());
    }

    #[test]
    fn anthropic_source_members_after_the_data_are_found() {
        let data = "B".repeat(10_000);
        let json = format!(
            r#"{{"source":{{"data":"{data}","media_type":"image/png","type":"base64"}},"type":"image"}}"#
        );
        let s = scan(&json);
        assert_eq!(s.get(1, "type"), Some("image"));
        assert_eq!(s.get(2, "type"), Some("base64"));
        assert_eq!(s.get(2, "media_type"), Some("image/png"));
        assert_eq!(s.long.unwrap().value, data);
    }

    #[test]
    fn garbage_is_broken_not_a_panic() {
        for text in ["", "{", "\"", "{\"a\":\"", "}}}}", "{\"a\":[1,2,{\"b\":\"c\"}]}"] {
            let _ = scan(text);
        }
        let text = format!("{{\"a\":\"{}", "x".repeat(9000));
        assert!(scan(&text).broken);
    }
}
