//! Expansion (docs/plugins.md#expansion) of what the real plugins compacted or omitted, and `prefix_kept`
//! in `--explain` with `--previous` (docs/plugins.md#token_budget, docs/cli.md#history-host-process) through the real binary.

use e2e_tests::{describe, json, run_json, TestConfig};
use history_engine::expand::{expand, ExpandError, Target};
use history_wire::chat::message_to_string;
use serde_json::{json as j, Value};

fn config(chain: &str, tables: &str) -> TestConfig {
    TestConfig::new(&format!(
        "[history]\nchain = {chain}\non_plugin_error = \"fail\"\n[models.c4]\ntokenizer = \"chars4\"\n{tables}\n"
    ))
}

/// A task, a call to `search` answered by a long result (id `r1`, expiring after one
/// turn by compaction), and a second unit whose result is short.
fn history() -> Value {
    j!([
        {"role": "user", "content": "task", "metadata": {"turn_added": 1}},
        {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}],
         "metadata": {"turn_added": 1}},
        {"role": "tool", "tool_call_id": "c1",
         "content": [{"type": "text", "text": "long result ".repeat(10)}, {"type": "image_url", "image_url": {"url": "u"}}],
         "metadata": {"id": "r1", "turn_added": 1, "expiration": {"turns": 1, "mode": "compact", "compact_length": 10}}},
        {"role": "assistant", "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "search", "arguments": "{}"}}],
         "metadata": {"turn_added": 1}},
        {"role": "tool", "tool_call_id": "c2", "content": "second result", "metadata": {"turn_added": 1}}
    ])
}

#[test]
fn a_compacted_message_expands_back_to_its_original_content() {
    let config = config("[\"default\", \"retention\"]", "");
    let input = history();
    let run = config.run("c4", &input.to_string(), Some(3)).unwrap();
    let mut working = run.history.clone();
    assert_eq!(run_json(&run)[2]["metadata"]["was_compacted"], true);

    let event = expand(&mut working, Target::ById("r1"), 3).unwrap();
    assert_eq!(event.kind.as_str(), "message-expanded");
    assert_eq!(event.index.into_option(), Some(2));
    assert_eq!(event.id.as_ref().into_option().map(|s| s.as_str()), Some("r1"));
    assert_eq!(event.turn, 3);
    let out = json(&history_wire::chat::history_to_string(&working));
    assert_eq!(
        out[2]["content"], input[2]["content"],
        "parts restored as they were"
    );
    let meta = &out[2]["metadata"];
    assert_eq!(meta["was_compacted"], false);
    assert_eq!(meta["can_expand"], false);
    assert!(meta.get("original_content").is_none());
    assert_eq!(meta["id"], "r1");
    // Only that message changed.
    for i in [0, 1, 3, 4] {
        assert_eq!(message_to_string(&working[i]), message_to_string(&run.history[i]));
    }
    // Once expanded it cannot be expanded again.
    assert!(matches!(
        expand(&mut working, Target::ByIndex(2), 3),
        Err(ExpandError::NotExpandable { index: 2, .. })
    ));
}

#[test]
fn an_omitted_tool_result_expands_back_and_after_compaction_to_the_real_original() {
    // retention compacts r1 first (turn 3), then tool_result_filter omits both results:
    // the placeholder's original is the real original, not the compacted text.
    let config = config(
        "[\"default\", \"retention\", \"tool_result_filter\"]",
        "[plugin.tool_result_filter]\nstrategy = \"drop_all\"",
    );
    let input = history();
    let run = config.run("c4", &input.to_string(), Some(3)).unwrap();
    let out = run_json(&run);
    assert_eq!(out[2]["content"], "[Omitted]");
    assert_eq!(out[4]["content"], "[Omitted]");
    let mut working = run.history.clone();
    expand(&mut working, Target::ByIndex(4), 3).unwrap();
    expand(&mut working, Target::ByIndex(2), 3).unwrap();
    let out = json(&history_wire::chat::history_to_string(&working));
    assert_eq!(out[4]["content"], "second result");
    assert_eq!(out[4]["metadata"]["omitted"], false);
    assert_eq!(out[2]["content"], input[2]["content"]);
    assert_eq!(out[2]["metadata"]["omitted"], false);
    assert_eq!(out[2]["metadata"]["was_compacted"], false);
}

#[test]
fn expanding_what_cannot_be_expanded_is_a_clear_error() {
    let config = config(
        "[\"default\", \"tool_result_filter\"]",
        "[plugin.tool_result_filter]\nstrategy = \"drop_all\"\npreserve_original = false",
    );
    let run = config.run("c4", &history().to_string(), Some(1)).unwrap();
    let mut working = run.history.clone();
    let before = history_wire::chat::history_to_string(&working);
    let err = |working: &mut Vec<_>, target| expand(working, target, 1).unwrap_err().to_string();
    assert_eq!(
        err(&mut working, Target::ByIndex(5)),
        "cannot expand message 5: the history has 5 messages"
    );
    assert_eq!(
        err(&mut working, Target::ById("zz")),
        "cannot expand message \"zz\": no message has that id"
    );
    // An omitted result without its original (preserve_original = false).
    assert_eq!(
        err(&mut working, Target::ByIndex(4)),
        "cannot expand message 4: it is not marked can_expand"
    );
    // A message that was never shortened.
    assert!(err(&mut working, Target::ByIndex(1)).starts_with("cannot expand message 1"));
    assert_eq!(history_wire::chat::history_to_string(&working), before);
}

fn units(n: usize) -> Vec<Value> {
    let mut messages = vec![j!({"role": "user", "content": "task"})];
    for i in 0..n {
        messages.push(j!({"role": "assistant", "tool_calls": [
            {"id": format!("c{i}"), "type": "function", "function": {"name": "search", "arguments": "{}"}}]}));
        messages.push(j!({"role": "tool", "tool_call_id": format!("c{i}"), "content": format!("result {i} {}", "x".repeat(30))}));
    }
    messages
}

#[test]
fn previous_shows_prefix_kept_per_plugin_and_for_the_output() {
    let config = config(
        "[\"default\", \"tool_result_filter\"]",
        "[plugin.tool_result_filter]\nkeep = 2",
    );
    // Turn 1: three units; results 0 is replaced.
    let first = config.process(&["--model", "c4"], &Value::Array(units(3)).to_string());
    assert!(first.status.success(), "{}", describe(&first));
    let previous = config.dir.path().join("previous.json");
    std::fs::write(&previous, &first.stdout).unwrap();
    let previous = previous.to_str().unwrap();

    // The agent sends the previous output back with one more unit: default keeps it all
    // (prefix 7 of 9 kept); tool_result_filter now replaces result 1 at index 4.
    let mut next = json(&String::from_utf8_lossy(&first.stdout))
        .as_array()
        .unwrap()
        .clone();
    next.extend(units(4)[7..].iter().cloned());
    let output = config.process(
        &["--model", "c4", "--explain", "--previous", previous],
        &Value::Array(next.clone()).to_string(),
    );
    assert!(output.status.success(), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    let after = |name: &str| {
        let at = lines
            .iter()
            .position(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{stderr}"));
        lines[at + 1].trim().to_string()
    };
    assert_eq!(
        after("default"),
        "prefix_kept 7: first difference from the previous output at message 7"
    );
    assert_eq!(
        after("tool_result_filter"),
        "prefix_kept 4: first difference from the previous output at message 4"
    );
    assert_eq!(
        after("output:"),
        "prefix_kept 4: first difference from the previous output at message 4"
    );

    // The same input again: nothing differs.
    let again = config.process(
        &["--model", "c4", "--explain", "--previous", previous],
        &String::from_utf8_lossy(&first.stdout),
    );
    assert!(again.status.success(), "{}", describe(&again));
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        stderr.contains("prefix_kept 7: all 7 messages as in the previous output"),
        "{stderr}"
    );
    // Without --previous there is no prefix_kept.
    let plain = config.process(&["--model", "c4", "--explain"], &Value::Array(next).to_string());
    assert!(!String::from_utf8_lossy(&plain.stderr).contains("prefix_kept"));
}

#[test]
fn a_bad_previous_file_is_bad_input() {
    let config = config("[\"default\"]", "");
    let missing = config.process(&["--previous", "/nonexistent/previous.json"], "[]");
    assert_eq!(missing.status.code(), Some(2), "{}", describe(&missing));
    assert!(missing.stdout.is_empty());
    let bad = config.dir.path().join("bad.json");
    std::fs::write(&bad, r#"[{"role":"robot"}]"#).unwrap();
    let output = config.process(&["--previous", bad.to_str().unwrap()], "[]");
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("previous output") && stderr.contains("message 0: unknown role \"robot\""),
        "{stderr}"
    );
}

/// `history-host expand` on a stateless history, then the expanded history fed back: the
/// message keeps its content, marked `expanded`, and no plugin shortens it again.
#[test]
fn history_host_expand_restores_a_message_that_stays_expanded() {
    let config = config(
        "[\"default\", \"tool_result_filter\", \"retention\"]",
        "[plugin.tool_result_filter]\nkeep = 0\n",
    );
    let input = history();
    let first = config.process(
        &["--model", "c4"],
        &j!({"turn": 3, "messages": input}).to_string(),
    );
    assert!(first.status.success(), "{}", describe(&first));
    let trimmed = json(&String::from_utf8_lossy(&first.stdout));
    assert_eq!(trimmed[4]["metadata"]["omitted"], true, "{trimmed}");

    let mut expand_cmd = std::process::Command::new(e2e_tests::host_bin());
    expand_cmd.args(["expand", "--index", "4"]);
    let expanded = e2e_tests::run_with_stdin(expand_cmd, &trimmed.to_string());
    assert!(expanded.status.success(), "{}", describe(&expanded));
    let expanded = json(&String::from_utf8_lossy(&expanded.stdout));
    assert_eq!(expanded[4]["content"], input[4]["content"]);
    assert_eq!(expanded[4]["metadata"]["expanded"], true);
    assert_eq!(expanded[4]["metadata"]["omitted"], false);

    // The next turn: tool_result_filter (keep = 0) leaves the expanded result alone.
    let again = config.process(
        &["--model", "c4"],
        &j!({"turn": 4, "messages": expanded}).to_string(),
    );
    assert!(again.status.success(), "{}", describe(&again));
    let again = json(&String::from_utf8_lossy(&again.stdout));
    assert_eq!(again[4], expanded[4], "the expanded result is not omitted again");

    // By id, and refusals in one line with status 2.
    let mut by_id = std::process::Command::new(e2e_tests::host_bin());
    by_id.args(["expand", "--id", "nope"]);
    let refused = e2e_tests::run_with_stdin(by_id, &trimmed.to_string());
    assert_eq!(refused.status.code(), Some(2), "{}", describe(&refused));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("cannot expand message \"nope\": no message has that id"),
        "{stderr}"
    );
    assert!(refused.stdout.is_empty());
}

/// `--explain` names the pinned messages as not counted against `effective_ctx` (by
/// `default`'s own pins) and says what an event's index counts.
#[test]
fn explain_marks_pinned_messages_and_what_indices_count() {
    let history = r#"[{"role":"system","content":"s"},{"role":"user","content":"task"},
        {"role":"assistant","content":"a"},{"role":"user","content":"more"},{"role":"assistant","content":"b"}]"#;
    let both = config("[\"default\"]", "");
    let output = both.process(&["--model", "c4", "--explain"], history);
    assert!(output.status.success(), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("effective_ctx 200 (unpinned messages)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("  pinned: messages 0, 1 (kept, and not counted against effective_ctx)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("is a position in the input of the plugin on that line"),
        "{stderr}"
    );
    // The operator turned the task's pin off: only the system message is pinned.
    let system_only = TestConfig::new(
        "[history]\nchain = [\"default\"]\n[models.c4]\ntokenizer = \"chars4\"\n[plugin.default]\npin_first_user = false\n",
    );
    let output = system_only.process(&["--model", "c4", "--explain"], history);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("  pinned: message 0 (kept, and not counted against effective_ctx)"),
        "{stderr}"
    );
}
