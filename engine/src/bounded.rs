//! A process-wide memory bounded in entries and bytes, split into shards so callers on
//! several threads rarely wait for each other: what the answers' memory (`written`) and
//! the proxy's resent messages are kept in. A full shard starts over, which costs at
//! most one more computation of what is still in use.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash};
use std::sync::{Mutex, MutexGuard};

use rustc_hash::FxHasher;

const SHARDS: usize = 16;

struct Shard<K, V> {
    /// Each entry with what it was counted as.
    entries: HashMap<K, (V, usize), BuildHasherDefault<FxHasher>>,
    bytes: usize,
}

/// At most `max_entries` entries and `max_bytes` bytes (as their callers count them), in
/// [`SHARDS`] shards; the caller picks an entry's shard from its key.
pub struct BoundedMap<K, V> {
    shards: Vec<Mutex<Shard<K, V>>>,
    entries_per_shard: usize,
    bytes_per_shard: usize,
}

impl<K: Hash + Eq, V> BoundedMap<K, V> {
    pub fn new(max_entries: usize, max_bytes: usize) -> BoundedMap<K, V> {
        BoundedMap {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        entries: HashMap::default(),
                        bytes: 0,
                    })
                })
                .collect(),
            entries_per_shard: max_entries.div_ceil(SHARDS),
            bytes_per_shard: max_bytes.div_ceil(SHARDS),
        }
    }

    fn shard(&self, spread: u64) -> MutexGuard<'_, Shard<K, V>> {
        self.shards[(spread % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// `read` on the entry of `key`, if there is one; `spread` picks the shard (the
    /// same for a key every time).
    pub fn get<R>(&self, spread: u64, key: &K, read: impl FnOnce(&V) -> R) -> Option<R> {
        self.shard(spread).entries.get(key).map(|(value, _)| read(value))
    }

    /// Keeps `value` under `key`, counted as `bytes`. Something larger than a shard's
    /// share is not kept; a shard that would grow past its share starts over.
    pub fn insert(&self, spread: u64, key: K, value: V, bytes: usize) {
        if bytes > self.bytes_per_shard {
            return;
        }
        let mut shard = self.shard(spread);
        if shard.entries.len() >= self.entries_per_shard || shard.bytes + bytes > self.bytes_per_shard {
            shard.entries.clear();
            shard.bytes = 0;
        }
        if let Some((_, old)) = shard.entries.insert(key, (value, bytes)) {
            shard.bytes -= old;
        }
        shard.bytes += bytes;
    }

    /// Entries kept now.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).entries.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_bytes_are_bounded_and_a_full_shard_starts_over() {
        let map = BoundedMap::new(64, 1 << 20);
        for key in 0..1000u64 {
            map.insert(key, key, key, 1);
            assert!(map.len() <= 64);
        }
        assert_eq!(map.get(999, &999, |v| *v), Some(999));
        let bytes = BoundedMap::new(1000, 16 * 100);
        bytes.insert(0, 0u64, (), 60);
        bytes.insert(0, 16, (), 60);
        assert_eq!(
            bytes.len(),
            1,
            "the shard's 100 bytes would be passed: it started over"
        );
        assert_eq!(bytes.get(0, &16, |_| ()), Some(()));
        bytes.insert(1, 1, (), 101);
        assert_eq!(bytes.get(1, &1, |_| ()), None, "larger than a shard's share");
    }

    #[test]
    fn a_key_kept_again_is_counted_once() {
        let map = BoundedMap::new(100, 16 * 100);
        for _ in 0..10 {
            map.insert(3, 3u64, "x", 60);
        }
        map.insert(3, 19, "y", 30);
        assert_eq!(map.len(), 2, "60 + 30 fit the shard's 100 bytes");
    }
}
