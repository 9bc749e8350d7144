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

use abi_stable::abi_stability::abi_checking::{AbiInstability, AbiInstabilityErrors};
use abi_stable::library::{lib_header_from_path, LibraryError, RootModule};
use abi_stable::type_layout::TLFieldOrFunction;
use abi_stable::StableAbi;
use plugin_api::{ConfigError, Description, LoadContext, PluginBox, PluginModRef, RResult};

use crate::elf;
use crate::probe::{Probed, Prober};
use crate::shadow::{ShadowLibraries, SHADOW_DIR};

pub use plugin_api::naming::{library_file_name, plugin_stem};

/// A loaded plugin library. Cloning it shares the mapped library (never unloaded).
#[derive(Clone)]
pub struct PluginLibrary {
    /// The exported chain name.
    pub name: String,
    /// The plugin's own version.
    pub version: String,
    pub description: Description,
    pub path: PathBuf,
    module: PluginModRef,
}

impl std::fmt::Debug for PluginLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginLibrary")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("path", &self.path)
            .finish()
    }
}

/// A library that could not be loaded, in one line; the full detail (e.g. abi_stable's
/// layout dump) is kept for debug logs.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub path: PathBuf,
    pub reason: String,
    pub detail: Option<String>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "refused plugin library {}: {}",
            self.path.display(),
            self.reason
        )
    }
}

/// The `plugin-api` version this host was built with.
pub fn host_api_version() -> String {
    PluginModRef::VERSION_STRINGS.to_string()
}

impl PluginLibrary {
    /// Loads one library file, having checked that it is a complete shared library.
    pub fn load(path: &Path) -> Result<PluginLibrary, Refusal> {
        PluginLibrary::load_as(path, path)
    }

    /// Loads `file`, naming it `shown` (a symlink's own path in `plugin_dir`, or the
    /// file a shadow copy was made of).
    pub(crate) fn load_as(shown: &Path, file: &Path) -> Result<PluginLibrary, Refusal> {
        let refuse = |reason: String, detail: Option<String>| Refusal {
            path: shown.to_path_buf(),
            reason,
            detail,
        };
        elf::check(file).map_err(|reason| refuse(reason, None))?;
        let header = lib_header_from_path(file).map_err(|err| match err {
            LibraryError::OpenError { err, .. } => refuse(format!("cannot open it: {err}"), None),
            LibraryError::GetSymbolError { .. } => refuse(
                "not a history plugin (it exports no abi_stable root module)".into(),
                None,
            ),
            LibraryError::InvalidAbiHeader(found) => refuse(
                format!("built with an incompatible abi_stable ({found:?})"),
                Some(err_text(&LibraryError::InvalidAbiHeader(found))),
            ),
            other => refuse(first_line(&other.to_string()), Some(other.to_string())),
        })?;

        let host_version = host_api_version();
        let plugin_version = header.version_strings().to_string();
        let versions = format!("plugin-api {plugin_version} (plugin) vs {host_version} (host)");
        if let (Ok(host), Ok(plugin)) = (
            PluginModRef::VERSION_STRINGS.parsed(),
            header.version_strings().parsed(),
        ) {
            if let Err(why) = crate::compat::check_versions(host, plugin) {
                return Err(refuse(format!("{versions}: {why}"), None));
            }
        }
        let Some(layout) = header.layout() else {
            return Err(refuse(format!("{versions}: it carries no layout to check"), None));
        };
        if let Err(errors) = crate::compat::check_layout(<PluginModRef as StableAbi>::LAYOUT, layout) {
            return Err(refuse(
                format!("{versions}: layout differs: {}", first_mismatch(&errors)),
                Some(errors.to_string()),
            ));
        }
        // SAFETY: the layout was checked just above. abi_stable's own check (in
        // `init_root_module`) would refuse a plugin built before the host's ABI grew.
        let module =
            unsafe { header.init_root_module_with_unchecked_layout::<PluginModRef>() }.map_err(|err| {
                refuse(
                    format!("{versions}: {}", first_line(&err.to_string())),
                    Some(err.to_string()),
                )
            })?;

        let name = module.name()().to_string();
        let version = module.version()().to_string();
        let description = module.describe()();
        Ok(PluginLibrary {
            name,
            version,
            description,
            path: shown.to_path_buf(),
            module,
        })
    }

    /// Builds an instance with the plugin's config; the plugin validates it.
    pub fn instantiate(&self, load: &LoadContext) -> Result<PluginBox, ConfigError> {
        match (self.module.new())(load) {
            RResult::ROk(instance) => Ok(instance),
            RResult::RErr(err) => Err(with_known_keys(err, &self.description.config_keys)),
        }
    }
}

/// A plugin's refusal of a key of its table that it does not read (`ConfigTable::finish`'s
/// `unknown key`), with the keys it accepts by its `describe`, as the host's own unknown
/// keys are told (docs/configuration.md#errors). A key inside a nested table is left as it
/// is: the list is of the table's top level.
fn with_known_keys(mut err: ConfigError, keys: &[plugin_api::ConfigKey]) -> ConfigError {
    let top_level = !err.key.is_empty() && !err.key.contains(['.', '[']);
    if top_level && err.message.as_str() == "unknown key" {
        let names: Vec<&str> = keys.iter().map(|key| key.name.as_str()).collect();
        err.message = if names.is_empty() {
            "unknown key (it accepts no keys)".into()
        } else {
            format!("unknown key (known: {})", names.join(", ")).into()
        };
    }
    err
}

fn err_text(err: &LibraryError) -> String {
    err.to_string()
}

fn first_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("unknown error")
        .to_string()
}

/// The first mismatch of a layout check, in a few words: where, and what differs.
fn first_mismatch(errors: &AbiInstabilityErrors) -> String {
    let Some(first) = errors.errors.iter().find(|e| !e.errs.is_empty()) else {
        return "unknown difference".into();
    };
    // The stack holds fields, functions and their parameters, some unnamed (`0` for a
    // prefix, `,`-lists for parameters): keep the readable names, then the failing type.
    let mut path: Vec<String> = Vec::new();
    for step in first.stack_trace.iter() {
        let name = match &step.expected {
            TLFieldOrFunction::Field(field) => field.name(),
            TLFieldOrFunction::Function(function) => function.name.as_str(),
        };
        let readable = name.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_');
        if readable && path.last().map(String::as_str) != Some(name) {
            path.push(name.to_string());
        }
    }
    if let Some(TLFieldOrFunction::Field(field)) = first.stack_trace.last().map(|s| &s.expected) {
        path.push(field.layout().name().to_string());
    }
    let place = if path.is_empty() {
        "the root module".to_string()
    } else {
        path.join(" → ")
    };
    let what = match &first.errs[0] {
        AbiInstability::FieldCountMismatch(ef) => {
            format!("{} fields where {} were expected", ef.found, ef.expected)
        }
        AbiInstability::Size(ef) => format!("size {} bytes where {} were expected", ef.found, ef.expected),
        AbiInstability::Alignment(ef) => format!("alignment {} where {} was expected", ef.found, ef.expected),
        AbiInstability::Name(ef) => format!("type {} where {} was expected", ef.found, ef.expected),
        AbiInstability::UnexpectedField(ef) => {
            format!(
                "field `{}` where `{}` was expected",
                ef.found.name(),
                ef.expected.name()
            )
        }
        AbiInstability::PackageVersion(ef) => {
            format!("package version {} where {} was expected", ef.found, ef.expected)
        }
        AbiInstability::TooManyVariants(ef) => {
            format!("{} variants where {} were expected", ef.found, ef.expected)
        }
        other => {
            let text = format!("{other:?}");
            text.chars().take(160).collect()
        }
    };
    format!("{place}: {what}")
}

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
    /// When set, a library is first loaded in a child process ([`Catalog::probed`]).
    prober: Option<Prober>,
    /// When set, libraries load from shadow copies ([`Catalog::shadowed`]).
    shadow: Option<Arc<ShadowLibraries>>,
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
            .filter(|path| plugin_stem(path).is_some())
            .collect();
        paths.sort();
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
                Some(libraries) => libraries.load(file)?,
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
        self.file(name)
            .is_some_and(|file| file.refused.is_none() && !matches!(file.loaded.get(), Some(Err(_))))
    }

    /// The available plugins' names, for messages: the files not refused so far, by the
    /// names their file names give.
    pub fn available_names(&self) -> String {
        let names: Vec<&str> = self
            .files
            .iter()
            .filter(|file| self.has(&file.name))
            .map(|file| file.name.as_str())
            .collect();
        if names.is_empty() {
            "none; build and install plugins with `cargo xtask build`".to_string()
        } else {
            names.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_api::ConfigKey;

    #[test]
    fn an_unknown_key_is_told_with_the_keys_the_plugin_accepts() {
        let keys = [("recent", "r"), ("max_tokens", "m")].map(|(name, meaning)| ConfigKey {
            name: name.into(),
            meaning: meaning.into(),
        });
        let told = with_known_keys(ConfigError::new("recnet", "unknown key"), &keys);
        assert_eq!(
            told.to_string(),
            "recnet: unknown key (known: recent, max_tokens)"
        );
        let none = with_known_keys(ConfigError::new("x", "unknown key"), &[]);
        assert_eq!(none.to_string(), "x: unknown key (it accepts no keys)");
        // Other refusals, and keys of nested tables, are the plugin's words alone.
        for (key, message) in [
            ("recent", "expected an integer ≥ 0, found \"a\""),
            ("tools.search.x", "unknown key"),
        ] {
            assert_eq!(
                with_known_keys(ConfigError::new(key, message), &keys)
                    .message
                    .as_str(),
                message
            );
        }
    }
}
