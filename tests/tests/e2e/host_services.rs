//! The services the host offers plugins through their context, seen from real plugin
//! libraries loaded by the real host, and the growth of the ABI: a plugin built against
//! the previous `plugin-api` release (`tests/fixtures/plugin-api-0.2.0`, a snapshot) loads
//! and runs in this host beside the current plugins, with the services that release had.

use e2e_tests::fixtures::{fixture_library, plugin_dir_with_installed};
use e2e_tests::{describe, json, run_json, TestConfig};
use history_engine::{host_api_version, Catalog};
use history_wire::chat::history_from_str;
use plugin_api::abi_stable::abi_stability::abi_checking::check_layout_compatibility;
use plugin_api::abi_stable::library::lib_header_from_path;
use plugin_api::abi_stable::StableAbi;
use plugin_api::{PluginModRef, Tokenizer};

const HISTORY: &str = r#"[{"role":"system","content":"You are terse."},
    {"role":"user","content":"Find the flights to Lisbon"},
    {"role":"assistant","content":"Three flights leave tomorrow morning."}]"#;

/// A configuration with `chain` over a plugin folder holding every installed plugin and
/// the `fixtures`; a failing plugin fails the turn.
fn config_with(fixtures: &[&str], chain: &str) -> (TestConfig, tempfile::TempDir) {
    let libraries: Vec<_> = fixtures.iter().map(|name| fixture_library(name)).collect();
    let dir = plugin_dir_with_installed(&libraries.iter().map(|l| l.as_path()).collect::<Vec<_>>());
    let config = TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = {chain}\non_plugin_error = \"fail\"\n",
        dir.path().display().to_string()
    ));
    (config, dir)
}

#[test]
fn a_plugin_asking_for_a_summary_gets_the_hosts_answer() {
    let (config, _dir) = config_with(&["summarize_probe"], r#"["default", "summarize_probe"]"#);
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

/// `(minor, patch)` of a `0.y.z` version.
fn minor_patch(version: &str) -> (u64, u64) {
    let parts: Vec<u64> = version.split('.').map(|p| p.parse().unwrap()).collect();
    assert!(
        parts.len() == 3 && parts[0] == 0,
        "not a 0.y.z version: {version}"
    );
    (parts[1], parts[2])
}

#[test]
fn a_plugin_built_against_the_previous_release_loads_and_uses_its_services() {
    let library = fixture_library("previous_api");
    let built_against = lib_header_from_path(&library)
        .unwrap()
        .version_strings()
        .to_string();
    assert_eq!(
        built_against, "0.2.0",
        "the fixture is built against the snapshot"
    );
    let (old, host) = (minor_patch(&built_against), minor_patch(&host_api_version()));
    assert!(
        old.0 == host.0 && old.1 < host.1,
        "the previous release is an older patch of the host's 0.y: {built_against} vs {}",
        host_api_version()
    );

    // abi_stable alone refuses it: the host's `HostServices` has a field (`summarize`) the
    // plugin's copy lacks. The host's check accepts exactly that growth.
    let header = lib_header_from_path(&library).unwrap();
    let (host_layout, plugin_layout) = (<PluginModRef as StableAbi>::LAYOUT, header.layout().unwrap());
    let refused = check_layout_compatibility(host_layout, plugin_layout).unwrap_err();
    assert!(
        refused.to_string().contains("HostServices"),
        "abi_stable refuses it for the services"
    );
    // And for the event kinds: the snapshot predates message-changed and message-summarized.
    assert!(
        refused.to_string().contains("EventKind"),
        "abi_stable refuses it for the event kinds"
    );
    assert!(history_engine::compat::check_layout(host_layout, plugin_layout).is_ok());

    // Old and current plugins in one chain.
    let chain = r#"["default", "previous_api", "summarize_probe", "token_budget"]"#;
    let (config, dir) = config_with(&["previous_api", "summarize_probe"], chain);
    let catalog = Catalog::discover(dir.path()).unwrap();
    assert!(catalog.files().iter().all(|f| f.refusal().is_none()));
    let previous = catalog.library("previous_api").map(|l| l.name.clone());
    assert_eq!(
        previous.ok().as_deref(),
        Some("previous_api"),
        "the older plugin loads"
    );

    let output = config.process(&[], HISTORY);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(json(&String::from_utf8_lossy(&output.stdout)), json(HISTORY));
    let stderr = String::from_utf8_lossy(&output.stderr);
    // It counted through the host's real tokenizer and logged through the host's log.
    let tokens =
        history_engine::tokens::history_tokens(Tokenizer::O200kBase, &history_from_str(HISTORY).unwrap());
    let hello = history_engine::tokens::count_text(Tokenizer::O200kBase, "hello world");
    assert!(
        stderr.contains(&format!(
            "previous_api: 3 messages, {tokens} tokens (o200k_base; \"hello world\" is {hello}) at turn 1"
        )),
        "{stderr}"
    );
    // The current plugin beside it still reaches the newer service.
    assert!(
        stderr.contains("summarize_probe: no summary: no summarizer is configured"),
        "{stderr}"
    );

    // The host library, in process: every stage ran, none was skipped.
    let run = config.run("default", HISTORY, None).unwrap();
    assert_eq!(run_json(&run), json(HISTORY));
    let stages: Vec<&str> = run.stages.iter().map(|s| s.plugin.as_str()).collect();
    assert_eq!(
        stages,
        ["default", "previous_api", "summarize_probe", "token_budget"]
    );
    assert!(run.stages.iter().all(|s| s.skipped.is_none()), "{:?}", run.stages);
}
