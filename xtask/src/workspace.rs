//! The workspace xtask acts on: found from the current directory at run time, so a copy
//! of the repository is acted on by its own xtask, never by the tree xtask was built in.

use std::path::{Path, PathBuf};
use std::process::Command;

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
}
