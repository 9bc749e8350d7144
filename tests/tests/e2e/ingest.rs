//! The ingest stage (docs/chain.md#ingest): plugins run on a turn's new messages before
//! anything is stored, their output stored as the transcript, a fault failing the turn.
//! The redactor fixture is the ingest plugin; `dedupe`, which drops, shows the rule that
//! an ingest plugin only rewrites.

use e2e_tests::fixtures::{fixture_library, plugin_dir_with, plugin_dir_with_installed};
use e2e_tests::server::Server;
use e2e_tests::store::{Kind, TestStore};
use e2e_tests::{describe, json, TestConfig};
use serde_json::{json as j, Value};

/// A configuration running `ingest` before the shipped-like chain, with `extra` tables.
fn config_with(dir: &tempfile::TempDir, history: &str, extra: &str) -> TestConfig {
    TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\n{history}\n[models.c4]\ntokenizer = \"chars4\"\n{extra}\n",
        dir.path().display().to_string()
    ))
}

fn turn_with_a_secret(n: u64) -> Value {
    j!([
        {"role": "user", "content": format!("step {n}: log in with SECRET")},
        {"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{n}"), "type": "function",
            "function": {"name": "login", "arguments": "{\"key\":\"SECRET\"}"}}]},
        {"role": "tool", "tool_call_id": format!("c{n}"), "content": "welcome, SECRET holder"},
        {"role": "assistant", "content": format!("done {n}")},
    ])
}

fn the_transcript_holds_what_ingest_returns_and_a_fault_fails_the_turn(kind: Kind) {
    let dir = plugin_dir_with_installed(&[&fixture_library("redactor")]);
    let config = config_with(
        &dir,
        "chain = [\"default\", \"tool_result_filter\"]\ningest = [\"redactor\"]\non_plugin_error = \"skip\"",
        "",
    );
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let id = server.create("c4");
    for n in 1..=3 {
        let answer = server.post(
            &format!("/v1/sessions/{id}/turns"),
            &j!({"messages": turn_with_a_secret(n)}),
        );
        assert_eq!(answer.status, 200, "{answer:?}");
        let body = answer.body.to_string();
        assert!(
            !answer.body["history"].to_string().contains("SECRET"),
            "sent: {body}"
        );
        // The redactor's events and its stats row come first, marked as ingest.
        assert_eq!(answer.body["stats"][0]["plugin"], "redactor", "{body}");
        assert_eq!(answer.body["stats"][0]["ingest"], true, "{body}");
        assert_eq!(
            answer.body["stats"][0]["messages_in"], 4,
            "only the new messages: {body}"
        );
        let changed = answer.body["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["plugin"] == "redactor" && e["kind"] == "message-changed")
            .count();
        assert_eq!(changed, 3, "{body}");
    }
    let transcript = server.transcript(&id);
    assert_eq!(transcript.len(), 12);
    let text = Value::Array(transcript.clone()).to_string();
    assert!(
        !text.contains("SECRET"),
        "the transcript holds the redacted text: {text}"
    );
    assert_eq!(transcript[0]["content"], "step 1: log in with [redacted]");
    assert!(!server.history(&id, false).to_string().contains("SECRET"));
    drop(server);

    // The redactor failing: the turn fails (even under on_plugin_error = "skip"), and
    // nothing of it is stored.
    let failing = config_with(
        &dir,
        "chain = [\"default\"]\ningest = [\"redactor\"]\non_plugin_error = \"skip\"",
        "[plugin.redactor]\nfail = true\n",
    );
    let server = Server::start(&failing.path, store.path(), &[]);
    let answer = server.post(
        &format!("/v1/sessions/{id}/turns"),
        &j!({"messages": turn_with_a_secret(4)}),
    );
    assert_eq!(answer.status, 422, "{answer:?}");
    assert!(
        answer.error().1.contains("plugin \"redactor\" failed"),
        "{answer:?}"
    );
    assert!(answer.error().1.contains("a required plugin"), "{answer:?}");
    assert_eq!(server.transcript(&id).len(), 12, "nothing stored");
}

fn without_ingest_the_transcript_keeps_the_raw_text(kind: Kind) {
    // The contrast docs/chain.md#ingest states: a redactor in the chain redacts what is
    // sent and kept as the working history, while the transcript keeps what arrived.
    let dir = plugin_dir_with(&[&fixture_library("redactor")]);
    let config = config_with(
        &dir,
        "chain = [\"default\", \"redactor\"]\nrequired = [\"redactor\"]",
        "",
    );
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let id = server.create("c4");
    let answer = server.post(
        &format!("/v1/sessions/{id}/turns"),
        &j!({"messages": turn_with_a_secret(1)}),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(!answer.body["history"].to_string().contains("SECRET"));
    assert!(Value::Array(server.transcript(&id))
        .to_string()
        .contains("SECRET"));
}

fn an_ingest_plugin_that_drops_a_message_fails_the_turn(kind: Kind) {
    let dir = plugin_dir_with_installed(&[]);
    let config = config_with(&dir, "chain = [\"default\"]\ningest = [\"dedupe\"]", "");
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let id = server.create("c4");
    let repeated = j!([{"role": "user", "content": "again"}, {"role": "user", "content": "again"}]);
    let answer = server.post(&format!("/v1/sessions/{id}/turns"), &j!({"messages": repeated}));
    assert_eq!(answer.status, 422, "{answer:?}");
    assert!(
        answer
            .error()
            .1
            .contains("an ingest plugin must return its input's 2 messages in order")
            && answer.error().1.contains("returned 1"),
        "{answer:?}"
    );
    assert_eq!(server.transcript(&id).len(), 0);
}

e2e_tests::store_tests!(
    the_transcript_holds_what_ingest_returns_and_a_fault_fails_the_turn,
    without_ingest_the_transcript_keeps_the_raw_text,
    an_ingest_plugin_that_drops_a_message_fails_the_turn,
);

#[test]
fn process_runs_ingest_first_and_explains_it() {
    let dir = plugin_dir_with(&[&fixture_library("redactor")]);
    let config = config_with(&dir, "chain = [\"default\"]\ningest = [\"redactor\"]", "");
    let input = turn_with_a_secret(1).to_string();
    let output = config.process(&["--explain", "--model", "c4"], &input);
    assert!(output.status.success(), "{}", describe(&output));
    let out = json(&String::from_utf8_lossy(&output.stdout));
    assert!(!out.to_string().contains("SECRET"), "{out}");
    assert_eq!(out.as_array().unwrap().len(), 4);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("ingest: the stages below ran on the entering messages")
            && stderr.contains("\nchain:\n"),
        "{stderr}"
    );
}

#[test]
fn ingest_is_refused_with_default_or_a_plugin_of_the_chain() {
    let dir = plugin_dir_with_installed(&[]);
    for (history, expected) in [
        ("ingest = [\"default\"]", "\"default\" cannot be in ingest"),
        (
            "chain = [\"default\", \"dedupe\"]\ningest = [\"dedupe\"]",
            "plugin \"dedupe\" is in ingest and in the chain",
        ),
        (
            "ingest = [\"nope\"]",
            "plugin \"nope\" in the ingest is not available",
        ),
    ] {
        let config = config_with(&dir, history, "");
        let output = config.process(&[], "[]");
        assert_eq!(output.status.code(), Some(3), "{history}: {}", describe(&output));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{history}: {stderr}");
    }
}
