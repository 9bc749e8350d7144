//! The host's token counter (docs/plugins.md#token_budget): tiktoken's real `o200k_base` and `cl100k_base`
//! encodings (tiktoken-rs's ranks, built into the binary as tables looked up in place: see
//! `bpe`; ready at once, no network) and `chars4`, offered to every plugin
//! through the host services (`services`). Counts are cached at two levels, so nothing is
//! tokenized twice:
//!
//! - each message remembers its own count (a message shared from turn to turn is looked
//!   up in O(1));
//! - a message a plugin made (a merge, a changed copy, a message re-parsed from a resent
//!   transcript) starts without one, so each of its items is looked up by content in
//!   [`ItemCache`] before it is tokenized: a merge of two counted messages costs two
//!   hashes, not a second tokenization.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use rustc_hash::FxHasher;

use plugin_api::parts::PartKind;
use plugin_api::{Content, Message, Part, RArc, Role, Tokenizer};

use crate::config::MediaRules;
use crate::media;

/// The per-message overhead of docs/plugins.md#token_budget's formula when nothing else is configured.
pub use plugin_api::DEFAULT_PER_MESSAGE_TOKENS as PER_MESSAGE_TOKENS;

/// Bytes handed to a BPE tokenizer since the process started (`cargo xtask bench` compares
/// it with the bytes that entered: 1.0 means nothing was tokenized twice).
static BYTES_TOKENIZED: AtomicU64 = AtomicU64::new(0);

/// Bytes handed to a BPE tokenizer so far.
pub fn bytes_tokenized() -> u64 {
    BYTES_TOKENIZED.load(Ordering::Relaxed)
}

/// Tokens of one text.
pub fn count_text(tokenizer: Tokenizer, text: &str) -> u64 {
    if text.is_empty() {
        return 0;
    }
    match tokenizer {
        Tokenizer::Chars4 => (text.chars().count() as u64).div_ceil(4),
        Tokenizer::O200kBase => {
            BYTES_TOKENIZED.fetch_add(text.len() as u64, Ordering::Relaxed);
            // tiktoken's counts, twice as fast as tiktoken-rs's encode (see `bpe`).
            crate::bpe::o200k_base().count(text)
        }
        Tokenizer::Cl100kBase => {
            BYTES_TOKENIZED.fetch_add(text.len() as u64, Ordering::Relaxed);
            crate::bpe::cl100k_base().count(text)
        }
    }
}

/// Token counts of item texts by content: (tokenizer, byte length, hash) → tokens. Every
/// non-empty item goes through it (hashing a short item costs less than tokenizing it),
/// so a resent conversation, parsed anew, tokenizes nothing it sent before.
/// Counts by content are true for every session, so the cache is process-wide; it is
/// split into shards by hash, so sessions counting at once on several threads rarely
/// wait for each other. Bounded: a full shard starts over, which costs at most one more
/// tokenization of what is still in use.
struct ItemCache {
    counts: HashMap<(Tokenizer, usize, u64), u64, BuildHasherDefault<FxHasher>>,
}

const ITEM_CACHE_SHARDS: usize = 16;

/// Entries the content cache holds in all (`token_cache_entries`); 0 turns it off.
static ITEM_CACHE_ENTRIES: AtomicU64 = AtomicU64::new(crate::config::DEFAULT_TOKEN_CACHE_ENTRIES);
static ITEM_CACHE_HITS: AtomicU64 = AtomicU64::new(0);
static ITEM_CACHE_MISSES: AtomicU64 = AtomicU64::new(0);

/// Sets how many item counts the content cache holds (`token_cache_entries`); a process
/// sets it once at start. 0 turns the cache off.
pub fn set_cache_entries(entries: u64) {
    ITEM_CACHE_ENTRIES.store(entries, Ordering::Relaxed);
}

/// The content cache's figures: what it can hold, what it holds, and its hits and misses
/// since the process started (a miss is one item tokenized).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    pub capacity: u64,
    pub entries: u64,
    pub hits: u64,
    pub misses: u64,
}

/// The content cache's figures now.
pub fn cache_stats() -> CacheStats {
    let entries = (0..ITEM_CACHE_SHARDS)
        .map(|shard| {
            item_cache((shard as u64) << 60)
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .counts
                .len() as u64
        })
        .sum();
    CacheStats {
        capacity: ITEM_CACHE_ENTRIES.load(Ordering::Relaxed),
        entries,
        hits: ITEM_CACHE_HITS.load(Ordering::Relaxed),
        misses: ITEM_CACHE_MISSES.load(Ordering::Relaxed),
    }
}

/// The shard of the cache that holds `hash`.
fn item_cache(hash: u64) -> &'static Mutex<ItemCache> {
    static CACHE: OnceLock<Vec<Mutex<ItemCache>>> = OnceLock::new();
    let shards = CACHE.get_or_init(|| {
        (0..ITEM_CACHE_SHARDS)
            .map(|_| {
                Mutex::new(ItemCache {
                    counts: HashMap::default(),
                })
            })
            .collect()
    });
    // The high bits: FxHash's low bits are the weakest.
    &shards[(hash >> 60) as usize % ITEM_CACHE_SHARDS]
}

/// Tokens of one item, through the content cache for the BPE tokenizers (what plugins
/// count through the host services goes through it too).
pub(crate) fn count_item(tokenizer: Tokenizer, text: &str) -> u64 {
    let capacity = ITEM_CACHE_ENTRIES.load(Ordering::Relaxed);
    if tokenizer == Tokenizer::Chars4 || text.is_empty() || capacity == 0 {
        return count_text(tokenizer, text);
    }
    let hash = BuildHasherDefault::<FxHasher>::default().hash_one(text);
    let key = (tokenizer, text.len(), hash);
    let cache = item_cache(hash);
    if let Some(&count) = cache.lock().unwrap_or_else(|e| e.into_inner()).counts.get(&key) {
        ITEM_CACHE_HITS.fetch_add(1, Ordering::Relaxed);
        return count;
    }
    ITEM_CACHE_MISSES.fetch_add(1, Ordering::Relaxed);
    let count = count_text(tokenizer, text);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    let per_shard = (capacity as usize).div_ceil(ITEM_CACHE_SHARDS);
    if cache.counts.len() >= per_shard {
        cache.counts.clear();
    }
    cache.counts.insert(key, count);
    count
}

thread_local! {
    /// The media rules of the run counting on this thread (`with_media_rules`).
    static MEDIA_RULES: std::cell::Cell<Option<MediaRules>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with `rules` as what media parts cost on this thread: a chain run sets its
/// model's, and hands them to a plugin call's helper thread.
pub fn with_media_rules<R>(rules: MediaRules, f: impl FnOnce() -> R) -> R {
    let previous = MEDIA_RULES.with(|cell| cell.replace(Some(rules)));
    let result = f();
    MEDIA_RULES.with(|cell| cell.set(previous));
    result
}

/// The media rules in force on this thread (the defaults outside a run).
pub fn media_rules() -> MediaRules {
    MEDIA_RULES.with(|cell| cell.get()).unwrap_or_default()
}

/// Σ tokens over a message's parts, tool calls and reasoning members
/// (docs/wire-format.md#parts): text by the tokenizer, media and reasoning by their own
/// rules ([`crate::media`]), any other part as its JSON text. Remembered on the message
/// unless it holds an image or a document, whose cost depends on the model's rules.
pub(crate) fn content_tokens(tokenizer: Tokenizer, message: &Message) -> u64 {
    let memo = message.token_memo();
    if let Some(count) = memo.get(tokenizer.slot()) {
        return count;
    }
    let rules = media_rules();
    let mut by_rules = false;
    let mut count = 0;
    let mut part = |part: &Part| match part {
        Part::Text { text, .. } => count_item(tokenizer, text),
        Part::Opaque { json } => match media::opaque_tokens(tokenizer, json, &rules) {
            Some(tokens) => {
                by_rules |= matches!(part.kind(), PartKind::Image | PartKind::Document);
                tokens
            }
            None => count_item(tokenizer, json),
        },
    };
    match &message.content {
        Content::Null => {}
        Content::Text(text) => count += count_item(tokenizer, text),
        Content::Parts(parts) => count += parts.iter().map(&mut part).sum::<u64>(),
    }
    for call in message.tool_calls.iter() {
        count += count_item(tokenizer, &call.name) + count_item(tokenizer, &call.arguments);
    }
    if message.role == Role::Assistant {
        count += message
            .extra
            .iter()
            .map(|m| media::reasoning_member_tokens(tokenizer, &m.key, &m.json))
            .sum::<u64>();
    }
    if !by_rules {
        memo.set(tokenizer.slot(), count);
    }
    count
}

/// A message's tokens: `per_message + Σ tokens(item)`.
pub fn message_tokens(tokenizer: Tokenizer, message: &Message, per_message: u64) -> u64 {
    per_message + content_tokens(tokenizer, message)
}

/// A history's tokens with the default per-message overhead.
pub fn history_tokens(tokenizer: Tokenizer, history: &[RArc<Message>]) -> u64 {
    history
        .iter()
        .map(|m| message_tokens(tokenizer, m, PER_MESSAGE_TOKENS))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use history_wire::chat::history_from_str;

    #[test]
    fn real_encodings_and_chars4_count_items_separately() {
        assert_eq!(count_text(Tokenizer::O200kBase, "hello world"), 2);
        assert_eq!(count_text(Tokenizer::Cl100kBase, "hello world"), 2);
        assert_eq!(count_text(Tokenizer::Chars4, "héllo"), 2);
        let history = history_from_str(
            r#"[{"role":"assistant","content":"abcde","tool_calls":[{"id":"1","function":{"name":"get","arguments":"{}"}}]}]"#,
        )
        .unwrap();
        // items: "abcde" → 2, "get" → 1, "{}" → 1
        assert_eq!(message_tokens(Tokenizer::Chars4, &history[0], 3), 7);
    }

    #[test]
    fn a_merged_or_reparsed_message_is_counted_from_the_item_cache() {
        let text = "a tool result long enough to be worth caching by content, unique 7f3a";
        let one = history_from_str(&format!(
            r#"[{{"role":"tool","tool_call_id":"c","content":"{text}"}}]"#
        ))
        .unwrap();
        let first = content_tokens(Tokenizer::O200kBase, &one[0]);
        // The same content in a new message (a merge's part, a re-parsed transcript).
        let again = history_from_str(&format!(
            r#"[{{"role":"user","content":[{{"type":"text","text":"{text}"}},{{"type":"text","text":"{text}"}}]}}]"#
        ))
        .unwrap();
        // Its items are in the content cache, so counting `again` tokenizes nothing.
        let key = (
            Tokenizer::O200kBase,
            text.len(),
            BuildHasherDefault::<FxHasher>::default().hash_one(text),
        );
        assert_eq!(item_cache(key.2).lock().unwrap().counts.get(&key), Some(&first));
        assert_eq!(content_tokens(Tokenizer::O200kBase, &again[0]), 2 * first);
    }

    #[test]
    fn a_counted_message_is_not_tokenized_again() {
        let history = history_from_str(r#"[{"role":"user","content":"some words to count once"}]"#).unwrap();
        let first = content_tokens(Tokenizer::O200kBase, &history[0]);
        let before = bytes_tokenized();
        assert_eq!(content_tokens(Tokenizer::O200kBase, &history[0]), first);
        // Other tests may tokenize concurrently, but never this message's bytes again
        // through this call: the memo answered.
        assert_eq!(
            history[0].token_memo().get(Tokenizer::O200kBase.slot()),
            Some(first)
        );
        let _ = before;
    }
}
