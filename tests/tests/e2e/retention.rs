//! `retention` (docs/plugins.md#retention) end to end, through the real cdylibs: block retention by
//! `retention_policy`, then expiration.

use e2e_tests::{describe, json, run_json, TestConfig};
use history_engine::chain::stateless_context;
use history_engine::{load_chain, Call};
use plugin_api::{ExpirationMode, ExpirationOverride, ROption};
use serde_json::{json as j, Value};

/// `default` + `retention` with `table` as retention's config, on a `chars4` model (`c4`),
/// failing on any plugin fault. `history` adds lines to `[history]`.
fn config_with(history: &str, table: &str) -> TestConfig {
    TestConfig::new(&format!(
        "[history]\nchain = [\"default\", \"retention\"]\non_plugin_error = \"fail\"\n{history}\n\
         [models.c4]\ntokenizer = \"chars4\"\n[plugin.retention]\n{table}\n"
    ))
}

fn config(table: &str) -> TestConfig {
    config_with("", table)
}

fn run_at(config: &TestConfig, history: &Value, turn: u64) -> Value {
    let run = config
        .run("c4", &history.to_string(), Some(turn))
        .unwrap_or_else(|e| panic!("{e}"));
    run_json(&run)
}

fn events(
    config: &TestConfig,
    history: &Value,
    turn: u64,
) -> Vec<(String, Option<u64>, Option<i64>, String)> {
    let run = config.run("c4", &history.to_string(), Some(turn)).unwrap();
    run.stages[1]
        .events
        .iter()
        .map(|e| {
            (
                e.kind.as_str().to_string(),
                e.index.into_option(),
                e.tokens_saved.into_option(),
                e.reason.to_string(),
            )
        })
        .collect()
}

const ANNOTATION_TAIL: &str = " characters. Agent can request expansion if needed.]";

/// The seed's action result: 600 characters, added on turn 1, compacted after 2 turns.
fn action_result_history() -> Value {
    let result: String = (0..600).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    j!([
        {"role": "user", "content": "research the topic", "metadata": {"turn_added": 1}},
        {"role": "assistant", "tool_calls": [
            {"id": "s1", "type": "function", "function": {"name": "google_search", "arguments": "{}"}}],
         "metadata": {"turn_added": 1}},
        {"role": "tool", "tool_call_id": "s1", "content": result,
         "metadata": {"turn_added": 1, "message_type": "action-result",
                      "expiration": {"turns": 2, "mode": "compact", "compact_mode": "first_n_chars",
                                     "compact_length": 500}}},
        {"role": "assistant", "content": "thinking", "metadata": {"turn_added": 1}}
    ])
}

#[test]
fn an_action_result_is_whole_on_turns_2_and_3_and_compacted_on_turn_4() {
    let config = config("");
    let input = action_result_history();
    for turn in [1, 2, 3] {
        assert_eq!(run_at(&config, &input, turn), input, "turn {turn}");
    }
    let out = run_at(&config, &input, 4);
    let original = input[2]["content"].as_str().unwrap();
    let expected = format!(
        "{}...\n\n[Compacted: showing first 500 of 600{ANNOTATION_TAIL}",
        &original[..500]
    );
    assert_eq!(out[2]["content"], expected);
    let meta = &out[2]["metadata"];
    assert_eq!(meta["was_compacted"], true);
    assert_eq!(meta["is_expired"], true);
    assert_eq!(meta["can_expand"], true);
    assert_eq!(meta["original_length"], 600);
    assert_eq!(meta["original_content"], original);
    // chars4: 600 chars = 150 tokens; the compacted text is 500 + 92 = 592 chars = 148.
    let compacted_tokens = (expected.chars().count() as i64 + 3) / 4;
    assert_eq!(meta["tokens_saved"], 150 - compacted_tokens);
    assert_eq!(meta["message_type"], "action-result", "other metadata is kept");
    assert_eq!(meta["expiration"], input[2]["metadata"]["expiration"]);
    // Everything else is untouched.
    for i in [0, 1, 3] {
        assert_eq!(out[i], input[i]);
    }
    let events = events(&config, &input, 4);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, "message-compacted");
    assert_eq!(events[0].1, Some(2));
    assert_eq!(events[0].2, Some(150 - compacted_tokens));
}

#[test]
fn the_timeline_through_the_binary_uses_the_documents_turn() {
    let config = config("");
    for (turn, compacted) in [(3, false), (4, true)] {
        let document = j!({"model": "c4", "turn": turn, "messages": action_result_history()});
        let output = config.process(&["--explain"], &document.to_string());
        assert!(output.status.success(), "{}", describe(&output));
        let out = json(&String::from_utf8_lossy(&output.stdout));
        assert_eq!(
            out[2]["metadata"]["was_compacted"] == true,
            compacted,
            "turn {turn}"
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            stderr.contains("message-compacted at message 2"),
            compacted,
            "{stderr}"
        );
    }
}

#[test]
fn compaction_counts_characters_and_leaves_short_content_alone() {
    let config = config("");
    let message = |content: Value| {
        j!([{"role": "user", "content": content,
             "metadata": {"turn_added": 1, "expiration": {"turns": 0, "mode": "compact", "compact_length": 3}}}])
    };
    // Three characters of six bytes: not longer than 3, untouched, no metadata added.
    let short = message(j!("ééé"));
    assert_eq!(run_at(&config, &short, 5), short);
    // Parts are measured as their concatenated text; opaque parts as compact JSON.
    let parts =
        message(j!([{"type": "text", "text": "éé"}, {"type": "image_url", "image_url": {"url": "u"}}]));
    let out = run_at(&config, &parts, 5);
    assert_eq!(
        out[0]["content"],
        format!("éé{{...\n\n[Compacted: showing first 3 of 46{ANNOTATION_TAIL}")
    );
    assert_eq!(out[0]["metadata"]["original_content"], parts[0]["content"]);
    // "éé" + `{"type":"image_url","image_url":{"url":"u"}}` (44 characters).
    assert_eq!(out[0]["metadata"]["original_length"], 46);
}

#[test]
fn ai_summary_falls_back_to_first_n_chars() {
    let config = config("");
    let input = j!([{"role": "user", "content": "0123456789",
        "metadata": {"turn_added": 1, "expiration": {"turns": 1, "mode": "compact",
                     "compact_mode": "ai_summary", "compact_length": 4}}}]);
    let out = run_at(&config, &input, 3);
    assert_eq!(
        out[0]["content"],
        format!("0123...\n\n[Compacted: showing first 4 of 10{ANNOTATION_TAIL}")
    );
    // The reason is logged and in the event (the summarizer's own tests: e2e summarizer).
    let document = j!({"model": "c4", "turn": 3, "messages": input});
    let output = config.process(&["--explain"], &document.to_string());
    assert!(output.status.success(), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "retention: ai_summary fell back to first_n_chars: no summarizer is configured ([summarizer] in plugins-enabled.toml)"
        ),
        "{stderr}"
    );
    assert!(
        stderr
            .contains("compacted to the first 4 characters (ai_summary failed: no summarizer is configured"),
        "{stderr}"
    );
}

#[test]
fn preserve_original_false_keeps_no_original_and_leaves_existing_keys() {
    let config = config("preserve_original = false");
    let mut input = action_result_history();
    let out = run_at(&config, &input, 4);
    assert!(out[2]["metadata"].get("original_content").is_none());
    assert!(out[2]["metadata"].get("can_expand").is_none());
    assert_eq!(out[2]["metadata"]["was_compacted"], true);
    // An original from an earlier step is left as it is.
    input[2]["metadata"]["original_content"] = j!("older original");
    input[2]["metadata"]["can_expand"] = j!(true);
    let out = run_at(&config, &input, 4);
    assert_eq!(out[2]["metadata"]["original_content"], "older original");
    assert_eq!(out[2]["metadata"]["can_expand"], true);
    // With preserve_original (default) an existing original is kept too.
    let out = run_at(&self::config(""), &input, 4);
    assert_eq!(out[2]["metadata"]["original_content"], "older original");
}

#[test]
fn remove_drops_user_messages_but_leaves_placeholders_for_tools_and_the_task() {
    let expiring = |turn: u64| j!({"turn_added": turn, "expiration": {"turns": 1, "mode": "remove"}});
    let input = j!([
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "the task", "metadata": expiring(1)},
        {"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "a tool result", "metadata": expiring(1)},
        {"role": "user", "content": "an old note", "metadata": expiring(1)},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "a new note", "metadata": expiring(5)}
    ]);
    let config = config("placeholder = \"[expired]\"");
    assert_eq!(run_at(&config, &input, 2), input, "age 1 is not over turns = 1");
    let out = run_at(&config, &input, 5);
    let out = out.as_array().unwrap();
    assert_eq!(out.len(), 6, "the old note is removed");
    assert_eq!(out[1]["content"], "[expired]");
    assert_eq!(out[1]["metadata"]["is_expired"], true);
    assert_eq!(out[3]["content"], "[expired]");
    assert_eq!(out[3]["tool_call_id"], "c");
    assert_eq!(out[3]["metadata"]["is_expired"], true);
    assert_eq!(out[4], input[5]);
    assert_eq!(out[5], input[6]);
    // The events' savings add up to the token change the host reports for retention.
    let run = config.run("c4", &input.to_string(), Some(5)).unwrap();
    let stage = &run.stages[1];
    let saved: i64 = stage
        .events
        .iter()
        .filter_map(|e| e.tokens_saved.into_option())
        .sum();
    assert_eq!(saved, stage.tokens_in as i64 - stage.tokens_out as i64);
    let kinds: Vec<(String, Option<u64>)> = events(&config, &input, 5)
        .into_iter()
        .map(|e| (e.0, e.1))
        .collect();
    assert_eq!(
        kinds,
        [
            ("message-expired".to_string(), Some(1)),
            ("message-expired".to_string(), Some(3)),
            ("message-removed".to_string(), Some(4))
        ]
    );
}

#[test]
fn defaults_missing_mode_or_turns_never_expire() {
    let config = config("");
    let input = j!([
        {"role": "user", "content": "x".repeat(600), "metadata": {"turn_added": 1, "expiration": {"turns": 1}}},
        {"role": "user", "content": "y".repeat(600), "metadata": {"turn_added": 1, "expiration": {"mode": "compact"}}},
        {"role": "user", "content": "z".repeat(600), "metadata": {"turn_added": 1, "expiration": {"turns": 1, "mode": "none"}}},
        {"role": "assistant", "content": "w".repeat(600), "metadata": {"turn_added": 1, "expiration": {"turns": 1, "mode": "compact"}}},
        {"role": "user", "content": "v".repeat(600), "metadata": {"turn_added": 1, "expiration": {"turns": 1, "mode": "compact"}}}
    ]);
    let out = run_at(&config, &input, 9);
    for i in 0..4 {
        assert_eq!(out[i], input[i], "message {i}");
    }
    // compact_length defaults to 500.
    assert!(out[4]["content"].as_str().unwrap().ends_with(
        "[Compacted: showing first 500 of 600 characters. Agent can request expansion if needed.]"
    ));
}

#[test]
fn ages_are_not_clamped_and_shortened_messages_are_skipped() {
    let config = config("");
    let expiration = j!({"turns": 0, "mode": "remove"});
    let input = j!([
        {"role": "user", "content": "task"},
        {"role": "user", "content": "from the future", "metadata": {"turn_added": 9, "expiration": expiration}},
        {"role": "user", "content": "compacted", "metadata": {"turn_added": 1, "was_compacted": true, "expiration": expiration}},
        {"role": "user", "content": "expired", "metadata": {"turn_added": 1, "is_expired": true, "expiration": expiration}},
        {"role": "user", "content": "omitted", "metadata": {"turn_added": 1, "omitted": true, "expiration": expiration}},
        {"role": "user", "content": "flag not a bool", "metadata": {"turn_added": 1, "omitted": "yes", "expiration": expiration}}
    ]);
    let out = run_at(&config, &input, 3);
    let out = out.as_array().unwrap();
    assert_eq!(out.len(), 5, "{out:?}");
    assert_eq!(&out[..], &input.as_array().unwrap()[..5]);
}

#[test]
fn messages_keep_their_true_ages_after_default_trimmed() {
    // Eight user turns without turn_added, at turn 8. The task u1 belongs to turn 1. default
    // keeps it (pinned) and the newest 8 messages (u5..a8); counted again in that trimmed
    // history, u1 would be the 5th newest user message, turn 4, age 4 — not over turns = 5.
    // Its true age is 7: it is compacted.
    let mut messages = Vec::new();
    for i in 1..=8 {
        let mut message = j!({"role": "user", "content": format!("u{i} {}", "x".repeat(20))});
        if i == 1 {
            message["metadata"] = j!({"expiration": {"turns": 5, "mode": "compact", "compact_length": 2}});
        }
        messages.push(message);
        messages.push(j!({"role": "assistant", "content": format!("a{i}")}));
    }
    let input = Value::Array(messages);
    let config = config_with("agent_max_ctx = 8", "");
    let run = config.run("c4", &input.to_string(), None).unwrap();
    assert_eq!(run.stages[0].messages_out, 9, "default trimmed to the task + 8");
    let out = run_json(&run);
    assert_eq!(out[0]["metadata"]["was_compacted"], true, "{out}");
    assert!(out[0]["content"]
        .as_str()
        .unwrap()
        .starts_with("u1...\n\n[Compacted: showing first 2 of 23"));
}

#[test]
fn per_tool_tables_apply_to_each_result_of_one_assistant_message() {
    let config = config(
        "[plugin.retention.tools.search]\nturns = 1\nmode = \"compact\"\ncompact_length = 5\n\
         [plugin.retention.tools.delete_file]\nturns = 1\nmode = \"remove\"\n",
    );
    let input = j!([
        {"role": "user", "content": "go", "metadata": {"turn_added": 1}},
        {"role": "assistant", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "search", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "delete_file", "arguments": "{}"}},
            {"id": "c", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}],
         "metadata": {"turn_added": 1}},
        {"role": "tool", "tool_call_id": "a", "content": "search results", "metadata": {"turn_added": 1}},
        {"role": "tool", "tool_call_id": "b", "content": "deleted", "metadata": {"turn_added": 1}},
        {"role": "tool", "tool_call_id": "c", "content": "file text", "metadata": {"turn_added": 1}},
        {"role": "tool", "tool_call_id": "zz", "name": "search", "content": "orphan results", "metadata": {"turn_added": 1}}
    ]);
    assert_eq!(run_at(&config, &input, 2), input);
    let out = run_at(&config, &input, 3);
    assert_eq!(
        out[2]["content"],
        format!("searc...\n\n[Compacted: showing first 5 of 14{ANNOTATION_TAIL}")
    );
    assert_eq!(out[3]["content"], "[Omitted]");
    assert_eq!(out[3]["metadata"]["is_expired"], true);
    assert_eq!(out[4], input[4], "read_file has no table");
    assert_eq!(
        out[5]["metadata"]["was_compacted"], true,
        "an orphan's own name decides"
    );
}

#[test]
fn precedence_is_override_then_the_messages_own_then_its_tools_table() {
    let input = j!([
        {"role": "user", "content": "task", "metadata": {"turn_added": 1}},
        {"role": "assistant", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "search", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "search", "arguments": "{}"}}],
         "metadata": {"turn_added": 1}},
        // Own expiration: compact_length 2 over the table's 4; turns from the table.
        {"role": "tool", "tool_call_id": "a", "content": "0123456789",
         "metadata": {"turn_added": 1, "expiration": {"compact_length": 2}}},
        {"role": "tool", "tool_call_id": "b", "content": "0123456789", "metadata": {"turn_added": 1}},
        // A user message with no expiration: the override does not reach it.
        {"role": "user", "content": "0123456789", "metadata": {"turn_added": 1}},
        // A user message with an expiration: the override does.
        {"role": "user", "content": "0123456789", "metadata": {"turn_added": 1, "expiration": {"turns": 50}}}
    ]);
    let tools = "[plugin.retention.tools.search]\nturns = 1\nmode = \"compact\"\ncompact_length = 4\n";
    let out = run_at(&config(tools), &input, 3);
    assert!(out[2]["content"]
        .as_str()
        .unwrap()
        .starts_with("01...\n\n[Compacted: showing first 2 of 10"));
    assert!(out[3]["content"]
        .as_str()
        .unwrap()
        .starts_with("0123...\n\n[Compacted: showing first 4 of 10"));
    assert_eq!(out[4], input[4]);
    assert_eq!(out[5], input[5], "turns 50, no mode");

    // The override wins field by field: compact_length 6 everywhere it applies, mode
    // compact for the user message whose own expiration had none, turns from below.
    let overridden = format!("{tools}[plugin.retention.override]\ncompact_length = 6\nmode = \"compact\"\n");
    let out = run_at(&config(&overridden), &input, 3);
    assert!(out[2]["content"]
        .as_str()
        .unwrap()
        .starts_with("012345...\n\n[Compacted: showing first 6 of 10"));
    assert!(out[3]["content"].as_str().unwrap().starts_with("012345..."));
    assert_eq!(out[4], input[4], "no expiration: the override does not apply");
    assert_eq!(out[5], input[5], "its own turns = 50 still hold");
    let out = run_at(&config(&format!("{overridden}turns = 1\n")), &input, 3);
    assert!(out[5]["content"].as_str().unwrap().starts_with("012345..."));
    assert_eq!(out[4], input[4]);

    // disable_expiration turns it all off.
    let disabled = format!("{tools}[plugin.retention.override]\ndisable_expiration = true\n");
    assert_eq!(run_at(&config(&disabled), &input, 9), input);
}

#[test]
fn the_sessions_override_wins_over_the_config_and_can_disable() {
    let config = config("[plugin.retention.override]\nmode = \"compact\"\ncompact_length = 6\n");
    let input = action_result_history();
    let run = |session: ExpirationOverride, turn: u64| {
        let (cfg, _catalog, chain) = load_chain(&config.path).unwrap();
        let history = history_wire::chat::history_from_str(&input.to_string()).unwrap();
        let mut ctx = stateless_context(&cfg, cfg.model("c4"), turn);
        ctx.expiration_override = ROption::RSome(session);
        run_json(&chain.run(history, &ctx, Call::Process).unwrap())
    };
    let session = ExpirationOverride {
        turns: ROption::RSome(0),
        mode: ROption::RSome(ExpirationMode::Remove),
        ..Default::default()
    };
    let out = run(session.clone(), 2);
    assert_eq!(out[2]["content"], "[Omitted]");
    assert_eq!(out[2]["metadata"]["is_expired"], true);
    let disabled = ExpirationOverride {
        disable_expiration: true,
        ..session
    };
    assert_eq!(run(disabled, 9), input);
}

/// Four user messages, each the user's text plus an injected block kept with policy 2.
fn injected_history(policy: Value) -> Value {
    let mut messages = Vec::new();
    for i in 0..4 {
        messages.push(j!({"role": "user",
            "content": [{"type": "text", "text": format!("question {i}")},
                        {"type": "text", "text": format!("injected context {i}")}],
            "metadata": {"retention_policy": [null, policy]}}));
        messages.push(j!({"role": "assistant", "content": format!("answer {i}")}));
    }
    Value::Array(messages)
}

#[test]
fn policy_2_keeps_a_part_at_idx_0_and_1_and_prunes_it_at_2_and_beyond() {
    let config = config("");
    let input = injected_history(j!(2));
    let out = run_at(&config, &input, 4);
    for (i, kept) in [(0, false), (2, false), (4, true), (6, true)] {
        if kept {
            assert_eq!(out[i], input[i], "message {i}");
        } else {
            assert_eq!(out[i]["content"], j!([input[i]["content"][0]]), "message {i}");
            assert_eq!(out[i]["metadata"]["retention_policy"], j!([null]));
        }
    }
    let events = events(&config, &input, 4);
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].0, "message-compacted");
    assert_eq!(events[0].1, Some(0));
    assert_eq!(events[0].3, "retention_policy pruned 1 of 2 parts");
    assert!(events[0].2.unwrap() > 0);
}

#[test]
fn policy_0_empties_messages_user_removed_task_and_tools_become_placeholders() {
    let input = j!([
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task", "metadata": {"retention_policy": [0]}},
        {"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "r"}, {"type": "text", "text": "s"}],
         "metadata": {"retention_policy": [0, 0], "id": "t1"}},
        {"role": "user", "content": "transient", "metadata": {"retention_policy": [0]}},
        {"role": "assistant", "content": "ok", "metadata": {"retention_policy": [0]}},
        {"role": "user", "content": null, "metadata": {"retention_policy": []}},
        {"role": "user", "content": "kept", "metadata": {"retention_policy": [null]}}
    ]);
    let run = config("").run("c4", &input.to_string(), Some(1)).unwrap();
    let stage = &run.stages[1];
    let saved: i64 = stage
        .events
        .iter()
        .filter_map(|e| e.tokens_saved.into_option())
        .sum();
    assert_eq!(saved, stage.tokens_in as i64 - stage.tokens_out as i64);
    let out = run_json(&run);
    let out = out.as_array().unwrap();
    assert_eq!(out.len(), 7, "{out:?}");
    assert_eq!(out[1]["content"], "[Omitted]");
    assert_eq!(out[1]["metadata"]["omitted"], true);
    assert!(out[1]["metadata"].get("retention_policy").is_none());
    assert_eq!(out[3]["content"], "[Omitted]");
    assert_eq!(out[3]["tool_call_id"], "c");
    assert_eq!(out[3]["metadata"]["omitted"], true);
    assert_eq!(out[3]["metadata"]["id"], "t1");
    assert!(out[3]["metadata"].get("retention_policy").is_none());
    assert_eq!(out[4], input[5], "an assistant's policy is ignored");
    assert_eq!(out[5], input[6], "no parts to begin with: left alone");
    assert_eq!(out[6], input[7]);
}

#[test]
fn a_placeholder_is_never_replaced_again_but_its_policy_still_counts() {
    // The newest message is already a placeholder that (oddly) kept a policy: it is left
    // exactly as it is, and still takes idx 0, so the older part with policy 1 goes.
    let input = j!([
        {"role": "user", "content": [{"type": "text", "text": "q"}, {"type": "text", "text": "ctx"}],
         "metadata": {"retention_policy": [null, 1]}},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "[Gone]", "metadata": {"omitted": true, "tokens_saved": 7, "retention_policy": [0]}}
    ]);
    let out = run_at(&config(""), &input, 2);
    assert_eq!(out[2], input[2]);
    assert_eq!(out[0]["content"], j!([{"type": "text", "text": "q"}]));
}

#[test]
fn a_wrong_length_policy_is_a_warning_and_still_counts() {
    // The newest message's policy is too long: it is left unchanged but still takes
    // idx 0, so the older message sits at idx 1 and its policy-1 part is pruned.
    let input = j!([
        {"role": "user", "content": [{"type": "text", "text": "q"}, {"type": "text", "text": "ctx"}],
         "metadata": {"retention_policy": [null, 1]}},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "one part", "metadata": {"retention_policy": [null, 0]}}
    ]);
    let config = config("");
    let out = run_at(&config, &input, 2);
    assert_eq!(out[0]["content"], j!([{"type": "text", "text": "q"}]));
    assert_eq!(out[2], input[2]);
    let events = events(&config, &input, 2);
    assert!(events
        .iter()
        .any(|e| e.0 == "warning" && e.1 == Some(2) && e.3.contains("2 entries for 1 content parts")));
    // --explain shows it.
    let output = config.process(&["--explain", "--model", "c4"], &input.to_string());
    assert!(output.status.success(), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("warning at message 2"), "{stderr}");
}

#[test]
fn applying_twice_is_applying_once() {
    let mut history = injected_history(j!(1)).as_array().unwrap().clone();
    history.extend(action_result_history().as_array().unwrap().iter().cloned());
    history.push(
        j!({"role": "user", "content": "note", "metadata": {"retention_policy": [0], "turn_added": 2}}),
    );
    history.push(j!({"role": "user", "content": "old", "metadata": {"turn_added": 1, "expiration": {"turns": 1, "mode": "remove"}}}));
    let input = Value::Array(history);
    for table in [
        "",
        "preserve_original = false",
        "[plugin.retention.override]\nturns = 0\nmode = \"remove\"",
    ] {
        let config = config(table);
        let once = run_at(&config, &input, 6);
        let twice = run_at(&config, &once, 6);
        assert_eq!(once, twice, "config {table:?}");
        assert_ne!(once, input);
    }
}

#[test]
fn bad_config_is_refused_naming_the_key() {
    let config = config("[plugin.retention.tools.search]\nmode = \"sometimes\"\n");
    let output = config.process(&[], "[]");
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("tools.search.mode"), "{stderr}");
}

#[test]
fn properties_on_generated_histories() {
    crate::common::check_properties(
        "retention",
        config,
        &[
        ("", "{}"),
        (
            "preserve_original = false\n[plugin.retention.tools.search]\nturns = 1\nmode = \"compact\"\ncompact_length = 4\n\
             [plugin.retention.tools.delete]\nturns = 0\nmode = \"remove\"",
            r#"{"preserve_original":false,"tools":{"search":{"turns":1,"mode":"compact","compact_length":4},
                "delete":{"turns":0,"mode":"remove"}}}"#,
        ),
        (
            "[plugin.retention.override]\nturns = 1\nmode = \"remove\"",
            r#"{"override":{"turns":1,"mode":"remove"}}"#,
        ),
        ],
        false,
    );
}
