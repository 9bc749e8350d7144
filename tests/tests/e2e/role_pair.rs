//! `role_pair` (docs/plugins.md#role_pair) through the real libraries: each repair step, merge and drop,
//! placeholders, events, idempotence, and the host's output check on every run
//! (`on_plugin_error = "fail"`).

use e2e_tests::{json, run_json, TestConfig};
use history_engine::ChainRun;
use history_wire::chat::history_to_string;
use plugin_api::EventKind;
use serde_json::Value;

fn config(table: &str) -> TestConfig {
    TestConfig::new(&format!(
        r#"
[history]
chain = ["default", "role_pair"]
on_plugin_error = "fail"

[plugin.role_pair]
{table}
"#
    ))
}

fn run_with(config: &TestConfig, input: &str) -> ChainRun {
    config
        .run("gpt-4o", input, None)
        .unwrap_or_else(|e| panic!("the turn failed: {e}\ninput: {input}"))
}

fn run(input: &str) -> ChainRun {
    run_with(&config(""), input)
}

fn events(run: &ChainRun, kind: EventKind) -> Vec<u64> {
    run.stages
        .iter()
        .filter(|s| s.plugin == "role_pair")
        .flat_map(|s| &s.events)
        .filter(|e| e.kind == kind)
        .filter_map(|e| e.index.into_option())
        .collect()
}

fn call(id: &str) -> String {
    format!(r#"{{"id":"{id}","type":"function","function":{{"name":"f","arguments":"{{}}"}}}}"#)
}

fn assert_json(run: &ChainRun, expected: &str) {
    let got = run_json(run);
    let expected = json(expected);
    assert_eq!(
        got,
        expected,
        "\n got: {}\nwant: {}",
        serde_json::to_string(&got).unwrap(),
        serde_json::to_string(&expected).unwrap()
    );
}

#[test]
fn a_valid_history_and_a_tool_loop_pass_through_untouched() {
    let input = format!(
        r#"[{{"role":"system","content":"s"}},{{"role":"user","content":"u"}},
        {{"role":"assistant","content":null,"tool_calls":[{c1}]}},{{"role":"tool","tool_call_id":"c1","content":"r1"}},
        {{"role":"assistant","content":null,"tool_calls":[{c2}]}},{{"role":"tool","tool_call_id":"c2","content":"r2"}},
        {{"role":"assistant","content":"done"}},{{"role":"system","content":"mid"}},{{"role":"assistant","content":"more"}},
        {{"role":"user","content":"u2"}},{{"role":"system","content":"mid2"}},{{"role":"user","content":"u3"}}]"#,
        c1 = call("c1"),
        c2 = call("c2")
    );
    let out = run(&input);
    assert_json(&out, &input);
    assert!(out.stages[1].events.is_empty());
}

#[test]
fn step1_orphan_results_are_dropped_and_the_first_of_two_results_is_kept() {
    let input = format!(
        r#"[{{"role":"user","content":"u"}},{{"role":"assistant","content":null,"tool_calls":[{c1}]}},
        {{"role":"tool","tool_call_id":"c1","content":"first"}},{{"role":"tool","tool_call_id":"c1","content":"second"}},
        {{"role":"tool","tool_call_id":"c9","content":"orphan"}},{{"role":"assistant","content":"done"}}]"#,
        c1 = call("c1")
    );
    let out = run(&input);
    assert_json(
        &out,
        &format!(
            r#"[{{"role":"user","content":"u"}},{{"role":"assistant","content":null,"tool_calls":[{c1}]}},
            {{"role":"tool","tool_call_id":"c1","content":"first"}},{{"role":"assistant","content":"done"}}]"#,
            c1 = call("c1")
        ),
    );
    assert_eq!(events(&out, EventKind::MessageRemoved), vec![3, 4]);
    // Removals say what they saved (model gpt-4o: o200k_base, 3 per message).
    for event in &out.stages[1].events {
        let saved = event.tokens_saved.into_option().unwrap();
        assert!(saved > 3, "{event:?}");
    }
}

#[test]
fn step2_a_separated_result_joins_its_calls_other_results_in_order() {
    let input = format!(
        r#"[{{"role":"user","content":"u"}},{{"role":"assistant","content":null,"tool_calls":[{c1},{c2}]}},
        {{"role":"tool","tool_call_id":"c2","content":"r2"}},{{"role":"user","content":"wait"}},
        {{"role":"tool","tool_call_id":"c1","content":"r1"}},{{"role":"assistant","content":"done"}}]"#,
        c1 = call("c1"),
        c2 = call("c2")
    );
    let out = run(&input);
    // r2 came first and stays first; r1 moves up after it. No placeholder is needed.
    assert_json(
        &out,
        &format!(
            r#"[{{"role":"user","content":"u"}},{{"role":"assistant","content":null,"tool_calls":[{c1},{c2}]}},
            {{"role":"tool","tool_call_id":"c2","content":"r2"}},{{"role":"tool","tool_call_id":"c1","content":"r1"}},
            {{"role":"user","content":"wait"}},{{"role":"assistant","content":"done"}}]"#,
            c1 = call("c1"),
            c2 = call("c2")
        ),
    );
    assert!(events(&out, EventKind::MessageOmitted).is_empty());
}

#[test]
fn step3_merge_joins_parts_calls_and_retention_policies() {
    let input = format!(
        r#"[{{"role":"system","content":"s"}},
        {{"role":"user","content":"a","metadata":{{"id":"m1","message_type":"user-input","x-keep":[1]}}}},
        {{"role":"user","content":[{{"type":"text","text":"b"}},{{"type":"image_url","image_url":{{"url":"u"}}}}],
          "metadata":{{"id":"m2","retention_policy":[0,null]}}}},
        {{"role":"user","content":null}},
        {{"role":"user","content":"c","name":"other"}},
        {{"role":"assistant","content":"x"}},
        {{"role":"assistant","content":null,"tool_calls":[{c1}]}},
        {{"role":"tool","tool_call_id":"c1","content":"r1"}}]"#,
        c1 = call("c1")
    );
    let out = run(&input);
    // Content: every part in order (a string is one text part, null none); metadata and
    // other fields from the first message; policies concatenated with null entries for
    // the parts of messages that had none. No policy in the assistant run: none added.
    assert_json(
        &out,
        &format!(
            r#"[{{"role":"system","content":"s"}},
            {{"role":"user","content":[{{"type":"text","text":"a"}},{{"type":"text","text":"b"}},
              {{"type":"image_url","image_url":{{"url":"u"}}}},{{"type":"text","text":"c"}}],
              "metadata":{{"id":"m1","message_type":"user-input","x-keep":[1],"retention_policy":[null,0,null,null]}}}},
            {{"role":"assistant","content":[{{"type":"text","text":"x"}}],"tool_calls":[{c1}]}},
            {{"role":"tool","tool_call_id":"c1","content":"r1"}}]"#,
            c1 = call("c1")
        ),
    );
    assert_eq!(events(&out, EventKind::MessageMerged), vec![2, 3, 4, 6]);
    // The merge keeps its first message's turn (docs/wire-format.md#turns).
    let turn_of_first_user = 1;
    assert_eq!(out.history[1].turn, turn_of_first_user);
}

#[test]
fn step3_merge_of_parts_less_messages_is_null_and_policies_are_taken_as_they_are() {
    let out = run(
        r#"[{"role":"user","content":"q"},{"role":"assistant","content":null},{"role":"assistant","content":null}]"#,
    );
    assert_json(
        &out,
        r#"[{"role":"user","content":"q"},{"role":"assistant","content":null}]"#,
    );
    // A policy whose length differs from its parts is concatenated as it is.
    let out = run(
        r#"[{"role":"user","content":"a","metadata":{"retention_policy":[1,2]}},{"role":"user","content":"b"},
            {"role":"assistant","content":"x"}]"#,
    );
    assert_json(
        &out,
        r#"[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"metadata":{"retention_policy":[1,2,null]}},
            {"role":"assistant","content":"x"}]"#,
    );
}

#[test]
fn step3_drop_mode_keeps_the_first_message_of_each_run() {
    let input = format!(
        r#"[{{"role":"user","content":"a"}},{{"role":"user","content":"b"}},{{"role":"assistant","content":"x"}},
        {{"role":"assistant","content":null,"tool_calls":[{c1}]}},{{"role":"tool","tool_call_id":"c1","content":"r1"}},
        {{"role":"user","content":"c"}}]"#,
        c1 = call("c1")
    );
    let out = run_with(&config("mode = \"drop\""), &input);
    // The dropped assistant's result answers no call any more: the next pass drops it.
    assert_json(
        &out,
        r#"[{"role":"user","content":"a"},{"role":"assistant","content":"x"},{"role":"user","content":"c"}]"#,
    );
    assert_eq!(events(&out, EventKind::MessageRemoved), vec![1, 3, 4]);
    assert!(events(&out, EventKind::MessageMerged).is_empty());
    // The same input merged instead.
    let out = run(&input);
    assert_json(
        &out,
        &format!(
            r#"[{{"role":"user","content":[{{"type":"text","text":"a"}},{{"type":"text","text":"b"}}]}},
            {{"role":"assistant","content":[{{"type":"text","text":"x"}}],"tool_calls":[{c1}]}},
            {{"role":"tool","tool_call_id":"c1","content":"r1"}},{{"role":"user","content":"c"}}]"#,
            c1 = call("c1")
        ),
    );
}

#[test]
fn step4_calls_without_a_result_get_placeholders_after_the_existing_results() {
    let input = format!(
        r#"[{{"role":"user","content":"u"}},
        {{"role":"assistant","content":null,"tool_calls":[{c1},{c2},{c3}],"metadata":{{"turn_added":1}}}},
        {{"role":"tool","tool_call_id":"c2","content":"r2"}},{{"role":"user","content":"u2"}}]"#,
        c1 = call("c1"),
        c2 = call("c2"),
        c3 = call("c3")
    );
    let expected = |placeholder: &str| {
        format!(
            r#"[{{"role":"user","content":"u"}},
            {{"role":"assistant","content":null,"tool_calls":[{c1},{c2},{c3}],"metadata":{{"turn_added":1}}}},
            {{"role":"tool","tool_call_id":"c2","content":"r2"}},
            {{"role":"tool","tool_call_id":"c1","content":"{placeholder}"}},
            {{"role":"tool","tool_call_id":"c3","content":"{placeholder}"}},
            {{"role":"user","content":"u2"}}]"#,
            c1 = call("c1"),
            c2 = call("c2"),
            c3 = call("c3")
        )
    };
    let out = run(&input);
    assert_json(&out, &expected("[Omitted]"));
    assert_eq!(events(&out, EventKind::MessageOmitted), vec![1, 1]);
    // A placeholder takes its call's turn (docs/wire-format.md#turns): 1, not the current turn 2.
    assert_eq!(out.history[3].turn, 1);
    let out = run_with(&config("placeholder = \"[result not kept]\""), &input);
    assert_json(&out, &expected("[result not kept]"));
}

#[test]
fn step5_leading_non_user_messages_are_dropped_and_systems_join_the_leading_block() {
    let input = format!(
        r#"[{{"role":"system","content":"s1"}},{{"role":"assistant","content":"hi"}},
        {{"role":"developer","content":"s2"}},{{"role":"assistant","content":null,"tool_calls":[{c1}]}},
        {{"role":"tool","tool_call_id":"c1","content":"r1"}},{{"role":"user","content":"u"}},
        {{"role":"assistant","content":"a"}}]"#,
        c1 = call("c1")
    );
    let out = run(&input);
    assert_json(
        &out,
        r#"[{"role":"system","content":"s1"},{"role":"developer","content":"s2"},
            {"role":"user","content":"u"},{"role":"assistant","content":"a"}]"#,
    );
    assert_eq!(events(&out, EventKind::MessageRemoved), vec![1, 3, 4]);
}

#[test]
fn a_history_with_no_user_message_comes_out_as_its_system_messages() {
    let input = format!(
        r#"[{{"role":"system","content":"s1"}},{{"role":"assistant","content":null,"tool_calls":[{c1}]}},
        {{"role":"tool","tool_call_id":"c1","content":"r1"}},{{"role":"system","content":"s2"}},
        {{"role":"assistant","content":"a"}}]"#,
        c1 = call("c1")
    );
    let out = run(&input);
    // System messages are never dropped; with the rest gone they are all leading.
    assert_json(
        &out,
        r#"[{"role":"system","content":"s1"},{"role":"system","content":"s2"}]"#,
    );
    // With no system message either, the repair leaves nothing: the host refuses an empty
    // result for a non-empty history, so the turn fails under `fail` (and `skip` would
    // pass the history on unrepaired).
    let failure = config("")
        .run(
            "gpt-4o",
            r#"[{"role":"assistant","content":"a"},{"role":"tool","tool_call_id":"x","content":"r"}]"#,
            None,
        )
        .unwrap_err();
    assert_eq!(failure.plugin, "role_pair");
    assert!(failure.message.contains("empty history returned"), "{failure}");
}

#[test]
fn opaque_assistant_parts_stay_with_their_tool_calls() {
    let input = format!(
        r#"[{{"role":"user","content":"u"}},
        {{"role":"assistant","content":[{{"type":"reasoning","summary":"think 1"}}]}},
        {{"role":"assistant","content":[{{"type":"reasoning","summary":"think 2"}},{{"type":"text","text":"calling"}}],
          "tool_calls":[{c1}]}},
        {{"role":"tool","tool_call_id":"c1","content":"r1"}}]"#,
        c1 = call("c1")
    );
    let out = run(&input);
    assert_json(
        &out,
        &format!(
            r#"[{{"role":"user","content":"u"}},
            {{"role":"assistant","content":[{{"type":"reasoning","summary":"think 1"}},{{"type":"reasoning","summary":"think 2"}},
              {{"type":"text","text":"calling"}}],"tool_calls":[{c1}]}},
            {{"role":"tool","tool_call_id":"c1","content":"r1"}}]"#,
            c1 = call("c1")
        ),
    );
}

#[test]
fn reused_call_ids_answer_the_nearest_earlier_call() {
    // Both assistant messages call "c1"; the one result answers the second (docs/wire-format.md#messages),
    // so the first gets a placeholder and the result stays where it is.
    let input = format!(
        r#"[{{"role":"user","content":"u"}},{{"role":"assistant","content":null,"tool_calls":[{c1}]}},
        {{"role":"user","content":"u2"}},{{"role":"assistant","content":null,"tool_calls":[{c1}]}},
        {{"role":"tool","tool_call_id":"c1","content":"r"}},{{"role":"tool","tool_call_id":"c1","content":"again"}}]"#,
        c1 = call("c1")
    );
    let out = run(&input);
    assert_json(
        &out,
        &format!(
            r#"[{{"role":"user","content":"u"}},{{"role":"assistant","content":null,"tool_calls":[{c1}]}},
            {{"role":"tool","tool_call_id":"c1","content":"[Omitted]"}},
            {{"role":"user","content":"u2"}},{{"role":"assistant","content":null,"tool_calls":[{c1}]}},
            {{"role":"tool","tool_call_id":"c1","content":"r"}}]"#,
            c1 = call("c1")
        ),
    );
}

/// A history with every kind of fault at once.
fn messy() -> String {
    format!(
        r#"[{{"role":"assistant","content":"lead"}},{{"role":"system","content":"s"}},
        {{"role":"tool","tool_call_id":"zz","content":"orphan"}},{{"role":"user","content":"a"}},
        {{"role":"user","content":[{{"type":"text","text":"b"}}],"metadata":{{"retention_policy":[2]}}}},
        {{"role":"assistant","content":null,"tool_calls":[{c1},{c2}]}},{{"role":"user","content":"c"}},
        {{"role":"tool","tool_call_id":"c2","content":"r2"}},{{"role":"assistant","content":"x"}},
        {{"role":"assistant","content":"y","tool_calls":[{c3}]}},{{"role":"tool","tool_call_id":"c3","content":"r3"}},
        {{"role":"tool","tool_call_id":"c3","content":"dup"}}]"#,
        c1 = call("c1"),
        c2 = call("c2"),
        c3 = call("c3")
    )
}

#[test]
fn the_repair_is_deterministic_and_idempotent() {
    for table in ["", "mode = \"drop\""] {
        let config = config(table);
        let once = run_with(&config, &messy());
        let once_text = history_to_string(&once.history);
        assert!(!once.stages[1].events.is_empty());
        assert_eq!(
            once_text,
            history_to_string(&run_with(&config, &messy()).history),
            "not deterministic ({table})"
        );
        let twice = run_with(&config, &once_text);
        assert_eq!(
            once_text,
            history_to_string(&twice.history),
            "not idempotent ({table})"
        );
        assert!(twice.stages[1].events.is_empty(), "{table}");
        assert!(twice.input_faults.is_empty(), "{:?}", twice.input_faults);
    }
}

#[test]
fn real_conversations_come_out_valid_and_stable() {
    let config = config("");
    for (name, conversation) in e2e_tests::real_conversations().into_iter().take(12) {
        let once = config
            .run("gpt-4o", &conversation, None)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let text = history_to_string(&once.history);
        let twice = config.run("gpt-4o", &text, None).unwrap();
        assert!(twice.input_faults.is_empty(), "{name}: {:?}", twice.input_faults);
        assert_eq!(text, history_to_string(&twice.history), "{name}");
        // Messages the plugin did not touch come out as they went in.
        let input: Value = json(&conversation);
        if once.stages[1].events.is_empty() {
            assert_eq!(run_json(&once), input, "{name}");
        }
    }
}

#[test]
fn bad_config_is_refused_naming_the_key() {
    for (table, key) in [
        ("mode = \"squash\"", "mode"),
        ("placeholder = 3", "placeholder"),
        ("modes = \"drop\"", "modes"),
    ] {
        let config = config(table);
        match history_engine::load_chain(&config.path) {
            Ok(_) => panic!("{table} was accepted"),
            Err(e) => assert!(e.to_string().contains(key), "{e}"),
        }
    }
}

/// The real binary with the chain `default, token_budget, role_pair`: the budget cuts to
/// the pinned task and a kept user message, which role_pair merges; `--explain` names
/// what each plugin did.
#[test]
fn process_runs_token_budget_then_role_pair() {
    let config = TestConfig::new(
        r#"
[history]
chain = ["default", "token_budget", "role_pair"]
on_plugin_error = "fail"
[models.small]
context_tokens = 100000
tokenizer = "chars4"
[plugin.token_budget]
max_tokens = 14
"#,
    );
    // chars4 + 3 per message: every message here costs 4 tokens. The pinned system
    // message and task take 8 of 14; the 6 left hold only the newest message, u3, which
    // then sits beside the task: role_pair merges the two.
    let input = r#"{"model":"small","messages":[{"role":"system","content":"s"},{"role":"user","content":"task"},
        {"role":"assistant","content":"a1"},{"role":"user","content":"u2"},{"role":"assistant","content":"a2"},
        {"role":"user","content":"u3"}]}"#;
    let output = config.process(&["--explain"], input);
    assert!(output.status.success(), "{}", e2e_tests::describe(&output));
    assert_eq!(
        json(&String::from_utf8_lossy(&output.stdout)),
        json(
            r#"[{"role":"system","content":"s"},
                {"role":"user","content":[{"type":"text","text":"task"},{"type":"text","text":"u3"}]}]"#
        )
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("token_budget") && stderr.contains("message-removed"),
        "{stderr}"
    );
    assert!(
        stderr.contains("role_pair") && stderr.contains("message-merged"),
        "{stderr}"
    );
}
