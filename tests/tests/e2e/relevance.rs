//! `relevance` (docs/plugins.md#relevance) through the real library: applied directly with
//! a message window, and in a chain after `default` with a token window.

use crate::common::{context, on_big_stack, prepared, text, Plugin};
use e2e_tests::{json, run_json, TestConfig};
use plugin_api::{Context, EventKind, Message, RArc};
use serde_json::{json as j, Value};

fn chain(table: &str) -> TestConfig {
    TestConfig::new(&format!(
        "[history]\nchain = [\"default\", \"relevance\"]\non_plugin_error = \"fail\"\n\
         [models.c4]\ntokenizer = \"chars4\"\n[plugin.relevance]\n{table}\n"
    ))
}

fn window(messages: u64) -> Context {
    let mut ctx = context(1);
    ctx.effective_ctx = messages;
    ctx
}

/// A task, then `n` exchanges about the weather, except exchange `special` which is about
/// the flamingo quaternion; the last user message asks `question`.
fn conversation(n: usize, special: usize, question: &str) -> Value {
    let mut messages = vec![
        j!({"role": "system", "content": "You are a helpful assistant."}),
        j!({"role": "user", "content": "Help me plan the week."}),
        j!({"role": "assistant", "content": "Sure."}),
    ];
    for i in 0..n {
        if i == special {
            messages.push(
                j!({"role": "user", "content": "Remember: the flamingo quaternion is stored in vault 7."}),
            );
            messages.push(
                j!({"role": "assistant", "content": "Noted, the flamingo quaternion lives in vault 7."}),
            );
        } else {
            messages.push(j!({"role": "user", "content": format!("Is it sunny on day {i}?")}));
            messages.push(j!({"role": "assistant", "content": format!("Day {i} looks sunny and warm.")}));
        }
    }
    messages.push(j!({"role": "user", "content": question}));
    Value::Array(messages)
}

fn contents(history: &[RArc<Message>]) -> Vec<String> {
    history.iter().map(|m| m.content.text()).collect()
}

#[test]
fn an_old_exchange_with_the_questions_rare_words_is_kept_over_newer_unrelated_ones() {
    let input = conversation(20, 3, "Where is the flamingo quaternion stored?");
    let history = prepared(&input.to_string(), 1);
    let plugin = Plugin::load("relevance", r#"{"recent":4}"#);
    let out = plugin.apply(&history, &window(12)).unwrap();
    let kept = contents(&out);
    assert_eq!(
        kept,
        [
            "You are a helpful assistant.",
            "Help me plan the week.",
            "Remember: the flamingo quaternion is stored in vault 7.",
            "Noted, the flamingo quaternion lives in vault 7.",
            "Day 18 looks sunny and warm.",
            "Is it sunny on day 19?",
            "Day 19 looks sunny and warm.",
            "Where is the flamingo quaternion stored?",
        ][..],
        "the old exchange fills the room; score-0 units never do"
    );
    // The newest 4 units, then the old exchange; the newer unrelated ones are not kept.
    assert!(!kept.iter().any(|c| c.contains("day 18?") || c.contains("day 17")));
}

#[test]
fn with_no_match_it_keeps_what_recency_alone_keeps() {
    let input = conversation(20, 3, "Zebra xylophone?").to_string();
    let history = prepared(&input, 1);
    let relevance = Plugin::load("relevance", r#"{"recent":5}"#);
    let out = relevance.apply(&history, &window(30)).unwrap();
    // Recency alone: the sliding window over the newest 5 units (one message each here).
    let default = Plugin::load("default", "{}");
    let recency = default.apply(&history, &window(5)).unwrap();
    assert_eq!(text(&out), text(&recency));
    assert_eq!(
        out.len(),
        2 + 5,
        "system, task and the newest 5 units (the pinned task precedes them)"
    );
}

#[test]
fn ties_go_to_the_newer_unit_and_units_stay_whole_and_in_order() {
    // Two equal old matches; room for one of them.
    let mut messages = vec![j!({"role": "user", "content": "task"})];
    for i in 0..6 {
        let word = if i == 1 || i == 2 { "ocelot" } else { "filler" };
        messages.push(j!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("c{i}"), "type": "function", "function": {"name": "look", "arguments": format!("{{\"q\":\"{word}\"}}")}}]}));
        messages
            .push(j!({"role": "tool", "tool_call_id": format!("c{i}"), "content": format!("result {word}")}));
    }
    messages.push(j!({"role": "user", "content": "ocelot?"}));
    let history = prepared(&Value::Array(messages).to_string(), 1);
    let plugin = Plugin::load("relevance", r#"{"recent":1}"#);
    let out = plugin.apply(&history, &window(3)).unwrap();
    let kept: Vec<String> = out.iter().map(|m| m.content.text()).collect();
    assert_eq!(kept, ["task", "", "result ocelot", "ocelot?"]);
    assert_eq!(
        out[1].tool_calls[0].id.as_str(),
        "c2",
        "the newer of two equal matches"
    );
}

#[test]
fn in_a_chain_the_token_window_chooses_the_relevant_exchange_and_reports_scores() {
    let input = conversation(20, 3, "Where is the flamingo quaternion stored?");
    let config = chain("recent = 2\nmax_tokens = 80");
    let run = config.run("c4", &input.to_string(), None).unwrap();
    let out = run_json(&run);
    let texts: Vec<&str> = out
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert!(
        texts.contains(&"Noted, the flamingo quaternion lives in vault 7."),
        "{texts:?}"
    );
    assert!(!texts.contains(&"Day 10 looks sunny and warm."), "{texts:?}");
    let stage = run.stages.iter().find(|s| s.plugin == "relevance").unwrap();
    let removed: Vec<_> = stage
        .events
        .iter()
        .filter(|e| e.kind == EventKind::MessageRemoved)
        .collect();
    assert!(!removed.is_empty());
    assert!(removed
        .iter()
        .all(|e| e.reason.contains("not relevant") && e.reason.contains("score")));
    // Applied again to its own output (what a session does next turn) it changes nothing.
    let again = config.run("c4", &out.to_string(), None).unwrap();
    assert_eq!(run_json(&again), out);
}

#[test]
fn a_history_that_fits_is_returned_unchanged() {
    let input = conversation(3, 1, "flamingo?");
    let run = chain("recent = 1").run("c4", &input.to_string(), None).unwrap();
    assert_eq!(run_json(&run), json(&input.to_string()));
}

#[test]
fn real_conversations_keep_pins_the_newest_unit_and_pass_the_check() {
    on_big_stack(|| {
        let plugin = Plugin::load("relevance", r#"{"recent":3}"#);
        for (name, conversation) in e2e_tests::real_conversations() {
            let history = prepared(&conversation, 1);
            let out = plugin
                .apply(&history, &window(12))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(out.len() <= history.len(), "{name}");
            assert!(same(out.last().unwrap(), history.last().unwrap()), "{name}");
            let first_user = history.iter().position(|m| m.role == plugin_api::Role::User);
            if let Some(first_user) = first_user {
                assert!(
                    out.iter().any(|m| same(m, &history[first_user])),
                    "{name}: task kept"
                );
            }
            // Kept messages are input messages, in input order.
            let mut at = 0;
            for m in &out {
                at += history[at..].iter().position(|h| same(h, m)).expect("in order") + 1;
            }
        }
    });
}

#[test]
fn properties_on_generated_histories() {
    crate::common::check_properties(
        "relevance",
        chain,
        &[
            ("", "{}"),
            ("recent = 1\nmax_tokens = 60", r#"{"recent":1,"max_tokens":60}"#),
            (
                "recent = 0\nmax_tokens = 30\nmin_score = 0.5\npin_first_user = false\nstop_words = [\"the\"]",
                r#"{"recent":0,"max_tokens":30,"min_score":0.5,"pin_first_user":false,"stop_words":["the"]}"#,
            ),
        ],
        false,
    );
}

/// The same shared message (not just equal content).
fn same(a: &RArc<Message>, b: &RArc<Message>) -> bool {
    std::ptr::eq(&**a, &**b)
}

/// In the chain, what `relevance` drops leaves the working history for good: `agentctl
/// history-chain-add relevance` makes the edit and says, on stderr, to use `--view`; in
/// the view it says nothing.
#[test]
fn agentctl_suggests_the_view_for_relevance() {
    let config = TestConfig::new("[history]\nchain = [\"default\"]\n");
    let output = e2e_tests::agentctl(&config.path, &["history-chain-add", "relevance"], &[]);
    assert!(output.status.success(), "{}", e2e_tests::describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with(
            "agentctl: hint: in the chain, the old exchanges it drops leave the working history for good"
        ) && stderr.contains("`agentctl history-chain-add relevance --view`"),
        "{stderr}"
    );
    let text = std::fs::read_to_string(&config.path).unwrap();
    assert!(text.contains("chain = [\"default\", \"relevance\"]"), "{text}");
    // As JSON, the hint is a member of the report.
    let again = TestConfig::new("[history]\nchain = [\"default\"]\n");
    let output = e2e_tests::agentctl(&again.path, &["--json", "history-chain-add", "relevance"], &[]);
    let report = json(&String::from_utf8_lossy(&output.stdout));
    assert!(report["hint"].as_str().unwrap().contains("--view"), "{report}");

    let view = TestConfig::new("[history]\nchain = [\"default\"]\n");
    let output = e2e_tests::agentctl(&view.path, &["history-chain-add", "relevance", "--view"], &[]);
    assert!(output.status.success(), "{}", e2e_tests::describe(&output));
    assert!(output.stderr.is_empty(), "{}", e2e_tests::describe(&output));
    let text = std::fs::read_to_string(&view.path).unwrap();
    assert!(text.contains("view = [\"relevance\"]"), "{text}");
}
