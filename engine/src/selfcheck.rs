//! The host's self-check, shared by `agentctl` and (later) the hot reload: every library
//! in `plugin_dir` loaded and instantiated one by one ([`plugins`]), and the whole
//! configuration loaded, validated and run on a built-in sample history ([`check`]).
//! These return data; the binaries render it.

use std::path::PathBuf;

use crate::chain::{instantiate_library, stateless_context, Chain};
use crate::config::{Config, OnPluginError, Place};
use crate::loader::{library_files, plugin_stem, Catalog, DiscoveryError, PluginLibrary};
use crate::{turns, Call};

/// One library file of `plugin_dir` (or a chain plugin with no library), as `plugins`
/// shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryStatus {
    /// The exported name, or for a library that does not load, the name its file suggests.
    pub name: String,
    pub version: Option<String>,
    pub file: Option<PathBuf>,
    /// The library loads and its `new` accepts its `[plugin.NAME]` table.
    pub loads: bool,
    /// Why not, in one line.
    pub reason: Option<String>,
    /// In the chain.
    pub enabled: bool,
    /// Where it runs, when it is in the chain or the view.
    pub position: Option<Place>,
    pub summary: Option<String>,
}

/// Every library in `plugin_dir`, loaded one by one (two libraries exporting one name both
/// show the conflict), each instantiated with its table; plus chain plugins with no library.
pub fn plugins(config: &Config) -> Result<Vec<LibraryStatus>, DiscoveryError> {
    let mut statuses: Vec<LibraryStatus> = Vec::new();
    let mut loaded: Vec<PluginLibrary> = Vec::new();
    for path in library_files(&config.plugin_dir)? {
        let guessed = plugin_stem(&path).unwrap_or_default().to_string();
        let position = |name: &str| config.place_of(name);
        match PluginLibrary::load(&path) {
            Ok(library) => {
                let mut status = LibraryStatus {
                    name: library.name.clone(),
                    version: Some(library.version.clone()),
                    file: Some(path.clone()),
                    loads: true,
                    reason: None,
                    enabled: position(&library.name).is_some(),
                    position: position(&library.name),
                    summary: Some(library.description.summary.to_string()),
                };
                if let Some(other) = loaded.iter().find(|l| l.name == library.name) {
                    let reason = format!(
                        "two libraries export the name \"{}\": {} and {} (remove one)",
                        library.name,
                        other.path.display(),
                        path.display()
                    );
                    for earlier in statuses.iter_mut().filter(|s| s.name == library.name) {
                        earlier.loads = false;
                        earlier.reason = Some(reason.clone());
                    }
                    status.loads = false;
                    status.reason = Some(reason);
                } else if let Err(err) = instantiate_library(config, &library) {
                    status.loads = false;
                    status.reason = Some(format!("its configuration is refused: {err}"));
                }
                statuses.push(status);
                loaded.push(library);
            }
            Err(refusal) => statuses.push(LibraryStatus {
                position: position(&guessed),
                enabled: position(&guessed).is_some(),
                name: guessed,
                version: None,
                file: Some(path),
                loads: false,
                reason: Some(refusal.reason),
                summary: None,
            }),
        }
    }
    for name in config.chain.iter().chain(&config.view) {
        if !statuses.iter().any(|s| &s.name == name) {
            statuses.push(LibraryStatus {
                name: name.clone(),
                version: None,
                file: None,
                loads: false,
                reason: Some(format!(
                    "in the chain but no library in {} exports it",
                    config.plugin_dir.display()
                )),
                enabled: true,
                position: config.place_of(name),
                summary: None,
            });
        }
    }
    Ok(statuses)
}

/// The history `check` runs the chain on: a system prompt, a task, a tool call with its
/// result, the assistant's answer and a follow-up, in the OpenAI Chat Completions format.
pub const SAMPLE_HISTORY: &str = r#"[
  {"role": "system", "content": "You are a coding agent working in a git repository. Use the tools to read and change files; keep answers short."},
  {"role": "user", "content": "The test `parses_leap_days` fails for the year 1900. Find the cause and fix it."},
  {"role": "assistant", "content": "Let me read the date code first.", "tool_calls": [
    {"id": "call_read_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"src/dates.rs\"}"}}
  ]},
  {"role": "tool", "tool_call_id": "call_read_1", "content": "pub fn days_in_february(year: i32) -> u32 {\n    if year % 4 == 0 { 29 } else { 28 }\n}\n"},
  {"role": "assistant", "content": "`days_in_february` ignores the century rule: 1900 is not a leap year. The fix is `year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)`."},
  {"role": "user", "content": "Good. Apply the fix and run the tests."}
]"#;

/// One plugin's part in a sample run.
#[derive(Debug, Clone)]
pub struct StageCheck {
    pub plugin: String,
    pub messages_in: usize,
    pub messages_out: usize,
    pub tokens_in: u64,
    pub tokens_out: u64,
    /// The fault (error, panic or invalid output), if any.
    pub fault: Option<String>,
}

/// The sample run on one model.
#[derive(Debug, Clone)]
pub struct SampleRun {
    pub model: String,
    pub effective_ctx: u64,
    pub messages_in: usize,
    pub messages_out: usize,
    pub stages: Vec<StageCheck>,
}

/// One chain plugin (or a `[plugin.NAME]` table) as `check` saw it.
#[derive(Debug, Clone)]
pub struct PluginCheck {
    pub name: String,
    pub version: Option<String>,
    /// Where it runs, when it is in the chain or the view.
    pub position: Option<Place>,
    /// The library loads and its `new` accepts its table.
    pub ok: bool,
    pub problem: Option<String>,
}

/// What `check` found.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    pub config: PathBuf,
    /// Problems that make the configuration unusable, one line each.
    pub problems: Vec<String>,
    /// Warnings (a refused library no one uses, a table naming no plugin).
    pub warnings: Vec<String>,
    pub plugins: Vec<PluginCheck>,
    pub runs: Vec<SampleRun>,
}

impl CheckReport {
    /// All is well: the chain loads, every config validates, every sample run is clean.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// `check`: loads the configuration and the plugins, validates every plugin's table
/// through its own `new`, builds the chain and runs it on [`SAMPLE_HISTORY`] once per
/// model (every listed model and `default`), reporting every plugin's fault.
pub fn check(config_file: &std::path::Path) -> CheckReport {
    let mut report = CheckReport {
        config: config_file.to_path_buf(),
        ..CheckReport::default()
    };
    let config = match Config::load(config_file) {
        Ok(config) => config,
        Err(err) => {
            report.problems.push(err.to_string());
            return report;
        }
    };
    let catalog = match Catalog::discover(&config.plugin_dir) {
        Ok(catalog) => catalog,
        Err(err) => {
            report.problems.push(format!("{}: {err}", config.file.display()));
            return report;
        }
    };
    for refusal in &catalog.refused {
        let used = plugin_stem(&refusal.path).is_some_and(|n| config.place_of(n).is_some());
        if !used {
            report.warnings.push(refusal.to_string());
        }
    }
    let mut names: Vec<(String, Option<Place>)> = config
        .chain
        .iter()
        .chain(&config.view)
        .map(|n| (n.clone(), config.place_of(n)))
        .collect();
    for table in &config.plugins {
        if config.place_of(&table.name).is_none() {
            names.push((table.name.clone(), None));
        }
    }
    for (name, position) in names {
        let mut entry = PluginCheck {
            name: name.clone(),
            version: None,
            position,
            ok: true,
            problem: None,
        };
        match catalog.plugins.get(&name) {
            Some(library) => {
                entry.version = Some(library.version.clone());
                if let Err(err) = instantiate_library(&config, library) {
                    entry.ok = false;
                    entry.problem = Some(err.to_string());
                }
            }
            None if position.is_none() => {
                report.warnings.push(format!(
                    "{}: [plugin.{name}] names no available plugin (available: {})",
                    config.file.display(),
                    catalog.available_names()
                ));
                continue;
            }
            None => {
                entry.ok = false;
                entry.problem = Some(match catalog.refusal_for(&name) {
                    Some(refusal) => format!("cannot be loaded: {refusal}"),
                    None => format!(
                        "not available in {} (available: {})",
                        config.plugin_dir.display(),
                        catalog.available_names()
                    ),
                });
            }
        }
        if let Some(problem) = &entry.problem {
            report.problems.push(format!("plugin \"{name}\": {problem}"));
        }
        report.plugins.push(entry);
    }
    if !report.problems.is_empty() {
        return report;
    }
    let mut chain = match Chain::load(&config, &catalog) {
        Ok(chain) => chain,
        Err(err) => {
            report.problems.push(err.to_string());
            return report;
        }
    };
    // Every stage runs, so every fault is reported, whatever `on_plugin_error` says.
    chain.on_error = OnPluginError::Skip;
    for model in config.models_for_validation() {
        let history = match plugin_api::wire::history_from_str(SAMPLE_HISTORY) {
            Ok(history) => history,
            Err(err) => {
                report
                    .problems
                    .push(format!("the built-in sample history is invalid: {err}"));
                return report;
            }
        };
        let turn = turns::current_turn(&history, None);
        let name = model.name.to_string();
        let effective_ctx = model.effective_ctx;
        let ctx = stateless_context(&config, model, turn);
        let messages_in = history.len();
        match chain.run(history, &ctx, Call::Process) {
            Ok(run) => {
                let stages: Vec<StageCheck> = run
                    .stages
                    .iter()
                    .map(|s| StageCheck {
                        plugin: s.plugin.clone(),
                        messages_in: s.messages_in,
                        messages_out: s.messages_out,
                        tokens_in: s.tokens_in,
                        tokens_out: s.tokens_out,
                        fault: s.skipped.clone(),
                    })
                    .collect();
                for stage in &stages {
                    if let Some(fault) = &stage.fault {
                        report.problems.push(format!(
                            "plugin \"{}\" faulted on the sample history (model {name}): {fault}",
                            stage.plugin
                        ));
                    }
                }
                report.runs.push(SampleRun {
                    model: name,
                    effective_ctx,
                    messages_in,
                    messages_out: run.history.len(),
                    stages,
                });
            }
            Err(failure) => report.problems.push(format!("model {name}: {failure}")),
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_history_is_valid_and_well_formed() {
        let history = plugin_api::wire::history_from_str(SAMPLE_HISTORY).unwrap();
        assert_eq!(history.len(), 6);
        let faults = plugin_api::structure::Faults::of(&history);
        assert_eq!(faults.count(), 0, "{:?}", faults.describe(&history));
    }
}
