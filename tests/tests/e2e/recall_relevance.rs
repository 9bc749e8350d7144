//! `relevance` drawing from the whole transcript (docs/plugins.md#relevance): a 60-turn
//! session served over HTTP, the shipped chain trimming the working history to the
//! model's 16 messages, and `relevance` in the view with `from_transcript = true`, as the
//! docs place it. An exchange dropped on turn 10 or so comes back into the sent history on
//! the turn whose question matches it, whole (the call with its result), under its own
//! identity — on SQLite and on PostgreSQL, in-process and in an isolated worker.

use e2e_tests::server::{shipped_config, Server};
use e2e_tests::store::{Kind, TestStore};
use serde_json::{json, Value};

/// Turn `turn`'s messages; turn 5's result holds the fact asked for on turn 61.
fn turn_messages(turn: u64) -> Value {
    super::recall::turn_messages_of(turn, 20)
}

/// The shipped configuration with `relevance` first in the view, drawing from the
/// transcript; `isolate` names plugins run in a worker.
fn config(isolate: &str) -> e2e_tests::TestConfig {
    let view = format!("view = [\"relevance\", \"role_pair\"]\n{isolate}");
    shipped_config(
        "",
        &[
            ("view = [\"role_pair\"]", view.as_str()),
            (
                "[plugin.role_pair]",
                "[plugin.relevance]\nfrom_transcript = true\n\n[plugin.role_pair]",
            ),
        ],
    )
}

fn post_turn(server: &Server, id: &str, messages: Value) -> Value {
    let answer = server.post(
        &format!("/v1/sessions/{id}/turns"),
        &json!({ "messages": messages }),
    );
    assert_eq!(answer.status, 200, "{answer:?}\n{}", server.stderr());
    answer.body
}

/// 60 turns, then the question that matches turn 5: the exchange is in the sent history
/// of that turn and only there.
fn an_exchange_dropped_on_an_earlier_turn_comes_back_when_it_becomes_relevant_on(server: &Server) {
    // local-8k: a window of 16 messages, so turn 5 left the working history long ago.
    let id = server.create("local-8k");
    for turn in 1..=60 {
        let sent = post_turn(server, &id, turn_messages(turn))["history"].to_string();
        // From turn 10 on, turn 5 is out of the working history, and no question asks
        // for it.
        if turn >= 10 {
            assert!(!sent.contains("zebra-quartz"), "turn {turn}: {sent}");
        }
    }
    let working = server.history(&id, false).to_string();
    assert!(!working.contains("zebra-quartz"), "{working}");

    let question = json!([{"role": "user", "content": "When does the staging database password rotate?"}]);
    let answer = post_turn(server, &id, question);
    let sent = answer["history"].as_array().unwrap().clone();
    let text = Value::Array(sent.clone()).to_string();
    // Whole: the call and its result, the result as it entered the transcript.
    let result = sent
        .iter()
        .find(|m| m["tool_call_id"] == "c5")
        .unwrap_or_else(|| panic!("turn 5's result is sent: {text}"));
    assert_eq!(
        result["content"],
        "deploy notes: the staging database password rotates on the zebra-quartz schedule"
    );
    let call = sent.iter().position(|m| {
        m["tool_calls"]
            .as_array()
            .is_some_and(|calls| calls.iter().any(|c| c["id"] == "c5"))
    });
    let result_at = sent.iter().position(|m| m["tool_call_id"] == "c5");
    assert!(
        call.is_some() && call < result_at,
        "the call comes before its result: {text}"
    );
    assert!(text.contains("step 5: read file_5.txt"), "{text}");
    // The question stays last.
    assert_eq!(
        sent.last().unwrap()["content"],
        "When does the staging database password rotate?"
    );
    // The view chose it: the working history is the chain's, without it.
    let working = server.history(&id, false).to_string();
    assert!(!working.contains("zebra-quartz"), "{working}");
    // The stored sent history has it, read back as the turn sent it.
    let stored = server.history(&id, true).to_string();
    assert!(stored.contains("zebra-quartz"), "{stored}");
}

fn an_exchange_dropped_on_an_earlier_turn_comes_back_when_it_becomes_relevant(kind: Kind) {
    let config = config("");
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    an_exchange_dropped_on_an_earlier_turn_comes_back_when_it_becomes_relevant_on(&server);
    assert_eq!(server.stop().code(), Some(0));
}

e2e_tests::store_tests!(an_exchange_dropped_on_an_earlier_turn_comes_back_when_it_becomes_relevant,);

/// The same with `relevance` in a worker process: its `ctx.recall` goes to the host over
/// the worker's pipe (docs/chain.md#isolation).
#[test]
fn an_isolated_relevance_recalls_through_the_host() {
    let config = config("isolate = [\"relevance\"]");
    let server = Server::start(&config.path, &config.dir.path().join("sessions.db"), &[]);
    an_exchange_dropped_on_an_earlier_turn_comes_back_when_it_becomes_relevant_on(&server);
    assert_eq!(server.stop().code(), Some(0));
}
