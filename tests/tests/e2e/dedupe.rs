//! `dedupe` (docs/plugins.md#dedupe) through the real library: on real conversations,
//! expansion of what it replaced, and properties on generated histories.

use e2e_tests::{describe, json, run_json, TestConfig};
use plugin_api::EventKind;
use serde_json::{json as j, Value};

fn config(table: &str) -> TestConfig {
    TestConfig::new(&format!(
        "[history]\nagent_max_ctx = 10000\nchain = [\"default\", \"dedupe\"]\non_plugin_error = \"fail\"\n\
         [models.c4]\ntokenizer = \"chars4\"\nmax_context = 10000\n[plugin.dedupe]\n{table}\n"
    ))
}

fn real(name: &str) -> Value {
    let text = std::fs::read_to_string(e2e_tests::real_data_dir().join(name)).unwrap();
    let value = json(&text);
    match value {
        Value::Object(mut document) => document.remove("messages").unwrap(),
        history => history,
    }
}

fn placeholders(history: &Value) -> Vec<usize> {
    history
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, m)| {
            m["content"]
                .as_str()
                .is_some_and(|c| c.starts_with("[Same as the result of call "))
        })
        .map(|(i, _)| i)
        .collect()
}

/// The swe-agent conversation with `setup.py` read again at the end: the first read
/// (message 5) becomes a placeholder pointing at the second, and `history-host expand`
/// restores it.
#[test]
fn a_file_read_twice_keeps_the_newer_read_and_expands_back() {
    let mut history = real("swe-agent-marshmallow-1867.json");
    let messages = history.as_array_mut().unwrap();
    assert_eq!(messages[4]["tool_calls"][0]["function"]["name"], "open");
    let first_read = messages[5].clone();
    messages.push(j!({"role": "user", "content": "Look at setup.py once more."}));
    messages.push(j!({"role": "assistant", "content": "Opening it again.", "tool_calls": [
        {"id": "call_again", "type": "function", "function": {"name": "open", "arguments": "{\"path\":\"setup.py\"}"}}]}));
    messages
        .push(j!({"role": "tool", "tool_call_id": "call_again", "content": first_read["content"].clone()}));
    let config = config("");
    let run = config.run("c4", &history.to_string(), None).unwrap();
    let out = run_json(&run);
    assert_eq!(
        out.as_array().unwrap().len(),
        history.as_array().unwrap().len(),
        "nothing removed"
    );
    assert_eq!(placeholders(&out), [5]);
    let placeholder = &out[5];
    assert_eq!(
        placeholder["content"],
        "[Same as the result of call call_again below]"
    );
    assert_eq!(placeholder["tool_call_id"], first_read["tool_call_id"]);
    assert_eq!(placeholder["metadata"]["omitted"], true);
    assert_eq!(placeholder["metadata"]["can_expand"], true);
    assert!(placeholder["metadata"]["tokens_saved"].as_i64().unwrap() > 100);
    assert_eq!(placeholder["metadata"]["original_content"], first_read["content"]);
    let last = out.as_array().unwrap().len() - 1;
    assert_eq!(out[last], history[last], "the newer read keeps its content");
    let stage = run.stages.iter().find(|s| s.plugin == "dedupe").unwrap();
    assert_eq!(stage.events.len(), 1);
    assert_eq!(stage.events[0].kind, EventKind::MessageOmitted);

    let mut expand = std::process::Command::new(e2e_tests::host_bin());
    expand.args(["expand", "--index", "5"]);
    let expanded = e2e_tests::run_with_stdin(expand, &out.to_string());
    assert!(expanded.status.success(), "{}", describe(&expanded));
    let expanded = json(&String::from_utf8_lossy(&expanded.stdout));
    assert_eq!(expanded[5]["content"], first_read["content"]);
    assert_eq!(expanded[5]["metadata"]["expanded"], true);
    // Expanded on purpose: the next turn does not dedupe it again.
    let again = run_json(&config.run("c4", &expanded.to_string(), None).unwrap());
    assert_eq!(again[5], expanded[5]);
    assert!(placeholders(&again).is_empty());
}

#[test]
fn a_real_repeated_browser_page_becomes_a_placeholder() {
    let history = real("inspect-browser-gpt4o-mini.json");
    let out = run_json(&config("").run("c4", &history.to_string(), None).unwrap());
    assert_eq!(placeholders(&out), [4]);
    let id = history[6]["tool_call_id"].as_str().unwrap();
    assert_eq!(
        out[4]["content"],
        format!("[Same as the result of call {id} below]")
    );
    // preserve_original = false: no original kept, nothing to expand.
    let out = run_json(
        &config("preserve_original = false")
            .run("c4", &history.to_string(), None)
            .unwrap(),
    );
    assert!(out[4]["metadata"].get("original_content").is_none());
    assert!(out[4]["metadata"].get("can_expand").is_none());
    // min_chars above the page's length, or tool_results = false: left alone.
    for table in ["min_chars = 100000", "tool_results = false"] {
        let out = run_json(&config(table).run("c4", &history.to_string(), None).unwrap());
        assert_eq!(out, history, "{table}");
    }
}

#[test]
fn consecutive_duplicates_keep_the_first() {
    let history = j!([
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "continue"},
        {"role": "user", "content": "continue"},
        {"role": "user", "content": "continue"},
        {"role": "assistant", "content": "done"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "continue"}
    ]);
    let run = config("").run("c4", &history.to_string(), None).unwrap();
    let out = run_json(&run);
    let texts: Vec<&str> = out
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["task", "ok", "continue", "done", "continue"]);
    let reasons: Vec<String> = run.stages[1]
        .events
        .iter()
        .map(|e| e.reason.to_string())
        .collect();
    assert_eq!(
        reasons,
        [
            "duplicate of message 2",
            "duplicate of message 2",
            "duplicate of message 5"
        ]
    );
    let out = run_json(
        &config("consecutive = false")
            .run("c4", &history.to_string(), None)
            .unwrap(),
    );
    assert_eq!(out, history);
}

#[test]
fn properties_on_generated_histories() {
    crate::common::check_properties(
        "dedupe",
        config,
        &[
            ("", "{}"),
            ("min_chars = 0", r#"{"min_chars":0}"#),
            (
                "min_chars = 1\npreserve_original = false\nconsecutive = false",
                r#"{"min_chars":1,"preserve_original":false,"consecutive":false}"#,
            ),
        ],
        false,
    );
}
