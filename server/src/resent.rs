//! The proxy's memory of the messages clients resend (docs/proxy.md#stateless-by-default).
//! An OpenAI client sends the whole conversation on every call, each message as the same
//! JSON text as last time; parsing it again is most of what a stateless call would cost.
//! So each message's text is remembered with the message parsed from it, and a message
//! whose text was seen before is that same parsed message again: not parsed, not copied,
//! and its token counts (kept on the message) not looked up again.
//!
//! Exact: a message is found by its text's hash and then compared byte for byte, so two
//! texts never share a parse. Bounded (`history_engine::bounded`): [`MAX_ENTRIES`]
//! messages and [`MAX_BYTES`] in all, in shards by hash.

use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::Arc;

use history_engine::bounded::BoundedMap;
use history_wire::anthropic;
use history_wire::chat::{parse_message, ShapeError};
use history_wire::responses::{Item, Memory, Parsed};
use plugin_api::{Message, RArc};
use rustc_hash::FxHasher;
use serde_json::value::RawValue;
use serde_json::Value;

/// Messages remembered in all.
pub(crate) const MAX_ENTRIES: usize = 65_536;
/// Bytes remembered in all: each message's text, counted twice for the parsed copy.
pub(crate) const MAX_BYTES: usize = 64 << 20;

/// A message text's length and hash.
type Key = (usize, u64);

/// A text's key → the text and its message.
pub(crate) struct ResentMessages(BoundedMap<Key, (Box<str>, RArc<Message>)>);

impl Default for ResentMessages {
    fn default() -> Self {
        ResentMessages(BoundedMap::new(MAX_ENTRIES, MAX_BYTES))
    }
}

/// The shard of a key: FxHash's high bits are its strongest.
fn spread(key: Key) -> u64 {
    key.1 >> 60
}

impl ResentMessages {
    /// The history of `texts` (a request's `messages`, each element's JSON text): each
    /// message remembered when its text was seen before, parsed otherwise. `prepare`
    /// runs on the whole history before the newly parsed messages are remembered, while
    /// nothing else holds them, so what it sets on them (identities, turns:
    /// `history_engine::turns::prepare`) is set in place and kept. Errors name the
    /// message's index.
    pub(crate) fn parse(
        &self,
        texts: &[&RawValue],
        prepare: impl FnOnce(&mut [RArc<Message>]),
    ) -> Result<Vec<RArc<Message>>, ShapeError> {
        let keys: Vec<Key> = texts.iter().map(|text| key(text.get())).collect();
        let mut history = Vec::with_capacity(texts.len());
        let mut parsed = Vec::new();
        for (index, (text, key)) in texts.iter().zip(&keys).enumerate() {
            if let Some(message) = self.find(text.get(), *key) {
                history.push(message);
                continue;
            }
            let value: Value =
                serde_json::from_str(text.get()).map_err(|e| ShapeError(format!("message {index}: {e}")))?;
            let message =
                parse_message(&value).map_err(|e| ShapeError(format!("message {index}: {}", e.0)))?;
            history.push(RArc::new(message));
            parsed.push(index);
        }
        prepare(&mut history);
        for index in parsed {
            let (text, key) = (texts[index].get(), keys[index]);
            let bytes = 2 * text.len() + std::mem::size_of::<Message>();
            self.0
                .insert(spread(key), key, (text.into(), history[index].clone()), bytes);
        }
        Ok(history)
    }

    /// The message parsed from `text` before, compared byte for byte (never trusted by key).
    fn find(&self, text: &str, key: Key) -> Option<RArc<Message>> {
        self.0
            .get(spread(key), &key, |(seen, message)| {
                (**seen == *text).then(|| message.clone())
            })
            .flatten()
    }

    /// Messages remembered now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// The same memory for the Responses wire (docs/proxy.md#responses): each `input` item's
/// text with the item read from it, and each message made of items with those items
/// (compared by address: an entry holds its items, so an address is never reused while
/// it is there). Bounded like [`ResentMessages`], each map on its own.
pub(crate) struct ResentItems {
    items: BoundedMap<Key, (Box<str>, Arc<Item>)>,
    messages: BoundedMap<u64, MadeOf>,
}

impl Default for ResentItems {
    fn default() -> Self {
        ResentItems {
            items: BoundedMap::new(MAX_ENTRIES, MAX_BYTES),
            messages: BoundedMap::new(MAX_ENTRIES, MAX_BYTES),
        }
    }
}

/// A message and the items it was made of.
type MadeOf = (Box<[Arc<Item>]>, RArc<Message>);

/// A run of items' key: their addresses hashed.
fn items_key(items: &[Arc<Item>]) -> u64 {
    let mut hasher = FxHasher::default();
    for item in items {
        hasher.write_usize(Arc::as_ptr(item) as usize);
    }
    hasher.finish()
}

impl Memory for ResentItems {
    fn item(&self, raw: &str) -> Option<Arc<Item>> {
        let key = key(raw);
        self.items
            .get(spread(key), &key, |(seen, item)| {
                (**seen == *raw).then(|| item.clone())
            })
            .flatten()
    }

    fn message(&self, items: &[Arc<Item>]) -> Option<RArc<Message>> {
        let key = items_key(items);
        self.messages
            .get(key >> 60, &key, |(seen, message)| {
                let same =
                    seen.len() == items.len() && seen.iter().zip(items).all(|(a, b)| Arc::ptr_eq(a, b));
                same.then(|| message.clone())
            })
            .flatten()
    }
}

impl ResentItems {
    /// Keeps what `parsed` read and made, once its messages are prepared (as
    /// [`ResentMessages::parse`] keeps a message after `prepare`).
    pub(crate) fn remember(&self, parsed: &Parsed<'_>) {
        for (raw, item) in parsed.parsed_items() {
            let key = key(raw);
            self.items.insert(
                spread(key),
                key,
                (raw.into(), item.clone()),
                raw.len() + item.weight(),
            );
        }
        for (items, message) in parsed.made_messages() {
            let key = items_key(items);
            let bytes = items.iter().map(|item| item.weight()).sum::<usize>();
            self.messages
                .insert(key >> 60, key, (items.into(), message.clone()), bytes);
        }
    }
}

/// The same memory for the Anthropic wire (docs/proxy.md#anthropic-messages): each
/// message's text with what it was read into (its host messages, prepared).
pub(crate) struct ResentAnthropic(BoundedMap<Key, (Box<str>, Arc<anthropic::Read>)>);

impl Default for ResentAnthropic {
    fn default() -> Self {
        ResentAnthropic(BoundedMap::new(MAX_ENTRIES, MAX_BYTES))
    }
}

impl anthropic::Memory for ResentAnthropic {
    fn message(&self, raw: &str) -> Option<Arc<anthropic::Read>> {
        let key = key(raw);
        self.0
            .get(spread(key), &key, |(seen, read)| {
                (**seen == *raw).then(|| read.clone())
            })
            .flatten()
    }
}

impl ResentAnthropic {
    /// Keeps what `parsed` read, once its messages are prepared.
    pub(crate) fn remember(&self, parsed: &anthropic::Parsed<'_>) {
        for (raw, read) in parsed.reads() {
            let key = key(raw);
            let bytes = raw.len() + read.weight();
            self.0
                .insert(spread(key), key, (raw.into(), Arc::new(read)), bytes);
        }
    }
}

fn key(text: &str) -> Key {
    (
        text.len(),
        BuildHasherDefault::<FxHasher>::default().hash_one(text),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(a: &RArc<Message>, b: &RArc<Message>) -> bool {
        std::ptr::eq::<Message>(&**a, &**b)
    }

    fn texts(json: &str) -> Vec<&RawValue> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_resent_message_is_the_same_parsed_message_and_a_new_one_is_parsed() {
        let memory = ResentMessages::default();
        let first = r#"[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]"#;
        let one = memory.parse(&texts(first), |_| {}).unwrap();
        let second = r#"[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]"#;
        let two = memory.parse(&texts(second), |_| {}).unwrap();
        assert!(same(&one[0], &two[0]) && same(&one[1], &two[1]));
        assert_eq!(two[2].content.text(), "c");
        assert_eq!(memory.len(), 3);
        // The same value spelled otherwise is another text: parsed, equal, not shared.
        let spaced = r#"[{"role": "user", "content": "a"}]"#;
        let three = memory.parse(&texts(spaced), |_| {}).unwrap();
        assert!(!same(&one[0], &three[0]));
        assert_eq!(one[0].content, three[0].content);
    }

    #[test]
    fn what_prepare_sets_on_a_new_message_is_remembered_with_it() {
        let memory = ResentMessages::default();
        let json = r#"[{"role":"user","content":"a"}]"#;
        let one = memory
            .parse(&texts(json), |history| RArc::make_mut(&mut history[0]).turn = 7)
            .unwrap();
        let two = memory.parse(&texts(json), |_| {}).unwrap();
        assert!(same(&one[0], &two[0]));
        assert_eq!(two[0].turn, 7);
    }

    #[test]
    fn a_text_with_the_same_key_but_other_bytes_is_never_taken_for_it() {
        let memory = ResentMessages::default();
        let json = r#"[{"role":"user","content":"a"}]"#;
        let one = memory.parse(&texts(json), |_| {}).unwrap();
        // Forge a collision: another text stored under this text's key.
        let other = r#"{"role":"user","content":"b"}"#;
        let k = key(r#"{"role":"user","content":"a"}"#);
        memory.0.insert(spread(k), k, (other.into(), one[0].clone()), 0);
        let two = memory.parse(&texts(json), |_| {}).unwrap();
        assert!(
            !same(&one[0], &two[0]),
            "compared byte for byte, not trusted by key"
        );
        assert_eq!(two[0].content.text(), "a");
    }

    #[test]
    fn bad_messages_are_errors_naming_their_index_and_nothing_is_remembered() {
        let memory = ResentMessages::default();
        let json = r#"[{"role":"user","content":"a"},{"role":"robot","content":"b"}]"#;
        let e = memory.parse(&texts(json), |_| {}).unwrap_err();
        assert!(e.0.starts_with("message 1: "), "{}", e.0);
        assert_eq!(memory.len(), 0);
    }

    #[test]
    fn the_memory_is_bounded_by_entries() {
        let memory = ResentMessages::default();
        for round in 0..(MAX_ENTRIES / 100 + 50) {
            let batch: Vec<String> = (0..100)
                .map(|i| format!(r#"{{"role":"user","content":"{round} {i}"}}"#))
                .collect();
            let json = format!("[{}]", batch.join(","));
            memory.parse(&texts(&json), |_| {}).unwrap();
            assert!(memory.len() <= MAX_ENTRIES);
        }
        assert!(memory.len() > 0);
    }
}
