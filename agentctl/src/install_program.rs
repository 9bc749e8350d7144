//! `agentctl install NAME.plugin.toml`: puts a process plugin — its manifest and the files
//! it names — into the configuration's `plugin_dir` (docs/process-plugins.md#installing).
//!
//! The program is started from where it is, with its `[plugin.NAME]` table, and must
//! answer the handshake with `ready` first. Then each file is written to a hidden
//! temporary beside its destination, fsynced and renamed over it, the manifest last: a
//! host watching `plugin_dir` sees the manifest only once its files are there. A
//! different file already at a destination is a clash, refused unless `force`.

use std::io::Write;
use std::path::{Path, PathBuf};

use history_engine::config::edit::Refused;
use history_engine::config::write::EditLock;
use history_engine::process_plugin::{check_program, manifest::Manifest};
use history_engine::Config;

use crate::install::Installed;

/// Installs the process plugin of `manifest_path` into `config_file`'s `plugin_dir`.
pub fn install_program(config_file: &Path, manifest_path: &Path, force: bool) -> Result<Installed, Refused> {
    let refuse = |why: String| Refused(format!("install {}: {why}", manifest_path.display()));
    let manifest = Manifest::read(manifest_path).map_err(refuse)?;
    let config = Config::load(config_file).map_err(|err| Refused(err.to_string()))?;
    let version = check_program(&config, &manifest).map_err(refuse)?;
    let source_dir = manifest.path.parent().unwrap_or(Path::new("/"));
    // Every file, relative to the manifest's folder; the manifest itself last.
    let mut copies: Vec<(PathBuf, PathBuf)> = Vec::new();
    for file in manifest.files.iter().filter(|f| **f != manifest.path) {
        let relative = file
            .strip_prefix(source_dir)
            .map_err(|_| refuse(format!("{} is not beside the manifest", file.display())))?;
        copies.push((file.clone(), config.plugin_dir.join(relative)));
    }
    let target = config
        .plugin_dir
        .join(manifest_path.file_name().unwrap_or_default());
    copies.push((manifest.path.clone(), target.clone()));
    let mut written = false;
    let mut replaced = false;
    let _lock = EditLock::acquire(&config.file)?;
    let mut planned = Vec::new();
    for (from, to) in &copies {
        let bytes =
            std::fs::read(from).map_err(|e| refuse(format!("cannot read {}: {e}", from.display())))?;
        match std::fs::read(to) {
            Ok(existing) if existing == bytes => continue,
            Ok(_) if !force => {
                return Err(refuse(format!(
                    "a different file is already installed as {} (agentctl install --force replaces it)",
                    to.display()
                )))
            }
            Ok(_) => replaced = true,
            Err(_) => {}
        }
        planned.push((from, to, bytes));
    }
    for (from, to, bytes) in planned {
        place(from, to, &bytes).map_err(refuse)?;
        written = true;
    }
    if let Ok(dir) = std::fs::File::open(&config.plugin_dir) {
        let _ = dir.sync_all();
    }
    Ok(Installed {
        name: manifest.name,
        version,
        file: target,
        written,
        replaced,
    })
}

/// Writes `bytes` (from `from`, whose permissions it keeps) to a hidden temporary beside
/// `to`, fsynced, then renames it over `to`.
fn place(from: &Path, to: &Path, bytes: &[u8]) -> Result<(), String> {
    let dir = to.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let name = to.file_name().unwrap_or_default().to_string_lossy();
    let temporary = dir.join(format!(".{name}.agentctl-{}.tmp", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut out = std::fs::File::create(&temporary)?;
        if let Ok(meta) = std::fs::metadata(from) {
            out.set_permissions(meta.permissions())?;
        }
        out.write_all(bytes)?;
        out.sync_all()?;
        std::fs::rename(&temporary, to)
    })();
    written.map_err(|e| {
        let _ = std::fs::remove_file(&temporary);
        format!("cannot write {}: {e}", to.display())
    })
}
