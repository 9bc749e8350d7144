//! The layout of a rank table as `build.rs` writes it into `OUT_DIR` and the counter reads
//! it in place (`include_bytes!`): nothing is parsed or allocated when a tokenizer starts.
//! This file is also compiled into the build script (`#[path]`), so both sides share the
//! hash and the layout.
//!
//! All numbers are little-endian `u32`:
//!
//! ```text
//! header   tokens, slots (a power of two), blob bytes
//! slots    `slots` entries: 0 (empty) or 1 + the index of a token; open addressing,
//!          linear probing from `hash(bytes) & (slots - 1)`
//! starts   `tokens + 1` offsets into the blob: token i is blob[starts[i]..starts[i+1]]
//! ranks    `tokens` ranks
//! blob     every token's bytes, one after the other
//! ```

/// The hash of a token's bytes (FxHash's mixing over 8-byte words, the length last).
#[inline]
pub fn hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h: u64 = 0;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        h = (h.rotate_left(5) ^ word).wrapping_mul(K);
    }
    let mut tail = [0u8; 8];
    let rest = chunks.remainder();
    tail[..rest.len()].copy_from_slice(rest);
    h = (h.rotate_left(5) ^ u64::from_le_bytes(tail)).wrapping_mul(K);
    h = (h.rotate_left(5) ^ bytes.len() as u64).wrapping_mul(K);
    // The high bits are the well-mixed ones.
    h ^ (h >> 29)
}

pub const HEADER_WORDS: usize = 3;

/// A rank table, read in place.
#[derive(Clone, Copy)]
pub struct RankTable<'a> {
    slots: &'a [u8],
    starts: &'a [u8],
    ranks: &'a [u8],
    blob: &'a [u8],
    mask: usize,
}

#[inline]
fn word(bytes: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes"))
}

#[allow(dead_code)] // the build script uses only a part of it
impl<'a> RankTable<'a> {
    /// The table in `bytes`; panics on a table `build.rs` did not write.
    pub fn new(bytes: &'a [u8]) -> RankTable<'a> {
        let tokens = word(bytes, 0) as usize;
        let slots = word(bytes, 1) as usize;
        let blob = word(bytes, 2) as usize;
        assert!(slots.is_power_of_two(), "a rank table's slot count");
        let (slots_at, starts_at) = (4 * HEADER_WORDS, 4 * (HEADER_WORDS + slots));
        let ranks_at = starts_at + 4 * (tokens + 1);
        let blob_at = ranks_at + 4 * tokens;
        assert_eq!(bytes.len(), blob_at + blob, "a rank table's length");
        RankTable {
            slots: &bytes[slots_at..starts_at],
            starts: &bytes[starts_at..ranks_at],
            ranks: &bytes[ranks_at..blob_at],
            blob: &bytes[blob_at..],
            mask: slots - 1,
        }
    }

    /// The rank of the token whose bytes are `piece`.
    #[inline]
    pub fn get(&self, piece: &[u8]) -> Option<u32> {
        let mut slot = hash(piece) as usize & self.mask;
        loop {
            let entry = word(self.slots, slot) as usize;
            if entry == 0 {
                return None;
            }
            let index = entry - 1;
            let (start, end) = (
                word(self.starts, index) as usize,
                word(self.starts, index + 1) as usize,
            );
            if &self.blob[start..end] == piece {
                return Some(word(self.ranks, index));
            }
            slot = (slot + 1) & self.mask;
        }
    }

    /// How many tokens the table holds.
    pub fn len(&self) -> usize {
        self.ranks.len() / 4
    }
}
