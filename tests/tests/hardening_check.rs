//! Regression tests for faults an adversarial round found in the output check, the wire
//! format and agentctl's writes:
//!
//! - a plugin returning an empty history for a non-empty one (fixture `emptier`);
//! - agentctl changing the owner of the configuration it edits.

use e2e_tests::fixtures::{fixture_library, plugin_dir_with};
use e2e_tests::{agentctl, describe, json, plugin_dir, TestConfig};

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
            .any(|l| l.contains("emptier") && l.contains("FAULT") && l.contains("empty")),
        "{stdout}"
    );
    assert!(!stdout.trim_end().ends_with("check: ok"), "{stdout}");
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
