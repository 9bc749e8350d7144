//! Rewriting plugins (docs/abi.md#where-text-lives): the redactor fixture, written with
//! `Message::map_text`, redacts every place a message carries text — content, tool-call
//! arguments, the original kept for expansion — and reports `message-changed` events,
//! whose turn the host fills in.

use e2e_tests::fixtures::{fixture_library, plugin_dir_with};
use e2e_tests::{describe, json, TestConfig};
use plugin_api::EventKind;

const HISTORY: &str = r#"[{"role":"user","content":"log in with SECRET"},
    {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"login","arguments":"{\"key\":\"SECRET\"}"}}]},
    {"role":"tool","tool_call_id":"c1","content":"[Omitted]","metadata":{"omitted":true,"can_expand":true,"original_content":"welcome, SECRET holder"}},
    {"role":"assistant","content":"logged in"}]"#;

#[test]
fn the_redactor_reaches_content_arguments_and_kept_originals_and_reports_each_change() {
    let dir = plugin_dir_with(&[&fixture_library("redactor")]);
    let config = TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"redactor\"]\non_plugin_error = \"fail\"\n",
        dir.path().display().to_string()
    ));
    let output = config.process(
        &["--explain"],
        &format!(r#"{{"turn": 5, "messages": {HISTORY}}}"#),
    );
    assert!(output.status.success(), "{}", describe(&output));
    let out = json(&String::from_utf8_lossy(&output.stdout));
    assert!(!out.to_string().contains("SECRET"), "{out}");
    assert_eq!(out[0]["content"], "log in with [redacted]");
    assert_eq!(
        out[1]["tool_calls"][0]["function"]["arguments"],
        r#"{"key":"[redacted]"}"#
    );
    assert_eq!(
        out[2]["metadata"]["original_content"],
        "welcome, [redacted] holder"
    );
    assert_eq!(out[3], json(HISTORY)[3], "an untouched message is passed through");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("message-changed ×3 at messages 0..=2: secret redacted"),
        "{stderr}"
    );

    // In process: each event is message-changed, about its message, at the run's turn
    // (the plugin built them with Event::of, without a turn).
    let run = config.run("default", HISTORY, Some(5)).unwrap();
    let events = &run.stages[1].events;
    assert_eq!(events.len(), 3, "{events:?}");
    for (index, event) in events.iter().enumerate() {
        assert_eq!(event.kind, EventKind::MessageChanged);
        assert_eq!(event.index.into_option(), Some(index as u64));
        assert_eq!(event.turn, 5, "the host fills in the turn");
    }
}

#[test]
fn a_history_without_secrets_is_passed_through_without_events() {
    let dir = plugin_dir_with(&[&fixture_library("redactor")]);
    let config = TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"redactor\"]\n",
        dir.path().display().to_string()
    ));
    let clean = HISTORY.replace("SECRET", "token");
    let run = config.run("default", &clean, None).unwrap();
    assert!(run.stages[1].events.is_empty());
    assert_eq!(e2e_tests::run_json(&run), json(&clean));
}

/// A rewriting plugin fails open unless it is required: `agentctl check` sees the
/// redactor rewrite the sample history (`message-changed`) and warns while it is not in
/// `[history] required` under `on_plugin_error = "skip"` — not once it is required, nor
/// under `"fail"`.
#[test]
fn check_warns_about_a_rewriting_plugin_that_is_not_required() {
    let dir = plugin_dir_with(&[&fixture_library("redactor")]);
    let config = |history: &str| {
        TestConfig::new(&format!(
            "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"redactor\"]\n{history}\n",
            dir.path().display().to_string()
        ))
    };
    let warning = "warning: plugin \"redactor\" rewrites messages (message-changed on the sample history) but is not required";
    let open = config("on_plugin_error = \"skip\"");
    let output = e2e_tests::agentctl(&open.path, &["check"], &[]);
    assert!(
        output.status.success(),
        "a warning, not a problem: {}",
        describe(&output)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains(warning) && text.contains("`agentctl history-require redactor`"),
        "{text}"
    );
    assert_eq!(
        text.matches("warning: plugin \"redactor\"").count(),
        1,
        "once: {text}"
    );
    let output = e2e_tests::agentctl(&open.path, &["check", "--json"], &[]);
    let report = json(&String::from_utf8_lossy(&output.stdout));
    assert!(
        report["warnings"][0]
            .as_str()
            .unwrap()
            .contains("is not required"),
        "{report}"
    );
    assert!(
        report["runs"][0]["stages"][1]["changed"].as_u64().unwrap() >= 1,
        "{report}"
    );

    for settled in [
        "on_plugin_error = \"skip\"\nrequired = [\"redactor\"]",
        "on_plugin_error = \"fail\"",
    ] {
        let output = e2e_tests::agentctl(&config(settled).path, &["check"], &[]);
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && !text.contains("warning:"),
            "{settled}: {text}"
        );
    }
}
