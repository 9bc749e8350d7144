//! What docs/chain.md#performance asks of a session's turns, checked on the real `default` library (not
//! timed: CI must not fail on a slow machine): a replay counts every message's tokens
//! once, and the chain passes kept messages on shared, never copied.
//!
//! Needs the installed plugins: run with `cargo xtask test`.

use e2e_tests::TestConfig;
use history_bench::{generate, split_turns, token_item_bytes};
use history_engine::chain::stateless_context;
use history_engine::{load_chain, tokens, turns, Call};
use history_wire::chat::parse_history;
use plugin_api::{Message, RArc};
use serde_json::Value;

#[test]
fn a_replay_counts_each_message_once_and_copies_none() {
    // A small window so `default` trims on most turns.
    let config =
        TestConfig::new("[history]\nagent_max_ctx = 40\nchain = [\"default\"]\non_plugin_error = \"fail\"\n");
    let (config, _catalog, chain) = load_chain(&config.path).unwrap_or_else(|e| panic!("{e}"));
    let model = config.model("default");

    let history = parse_history(&Value::Array(generate(120, 5))).unwrap();
    let entered: u64 = history.iter().map(|m| token_item_bytes(m)).sum();
    // Only this test runs in this binary: the process-wide counter is ours.
    let before = tokens::bytes_tokenized();
    let mut previous: Vec<RArc<Message>> = Vec::new();
    let mut trimmed_turns = 0;
    for (index, mut new) in split_turns(history, history_bench::is_user)
        .into_iter()
        .enumerate()
    {
        let turn = index as u64 + 1;
        // Stamped while unshared, so `input` below can be kept for the comparison.
        turns::stamp_entering(&mut new, turn, None);
        let mut input = previous;
        input.extend(new);
        let kept_input = input.clone();
        let ctx = stateless_context(&config, model.clone(), turn);
        let run = chain.run(input, &ctx, Call::Process).unwrap();
        if run.history.len() < kept_input.len() {
            trimmed_turns += 1;
        }
        for message in &run.history {
            assert!(
                kept_input.iter().any(|m| std::ptr::eq(&**m, &**message)),
                "turn {turn}: an output message is a copy, not the input message shared"
            );
        }
        previous = run.working;
    }
    assert!(
        trimmed_turns > 50,
        "default trimmed on {trimmed_turns} turns only"
    );
    // Every message is counted, none twice: identical items in different messages (a
    // repeated result or arguments string) are counted once through the content cache,
    // so the bytes tokenized can fall just below the bytes that entered, never above.
    let tokenized = tokens::bytes_tokenized() - before;
    assert!(
        tokenized <= entered && tokenized * 100 >= entered * 95,
        "bytes tokenized over the replay: {tokenized}, bytes that entered: {entered}"
    );
}
