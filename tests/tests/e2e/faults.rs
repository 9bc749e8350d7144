//! Fault containment (docs/chain.md#faults, docs/abi.md#loading): a panicking plugin, a plugin that returns an
//! invalid history, and plugins built against another `plugin-api` — each a real library
//! built by the test, loaded by the real host.

use e2e_tests::fixtures::{
    changed_api_version, fixture_library, plugin_built_against_changed_api, plugin_dir_with, ApiChange,
};
use e2e_tests::{agentctl, describe, json, TestConfig};
use history_engine::{host_api_version, plugin_stem};

const HISTORY: &str = r#"[{"role":"system","content":"s"},{"role":"user","content":"task"},
    {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"search","arguments":"{}"}}]},
    {"role":"tool","tool_call_id":"c1","content":"found"},
    {"role":"assistant","content":"done"}]"#;

fn config(chain: &str, on_error: &str, dir: &std::path::Path) -> TestConfig {
    TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = {chain}\non_plugin_error = \"{on_error}\"\n",
        dir.display().to_string()
    ))
}

#[test]
fn a_panicking_plugin_is_skipped_and_the_history_passed_on() {
    let dir = plugin_dir_with(&[&fixture_library("panicker")]);
    let config = config(r#"["default", "panicker"]"#, "skip", dir.path());
    let output = config.process(&["--explain"], HISTORY);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(json(&String::from_utf8_lossy(&output.stdout)), json(HISTORY));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("plugin \"panicker\" skipped"), "{stderr}");
    assert!(stderr.contains("fixture panic with 5 messages"), "{stderr}");
    assert!(
        !stderr.contains("stack backtrace") && !stderr.contains("RUST_BACKTRACE"),
        "{stderr}"
    );
}

#[test]
fn a_panicking_plugin_fails_the_turn_under_fail_with_its_message() {
    let dir = plugin_dir_with(&[&fixture_library("panicker")]);
    let config = config(r#"["default", "panicker"]"#, "fail", dir.path());
    let output = config.process(&[], HISTORY);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr.lines().last().unwrap();
    assert!(
        last.starts_with("history-host: plugin \"panicker\" failed: panicked at"),
        "{stderr}"
    );
    assert!(last.contains("fixture panic with 5 messages"), "{stderr}");

    // In-process too: the host keeps running after the plugin panicked.
    let run = config.run("default", HISTORY, None);
    assert_eq!(run.unwrap_err().plugin, "panicker");
    let again = config.run("default", HISTORY, None);
    assert!(again.is_err(), "the host still serves calls after a plugin panic");
}

#[test]
fn an_invalid_output_is_named_by_the_check() {
    let dir = plugin_dir_with(&[&fixture_library("orphan_maker")]);
    let failing = config(r#"["default", "orphan_maker"]"#, "fail", dir.path());
    let failure = failing.run("default", HISTORY, None).unwrap_err();
    assert_eq!(failure.plugin, "orphan_maker");
    assert!(
        failure.message.contains("invalid output")
            && failure.message.contains("tool result \"c1\" answers no call"),
        "{failure}"
    );

    let skipping = config(r#"["default", "orphan_maker"]"#, "skip", dir.path());
    let run = skipping.run("default", HISTORY, None).unwrap();
    assert_eq!(
        e2e_tests::run_json(&run),
        json(HISTORY),
        "skip passes the input on"
    );
    let report = &run.stages[1];
    assert!(
        report.skipped.as_deref().unwrap().contains("answers no call"),
        "{report:?}"
    );
}

/// The one-line refusal of a plugin built against a changed `plugin-api`. Named by
/// nothing, it is never loaded and the rest of the chain runs; in the chain it is a loading
/// error (exit 3) whose one line carries the reason; `agentctl plugins`, which loads every
/// library in a child process, gives the same reason.
fn refusal_line(change: ApiChange) -> String {
    let library = plugin_built_against_changed_api(change);
    let file_name = library.file_name().unwrap().to_string_lossy().to_string();
    let name = plugin_stem(&library).unwrap();
    let dir = plugin_dir_with(&[&library]);
    let unnamed = config(r#"["default"]"#, "fail", dir.path());
    let output = unnamed.process(&[], HISTORY);
    assert!(
        output.status.success(),
        "the rest of the chain still loads: {}",
        describe(&output)
    );
    assert_eq!(json(&String::from_utf8_lossy(&output.stdout)), json(HISTORY));
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(!stderr.contains(&file_name), "never loaded: {stderr}");

    let named = config(&format!(r#"["default", "{name}"]"#), "fail", dir.path());
    let output = named.process(&[], HISTORY);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    let line = stderr.trim_end().to_string();
    assert!(
        line.contains(&format!(
            "\"{name}\" in the chain cannot be loaded: refused plugin library"
        )) && line.contains(&file_name),
        "{line}"
    );

    let listed = agentctl(&unnamed.path, &["plugins", "--json"], &[]);
    assert!(listed.status.success(), "{}", describe(&listed));
    let value = json(&String::from_utf8_lossy(&listed.stdout));
    let entry = value["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["file"].as_str().unwrap().ends_with(&file_name))
        .unwrap_or_else(|| panic!("{value}"))
        .clone();
    assert_eq!(entry["loads"], false, "{entry}");
    assert!(
        line.ends_with(entry["reason"].as_str().unwrap()),
        "{line}\n{entry}"
    );
    line
}

#[test]
fn a_plugin_with_another_layout_is_refused_in_one_line() {
    let line = refusal_line(ApiChange::Layout);
    let version = host_api_version();
    assert!(
        line.contains(&format!("plugin-api {version} (plugin) vs {version} (host)")),
        "{line}"
    );
    assert!(
        line.contains("layout differs") && line.contains("variants"),
        "{line}"
    );
    assert!(line.len() < 400, "one short line, not a layout dump: {line}");
}

#[test]
fn a_plugin_built_against_another_minor_version_is_refused_in_one_line() {
    let line = refusal_line(ApiChange::Version);
    let (plugin, host) = (changed_api_version(ApiChange::Version), host_api_version());
    assert!(
        line.contains(&format!("plugin-api {plugin} (plugin) vs {host} (host)")),
        "{line}"
    );
    assert!(line.contains("minor must match"), "{line}");
}

#[test]
fn a_plugin_built_against_a_newer_patch_is_refused_in_one_line() {
    let line = refusal_line(ApiChange::NewerPatch);
    let (plugin, host) = (changed_api_version(ApiChange::NewerPatch), host_api_version());
    assert!(
        line.contains(&format!("plugin-api {plugin} (plugin) vs {host} (host)")),
        "{line}"
    );
    assert!(line.contains("newer plugin-api"), "{line}");
}

const SECRET_HISTORY: &str =
    r#"[{"role":"user","content":"my key is SECRET"},{"role":"assistant","content":"noted"}]"#;

/// A chain with the redactor fixture (failing when `fail`), the panicker, and
/// `[history] required` set to `required`, under `on_plugin_error = "skip"`.
fn required_config(required: &str, fail: bool, dir: &std::path::Path) -> TestConfig {
    TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"panicker\", \"redactor\"]\non_plugin_error = \"skip\"\n\
         required = {required}\n\n[plugin.redactor]\nfail = {fail}\n",
        dir.display().to_string()
    ))
}

#[test]
fn a_required_plugin_that_fails_fails_the_turn_even_under_skip() {
    let dir = plugin_dir_with(&[&fixture_library("redactor"), &fixture_library("panicker")]);

    // Working: the redactor redacts; the panicker, not required, is skipped.
    let working = required_config(r#"["redactor"]"#, false, dir.path());
    let output = working.process(&[], SECRET_HISTORY);
    assert!(output.status.success(), "{}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("my key is [redacted]") && !stdout.contains("SECRET"),
        "{stdout}"
    );
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("plugin \"panicker\" skipped"),
        "{}",
        describe(&output)
    );

    // Failing: the turn fails (exit 4) and nothing unredacted is written.
    let failing = required_config(r#"["redactor"]"#, true, dir.path());
    let output = failing.process(&[], SECRET_HISTORY);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    assert!(output.stdout.is_empty(), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr.lines().last().unwrap();
    assert!(
        last.starts_with(
            "history-host: plugin \"redactor\" failed: the redaction rules could not be applied"
        ) && last.contains("a required plugin"),
        "{stderr}"
    );
    let failure = failing.run("default", SECRET_HISTORY, None).unwrap_err();
    assert_eq!(failure.plugin, "redactor");

    // Not required: the same fault is skipped and the history passed on as it came.
    let skipped = required_config("[]", true, dir.path());
    let run = skipped.run("default", SECRET_HISTORY, None).unwrap();
    assert_eq!(e2e_tests::run_json(&run), json(SECRET_HISTORY));
    assert!(run.stages[2].skipped.is_some(), "{:?}", run.stages[2]);
}

#[test]
fn a_required_name_must_be_in_the_chain_or_the_view() {
    let dir = plugin_dir_with(&[&fixture_library("redactor"), &fixture_library("panicker")]);
    let config = TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = [\"default\"]\nrequired = [\"redactor\"]\n",
        dir.path().display().to_string()
    ));
    let output = config.process(&[], SECRET_HISTORY);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(":4: plugin \"redactor\" in `required` is in neither the chain nor the view"),
        "{stderr}"
    );
}

/// A summary (docs/chain.md#the-output-check) passes the check when its `summary_of`
/// names exactly input messages it replaced; a forged one — naming a message still in the
/// output, or one that was never in the input — is refused end to end.
#[test]
fn a_forged_summary_is_refused_and_an_honest_one_accepted() {
    let dir = plugin_dir_with(&[&fixture_library("summary_forger")]);
    let with = |forge: &str| {
        TestConfig::new(&format!(
            "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"summary_forger\"]\non_plugin_error = \"fail\"\n\
             [plugin.summary_forger]\nforge = \"{forge}\"\n",
            dir.path().display().to_string()
        ))
    };
    let history = r#"[{"role":"user","content":"task","metadata":{"id":"m1"}},
        {"role":"assistant","content":"ok","metadata":{"id":"m2"}},
        {"role":"user","content":"more","metadata":{"id":"m3"}},
        {"role":"assistant","content":"done","metadata":{"id":"m4"}}]"#;
    let run = with("none").run("default", history, None).unwrap();
    let out = e2e_tests::run_json(&run);
    assert_eq!(out[0]["metadata"]["summary_of"], serde_json::json!(["m1", "m2"]));
    assert_eq!(out.as_array().unwrap().len(), 3);

    let kept = with("kept").run("default", history, None).unwrap_err();
    assert!(
        kept.message
            .contains("a summary of \"m4\", which is still in the output"),
        "{kept}"
    );
    let unknown = with("unknown").run("default", history, None).unwrap_err();
    assert!(
        unknown
            .message
            .contains("a summary of \"no-such-message\", which is not an input message"),
        "{unknown}"
    );
    // Through the binary: the turn fails with status 4 and one line naming the plugin.
    let output = with("kept").process(&[], history);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    assert!(String::from_utf8_lossy(&output.stderr).contains("summary_forger"));
}
