//! The one build-and-install pipeline of `build`, `test` and `bench`: build the plugin
//! crates (and the other packages a task needs) in a profile, then make the install
//! folder hold the plugin libraries this build produced, and none that an earlier build
//! installed and this one did not.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use plugin_api::naming::{library_file_name, plugin_stem};

use crate::workspace::{cargo, Plugin};
use crate::{run, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    Dev,
    Release,
}

impl Profile {
    /// The name in `[profile.NAME]` and `CARGO_PROFILE_NAME_*`.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Dev => "dev",
            Profile::Release => "release",
        }
    }

    /// The folder of the target directory cargo builds this profile into.
    pub fn output_dir(self) -> &'static str {
        match self {
            Profile::Dev => "debug",
            Profile::Release => "release",
        }
    }
}

/// One build and install.
pub struct Install<'a> {
    /// The workspace root (where cargo runs).
    pub root: &'a Path,
    pub target_dir: &'a Path,
    pub profile: Profile,
    /// Built beside the plugins, not installed: binaries, the bench.
    pub packages: &'a [String],
    /// Built and installed.
    pub plugins: &'a [Plugin],
    /// Where the plugin libraries go.
    pub dir: &'a Path,
}

impl Install<'_> {
    /// Builds the packages and the plugins, then installs the plugins (removing every
    /// plugin library in the install folder this build did not produce).
    pub fn run(&self) -> Result<Vec<PathBuf>> {
        refuse_panic_abort(self.root, self.profile)?;
        let mut command = cargo();
        command.current_dir(self.root).arg("build");
        if self.profile == Profile::Release {
            command.arg("--release");
        }
        let plugin_packages = self.plugins.iter().map(|p| &p.package);
        for package in self.packages.iter().chain(plugin_packages) {
            command.args(["--package", package]);
        }
        run(&mut command)?;
        let built = self.target_dir.join(self.profile.output_dir());
        let names: Vec<&str> = self.plugins.iter().map(|p| p.name.as_str()).collect();
        install_plugins(&built, &names, self.dir)
    }
}

/// The file of an install folder that lists the libraries xtask installed there, one file
/// name a line: what a later install may remove. Hidden, so discovery never lists it.
pub const MANIFEST: &str = ".xtask-installed";

/// Makes `dir` hold the libraries of the plugins `names`, copied from `built`: first
/// removes the libraries an earlier install put there ([`MANIFEST`]) that this build did
/// not produce (a renamed or deleted plugin crate's old library would otherwise still
/// load, and two libraries exporting one name make every host command fail), then
/// installs each with [`install_library`] and records them. A library xtask did not
/// install — `agentctl install` puts out-of-tree plugins in the same `plugin_dir` — is
/// never removed.
pub fn install_plugins(built: &Path, names: &[&str], dir: &Path) -> Result<Vec<PathBuf>> {
    // Every library is there before anything in `dir` changes.
    let libraries: Vec<PathBuf> = names
        .iter()
        .map(|name| built.join(library_file_name(name)))
        .collect();
    if let Some(missing) = libraries.iter().find(|library| !library.is_file()) {
        return Err(format!("the build did not produce {}", missing.display()));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let earlier = read_manifest(dir)?;
    for stale in stale_files(dir, names, &earlier)? {
        std::fs::remove_file(&stale).map_err(|e| format!("cannot remove {}: {e}", stale.display()))?;
        eprintln!("removed stale {}", stale.display());
    }
    let mut installed = Vec::new();
    for library in &libraries {
        let destination = install_library(library, dir)?;
        eprintln!("installed {}", destination.display());
        installed.push(destination);
    }
    write_manifest(dir, names)?;
    Ok(installed)
}

/// The library file names the last install recorded in `dir` (none when it has no
/// manifest: a folder xtask never installed into, or one from before the manifest).
fn read_manifest(dir: &Path) -> Result<HashSet<String>> {
    let path = dir.join(MANIFEST);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text
            .lines()
            .map(str::trim)
            .filter(|line| plugin_stem(Path::new(line)).is_some())
            .map(str::to_string)
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(HashSet::new()),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Records the libraries of `names` as xtask's, through a temporary file and a rename.
fn write_manifest(dir: &Path, names: &[&str]) -> Result<()> {
    let mut files: Vec<String> = names.iter().map(|name| library_file_name(name)).collect();
    files.sort();
    let text: String = files.iter().map(|file| format!("{file}\n")).collect();
    let path = dir.join(MANIFEST);
    let temporary = dir.join(format!("{MANIFEST}.tmp"));
    std::fs::write(&temporary, text)
        .and_then(|()| std::fs::rename(&temporary, &path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The libraries in `dir` that an earlier install put there (`earlier`) and `names` no
/// longer has, and the temporary files of xtask's interrupted installs.
fn stale_files(dir: &Path, names: &[&str], earlier: &HashSet<String>) -> Result<Vec<PathBuf>> {
    let keep: HashSet<&str> = names.iter().copied().collect();
    let ours =
        |file: &str| earlier.contains(file) || plugin_stem(Path::new(file)).is_some_and(|n| keep.contains(n));
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut stale = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
            .path();
        let file = path.file_name().and_then(|f| f.to_str()).unwrap_or_default();
        let is_stale = match plugin_stem(&path) {
            Some(name) => earlier.contains(file) && !keep.contains(name),
            None => temporary_of(&path)
                .is_some_and(|library| plugin_stem(Path::new(library)).is_some() && ours(library)),
        };
        if is_stale {
            stale.push(path);
        }
    }
    stale.sort();
    Ok(stale)
}

/// `.LIBRARY.installing` (a copy [`install_library`] had not renamed yet) → `LIBRARY`.
fn temporary_of(path: &Path) -> Option<&str> {
    path.file_name()?
        .to_str()?
        .strip_prefix('.')?
        .strip_suffix(".installing")
}

/// Copies a library into `dir` under a temporary name, then renames it into place: a
/// process that has the old file loaded keeps its mapping (overwriting a loaded library
/// in place crashes that process).
pub fn install_library(library: &Path, dir: &Path) -> Result<PathBuf> {
    let file_name = library.file_name().ok_or("library without a file name")?;
    let destination = dir.join(file_name);
    let temporary = dir.join(format!(".{}.installing", file_name.to_string_lossy()));
    std::fs::copy(library, &temporary).map_err(|e| {
        format!(
            "cannot copy {} to {}: {e}",
            library.display(),
            temporary.display()
        )
    })?;
    std::fs::rename(&temporary, &destination)
        .map_err(|e| format!("cannot install {}: {e}", destination.display()))?;
    Ok(destination)
}

/// Refuses `panic = "abort"` for the profile, set in the environment, the workspace's
/// Cargo.toml or its `.cargo/config.toml`: a plugin's panic must unwind to the export
/// macro's `catch_unwind`, or it takes the whole host process down.
pub fn refuse_panic_abort(root: &Path, profile: Profile) -> Result<()> {
    let profile = profile.name();
    let env_key = format!("CARGO_PROFILE_{}_PANIC", profile.to_uppercase());
    if std::env::var(&env_key).is_ok_and(|v| v == "abort") {
        return Err(format!(
            "{env_key}=abort: plugins must be built with panic = \"unwind\""
        ));
    }
    for file in [root.join("Cargo.toml"), root.join(".cargo/config.toml")] {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let document: toml_edit::DocumentMut =
            text.parse().map_err(|e| format!("{}: {e}", file.display()))?;
        let panic = document
            .get("profile")
            .and_then(|p| p.get(profile))
            .and_then(|p| p.get("panic"))
            .and_then(|p| p.as_str());
        if panic == Some("abort") {
            return Err(format!(
                "{} sets panic = \"abort\" in [profile.{profile}]: refusing to build plugins that way — \
                 a panicking plugin would take the host down instead of becoming an error; use panic = \"unwind\"",
                file.display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path, contents: &str) {
        std::fs::write(path, contents).unwrap();
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn installing_removes_the_libraries_an_earlier_install_put_there_and_no_other() {
        let temp = tempfile::tempdir().unwrap();
        let built = temp.path().join("debug");
        let dir = temp.path().join("plugins");
        std::fs::create_dir_all(&built).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["default", "old_name"] {
            touch(
                &built.join(library_file_name(name)),
                &format!("first build {name}"),
            );
        }
        install_plugins(&built, &["default", "old_name"], &dir).unwrap();
        // Since then: `agentctl install` put an out-of-tree plugin beside them, the crate
        // old_name was renamed new_name, a copy of default was interrupted, one of the
        // out-of-tree plugin too.
        let outside = library_file_name("out_of_tree");
        touch(&dir.join(&outside), "installed by agentctl");
        touch(
            &dir.join(format!(".{outside}.installing")),
            "agentctl's, half copied",
        );
        let old = library_file_name("old_name");
        touch(
            &dir.join(format!(".{}.installing", library_file_name("default"))),
            "half copied",
        );
        std::fs::remove_file(built.join(&old)).unwrap();
        for name in ["default", "new_name"] {
            touch(&built.join(library_file_name(name)), &format!("built {name}"));
        }
        // Files that are not plugin libraries are not this pipeline's to remove.
        touch(&dir.join("README"), "");
        touch(&dir.join(format!("{old}.bak")), "");

        let installed = install_plugins(&built, &["default", "new_name"], &dir).unwrap();

        assert_eq!(
            installed,
            [
                dir.join(library_file_name("default")),
                dir.join(library_file_name("new_name"))
            ]
        );
        assert!(!dir.join(&old).exists(), "the stale library is removed");
        let mut expected = vec![
            MANIFEST.to_string(),
            library_file_name("default"),
            library_file_name("new_name"),
            outside.clone(),
            format!(".{outside}.installing"),
            "README".to_string(),
            format!("{old}.bak"),
        ];
        expected.sort();
        assert_eq!(files(&dir), expected);
        assert_eq!(
            std::fs::read_to_string(dir.join(&outside)).unwrap(),
            "installed by agentctl",
            "what xtask did not install is kept"
        );
        for name in ["default", "new_name"] {
            let text = std::fs::read_to_string(dir.join(library_file_name(name))).unwrap();
            assert_eq!(
                text,
                format!("built {name}"),
                "the installed library is this build's"
            );
        }
        assert_eq!(
            std::fs::read_to_string(dir.join(MANIFEST)).unwrap(),
            format!(
                "{}\n{}\n",
                library_file_name("default"),
                library_file_name("new_name")
            )
        );
    }

    #[test]
    fn a_folder_without_a_manifest_loses_nothing() {
        let temp = tempfile::tempdir().unwrap();
        let built = temp.path().join("debug");
        let dir = temp.path().join("plugins");
        std::fs::create_dir_all(&built).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        touch(&built.join(library_file_name("default")), "built");
        touch(&dir.join(library_file_name("mine")), "put here by hand");
        install_plugins(&built, &["default"], &dir).unwrap();
        assert_eq!(
            files(&dir),
            [
                MANIFEST.to_string(),
                library_file_name("default"),
                library_file_name("mine")
            ]
        );
    }

    #[test]
    fn installing_creates_the_folder() {
        let temp = tempfile::tempdir().unwrap();
        let built = temp.path().join("release");
        std::fs::create_dir_all(&built).unwrap();
        touch(&built.join(library_file_name("floor")), "floor");
        let dir = temp.path().join("target/bench-plugins");
        install_plugins(&built, &["floor"], &dir).unwrap();
        assert_eq!(files(&dir), [MANIFEST.to_string(), library_file_name("floor")]);
    }

    #[test]
    fn a_missing_library_changes_nothing_in_the_install_folder() {
        let temp = tempfile::tempdir().unwrap();
        let built = temp.path().join("debug");
        let dir = temp.path().join("plugins");
        std::fs::create_dir_all(&built).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        touch(&dir.join(library_file_name("old_name")), "installed earlier");
        let error = install_plugins(&built, &["default"], &dir).unwrap_err();
        assert!(error.contains("did not produce"), "{error}");
        assert_eq!(files(&dir), [library_file_name("old_name")]);
    }

    #[test]
    fn panic_abort_in_the_workspace_manifest_is_refused() {
        let temp = tempfile::tempdir().unwrap();
        touch(
            &temp.path().join("Cargo.toml"),
            "[workspace]\nmembers = []\n\n[profile.release]\npanic = \"abort\"\n",
        );
        let error = refuse_panic_abort(temp.path(), Profile::Release).unwrap_err();
        assert!(error.contains("use panic = \"unwind\""), "{error}");
        // The test process might have CARGO_PROFILE_DEV_PANIC set by whoever runs it.
        if std::env::var_os("CARGO_PROFILE_DEV_PANIC").is_none() {
            refuse_panic_abort(temp.path(), Profile::Dev).unwrap();
        }
    }
}
