//! A session's answer written as JSON text with each lasting message written once
//! (docs/sessions.md#answers). The answer carries the whole sent history every turn, and
//! most of its messages are the very ones the last answer carried: the session keeps them
//! in its working history from turn to turn. So the text of each such message is
//! remembered, by the message's address, and a message met again is copied from there
//! instead of being escaped again.
//!
//! Exact: an entry holds a clone of the message's `RArc`, so its address cannot be
//! reused by another message while it is a key, and a shared message cannot change (a
//! plugin that changes one changes a copy). What a message may still differ in, its turn
//! and identity, is never written. Bounded ([`crate::bounded`]): [`MAX_ENTRIES`]
//! messages and [`MAX_BYTES`] in all (text and message counted), in shards by address.
//! Only lasting messages are remembered: one a view stage made for one answer would never
//! be met again.

use std::collections::HashSet;
use std::hash::BuildHasherDefault;
use std::sync::OnceLock;

use history_wire::chat::write_message;
use plugin_api::{Message, RArc};
use rustc_hash::FxHasher;

use crate::bounded::BoundedMap;

/// Messages remembered in all.
pub const MAX_ENTRIES: usize = 65_536;
/// Bytes remembered in all: each text counted twice (the text, and the message the entry
/// keeps alive).
pub const MAX_BYTES: usize = 64 << 20;

/// Appends `history` to `out` as compact JSON text, as
/// `history_wire::chat::history_to_string` writes it. The messages of `history` that are
/// also in `lasting` (the working history a session keeps for its next turn) are
/// remembered; the others (made for this answer by a view stage) are written and
/// forgotten, so they do not crowd out what comes again.
pub fn write_history(out: &mut String, history: &[RArc<Message>], lasting: &[RArc<Message>]) {
    memory().write(out, history, lasting);
}

/// Remembers `text` as the JSON text of `message`, written by the caller with
/// `history_wire::chat::write_message` (a session writes each new message's transcript row
/// so): its first answer copies it instead of escaping the message a second time. The
/// caller passes only a message of the working history it keeps, as [`write_history`]
/// remembers only those.
pub fn remember(message: &RArc<Message>, text: &str) {
    memory().remember(message, text);
}

fn memory() -> &'static Memory {
    static WIRE: OnceLock<Memory> = OnceLock::new();
    WIRE.get_or_init(Memory::default)
}

/// A message's address → the message (kept alive, so the address stays its) and its text.
struct Memory(BoundedMap<usize, (RArc<Message>, Box<str>)>);

impl Default for Memory {
    fn default() -> Memory {
        Memory(BoundedMap::new(MAX_ENTRIES, MAX_BYTES))
    }
}

fn address(message: &RArc<Message>) -> usize {
    std::ptr::from_ref::<Message>(message) as usize
}

/// The shard of an address: allocations are aligned, so the low bits say little.
fn spread(address: usize) -> u64 {
    (address >> 6) as u64
}

impl Memory {
    fn write(&self, out: &mut String, history: &[RArc<Message>], lasting: &[RArc<Message>]) {
        let lasting: HashSet<usize, BuildHasherDefault<FxHasher>> = lasting.iter().map(address).collect();
        out.push('[');
        for (i, message) in history.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let key = address(message);
            if !lasting.contains(&key) {
                write_message(out, message);
                continue;
            }
            if self
                .0
                .get(spread(key), &key, |(_, text)| out.push_str(text))
                .is_some()
            {
                continue;
            }
            let start = out.len();
            write_message(out, message);
            self.remember(message, &out[start..]);
        }
        out.push(']');
    }

    /// Keeps `text` as `message`'s, the message with it (so its address stays its own).
    fn remember(&self, message: &RArc<Message>, text: &str) {
        let key = address(message);
        let bytes = 2 * text.len() + std::mem::size_of::<Message>();
        self.0
            .insert(spread(key), key, (message.clone(), text.into()), bytes);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use history_wire::chat::history_from_str;

    const JSON: &str = r#"[{"role":"user","content":"a\nb","metadata":{"id":"m1","turn_added":1}},{"role":"tool","tool_call_id":"c","content":"[Omitted]","metadata":{"omitted":true,"original_content":"long"}}]"#;

    fn written(memory: &Memory, history: &[RArc<Message>], lasting: &[RArc<Message>]) -> String {
        let mut out = String::from("x");
        memory.write(&mut out, history, lasting);
        out.split_off(1)
    }

    #[test]
    fn what_is_written_is_what_the_wire_writer_writes_the_first_time_and_after() {
        let memory = Memory::default();
        let history = history_from_str(JSON).unwrap();
        for _ in 0..2 {
            assert_eq!(
                written(&memory, &history, &history),
                history_wire::chat::history_to_string(&history)
            );
        }
        assert_eq!(written(&memory, &history[..0], &history), "[]");
        let mut out = String::new();
        write_history(&mut out, &history, &history);
        assert_eq!(out, history_wire::chat::history_to_string(&history));
    }

    #[test]
    fn a_remembered_transcript_text_is_what_the_answer_copies() {
        let history = history_from_str(JSON).unwrap();
        remember(&history[0], &history_wire::chat::message_to_string(&history[0]));
        let mut out = String::new();
        write_history(&mut out, &history, &history);
        assert_eq!(out, history_wire::chat::history_to_string(&history));
        // The copy is what was remembered: a text remembered for a message is its text.
        let marked = history_from_str(JSON).unwrap();
        remember(&marked[1], "\"marker\"");
        let mut out = String::new();
        write_history(&mut out, &marked, &marked);
        assert!(out.ends_with(",\"marker\"]"), "{out}");
    }

    #[test]
    fn a_lasting_message_met_again_is_copied_and_a_changed_copy_is_written_anew() {
        let memory = Memory::default();
        let history = history_from_str(JSON).unwrap();
        let out = written(&memory, &history, &history);
        assert_eq!(memory.len(), 2);
        // A copy changed as a plugin changes one: another message, another entry.
        let mut changed = history.clone();
        RArc::make_mut(&mut changed[0]).content = plugin_api::Content::Text("c".into());
        assert_eq!(
            written(&memory, &changed, &changed),
            history_wire::chat::history_to_string(&changed)
        );
        assert_eq!(memory.len(), 3);
        // Its turn and identity are not written: a copy with only its turn changed is
        // written as the same text.
        let mut turned = history.clone();
        RArc::make_mut(&mut turned[0]).turn = 9;
        assert_eq!(written(&memory, &turned, &turned), out);
        assert_eq!(memory.len(), 4);
    }

    #[test]
    fn a_message_not_lasting_is_written_and_not_remembered() {
        let memory = Memory::default();
        let history = history_from_str(JSON).unwrap();
        let out = written(&memory, &history, &history[..1]);
        assert_eq!(out, history_wire::chat::history_to_string(&history));
        assert_eq!(memory.len(), 1);
    }

    #[test]
    fn the_memory_is_bounded_by_entries() {
        let memory = Memory::default();
        for round in 0..(MAX_ENTRIES / 100 + 50) {
            let json: Vec<String> = (0..100)
                .map(|i| format!(r#"{{"role":"user","content":"{round} {i}"}}"#))
                .collect();
            let history = history_from_str(&format!("[{}]", json.join(","))).unwrap();
            memory.write(&mut String::new(), &history, &history);
            assert!(memory.len() <= MAX_ENTRIES);
        }
        assert!(memory.len() > 0);
    }
}
