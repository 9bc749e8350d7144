//! Properties of `token_budget`, `role_pair` and the full shipped chain over generated histories
//! ([`e2e_tests::histories::history`]), through the real libraries with
//! `on_plugin_error = "fail"`, so every run also passes the host's output check (docs/chain.md#the-output-check:
//! valid shape, no new structural faults, nothing invented).

use std::collections::HashSet;

use e2e_tests::histories::history;
use e2e_tests::{json, run_json, TestConfig};
use history_engine::ChainRun;
use history_wire::chat::history_to_string;
use plugin_api::{EventKind, Tokenizer};
use proptest::prelude::*;
use serde_json::Value;

const PLACEHOLDER: &str = "[Omitted]";

fn config(chain: &str, tables: &str) -> TestConfig {
    TestConfig::new(&format!(
        r#"
[history]
chain = [{chain}]
on_plugin_error = "fail"

[models.m]
context_tokens = 100000
tokenizer = "chars4"

{tables}
"#
    ))
}

fn run(config: &TestConfig, input: &str) -> Result<ChainRun, TestCaseError> {
    config
        .run("m", input, None)
        .map_err(|e| TestCaseError::fail(format!("the turn failed: {e}")))
}

/// Runs a chain ending in `role_pair`; `None` when the turn failed only because what
/// reached `role_pair` has no user and no system message: its repair keeps none of it,
/// and the host refuses an empty result for a non-empty history.
fn run_unless_emptied(config: &TestConfig, input: &str) -> Result<Option<ChainRun>, TestCaseError> {
    let failure = match config.run("m", input, None) {
        Ok(run) => return Ok(Some(run)),
        Err(failure) => failure,
    };
    if failure.plugin == "role_pair" && failure.message.contains("empty history returned") {
        // What reached role_pair: the same chain with role_pair skipped.
        let text = std::fs::read_to_string(&config.path)
            .unwrap()
            .replace("on_plugin_error = \"fail\"", "on_plugin_error = \"skip\"");
        let reached = run(&TestConfig::new(&text), input)?;
        let reached = array(run_json(&reached));
        if !reached.is_empty() && !reached.iter().any(|m| matches!(role(m), "user" | "system")) {
            return Ok(None);
        }
    }
    Err(TestCaseError::fail(format!("the turn failed: {failure}")))
}

fn stage_events(run: &ChainRun, plugin: &str, kind: EventKind) -> usize {
    run.stages
        .iter()
        .filter(|s| s.plugin == plugin)
        .flat_map(|s| &s.events)
        .filter(|e| e.kind == kind)
        .count()
}

fn role(message: &Value) -> &str {
    match message["role"].as_str().unwrap_or("") {
        "developer" => "system",
        role => role,
    }
}

fn call_ids(message: &Value) -> Vec<&str> {
    message["tool_calls"]
        .as_array()
        .map(|calls| calls.iter().filter_map(|c| c["id"].as_str()).collect())
        .unwrap_or_default()
}

/// Why `history` would be refused by a strict provider, if it would: after the leading
/// system messages it starts with `user`; no two adjacent user (or assistant) messages (a
/// system message in the middle separates); every assistant message's calls are answered
/// right after it, each exactly once, and every tool message is such an answer.
fn strict_violation(history: &[Value]) -> Option<String> {
    let lead = history.iter().take_while(|m| role(m) == "system").count();
    if lead < history.len() && role(&history[lead]) != "user" {
        return Some(format!("message {lead}: starts with {}", role(&history[lead])));
    }
    for (i, pair) in history.windows(2).enumerate() {
        let (a, b) = (role(&pair[0]), role(&pair[1]));
        if a == b && (a == "user" || a == "assistant") {
            return Some(format!("messages {i} and {}: adjacent {a} messages", i + 1));
        }
    }
    let mut i = 0;
    while i < history.len() {
        let message = &history[i];
        if role(message) == "tool" {
            return Some(format!("message {i}: a tool result that follows no call"));
        }
        i += 1;
        if role(message) != "assistant" || call_ids(message).is_empty() {
            continue;
        }
        let calls: HashSet<&str> = call_ids(message).into_iter().collect();
        let mut answered = HashSet::new();
        while i < history.len() && role(&history[i]) == "tool" {
            let id = history[i]["tool_call_id"].as_str().unwrap_or("");
            if !calls.contains(id) {
                return Some(format!(
                    "message {i}: result \"{id}\" answers none of the calls before it"
                ));
            }
            if !answered.insert(id) {
                return Some(format!("message {i}: second result for \"{id}\""));
            }
            i += 1;
        }
        if answered.len() != calls.len() {
            return Some(format!("message before {i}: a call has no result"));
        }
    }
    None
}

/// The content of a message as a list of parts (a string is one text part, null none).
fn parts(message: &Value) -> Vec<Value> {
    match &message["content"] {
        Value::String(text) => vec![serde_json::json!({"type": "text", "text": text})],
        Value::Array(parts) => parts.clone(),
        _ => Vec::new(),
    }
}

fn calls(message: &Value) -> Vec<Value> {
    message["tool_calls"].as_array().cloned().unwrap_or_default()
}

/// The message without the members a merge rewrites.
fn identity(message: &Value) -> Value {
    let mut message = message.clone();
    if let Some(object) = message.as_object_mut() {
        object.remove("content");
        object.remove("tool_calls");
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("retention_policy");
            if meta.is_empty() {
                object.remove("metadata");
            }
        }
    }
    message
}

/// A part the host reads as reasoning (docs/wire-format.md#part-kinds).
fn is_reasoning(part: &Value) -> bool {
    matches!(
        part["type"].as_str(),
        Some("thinking" | "redacted_thinking" | "reasoning")
    )
}

/// A message's parts split into its reasoning parts and the others, each in order.
fn split_parts(parts: Vec<Value>) -> (Vec<Value>, Vec<Value>) {
    parts.into_iter().partition(is_reasoning)
}

/// Whether `output` is a merge of same-role input messages starting at `first`: its
/// parts and calls are those of `first` and of some later same-role messages, in order —
/// an assistant's reasoning parts first (docs/plugins.md#role_pair), the others after,
/// each group in order.
fn is_merge_from(input: &[Value], first: usize, output: &Value) -> bool {
    if role(&input[first]) != role(output) || identity(&input[first]) != identity(output) {
        return false;
    }
    let out_parts = parts(output);
    if role(output) == "assistant" && out_parts.iter().skip_while(|p| is_reasoning(p)).any(is_reasoning) {
        return false;
    }
    let ((want_r, want_o), want_calls) = (split_parts(out_parts), calls(output));
    let (mut r, mut o, mut c) = (0, 0, 0);
    for (j, message) in input.iter().enumerate().skip(first) {
        if role(message) != role(output) {
            continue;
        }
        let ((mr, mo), mc) = (split_parts(parts(message)), calls(message));
        let fits =
            want_r[r..].starts_with(&mr) && want_o[o..].starts_with(&mo) && want_calls[c..].starts_with(&mc);
        if fits {
            r += mr.len();
            o += mo.len();
            c += mc.len();
        } else if j == first {
            return false;
        }
        if r == want_r.len() && o == want_o.len() && c == want_calls.len() {
            return true;
        }
    }
    false
}

/// Why an output message was invented, if one was: each must be an input message, a
/// placeholder result, or (when merging) a merge of same-role input messages.
fn invented(input: &[Value], output: &[Value], merging: bool) -> Option<String> {
    for (index, message) in output.iter().enumerate() {
        if input.contains(message) {
            continue;
        }
        let is_placeholder = role(message) == "tool"
            && message["content"] == PLACEHOLDER
            && message.as_object().is_some_and(|o| o.len() == 3);
        if is_placeholder {
            continue;
        }
        if merging && (0..input.len()).any(|first| is_merge_from(input, first, message)) {
            continue;
        }
        return Some(format!("output message {index} is made up: {message}"));
    }
    None
}

/// Whether `output` is `input` with some messages left out, in order.
fn is_subsequence(input: &[Value], output: &[Value]) -> bool {
    let mut rest = input.iter();
    output.iter().all(|message| rest.any(|m| m == message))
}

fn tokens(run: &ChainRun) -> u64 {
    run.history
        .iter()
        .map(|m| history_engine::tokens::message_tokens(Tokenizer::Chars4, m, 3))
        .sum()
}

fn input_tokens(input: &str) -> u64 {
    history_wire::chat::history_from_str(input)
        .unwrap()
        .iter()
        .map(|m| history_engine::tokens::message_tokens(Tokenizer::Chars4, m, 3))
        .sum()
}

fn array(value: Value) -> Vec<Value> {
    match value {
        Value::Array(items) => items,
        other => panic!("not an array: {other}"),
    }
}

/// token_budget's table: a budget B, maybe a target below it, pins on or off.
fn budget_table() -> impl Strategy<Value = (u64, String)> {
    (
        1u64..400,
        prop::option::weighted(0.4, 0.0f64..1.0),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(budget, target, pin_system, pin_first_user)| {
            let mut table = format!(
                "[plugin.token_budget]\nmax_tokens = {budget}\npin_system = {pin_system}\npin_first_user = {pin_first_user}\n"
            );
            if let Some(fraction) = target {
                let target = ((budget as f64) * fraction) as u64;
                table.push_str(&format!("target_tokens = {}\n", target.min(budget - 1)));
            }
            (budget, table)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn token_budget_fits_keeps_input_messages_and_is_stable(input in history(), (budget, table) in budget_table()) {
        let config = config(r#""default", "token_budget""#, &table);
        let out = run(&config, &input)?;
        let input_json = array(json(&input));
        let output = array(run_json(&out));
        let over = stage_events(&out, "token_budget", EventKind::OverBudget);
        // Nothing invented or changed: a selection of the input, in order.
        prop_assert!(is_subsequence(&input_json, &output), "not a subsequence of the input");
        // Fits the budget unless it says it does not.
        prop_assert!(tokens(&out) <= budget || over == 1, "{} tokens over {budget} without an event", tokens(&out));
        prop_assert!(over <= 1);
        // Never empty: a non-empty input keeps something.
        prop_assert!(input_json.is_empty() || !output.is_empty());
        // A history that fits is returned unchanged, with no event.
        if input_tokens(&input) <= budget {
            prop_assert_eq!(&output, &input_json);
            prop_assert!(out.stages[1].events.is_empty());
        }
        // Idempotent where docs/plugins.md#shared-trimming-rules promises it: the output fits, so it comes back unchanged.
        if over == 0 {
            let text = history_to_string(&out.history);
            let again = run(&config, &text)?;
            prop_assert_eq!(history_to_string(&again.history), text);
        }
    }

    #[test]
    fn role_pair_output_suits_a_strict_provider_and_is_idempotent(input in history(), drop in prop::bool::weighted(0.3)) {
        let table = if drop { "[plugin.role_pair]\nmode = \"drop\"\n" } else { "" };
        let config = config(r#""default", "role_pair""#, table);
        let Some(out) = run_unless_emptied(&config, &input)? else {
            return Ok(());
        };
        let input_json = array(json(&input));
        let output = array(run_json(&out));
        if let Some(violation) = strict_violation(&output) {
            return Err(TestCaseError::fail(format!("{violation}\noutput: {}", Value::Array(output.clone()))));
        }
        if let Some(made_up) = invented(&input_json, &output, !drop) {
            return Err(TestCaseError::fail(made_up));
        }
        // No user message: the system messages alone.
        if !input_json.iter().any(|m| role(m) == "user") {
            prop_assert!(output.iter().all(|m| role(m) == "system"));
        }
        // System messages are never dropped.
        let systems = |h: &[Value]| h.iter().filter(|m| role(m) == "system").count();
        prop_assert_eq!(systems(&output), systems(&input_json));
        // Deterministic and idempotent, byte for byte.
        let text = history_to_string(&out.history);
        prop_assert_eq!(&history_to_string(&run(&config, &input)?.history), &text);
        let again = run(&config, &text)?;
        prop_assert_eq!(history_to_string(&again.history), text);
        prop_assert!(again.stages[1].events.is_empty());
    }

    #[test]
    fn the_chain_default_token_budget_role_pair_gives_a_valid_history(input in history(), (_budget, table) in budget_table()) {
        let config = config(r#""default", "token_budget", "role_pair""#, &table);
        let Some(out) = run_unless_emptied(&config, &input)? else {
            return Ok(());
        };
        let output = array(run_json(&out));
        if let Some(violation) = strict_violation(&output) {
            return Err(TestCaseError::fail(format!("{violation}\noutput: {}", Value::Array(output.clone()))));
        }
        prop_assert!(out.stages.iter().all(|s| s.skipped.is_none()));
    }

    #[test]
    fn the_full_shipped_chain_gives_a_valid_history(
        input in history(),
        (_budget, table) in budget_table(),
        keep in 0u64..4,
    ) {
        let tables = format!("{table}\n[plugin.tool_result_filter]\nkeep = {keep}\n");
        let config = config(
            r#""default", "tool_result_filter", "retention", "token_budget", "role_pair""#,
            &tables,
        );
        let Some(out) = run_unless_emptied(&config, &input)? else {
            return Ok(());
        };
        let output = array(run_json(&out));
        if let Some(violation) = strict_violation(&output) {
            return Err(TestCaseError::fail(format!("{violation}\noutput: {}", Value::Array(output.clone()))));
        }
        prop_assert!(out.stages.iter().all(|s| s.skipped.is_none()));
        let filter = out.stages.iter().find(|s| s.plugin == "tool_result_filter").unwrap();
        prop_assert_eq!(filter.messages_in, filter.messages_out);
    }
}

/// The checks above must be able to fail: a few hand-made violations.
#[test]
fn the_property_checks_catch_violations() {
    let h = |text: &str| array(json(text));
    let call = r#"{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}"#;
    assert!(strict_violation(&h(
        r#"[{"role":"system","content":"s"},{"role":"assistant","content":"x"}]"#
    ))
    .is_some());
    assert!(strict_violation(&h(
        r#"[{"role":"user","content":"a"},{"role":"user","content":"b"}]"#
    ))
    .is_some());
    assert!(strict_violation(&h(&format!(
        r#"[{{"role":"user","content":"a"}},{{"role":"assistant","content":null,"tool_calls":[{call}]}}]"#
    )))
    .is_some());
    assert!(strict_violation(&h(&format!(
        r#"[{{"role":"user","content":"a"}},{{"role":"assistant","content":null,"tool_calls":[{call}]}},
            {{"role":"tool","tool_call_id":"a","content":"r"}},{{"role":"tool","tool_call_id":"a","content":"r"}}]"#
    )))
    .is_some());
    assert!(strict_violation(&h(
        r#"[{"role":"user","content":"a"},{"role":"tool","tool_call_id":"a","content":"r"}]"#
    ))
    .is_some());
    assert!(strict_violation(&h(&format!(
        r#"[{{"role":"user","content":"a"}},{{"role":"assistant","content":null,"tool_calls":[{call}]}},
            {{"role":"tool","tool_call_id":"a","content":"r"}},{{"role":"assistant","content":"x"}},
            {{"role":"system","content":"s"}},{{"role":"user","content":"b"}}]"#
    )))
    .is_none());

    let input =
        h(r#"[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"}]"#);
    let merged = h(r#"[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"c"}]}]"#);
    assert!(invented(&input, &merged, true).is_none());
    assert!(invented(&input, &merged, false).is_some());
    let made_up = h(r#"[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"z"}]}]"#);
    assert!(invented(&input, &made_up, true).is_some());
    let reordered =
        h(r#"[{"role":"user","content":[{"type":"text","text":"b"},{"type":"text","text":"a"}]}]"#);
    assert!(invented(&input, &reordered, true).is_some());
    assert!(!is_subsequence(
        &input,
        &h(r#"[{"role":"user","content":"c"},{"role":"user","content":"a"}]"#)
    ));
}
