//! Fixture plugins built by the tests: the plugins of `tests/fixtures/` (fault containment,
//! host services) and plugins built against a *changed* `plugin-api` (another layout,
//! another version).
//! They build into `target/fixtures`, their own target folder, so a test can run cargo
//! while the outer `cargo test` holds the main one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use history_engine::library_file_name;

use crate::{plugin_dir, target_dir, workspace_root};

/// The fixtures' target folder.
pub fn fixture_target() -> PathBuf {
    target_dir().join("fixtures")
}

/// Runs `cargo build` (or `cargo ARGS`) on a manifest into the fixtures' target folder.
pub fn cargo_in_fixture_target(manifest: &Path, args: &[&str]) {
    // Start from the workspace's lock file: the same dependency versions, already
    // downloaded and compiled, and no registry look-up.
    let lock = manifest.with_file_name("Cargo.lock");
    if !lock.exists() {
        std::fs::copy(workspace_root().join("Cargo.lock"), &lock).unwrap();
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(args)
        .arg("--manifest-path")
        .arg(manifest)
        .arg("--target-dir")
        .arg(fixture_target())
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo {args:?} {} failed:\n{}",
        manifest.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Builds `tests/fixtures` once per test process; returns the built library of plugin `name`.
pub fn fixture_library(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        cargo_in_fixture_target(&workspace_root().join("tests/fixtures/Cargo.toml"), &["build"]);
    });
    let path = fixture_target().join("debug").join(library_file_name(name));
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// How a copy of `plugin-api` differs from the real one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiChange {
    /// Same version, one more variant in an ABI enum (`LogLevel`).
    Layout,
    /// The next `0.y` (0.y+1.0), same layout.
    Version,
    /// The next patch of the same `0.y`, same layout: newer than the host's.
    NewerPatch,
}

/// The `plugin-api` version a copy changed by `change` claims.
pub fn changed_api_version(change: ApiChange) -> String {
    let current = history_engine::host_api_version();
    let parts: Vec<u64> = current.split('.').map(|p| p.parse().unwrap()).collect();
    let [major, minor, patch] = parts[..] else {
        panic!("plugin-api version {current} is not x.y.z")
    };
    assert_eq!(major, 0, "the fixtures assume a 0.y plugin-api");
    match change {
        ApiChange::Layout => current,
        ApiChange::Version => format!("0.{}.0", minor + 1),
        ApiChange::NewerPatch => format!("0.{minor}.{}", patch + 1),
    }
}

/// Builds a plugin named `changed_<kind>` against a changed copy of `plugin-api`.
pub fn plugin_built_against_changed_api(change: ApiChange) -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let kind = match change {
        ApiChange::Layout => "layout",
        ApiChange::Version => "version",
        ApiChange::NewerPatch => "newer_patch",
    };
    let root = fixture_target().join(format!("changed-api-{kind}"));
    let api = root.join("plugin-api");
    copy_dir(&workspace_root().join("plugin-api"), &api);
    match change {
        ApiChange::Layout => patch(
            &api.join("src/context.rs"),
            "    Debug,\n}",
            "    Debug,\n    Trace,\n}",
        ),
        ApiChange::Version | ApiChange::NewerPatch => patch(
            &api.join("Cargo.toml"),
            &format!("version = \"{}\"", history_engine::host_api_version()),
            &format!("version = \"{}\"", changed_api_version(change)),
        ),
    }
    // The copy is a standalone package: give it concrete values for workspace keys.
    patch(
        &api.join("Cargo.toml"),
        "edition.workspace = true",
        "edition = \"2021\"",
    );
    patch(
        &api.join("Cargo.toml"),
        "license.workspace = true",
        "license = \"MIT\"",
    );
    patch(
        &api.join("Cargo.toml"),
        "abi_stable.workspace = true",
        "abi_stable = \"0.11\"",
    );
    patch(
        &api.join("Cargo.toml"),
        "serde_json.workspace = true",
        "serde_json = { version = \"1\", features = [\"preserve_order\"] }",
    );
    patch(
        &api.join("Cargo.toml"),
        "rustc-hash.workspace = true",
        "rustc-hash = \"2\"",
    );
    patch(&api.join("Cargo.toml"), "[lints]\nworkspace = true\n", "");
    // Its tests' dependencies are the workspace's; a plugin build needs none of them.
    patch(
        &api.join("Cargo.toml"),
        "[dev-dependencies]\n# The integration tests build their histories from JSON, as plugin authors do.\nhistory-wire.workspace = true\nplugin-testing.workspace = true\n",
        "",
    );
    let name = format!("changed_{kind}");
    let plugin = root.join("plugin");
    std::fs::create_dir_all(plugin.join("src")).unwrap();
    std::fs::write(
        plugin.join("Cargo.toml"),
        format!(
            "[package]\nname = \"history_plugin_{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
             [lib]\ncrate-type = [\"cdylib\"]\n\n[dependencies]\nplugin-api = {{ path = \"../plugin-api\" }}\n"
        ),
    )
    .unwrap();
    std::fs::write(
        plugin.join("src/lib.rs"),
        format!(
            "use plugin_api::*;\npub struct P;\nimpl HistoryPlugin for P {{\n\
             const NAME: &'static str = \"{name}\";\nconst VERSION: &'static str = \"0.1.0\";\n\
             const SUMMARY: &'static str = \"built against a changed plugin-api\";\n\
             fn new(_: &LoadContext) -> Result<Self, ConfigError> {{ Ok(P) }}\n\
             fn process(&self, h: &[RArc<Message>], _: &Context) -> Result<Output, String> {{ Ok(Output::unchanged(h)) }}\n}}\n\
             plugin_api::export_plugin!(P);\n"
        ),
    )
    .unwrap();
    // Its own workspace, so cargo does not take it for part of the main one.
    std::fs::write(
        root.join("Cargo.toml"),
        "[workspace]\nresolver = \"2\"\nmembers = [\"plugin\", \"plugin-api\"]\n",
    )
    .unwrap();
    cargo_in_fixture_target(&root.join("Cargo.toml"), &["build"]);
    let path = fixture_target().join("debug").join(library_file_name(&name));
    assert!(path.exists(), "{} was not built", path.display());
    path
}

fn patch(file: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(file).unwrap();
    if text.contains(to) && !text.contains(from) {
        return; // already patched by an earlier run
    }
    assert!(
        text.contains(from),
        "{} no longer contains {from:?}: update the fixture",
        file.display()
    );
    std::fs::write(file, text.replacen(from, to, 1)).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            let text = std::fs::read(entry.path()).unwrap();
            // Rewrite only when the source changed, so cargo's incremental build holds.
            if std::fs::read(&target).ok().as_deref() != Some(&text) {
                std::fs::write(&target, text).unwrap();
            }
        }
    }
    // What the source no longer has goes (a module moved into a folder would clash).
    for entry in std::fs::read_dir(to).unwrap() {
        let entry = entry.unwrap();
        if !from.join(entry.file_name()).exists() {
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                std::fs::remove_dir_all(&path).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
        }
    }
}

/// A temporary plugin folder holding the shipped `default` plus `libraries`.
pub fn plugin_dir_with(libraries: &[&Path]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let default = library_file_name("default");
    std::fs::copy(plugin_dir().join(&default), dir.path().join(&default)).unwrap();
    for library in libraries {
        std::fs::copy(library, dir.path().join(library.file_name().unwrap())).unwrap();
    }
    dir
}

/// A temporary plugin folder holding every installed plugin (`target/plugins`) plus
/// `libraries`.
pub fn plugin_dir_with_installed(libraries: &[&Path]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let installed: Vec<PathBuf> = std::fs::read_dir(plugin_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| history_engine::plugin_stem(path).is_some())
        .collect();
    for library in installed
        .iter()
        .map(PathBuf::as_path)
        .chain(libraries.iter().copied())
    {
        std::fs::copy(library, dir.path().join(library.file_name().unwrap())).unwrap();
    }
    dir
}
