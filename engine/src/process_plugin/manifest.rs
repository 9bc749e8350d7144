//! A process plugin's manifest, `NAME.plugin.toml` in `plugin_dir`
//! (docs/process-plugins.md#the-manifest): the program to run, the protocol it speaks, and
//! the files it is made of (what hot reload fingerprints).

use std::path::{Path, PathBuf};

/// How a manifest's file name ends: `redact.plugin.toml` names plugin `redact`.
pub const MANIFEST_SUFFIX: &str = ".plugin.toml";

/// The protocol versions this host speaks (docs/process-plugins.md#versions).
pub const PROTOCOL: i64 = 1;

/// The plugin a manifest's file name gives, if it is one: `redact.plugin.toml` → `redact`.
pub fn manifest_stem(path: &Path) -> Option<&str> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(MANIFEST_SUFFIX)?;
    let valid = !stem.is_empty()
        && stem
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    valid.then_some(stem)
}

/// A manifest read and checked.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// The plugin's name, from the file name.
    pub name: String,
    /// The manifest's own path.
    pub path: PathBuf,
    /// The program and its arguments; a relative program or argument that names a file
    /// beside the manifest is made absolute (docs/process-plugins.md#the-manifest).
    pub command: Vec<String>,
    /// The files the plugin is made of, absolute: the manifest, the command's arguments
    /// that are files beside it and `files`. What hot reload fingerprints and what
    /// `agentctl install` copies.
    pub files: Vec<PathBuf>,
    /// `description`, what `agentctl plugins` shows.
    pub description: Option<String>,
}

impl Manifest {
    /// Reads and checks the manifest at `path`. The error says what is wrong and where.
    pub fn read(path: &Path) -> Result<Manifest, String> {
        let name = manifest_stem(path)
            .ok_or_else(|| format!("{} is not named NAME.plugin.toml", path.display()))?
            .to_string();
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
        let doc: toml_edit::DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| {
            format!(
                "not valid TOML: {}",
                e.to_string().lines().next().unwrap_or_default()
            )
        })?;
        // Absolute, so the command's files mean the same from any working folder.
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let dir = std::fs::canonicalize(dir).map_err(|e| format!("cannot read its folder: {e}"))?;
        let dir = dir.as_path();
        let path = &dir.join(path.file_name().unwrap_or_default());
        for (key, _) in doc.iter() {
            if !["protocol", "command", "files", "description"].contains(&key) {
                return Err(format!(
                    "unknown key {key:?} (known: protocol, command, files, description)"
                ));
            }
        }
        match doc.get("protocol").and_then(|v| v.as_integer()) {
            Some(PROTOCOL) => {}
            Some(other) => {
                return Err(format!(
                    "protocol = {other}, but this host speaks protocol {PROTOCOL}"
                ))
            }
            None => return Err(format!("protocol must be set to an integer ({PROTOCOL})")),
        }
        let strings = |key: &str| -> Result<Vec<String>, String> {
            let Some(item) = doc.get(key) else {
                return Ok(Vec::new());
            };
            let array = item
                .as_array()
                .ok_or_else(|| format!("{key} must be an array of strings"))?;
            array
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| format!("{key} must be an array of strings"))
        };
        let mut command = strings("command")?;
        if command.is_empty() {
            return Err("command must name a program: command = [\"python3\", \"NAME.py\"]".into());
        }
        let mut files = vec![path.to_path_buf()];
        for (i, arg) in command.iter_mut().enumerate() {
            let beside = dir.join(&*arg);
            // A relative path that names a file beside the manifest is that file; a bare
            // program name (`python3`, `node`) is looked up on PATH as usual.
            if Path::new(arg.as_str()).is_relative() && beside.is_file() && (i > 0 || arg.contains('/')) {
                *arg = beside.to_string_lossy().into_owned();
                files.push(beside);
            }
        }
        for file in strings("files")? {
            let beside = dir.join(&file);
            if Path::new(&file).is_absolute() || file.split('/').any(|c| c == "..") {
                return Err(format!(
                    "files: {file:?} must be a relative path inside plugin_dir"
                ));
            }
            if !beside.is_file() {
                return Err(format!("files: {} does not exist", beside.display()));
            }
            files.push(beside);
        }
        files.sort();
        files.dedup();
        let description = doc
            .get("description")
            .and_then(|v| v.as_str())
            .map(str::to_string);
        Ok(Manifest {
            name,
            path: path.to_path_buf(),
            command,
            files,
            description,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_names_its_plugin_and_makes_its_script_absolute() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("redact.py"), "pass\n").unwrap();
        let path = dir.path().join("redact.plugin.toml");
        std::fs::write(&path, "protocol = 1\ncommand = [\"python3\", \"redact.py\"]\n").unwrap();
        let manifest = Manifest::read(&path).unwrap();
        assert_eq!(manifest.name, "redact");
        assert_eq!(manifest.command[0], "python3");
        assert_eq!(
            manifest.command[1],
            dir.path().join("redact.py").to_string_lossy()
        );
        assert_eq!(
            manifest.files,
            vec![
                dir.path().join("redact.plugin.toml"),
                dir.path().join("redact.py")
            ]
        );
    }

    #[test]
    fn bad_manifests_say_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.plugin.toml");
        for (text, expected) in [
            ("command = [\"a\"]\n", "protocol must be set"),
            (
                "protocol = 2\ncommand = [\"a\"]\n",
                "protocol = 2, but this host speaks protocol 1",
            ),
            ("protocol = 1\n", "command must name a program"),
            (
                "protocol = 1\ncommand = \"a\"\n",
                "command must be an array of strings",
            ),
            (
                "protocol = 1\ncommand = [\"a\"]\nfiles = [\"../etc\"]\n",
                "must be a relative path inside plugin_dir",
            ),
            (
                "protocol = 1\ncommand = [\"a\"]\ncomand = 1\n",
                "unknown key \"comand\"",
            ),
            ("protocol = [\n", "not valid TOML"),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = Manifest::read(&path).unwrap_err();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
        assert_eq!(manifest_stem(Path::new("/a/Bad Name.plugin.toml")), None);
        assert_eq!(manifest_stem(Path::new("/a/ok_1.plugin.toml")), Some("ok_1"));
    }
}
