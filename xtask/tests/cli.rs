//! The xtask binary as a subprocess: its usage and exit codes, and that it acts on the
//! workspace it runs in rather than the one it was built in.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn xtask() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn describe(output: &Output) -> String {
    format!(
        "{}\nstdout: {}\nstderr: {}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    )
}

/// The workspace this test (and xtask) was built in.
fn built_in() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn help_prints_the_usage_to_stdout_and_succeeds() {
    for flag in ["--help", "-h", "help"] {
        let output = xtask().arg(flag).output().unwrap();
        assert_eq!(output.status.code(), Some(0), "{flag}: {}", describe(&output));
        let stdout = text(&output.stdout);
        assert!(
            stdout.starts_with("usage: cargo xtask <task>"),
            "{flag}: {stdout}"
        );
        for task in ["build", "test", "new-plugin", "gen-history", "bench"] {
            assert!(
                stdout.contains(&format!("\n  {task} ")),
                "{flag}: {task} in {stdout}"
            );
        }
        assert!(output.stderr.is_empty(), "{flag}: {}", describe(&output));
    }
}

#[test]
fn an_unknown_or_missing_task_prints_the_usage_to_stderr_and_exits_2() {
    for args in [&["frobnicate"][..], &[], &["build", "--relase"], &["new-plugin"]] {
        let output = xtask().args(args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", describe(&output));
        assert!(output.stdout.is_empty(), "{args:?}: {}", describe(&output));
        assert!(
            text(&output.stderr).contains("usage: cargo xtask <task>"),
            "{args:?}: {}",
            describe(&output)
        );
    }
    let output = xtask().arg("frobnicate").output().unwrap();
    assert!(text(&output.stderr).starts_with("xtask: unknown task `frobnicate`"));
}

/// A copy of the workspace's manifest: all `new-plugin` needs of the workspace.
fn copy_of_the_workspace() -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    std::fs::copy(built_in().join("Cargo.toml"), copy.path().join("Cargo.toml")).unwrap();
    std::fs::create_dir_all(copy.path().join("plugins")).unwrap();
    copy
}

#[test]
fn new_plugin_in_a_copy_of_the_workspace_writes_into_the_copy() {
    let copy = copy_of_the_workspace();
    let name = "copy_probe";
    // Run from a subfolder: the root is found by walking up.
    let output = xtask()
        .args(["new-plugin", name])
        .current_dir(copy.path().join("plugins"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));

    let crate_dir = copy.path().join("plugins").join(name);
    assert!(crate_dir.join("Cargo.toml").is_file(), "{}", describe(&output));
    assert!(crate_dir.join("src/lib.rs").is_file());
    let manifest = std::fs::read_to_string(copy.path().join("Cargo.toml")).unwrap();
    assert!(manifest.contains(&format!("\"plugins/{name}\"")), "{manifest}");

    assert!(
        !built_in().join("plugins").join(name).exists(),
        "the original tree is untouched"
    );
    let original = std::fs::read_to_string(built_in().join("Cargo.toml")).unwrap();
    assert!(!original.contains(name));
    assert!(text(&output.stderr).contains("next: cargo xtask build"));
}

#[test]
fn a_standalone_plugin_scaffolded_in_a_copy_depends_on_the_copy_plugin_api() {
    let copy = copy_of_the_workspace();
    let elsewhere = tempfile::tempdir().unwrap();
    let crate_dir = elsewhere.path().join("standalone_probe");
    let output = xtask()
        .args(["new-plugin", "standalone_probe", "--dir"])
        .arg(&crate_dir)
        .current_dir(copy.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).unwrap();
    let api = copy.path().join("plugin-api").display().to_string();
    assert!(manifest.contains(&format!("path = \"{api}\"")), "{manifest}");
    assert!(
        std::fs::read_to_string(copy.path().join("Cargo.toml")).unwrap()
            == std::fs::read_to_string(built_in().join("Cargo.toml")).unwrap(),
        "a standalone crate is no member"
    );
    // The hint says how to build and install a crate `cargo xtask build` does not know:
    // the README's out-of-tree flow (cargo build, agentctl install, history-chain-add).
    let stderr = text(&output.stderr);
    let library = plugin_api::naming::library_file_name("standalone_probe");
    assert!(
        stderr.contains(&format!(
            "cargo build --manifest-path {}",
            crate_dir.join("Cargo.toml").display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "agentctl install {}",
            crate_dir.join("target/debug").join(&library).display()
        )),
        "{stderr}"
    );
}

#[test]
fn outside_any_workspace_a_task_says_where_to_run_it() {
    let nowhere = tempfile::tempdir().unwrap();
    let output = xtask()
        .args(["new-plugin", "lost"])
        .current_dir(nowhere.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(text(&output.stderr).contains("run cargo xtask inside the workspace"));
    assert!(!nowhere.path().join("plugins").exists());
}
