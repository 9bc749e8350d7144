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

use plugin_api::parts::{MediaRules, PartKind};
use plugin_api::{Content, Event, EventKind, Message, Part, RArc, Tokenizer};

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

/// Σ tokens(item) over a message's items, remembered on the message: each part by its
/// kind's rule under the model's [`MediaRules`] (docs/wire-format.md#part-kinds, the rules
/// from [`with_media_rules`]), its reasoning members and its tool calls by the tokenizer.
pub(crate) fn content_tokens(tokenizer: Tokenizer, message: &Message) -> u64 {
    let (rules, tag) = current_rules();
    let memo = message.token_memo();
    if let Some(stored) = memo.get(tokenizer.slot()) {
        // A count whose rules differ (another model with this tokenizer) is counted again;
        // one that depends on no rules holds for every model.
        if stored >> TAG_SHIFT == TEXT_TAG || stored >> TAG_SHIFT == tag {
            return stored & COUNT_MASK;
        }
    }
    let mut media = false;
    let mut count = 0u64;
    for part in parts_of(&message.content) {
        let kind = part.kind();
        media |= matches!(kind, PartKind::Image | PartKind::Document | PartKind::Audio);
        if kind == PartKind::Other {
            warn_unknown_kind(part);
        }
        let cost = part.cost(&rules);
        count += cost.tokens
            + cost
                .texts
                .iter()
                .map(|text| count_item(tokenizer, text))
                .sum::<u64>();
    }
    if let Content::Text(text) = &message.content {
        count += count_item(tokenizer, text);
    }
    count += message
        .reasoning_texts()
        .map(|text| count_item(tokenizer, &text))
        .sum::<u64>();
    count += message
        .tool_calls
        .iter()
        .map(|call| count_item(tokenizer, &call.name) + count_item(tokenizer, &call.arguments))
        .sum::<u64>();
    let count = count.min(COUNT_MASK);
    memo.set(
        tokenizer.slot(),
        ((if media { tag } else { TEXT_TAG }) << TAG_SHIFT) | count,
    );
    count
}

fn parts_of(content: &Content) -> &[Part] {
    match content {
        Content::Parts(parts) => parts.as_slice(),
        _ => &[],
    }
}

/// A message's memo holds `tag << TAG_SHIFT | count`: the tag says which rules the count
/// was made under. [`TEXT_TAG`]: a count no rule changes (no image, document or audio);
/// another tag: a hash of the [`MediaRules`] (stable from process to process, as the
/// session store keeps counts). A count stored before tags (tag 0) is counted again.
const TAG_SHIFT: u32 = 48;
const COUNT_MASK: u64 = (1 << TAG_SHIFT) - 1;
const TEXT_TAG: u64 = 1;

fn rules_tag(rules: &MediaRules) -> u64 {
    let hash = BuildHasherDefault::<FxHasher>::default().hash_one(rules);
    2 + hash % 0xfffe
}

thread_local! {
    /// The rules of the model of the run this thread counts for (see [`with_media_rules`]).
    static RULES: std::cell::Cell<Option<(MediaRules, u64)>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with this thread counting images and documents by `rules`, the model of the
/// run's (`[models.NAME]`, docs/configuration.md#models). The host sets it around every
/// chain run and every plugin call, on the thread the call runs on, so a plugin's counts
/// through the host services use its call's model without any change of the ABI. A
/// thread without it (one a plugin started itself) counts by OpenAI's family defaults.
pub fn with_media_rules<T>(rules: MediaRules, f: impl FnOnce() -> T) -> T {
    let before = RULES.with(|cell| cell.replace(Some((rules, rules_tag(&rules)))));
    struct Restore(Option<(MediaRules, u64)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            RULES.with(|cell| cell.set(self.0));
        }
    }
    let _restore = Restore(before);
    f()
}

/// The rules this thread counts by, and their tag.
pub(crate) fn current_rules() -> (MediaRules, u64) {
    RULES
        .with(|cell| cell.get())
        .unwrap_or_else(|| (MediaRules::OPENAI, rules_tag(&MediaRules::OPENAI)))
}

/// Logs once per process each part type the host does not know (counted as its JSON text).
fn warn_unknown_kind(part: &Part) {
    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let name = part.type_name().unwrap_or("(no type)");
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    // Bounded: past 64 names, nothing more is remembered or logged.
    if seen.len() < 64 && !seen.iter().any(|n| n == name) {
        seen.push(name.to_string());
        tracing::warn!(
            "a content part of type {} is not a kind the host knows: counted as its JSON text (docs/wire-format.md#part-kinds)",
            plugin_api::echo::quoted(name)
        );
    }
}

/// One `warning` event per content-part type in `history` that the host does not know
/// (kept verbatim, counted as its JSON text), about the first message carrying it: what a
/// run reports besides its plugins' events (docs/wire-format.md#part-kinds). Reads each
/// opaque part's `"type"` from the head of its text, never its payload.
pub(crate) fn unknown_part_events(history: &[RArc<Message>]) -> Vec<Event> {
    let mut events: Vec<(String, Event)> = Vec::new();
    for (index, message) in history.iter().enumerate() {
        for part in parts_of(&message.content) {
            if part.kind() != PartKind::Other {
                continue;
            }
            let name = part.type_name().unwrap_or("(no type)");
            // Bounded like the log: a history of many invented types names the first 16.
            if events.len() < 16 && !events.iter().any(|(seen, _)| seen == name) {
                let reason = format!(
                    "a content part of type {} is not a kind the host knows: kept verbatim, counted as its JSON text (docs/wire-format.md#part-kinds)",
                    plugin_api::echo::quoted(name)
                );
                events.push((
                    name.to_string(),
                    Event::of(EventKind::Warning, reason).at(index, message),
                ));
            }
        }
    }
    events.into_iter().map(|(_, event)| event).collect()
}

/// Σ tokens over `items`, each through the content cache: how a message was counted before
/// part kinds (every part as its text or JSON text), kept for `cargo xtask bench`'s ratio.
pub fn items_tokens<'a>(tokenizer: Tokenizer, items: impl Iterator<Item = &'a str>) -> u64 {
    items.map(|item| count_item(tokenizer, item)).sum()
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
            history[0]
                .token_memo()
                .get(Tokenizer::O200kBase.slot())
                .map(|m| m & COUNT_MASK),
            Some(first)
        );
        let _ = before;
    }

    #[test]
    fn an_image_costs_its_tiles_not_its_base64_and_each_model_counts_by_its_rules() {
        use plugin_api::parts::samples::{image_url_part, png};
        let part = image_url_part("image/png", &png(1024, 1024), Some("high"));
        let history = history_from_str(&format!(
            r#"[{{"role":"user","content":[{{"type":"text","text":"hello world"}},{part}],"reasoning_content":"hello world"}}]"#
        ))
        .unwrap();
        let before = bytes_tokenized();
        let openai = with_media_rules(MediaRules::OPENAI, || {
            content_tokens(Tokenizer::O200kBase, &history[0])
        });
        assert_eq!(openai, 2 + 765 + 2);
        // The base64 (over a megabyte) was never handed to the tokenizer.
        assert!(bytes_tokenized() - before < 1000);
        // The same message on an Anthropic model: its rule, not the count remembered above.
        let anthropic = with_media_rules(MediaRules::ANTHROPIC, || {
            content_tokens(Tokenizer::O200kBase, &history[0])
        });
        assert_eq!(anthropic, 2 + 1399 + 2);
        // And back: the memo's tag says which rules it holds.
        assert_eq!(
            with_media_rules(MediaRules::OPENAI, || content_tokens(
                Tokenizer::O200kBase,
                &history[0]
            )),
            openai
        );
    }
}
