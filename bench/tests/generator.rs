//! The generator is deterministic for a seed and makes the histories it advertises: whole
//! tool-call units, realistic result sizes, text that tokenizes like real tool output.

use history_bench::{fan_out, generate, generate_messages, split_turns, to_json_text};
use history_engine::tokens::count_text;
use history_wire::chat::parse_history;
use plugin_api::structure::Faults;
use plugin_api::{Role, Tokenizer};
use serde_json::Value;

#[test]
fn the_same_seed_gives_the_same_history() {
    let a = to_json_text(&generate(60, 42));
    assert_eq!(a, to_json_text(&generate(60, 42)));
    assert_ne!(a, to_json_text(&generate(60, 43)));
    // A longer history starts with the shorter one: turns do not depend on the count.
    let longer = generate(80, 42);
    assert_eq!(generate(60, 42)[..], longer[..generate(60, 42).len()]);
    // The printed text is one JSON array holding the same messages.
    let reparsed: Value = serde_json::from_str(&a).unwrap();
    assert_eq!(reparsed, Value::Array(generate(60, 42)));
}

#[test]
fn histories_have_the_advertised_shape() {
    let turns = 300;
    let values = generate(turns, 7);
    let history = parse_history(&Value::Array(values.clone())).expect("valid wire format");
    assert_eq!(history[0].role, Role::System);
    assert_eq!(history.iter().filter(|m| m.role == Role::User).count(), turns);
    assert_eq!(split_turns(history.clone(), history_bench::is_user).len(), turns);
    // Every call has its result and every result its call; it starts with the user.
    let faults = Faults::of(&history);
    assert_eq!(faults.count(), 0, "{:?}", faults.describe(&history));
    // Assistant messages carry 0–3 calls; each turn ends with a plain reply.
    assert!(history.iter().all(|m| m.tool_calls.len() <= 3));
    assert!(history.iter().any(|m| m.tool_calls.len() >= 2));
    for turn in split_turns(history.clone(), history_bench::is_user) {
        let last = turn.last().unwrap();
        assert!(last.role == Role::Assistant && last.tool_calls.is_empty());
    }
    // About 4 messages a turn (260 turns ≈ 1,000 messages, as the LangChain comparison says).
    let per_turn = history.len() as f64 / turns as f64;
    assert!((3.5..4.8).contains(&per_turn), "{per_turn} messages per turn");

    let sizes: Vec<usize> = history
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content.text().len())
        .collect();
    let share = |range: std::ops::Range<usize>| {
        sizes.iter().filter(|s| range.contains(s)).count() as f64 / sizes.len() as f64
    };
    assert!(share(200..2_048) > 0.65, "mostly 0.2–2 KB: {}", share(200..2_048));
    assert!(
        share(5_120..51_201) > 0.02,
        "some 5–50 KB: {}",
        share(5_120..51_201)
    );
    assert!(sizes.iter().all(|&s| s <= 51_200), "none above 50 KB");

    // Real tool output is about 2–5 bytes per o200k token; a repeated single character
    // or random bytes would be far outside that.
    let text: String = history
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content.text())
        .collect();
    let bytes_per_token = text.len() as f64 / count_text(Tokenizer::O200kBase, &text) as f64;
    assert!(
        (2.0..5.5).contains(&bytes_per_token),
        "{bytes_per_token} bytes per token"
    );
}

#[test]
fn a_history_of_at_least_n_messages_is_whole_turns() {
    let values = generate_messages(500, 3);
    assert!(values.len() >= 500);
    let history = parse_history(&Value::Array(values)).unwrap();
    assert_eq!(Faults::of(&history).count(), 0);
    let last = history.last().unwrap();
    assert!(last.role == Role::Assistant && last.tool_calls.is_empty());
}

#[test]
fn the_fan_out_is_one_call_message_answered_in_reverse_order() {
    let history = parse_history(&Value::Array(fan_out(8))).unwrap();
    assert_eq!(history.len(), 10);
    assert_eq!(Faults::of(&history).count(), 0);
    assert_eq!(history[1].tool_calls.len(), 8);
    let ids: Vec<&str> = history[2..].iter().map(|m| m.call_id().unwrap()).collect();
    let mut reversed: Vec<&str> = history[1].tool_calls.iter().map(|c| c.id.as_str()).collect();
    reversed.reverse();
    assert_eq!(ids, reversed);
    // Half the results are empty (the edit and write tools have nothing to say).
    let empty = history[2..]
        .iter()
        .filter(|m| m.content.text().is_empty())
        .count();
    assert_eq!(empty, 4);
}
