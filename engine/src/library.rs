//! A plugin library: loading one file (its ELF, its `plugin-api` version and layout
//! checked before any of its code runs, docs/abi.md#loading) and building an instance with
//! its `[plugin.NAME]` table. What finds the files (`loader`), copies them (`shadow`) and
//! probes them in a child (`probe`) all build on this, and it on none of them.

use std::path::{Path, PathBuf};

use abi_stable::abi_stability::abi_checking::{AbiInstability, AbiInstabilityErrors};
use abi_stable::library::{lib_header_from_path, LibraryError, RootModule};
use abi_stable::type_layout::TLFieldOrFunction;
use abi_stable::StableAbi;
use plugin_api::echo;
use plugin_api::{Description, LoadContext, PluginBox, PluginModRef, RResult};

use crate::config::{Config, ConfigError};
use crate::{elf, logging, services};

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
    pub fn instantiate(&self, load: &LoadContext) -> Result<PluginBox, plugin_api::ConfigError> {
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
fn with_known_keys(
    mut err: plugin_api::ConfigError,
    keys: &[plugin_api::ConfigKey],
) -> plugin_api::ConfigError {
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

/// The [`LoadContext`] for plugin `name`'s `new`.
pub(crate) fn load_context(config: &Config, name: &str) -> LoadContext {
    let config_json = config
        .plugin_table(name)
        .map(|t| t.json.to_string())
        .unwrap_or_else(|| "{}".to_string());
    LoadContext {
        config_json: config_json.into(),
        agent_max_ctx: config.agent_max_ctx,
        models: config.models_for_validation().into(),
        services: services::SERVICES,
    }
}

/// Builds an instance of `library` with its `[plugin.NAME]` table, the plugin validating
/// it (what `agentctl plugins` and `check` report per plugin). The error names the table,
/// the key and its line.
pub(crate) fn instantiate_library(
    config: &Config,
    library: &PluginLibrary,
) -> Result<PluginBox, ConfigError> {
    let name = library.name.as_str();
    let load = load_context(config, name);
    logging::with_plugin(name, || library.instantiate(&load)).map_err(|err| table_error(config, name, &err))
}

/// A plugin's refusal of its table: the table, the key and its line.
pub(crate) fn table_error(config: &Config, name: &str, err: &plugin_api::ConfigError) -> ConfigError {
    let line = config
        .plugin_key_line(name, &err.key)
        .or_else(|| config.history_key_line("chain"));
    let place = if err.key.is_empty() {
        format!("[plugin.{name}]")
    } else {
        format!("[plugin.{name}] {}", echo::bare(&err.key))
    };
    config.error(line, format!("{place}: {}", echo::text(&err.message)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_api::{ConfigError, ConfigKey};

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
