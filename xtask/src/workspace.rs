//! The workspace xtask acts on: found from the current directory at run time, so a copy
//! of the repository is acted on by its own xtask, never by the tree xtask was built in.

use std::path::{Path, PathBuf};
use std::process::Command;

use plugin_api::naming::STEM_PREFIX;

use crate::Result;

/// The package that is this program: the mark of the workspace it belongs to.
pub const XTASK_PACKAGE: &str = "xtask";

/// The workspace root: the nearest folder at or above `start` whose `Cargo.toml` has a
/// `[workspace]` table listing `xtask` among its members. Nested workspaces that do not
/// (a standalone plugin crate scaffolded inside the tree) are walked past.
pub fn find_root(start: &Path) -> Result<PathBuf> {
    for dir in start.ancestors() {
        let manifest = dir.join("Cargo.toml");
        // A folder without a readable, well-formed Cargo.toml is walked past.
        let Some(document) = std::fs::read_to_string(&manifest)
            .ok()
            .and_then(|text| text.parse::<toml_edit::DocumentMut>().ok())
        else {
            continue;
        };
        let has_xtask = document
            .get("workspace")
            .and_then(|w| w.get("members"))
            .and_then(|m| m.as_array())
            .is_some_and(|members| members.iter().any(|m| m.as_str() == Some(XTASK_PACKAGE)));
        if has_xtask {
            return Ok(dir.to_path_buf());
        }
    }
    Err(format!(
        "no Cargo.toml with a [workspace] that has an `{XTASK_PACKAGE}` member in {} or above: \
         run cargo xtask inside the workspace",
        start.display()
    ))
}

/// The workspace of the current directory.
pub fn current_root() -> Result<PathBuf> {
    let dir = std::env::current_dir().map_err(|e| format!("cannot read the current directory: {e}"))?;
    find_root(&dir)
}

/// The workspace's plugin crates and binaries, and where cargo builds them.
#[derive(Debug)]
pub struct Metadata {
    /// `target/` unless `CARGO_TARGET_DIR` or cargo's configuration says otherwise.
    pub target_dir: PathBuf,
    pub packages: Vec<Package>,
}

#[derive(Debug)]
pub struct Package {
    pub name: String,
    /// Whether it has a `bin` target.
    pub has_bin: bool,
    /// For a plugin crate (a `cdylib` target named `history_plugin_NAME`): NAME.
    pub plugin: Option<String>,
}

/// A plugin crate of the workspace: its package and the plugin name its library has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plugin {
    pub package: String,
    pub name: String,
}

impl Metadata {
    /// `cargo metadata` of the workspace at `root`.
    pub fn load(root: &Path) -> Result<Metadata> {
        let output = cargo()
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .current_dir(root)
            .output()
            .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "cargo metadata failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let json: serde_json::Value =
            serde_json::from_slice(&output.stdout).map_err(|e| format!("cargo metadata: {e}"))?;
        Metadata::from_json(&json)
    }

    pub fn from_json(metadata: &serde_json::Value) -> Result<Metadata> {
        let target_dir = metadata["target_directory"]
            .as_str()
            .ok_or("cargo metadata has no target_directory")?;
        let mut packages = Vec::new();
        for package in metadata["packages"].as_array().into_iter().flatten() {
            let targets = package["targets"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default();
            let has_kind = |target: &serde_json::Value, kind: &str| {
                target["kind"].as_array().into_iter().flatten().any(|k| k == kind)
            };
            // The library's file is named after its target (not its package).
            let plugin = targets
                .iter()
                .filter(|t| has_kind(t, "cdylib"))
                .filter_map(|t| t["name"].as_str()?.strip_prefix(STEM_PREFIX))
                .find(|name| !name.is_empty())
                .map(str::to_string);
            packages.push(Package {
                name: package["name"].as_str().unwrap_or_default().to_string(),
                has_bin: targets.iter().any(|t| has_kind(t, "bin")),
                plugin,
            });
        }
        packages.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Metadata {
            target_dir: PathBuf::from(target_dir),
            packages,
        })
    }

    /// The plugin crates, but those in `except` (packages).
    pub fn plugins(&self, except: &[&str]) -> Vec<Plugin> {
        self.packages
            .iter()
            .filter(|p| !except.contains(&p.name.as_str()))
            .filter_map(|p| {
                Some(Plugin {
                    package: p.name.clone(),
                    name: p.plugin.clone()?,
                })
            })
            .collect()
    }

    /// The packages with a binary, but those in `except`.
    pub fn binaries(&self, except: &[&str]) -> Vec<String> {
        self.packages
            .iter()
            .filter(|p| p.has_bin && !except.contains(&p.name.as_str()))
            .map(|p| p.name.clone())
            .collect()
    }
}

/// `cargo` as cargo ran us (`$CARGO`), else the one on `PATH`.
pub fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn the_root_is_found_from_the_start_folder_not_from_where_xtask_was_built() {
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path().join("copy");
        write(
            &root.join("Cargo.toml"),
            "[workspace]\nmembers = [\"plugin-api\", \"xtask\"]\n",
        );
        let deep = root.join("plugins/default/src");
        std::fs::create_dir_all(&deep).unwrap();
        // A member's own Cargo.toml (no [workspace]) is walked past.
        write(
            &root.join("plugins/default/Cargo.toml"),
            "[package]\nname = \"p\"\n",
        );

        assert_eq!(find_root(&root).unwrap(), root);
        assert_eq!(find_root(&deep).unwrap(), root);
        let compiled_in = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        assert_ne!(find_root(&deep).unwrap(), compiled_in);
    }

    #[test]
    fn a_nested_workspace_without_xtask_is_walked_past() {
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path();
        write(&root.join("Cargo.toml"), "[workspace]\nmembers = [\"xtask\"]\n");
        // A standalone plugin crate scaffolded inside the tree has a [workspace] of its own.
        let standalone = root.join("scratch/probe");
        write(
            &standalone.join("Cargo.toml"),
            "[package]\nname = \"history_plugin_probe\"\n\n[workspace]\n",
        );
        assert_eq!(find_root(&standalone.join("src")).unwrap(), root);
    }

    #[test]
    fn no_workspace_above_the_start_folder_is_an_error() {
        let temp = tempfile::tempdir().unwrap();
        let error = find_root(temp.path()).unwrap_err();
        assert!(error.contains("run cargo xtask inside the workspace"), "{error}");
    }

    #[test]
    fn plugins_and_binaries_are_read_from_cargo_metadata() {
        let target = |name: &str, kinds: &[&str]| serde_json::json!({ "name": name, "kind": kinds });
        let metadata = serde_json::json!({
            "target_directory": "/somewhere/target",
            "packages": [
                { "name": "history-host", "targets": [target("history_host", &["lib"]), target("history-host", &["bin"])] },
                { "name": "xtask", "targets": [target("xtask", &["bin"])] },
                { "name": "history_plugin_b", "targets": [target("history_plugin_b", &["cdylib", "rlib"])] },
                { "name": "history-plugin-a", "targets": [target("history_plugin_a", &["cdylib", "rlib"])] },
                { "name": "history_plugin_floor", "targets": [target("history_plugin_floor", &["cdylib"])] },
                { "name": "plugin-api", "targets": [target("plugin_api", &["lib"])] },
                { "name": "other-cdylib", "targets": [target("other", &["cdylib"])] },
                { "name": "history_plugin_rlib_only", "targets": [target("history_plugin_rlib_only", &["lib"])] },
            ]
        });
        let metadata = Metadata::from_json(&metadata).unwrap();
        assert_eq!(metadata.target_dir, Path::new("/somewhere/target"));
        let plugin = |package: &str, name: &str| Plugin {
            package: package.into(),
            name: name.into(),
        };
        assert_eq!(
            metadata.plugins(&["history_plugin_floor"]),
            [plugin("history-plugin-a", "a"), plugin("history_plugin_b", "b")]
        );
        assert_eq!(metadata.plugins(&[]).len(), 3);
        assert_eq!(metadata.binaries(&["xtask"]), ["history-host"]);
    }
}
