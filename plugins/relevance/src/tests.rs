//! `relevance` through its rlib, with `plugin_testing`'s services and the host's own output
//! check: `from_transcript` brings back an exchange the history lost
//! (docs/plugins.md#relevance).

use super::*;
use plugin_api::Content;
use plugin_testing::{load_context, settings, with_transcript};

/// A session's transcript: the task, an exchange about the cache's port with a tool call
/// (messages 3 to 6), two later exchanges, and the question that matches the old one.
const TRANSCRIPT: &str = r#"[
  {"role":"user","content":"Task: write the deploy script for the service."},
  {"role":"assistant","content":"Starting on the deploy script."},
  {"role":"user","content":"Which port does the cache server listen on?"},
  {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read_config","arguments":"{\"file\":\"cache.toml\"}"}}]},
  {"role":"tool","tool_call_id":"c1","content":"[cache] port = 6380, bind = 10.0.0.7"},
  {"role":"assistant","content":"The cache server listens on port 6380."},
  {"role":"user","content":"Now write the readme."},
  {"role":"assistant","content":"The readme is written."},
  {"role":"user","content":"Add unit tests for the parser."},
  {"role":"assistant","content":"Added six tests."},
  {"role":"user","content":"Put the cache server port into the deploy script."}
]"#;

fn plugin(config: &str) -> Relevance {
    Relevance::new(&load_context(config)).expect("a valid table")
}

/// The transcript, and the working history an earlier trim left: messages 3 to 6 gone.
fn transcript_and_history() -> (Vec<RArc<Message>>, Vec<RArc<Message>>) {
    let transcript = plugin_testing::history(TRANSCRIPT);
    let history = transcript
        .iter()
        .filter(|m| !(3..=6).contains(&m.origin()))
        .map(|m| RArc::new((**m).clone()))
        .collect();
    (transcript, history)
}

fn origins(history: &[RArc<Message>]) -> Vec<u64> {
    history.iter().map(|m| m.origin()).collect()
}

#[test]
fn from_transcript_brings_back_the_exchange_the_question_matches_whole_and_in_order() {
    let (transcript, history) = transcript_and_history();
    let relevance = plugin(r#"{"from_transcript": true, "recent": 2}"#);
    let ctx = settings().session("s1").effective_ctx(20).turn(6).context();
    let output = with_transcript(transcript, || plugin_testing::process(&relevance, &history, &ctx))
        .expect("the host's check accepts the recalled exchange");
    // The call with its result and the answer come back before the next user message.
    assert_eq!(origins(&output.history), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
    let tool = &output.history[4];
    assert_eq!(tool.call_id(), Some("c1"));
    let recalled: Vec<&Event> = output
        .events
        .iter()
        .filter(|e| e.kind == EventKind::MessageRecalled)
        .collect();
    assert_eq!(recalled.len(), 1, "{:?}", output.events);
    assert!(recalled[0].reason.contains("4 messages"), "{:?}", recalled[0]);
}

#[test]
fn without_from_transcript_a_session_or_a_match_nothing_is_recalled() {
    let (transcript, history) = transcript_and_history();
    let session = settings().session("s1").effective_ctx(20).turn(6).context();
    let stateless = settings().effective_ctx(20).turn(6).context();
    let on = plugin(r#"{"from_transcript": true, "recent": 2}"#);
    let off = plugin(r#"{"recent": 2}"#);
    with_transcript(transcript, || {
        for (relevance, ctx) in [(&off, &session), (&on, &stateless)] {
            let output = plugin_testing::process(relevance, &history, ctx).unwrap();
            assert_eq!(origins(&output.history), origins(&history));
        }
        // A question matching only what the history has recalls nothing.
        let mut asked = history.clone();
        RArc::make_mut(asked.last_mut().unwrap()).content = Content::Text("More parser tests.".into());
        let output = plugin_testing::process(&on, &asked, &session).unwrap();
        assert_eq!(origins(&output.history), origins(&history));
    });
}

#[test]
fn a_recalled_exchange_displaces_the_oldest_unmatched_units_and_is_never_there_twice() {
    let (transcript, history) = transcript_and_history();
    let relevance = plugin(r#"{"from_transcript": true, "recent": 2}"#);
    with_transcript(transcript.clone(), || {
        // A window of 9 unpinned messages, 6 in use: the exchange's 4 come in, and the
        // oldest message matching nothing (7) goes; 2 matches ("deploy script") and stays.
        let ctx = settings().session("s1").effective_ctx(9).turn(6).context();
        let output = plugin_testing::process(&relevance, &history, &ctx).unwrap();
        assert_eq!(origins(&output.history), [1, 2, 3, 4, 5, 6, 8, 9, 10, 11]);
        // A window of 5, which the history does not fit: the newest 2 and the exchange's 4
        // do not fit either, so it stays out; the older match (2) comes in, as always.
        let ctx = settings().session("s1").effective_ctx(5).turn(6).context();
        let output = plugin_testing::process(&relevance, &history, &ctx).unwrap();
        assert_eq!(origins(&output.history), [1, 2, 10, 11]);
        // A compacted copy of message 5 in the history: the exchange is not recalled again.
        let mut with_copy = history.clone();
        let mut copy = (*transcript[4]).clone();
        copy.content = Content::Text("[Omitted]".into());
        with_copy.insert(2, RArc::new(copy));
        let ctx = settings().session("s1").effective_ctx(20).turn(6).context();
        let output = plugin_testing::process(&relevance, &with_copy, &ctx);
        // The history itself has an orphan result (its call is gone): the check allows
        // what the input had, and nothing is added.
        assert_eq!(origins(&output.unwrap().history), origins(&with_copy));
    });
}

#[test]
fn the_new_keys_are_checked() {
    let err = Relevance::new(&load_context(r#"{"from_transcript": "yes"}"#))
        .err()
        .unwrap();
    assert_eq!(err.key.as_str(), "from_transcript");
    let err = Relevance::new(&load_context(r#"{"recall_limit": -1}"#))
        .err()
        .unwrap();
    assert_eq!(err.key.as_str(), "recall_limit");
}
