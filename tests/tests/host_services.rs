//! The services the host offers plugins through their context, seen from real plugin
//! libraries loaded by the real host.

use e2e_tests::fixtures::{fixture_library, plugin_dir_with_installed};
use e2e_tests::{describe, json, TestConfig};

const HISTORY: &str = r#"[{"role":"system","content":"You are terse."},
    {"role":"user","content":"Find the flights to Lisbon"},
    {"role":"assistant","content":"Three flights leave tomorrow morning."}]"#;

/// A configuration with `chain` over a plugin folder holding every installed plugin and
/// `fixture`; a failing plugin fails the turn.
fn config_with(fixture: &str, chain: &str) -> (TestConfig, tempfile::TempDir) {
    let dir = plugin_dir_with_installed(&[&fixture_library(fixture)]);
    let config = TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = {chain}\non_plugin_error = \"fail\"\n",
        dir.path().display().to_string()
    ));
    (config, dir)
}

#[test]
fn a_plugin_asking_for_a_summary_gets_the_hosts_answer() {
    let (config, _dir) = config_with("summarize_probe", r#"["default", "summarize_probe"]"#);
    let output = config.process(&[], HISTORY);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(json(&String::from_utf8_lossy(&output.stdout)), json(HISTORY));
    let stderr = String::from_utf8_lossy(&output.stderr);
    // A host without a summarizer says so; the plugin falls back (here: logs and passes on).
    assert!(
        stderr.contains(
            "summarize_probe: no summary: no summarizer is configured ([summarizer] in plugins-enabled.toml)"
        ),
        "{stderr}"
    );
}
