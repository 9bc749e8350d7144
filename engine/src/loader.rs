//! Discovery and loading of plugin libraries (docs/abi.md#loading, docs/abi.md#discovery).
//!
//! Each file is loaded with `lib_header_from_path` + `init_root_module_with_unchecked_layout`
//! — never `RootModule::load_from_file`, which caches one module per type and would hand
//! back the first plugin for every later path. Libraries are never unloaded. A library
//! built against an incompatible `plugin-api` is refused before any of its code runs, in
//! one line: versions and layouts are checked here first, by [`crate::compat`]'s rules,
//! which let a plugin built against an older `plugin-api` of the same `0.y` load.
//!
//! Mapping a library runs its code (its constructors) and trusts its headers, so nothing
//! is mapped that is not needed. Discovery ([`Catalog::discover`]) only lists the files
//! named `<prefix>history_plugin_<name><suffix>`: each names its plugin by its file name,
//! and a symlink that leads out of `plugin_dir` or a file that is not a complete shared
//! library ([`crate::elf`]) is refused there, unread by the loader. A library is mapped
//! when its plugin is asked for ([`Catalog::library`]: a chain entry, a `[plugin.NAME]`
//! table), and it must export the name its file gives. What looks at every file
//! (`agentctl plugins`, `check`) loads each one in a child process ([`crate::probe`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::elf;
use crate::library::{PluginLibrary, Refusal};
use crate::probe::{Probed, Prober};
use crate::process_plugin::manifest::{manifest_stem, Manifest};
use crate::shadow::{ShadowLibraries, SHADOW_DIR};

pub use plugin_api::naming::{library_file_name, plugin_stem};

/// One library file of `plugin_dir`, found by its name and mapped only when its plugin is
/// asked for ([`Catalog::library`]).
#[derive(Debug)]
pub struct LibraryFile {
    /// The plugin its file name gives (`libhistory_plugin_x.so` → `x`): the name its
    /// library must export.
    pub name: String,
    /// Its path in `plugin_dir` (a symlink's own path).
    pub path: PathBuf,
    /// The file that is loaded: `path`, or a symlink's target (inside `plugin_dir`).
    pub target: PathBuf,
    /// Refused at discovery, before anything was mapped.
    refused: Option<Refusal>,
    /// What a child process found, when the catalog probes ([`Catalog::probed`]).
    probed: OnceLock<Result<Probed, Refusal>>,
    loaded: OnceLock<Result<PluginLibrary, Refusal>>,
}

impl LibraryFile {
    /// Why discovery refused the file (a symlink out of `plugin_dir`, not a complete
    /// shared library), if it did. Such a file is never mapped.
    pub fn refusal(&self) -> Option<&Refusal> {
        self.refused.as_ref()
    }
}

/// The plugin library files of `plugin_dir`, each loaded only when asked for.
#[derive(Debug, Default)]
pub struct Catalog {
    /// By name (file name order).
    files: Vec<LibraryFile>,
    /// The process plugins' manifests, `NAME.plugin.toml` (docs/process-plugins.md#the-manifest),
    /// by name: each read, or why it cannot be.
    programs: Vec<ProgramFile>,
    /// When set, a library is first loaded in a child process ([`Catalog::probed`]).
    prober: Option<Prober>,
    /// When set, libraries load from shadow copies ([`Catalog::shadowed`]).
    shadow: Option<Arc<ShadowLibraries>>,
}

/// A process plugin's manifest in `plugin_dir`.
#[derive(Debug)]
pub struct ProgramFile {
    /// The plugin its file name gives (`redact.plugin.toml` → `redact`).
    pub name: String,
    /// The manifest's path.
    pub path: PathBuf,
    /// The manifest, or why it was refused (one line).
    pub manifest: Result<Manifest, String>,
}

/// Why [`Catalog::library`] has no library for a name.
#[derive(Debug, Clone, Copy)]
pub enum Unavailable<'a> {
    /// No file in `plugin_dir` is named for it.
    Missing,
    /// Its file is refused.
    Refused(&'a Refusal),
}

/// A discovery error: the folder cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryError(pub String);

impl std::fmt::Display for DiscoveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What is loaded for `path`, an entry of `plugin_dir` (`dir`, canonical): the path itself,
/// or a symlink's target when it lies inside `plugin_dir`. Plugins load only from there.
fn resolve(dir: &Path, path: &Path) -> Result<PathBuf, String> {
    let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    if !is_link {
        return Ok(path.to_path_buf());
    }
    let link = std::fs::read_link(path).unwrap_or_default();
    match std::fs::canonicalize(path) {
        Ok(target) if target.starts_with(dir) => Ok(target),
        Ok(target) => Err(format!(
            "a symbolic link to {}, outside plugin_dir {}: plugins load only from plugin_dir",
            target.display(),
            dir.display()
        )),
        Err(err) => Err(format!(
            "a symbolic link to {}, which cannot be read: {err}",
            link.display()
        )),
    }
}

impl Catalog {
    /// Lists the plugin library files in `dir` without mapping any: a symlink out of `dir`
    /// and a file that is not a complete shared library are refused here.
    pub fn discover(dir: &Path) -> Result<Catalog, DiscoveryError> {
        let cannot_read = |err: std::io::Error| {
            DiscoveryError(format!(
                "cannot read plugin_dir {}: {err} (build and install the plugins with `cargo xtask build`)",
                dir.display()
            ))
        };
        let entries = std::fs::read_dir(dir).map_err(cannot_read)?;
        let canonical = std::fs::canonicalize(dir).map_err(cannot_read)?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            // The shadow copies (crate::shadow) are the host's, never plugins to discover.
            .filter(|entry| entry.file_name() != SHADOW_DIR)
            .map(|entry| entry.path())
            .collect();
        paths.sort();
        let mut programs = Vec::new();
        for path in paths.iter().filter(|path| path.is_file()) {
            if let Some(name) = manifest_stem(path) {
                let manifest = Manifest::read(path).map_err(|why| format!("{}: {why}", path.display()));
                programs.push(ProgramFile {
                    name: name.to_string(),
                    path: path.clone(),
                    manifest,
                });
            }
        }
        paths.retain(|path| plugin_stem(path).is_some());
        let mut files = Vec::new();
        for path in paths {
            let name = plugin_stem(&path).unwrap_or_default().to_string();
            let refuse = |reason: String| Refusal {
                path: path.clone(),
                reason,
                detail: None,
            };
            let (target, refused) = match resolve(&canonical, &path) {
                // A folder (or a link to one) is not a library and is not listed.
                Ok(target) if !target.is_file() => continue,
                Ok(target) => {
                    let refused = elf::check(&target).err().map(refuse);
                    (target, refused)
                }
                Err(reason) => (path.clone(), Some(refuse(reason))),
            };
            files.push(LibraryFile {
                name,
                path,
                target,
                refused,
                probed: OnceLock::new(),
                loaded: OnceLock::new(),
            });
        }
        Ok(Catalog {
            files,
            programs,
            prober: None,
            shadow: None,
        })
    }

    /// This catalog, loading every library first in a child process run by `prober`, so
    /// a library that crashes or exits while it loads is refused instead of ending this
    /// process. For tools that must outlive any library; the host itself loads directly.
    pub fn probed(mut self, prober: Prober) -> Catalog {
        self.prober = Some(prober);
        self
    }

    /// This catalog, loading every library from a shadow copy held by `libraries`
    /// (`<plugin_dir>/.shadow/<hash>/`), reusing one already loaded with the same content:
    /// for a host that reloads, which must never map a file of `plugin_dir` that a rebuild
    /// may overwrite (docs/chain.md#hot-reload).
    pub fn shadowed(mut self, libraries: Arc<ShadowLibraries>) -> Catalog {
        self.shadow = Some(libraries);
        self
    }

    /// With a prober, probes the libraries of `names` not probed yet, all at once (a few
    /// children at a time), so that loading them one by one later waits on none.
    pub fn preload<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        let Some(prober) = &self.prober else {
            return;
        };
        let mut files: Vec<&LibraryFile> = names
            .into_iter()
            .filter_map(|name| self.file(name))
            .filter(|file| file.refused.is_none() && file.probed.get().is_none())
            .collect();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        files.dedup_by(|a, b| a.path == b.path);
        let targets: Vec<&Path> = files.iter().map(|file| file.target.as_path()).collect();
        for (file, result) in files.iter().zip(prober.probe_all(&targets, None)) {
            let _ = file.probed.set(result);
        }
    }

    /// Every library file found, in file name order.
    pub fn files(&self) -> &[LibraryFile] {
        &self.files
    }

    /// Every process plugin's manifest found, in file name order.
    pub fn programs(&self) -> &[ProgramFile] {
        &self.programs
    }

    /// The manifest of process plugin `name`, when no library is named for it (a library
    /// of the same name wins: docs/process-plugins.md#the-manifest).
    pub fn program(&self, name: &str) -> Option<&ProgramFile> {
        if self.file(name).is_some() {
            return None;
        }
        self.programs.iter().find(|program| program.name == name)
    }

    /// The file named for plugin `name`.
    pub fn file(&self, name: &str) -> Option<&LibraryFile> {
        self.files.iter().find(|file| file.name == name)
    }

    /// Plugin `name`'s library, mapped on first use (never before, never twice): the
    /// file named for it, which must export that name.
    pub fn library(&self, name: &str) -> Result<&PluginLibrary, Unavailable<'_>> {
        let file = self.file(name).ok_or(Unavailable::Missing)?;
        if let Some(refusal) = &file.refused {
            return Err(Unavailable::Refused(refusal));
        }
        file.loaded
            .get_or_init(|| self.load(file))
            .as_ref()
            .map_err(Unavailable::Refused)
    }

    fn load(&self, file: &LibraryFile) -> Result<PluginLibrary, Refusal> {
        let refuse = |reason: String| Refusal {
            path: file.path.clone(),
            reason,
            detail: None,
        };
        let exports = |name: &str| self.name_conflict(file, name).map_or(Ok(()), |r| Err(refuse(r)));
        let result = (|| -> Result<PluginLibrary, Refusal> {
            if let Some(prober) = &self.prober {
                let probed = file.probed.get_or_init(|| prober.probe(&file.target, None));
                let probed = probed.as_ref().map_err(|refusal| Refusal {
                    path: file.path.clone(),
                    ..refusal.clone()
                })?;
                // Refused before it is mapped here, as the probe saw it.
                exports(&probed.name)?;
            }
            let library = match &self.shadow {
                Some(libraries) => libraries.load(&file.path, &file.target)?,
                None => PluginLibrary::load_as(&file.path, &file.target)?,
            };
            exports(&library.name)?;
            Ok(library)
        })();
        if let Err(refusal) = &result {
            if let Some(detail) = &refusal.detail {
                tracing::debug!("{}: {detail}", refusal.path.display());
            }
        }
        result
    }

    /// Why `file`'s library cannot stand for its plugin when it exports `exported`: a
    /// library must export the name its file gives, and two files that export one name are
    /// an error naming both.
    pub fn name_conflict(&self, file: &LibraryFile, exported: &str) -> Option<String> {
        if exported == file.name {
            return None;
        }
        Some(match self.file(exported) {
            Some(other) => {
                let (first, second) = if other.path < file.path {
                    (&other.path, &file.path)
                } else {
                    (&file.path, &other.path)
                };
                format!(
                    "two plugin libraries export the name \"{exported}\": {} and {} (remove one)",
                    first.display(),
                    second.display()
                )
            }
            None => format!(
                "it exports the name \"{exported}\", not \"{}\" as its file name says (rename it {})",
                file.name,
                library_file_name(exported)
            ),
        })
    }

    /// Whether plugin `name` has a library file not refused so far (it may still be
    /// refused when it is loaded).
    pub fn has(&self, name: &str) -> bool {
        if self.program(name).is_some_and(|program| program.manifest.is_ok()) {
            return true;
        }
        self.file(name)
            .is_some_and(|file| file.refused.is_none() && !matches!(file.loaded.get(), Some(Err(_))))
    }

    /// The available plugins' names, for messages: the files not refused so far, by the
    /// names their file names give.
    pub fn available_names(&self) -> String {
        let mut names: Vec<&str> = self
            .files
            .iter()
            .map(|file| file.name.as_str())
            .chain(self.programs.iter().map(|program| program.name.as_str()))
            .filter(|name| self.has(name))
            .collect();
        names.sort_unstable();
        names.dedup();
        if names.is_empty() {
            "none; build and install plugins with `cargo xtask build`".to_string()
        } else {
            names.join(", ")
        }
    }
}
