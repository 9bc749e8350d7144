//! `agentctl`'s reports (SPEC §6.2): `history-list` (the configuration as the host reads
//! it), `plugins` (every library in `plugin_dir`) and `check` (load the chain, validate
//! every plugin's table, run the chain on a built-in sample). Each report is data with a
//! text rendering and a JSON one (`--json`).

use std::fmt::Write;
use std::path::PathBuf;

use serde_json::{json, Value};

use crate::chain::{instantiate_library, stateless_context, Chain};
use crate::config::{Config, OnPluginError};
use crate::loader::{library_files, plugin_stem, Catalog, DiscoveryError, PluginLibrary};
use crate::{turns, Call};

fn on_error_name(on_error: OnPluginError) -> &'static str {
    match on_error {
        OnPluginError::Skip => "skip",
        OnPluginError::Fail => "fail",
    }
}

/// `history-list`: the chain in order with each plugin's summary, the settings, the
/// models with their window, and the available plugins not in the chain.
pub fn history_list(config: &Config, catalog: &Result<Catalog, DiscoveryError>) -> (String, Value) {
    let describe = |name: &str| -> (Option<String>, Option<String>) {
        match catalog {
            Ok(catalog) => match catalog.plugins.get(name) {
                Some(library) => (Some(library.description.summary.to_string()), None),
                None => match catalog.refusal_for(name) {
                    Some(refusal) => (None, Some(format!("cannot be loaded: {}", refusal.reason))),
                    None => (
                        None,
                        Some(format!("not available in {}", config.plugin_dir.display())),
                    ),
                },
            },
            Err(err) => (None, Some(err.to_string())),
        }
    };
    let mut text = String::new();
    let _ = writeln!(text, "config: {}", config.file.display());
    let _ = writeln!(text, "plugin_dir: {}", config.plugin_dir.display());
    let _ = writeln!(text, "chain:");
    let width = config.chain.iter().map(String::len).max().unwrap_or(0);
    let mut chain_json = Vec::new();
    for (position, name) in config.chain.iter().enumerate() {
        let (summary, problem) = describe(name);
        let shown = match (&summary, &problem) {
            (Some(summary), _) => summary.clone(),
            (None, Some(problem)) => format!("(!) {problem}"),
            (None, None) => String::new(),
        };
        let _ = writeln!(text, "  {position}  {name:<width$}  {shown}");
        chain_json.push(json!({
            "position": position,
            "name": name,
            "description": summary,
            "available": problem.is_none(),
            "problem": problem,
        }));
    }
    let timeout = match config.session_idle_timeout_minutes {
        0 => "0 (never reap)".to_string(),
        m => m.to_string(),
    };
    let _ = writeln!(text, "agent_max_ctx: {}", config.agent_max_ctx);
    let _ = writeln!(text, "max_users: {}", config.max_users);
    let _ = writeln!(text, "session_idle_timeout_minutes: {timeout}");
    let _ = writeln!(text, "on_plugin_error: {}", on_error_name(config.on_plugin_error));
    let _ = writeln!(text, "models:");
    let mut models_json = Vec::new();
    let models = config.models_for_validation();
    let width = models.iter().map(|m| m.name.len()).max().unwrap_or(0);
    for model in &models {
        let listed = config
            .models
            .iter()
            .any(|(n, _)| n.as_str() == model.name.as_str());
        let _ = writeln!(
            text,
            "  {:<width$}  effective_ctx {:>4}  (max_context {}, context_tokens {}, tokenizer {}){}",
            model.name.as_str(),
            model.effective_ctx,
            model.max_context,
            model.context_tokens,
            model.tokenizer.as_str(),
            if listed {
                ""
            } else {
                "  [built-in default: what an unlisted model gets]"
            }
        );
        models_json.push(json!({
            "name": model.name.as_str(),
            "effective_ctx": model.effective_ctx,
            "max_context": model.max_context,
            "context_tokens": model.context_tokens,
            "tokenizer": model.tokenizer.as_str(),
            "listed": listed,
        }));
    }
    let mut available_json = Vec::new();
    match catalog {
        Ok(catalog) => {
            let others: Vec<&PluginLibrary> = catalog
                .plugins
                .values()
                .filter(|library| !config.chain.contains(&library.name))
                .collect();
            if others.is_empty() {
                let _ = writeln!(text, "available, not in the chain: none");
            } else {
                let _ = writeln!(text, "available, not in the chain:");
                let width = others.iter().map(|l| l.name.len()).max().unwrap_or(0);
                for library in others {
                    let _ = writeln!(
                        text,
                        "  {:<width$}  {}",
                        library.name,
                        library.description.summary.as_str()
                    );
                    available_json.push(json!({
                        "name": library.name,
                        "version": library.version,
                        "description": library.description.summary.as_str(),
                    }));
                }
            }
        }
        Err(err) => {
            let _ = writeln!(text, "available, not in the chain: unknown ({err})");
        }
    }
    let json = json!({
        "config": config.file.display().to_string(),
        "plugin_dir": config.plugin_dir.display().to_string(),
        "chain": chain_json,
        "agent_max_ctx": config.agent_max_ctx,
        "max_users": config.max_users,
        "session_idle_timeout_minutes": config.session_idle_timeout_minutes,
        "on_plugin_error": on_error_name(config.on_plugin_error),
        "models": models_json,
        "available": available_json,
        "discovery_error": catalog.as_ref().err().map(|e| e.to_string()),
    });
    (text, json)
}

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
    /// Its position in the chain.
    pub position: Option<usize>,
    pub summary: Option<String>,
}

/// Every library in `plugin_dir`, loaded one by one (two libraries exporting one name both
/// show the conflict), each instantiated with its table; plus chain plugins with no library.
pub fn plugins(config: &Config) -> Result<Vec<LibraryStatus>, DiscoveryError> {
    let mut statuses: Vec<LibraryStatus> = Vec::new();
    let mut loaded: Vec<PluginLibrary> = Vec::new();
    for path in library_files(&config.plugin_dir)? {
        let guessed = plugin_stem(&path).unwrap_or_default().to_string();
        let position = |name: &str| config.chain.iter().position(|n| n == name);
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
    for (position, name) in config.chain.iter().enumerate() {
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
                position: Some(position),
                summary: None,
            });
        }
    }
    Ok(statuses)
}

/// `plugins` as text and JSON.
pub fn render_plugins(config: &Config, statuses: &[LibraryStatus]) -> (String, Value) {
    let mut text = String::new();
    let _ = writeln!(text, "plugin_dir: {}", config.plugin_dir.display());
    if statuses.is_empty() {
        let _ = writeln!(
            text,
            "no plugin libraries found (build and install them with `cargo xtask build`)"
        );
    }
    let name_width = statuses.iter().map(|s| s.name.len()).max().unwrap_or(0);
    let version_width = statuses
        .iter()
        .map(|s| s.version.as_deref().unwrap_or("-").len())
        .max()
        .unwrap_or(0);
    let file_name = |status: &LibraryStatus| {
        status
            .file
            .as_ref()
            .and_then(|f| f.file_name())
            .map(|f| f.to_string_lossy().to_string())
            .unwrap_or_else(|| "(no library)".to_string())
    };
    let file_width = statuses.iter().map(|s| file_name(s).len()).max().unwrap_or(0);
    for status in statuses {
        let enabled = match status.position {
            Some(p) => format!("enabled (position {p})"),
            None => "not enabled".to_string(),
        };
        let loads = if status.loads {
            "loads".to_string()
        } else {
            format!(
                "DOES NOT LOAD: {}",
                status.reason.as_deref().unwrap_or("unknown reason")
            )
        };
        let _ = writeln!(
            text,
            "{:<name_width$}  {:<version_width$}  {:<file_width$}  {loads}; {enabled}",
            status.name,
            status.version.as_deref().unwrap_or("-"),
            file_name(status),
        );
    }
    let json = json!({
        "config": config.file.display().to_string(),
        "plugin_dir": config.plugin_dir.display().to_string(),
        "plugins": statuses.iter().map(|s| json!({
            "name": s.name,
            "version": s.version,
            "file": s.file.as_ref().map(|f| f.display().to_string()),
            "loads": s.loads,
            "reason": s.reason,
            "enabled": s.enabled,
            "position": s.position,
            "description": s.summary,
        })).collect::<Vec<_>>(),
    });
    (text, json)
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
    pub position: Option<usize>,
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
        let used = plugin_stem(&refusal.path).is_some_and(|n| config.chain.iter().any(|c| c == n));
        if !used {
            report.warnings.push(refusal.to_string());
        }
    }
    let mut names: Vec<(String, Option<usize>)> = config
        .chain
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), Some(i)))
        .collect();
    for table in &config.plugins {
        if !config.chain.contains(&table.name) {
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

/// `check` as text and JSON.
pub fn render_check(report: &CheckReport) -> (String, Value) {
    let mut text = String::new();
    let _ = writeln!(text, "config: {}", report.config.display());
    for plugin in &report.plugins {
        let place = match plugin.position {
            Some(p) => format!("position {p}"),
            None => "not in the chain".to_string(),
        };
        let state = match &plugin.problem {
            None => "loads, config ok".to_string(),
            Some(problem) => format!("FAULT: {problem}"),
        };
        let _ = writeln!(
            text,
            "plugin {} {} ({place}): {state}",
            plugin.name,
            plugin.version.as_deref().unwrap_or("-")
        );
    }
    for run in &report.runs {
        let _ = writeln!(
            text,
            "sample run, model {} (effective_ctx {}): {} -> {} messages",
            run.model, run.effective_ctx, run.messages_in, run.messages_out
        );
        let width = run.stages.iter().map(|s| s.plugin.len()).max().unwrap_or(0);
        for stage in &run.stages {
            let state = match &stage.fault {
                None => "ok".to_string(),
                Some(fault) => format!("FAULT: {fault}"),
            };
            let _ = writeln!(
                text,
                "  {:<width$}  {} -> {} messages  {state}",
                stage.plugin, stage.messages_in, stage.messages_out
            );
        }
    }
    for warning in &report.warnings {
        let _ = writeln!(text, "warning: {warning}");
    }
    if report.ok() {
        let _ = writeln!(text, "check: ok");
    } else {
        for problem in &report.problems {
            let _ = writeln!(text, "problem: {problem}");
        }
        let _ = writeln!(text, "check: FAILED ({} problem(s))", report.problems.len());
    }
    let json = json!({
        "config": report.config.display().to_string(),
        "ok": report.ok(),
        "problems": report.problems,
        "warnings": report.warnings,
        "plugins": report.plugins.iter().map(|p| json!({
            "name": p.name,
            "version": p.version,
            "position": p.position,
            "ok": p.ok,
            "problem": p.problem,
        })).collect::<Vec<_>>(),
        "runs": report.runs.iter().map(|r| json!({
            "model": r.model,
            "effective_ctx": r.effective_ctx,
            "messages_in": r.messages_in,
            "messages_out": r.messages_out,
            "stages": r.stages.iter().map(|s| json!({
                "plugin": s.plugin,
                "messages_in": s.messages_in,
                "messages_out": s.messages_out,
                "tokens_in": s.tokens_in,
                "tokens_out": s.tokens_out,
                "ok": s.fault.is_none(),
                "fault": s.fault,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    (text, json)
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
