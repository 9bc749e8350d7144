//! Discovery and loading of plugin libraries (SPEC §3.2, §3.4).
//!
//! Each file is loaded with `lib_header_from_path` + `init_root_module_with_unchecked_layout`
//! — never `RootModule::load_from_file`, which caches one module per type and would hand
//! back the first plugin for every later path. Libraries are never unloaded. A library
//! built against an incompatible `plugin-api` is refused before any of its code runs, in
//! one line: versions and layouts are checked here first, by [`crate::compat`]'s rules,
//! which let a plugin built against an older `plugin-api` of the same `0.y` load.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use abi_stable::abi_stability::abi_checking::{AbiInstability, AbiInstabilityErrors};
use abi_stable::library::{lib_header_from_path, LibraryError, RootModule};
use abi_stable::type_layout::TLFieldOrFunction;
use abi_stable::StableAbi;
use plugin_api::{ConfigError, Description, LoadContext, PluginBox, PluginModRef, RResult};

/// The file stem every plugin library has (after the platform's prefix).
pub const STEM_PREFIX: &str = "history_plugin_";

/// A loaded plugin library.
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
    /// Loads one library file.
    pub fn load(path: &Path) -> Result<PluginLibrary, Refusal> {
        let refuse = |reason: String, detail: Option<String>| Refusal {
            path: path.to_path_buf(),
            reason,
            detail,
        };
        let header = lib_header_from_path(path).map_err(|err| match err {
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
            path: path.to_path_buf(),
            module,
        })
    }

    /// Builds an instance with the plugin's config; the plugin validates it.
    pub fn instantiate(&self, load: &LoadContext) -> Result<PluginBox, ConfigError> {
        match (self.module.new())(load) {
            RResult::ROk(instance) => Ok(instance),
            RResult::RErr(err) => Err(err),
        }
    }
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

/// The plugin libraries found in a folder.
#[derive(Debug, Default)]
pub struct Catalog {
    /// Loadable plugins by exported name.
    pub plugins: BTreeMap<String, PluginLibrary>,
    /// Libraries that were found but refused.
    pub refused: Vec<Refusal>,
}

/// A discovery error: two files export the same name, or the folder cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryError(pub String);

impl std::fmt::Display for DiscoveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Library files in `dir` named `<prefix>history_plugin_*<suffix>`, sorted.
pub fn library_files(dir: &Path) -> Result<Vec<PathBuf>, DiscoveryError> {
    let entries = std::fs::read_dir(dir).map_err(|err| {
        DiscoveryError(format!(
            "cannot read plugin_dir {}: {err} (build and install the plugins with `cargo xtask build`)",
            dir.display()
        ))
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.is_file() && plugin_stem(path).is_some())
        .collect();
    files.sort();
    Ok(files)
}

/// The file name of plugin `name`'s library (`x` → `libhistory_plugin_x.so` on Linux):
/// the inverse of [`plugin_stem`].
pub fn library_file_name(name: &str) -> String {
    format!(
        "{}{STEM_PREFIX}{name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    )
}

/// The chain name a library file's name suggests (`libhistory_plugin_x.so` → `x`).
pub fn plugin_stem(path: &Path) -> Option<&str> {
    let file = path.file_name()?.to_str()?;
    let stem = file
        .strip_prefix(std::env::consts::DLL_PREFIX)?
        .strip_suffix(std::env::consts::DLL_SUFFIX)?;
    stem.strip_prefix(STEM_PREFIX).filter(|name| !name.is_empty())
}

impl Catalog {
    /// Discovers and loads every plugin library in `dir`.
    pub fn discover(dir: &Path) -> Result<Catalog, DiscoveryError> {
        let mut catalog = Catalog::default();
        for path in library_files(dir)? {
            match PluginLibrary::load(&path) {
                Ok(library) => {
                    if let Some(other) = catalog.plugins.get(&library.name) {
                        return Err(DiscoveryError(format!(
                            "two plugin libraries export the name \"{}\": {} and {}",
                            library.name,
                            other.path.display(),
                            path.display()
                        )));
                    }
                    catalog.plugins.insert(library.name.clone(), library);
                }
                Err(refusal) => {
                    tracing::warn!("{refusal}");
                    if let Some(detail) = &refusal.detail {
                        tracing::debug!("{}: {detail}", refusal.path.display());
                    }
                    catalog.refused.push(refusal);
                }
            }
        }
        Ok(catalog)
    }

    /// The available plugins' names, for messages.
    pub fn available_names(&self) -> String {
        if self.plugins.is_empty() {
            "none; build and install plugins with `cargo xtask build`".to_string()
        } else {
            self.plugins.keys().cloned().collect::<Vec<_>>().join(", ")
        }
    }

    /// The refusal of the library whose file name suggests `name`, if any.
    pub fn refusal_for(&self, name: &str) -> Option<&Refusal> {
        self.refused.iter().find(|r| plugin_stem(&r.path) == Some(name))
    }
}
