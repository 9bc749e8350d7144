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
//! `regex` crate's engine anchored at each piece. The ranks are tiktoken-rs's own, and so is
//! the byte-pair merge of short pieces (`byte_pair_split`); long pieces go through
//! [`merge_count`], the same merge with a heap, because tiktoken-rs's rescans every part
//! after each merge: quadratic in the piece, and a piece can be a whole message (a long
//! run of letters is one piece). `tests` compares the counts with tiktoken-rs on tricky,
//! random and long text.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
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

type Ranks = FxHashMap<Vec<u8>, Rank>;

struct Encoding {
    split: Regex,
    ranks: Ranks,
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
            None => byte_pair_count(piece, &encoding.ranks),
        };
        start = end;
    }
    count
}

/// Pieces at least this long are merged by [`merge_count`]; shorter ones by tiktoken-rs,
/// whose rescan of a few parts beats a heap's bookkeeping.
const LONG_PIECE: usize = 100;

/// Tokens of one piece that is not itself a token: the parts the byte-pair merge leaves.
fn byte_pair_count(piece: &[u8], ranks: &Ranks) -> u64 {
    if piece.len() < LONG_PIECE {
        byte_pair_split(piece, ranks).len() as u64
    } else {
        merge_count(piece, ranks)
    }
}

/// The byte-pair merge of tiktoken, counting the parts it leaves, in O(n log n).
///
/// The merge starts from single bytes and repeatedly joins the adjacent pair of parts whose
/// concatenation has the lowest rank, the leftmost of equal ranks, until no adjacent pair
/// is a token. tiktoken-rs finds that pair by scanning all the parts after every merge;
/// here the candidate pairs wait in a min-heap keyed by (rank, start), which is the same
/// order. The parts form a linked list over the piece's byte offsets: a live part starting
/// at `s` ends at `end[s]`, the part before it starts at `prev[s]`, and `pair[s]` is the
/// rank of joining it with the part after it. A merge changes the pairs of the merged part
/// and of the part before it; their old heap entries are not removed but skipped when
/// they come out and no longer match `pair` (an entry that still matches stands for a pair
/// that is really there, with that rank, so taking it is right).
///
/// Memory: three `u32` per byte of the piece, and a heap of at most three `u64` per byte.
/// A piece of 4 GiB or more (more than any message holds in practice) takes tiktoken-rs's
/// merge instead.
fn merge_count(piece: &[u8], ranks: &Ranks) -> u64 {
    let len = piece.len();
    if len < 2 {
        return len as u64;
    }
    if u32::try_from(len).is_err() {
        return byte_pair_split(piece, ranks).len() as u64;
    }
    // No token joins there (no part after, or the bytes are not a token).
    const NONE: Rank = Rank::MAX;
    let rank_of = |start: usize, end: usize| {
        if end <= len {
            ranks.get(&piece[start..end]).copied().unwrap_or(NONE)
        } else {
            NONE
        }
    };
    let entry = |rank: Rank, start: usize| Reverse((u64::from(rank) << 32) | start as u64);
    let mut end: Vec<u32> = (1..=len as u32).collect();
    let mut prev: Vec<u32> = (0..len as u32).map(|s| s.wrapping_sub(1)).collect();
    let mut pair: Vec<Rank> = (0..len).map(|s| rank_of(s, s + 2)).collect();
    let mut heap: BinaryHeap<Reverse<u64>> = pair
        .iter()
        .enumerate()
        .filter(|(_, &rank)| rank != NONE)
        .map(|(start, &rank)| entry(rank, start))
        .collect();
    let mut parts = len as u64;
    while let Some(Reverse(key)) = heap.pop() {
        let (rank, start) = ((key >> 32) as Rank, (key & u64::from(u32::MAX)) as usize);
        if pair[start] != rank {
            continue; // an older pair of this part, since changed
        }
        // Join the part at `start` with the one after it, which ends at `joined_end`.
        let right = end[start] as usize;
        let joined_end = end[right] as usize;
        end[start] = joined_end as u32;
        pair[right] = NONE;
        parts -= 1;
        if joined_end < len {
            prev[joined_end] = start as u32;
            pair[start] = rank_of(start, end[joined_end] as usize);
        } else {
            pair[start] = NONE;
        }
        if pair[start] != NONE {
            heap.push(entry(pair[start], start));
        }
        if start > 0 {
            let before = prev[start] as usize;
            pair[before] = rank_of(before, joined_end);
            if pair[before] != NONE {
                heap.push(entry(pair[before], before));
            }
        }
    }
    parts
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

    /// Xorshift: the same pseudo-random sequence on every run.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// `len` random letters out of A, C, G, T: one piece as long as the text, with many
    /// different merges (a DNA sequence pasted into a message).
    fn acgt(len: usize, seed: u64) -> String {
        let mut state = seed;
        (0..len)
            .map(|_| ['A', 'C', 'G', 'T'][(next(&mut state) % 4) as usize])
            .collect()
    }

    #[test]
    fn the_heap_merge_equals_tiktokens_merge_piece_by_piece() {
        // Pieces of every length up to past the switch between the two merges, over
        // alphabets that make long tokens (one letter), many merges (a word, hex digits)
        // and multi-byte characters whose bytes merge first.
        let ranks = &encoding().ranks;
        let alphabets = [
            "a",
            "ACGT",
            "abcdef0123456789",
            "internationalization ",
            "é字😀a ",
        ];
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for alphabet in alphabets {
            let chars: Vec<char> = alphabet.chars().collect();
            for len in 2..3 * LONG_PIECE {
                let text: String = (0..len)
                    .map(|_| chars[(next(&mut state) % chars.len() as u64) as usize])
                    .collect();
                let piece = text.as_bytes();
                assert_eq!(
                    merge_count(piece, ranks),
                    byte_pair_split(piece, ranks).len() as u64,
                    "{text:?}"
                );
            }
        }
    }

    #[test]
    fn long_runs_are_counted_as_tiktoken_does() {
        // Each of these is one piece of about 20 KB, or holds one.
        let runs = [
            "a".repeat(20_000),
            acgt(20_000, 7),
            " ".repeat(20_000),
            format!("{}x", " ".repeat(20_000)),
            "\n".repeat(10_000),
            "!?".repeat(10_000),
            "字".repeat(7_000),
            "😀".repeat(5_000),
            format!("a {} word", "internationalization".repeat(1_000)),
        ];
        for text in &runs {
            let start: String = text.chars().take(8).collect();
            assert_eq!(count(text), reference(text), "{start:?}…");
        }
    }

    #[test]
    fn a_megabyte_in_one_piece_is_counted_as_tiktoken_does() {
        // A megabyte of one letter and of random ACGT, each a single piece. Quadratic
        // merging would take many minutes here (20-25 s on 200 KB in a release build); the
        // heap merge takes about a tenth of a second (a few seconds in a debug build).
        // tiktoken-rs's own encode merges long pieces with a heap too, so it can answer on
        // the ACGT; for the letter the answer is known: "aaaaaaaa" is a token.
        assert_eq!(count(&"a".repeat(1_000_000)), 125_000);
        let dna = acgt(1_000_000, 11);
        assert_eq!(count(&dna), reference(&dna));
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
