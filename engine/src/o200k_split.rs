//! `o200k_base`'s splitting pattern worked by hand: the `regex` engine spends hundreds of
//! instructions setting up each anchored search for a piece of five bytes on average, and
//! compiling the pattern's Unicode classes costs a one-shot `history-host process` a few
//! milliseconds (docs/sessions.md#counting-tokens). [`o200k_piece`] gives the end of the
//! piece starting at a position exactly as the pattern of [`super::bpe`] (leftmost-first,
//! greedy, with the `\s+(?!\S)` look-ahead done by `lookahead_end`) would, or `None` as
//! soon as a character it would have to look at is one the regex must decide. The
//! branches, in the pattern's order:
//!
//! 1. `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`
//! 2. `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|…)?`
//! 3. `\p{N}{1,3}`
//! 4. ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
//! 5. `\s*[\r\n]+`
//! 6. `\s+` (then the look-ahead gives back a run's last space before a non-space)
//!
//! Beyond ASCII, four kinds of character are decided here, each standing in every branch
//! exactly where an ASCII character does: an uppercase letter (`\p{Lu}`, as `A`), a
//! lowercase one (`\p{Ll}`, as `a`), a space (`\s`, as a tab: a no-break space, a line
//! separator) and a character that is no letter, mark, number or space (as `.`: `’`, `—`,
//! `•`, `×`…). The rest (other letters, which both letter classes take, marks, numbers) is
//! left to the regex: there the branches' classes overlap and the regex's backtracking
//! decides. The three classes are read from
//! regex-syntax's Unicode tables, the ones the regex itself is compiled from, so both
//! sides agree on every character.
//!
//! `tests` in `bpe` compare it with the regex on random text over an alphabet of the
//! characters each branch turns on, ASCII and not.

use std::sync::OnceLock;

use regex_syntax::hir::{Class, HirKind};

// What each character is, as bits: for ASCII one table, so every test of the split is a
// look-up and a mask (the `is_ascii_*` tests it replaced took four times as many
// instructions); beyond ASCII, the classes of the module's doc.
const UPPER: u8 = 1;
const LOWER: u8 = 1 << 1;
const DIGIT: u8 = 1 << 2;
/// `\s` for ASCII, as Unicode `White_Space` has it: tab, line feed, vertical tab, form
/// feed, carriage return, space.
const SPACE: u8 = 1 << 3;
const LINE_BREAK: u8 = 1 << 4;
/// `[^\r\n\p{L}\p{N}]`.
const PREFIX: u8 = 1 << 5;
/// `[^\s\p{L}\p{N}]`.
const SYMBOL: u8 = 1 << 6;
/// The regex decides: a character beyond ASCII of none of the three kinds.
const REGEX: u8 = 1 << 7;
/// Not a class: the byte starts (or continues) a character beyond ASCII.
const WIDE: u8 = REGEX;

static ASCII_CLASSES: [u8; 256] = {
    let mut classes = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        classes[b] = if !byte.is_ascii() {
            WIDE
        } else {
            let space = matches!(byte, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ');
            let line_break = matches!(byte, b'\r' | b'\n');
            let alphanumeric = byte.is_ascii_alphanumeric();
            let mut class = 0;
            if byte.is_ascii_uppercase() {
                class |= UPPER;
            }
            if byte.is_ascii_lowercase() {
                class |= LOWER;
            }
            if byte.is_ascii_digit() {
                class |= DIGIT;
            }
            if space {
                class |= SPACE;
            }
            if line_break {
                class |= LINE_BREAK;
            }
            if !line_break && !alphanumeric {
                class |= PREFIX;
            }
            if !space && !alphanumeric {
                class |= SYMBOL;
            }
            class
        };
        b += 1;
    }
    classes
};

/// The class of the character at `at` and its length in bytes.
#[inline(always)]
fn class_at(text: &[u8], at: usize) -> (u8, usize) {
    let class = ASCII_CLASSES[text[at] as usize];
    if class != WIDE {
        (class, 1)
    } else {
        wide_class(text, at)
    }
}

/// [`class_at`] for a character beyond ASCII.
#[cold]
fn wide_class(text: &[u8], at: usize) -> (u8, usize) {
    let (c, len) = decode(text, at);
    let classes = unicode_classes();
    let class = if classes.upper.contains(c) {
        UPPER
    } else if classes.lower.contains(c) {
        LOWER
    } else if classes.space.contains(c) {
        PREFIX | SPACE
    } else if classes.regex.contains(c) {
        REGEX
    } else {
        PREFIX | SYMBOL
    };
    (class, len)
}

/// The character starting at `at` of UTF-8 text, and its length.
fn decode(text: &[u8], at: usize) -> (u32, usize) {
    let lead = text[at];
    let (len, bits) = match lead {
        0xf0.. => (4, lead & 0x07),
        0xe0.. => (3, lead & 0x0f),
        _ => (2, lead & 0x1f),
    };
    let c = text[at + 1..at + len]
        .iter()
        .fold(u32::from(bits), |c, &b| (c << 6) | u32::from(b & 0x3f));
    (c, len)
}

/// Characters as sorted, disjoint ranges.
struct Ranges(Vec<(u32, u32)>);

impl Ranges {
    /// The ranges of a Unicode class by regex-syntax's tables.
    fn of(class: &str) -> Ranges {
        let hir = regex_syntax::parse(class).expect("a Unicode class parses");
        let HirKind::Class(Class::Unicode(class)) = hir.kind() else {
            unreachable!("a Unicode class is one");
        };
        Ranges(
            class
                .ranges()
                .iter()
                .map(|range| (u32::from(range.start()), u32::from(range.end())))
                .collect(),
        )
    }

    fn contains(&self, c: u32) -> bool {
        match self.0.binary_search_by(|&(start, _)| start.cmp(&c)) {
            Ok(_) => true,
            Err(0) => false,
            Err(next) => c <= self.0[next - 1].1,
        }
    }
}

struct UnicodeClasses {
    upper: Ranges,
    lower: Ranges,
    space: Ranges,
    /// Every other letter, every mark and number.
    regex: Ranges,
}

/// Read once, the first time a character beyond ASCII is split (well under a millisecond;
/// compiling the pattern took a few).
fn unicode_classes() -> &'static UnicodeClasses {
    static CLASSES: OnceLock<UnicodeClasses> = OnceLock::new();
    CLASSES.get_or_init(|| UnicodeClasses {
        upper: Ranges::of(r"\p{Lu}"),
        lower: Ranges::of(r"\p{Ll}"),
        space: Ranges::of(r"\s"),
        regex: Ranges::of(r"[\p{Lt}\p{Lm}\p{Lo}\p{M}\p{N}]"),
    })
}

/// The end of the run from `at` of characters in `want`, or `None` when it stops at one
/// the regex must decide.
#[inline(always)]
fn run(text: &[u8], mut at: usize, want: u8) -> Option<usize> {
    while at < text.len() {
        let class = ASCII_CLASSES[text[at] as usize];
        if class & want != 0 {
            at += 1;
            continue;
        }
        if class != WIDE {
            return Some(at);
        }
        match wide_class(text, at) {
            (class, len) if class & want != 0 => at += len,
            (class, _) if class & REGEX != 0 => return None,
            _ => return Some(at),
        }
    }
    Some(at)
}

/// [`run`] of lowercase letters, eight bytes a step while they are ASCII: most of a
/// text's bytes are in such runs (the body of a word), and a word of five letters takes
/// one step instead of five.
#[inline(always)]
fn lowercase_run(text: &[u8], mut at: usize) -> Option<usize> {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const ONES: u64 = 0x0101_0101_0101_0101;
    while at + 8 <= text.len() {
        let bytes = u64::from_le_bytes(text[at..at + 8].try_into().expect("8 bytes"));
        // Per byte, its low seven bits plus a constant below 0x80 never carries into the
        // next byte; the sum's top bit says whether the byte reached `a`, and past `z`.
        let low7 = bytes & !HIGH;
        let from_a = low7 + ONES * (0x80 - u64::from(b'a'));
        let past_z = low7 + ONES * (0x80 - u64::from(b'z') - 1);
        let lowercase = from_a & !past_z & !bytes & HIGH;
        let stop = !lowercase & HIGH;
        if stop == 0 {
            at += 8;
            continue;
        }
        let end = at + (stop.trailing_zeros() / 8) as usize;
        if text[end].is_ascii() {
            return Some(end);
        }
        // A character beyond ASCII: a lowercase one goes on with the run.
        match class_at(text, end) {
            (LOWER, len) => at = end + len,
            (class, _) if class & REGEX != 0 => return None,
            _ => return Some(end),
        }
    }
    run(text, at, LOWER)
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)?` at `at`: its length, or `None` where a byte it looks
/// at is not ASCII (case-insensitive, `s` also matches `ſ`: the regex decides).
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
    let first = ASCII_CLASSES[text[start] as usize];
    if first != WIDE {
        // Inlined with a first character of one byte: ASCII text pays nothing for the
        // characters beyond it.
        piece_from(text, start, first, 1)
    } else {
        wide_piece(text, start)
    }
}

/// [`o200k_piece`] where the first character is beyond ASCII.
#[cold]
fn wide_piece(text: &[u8], start: usize) -> Option<usize> {
    let (first, first_len) = wide_class(text, start);
    piece_from(text, start, first, first_len)
}

/// [`o200k_piece`] with the first character's class and length.
#[inline(always)]
fn piece_from(text: &[u8], start: usize, first: u8, first_len: usize) -> Option<usize> {
    if first & REGEX != 0 {
        return None;
    }
    // Branches 1 and 2: letters after at most one prefix character.
    let letters = if first & PREFIX != 0 {
        start + first_len
    } else {
        start
    };
    if letters < text.len() {
        let at = class_at(text, letters).0;
        let upper = if at & UPPER != 0 {
            run(text, letters, UPPER)?
        } else if at & REGEX != 0 {
            return None;
        } else {
            letters
        };
        let lower = lowercase_run(text, upper)?;
        // Branch 1 needs a lowercase letter, branch 2 an uppercase one.
        if lower > upper || upper > letters {
            return Some(lower + contraction(text, lower)?);
        }
    }
    // Branch 3.
    if first & DIGIT != 0 {
        let mut end = start + 1;
        while end < text.len() && end < start + 3 && ASCII_CLASSES[text[end] as usize] & DIGIT != 0 {
            end += 1;
        }
        if end < text.len() && end < start + 3 && class_at(text, end).0 & REGEX != 0 {
            return None;
        }
        return Some(end);
    }
    // Branch 4.
    let symbols = if text[start] == b' ' { start + 1 } else { start };
    if symbols < text.len() {
        let (at, _) = class_at(text, symbols);
        if at & SYMBOL != 0 {
            let mut end = run(text, symbols, SYMBOL)?;
            while end < text.len() && matches!(text[end], b'\r' | b'\n' | b'/') {
                end += 1;
            }
            return Some(end);
        }
        if at & REGEX != 0 {
            return None;
        }
    }
    // Branches 5 and 6: `first` is a space here (every other character this module
    // decides started a piece above).
    let spaces = run(text, start, SPACE)?;
    if let Some(last) = text[start..spaces]
        .iter()
        .rposition(|&b| ASCII_CLASSES[b as usize] & LINE_BREAK != 0)
    {
        return Some(start + last + 1);
    }
    // The look-ahead: a run of two or more characters gives back its last one before a
    // non-space (the character after the run is decided here: `run` said so).
    let mut last = spaces - 1;
    while text[last] & 0xc0 == 0x80 {
        last -= 1; // a continuation byte: the last character starts before it
    }
    if last > start && spaces < text.len() {
        Some(last)
    } else {
        Some(spaces)
    }
}
