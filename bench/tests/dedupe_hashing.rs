//! `dedupe` hashes each tool result once per message, whatever the history's length
//! (docs/plugins.md#dedupe): over a replay that hands each turn's whole working history
//! back, the bytes it hashed (its own count) stay within 1.05 of the tool-result bytes
//! that entered. Counts, not time.
//!
//! Needs the installed plugins: run with `cargo xtask test`.

use e2e_tests::TestConfig;
use history_bench::{generate, hashing};
use history_engine::{load_chain, Chain};
use history_wire::chat::parse_history;
use plugin_api::Role;
use serde_json::Value;

#[test]
fn over_a_replay_dedupe_hashes_each_result_once() {
    // min_chars 0: every result takes part, so every byte that entered is hashed once.
    let config = TestConfig::new(
        "[history]\nchain = [\"default\"]\non_plugin_error = \"fail\"\n[plugin.dedupe]\nmin_chars = 0\n",
    );
    let (config, catalog, _) = load_chain(&config.path).unwrap_or_else(|e| panic!("{e}"));
    // dedupe alone, as the bench runs it: nothing trims the working history it is handed.
    let chain = Chain::repeated(&config, &catalog, "dedupe", 1).unwrap_or_else(|e| panic!("{e}"));
    let model = config.model("default");
    let history = parse_history(&Value::Array(generate(200, 3))).unwrap();
    let results = history.iter().filter(|m| m.role == Role::Tool).count();
    let hashing = hashing::replay(&chain, &config, &model, history).unwrap();

    eprintln!("{hashing:?}, ratio {}", hashing.ratio());
    assert_eq!(hashing.turns, 200);
    assert!(results > 100 && hashing.bytes_entered > 100_000, "{hashing:?}");
    // Hashed again at every turn, the 200 turns would have hashed ~100x what entered.
    assert!(hashing.ratio() <= 1.05, "{hashing:?}");
    // Each result whole and once: not a byte missed either.
    assert_eq!(hashing.bytes_hashed, hashing.bytes_entered, "{hashing:?}");
}
