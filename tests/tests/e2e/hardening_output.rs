//! What the binaries promise about their output, and what a plugin in their process can
//! no longer break: a write that fails is a failure (a closed pipe is not); a plugin's
//! `println!`, its closing of fd 1 or its `exit(0)` cannot fake or corrupt the output;
//! every error or log line stays one line, with no raw control characters and no
//! megabyte echoes; usage errors have their own status; a refused library is one line.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use e2e_tests::fixtures::{fixture_library, plugin_built_against_changed_api, plugin_dir_with, ApiChange};
use e2e_tests::{agentctl_bin, describe, host_bin, json, TestConfig};

const HISTORY: &str = r#"[{"role":"system","content":"s"},{"role":"user","content":"task"},
    {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"search","arguments":"{}"}}]},
    {"role":"tool","tool_call_id":"c1","content":"found"},
    {"role":"assistant","content":"done"}]"#;

/// The status of a write that failed (not a closed pipe).
const WRITE_FAILED: i32 = 5;
/// The status when a plugin ended the process before the output was written.
const PLUGIN_EXIT: i32 = 6;
/// A usage error (sysexits' EX_USAGE).
const USAGE: i32 = 64;

/// Runs `command` with `stdin`, its stdout going to `stdout`, collecting stderr (and
/// stdout, when `stdout` is a pipe).
fn run(command: Command, stdin: &str, stdout: Stdio) -> Output {
    e2e_tests::run_with_stdin_to(command, stdin, stdout)
}

/// `history-host process --config CONFIG ARGS…`, `HISTORY_LOG` set to `log` if given.
fn host(config: &Path, args: &[&str], log: Option<&str>) -> Command {
    let mut command = Command::new(host_bin());
    command.arg("process").arg("--config").arg(config).args(args);
    command.env_remove("HISTORY_LOG");
    if let Some(log) = log {
        command.env("HISTORY_LOG", log);
    }
    command
}

/// `agentctl --config CONFIG ARGS…`.
fn agentctl(config: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(agentctl_bin());
    command
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("HISTORY_LOG")
        .env_remove("AGENTCTL_FAULT");
    command
}

/// `/dev/full`: every write fails with "No space left on device".
fn full_device() -> Stdio {
    std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full")
        .into()
}

/// The write end of a pipe whose read end is already closed: every write gets EPIPE,
/// whatever the timing (what `| head -1` leaves once head has its line).
fn closed_pipe() -> Stdio {
    let mut reader = Command::new("true").stdin(Stdio::piped()).spawn().unwrap();
    let write_end = reader.stdin.take().unwrap();
    reader.wait().unwrap();
    write_end.into()
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).to_string()
}

/// A configuration whose plugin folder holds `default` and the fixture `fixture`, with
/// `chain` and `on_plugin_error`, plus `extra` lines.
fn fixture_config(
    fixture: &str,
    chain: &str,
    on_error: &str,
    extra: &str,
) -> (TestConfig, tempfile::TempDir) {
    let dir = plugin_dir_with(&[&fixture_library(fixture)]);
    let config = TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = {chain}\non_plugin_error = \"{on_error}\"\n{extra}",
        dir.path().display().to_string()
    ));
    (config, dir)
}

/// Every line of `stderr` is one line of the program's: no raw control character, and
/// the fixture's second line never starts a line of its own.
fn assert_one_line_each(stderr: &str) {
    assert!(
        !stderr.chars().any(|c| c.is_control() && c != '\n'),
        "a raw control character reached stderr: {stderr:?}"
    );
    assert!(
        !stderr.lines().any(|l| l.starts_with("second line")),
        "a line was split: {stderr}"
    );
}

// 1. Lost output is a failure; a closed pipe is not.

#[test]
fn output_that_cannot_be_written_is_a_failure_in_one_line() {
    let config = TestConfig::new("");
    let output = run(host(&config.path, &[], Some("error")), HISTORY, full_device());
    assert_eq!(output.status.code(), Some(WRITE_FAILED), "{}", describe(&output));
    let stderr = stderr_of(&output);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("history-host: cannot write output: No space left on device"),
        "{stderr}"
    );

    let output = run(
        agentctl(&config.path, &["history-list", "--json"]),
        "",
        full_device(),
    );
    assert_eq!(output.status.code(), Some(WRITE_FAILED), "{}", describe(&output));
    let stderr = stderr_of(&output);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("agentctl: cannot write output: No space left on device"),
        "{stderr}"
    );
}

#[test]
fn a_closed_pipe_is_a_quiet_success_for_both_binaries() {
    let config = TestConfig::new("");
    let output = run(host(&config.path, &[], Some("error")), HISTORY, closed_pipe());
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert!(output.stderr.is_empty(), "{}", describe(&output));

    for args in [
        &["history-list", "--json"][..],
        &["history-list"],
        &["plugins"],
        &["check", "--json"],
    ] {
        let output = run(agentctl(&config.path, args), "", closed_pipe());
        assert_eq!(output.status.code(), Some(0), "{args:?}: {}", describe(&output));
        assert!(output.stderr.is_empty(), "{args:?}: {}", describe(&output));
    }
}

// 2. A plugin's println! or close(1) cannot corrupt or lose the output.

#[test]
fn a_plugin_printing_to_stdout_does_not_corrupt_the_output() {
    let (config, _dir) = fixture_config("printer", r#"["default", "printer"]"#, "fail", "");
    let output = run(host(&config.path, &[], None), HISTORY, Stdio::piped());
    assert!(output.status.success(), "{}", describe(&output));
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    let value: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {stdout}"));
    assert_eq!(value, json(HISTORY));
    assert!(
        stderr_of(&output).contains("printer: garbage from process"),
        "the plugin's print went to stderr: {}",
        describe(&output)
    );

    let output = run(agentctl(&config.path, &["check", "--json"]), "", Stdio::piped());
    assert!(output.status.success(), "{}", describe(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("check --json is not JSON ({e}): {}", describe(&output)));
    assert_eq!(report["ok"], true, "{report}");
}

#[test]
fn a_plugin_closing_stdout_does_not_lose_the_output() {
    let (config, _dir) = fixture_config("fd_closer", r#"["default", "fd_closer"]"#, "fail", "");
    let output = run(host(&config.path, &[], None), HISTORY, Stdio::piped());
    assert!(output.status.success(), "{}", describe(&output));
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    let value: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", describe(&output)));
    assert_eq!(value, json(HISTORY));

    let output = run(agentctl(&config.path, &["check", "--json"]), "", Stdio::piped());
    assert!(output.status.success(), "{}", describe(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("check --json is not JSON ({e}): {}", describe(&output)));
    assert_eq!(report["ok"], true, "{report}");
}

// 3. A plugin's exit(0) is not a success.

#[test]
fn a_plugin_ending_the_process_is_a_failure() {
    let (config, _dir) = fixture_config("exiter", r#"["default", "exiter"]"#, "skip", "");
    let output = run(host(&config.path, &[], Some("error")), HISTORY, Stdio::piped());
    assert_eq!(output.status.code(), Some(PLUGIN_EXIT), "{}", describe(&output));
    assert!(output.stdout.is_empty(), "{}", describe(&output));
    assert_eq!(
        stderr_of(&output),
        "history-host: a plugin ended the process before the output was written\n"
    );

    let output = run(agentctl(&config.path, &["check", "--json"]), "", Stdio::piped());
    assert_eq!(output.status.code(), Some(PLUGIN_EXIT), "{}", describe(&output));
    assert!(output.stdout.is_empty(), "{}", describe(&output));
    assert_eq!(
        stderr_of(&output),
        "agentctl: a plugin ended the process before the output was written\n"
    );
}

// 4. Control characters are escaped wherever input or a plugin's words are echoed.

#[test]
fn control_characters_in_the_input_are_escaped_on_one_line() {
    let config = TestConfig::new("");
    let output = config.process(&[], r#"[{"role":"ro\nbot\u001b[31m","content":"x"}]"#);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    assert_eq!(
        stderr_of(&output),
        "history-host: message 0: unknown role \"ro\\nbot\\u{1b}[31m\"\n"
    );

    // A member name of the document.
    let output = config.process(&[], "{\"messages\":[],\"x\\r\\u009b2J\":1}");
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    assert_eq!(
        stderr_of(&output),
        "history-host: document: unknown member \"x\\r\\u{9b}2J\" (expected model, turn, messages)\n"
    );

    // The model name in --explain.
    let input = r#"[{"role":"user","content":"hi"}]"#;
    let output = config.process(&["--explain", "--model", "m\n\u{1b}[2Jx"], input);
    assert!(output.status.success(), "{}", describe(&output));
    let stderr = stderr_of(&output);
    assert_one_line_each(&stderr);
    assert!(stderr.contains(r"model m\n\u{1b}[2Jx, turn"), "{stderr}");
}

#[test]
fn control_characters_in_the_configuration_are_escaped_on_one_line() {
    for (body, expected) in [
        (
            "[history]\nchain = [\"default\", \"a\\nb\\u001b[31m\"]\n",
            r#"chain entry "a\nb\u{1b}[31m" is not a plugin name"#,
        ),
        ("[history]\non_plugin_error = \"sk\\nip\"\n", r#"found "sk\nip""#),
        (
            "[history]\n\"ch\\nain\" = 1\n",
            r"unknown key `ch\nain` in [history]",
        ),
        (
            "[models.\"m\\u001b]0;x\\u0007\"]\ntokenizer = 1\n",
            r"[models.m\u{1b}]0;x\u{7}] must be a string",
        ),
    ] {
        let config = TestConfig::new(body);
        let output = config.process(&[], HISTORY);
        assert_eq!(output.status.code(), Some(3), "{body}: {}", describe(&output));
        let stderr = stderr_of(&output);
        assert_eq!(stderr.lines().count(), 1, "{body}: {stderr}");
        assert_one_line_each(&stderr);
        assert!(stderr.contains(expected), "{body}: {stderr}");
    }

    // agentctl echoes its arguments the same way.
    let config = TestConfig::new("");
    for args in [
        &["history-chain-add", "a\nb\u{1b}[31m"][..],
        &["history-maxctx", "1\n\u{1b}[2J"],
    ] {
        let output = run(agentctl(&config.path, args), "", Stdio::piped());
        assert_eq!(output.status.code(), Some(1), "{args:?}: {}", describe(&output));
        let stderr = stderr_of(&output);
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert_one_line_each(&stderr);
        assert!(stderr.contains(r"\u{1b}"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_plugin_error_panic_log_or_refusal_with_a_newline_stays_one_line() {
    let words = r"first line\nsecond line \u{1b}[31mred";
    for (mode, on_error, status) in [
        ("error", "fail", 4),
        ("panic", "fail", 4),
        ("error", "skip", 0),
        ("log", "fail", 0),
        ("config", "fail", 3),
    ] {
        let (config, _dir) = fixture_config(
            "multiline",
            r#"["default", "multiline"]"#,
            on_error,
            &format!("[plugin.multiline]\nmode = \"{mode}\"\n"),
        );
        let output = run(host(&config.path, &[], Some("warn")), HISTORY, Stdio::piped());
        let what = format!("mode {mode}, {on_error}");
        assert_eq!(
            output.status.code(),
            Some(status),
            "{what}: {}",
            describe(&output)
        );
        let stderr = stderr_of(&output);
        assert_one_line_each(&stderr);
        assert_eq!(stderr.lines().count(), 1, "{what}: {stderr}");
        assert!(stderr.contains(words), "{what}: {stderr}");
        if status == 0 {
            assert_eq!(json(&String::from_utf8_lossy(&output.stdout)), json(HISTORY));
        }
    }
}

// 5. Echoes are cut.

#[test]
fn a_huge_value_gives_a_short_line() {
    let config = TestConfig::new("");
    let huge = "r".repeat(5 << 20);
    for input in [
        format!(r#"[{{"role":"{huge}","content":"x"}}]"#),
        format!(r#"{{"turn":"{huge}","messages":[]}}"#),
        format!(r#"[{{"role":"user","metadata":{{"expiration":{{"mode":"{huge}"}}}}}}]"#),
    ] {
        let output = config.process(&[], &input);
        assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
        let stderr = stderr_of(&output);
        assert!(stderr.len() < 300, "{} bytes: {}…", stderr.len(), &stderr[..300]);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("rrrr…\""), "{stderr}");
    }
}

// 6. Usage errors have their own status.

#[test]
fn usage_errors_exit_64_and_help_exits_0() {
    let config = TestConfig::new("");
    for mut command in [
        host(&config.path, &["--no-such-flag"], None),
        agentctl(&config.path, &["--no-such-flag", "history-list"]),
        agentctl(&config.path, &["no-such-command"]),
        Command::new(host_bin()),
    ] {
        command.env_remove("HISTORY_LOG");
        let output = run(command, "", Stdio::piped());
        assert_eq!(output.status.code(), Some(USAGE), "{}", describe(&output));
        assert!(output.stdout.is_empty(), "{}", describe(&output));
        assert!(!output.stderr.is_empty(), "{}", describe(&output));
    }
    for (bin, arg) in [
        (host_bin(), "--help"),
        (host_bin(), "--version"),
        (agentctl_bin(), "--help"),
        (agentctl_bin(), "--version"),
    ] {
        let mut command = Command::new(&bin);
        command.arg(arg);
        let output = run(command, "", Stdio::piped());
        assert_eq!(output.status.code(), Some(0), "{arg}: {}", describe(&output));
        assert!(!output.stdout.is_empty(), "{arg}: {}", describe(&output));
        assert!(output.stderr.is_empty(), "{arg}: {}", describe(&output));
    }
}

// 7. A refused library in the chain is one line.

#[test]
fn a_refused_library_in_the_chain_is_one_line() {
    let library = plugin_built_against_changed_api(ApiChange::Layout);
    let dir = plugin_dir_with(&[&library]);
    let config = TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"changed_layout\"]\n",
        dir.path().display().to_string()
    ));
    let output = run(host(&config.path, &[], None), HISTORY, Stdio::piped());
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    assert!(output.stdout.is_empty());
    let stderr = stderr_of(&output);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("\"changed_layout\" in the chain cannot be loaded: refused plugin library"),
        "{stderr}"
    );
}
