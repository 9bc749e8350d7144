//! Counting `o200k_base` and `cl100k_base` tokens without fancy-regex and without loading
//! a vocabulary: the same counts as tiktoken-rs's `encode_ordinary(text).len()`, about
//! twice as fast, and ready at once (tiktoken-rs decodes and hashes a vocabulary on first
//! use: about half a second for o200k_base in a release build, three in a debug build).
//!
//! The ranks are tiktoken-rs's own, turned by `build.rs` into a table that is looked up in
//! place ([`RankTable`]). tiktoken splits text with a pattern whose `\s+(?!\S)` branch
//! needs a look-ahead, so it runs fancy-regex's backtracking VM for every piece. Here the
//! look-ahead is done by hand: the pattern's last two branches (`\s+(?!\S)|\s+` in
//! o200k_base, `\s+(?!\S)|\s` in cl100k_base) become `\s+`, and a whitespace run that only
//! they can have matched (no line break: a branch before them takes every run holding
//! one) gives back its last character when a non-whitespace character follows — exactly
//! what the look-ahead does. cl100k_base's possessive quantifiers (`?+`, `++`) change
//! nothing where they stand (what follows them cannot match what they would give back),
//! so they become plain ones. The rest of each pattern is tiktoken's, run by the `regex`
//! crate's engine anchored at each piece. Short pieces are merged as tiktoken merges them
//! ([`short_merge_count`]); long pieces go through [`merge_count`], the same merge with a
//! heap, because rescanning every part after each merge is quadratic in the piece, and a
//! piece can be a whole message (a long run of letters is one piece). `tests` compares
//! the counts with tiktoken-rs on tricky, random and long text.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::OnceLock;

use regex_automata::meta::{Cache, Regex};
use regex_automata::util::pool::Pool;
use regex_automata::{Anchored, Input};

use crate::rank_table::RankTable;

type Rank = u32;

/// tiktoken-rs's `O200K_BASE_PAT_STR` with `\s+(?!\S)|\s+` folded into `\s+`.
const O200K_PATTERN: &str = concat!(
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

/// tiktoken-rs's cl100k_base pattern,
/// `'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s`,
/// with plain quantifiers for the possessive ones and `\s+(?!\S)|\s` folded into `\s+`.
const CL100K_PATTERN: &str = concat!(
    r"'(?i:[sdmt]|ll|ve|re)",
    "|",
    r"[^\r\n\p{L}\p{N}]?\p{L}+",
    "|",
    r"\p{N}{1,3}",
    "|",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    "|",
    r"\s+$",
    "|",
    r"\s*[\r\n]",
    "|",
    r"\s+",
);

static O200K_RANKS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/o200k_base.ranks"));
static CL100K_RANKS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/cl100k_base.ranks"));

/// One BPE encoding: its splitting pattern and its ranks.
pub(crate) struct Encoding {
    pattern: &'static str,
    /// The splitting pattern, compiled for the first piece it has to decide: a few
    /// milliseconds, which a `history-host process` in `o200k_base` spends only for a
    /// piece with a character crate::o200k_split leaves to it (a letter of neither case,
    /// such as CJK, a mark, a digit or a space beyond ASCII).
    split: OnceLock<Regex>,
    /// Scratches, one taken per text counted: a search cache for `split` (`Regex::search`
    /// takes one from the regex's own pool for every piece, and a thread other than the
    /// pool's first takes it under a mutex: with the service's many threads that was a
    /// fifth of counting in the serve bench) and the recent pieces' counts.
    caches: Pool<Scratch, NewScratch>,
    ranks: RankTable<'static>,
    /// The pattern is `o200k_base`'s, worked by hand (crate::o200k_split): a
    /// piece's end, or `None` where the regex must decide. Called directly, not through
    /// a function pointer, so it is inlined into the count's loop.
    split_by_hand: bool,
}

type NewScratch = Box<dyn Fn() -> Scratch + Send + Sync + std::panic::RefUnwindSafe + std::panic::UnwindSafe>;

/// What one count works with, taken from the encoding's pool and given back after: the
/// regex's search cache and the counts of the pieces counted lately.
pub(crate) struct Scratch {
    /// Made when the regex first decides a piece.
    regex: Option<Cache>,
    pieces: PieceCounts,
}

/// The token counts of recently counted pieces, two-way set-associative by the pieces'
/// hash: words repeat (a piece is five bytes on average, and a session's text says the
/// same words again and again), and a hit costs one look into this small table where the
/// count costs a look-up in the vocabulary's table of megabytes, a cache miss or several,
/// and for a piece that is not one token the byte-pair merge as well
/// (docs/sessions.md#counting-tokens). Two ways: a text's few thousand distinct pieces
/// evict each other in a direct-mapped table of this size (a generated 4.6 MB history
/// looked up the vocabulary for 4.7 % of its pieces that way, for 0.9 % with two ways;
/// its distinct pieces are about 0.75 %). Exact: an entry holds the piece's bytes and is
/// used only for the same bytes.
struct PieceCounts {
    sets: Box<[PieceSet]>,
}

/// A set: the piece found or added last first.
#[derive(Clone, Copy, Default)]
#[repr(C, align(32))]
struct PieceSet([PieceEntry; 2]);

/// Pieces longer than this are counted without the cache (few are: a word of fifteen
/// letters with its space, a long run of spaces).
const CACHED_PIECE: usize = 15;

/// 8,192 sets of two entries of 16 bytes: 256 KiB, within a core's L2 cache.
const PIECE_SETS: usize = 8192;

/// A cached piece: its bytes zero-padded to 15 in two words, its length in the top byte's
/// low half (no piece is empty: an all-zero entry is an empty one) and, in an entry, its
/// count in the top byte's high half (a piece of at most 15 bytes has at most 15 tokens).
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
#[repr(C, align(16))]
struct PieceEntry {
    low: u64,
    high: u64,
}

/// Where an entry keeps its count.
const COUNT_SHIFT: u32 = 60;

/// The key of the piece `text[start..start + len]`, `len` at most [`CACHED_PIECE`]: an
/// entry without its count.
#[inline]
fn piece_key(text: &[u8], start: usize, len: usize) -> PieceEntry {
    let (low, high) = if start + 16 <= text.len() {
        // Two unaligned loads, the bytes past the piece masked off below.
        let word = |at: usize| u64::from_le_bytes(text[at..at + 8].try_into().expect("8 bytes"));
        (word(start), word(start + 8))
    } else {
        let mut bytes = [0u8; 16];
        bytes[..len].copy_from_slice(&text[start..start + len]);
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        (word(0), word(8))
    };
    let [low_mask, high_mask] = PIECE_MASKS[len];
    PieceEntry {
        low: low & low_mask,
        high: (high & high_mask) | (len as u64) << 56,
    }
}

/// For each piece length, the masks keeping a key's words' bytes of the piece.
const PIECE_MASKS: [[u64; 2]; CACHED_PIECE + 1] = {
    let mut masks = [[0u64; 2]; CACHED_PIECE + 1];
    let mut len = 0;
    while len <= CACHED_PIECE {
        let mut word = 0;
        while word < 2 {
            let kept = len.saturating_sub(8 * word);
            masks[len][word] = if kept >= 8 {
                u64::MAX
            } else {
                (1u64 << (8 * kept)) - 1
            };
            word += 1;
        }
        len += 1;
    }
    masks
};

/// The set of a key: one multiply (FxHash's constant) of its words folded together, its
/// high bits.
#[inline]
fn piece_set(key: &PieceEntry) -> usize {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let h = (key.low ^ key.high.rotate_left(29)).wrapping_mul(K);
    (h >> (64 - PIECE_SETS.trailing_zeros())) as usize
}

impl PieceEntry {
    /// Whether this entry holds the piece of `key`.
    #[inline]
    fn holds(&self, key: &PieceEntry) -> bool {
        self.low == key.low && self.high & !(0xf << COUNT_SHIFT) == key.high
    }

    fn count(&self) -> u64 {
        self.high >> COUNT_SHIFT
    }
}

impl PieceCounts {
    fn new() -> PieceCounts {
        PieceCounts {
            sets: vec![PieceSet::default(); PIECE_SETS].into_boxed_slice(),
        }
    }

    /// The count of the piece `text[start..start + len]` (at most [`CACHED_PIECE`] bytes),
    /// from the cache or by `count`.
    #[inline]
    fn get_or(&mut self, text: &[u8], start: usize, len: usize, count: impl FnOnce() -> u64) -> u64 {
        let key = piece_key(text, start, len);
        let PieceSet(ways) = &mut self.sets[piece_set(&key)];
        if ways[0].holds(&key) {
            return ways[0].count();
        }
        if ways[1].holds(&key) {
            ways.swap(0, 1);
            return ways[0].count();
        }
        let counted = count();
        // The older entry goes; at most `len` ≤ 15 tokens fit the count's four bits.
        ways[1] = ways[0];
        ways[0] = PieceEntry {
            high: key.high | counted << COUNT_SHIFT,
            ..key
        };
        counted
    }
}

/// The `o200k_base` encoding (its pattern is compiled for the first piece that is not ASCII).
pub(crate) fn o200k_base() -> &'static Encoding {
    static ENCODING: OnceLock<Encoding> = OnceLock::new();
    ENCODING.get_or_init(|| Encoding::new(O200K_PATTERN, O200K_RANKS, true))
}

/// The `cl100k_base` encoding (its pattern is compiled for the first piece).
pub(crate) fn cl100k_base() -> &'static Encoding {
    static ENCODING: OnceLock<Encoding> = OnceLock::new();
    ENCODING.get_or_init(|| Encoding::new(CL100K_PATTERN, CL100K_RANKS, false))
}

impl Encoding {
    fn new(pattern: &'static str, ranks: &'static [u8], split_by_hand: bool) -> Encoding {
        Encoding {
            pattern,
            split: OnceLock::new(),
            caches: Pool::new(Box::new(|| Scratch {
                regex: None,
                pieces: PieceCounts::new(),
            })),
            ranks: RankTable::new(ranks),
            split_by_hand,
        }
    }

    /// Tokens of `text`, ordinary encoding (no special tokens).
    pub(crate) fn count(&self, text: &str) -> u64 {
        self.count_with(&mut self.caches.get(), text)
    }

    fn count_with(&self, scratch: &mut Scratch, text: &str) -> u64 {
        let mut count = 0u64;
        let mut start = 0;
        while start < text.len() {
            let by_hand = if self.split_by_hand {
                crate::o200k_split::o200k_piece(text.as_bytes(), start)
            } else {
                None
            };
            let end = match by_hand {
                // Never an empty piece, even from a wrong split: the regex decides it then
                // (an empty piece would never end the loop).
                Some(end) if end > start => end,
                _ => self.regex_piece(&mut scratch.regex, text, start),
            };
            let piece = &text.as_bytes()[start..end];
            let count_piece = || match self.ranks.get(piece) {
                Some(_) => 1,
                None => byte_pair_count(piece, &self.ranks),
            };
            count += if piece.len() <= CACHED_PIECE {
                scratch
                    .pieces
                    .get_or(text.as_bytes(), start, piece.len(), count_piece)
            } else {
                count_piece()
            };
            start = end;
        }
        count
    }
}

impl Encoding {
    /// The end of the piece at `start` by the regex, look-ahead done.
    fn regex_piece(&self, cache: &mut Option<Cache>, text: &str, start: usize) -> usize {
        let split = self
            .split
            .get_or_init(|| Regex::new(self.pattern).expect("a tiktoken pattern compiles"));
        let cache = cache.get_or_insert_with(|| split.create_cache());
        let input = Input::new(text).range(start..).anchored(Anchored::Yes);
        // Every character starts a piece (the last branch takes any whitespace, the
        // others everything else), so an anchored search always finds one.
        let found = split.search_with(cache, &input).map_or(text.len(), |m| m.end());
        lookahead_end(text, start, found)
    }
}

/// Pieces at least this long are merged by [`merge_count`]; shorter ones by
/// [`short_merge_count`], whose rescan of a few parts beats a heap's bookkeeping.
const LONG_PIECE: usize = 100;

/// Tokens of one piece that is not itself a token: the parts the byte-pair merge leaves.
fn byte_pair_count(piece: &[u8], ranks: &RankTable) -> u64 {
    if piece.len() < LONG_PIECE {
        short_merge_count(piece, ranks)
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
fn merge_count(piece: &[u8], ranks: &RankTable) -> u64 {
    let len = piece.len();
    if len < 2 {
        return len as u64;
    }
    if u32::try_from(len).is_err() {
        return short_merge_count(piece, ranks);
    }
    // No token joins there (no part after, or the bytes are not a token).
    const NONE: Rank = Rank::MAX;
    let rank_of = |start: usize, end: usize| {
        if end <= len {
            ranks.get(&piece[start..end]).unwrap_or(NONE)
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

/// The byte-pair merge as tiktoken does it (`_byte_pair_merge`): the parts' starts and the
/// rank of joining each with the next, rescanned for the lowest rank after every merge.
/// Quadratic in the piece, the fastest on short ones.
fn short_merge_count(piece: &[u8], ranks: &RankTable) -> u64 {
    if piece.len() < 2 {
        return piece.len() as u64;
    }
    // (start, rank of joining this part with the next).
    let mut parts: Vec<(usize, Rank)> = Vec::with_capacity(piece.len() + 1);
    for i in 0..piece.len() - 1 {
        parts.push((i, ranks.get(&piece[i..i + 2]).unwrap_or(Rank::MAX)));
    }
    parts.push((piece.len() - 1, Rank::MAX));
    parts.push((piece.len(), Rank::MAX));
    // The rank of joining part i with the next, once part i + 1 is gone.
    let rank_at = |parts: &Vec<(usize, Rank)>, i: usize| {
        if i + 3 < parts.len() {
            ranks.get(&piece[parts[i].0..parts[i + 3].0]).unwrap_or(Rank::MAX)
        } else {
            Rank::MAX
        }
    };
    loop {
        // The lowest rank, the leftmost of equal ones.
        let (mut rank, mut i) = (Rank::MAX, usize::MAX);
        for (at, &(_, here)) in parts[..parts.len() - 1].iter().enumerate() {
            if here < rank {
                (rank, i) = (here, at);
            }
        }
        if rank == Rank::MAX {
            break;
        }
        if i > 0 {
            parts[i - 1].1 = rank_at(&parts, i - 1);
        }
        parts[i].1 = rank_at(&parts, i);
        parts.remove(i + 1);
    }
    (parts.len() - 1) as u64
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

    /// Our count and tiktoken-rs's of `text` in both encodings, which must be equal.
    fn check(text: &str) {
        assert_eq!(o200k_base().count(text), o200k(text), "o200k_base: {text:?}");
        assert_eq!(cl100k_base().count(text), cl100k(text), "cl100k_base: {text:?}");
    }

    fn o200k(text: &str) -> u64 {
        tiktoken_rs::o200k_base_singleton().encode_ordinary(text).len() as u64
    }

    fn cl100k(text: &str) -> u64 {
        tiktoken_rs::cl100k_base_singleton().encode_ordinary(text).len() as u64
    }

    fn count(text: &str) -> u64 {
        o200k_base().count(text)
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
            check(case);
        }
    }

    #[test]
    fn counts_equal_tiktoken_on_the_real_conversations() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/real");
        let entries = std::fs::read_dir(&dir).unwrap();
        let mut checked = 0;
        for path in entries.map(|e| e.unwrap().path()) {
            // The .json files (the large .jsonl is slow to count twice in a debug build).
            if path.extension().is_some_and(|e| e == "json") {
                let text = std::fs::read_to_string(&path).unwrap();
                let history: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
                for message in &history {
                    if let Some(content) = message["content"].as_str() {
                        check(content);
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
        let ranks = &o200k_base().ranks;
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
                    short_merge_count(piece, ranks),
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
            assert_eq!(count(text), o200k(text), "{start:?}…");
            assert_eq!(cl100k_base().count(text), cl100k(text), "{start:?}…");
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
        assert_eq!(count(&dna), o200k(&dna));
    }

    #[test]
    fn a_piece_has_one_key_wherever_it_stands_and_its_own() {
        // Mid-text (two loads, the rest masked off) and at the end (copied): one key.
        let text = b"xx hello world, and then some more text after it";
        let tail = b"the end: hello";
        let key = piece_key(text, 2, 6);
        assert_eq!(key, piece_key(tail, tail.len() - 6, 6));
        assert_ne!(key, piece_key(text, 2, 5), "a prefix is another piece");
        assert_ne!(key, piece_key(text, 3, 6));
        let long = b"abcdefghijklmnopqrstuvwxyz0123456789";
        assert_ne!(piece_key(long, 0, 15), piece_key(long, 0, 14));
        assert_eq!(piece_key(long, 1, 15), piece_key(&long[1..16], 0, 15));
        // Counted twice through the cache, a text gives tiktoken's count both times.
        let text = "The same words, the same words again: the same words.";
        assert_eq!(count(text), o200k(text));
        assert_eq!(count(text), o200k(text));
    }

    #[test]
    fn the_pieces_split_by_hand_are_the_regexs() {
        // Random text over the characters each branch turns on, ASCII and not: every
        // piece the hand-made split gives is the regex's. Beyond ASCII: uppercase and
        // lowercase letters (ſ folds to `s` in a contraction), spaces (no-break, next
        // line, line separator, ideographic), punctuation and symbols (a zero-width joiner
        // is neither letter nor space), and what the split leaves to the regex: other
        // letters (CJK, ª, ʰ, ǅ), marks, numbers.
        let alphabet: Vec<char> = concat!(
            "aZs'tRrEvVlLmMdD09 \t\n\r\x0b\x0c/.,!(_\x00\x7f",
            "éÉßſΩωЖж’—•×«€→\u{200d}\u{a0}\u{85}\u{2028}\u{202f}\u{3000}",
            "中ªʰǅ\u{301}\u{fe0f}²٣",
        )
        .chars()
        .collect();
        let lowercase: Vec<char> = "abcdefghijklmnopqrstuvwxyzéßж".chars().collect();
        let encoding = o200k_base();
        let mut cache = encoding.caches.get();
        let cache = &mut cache.regex;
        let mut state = 7u64;
        let (mut decided, mut wide) = (0, 0);
        for round in 0..40_000 {
            let len = 1 + (next(&mut state) % 12) as usize;
            let mut text = String::new();
            for _ in 0..len {
                text.push(alphabet[(next(&mut state) % alphabet.len() as u64) as usize]);
                // Every other text has long runs of lowercase letters too, which the split
                // reads eight bytes at a time while they are ASCII: runs that end on each
                // byte of a word, and go on past a letter beyond ASCII.
                if round % 2 == 1 && next(&mut state).is_multiple_of(3) {
                    let run = (next(&mut state) % 20) as usize;
                    text.extend(
                        (0..run).map(|_| lowercase[(next(&mut state) % lowercase.len() as u64) as usize]),
                    );
                }
            }
            let mut start = 0;
            while start < text.len() {
                let by_regex = encoding.regex_piece(cache, &text, start);
                if let Some(end) = crate::o200k_split::o200k_piece(text.as_bytes(), start) {
                    assert_eq!(end, by_regex, "{text:?} from {start}");
                    decided += 1;
                    wide += usize::from(!text[start..end].is_ascii());
                }
                start = by_regex;
            }
        }
        assert!(decided > 40_000, "{decided} pieces decided by hand");
        assert!(wide > 10_000, "{wide} pieces beyond ASCII decided by hand");
    }

    #[test]
    fn counts_equal_tiktoken_on_random_text() {
        // Random strings over an alphabet of what splits differently: spaces of several
        // kinds, line breaks, letters of both cases and scripts, marks, digits, quotes.
        let alphabet: Vec<char> = " \t\n\r\u{a0}\u{3000}aZé\u{301}字😀7'/.-_sStTlLvVeErRdDmM"
            .chars()
            .collect();
        // 200,000 in a release build (`cargo test --release -p history-engine bpe`), a few
        // thousand in the debug build the test suite runs.
        let strings = if cfg!(debug_assertions) { 3_000 } else { 200_000 };
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..strings {
            let mut text = String::new();
            let len = 1 + (state % 24) as usize;
            for _ in 0..len {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                text.push(alphabet[(state % alphabet.len() as u64) as usize]);
            }
            check(&text);
        }
    }
}
