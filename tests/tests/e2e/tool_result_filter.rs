//! `tool_result_filter` (docs/plugins.md#tool_result_filter) end to end, through the real cdylibs.

use e2e_tests::{describe, json, run_json, TestConfig};
use serde_json::{json as j, Value};

/// A chain of `default` + `tool_result_filter` with `table` as the filter's config, on a
/// `chars4` model (`c4`) so token counts are exact, failing on any plugin fault.
fn config(table: &str) -> TestConfig {
    TestConfig::new(&format!(
        "[history]\nchain = [\"default\", \"tool_result_filter\"]\non_plugin_error = \"fail\"\n\
         [models.c4]\ntokenizer = \"chars4\"\n[plugin.tool_result_filter]\n{table}\n"
    ))
}

/// A task, then `n` units of one call `call_i` to `search` and its result `result i …`.
fn agent_history(n: usize) -> Value {
    let mut messages = vec![j!({"role": "user", "content": "find the flights"})];
    for i in 0..n {
        messages.push(j!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("call_{i}"), "type": "function",
             "function": {"name": "search", "arguments": format!("{{\"q\":\"query number {i}\"}}")}}]}));
        messages.push(j!({"role": "tool", "tool_call_id": format!("call_{i}"),
            "content": format!("result {i}: {}", "x".repeat(40))}));
    }
    Value::Array(messages)
}

fn run(config: &TestConfig, history: &Value) -> Value {
    let run = config
        .run("c4", &history.to_string(), None)
        .unwrap_or_else(|e| panic!("{e}"));
    run_json(&run)
}

fn omitted_indices(history: &Value) -> Vec<usize> {
    history
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, m)| m["metadata"]["omitted"] == j!(true))
        .map(|(i, _)| i)
        .collect()
}

fn tool_indices(history: &Value) -> Vec<usize> {
    history
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, m)| m["role"] == "tool")
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn keep_last_replaces_all_but_the_newest_four_and_keeps_every_message() {
    let input = agent_history(10);
    let out = run(&config(""), &input);
    assert_eq!(out.as_array().unwrap().len(), input.as_array().unwrap().len());
    let tools = tool_indices(&out);
    assert_eq!(omitted_indices(&out), tools[..6].to_vec());
    for &i in &tools[..6] {
        let message = &out[i];
        assert_eq!(message["content"], "[Omitted]");
        assert_eq!(message["tool_call_id"], input[i]["tool_call_id"]);
        assert_eq!(message["metadata"]["can_expand"], true);
        assert_eq!(message["metadata"]["original_content"], input[i]["content"]);
    }
    for &i in &tools[6..] {
        assert_eq!(out[i], input[i], "the newest four results are untouched");
    }
    // Assistant messages and the task are never touched.
    for i in (0..out.as_array().unwrap().len()).filter(|i| !tools.contains(i)) {
        assert_eq!(out[i], input[i]);
    }
}

#[test]
fn tokens_saved_is_original_minus_placeholder_in_the_models_tokenizer() {
    // chars4: "result 0: " + 40 x = 50 chars = 13 tokens; "[Omitted]" = 9 chars = 3 tokens.
    let config = config("strategy = \"drop_all\"");
    let run = config.run("c4", &agent_history(2).to_string(), None).unwrap();
    let out = run_json(&run);
    assert_eq!(out[2]["metadata"]["tokens_saved"], 10);
    let stage = &run.stages[1];
    assert_eq!(stage.plugin, "tool_result_filter");
    let omitted: Vec<_> = stage
        .events
        .iter()
        .filter(|e| e.kind.as_str() == "message-omitted")
        .collect();
    assert_eq!(omitted.len(), 2);
    assert_eq!(omitted[0].index.into_option(), Some(2));
    assert_eq!(omitted[0].tokens_saved.into_option(), Some(10));
    assert_eq!(stage.tokens_in - stage.tokens_out, 20);
}

#[test]
fn drop_all_and_keep_all() {
    let input = agent_history(3);
    let out = run(&config("strategy = \"drop_all\""), &input);
    assert_eq!(omitted_indices(&out), tool_indices(&input));
    let out = run(&config("strategy = \"keep_all\""), &input);
    assert_eq!(out, input);
    // min_chars defaults to 0: an empty result is "no longer than 0" and left alone.
    let mut with_empty = input.clone();
    with_empty[2]["content"] = j!("");
    with_empty[4]["content"] = Value::Null;
    let out = run(&config("strategy = \"drop_all\""), &with_empty);
    assert_eq!(omitted_indices(&out), vec![6]);
}

#[test]
fn keep_counts_tool_messages_not_units() {
    // One assistant message with three calls, answered by three results: keep = 2 keeps
    // the two newest results, not the whole unit.
    let input = j!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "search", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "search", "arguments": "{}"}},
            {"id": "c", "type": "function", "function": {"name": "search", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "result a, long enough"},
        {"role": "tool", "tool_call_id": "b", "content": "result b, long enough"},
        {"role": "tool", "tool_call_id": "c", "content": "result c, long enough"}
    ]);
    let out = run(&config("keep = 2"), &input);
    assert_eq!(omitted_indices(&out), vec![2]);
}

#[test]
fn exclude_tools_uses_the_calls_function_name_else_the_message_name() {
    // One assistant message calls two tools; `read_file` is excluded. The orphan result has
    // no call, so its own `name` decides.
    let input = j!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "read_file", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "search", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "name": "search", "content": "file contents, long"},
        {"role": "tool", "tool_call_id": "b", "name": "read_file", "content": "search results, long"},
        {"role": "tool", "tool_call_id": "zz", "name": "read_file", "content": "orphan file contents"},
        {"role": "tool", "tool_call_id": "yy", "name": "search", "content": "orphan search results"},
        {"role": "user", "content": "next"}
    ]);
    let out = run(
        &config("strategy = \"drop_all\"\nexclude_tools = [\"read_file\"]"),
        &input,
    );
    assert_eq!(omitted_indices(&out), vec![3, 5]);
    // Excluded results do not count toward keep: with keep = 1 the newest counted result
    // (index 5) is kept although an excluded one (4) is newer than index 3.
    let out = run(&config("keep = 1\nexclude_tools = [\"read_file\"]"), &input);
    assert_eq!(omitted_indices(&out), vec![3]);
}

#[test]
fn min_chars_leaves_short_results_alone_and_uncounted() {
    let input = j!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "ééééééééééé"},
        {"role": "tool", "tool_call_id": "b", "content": "ok"},
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "ééééé"}, {"type": "text", "text": "éééééé"}]}
    ]);
    // 11 characters (22 bytes): with min_chars = 10 the two 11-character results count,
    // "ok" does not; keep = 1 keeps the newest counted one (index 4).
    let out = run(&config("keep = 1\nmin_chars = 10"), &input);
    assert_eq!(omitted_indices(&out), vec![2]);
    // min_chars counts characters, not bytes: 11 characters are not over 11.
    let out = run(&config("strategy = \"drop_all\"\nmin_chars = 11"), &input);
    assert_eq!(out, input);
}

#[test]
fn trigger_tokens_acts_only_over_the_threshold() {
    let input = agent_history(6);
    // chars4 with 3 per message: the history's total, as the host's report counts it.
    let total = {
        let config = config("strategy = \"keep_all\"");
        config.run("c4", &input.to_string(), None).unwrap().tokens_in
    };
    let at = run(&config(&format!("trigger_tokens = {total}")), &input);
    assert_eq!(at, input, "not over the threshold: nothing changes");
    let below = run(&config(&format!("trigger_tokens = {}", total - 1)), &input);
    assert_eq!(omitted_indices(&below).len(), 2);
}

#[test]
fn clear_at_least_is_all_or_nothing() {
    // drop_all on 3 results saves 3 × 10 = 30 tokens (chars4).
    let input = agent_history(3);
    assert_eq!(
        run(&config("strategy = \"drop_all\"\nclear_at_least = 31"), &input),
        input
    );
    assert_eq!(
        omitted_indices(&run(
            &config("strategy = \"drop_all\"\nclear_at_least = 30"),
            &input
        ))
        .len(),
        3
    );
    // Cleared arguments count: each `{"q":"query number i"}` (22 chars, 6 tokens) becomes
    // `{}` (1 token), 5 more per result.
    let out = run(
        &config("strategy = \"drop_all\"\nclear_at_least = 45\nclear_tool_inputs = true"),
        &input,
    );
    assert_eq!(omitted_indices(&out).len(), 3);
    assert_eq!(out[2]["metadata"]["tokens_saved"], 15);
    assert_eq!(
        run(
            &config("strategy = \"drop_all\"\nclear_at_least = 46\nclear_tool_inputs = true"),
            &input
        ),
        input
    );
}

#[test]
fn clear_tool_inputs_clears_only_the_replaced_results_calls() {
    let input = j!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "calling", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"q\":\"first\"}"}},
            {"id": "b", "type": "function", "function": {"name": "f", "arguments": {"q": "second"}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "result a, long enough"},
        {"role": "tool", "tool_call_id": "b", "content": "result b, long enough"},
        {"role": "assistant", "content": "done"}
    ]);
    let out = run(&config("keep = 1\nclear_tool_inputs = true"), &input);
    assert_eq!(out.as_array().unwrap().len(), 5);
    assert_eq!(omitted_indices(&out), vec![2]);
    let calls = &out[1]["tool_calls"];
    assert_eq!(calls[0]["function"]["arguments"], "{}");
    assert_eq!(
        calls[1], input[1]["tool_calls"][1],
        "the kept result's call is untouched"
    );
    assert_eq!(out[1]["content"], "calling");
    // Without the switch the assistant message is untouched.
    let out = run(&config("keep = 1"), &input);
    assert_eq!(out[1], input[1]);
}

#[test]
fn preserve_original_and_an_earlier_original() {
    let input = j!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "compacted text ...",
         "metadata": {"was_compacted": true, "is_expired": true, "original_content": "the real original",
                      "can_expand": true, "custom": 1}},
        {"role": "tool", "tool_call_id": "b", "content": "plain result, long"}
    ]);
    let out = run(&config("strategy = \"drop_all\""), &input);
    assert_eq!(out[2]["metadata"]["original_content"], "the real original");
    assert_eq!(out[2]["metadata"]["custom"], 1, "unknown metadata is kept");
    assert_eq!(out[3]["metadata"]["original_content"], "plain result, long");

    let out = run(
        &config("strategy = \"drop_all\"\npreserve_original = false"),
        &input,
    );
    // Existing keys are left as they are; nothing new is added.
    assert_eq!(out[2]["metadata"]["original_content"], "the real original");
    assert_eq!(out[2]["metadata"]["can_expand"], true);
    assert_eq!(out[3]["content"], "[Omitted]");
    assert_eq!(out[3]["metadata"]["omitted"], true);
    assert!(out[3]["metadata"].get("original_content").is_none());
    assert!(out[3]["metadata"].get("can_expand").is_none());
}

#[test]
fn placeholders_are_never_replaced_again_and_do_not_count() {
    let mut input = agent_history(4);
    input[2] = j!({"role": "tool", "tool_call_id": "call_0", "content": "[Gone]",
                   "metadata": {"omitted": true, "tokens_saved": 99}});
    // keep = 2: of the three counted results (4, 6, 8) the oldest is replaced; the
    // placeholder at 2 stays exactly as it was.
    let out = run(&config("keep = 2"), &input);
    assert_eq!(out[2], input[2]);
    assert_eq!(omitted_indices(&out), vec![2, 4]);
}

#[test]
fn a_result_that_already_is_the_placeholder_is_left_alone() {
    // role_pair answers a call that had no result with a bare placeholder; sent back on
    // the next turn, it is neither replaced (its bytes stay) nor counted toward keep.
    let mut input = agent_history(3);
    input[2] = j!({"role": "tool", "tool_call_id": "call_0", "content": "[Omitted]"});
    let out = run(&config("keep = 1"), &input);
    assert_eq!(out[2], input[2]);
    assert_eq!(omitted_indices(&out), vec![4]);
}

#[test]
fn applying_twice_is_applying_once() {
    for table in [
        "",
        "keep = 1\nclear_tool_inputs = true",
        "strategy = \"drop_all\"\npreserve_original = false",
        "keep = 2\nclear_at_least = 5\nmin_chars = 3",
    ] {
        let config = config(table);
        let once = run(&config, &agent_history(7));
        let twice = run(&config, &once);
        assert_eq!(once, twice, "config {table:?}");
    }
}

#[test]
fn placeholders_are_byte_stable_across_turns() {
    // Turn 7: the full transcript; turn 8: the previous output plus a new unit; turn 9:
    // the full transcript again. The replaced result's bytes never change.
    let config = config("keep = 2");
    let bytes =
        |run: &history_engine::ChainRun, i: usize| history_wire::chat::message_to_string(&run.history[i]);
    let first = config.run("c4", &agent_history(4).to_string(), Some(7)).unwrap();
    let mut next = run_json(&first);
    let more = agent_history(5);
    next.as_array_mut()
        .unwrap()
        .extend(more.as_array().unwrap()[9..].iter().cloned());
    let second = config.run("c4", &next.to_string(), Some(8)).unwrap();
    let third = config.run("c4", &agent_history(5).to_string(), Some(9)).unwrap();
    for i in [2, 4] {
        assert_eq!(bytes(&first, i), bytes(&second, i));
        assert_eq!(bytes(&first, i), bytes(&third, i));
    }
    assert_eq!(omitted_indices(&run_json(&second)), vec![2, 4, 6]);
}

#[test]
fn the_count_of_messages_never_changes_on_real_conversations() {
    let config = config("strategy = \"drop_all\"\nclear_tool_inputs = true");
    for (name, text) in e2e_tests::real_conversations() {
        // default (first) may trim; compare against the filter's own input.
        let run = config
            .run("c4", &text, None)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let stage = &run.stages[1];
        assert_eq!(stage.messages_in, stage.messages_out, "{name}");
    }
}

#[test]
fn the_binary_logs_one_line_and_explains_the_events() {
    let config = config("");
    let output = config.process(&["--explain", "--model", "c4"], &agent_history(10).to_string());
    assert!(output.status.success(), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("tool results: 10 total, 4 kept, 6 replaced with placeholders"),
        "{stderr}"
    );
    assert!(
        stderr.contains("message-omitted ×6 at messages 2..=12, 60 tokens saved"),
        "{stderr}"
    );
    let out = json(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(omitted_indices(&out).len(), 6);
}

#[test]
fn the_log_line_does_not_count_empty_results_as_kept() {
    let mut history = agent_history(6);
    // Results 0 and 5 came back empty: nothing to replace, and nothing kept either.
    history[2]["content"] = j!("");
    history[12]["content"] = Value::Null;
    let output = config("keep = 2").process(&["--model", "c4"], &history.to_string());
    assert!(output.status.success(), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    // 6 results: of the 4 with content the newest 2 are kept and 2 replaced; 2 are empty.
    assert!(
        stderr.contains("tool results: 6 total, 2 kept, 2 replaced with placeholders, 2 empty"),
        "{stderr}"
    );
}

#[test]
fn properties_on_generated_histories() {
    crate::common::check_properties(
        "tool_result_filter",
        config,
        &[
            ("", "{}"),
            (
                "keep = 1\nclear_tool_inputs = true\nmin_chars = 3\nexclude_tools = [\"delete\"]",
                r#"{"keep":1,"clear_tool_inputs":true,"min_chars":3,"exclude_tools":["delete"]}"#,
            ),
            (
                "strategy = \"drop_all\"\npreserve_original = false\nclear_at_least = 5",
                r#"{"strategy":"drop_all","preserve_original":false,"clear_at_least":5}"#,
            ),
        ],
        true,
    );
}
