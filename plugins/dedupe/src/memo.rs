//! What `dedupe` remembers across calls (docs/plugins.md#dedupe): each tool result's
//! content hash, keyed by the address of the message, so a session that resends its
//! working history every turn has each result hashed once, not once per turn.
//!
//! Exact, never a stale hash: messages cross the ABI as `RArc<Message>` and are never
//! changed once shared, and an entry holds a clone of the `RArc` it is keyed by, so the
//! address cannot be freed and reused by another message while it is a key. (The host
//! changes a message in place only through `RArc::make_mut` on a message nobody else
//! holds; the entry's clone makes that a copy at a new address.) A changed copy made by
//! an earlier stage is a new `RArc` every call: it is hashed every call. So are the
//! messages of an isolated plugin's worker (docs/chain.md#isolation), decoded anew each
//! call.
//!
//! Bounded and shared: the plugin instance serves every session's calls, from many threads
//! at once. The entries are split into [`SHARDS`] shards by address, each under its own
//! lock, taken once per call for the lookups and once for the new entries; no lock is
//! held while hashing. A shard past its share of [`MAX_ENTRIES`] or [`MAX_BYTES`] forgets
//! the entries seen least recently (by the call that last looked them up) down to three
//! quarters of its share; a result past a shard's byte share is not remembered.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use plugin_api::{Content, Message, RArc};
use rustc_hash::FxHashMap;

/// Shards of the memo: calls of many sessions look up at once.
pub const SHARDS: usize = 16;
/// Results remembered, over all shards.
pub const MAX_ENTRIES: usize = 65_536;
/// Content bytes of the results remembered, over all shards (what the memo can keep
/// alive once the sessions holding them have let go).
pub const MAX_BYTES: usize = 64 << 20;

/// What a call's lookups came to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Bytes of content hashed in this call (the text of every item hashed).
    pub bytes_hashed: u64,
    /// Results hashed in this call.
    pub hashed: usize,
    /// Results whose hash was remembered from an earlier call.
    pub remembered: usize,
}

struct Entry {
    /// Keeps the address a key while the entry lives.
    _message: RArc<Message>,
    /// `None`: the result is too short to take part (its content decides that too).
    hash: Option<u64>,
    bytes: usize,
    last_call: u64,
}

#[derive(Default)]
struct Shard {
    entries: FxHashMap<usize, Entry>,
    bytes: usize,
}

impl Shard {
    /// Forgets the entries seen least recently until the shard is within three quarters
    /// of its share (so this runs once per many inserts, not at each).
    fn evict(&mut self) {
        let (max_entries, max_bytes) = (MAX_ENTRIES / SHARDS, MAX_BYTES / SHARDS);
        if self.entries.len() <= max_entries && self.bytes <= max_bytes {
            return;
        }
        let mut by_age: Vec<(u64, usize)> = self.entries.iter().map(|(&k, e)| (e.last_call, k)).collect();
        by_age.sort_unstable();
        for (_, key) in by_age {
            if self.entries.len() <= max_entries * 3 / 4 && self.bytes <= max_bytes * 3 / 4 {
                break;
            }
            if let Some(entry) = self.entries.remove(&key) {
                self.bytes -= entry.bytes;
            }
        }
    }
}

/// The memo of one plugin instance.
pub struct HashMemo {
    shards: Box<[Mutex<Shard>]>,
    calls: AtomicU64,
}

impl Default for HashMemo {
    fn default() -> Self {
        HashMemo {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            calls: AtomicU64::new(0),
        }
    }
}

/// Bytes of a content's items: what hashing it reads.
pub fn content_bytes(content: &Content) -> usize {
    content.items().map(str::len).sum()
}

fn key(message: &RArc<Message>) -> usize {
    &**message as *const Message as usize
}

fn shard_of(key: usize) -> usize {
    // Allocations are 16-byte aligned: the low bits say nothing.
    (key >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58 & (SHARDS - 1)
}

impl HashMemo {
    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        self.shards[shard].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The hash of each of `messages` (`None`: too short to take part), by `hash` for
    /// those not remembered from an earlier call; `hash` must depend on the content alone.
    pub fn hashes(
        &self,
        messages: &[&RArc<Message>],
        hash: impl Fn(&Message) -> Option<u64>,
    ) -> (Vec<Option<u64>>, Stats) {
        let call = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let keys: Vec<usize> = messages.iter().map(|m| key(m)).collect();
        let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); SHARDS];
        for (position, &key) in keys.iter().enumerate() {
            by_shard[shard_of(key)].push(position);
        }
        let mut hashes: Vec<Option<Option<u64>>> = vec![None; messages.len()];
        let mut stats = Stats::default();
        for (shard, positions) in by_shard.iter().enumerate() {
            if positions.is_empty() {
                continue;
            }
            let mut shard = self.lock(shard);
            for &position in positions {
                if let Some(entry) = shard.entries.get_mut(&keys[position]) {
                    entry.last_call = call;
                    hashes[position] = Some(entry.hash);
                    stats.remembered += 1;
                }
            }
        }
        // No lock held while hashing.
        let mut new_by_shard: Vec<Vec<usize>> = vec![Vec::new(); SHARDS];
        for (position, slot) in hashes.iter_mut().enumerate() {
            if slot.is_none() {
                let message = messages[position];
                let hashed = hash(message);
                if hashed.is_some() {
                    stats.bytes_hashed += content_bytes(&message.content) as u64;
                    stats.hashed += 1;
                }
                *slot = Some(hashed);
                new_by_shard[shard_of(keys[position])].push(position);
            }
        }
        for (shard, positions) in new_by_shard.iter().enumerate() {
            if positions.is_empty() {
                continue;
            }
            let mut shard = self.lock(shard);
            for &position in positions {
                let message = messages[position];
                let bytes = content_bytes(&message.content);
                if bytes > MAX_BYTES / SHARDS {
                    continue;
                }
                let entry = Entry {
                    _message: message.clone(),
                    hash: hashes[position].flatten(),
                    bytes,
                    last_call: call,
                };
                // Another session's call may have remembered it meanwhile: same content,
                // same hash.
                if let Some(old) = shard.entries.insert(keys[position], entry) {
                    shard.bytes -= old.bytes;
                }
                shard.bytes += bytes;
            }
            shard.evict();
        }
        (hashes.into_iter().map(Option::flatten).collect(), stats)
    }

    /// Results remembered now, over all shards.
    pub fn len(&self) -> usize {
        (0..SHARDS).map(|s| self.lock(s).entries.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use history_wire::chat::history_from_str;

    fn results(n: usize, chars: usize) -> Vec<RArc<Message>> {
        let json: Vec<String> = (0..n)
            .map(|i| {
                let text = format!("{i:>width$}", width = chars);
                format!(r#"{{"role":"tool","tool_call_id":"c{i}","content":"{text}"}}"#)
            })
            .collect();
        history_from_str(&format!("[{}]", json.join(","))).unwrap()
    }

    fn hash(message: &Message) -> Option<u64> {
        Some(crate::content_hash(&message.content))
    }

    #[test]
    fn a_message_is_hashed_once_across_calls_and_a_copy_again() {
        let memo = HashMemo::default();
        let history = results(10, 300);
        let refs: Vec<&RArc<Message>> = history.iter().collect();
        let (first, stats) = memo.hashes(&refs, hash);
        assert_eq!(
            (stats.hashed, stats.remembered, stats.bytes_hashed),
            (10, 0, 3000)
        );
        let (again, stats) = memo.hashes(&refs, hash);
        assert_eq!((stats.hashed, stats.remembered, stats.bytes_hashed), (0, 10, 0));
        assert_eq!(first, again);
        // A copy with the same content is another message: hashed again, the same hash.
        let copy = RArc::new((*history[3]).clone());
        let (hashes, stats) = memo.hashes(&[&copy], hash);
        assert_eq!((stats.hashed, hashes[0]), (1, first[3]));
    }

    #[test]
    fn the_memo_forgets_the_least_recently_seen_past_its_bound() {
        let memo = HashMemo::default();
        let old = results(1, 300);
        memo.hashes(&[&old[0]], hash);
        // Enough new results, seen later, to push every shard past its share.
        for _ in 0..4 {
            let batch = results(MAX_ENTRIES / 2, 1);
            let refs: Vec<&RArc<Message>> = batch.iter().collect();
            memo.hashes(&refs, |_| None);
            assert!(memo.len() <= MAX_ENTRIES, "{}", memo.len());
        }
        let (_, stats) = memo.hashes(&[&old[0]], hash);
        assert_eq!(stats.hashed, 1, "the oldest entry was forgotten");
        assert_eq!(RArc::strong_count(&old[0]), 2, "held again by its new entry");
    }

    #[test]
    fn concurrent_calls_agree() {
        let memo = HashMemo::default();
        let history = results(2000, 50);
        let expected: Vec<Option<u64>> = history.iter().map(|m| hash(m)).collect();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    let refs: Vec<&RArc<Message>> = history.iter().collect();
                    for _ in 0..5 {
                        assert_eq!(memo.hashes(&refs, hash).0, expected);
                    }
                });
            }
        });
        assert_eq!(memo.len(), 2000);
    }
}
