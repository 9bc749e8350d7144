//! Bad input (docs/wire-format.md#input-checks, docs/cli.md#exit-statuses): exit 2, one line naming what and where, nothing on stdout;
//! structural faults are accepted and reported.

use e2e_tests::{describe, json, TestConfig};

fn bad(input: &str) -> String {
    let config = TestConfig::new("");
    let output = config.process(&[], input);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr.lines().last().unwrap().to_string()
}

#[test]
fn bad_input_names_the_problem_and_where() {
    assert!(bad(r#"[{"role":"user","content":"a"},{"role":"robot"}]"#)
        .ends_with("message 1: unknown role \"robot\""));
    assert!(bad("not json").contains("input is not valid JSON"));
    assert!(bad(r#"[{"role":"user","content":NaN}]"#).contains("not valid JSON"));
    assert!(bad(r#"[{"role":"user","content":1e999}]"#).contains("not valid JSON"));
    assert!(bad(r#"[{"role":"user","content":"\ud800"}]"#).contains("not valid JSON"));
    assert!(
        bad(r#"[{"role":"tool","content":"x"}]"#).contains("message 0: tool message without tool_call_id")
    );
    assert!(
        bad(r#"[{"role":"user","metadata":{"turn_added":0}}]"#).contains("message 0: metadata.turn_added")
    );
    assert!(bad(r#"{"turn":0,"messages":[]}"#).contains("turn must be an integer"));
    assert!(bad(r#"{"messages":[],"extra":1}"#).contains("unknown member \"extra\""));
    let deep = format!("[{}{}]", "[".repeat(200), "]".repeat(200));
    assert!(bad(&deep).contains("not valid JSON"));
}

#[test]
fn structural_faults_are_accepted_and_reported() {
    let input =
        r#"[{"role":"assistant","content":"hi"},{"role":"tool","tool_call_id":"nope","content":"x"}]"#;
    let config = TestConfig::new("");
    let output = config.process(&["--explain"], input);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(json(&String::from_utf8_lossy(&output.stdout)), json(input));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("structural fault in the input: message 1: tool result \"nope\" answers no call"),
        "{stderr}"
    );
    assert!(stderr.contains("history starts with assistant"), "{stderr}");
}

#[test]
fn the_document_form_sets_model_and_turn() {
    let config = TestConfig::new("[models.tiny]\nmax_context = 1\n[models.other]\n");
    let doc = r#"{"model":"tiny","turn":7,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}"#;
    let output = config.process(&["--explain"], doc);
    assert!(output.status.success(), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("model tiny, turn 7, effective_ctx 1"), "{stderr}");
    // --model wins over the document's model
    let output = config.process(&["--explain", "--model", "other"], doc);
    assert!(String::from_utf8_lossy(&output.stderr).contains("model other, turn 7, effective_ctx 200"));
}
