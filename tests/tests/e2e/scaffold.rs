//! `cargo xtask new-plugin`: the generated crate builds, passes its own test, installs and
//! runs in a chain — without edits.

use std::process::Command;

use e2e_tests::fixtures::{cargo_in_fixture_target, fixture_target, plugin_dir_with};
use e2e_tests::{describe, json, target_dir, TestConfig};

#[test]
fn a_scaffolded_plugin_builds_loads_and_runs_in_a_chain() {
    let xtask = target_dir()
        .join("debug")
        .join(format!("xtask{}", std::env::consts::EXE_SUFFIX));
    assert!(xtask.exists(), "{} is built by `cargo xtask`", xtask.display());
    let crate_dir = tempfile::tempdir().unwrap();
    let plugin = crate_dir.path().join("scaffolded_probe");
    let output = Command::new(&xtask)
        .args(["new-plugin", "scaffolded_probe", "--dir"])
        .arg(&plugin)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    // The next step it prints is the README's out-of-tree flow.
    let said = String::from_utf8_lossy(&output.stderr);
    let readme = std::fs::read_to_string(e2e_tests::workspace_root().join("README.md")).unwrap();
    for step in [
        "cargo build",
        "agentctl install",
        "target/debug/libhistory_plugin_",
        "agentctl history-chain-add",
    ] {
        assert!(said.contains(step), "the scaffold does not say {step:?}: {said}");
        assert!(readme.contains(step), "the README does not say {step:?}");
    }

    let manifest = plugin.join("Cargo.toml");
    cargo_in_fixture_target(&manifest, &["test", "--quiet"]);
    cargo_in_fixture_target(&manifest, &["build"]);
    let library = fixture_target()
        .join("debug")
        .join(history_engine::library_file_name("scaffolded_probe"));
    let dir = plugin_dir_with(&[&library]);
    let config = TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"scaffolded_probe\"]\non_plugin_error = \"fail\"\n",
        dir.path().display().to_string()
    ));
    let input = r#"[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]"#;
    let output = config.process(&[], input);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(json(&String::from_utf8_lossy(&output.stdout)), json(input));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("scaffolded_probe: 2 messages at turn 1"),
        "its log line reaches the host: {stderr}"
    );
}

#[test]
fn new_plugin_refuses_a_name_that_is_not_an_identifier() {
    let xtask = target_dir()
        .join("debug")
        .join(format!("xtask{}", std::env::consts::EXE_SUFFIX));
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(&xtask)
        .args(["new-plugin", "../evil", "--dir"])
        .arg(dir.path().join("x"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("is not a plugin name"));
}

#[test]
fn panic_abort_is_refused_by_xtask_and_by_the_export_macro() {
    let xtask = target_dir()
        .join("debug")
        .join(format!("xtask{}", std::env::consts::EXE_SUFFIX));
    let output = Command::new(&xtask)
        .arg("build")
        .env("CARGO_PROFILE_DEV_PANIC", "abort")
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("plugins must be built with panic = \"unwind\""));

    // A plugin crate checked with panic = "abort" does not compile: export_plugin! refuses.
    let crate_dir = tempfile::tempdir().unwrap();
    let plugin = crate_dir.path().join("abort_probe");
    let output = Command::new(&xtask)
        .args(["new-plugin", "abort_probe", "--dir"])
        .arg(&plugin)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(["check", "--lib", "--manifest-path"])
        .arg(plugin.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(fixture_target().join("panic-abort"))
        .env("CARGO_PROFILE_DEV_PANIC", "abort")
        .output()
        .unwrap();
    assert!(!output.status.success(), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("history plugins must be built with panic = \"unwind\""),
        "{}",
        describe(&output)
    );
}
