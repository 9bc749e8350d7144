//! `o200k_base`'s splitting pattern worked by hand for ASCII text: most of what a session
//! counts is ASCII, and the `regex` engine spends hundreds of instructions setting up each
//! anchored search for a piece of five bytes on average (docs/sessions.md#performance).
//! [`o200k_piece`] gives the end of the piece starting at a position exactly as the
//! pattern of [`super::bpe`] (leftmost-first, greedy, with the `\s+(?!\S)` look-ahead
//! done by `lookahead_end`) would, or `None` as soon as a byte it would have to look at
//! is not ASCII: a letter, digit, mark or space beyond ASCII could change the piece, so
//! the regex decides those. The branches, in the pattern's order:
//!
//! 1. `[^\r\n\p{L}\p{N}]?[\p{Lu}…]*[\p{Ll}…]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`
//! 2. `[^\r\n\p{L}\p{N}]?[\p{Lu}…]+[\p{Ll}…]*(?i:'s|…)?`
//! 3. `\p{N}{1,3}`
//! 4. ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
//! 5. `\s*[\r\n]+`
//! 6. `\s+` (then the look-ahead gives back a run's last space before a non-space)
//!
//! `tests` compare it with the regex on random text over an alphabet of the characters
//! each branch turns on, ASCII and not.

/// ASCII whitespace as `\s` (Unicode `White_Space`) has it: tab, line feed, vertical tab,
/// form feed, carriage return, space.
fn space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ')
}

fn line_break(b: u8) -> bool {
    matches!(b, b'\r' | b'\n')
}

/// `[^\r\n\p{L}\p{N}]` for an ASCII byte.
fn prefix(b: u8) -> bool {
    !line_break(b) && !b.is_ascii_alphanumeric()
}

/// `[^\s\p{L}\p{N}]` for an ASCII byte.
fn symbol(b: u8) -> bool {
    !space(b) && !b.is_ascii_alphanumeric()
}

/// The end of the run from `at` of bytes in `class`, or `None` when it stops at a byte
/// that is not ASCII.
fn run(text: &[u8], at: usize, class: impl Fn(u8) -> bool) -> Option<usize> {
    let mut end = at;
    while end < text.len() && text[end].is_ascii() && class(text[end]) {
        end += 1;
    }
    match text.get(end) {
        Some(b) if !b.is_ascii() => None,
        _ => Some(end),
    }
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)?` at `at`: its length, or `None` where a byte it looks
/// at is not ASCII.
fn contraction(text: &[u8], at: usize) -> Option<usize> {
    let byte = |i: usize| text.get(at + i).copied();
    if byte(0) != Some(b'\'') {
        return Some(0);
    }
    let Some(first) = byte(1) else { return Some(0) };
    if !first.is_ascii() {
        return None;
    }
    let second = |want: u8| match byte(2) {
        Some(b) if !b.is_ascii() => None,
        Some(b) if b.to_ascii_lowercase() == want => Some(3),
        _ => Some(0),
    };
    match first.to_ascii_lowercase() {
        b's' | b't' | b'm' | b'd' => Some(2),
        b'r' | b'v' => second(b'e'),
        b'l' => second(b'l'),
        _ => Some(0),
    }
}

/// The end of `o200k_base`'s piece that starts at `start` (a character boundary before
/// the end of `text`), look-ahead done; `None`: the regex must decide.
#[inline]
pub(crate) fn o200k_piece(text: &[u8], start: usize) -> Option<usize> {
    let first = text[start];
    if !first.is_ascii() {
        return None;
    }
    // Branches 1 and 2: letters after at most one prefix character.
    let letters = if prefix(first) { start + 1 } else { start };
    if letters < text.len() || letters == start {
        let upper = run(text, letters, |b| b.is_ascii_uppercase())?;
        let lower = run(text, upper, |b| b.is_ascii_lowercase())?;
        // Branch 1 needs a lowercase letter, branch 2 an uppercase one.
        if lower > upper || upper > letters {
            return Some(lower + contraction(text, lower)?);
        }
    }
    // Branch 3.
    if first.is_ascii_digit() {
        let mut end = start + 1;
        while end < text.len() && end < start + 3 && text[end].is_ascii_digit() {
            end += 1;
        }
        return match text.get(end) {
            Some(b) if !b.is_ascii() && end < start + 3 => None,
            _ => Some(end),
        };
    }
    // Branch 4.
    let symbols = if first == b' ' { start + 1 } else { start };
    if symbols < text.len() && text[symbols].is_ascii() && symbol(text[symbols]) {
        let end = run(text, symbols, symbol)?;
        let mut end = end;
        while end < text.len() && matches!(text[end], b'\r' | b'\n' | b'/') {
            end += 1;
        }
        return Some(end);
    }
    if symbols < text.len() && !text[symbols].is_ascii() {
        return None;
    }
    // Branches 5 and 6: `first` is whitespace here (every other ASCII byte started a
    // piece above).
    let spaces = run(text, start, space)?;
    if let Some(last) = text[start..spaces].iter().rposition(|b| line_break(*b)) {
        return Some(start + last + 1);
    }
    // The look-ahead: a run of two or more gives back its last space before a
    // non-space (the byte after the run is ASCII: `run` said so).
    if spaces - start >= 2 && spaces < text.len() {
        Some(spaces - 1)
    } else {
        Some(spaces)
    }
}
