//! `agentctl install FILE`: puts a plugin library built elsewhere into the configuration's
//! `plugin_dir` (docs/cli.md#agentctl).
//!
//! The bytes are read once, written to a temporary file in `plugin_dir` (hidden: its name
//! starts with `.`, so discovery never lists it) and fsynced; that copy — exactly what
//! will be installed — must be a complete ELF shared library, load in a child process
//! ([`Prober`]: a library that crashes while it loads ends the child, not agentctl), pass
//! the `plugin-api` version and layout checks, export the name its file gives and accept
//! its `[plugin.NAME]` table, if any. Only then is it renamed over the destination and the
//! folder fsynced: a crash leaves either no library or the whole one, never half of one,
//! and a library already loaded by a running host is never overwritten in place (a rename
//! gives the new file its own inode). A different library already at the destination is
//! a name clash, refused unless `force`.

use std::io::Write;
use std::path::{Path, PathBuf};

use history_engine::{check_elf_library, library_file_name, plugin_stem, Config, Prober};

use history_engine::config::edit::Refused;
use history_engine::config::write::{remove_stale_temporaries, EditLock};

/// What [`install`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The plugin's exported name.
    pub name: String,
    pub version: String,
    /// Where it is now.
    pub file: PathBuf,
    /// False when the same bytes were already there: nothing was written.
    pub written: bool,
    /// True when a different library was replaced (`force`).
    pub replaced: bool,
}

/// Installs `library` into the `plugin_dir` of the configuration `config_file`. `prober`
/// loads the copy in a child process; `before_rename` runs once the copy is written,
/// fsynced and validated, just before the rename (the binary's fault hook for tests).
pub fn install(
    config_file: &Path,
    library: &Path,
    force: bool,
    prober: &Prober,
    before_rename: &dyn Fn(),
) -> Result<Installed, Refused> {
    let refuse = |why: String| Refused(format!("install {}: {why}", library.display()));
    let Some(stem) = plugin_stem(library) else {
        return Err(refuse(format!(
            "not named like a plugin library ({}, NAME in lowercase letters, digits and _)",
            library_file_name("NAME")
        )));
    };
    let name = stem.to_string();
    let config = Config::load(config_file).map_err(|err| Refused(err.to_string()))?;
    check_elf_library(library).map_err(refuse)?;
    let bytes = std::fs::read(library).map_err(|err| refuse(format!("cannot read it: {err}")))?;
    let target = config.plugin_dir.join(library_file_name(&name));
    let existing = match std::fs::read(&target) {
        Ok(existing) => Some(existing),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
        Err(err) => return Err(refuse(format!("cannot read {}: {err}", target.display()))),
    };
    if existing.as_deref() == Some(bytes.as_slice()) {
        let probed = prober
            .probe(&target, Some(&config.file))
            .map_err(|r| refuse(r.reason))?;
        return Ok(Installed {
            name,
            version: probed.version,
            file: target,
            written: false,
            replaced: false,
        });
    }
    if existing.is_some() && !force {
        return Err(refuse(format!(
            "a different library is already installed as {} (agentctl install --force replaces it)",
            target.display()
        )));
    }
    // One agentctl changes the configuration's plugins at a time.
    let _lock = EditLock::acquire(&config.file)?;
    let file_name = library_file_name(&name);
    remove_stale_temporaries(&config.plugin_dir, &file_name);
    let temporary = config
        .plugin_dir
        .join(format!(".{file_name}.agentctl-{}.tmp", std::process::id()));
    let result = place(
        &temporary,
        &target,
        &bytes,
        library,
        &name,
        &config,
        prober,
        before_rename,
    );
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    let version = result.map_err(refuse)?;
    Ok(Installed {
        name,
        version,
        file: target,
        written: true,
        replaced: existing.is_some(),
    })
}

/// Writes `bytes` to `temporary`, validates that copy, and renames it to `target`; the
/// installed version, or why not.
#[allow(clippy::too_many_arguments)]
fn place(
    temporary: &Path,
    target: &Path,
    bytes: &[u8],
    library: &Path,
    name: &str,
    config: &Config,
    prober: &Prober,
    before_rename: &dyn Fn(),
) -> Result<String, String> {
    let cannot = |what: &str, err: std::io::Error| format!("cannot {what} {}: {err}", temporary.display());
    let _ = std::fs::remove_file(temporary);
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(temporary)
        .map_err(|e| cannot("create", e))?;
    let permissions = std::fs::metadata(library).map(|m| m.permissions());
    (|| {
        if let Ok(permissions) = permissions {
            out.set_permissions(permissions)?;
        }
        out.write_all(bytes)?;
        out.sync_all()
    })()
    .map_err(|e| cannot("write", e))?;
    drop(out);
    check_elf_library(temporary)?;
    let probed = prober
        .probe(temporary, Some(&config.file))
        .map_err(|refusal| refusal.reason)?;
    if probed.name != name {
        return Err(format!(
            "it exports the plugin name \"{}\", but its file name says \"{name}\" (rename it to {})",
            probed.name,
            library_file_name(&probed.name)
        ));
    }
    if let Some(err) = probed.config_error {
        return Err(format!(
            "it loads, but refuses its [plugin.{name}] table in {}: {err}",
            config.file.display()
        ));
    }
    before_rename();
    std::fs::rename(temporary, target)
        .map_err(|err| format!("cannot move it to {}: {err}", target.display()))?;
    // The rename is durable once the folder's entry is on disk.
    if let Ok(dir) = std::fs::File::open(&config.plugin_dir) {
        let _ = dir.sync_all();
    }
    Ok(probed.version)
}
