//! Counting `o200k_base` tokens without fancy-regex: the same counts as tiktoken-rs's
//! `encode_ordinary(text).len()`, about twice as fast (`cargo xtask bench`'s replay spends
//! most of its time counting new messages; see the commit that added this).
//!
//! tiktoken splits text with a pattern whose `\s+(?!\S)` branch needs a look-ahead, so it
//! runs fancy-regex's backtracking VM for every piece. Here the look-ahead is done by hand:
//! the pattern's last two branches `\s+(?!\S)|\s+` become `\s+`, and a whitespace run that
//! only they can have matched (no line break: `\s*[\r\n]+` comes first and takes every run
//! holding one) gives back its last character when a non-whitespace character follows —
//! exactly what the look-ahead does. The rest of the pattern is tiktoken's, run by the
//! `regex` crate's engine anchored at each piece. The byte-pair merge and the ranks are
//! tiktoken-rs's own (`byte_pair_split`). `tests` compares the counts with tiktoken-rs on tricky and random text.

use std::sync::OnceLock;

use regex_automata::meta::Regex;
use regex_automata::{Anchored, Input};
use rustc_hash::FxHashMap;
use tiktoken_rs::{byte_pair_split, Rank};

/// tiktoken-rs's `O200K_BASE_PAT_STR` with `\s+(?!\S)|\s+` folded into `\s+`.
const PATTERN: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"\p{N}{1,3}",
    "|",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    "|",
    r"\s*[\r\n]+",
    "|",
    r"\s+",
);

struct Encoding {
    split: Regex,
    ranks: FxHashMap<Vec<u8>, Rank>,
}

fn encoding() -> &'static Encoding {
    static ENCODING: OnceLock<Encoding> = OnceLock::new();
    ENCODING.get_or_init(|| {
        // A CoreBPE of our own, dropped once the ranks are out: the counter keeps only
        // the map and the pattern (tiktoken-rs's singleton would keep a second copy).
        let bpe = tiktoken_rs::o200k_base().expect("tiktoken-rs's embedded o200k_base loads");
        let specials: Vec<Vec<u8>> = bpe
            .special_tokens()
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
        // The ranks are not exported; every ordinary token decodes to its bytes.
        let mut ranks = FxHashMap::default();
        for rank in 0..O200K_TOKENS {
            if let Ok(bytes) = bpe.decode_bytes(&[rank]) {
                if !specials.contains(&bytes) {
                    ranks.insert(bytes, rank);
                }
            }
        }
        Encoding {
            split: Regex::new(PATTERN).expect("the o200k_base pattern compiles"),
            ranks,
        }
    })
}

/// Ranks are below this (ordinary tokens end at 199,997; the special ones are above).
const O200K_TOKENS: Rank = 200_019;

/// `o200k_base` tokens of `text`, ordinary encoding (no special tokens).
pub fn count(text: &str) -> u64 {
    let encoding = encoding();
    let mut count = 0u64;
    let mut start = 0;
    while start < text.len() {
        let input = Input::new(text).range(start..).anchored(Anchored::Yes);
        // Every character starts a piece (the last branch takes any whitespace, the
        // others everything else), so an anchored search always finds one.
        let found = encoding.split.search(&input).map_or(text.len(), |m| m.end());
        let end = lookahead_end(text, start, found);
        let piece = &text.as_bytes()[start..end];
        count += match encoding.ranks.get(piece) {
            Some(_) => 1,
            None => byte_pair_split(piece, &encoding.ranks).len() as u64,
        };
        start = end;
    }
    count
}

/// Where tiktoken's piece `text[start..end]` really ends: a run of whitespace without a
/// line break, followed by a non-whitespace character, leaves its last character to the
/// next piece (`\s+(?!\S)`), unless it is a single character (then `\s+` takes it).
fn lookahead_end(text: &str, start: usize, end: usize) -> usize {
    let piece = &text[start..end];
    let mut chars = piece.chars();
    let Some(last) = chars.next_back() else {
        return end;
    };
    let followed_by_non_space = text[end..].chars().next().is_some_and(|c| !c.is_whitespace());
    if followed_by_non_space
        && chars.next().is_some()
        && piece.chars().all(|c| c.is_whitespace() && c != '\r' && c != '\n')
    {
        end - last.len_utf8()
    } else {
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(text: &str) -> u64 {
        tiktoken_rs::o200k_base_singleton().encode_ordinary(text).len() as u64
    }

    #[test]
    fn counts_equal_tiktoken_on_tricky_text() {
        let cases = [
            "",
            " ",
            "  ",
            "a",
            "hello world",
            "a  b",
            "a   b",
            "a \t b",
            "x\u{3000}\u{3000}y",
            "x \u{3000}y",
            "trailing   ",
            "   leading",
            "\n\n  \n x",
            "  \r\n  y",
            "line\r\nnext\rthird\n",
            "I'LL don't We've they'RE it's",
            "12345678 3.14159 1,000,000",
            "path/to/file.rs:42:7\n/usr/lib/\n",
            "emoji 😀😀 and 中文字符 and Ünïcödé and עברית",
            "combining e\u{301}\u{301} marks",
            "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
            "    indented code {\n        more();\n    }\n",
            "tabs\t\tand\t spaces \t\n",
            "???!!! ... --- ===",
            " \u{a0}x \u{a0} y\u{2003}\u{2003}z",
        ];
        for case in cases {
            assert_eq!(count(case), reference(case), "{case:?}");
        }
    }

    #[test]
    fn counts_equal_tiktoken_on_the_real_conversations() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/real");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return; // the shared data is beside the repository, not in it
        };
        let mut checked = 0;
        for path in entries.map(|e| e.unwrap().path()) {
            // The .json files (the large .jsonl is slow to count twice in a debug build).
            if path.extension().is_some_and(|e| e == "json") {
                let text = std::fs::read_to_string(&path).unwrap();
                let history: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
                for message in &history {
                    if let Some(content) = message["content"].as_str() {
                        assert_eq!(count(content), reference(content), "{}", path.display());
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 50, "{checked} texts checked in {}", dir.display());
    }

    #[test]
    fn counts_equal_tiktoken_on_random_text() {
        // Random strings over an alphabet of what splits differently: spaces of several
        // kinds, line breaks, letters of both cases and scripts, marks, digits, quotes.
        let alphabet: Vec<char> = " \t\n\r\u{a0}\u{3000}aZé\u{301}字😀7'/.-_sStT".chars().collect();
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..3_000 {
            let mut text = String::new();
            let len = 1 + (state % 24) as usize;
            for _ in 0..len {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                text.push(alphabet[(state % alphabet.len() as u64) as usize]);
            }
            assert_eq!(count(&text), reference(&text), "{text:?}");
        }
    }
}
