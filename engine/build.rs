//! Writes the rank tables of `o200k_base` and `cl100k_base` into `OUT_DIR`, from the
//! vocabularies tiktoken-rs ships, in the layout of `src/rank_table.rs`: the counter looks
//! tokens up in place in the bytes it includes, so a tokenizer is ready without parsing
//! (it took tiktoken-rs about half a second per process to decode and hash the o200k_base
//! vocabulary). Generated at build time, never committed.

use std::path::Path;

#[path = "src/rank_table.rs"]
mod rank_table;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/rank_table.rs");
    let out = std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR");
    let out = Path::new(&out);
    let o200k = tiktoken_rs::o200k_base().expect("tiktoken-rs's o200k_base loads");
    write_table(&o200k, 200_019, &out.join("o200k_base.ranks"));
    let cl100k = tiktoken_rs::cl100k_base().expect("tiktoken-rs's cl100k_base loads");
    write_table(&cl100k, 100_277, &out.join("cl100k_base.ranks"));
}

/// The ordinary tokens of `bpe` (every rank below `ranks` that decodes and is not a
/// special token) as a table.
fn write_table(bpe: &tiktoken_rs::CoreBPE, ranks: u32, file: &Path) {
    let specials: Vec<Vec<u8>> = bpe
        .special_tokens()
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    let mut tokens: Vec<(Vec<u8>, u32)> = Vec::new();
    for rank in 0..ranks {
        if let Ok(bytes) = bpe.decode_bytes(&[rank]) {
            if !specials.contains(&bytes) {
                tokens.push((bytes, rank));
            }
        }
    }
    let slots = (tokens.len() * 2).next_power_of_two();
    let mut slot_words = vec![0u32; slots];
    for (index, (bytes, _)) in tokens.iter().enumerate() {
        let mut slot = rank_table::hash(bytes) as usize & (slots - 1);
        while slot_words[slot] != 0 {
            slot = (slot + 1) & (slots - 1);
        }
        slot_words[slot] = index as u32 + 1;
    }
    let blob_len: usize = tokens.iter().map(|(bytes, _)| bytes.len()).sum();
    let mut words: Vec<u32> = vec![tokens.len() as u32, slots as u32, blob_len as u32];
    words.extend(&slot_words);
    let mut start = 0u32;
    words.push(0);
    for (bytes, _) in &tokens {
        start += bytes.len() as u32;
        words.push(start);
    }
    words.extend(tokens.iter().map(|(_, rank)| *rank));
    let mut data: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    for (bytes, _) in &tokens {
        data.extend_from_slice(bytes);
    }
    // Check what was written reads back.
    let table = rank_table::RankTable::new(&data);
    assert_eq!(table.len(), tokens.len());
    for (bytes, rank) in &tokens {
        assert_eq!(table.get(bytes), Some(*rank));
    }
    std::fs::write(file, data).expect("OUT_DIR is writable");
}
