//! Regression tests for faults an adversarial round found in the output check, the wire
//! format and agentctl's writes:
//!
//! - a plugin hiding data in untyped `extra` members named like modelled fields (or given
//!   twice): an invented tool call, content the token budget never counts, metadata the
//!   host refuses as input (fixture `smuggler`);
//! - a plugin returning an empty history for a non-empty one (fixture `emptier`);
//! - tool calls whose `function` is not the usual shape, changed by a chain that changes
//!   nothing;
//! - agentctl changing the owner of the configuration it edits.

use e2e_tests::fixtures::{fixture_library, plugin_dir_with};
use e2e_tests::{agentctl, describe, json, plugin_dir, real_conversations, TestConfig};
use history_wire::chat::history_from_str;
use plugin_api::faithful::check_faithful;

const HISTORY: &str = r#"[{"role":"system","content":"s"},{"role":"user","content":"task"},
    {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"search","arguments":"{}"}}]},
    {"role":"tool","tool_call_id":"c1","content":"found"},
    {"role":"assistant","content":"done"}]"#;

/// `plugin_dir` holds the shipped plugins plus the fixture `fixture`.
fn config_with(fixture: &str, chain: &str, on_error: &str, tables: &str) -> (TestConfig, tempfile::TempDir) {
    let dir = plugin_dir_with(&[&fixture_library(fixture)]);
    for name in ["token_budget", "tool_result_filter"] {
        let file = history_engine::library_file_name(name);
        std::fs::copy(plugin_dir().join(&file), dir.path().join(&file)).unwrap();
    }
    let config = TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = {chain}\non_plugin_error = \"{on_error}\"\n{tables}",
        dir.path().display().to_string()
    ));
    (config, dir)
}

/// Each trick of the `smuggler` fixture and the key the check must name.
const TRICKS: &[(&str, &str)] = &[
    ("tool_calls", "tool_calls"),
    ("content", "content"),
    ("metadata", "metadata"),
    ("turn_added", "turn_added"),
    ("duplicate", "note"),
    ("function", "function"),
    ("arguments", "arguments"),
];

fn smuggler(trick: &str, on_error: &str) -> (TestConfig, tempfile::TempDir) {
    config_with(
        "smuggler",
        r#"["default", "smuggler"]"#,
        on_error,
        &format!("[plugin.smuggler]\ntrick = \"{trick}\"\n"),
    )
}

/// Runs `check` for every trick; fails listing every trick it failed for.
fn for_every_trick(on_error: &str, check: impl Fn(&str, &std::process::Output) -> Result<(), String>) {
    let failures: Vec<String> = TRICKS
        .iter()
        .filter_map(|(trick, key)| {
            let (config, _dir) = smuggler(trick, on_error);
            let output = config.process(&[], HISTORY);
            check(key, &output)
                .err()
                .map(|why| format!("trick {trick}: {why}\n{}", describe(&output)))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_smuggled_extra_member_fails_the_turn_under_fail_naming_the_plugin_and_the_key() {
    for_every_trick("fail", |key, output| {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().last().unwrap_or_default();
        if output.status.code() != Some(4) || !output.stdout.is_empty() {
            return Err("not exit 4 with nothing on stdout".into());
        }
        if !last.starts_with("history-host: plugin \"smuggler\" failed: invalid output") {
            return Err("the last line does not name the plugin and an invalid output".into());
        }
        if !last.contains(&format!("\"{key}\"")) {
            return Err(format!("the last line does not name \"{key}\""));
        }
        Ok(())
    });
}

#[test]
fn a_smuggled_extra_member_is_skipped_under_skip_and_the_output_is_clean() {
    for_every_trick("skip", |key, output| {
        if !output.status.success() {
            return Err("the turn failed".into());
        }
        if json(&String::from_utf8_lossy(&output.stdout)) != json(HISTORY) {
            return Err("the output is not the input passed on".into());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        match stderr.lines().find(|l| l.contains("plugin \"smuggler\" skipped")) {
            Some(line) if line.contains(&format!("\"{key}\"")) => Ok(()),
            Some(_) => Err(format!("the warning does not name \"{key}\"")),
            None => Err("no warning that the plugin was skipped".into()),
        }
    });
}

#[test]
fn content_hidden_in_extra_does_not_get_past_token_budget() {
    let tables = "[plugin.smuggler]\ntrick = \"content\"\n[plugin.token_budget]\nmax_tokens = 100\n";
    let chain = r#"["default", "smuggler", "token_budget"]"#;
    let (failing, _dir) = config_with("smuggler", chain, "fail", tables);
    let output = failing.process(&[], HISTORY);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));

    let (skipping, _dir) = config_with("smuggler", chain, "skip", tables);
    let output = skipping.process(&["--explain"], HISTORY);
    assert!(output.status.success(), "{}", describe(&output));
    let (clean, _dir) = config_with("smuggler", r#"["default", "token_budget"]"#, "fail", tables);
    let expected = clean.process(&[], HISTORY);
    assert!(expected.status.success(), "{}", describe(&expected));
    assert!(output.stdout.len() < 10_000, "the hidden content came out");
    assert_eq!(
        json(&String::from_utf8_lossy(&output.stdout)),
        json(&String::from_utf8_lossy(&expected.stdout))
    );
}

#[test]
fn every_real_conversation_parses_to_messages_written_as_their_fields_say() {
    for (name, text) in real_conversations() {
        let history = history_from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (index, message) in history.iter().enumerate() {
            if let Err(fault) = check_faithful(message) {
                panic!("{name}: message {index}: {fault}");
            }
        }
    }
}

#[test]
fn an_empty_result_for_a_non_empty_history_fails_the_turn_under_fail() {
    let (config, _dir) = config_with("emptier", r#"["default", "emptier"]"#, "fail", "");
    let output = config.process(&[], HISTORY);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("history-host: plugin \"emptier\" failed: invalid output") && last.contains("empty"),
        "{stderr}"
    );

    // An empty history may come out empty.
    let output = config.process(&[], "[]");
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(json(&String::from_utf8_lossy(&output.stdout)), json("[]"));
}

#[test]
fn an_empty_result_is_skipped_under_skip_and_the_input_passed_on() {
    let (config, _dir) = config_with("emptier", r#"["default", "emptier"]"#, "skip", "");
    let output = config.process(&[], HISTORY);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(json(&String::from_utf8_lossy(&output.stdout)), json(HISTORY));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("plugin \"emptier\" skipped") && l.contains("empty")),
        "{stderr}"
    );
}

#[test]
fn agentctl_check_reports_an_empty_result_as_a_fault() {
    let (config, _dir) = config_with("emptier", r#"["default", "emptier"]"#, "skip", "");
    let output = agentctl(&config.path, &["check"], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("emptier") && l.contains("FAULT")),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("problem: plugin \"emptier\"") && l.contains("empty")),
        "{stdout}"
    );
    assert!(!stdout.trim_end().ends_with("check: ok"), "{stdout}");
}

/// Tool calls whose `function` is not the usual `{"name": STRING, "arguments": …}`.
const ODD_CALLS: &str = r#"[{"role":"user","content":"task"},
    {"role":"assistant","content":null,"tool_calls":[
        {"id":"a","type":"function","function":{}},
        {"id":"b","type":"function","function":{"name":null,"arguments":null}},
        {"id":"c","type":"function","function":{"name":5,"arguments":"{\"q\":1}"}},
        {"id":"d","type":"function","function":{"name":"f"}},
        {"id":"e","type":"function","function":{"arguments":"{}","strict":true}},
        {"id":"f","type":"function","function":{"name":"g","arguments":null}},
        {"id":"g","type":"function","function":{"name":{"x":[1]},"arguments":{"q":2}}},
        {"id":"h","type":"function","function":"search"},
        {"id":"i","type":"function","function":{"name":"h","arguments":{"q":3},"x":1}}]},
    {"role":"tool","tool_call_id":"a","content":"ra"},{"role":"tool","tool_call_id":"b","content":"rb"},
    {"role":"tool","tool_call_id":"c","content":"rc"},{"role":"tool","tool_call_id":"d","content":"rd"},
    {"role":"tool","tool_call_id":"e","content":"re"},{"role":"tool","tool_call_id":"f","content":"rf"},
    {"role":"tool","tool_call_id":"g","content":"rg"},{"role":"tool","tool_call_id":"h","content":"rh"},
    {"role":"tool","tool_call_id":"i","content":"ri"},
    {"role":"assistant","content":"done"}]"#;

#[test]
fn tool_calls_of_any_shape_come_out_of_default_as_they_went_in() {
    let config = TestConfig::new("[history]\nchain = [\"default\"]\non_plugin_error = \"fail\"\n");
    let output = config.process(&[], ODD_CALLS);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(json(&String::from_utf8_lossy(&output.stdout)), json(ODD_CALLS));
}

#[test]
fn clearing_tool_inputs_leaves_an_odd_function_as_it_came() {
    let config = TestConfig::new(
        "[history]\nchain = [\"default\", \"tool_result_filter\"]\non_plugin_error = \"fail\"\n\
         [plugin.tool_result_filter]\nstrategy = \"drop_all\"\nclear_tool_inputs = true\n",
    );
    // Results long enough for their placeholders to save tokens.
    let input = ODD_CALLS.replace(
        "\"content\":\"r",
        &format!("\"content\":\"{}r", "a long result ".repeat(20)),
    );
    let output = config.process(&[], &input);
    assert!(output.status.success(), "{}", describe(&output));
    let out = json(&String::from_utf8_lossy(&output.stdout));
    let input = json(&input);
    let calls = out[1]["tool_calls"].as_array().unwrap();
    for (call, original) in calls.iter().zip(input[1]["tool_calls"].as_array().unwrap()) {
        if call["id"] == "i" {
            // The usual shape: its arguments are cleared.
            assert_eq!(call["function"]["arguments"], "{}", "{call}");
            assert_eq!(call["function"]["x"], 1, "{call}");
        } else {
            assert_eq!(call, original);
        }
    }
    assert!(out[2]["metadata"]["omitted"] == true, "{out}");
}

#[cfg(unix)]
#[test]
fn agentctl_keeps_the_owner_group_and_mode_of_the_config() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let config = TestConfig::new("max_users = 50\n[history]\nchain = [\"default\"]\n");
    // A file this process made is owned by its effective user.
    if std::fs::metadata(&config.path).unwrap().uid() != 0 {
        println!("skipped: agentctl_keeps_the_owner_group_and_mode_of_the_config needs root to give the file another owner");
        return;
    }
    std::os::unix::fs::chown(&config.path, Some(1234), Some(1234)).unwrap();
    std::fs::set_permissions(&config.path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let text = std::fs::read_to_string(&config.path).unwrap();

    let output = agentctl(&config.path, &["max-users", "7"], &[]);
    assert!(output.status.success(), "{}", describe(&output));
    let after = std::fs::metadata(&config.path).unwrap();
    assert_eq!((after.uid(), after.gid()), (1234, 1234), "owner and group kept");
    assert_eq!(after.permissions().mode() & 0o777, 0o600, "mode kept");
    let now = std::fs::read_to_string(&config.path).unwrap();
    assert_eq!(now, text.replace("max_users = 50", "max_users = 7"));
}
