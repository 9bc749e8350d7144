//! `summarize` (docs/plugins.md#summarize) through the real library, on generated agent
//! conversations (the bench's generator): no summarizer is configured, so the summary is
//! the extractive digest.

use std::collections::HashSet;

use crate::common::{context, on_big_stack, prepared, Plugin};
use plugin_api::{Context, Message, RArc, Tokenizer};

fn generated(turns: usize) -> String {
    history_bench::to_json_text(&history_bench::generate(turns, 11))
}

fn tokens(history: &[RArc<Message>], ctx: &Context) -> u64 {
    history
        .iter()
        .map(|m| ctx.tokens().message(Tokenizer::Chars4, m, 3))
        .sum()
}

fn summaries(history: &[RArc<Message>]) -> Vec<&RArc<Message>> {
    history
        .iter()
        .filter(|m| m.meta().and_then(|meta| meta.summary_of()).is_some())
        .collect()
}

const CONFIG: &str = r#"{"trigger_tokens":12000,"keep_tokens":6000,"target_chars":2000}"#;

#[test]
fn a_300_turn_conversation_gets_one_summary_of_exactly_the_dropped_messages() {
    on_big_stack(|| {
        let plugin = Plugin::load("summarize", CONFIG);
        let input = prepared(&generated(300), 300);
        let ctx = context(300);
        assert!(tokens(&input, &ctx) > 12_000);
        let out = plugin.apply(&input, &ctx).unwrap();
        let found = summaries(&out);
        assert_eq!(found.len(), 1, "one summary message");
        let summary = found[0];
        let text = summary.content.text();
        let kept: HashSet<u64> = out.iter().map(|m| m.origin()).collect();
        let dropped: Vec<String> = input
            .iter()
            .filter(|m| !kept.contains(&m.origin()))
            .map(|m| m.identity())
            .collect();
        assert_eq!(summary.meta().unwrap().summary_of().unwrap(), dropped);
        assert!(
            text.starts_with(&format!("[Summary of {} earlier messages]\n\n", dropped.len())),
            "{text}"
        );
        assert!(text.chars().count() <= 2000 + 60);
        assert!(summary.meta().unwrap().original_content.is_none());
        assert!(tokens(&out, &ctx) <= 12_000, "{} tokens", tokens(&out, &ctx));
        // The digest has the contract's shapes: a tool call with its result's first line.
        assert!(text.contains(") → "), "{text}");
    });
}

#[test]
fn fed_back_turn_by_turn_the_summary_runs_forward_and_stays_one() {
    on_big_stack(|| {
        let plugin = Plugin::load("summarize", CONFIG);
        let all: Vec<serde_json::Value> = history_bench::generate(120, 5);
        let turns = history_bench::split_turns(all, |m| m["role"] == "user");
        let mut working: Vec<serde_json::Value> = Vec::new();
        let mut summarized_turns = 0;
        for (turn, messages) in turns.into_iter().enumerate() {
            working.extend(messages);
            let turn = turn as u64 + 1;
            let input = prepared(&serde_json::Value::Array(working.clone()).to_string(), turn);
            let ctx = context(turn);
            let out = plugin.apply(&input, &ctx).unwrap();
            let found = summaries(&out);
            assert!(found.len() <= 1, "turn {turn}: {} summaries", found.len());
            if !found.is_empty() {
                summarized_turns += 1;
            }
            assert!(tokens(&out, &ctx) <= 12_000, "turn {turn}");
            working = serde_json::from_str(&history_wire::chat::history_to_string(&out)).unwrap();
        }
        assert!(summarized_turns > 10, "the summary was made and carried forward");
    });
}

#[test]
fn under_the_trigger_nothing_changes() {
    let plugin = Plugin::load("summarize", CONFIG);
    let input = prepared(&generated(3), 3);
    let out = plugin.apply(&input, &context(3)).unwrap();
    assert_eq!(crate::common::text(&out), crate::common::text(&input));
}

#[test]
fn properties_on_generated_histories() {
    crate::common::check_properties(
        "summarize",
        |table: &str| {
            e2e_tests::TestConfig::new(&format!(
                "[history]\nchain = [\"default\", \"summarize\"]\non_plugin_error = \"fail\"\n\
                 [models.c4]\ntokenizer = \"chars4\"\n[plugin.summarize]\n{table}\n"
            ))
        },
        &[
            (
                "trigger_tokens = 40\nkeep_tokens = 10",
                r#"{"trigger_tokens":40,"keep_tokens":10}"#,
            ),
            (
                "trigger_tokens = 20\nkeep_tokens = 0\nrole = \"system\"\ntarget_chars = 50",
                r#"{"trigger_tokens":20,"keep_tokens":0,"role":"system","target_chars":50}"#,
            ),
        ],
        false,
    );
}

#[test]
fn each_summarized_message_is_reported_as_message_summarized() {
    on_big_stack(|| {
        let config = e2e_tests::TestConfig::new(
            "[history]\nchain = [\"default\", \"summarize\"]\non_plugin_error = \"fail\"\nagent_max_ctx = 100000\n\
             [models.c4]\ntokenizer = \"chars4\"\nmax_context = 100000\n\
             [plugin.summarize]\ntrigger_tokens = 12000\nkeep_tokens = 6000\ntarget_chars = 2000\n",
        );
        let run = config.run("c4", &generated(300), Some(300)).unwrap();
        let summary = summaries(&run.history)[0];
        let covered = summary.meta().unwrap().summary_of().unwrap().len();
        let events = &run.stages[1].events;
        assert_eq!(events.len(), covered, "one event per summarized message");
        for event in events.iter() {
            assert_eq!(event.kind.as_str(), "message-summarized");
            assert_eq!(event.turn, 300);
            assert!(
                event.reason.starts_with("summarized: replaced by one summary"),
                "{}",
                event.reason
            );
        }
    });
}
