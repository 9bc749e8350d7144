//! How a session maps to its stored form and back (docs/sessions.md#the-store): read
//! back (reusing what this host holds), what it holds for a read-back, and what a write
//! stores — its working history as references and new copies, its sent history as
//! references and inline messages, each message with its token counts.

use std::collections::HashMap;

use history_engine::turns;
use history_wire::chat::{message_to_string, parse_message};
use plugin_api::{Message, RArc, Tokenizer};
use serde_json::Value;

use super::Session;
use crate::error::{ErrorKind, SessionError};
use crate::store::{
    decode_sent, CopyRow, HostCopy, SentEntry, SessionRow, StoredMessage, StoredSession, TokenCounts,
    WorkingRef,
};

impl Session {
    /// A session as stored: its working history's messages get their transcript
    /// identities back.
    pub fn from_stored(stored: StoredSession) -> Result<Session, SessionError> {
        Session::from_stored_reusing(stored, None)
    }

    /// [`Session::from_stored`], taking from `earlier` (this session as this host last
    /// had it, before another host changed it) every message the stored histories still
    /// reference: a transcript message or a stored copy never changes under its
    /// reference (the transcript is append-only, a copy gets a new key), so only what is
    /// new since is parsed — and, read with [`Session::host_copy`], only that is read
    /// (docs/scaling-out.md#what-is-shared-what-each-host-keeps).
    pub fn from_stored_reusing(
        stored: StoredSession,
        earlier: Option<&Session>,
    ) -> Result<Session, SessionError> {
        let held = earlier.map(Session::held_messages).unwrap_or_default();
        let missing = |what: &str, r: &WorkingRef| {
            SessionError::new(
                ErrorKind::Store,
                format!("{what} {r:?} was neither read from the store nor held by this host"),
            )
        };
        let mut working = Vec::with_capacity(stored.working.len());
        let mut refs = Vec::with_capacity(stored.working.len());
        for stored_message in stored.working {
            let StoredMessage {
                reference,
                seq,
                text,
                tokens,
            } = stored_message;
            if let Some(&message) = held.get(&reference) {
                working.push(message.clone());
                refs.push(reference);
                continue;
            }
            let text = text.ok_or_else(|| missing("working history entry", &reference))?;
            let value: Value = serde_json::from_str(&text).map_err(|e| {
                SessionError::new(ErrorKind::Store, format!("stored message is not JSON: {e}"))
            })?;
            let mut message = parse_message(&value)
                .map_err(|e| SessionError::new(ErrorKind::Store, format!("stored message: {e}")))?;
            if let Some(seq) = seq {
                message.set_origin(seq);
            }
            // Counted before it was stored: not tokenized again.
            give_token_counts(&tokens, &message);
            working.push(RArc::new(message));
            refs.push(reference);
        }
        turns::prepare(&mut working, stored.row.turn.max(1));
        let (sent, last_sent, sent_copies) = match stored.sent {
            Some((encoded, texts)) => {
                let entries = decode_sent(&encoded)?;
                // A sent message that is a working one is that very message, as before
                // the session was stored: shared, not parsed a second time.
                let in_working: HashMap<WorkingRef, &RArc<Message>> =
                    refs.iter().copied().zip(&working).collect();
                let mut messages = Vec::with_capacity(texts.len());
                for (entry, text) in entries.iter().zip(texts) {
                    if let SentEntry::Ref(reference) = entry {
                        if let Some(&message) = in_working.get(reference).or_else(|| held.get(reference)) {
                            messages.push(message.clone());
                            continue;
                        }
                    }
                    let text = match (entry, text) {
                        (_, Some(text)) => text,
                        (SentEntry::Ref(reference), None) => {
                            return Err(missing("sent history entry", reference))
                        }
                        (SentEntry::Inline(text), None) => text.clone(),
                    };
                    let value: Value = serde_json::from_str(&text).map_err(|e| {
                        SessionError::new(ErrorKind::Store, format!("stored sent message is not JSON: {e}"))
                    })?;
                    let message = parse_message(&value).map_err(|e| {
                        SessionError::new(ErrorKind::Store, format!("stored sent message: {e}"))
                    })?;
                    messages.push(RArc::new(message));
                }
                let copies = copies_of(&entries);
                (Some(encoded), Some(messages), copies)
            }
            None => (None, None, Vec::new()),
        };
        Ok(Session {
            row: stored.row,
            working,
            refs,
            last_sent,
            sent,
            sent_copies,
        })
    }

    /// The messages this session holds under a store reference: its working history's,
    /// and its last sent history's that are references.
    fn held_messages(&self) -> HashMap<WorkingRef, &RArc<Message>> {
        let mut held: HashMap<WorkingRef, &RArc<Message>> =
            self.refs.iter().copied().zip(&self.working).collect();
        for (reference, message) in self.sent_references() {
            held.entry(reference).or_insert(message);
        }
        held
    }

    /// The last sent history's messages that are store references, with them.
    fn sent_references(&self) -> impl Iterator<Item = (WorkingRef, &RArc<Message>)> {
        let entries = match (&self.sent, &self.last_sent) {
            (Some(encoded), Some(_)) => decode_sent(encoded).unwrap_or_default(),
            _ => Vec::new(),
        };
        entries
            .into_iter()
            .zip(self.last_sent.iter().flatten())
            .filter_map(|(entry, message)| match entry {
                SentEntry::Ref(reference) => Some((reference, message)),
                SentEntry::Inline(_) => None,
            })
    }

    /// What this host holds of the session, for [`Store::lock`]: a read-back after
    /// another host's change sends only the messages not among these (the references of
    /// [`Session::held_messages`], repeats and all).
    pub fn host_copy(&self) -> HostCopy {
        let sent = self.sent_references().map(|(reference, _)| reference);
        HostCopy {
            version: self.row.version,
            refs: self.refs.iter().copied().chain(sent).collect(),
        }
    }

    /// The stored working history's messages by identity, with their store entries.
    pub(super) fn known(&self) -> Known {
        by_origin(&self.working, &self.refs)
    }

    /// What storing `working` writes: a message that is (byte for byte) one the store has
    /// keeps its entry; any other becomes a new copy.
    pub(super) fn working_update(
        &self,
        row: &mut SessionRow,
        working: &[RArc<Message>],
        known: &Known,
    ) -> WorkingUpdate {
        let mut refs = Vec::with_capacity(working.len());
        let mut new_copies = Vec::new();
        for message in working {
            let reference = match entry_of(known, message) {
                Some(r) => r,
                None => {
                    let key = row.next_copy;
                    row.next_copy += 1;
                    let origin = message.origin();
                    let text = message_to_string(message);
                    // The answer writes this working message too: it copies this text.
                    history_engine::written::remember(message, &text);
                    new_copies.push(CopyRow {
                        key,
                        seq: (origin != 0 && origin <= row.transcript_len).then_some(origin),
                        message: text,
                        tokens: token_counts(message),
                    });
                    WorkingRef::Copy(key)
                }
            };
            refs.push(reference);
        }
        WorkingUpdate { refs, new_copies }
    }

    /// The copies stored now that neither the new working history (`refs`) nor the sent
    /// history to be stored (`sent_copies`) uses: dropped by the same write.
    pub(super) fn dropped(&self, refs: &[WorkingRef], sent_copies: &[u64]) -> Vec<u64> {
        let copies = |refs: &[WorkingRef]| {
            refs.iter()
                .filter_map(|r| match r {
                    WorkingRef::Copy(k) => Some(*k),
                    WorkingRef::Transcript(_) => None,
                })
                .collect::<Vec<u64>>()
        };
        let kept: rustc_hash::FxHashSet<u64> = copies(refs)
            .into_iter()
            .chain(sent_copies.iter().copied())
            .collect();
        let mut dropped: Vec<u64> = copies(&self.refs)
            .into_iter()
            .chain(self.sent_copies.iter().copied())
            .filter(|k| !kept.contains(k))
            .collect();
        dropped.sort_unstable();
        dropped.dedup();
        dropped
    }
}

/// The sent history as stored: a message that is one of the working history's (the same
/// message, or the same bytes) is its entry; any other (changed by a view stage, or by
/// the turn's display context) is stored whole.
pub(super) fn sent_entries(
    sent: &[RArc<Message>],
    working: &[RArc<Message>],
    refs: &[WorkingRef],
) -> Vec<SentEntry> {
    let known = by_origin(working, refs);
    sent.iter()
        .map(|message| match entry_of(&known, message) {
            Some(reference) => SentEntry::Ref(reference),
            None => SentEntry::Inline(message_to_string(message)),
        })
        .collect()
}

/// `messages` by identity, each with its store entry (`refs`, in step).
fn by_origin(messages: &[RArc<Message>], refs: &[WorkingRef]) -> Known {
    let mut known = Known::with_capacity(messages.len() + 16);
    for (message, reference) in messages.iter().zip(refs) {
        known.add(message, *reference);
    }
    known
}

/// The store entry of `message` in `known`: of the very same message, or of one with the
/// same identity and the same bytes.
fn entry_of(known: &Known, message: &RArc<Message>) -> Option<WorkingRef> {
    known.of(message.origin()).find_map(|(m, reference)| {
        (std::ptr::eq::<Message>(&**m, &**message) || **m == **message).then_some(reference)
    })
}

/// The token counts `message` remembers, as the store keeps them beside it: a count is
/// the tokens of the message's items, which depend on its text alone, so a host reading
/// the message back takes it instead of tokenizing again (docs/sessions.md#the-store).
pub(super) fn token_counts(message: &Message) -> TokenCounts {
    let memo = message.token_memo();
    let pairs: Vec<String> = Tokenizer::ALL
        .iter()
        .filter_map(|t| memo.get(t.slot()).map(|count| format!("{}:{count}", t.as_str())))
        .collect();
    TokenCounts((!pairs.is_empty()).then(|| pairs.join(",")))
}

/// Gives `message`, read back, the counts stored with it. What does not read as a count
/// is left out: they are a cache, and the message is counted again.
fn give_token_counts(counts: &TokenCounts, message: &Message) {
    let Some(text) = &counts.0 else { return };
    for pair in text.split(',') {
        let Some((name, count)) = pair.split_once(':') else {
            continue;
        };
        if let (Some(tokenizer), Ok(count)) = (Tokenizer::parse(name), count.parse::<u64>()) {
            message.token_memo().set(tokenizer.slot(), count);
        }
    }
}

/// The working copies a stored sent history references.
pub(super) fn copies_of(entries: &[SentEntry]) -> Vec<u64> {
    let mut copies: Vec<u64> = entries
        .iter()
        .filter_map(|e| match e {
            SentEntry::Ref(WorkingRef::Copy(k)) => Some(*k),
            _ => None,
        })
        .collect();
    copies.sort_unstable();
    copies.dedup();
    copies
}

/// Messages by identity (their origin), each with its store entry ([`entry_of`]); built
/// twice a turn over the whole working history, so hashed with FxHash, and with no list
/// per identity: nearly every identity has one message, the others wait in `more`.
#[derive(Default)]
pub(super) struct Known {
    first: HashMap<u64, (RArc<Message>, WorkingRef), rustc_hash::FxBuildHasher>,
    more: Vec<(u64, RArc<Message>, WorkingRef)>,
}

impl Known {
    pub(super) fn with_capacity(capacity: usize) -> Known {
        Known {
            first: HashMap::with_capacity_and_hasher(capacity, Default::default()),
            more: Vec::new(),
        }
    }

    pub(super) fn add(&mut self, message: &RArc<Message>, reference: WorkingRef) {
        let origin = message.origin();
        match self.first.entry(origin) {
            std::collections::hash_map::Entry::Vacant(entry) => {
                entry.insert((message.clone(), reference));
            }
            std::collections::hash_map::Entry::Occupied(_) => {
                self.more.push((origin, message.clone(), reference));
            }
        }
    }

    /// The messages of `origin` with their entries, in the order they were added.
    fn of(&self, origin: u64) -> impl Iterator<Item = (&RArc<Message>, WorkingRef)> {
        let first = self.first.get(&origin).map(|(m, r)| (m, *r));
        let more = self
            .more
            .iter()
            .filter(move |(o, ..)| *o == origin)
            .map(|(_, m, r)| (m, *r));
        first.into_iter().chain(more)
    }
}

/// What storing a working history writes ([`Session::working_update`]).
pub(super) struct WorkingUpdate {
    pub(super) refs: Vec<WorkingRef>,
    pub(super) new_copies: Vec<CopyRow>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_counts_are_stored_by_tokenizer_name_and_a_bad_pair_is_left_out() {
        let message = || parse_message(&serde_json::json!({"role": "user", "content": "hi"})).unwrap();
        let counted = message();
        assert_eq!(token_counts(&counted), TokenCounts(None), "nothing counted yet");
        counted.token_memo().set(Tokenizer::O200kBase.slot(), 5);
        counted.token_memo().set(Tokenizer::Chars4.slot(), 1);
        let stored = token_counts(&counted);
        assert_eq!(stored.0.as_deref(), Some("o200k_base:5,chars4:1"));

        let read_back = message();
        give_token_counts(&stored, &read_back);
        assert_eq!(token_counts(&read_back), stored);

        let damaged = message();
        give_token_counts(
            &TokenCounts(Some("o200k_base:5,bogus:3,cl100k_base:x,chars4".into())),
            &damaged,
        );
        assert_eq!(token_counts(&damaged).0.as_deref(), Some("o200k_base:5"));
    }
}
