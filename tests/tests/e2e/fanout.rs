//! A wide tool-call fan-out, end to end through the real cdylibs: one assistant message
//! with thousands of calls, answered in reverse order. Every plugin that looks up the call
//! a result answers does it once per result, so these histories catch both a wrong lookup
//! (the detailed checks on 2,000 calls) and a lookup that scans all the calls each time
//! (100,000 calls: seconds in a debug build when each lookup is a hash; with a scan per
//! lookup the test did not finish in 20 minutes).

use e2e_tests::{plugin_dir, run_json, workspace_root, TestConfig};
use plugin_api::EventKind;
use serde_json::{json as j, Value};

/// The tool of call `i`: three tools in turn.
fn tool(i: usize) -> &'static str {
    ["search", "read", "write"][i % 3]
}

/// A task, then one assistant message with `calls` calls `call_0`…, and the results of
/// the calls `answered` picks, newest call first (the reverse of the calls' order). All
/// of it added on turn 1.
fn fan_out(calls: usize, answered: impl Fn(usize) -> bool) -> Value {
    let turn_1 = j!({"turn_added": 1});
    let tool_calls: Vec<Value> = (0..calls)
        .map(|i| {
            j!({"id": format!("call_{i}"), "type": "function",
                "function": {"name": tool(i), "arguments": format!("{{\"n\":{i}}}")}})
        })
        .collect();
    let mut messages = vec![
        j!({"role": "user", "content": "do it all at once", "metadata": turn_1}),
        j!({"role": "assistant", "content": null, "tool_calls": tool_calls, "metadata": turn_1}),
    ];
    for i in (0..calls).rev().filter(|&i| answered(i)) {
        messages.push(j!({"role": "tool", "tool_call_id": format!("call_{i}"),
            "content": format!("{} result {i}", tool(i)), "metadata": turn_1}));
    }
    Value::Array(messages)
}

/// The call id a result answers, as a number.
fn call_number(message: &Value) -> usize {
    message["tool_call_id"].as_str().unwrap()["call_".len()..]
        .parse()
        .unwrap()
}

/// `chain` on a `chars4` model (`c4`, window 200 messages), failing on any plugin fault,
/// with `tables` appended. No deadline: these tests measure how the plugins' work grows with a wide fan-out, and
/// a debug build on a loaded machine may take longer than the default 2 s per call.
fn config(chain: &str, tables: &str) -> TestConfig {
    TestConfig::new(&format!(
        "[history]\nchain = [{chain}]\non_plugin_error = \"fail\"\nplugin_timeout_ms = 0\n\
         [models.c4]\ntokenizer = \"chars4\"\n{tables}\n"
    ))
}

fn run(config: &TestConfig, history: &Value, turn: Option<u64>) -> Value {
    let run = config
        .run("c4", &history.to_string(), turn)
        .unwrap_or_else(|e| panic!("{e}"));
    run_json(&run)
}

#[test]
fn the_shipped_chain_keeps_a_wide_fan_out_whole_and_replaces_all_but_the_newest_four_results() {
    let shipped = std::fs::read_to_string(workspace_root().join("plugins-enabled.toml")).unwrap();
    let text = shipped
        .replace(
            "plugin_dir = \"target/plugins\"",
            &format!("plugin_dir = {:?}", plugin_dir().display().to_string()),
        )
        .replace("on_plugin_error = \"skip\"", "on_plugin_error = \"fail\"");
    let config = TestConfig::new(&text);
    let input = fan_out(2_000, |_| true);
    let run = config
        .run("default", &input.to_string(), None)
        .unwrap_or_else(|e| panic!("{e}"));
    let out = run_json(&run);
    // `default`: the fan-out is one unit of 2,001 messages, over the window of 200: the
    // newest unit is kept whole with the pinned task (over budget). Nothing else removes,
    // merges or moves a message: the results are right after their call, in any order.
    assert_eq!(out.as_array().unwrap().len(), 2_002);
    assert!(run.stages[0]
        .events
        .iter()
        .any(|e| e.kind == EventKind::OverBudget));
    assert_eq!(out[0], input[0]);
    assert_eq!(out[1], input[1]);
    // `tool_result_filter`, keep 4: the four newest results are the last four messages,
    // the answers of calls 3, 2, 1 and 0; the 1,996 others are placeholders.
    for index in 2..2_002 {
        let (message, original) = (&out[index], &input[index]);
        assert_eq!(message["tool_call_id"], original["tool_call_id"]);
        if index >= 1_998 {
            assert_eq!(message, original, "message {index} is among the newest four");
        } else {
            assert_eq!(message["content"], "[Omitted]", "message {index}");
            assert_eq!(message["metadata"]["omitted"], true);
            assert_eq!(message["metadata"]["original_content"], original["content"]);
        }
    }
    assert_eq!(
        (1_998..2_002).map(|i| call_number(&out[i])).collect::<Vec<_>>(),
        [3, 2, 1, 0]
    );
}

#[test]
fn tool_result_filter_names_each_result_of_a_wide_fan_out_by_its_own_call() {
    // `write` results are excluded (never replaced, not counted); the newest four counted
    // results keep their content; every other result is replaced and its call's arguments
    // cleared, and only those calls' arguments.
    let config = config(
        "\"default\", \"tool_result_filter\"",
        "[plugin.tool_result_filter]\nexclude_tools = [\"write\"]\nclear_tool_inputs = true",
    );
    let input = fan_out(2_000, |_| true);
    let out = run(&config, &input, None);
    assert_eq!(out.as_array().unwrap().len(), 2_002);
    // Counted results in history order: calls 1999, 1997, 1996, 1994, … (not `write`);
    // the newest four are the last four of them.
    let counted: Vec<usize> = (2..2_002)
        .filter(|&i| tool(call_number(&input[i])) != "write")
        .collect();
    let kept = &counted[counted.len() - 4..];
    let mut replaced_calls = Vec::new();
    for index in 2..2_002 {
        let (message, original) = (&out[index], &input[index]);
        let call = call_number(original);
        if tool(call) == "write" || kept.contains(&index) {
            assert_eq!(message, original, "message {index} (call {call})");
        } else {
            assert_eq!(message["content"], "[Omitted]", "message {index} (call {call})");
            assert_eq!(message["tool_call_id"], original["tool_call_id"]);
            replaced_calls.push(call);
        }
    }
    assert_eq!(replaced_calls.len(), counted.len() - 4);
    let calls = out[1]["tool_calls"].as_array().unwrap();
    for (i, call) in calls.iter().enumerate() {
        let arguments = &call["function"]["arguments"];
        if replaced_calls.contains(&i) {
            assert_eq!(arguments, "{}", "call {i}");
        } else {
            assert_eq!(
                arguments, &input[1]["tool_calls"][i]["function"]["arguments"],
                "call {i}"
            );
        }
    }
}

#[test]
fn each_result_of_a_wide_fan_out_expires_by_its_own_tools_settings() {
    // Added on turn 1, seen on turn 3: two turns old, over `turns = 1`. `search` results
    // are removed (placeholders, so the structure holds), `read` results compacted to 4
    // characters, `write` results have no settings and stay.
    let config = config(
        "\"default\", \"retention\"",
        "[plugin.retention.tools.search]\nturns = 1\nmode = \"remove\"\n\
         [plugin.retention.tools.read]\nturns = 1\nmode = \"compact\"\ncompact_length = 4",
    );
    let input = fan_out(2_000, |_| true);
    let out = run(&config, &input, Some(3));
    assert_eq!(out.as_array().unwrap().len(), 2_002);
    for index in 2..2_002 {
        let (message, original) = (&out[index], &input[index]);
        let call = call_number(original);
        assert_eq!(message["tool_call_id"], original["tool_call_id"]);
        match tool(call) {
            "search" => {
                assert_eq!(message["content"], "[Omitted]", "message {index} (call {call})");
                assert_eq!(message["metadata"]["is_expired"], true);
            }
            "read" => {
                let text = message["content"].as_str().unwrap();
                assert!(
                    text.starts_with("read...\n\n[Compacted: showing first 4 of "),
                    "{text}"
                );
                assert_eq!(message["metadata"]["was_compacted"], true);
            }
            _ => assert_eq!(message, original, "message {index} (call {call})"),
        }
    }
}

#[test]
fn role_pair_answers_the_unanswered_calls_of_a_wide_fan_out_in_call_order() {
    // Only the odd calls have results (newest first); role_pair adds a placeholder result
    // for each even call after them, in `tool_calls` order, and moves nothing else.
    let config = config(
        "\"default\", \"role_pair\"",
        "[plugin.role_pair]\nplaceholder = \"[none]\"",
    );
    let input = fan_out(2_000, |i| i % 2 == 1);
    let out = run(&config, &input, None);
    let out = out.as_array().unwrap();
    assert_eq!(out.len(), 2_002);
    assert_eq!(&out[..1_002], &input.as_array().unwrap()[..]);
    for (k, message) in out[1_002..].iter().enumerate() {
        assert_eq!(message["role"], "tool");
        assert_eq!(message["tool_call_id"], format!("call_{}", 2 * k));
        assert_eq!(message["content"], "[none]");
    }
}

#[test]
fn a_fan_out_of_a_hundred_thousand_calls_goes_through_the_plugins_that_look_up_calls() {
    // Every lookup of a result's call once per result: by hash, this takes seconds in a
    // debug build; scanning the calls for each result, more than 20 minutes (2,000 calls
    // are too few to tell the two apart). Results of `write` are excluded from the
    // filter, so `retention` finds their tool too and expires them (added on turn 1, seen
    // on turn 10); the even calls get role_pair's placeholders, which the host's output
    // check then matches against the calls.
    let config = config(
        "\"default\", \"tool_result_filter\", \"retention\", \"role_pair\"",
        "[plugin.tool_result_filter]\nexclude_tools = [\"write\"]\nclear_tool_inputs = true\n\
         [plugin.retention.tools.write]\nturns = 5\nmode = \"remove\"",
    );
    let calls = 100_000;
    let input = fan_out(calls, |i| i % 2 == 1);
    let run = config
        .run("c4", &input.to_string(), Some(10))
        .unwrap_or_else(|e| panic!("{e}"));
    let count = |plugin: usize, kind: EventKind| {
        run.stages[plugin]
            .events
            .iter()
            .filter(|e| e.kind == kind)
            .count()
    };
    let answered = calls / 2;
    let write_results = (0..calls).filter(|&i| i % 2 == 1 && tool(i) == "write").count();
    assert_eq!(run.history.len(), 2 + calls);
    assert_eq!(count(1, EventKind::MessageOmitted), answered - write_results - 4);
    assert_eq!(count(2, EventKind::MessageExpired), write_results);
    assert_eq!(count(3, EventKind::MessageOmitted), calls - answered);
}
