//! The host's self-check, shared by `agentctl` and (later) the hot reload: every library
//! in `plugin_dir` loaded and instantiated one by one ([`plugins`]), and the whole
//! configuration loaded, validated and run on a built-in sample history ([`check`]).
//! These return data; the binaries render it.
//!
//! Both look at every library, so each is loaded in a child process ([`Prober`]): a
//! library that crashes, exits or hangs while it loads is reported as not loading, and
//! the caller carries on. Only the chain `check` runs is loaded in this process, once its
//! libraries have loaded in a child.

use std::path::{Path, PathBuf};

use crate::chain::{stateless_context, Chain};
use crate::config::{Config, OnPluginError, Place};
use crate::loader::{plugin_stem, Catalog, DiscoveryError};
use crate::probe::Prober;
use crate::{turns, Call};

/// One library file of `plugin_dir` (or a chain plugin with no library), as `plugins`
/// shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryStatus {
    /// The exported name, or for a library that does not load, the name its file gives.
    pub name: String,
    pub version: Option<String>,
    pub file: Option<PathBuf>,
    /// Available: the library loads and exports the name its file gives (its
    /// configuration may still be refused).
    pub available: bool,
    /// The library loads and its `new` accepts its `[plugin.NAME]` table.
    pub loads: bool,
    /// Why not, in one line.
    pub reason: Option<String>,
    /// The plugin's `new` refused its table (the error, naming the key and its line).
    pub config_error: Option<String>,
    /// In the chain or the view.
    pub enabled: bool,
    /// Where it runs, when it is in the chain or the view.
    pub position: Option<Place>,
    pub summary: Option<String>,
    /// The keys its `[plugin.NAME]` table accepts, each with its meaning (its `describe`).
    pub config_keys: Vec<(String, String)>,
    /// A process plugin (a program named by `NAME.plugin.toml`, docs/process-plugins.md),
    /// not a library.
    pub program: bool,
}

impl LibraryStatus {
    /// The plugin this entry stands for in the configuration: the name its file gives.
    fn configured_as(&self) -> &str {
        self.file
            .as_deref()
            .and_then(|file| {
                plugin_stem(file).or_else(|| crate::process_plugin::manifest::manifest_stem(file))
            })
            .unwrap_or(&self.name)
    }
}

/// Every library in `plugin_dir`, each loaded in a child process run by `prober` and
/// instantiated there with its table; plus chain plugins with no library. Nothing is
/// mapped in this process.
pub fn plugins(config: &Config, prober: &Prober) -> Result<Vec<LibraryStatus>, DiscoveryError> {
    let catalog = Catalog::discover(&config.plugin_dir)?;
    Ok(statuses(config, &catalog, prober))
}

fn statuses(config: &Config, catalog: &Catalog, prober: &Prober) -> Vec<LibraryStatus> {
    let position = |name: &str| config.place_of(name);
    // Files refused at discovery are not probed: nothing of them is ever mapped.
    let to_probe: Vec<&Path> = catalog
        .files()
        .iter()
        .filter(|file| file.refusal().is_none())
        .map(|file| file.target.as_path())
        .collect();
    let mut probed = prober.probe_all(&to_probe, Some(&config.file)).into_iter();
    let mut statuses: Vec<LibraryStatus> = Vec::new();
    for file in catalog.files() {
        let mut status = LibraryStatus {
            name: file.name.clone(),
            version: None,
            file: Some(file.path.clone()),
            available: false,
            loads: false,
            reason: None,
            config_error: None,
            enabled: position(&file.name).is_some(),
            position: position(&file.name),
            summary: None,
            config_keys: Vec::new(),
            program: false,
        };
        let result = match file.refusal() {
            Some(refusal) => Err(refusal.clone()),
            None => probed.next().expect("one probe per file"),
        };
        match result {
            Ok(library) => {
                status.version = Some(library.version.clone());
                match catalog.name_conflict(file, &library.name) {
                    Some(conflict) => status.reason = Some(conflict),
                    None => {
                        status.available = true;
                        status.summary = Some(library.summary.clone());
                        status.config_keys = library.config_keys.clone();
                        status.loads = library.config_error.is_none();
                        status.reason = library
                            .config_error
                            .as_ref()
                            .map(|err| format!("its configuration is refused: {err}"));
                        status.config_error = library.config_error;
                    }
                }
                status.name = library.name;
            }
            Err(refusal) => status.reason = Some(refusal.reason),
        }
        statuses.push(status);
    }
    for program in catalog.programs() {
        statuses.push(program_status(config, catalog, program));
    }
    for name in config.chain.iter().chain(&config.view) {
        if !statuses.iter().any(|s| s.configured_as() == name) {
            statuses.push(LibraryStatus {
                name: name.clone(),
                version: None,
                file: None,
                available: false,
                loads: false,
                reason: Some(format!(
                    "in the chain but no library in {} exports it",
                    config.plugin_dir.display()
                )),
                config_error: None,
                enabled: true,
                position: config.place_of(name),
                summary: None,
                config_keys: Vec::new(),
                program: false,
            });
        }
    }
    statuses
}

/// A process plugin's status: its program started with its table (and ended), which is
/// how its version and its refusal of the table are known.
fn program_status(config: &Config, catalog: &Catalog, program: &crate::ProgramFile) -> LibraryStatus {
    let place = config.place_of(&program.name);
    let mut status = LibraryStatus {
        name: program.name.clone(),
        version: None,
        file: Some(program.path.clone()),
        available: false,
        loads: false,
        reason: None,
        config_error: None,
        enabled: place.is_some(),
        position: place,
        summary: None,
        config_keys: Vec::new(),
        program: true,
    };
    if catalog.program(&program.name).is_none() {
        status.reason = Some(format!(
            "a library named {:?} is in plugin_dir too, and wins",
            program.name
        ));
        return status;
    }
    let manifest = match &program.manifest {
        Ok(manifest) => manifest,
        Err(why) => {
            status.reason = Some(why.clone());
            return status;
        }
    };
    status.summary = manifest.description.clone();
    let load = crate::library::load_context(config, &program.name);
    match crate::process_plugin::ProcessPlugin::start(
        manifest,
        &load.config_json,
        load.agent_max_ctx,
        &load.models,
    ) {
        Ok(plugin) => {
            status.version = Some(plugin.version().to_string());
            status.available = true;
            status.loads = true;
        }
        Err(crate::process_plugin::StartFailure::Config(err)) => {
            let err = crate::library::table_error(config, &program.name, &err).to_string();
            status.available = true;
            status.reason = Some(format!("its configuration is refused: {err}"));
            status.config_error = Some(err);
        }
        Err(crate::process_plugin::StartFailure::Failed(why)) => status.reason = Some(why),
    }
    status
}

/// The history `check` runs the chain on: a system prompt, a task, a tool call with its
/// result, the assistant's answer and a follow-up, in the OpenAI Chat Completions format.
/// The follow-up carries what a redactor looks for (a token, an e-mail address), so a
/// plugin that rewrites text shows itself by its `message-changed` events.
pub const SAMPLE_HISTORY: &str = r#"[
  {"role": "system", "content": "You are a coding agent working in a git repository. Use the tools to read and change files; keep answers short."},
  {"role": "user", "content": "The test `parses_leap_days` fails for the year 1900. Find the cause and fix it."},
  {"role": "assistant", "content": "Let me read the date code first.", "tool_calls": [
    {"id": "call_read_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"src/dates.rs\"}"}}
  ]},
  {"role": "tool", "tool_call_id": "call_read_1", "content": "pub fn days_in_february(year: i32) -> u32 {\n    if year % 4 == 0 { 29 } else { 28 }\n}\n"},
  {"role": "assistant", "content": "`days_in_february` ignores the century rule: 1900 is not a leap year. The fix is `year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)`."},
  {"role": "user", "content": "Good. Apply the fix and run the tests. The CI reads SECRET_TOKEN=sk-SECRET-4f8a2c91 from .env; mail the result to ops@example.com."}
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
    /// Its `message-changed` events: messages it rewrote in place (a redaction).
    pub changed: usize,
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
    /// `[history] isolate`: the plugins the sample runs called in a worker process.
    pub isolate: Vec<String>,
    /// `[summarizer]`, when configured: what `check` can say without calling it.
    pub summarizer: Option<SummarizerCheck>,
}

/// The configured summarizer as `check` sees it (it is not called: a check costs nothing).
#[derive(Debug, Clone)]
pub struct SummarizerCheck {
    /// Where requests go: `URL/chat/completions`.
    pub endpoint: String,
    pub model: String,
    pub timeout_ms: u64,
    /// `api_key_env` and whether that variable is set here.
    pub api_key_env: Option<(String, bool)>,
}

impl CheckReport {
    /// All is well: the chain loads, every config validates, every sample run is clean.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// `check`: loads the configuration, loads every library in a child process run by
/// `prober` (a library that does not load is a warning unless the configuration names
/// it), validates every named plugin's table through its own `new`, then builds the chain
/// here and runs it on [`SAMPLE_HISTORY`] once per model (every listed model and
/// `default`), reporting every plugin's fault.
pub fn check(config_file: &Path, prober: &Prober) -> CheckReport {
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
    report.isolate = config.isolate.clone();
    report.summarizer = config.summarizer.as_ref().map(|s| SummarizerCheck {
        endpoint: format!("{}/chat/completions", s.url),
        model: s.model.clone(),
        timeout_ms: s.timeout_ms,
        api_key_env: s.api_key_env.as_ref().map(|name| {
            (
                name.clone(),
                std::env::var_os(name).is_some_and(|v| !v.is_empty()),
            )
        }),
    });
    if let Some((name, false)) = report.summarizer.as_ref().and_then(|s| s.api_key_env.as_ref()) {
        // The chain would not load here: `history-host` refuses an unset key variable.
        report.problems.push(format!(
            "{}:{}: [summarizer] api_key_env names {name}, which is not set in this environment",
            config.file.display(),
            config.summarizer_key_line("api_key_env").unwrap_or(0)
        ));
    }
    let catalog = match Catalog::discover(&config.plugin_dir) {
        Ok(catalog) => catalog,
        Err(err) => {
            report.problems.push(format!("{}: {err}", config.file.display()));
            return report;
        }
    };
    let statuses = statuses(&config, &catalog, prober);
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
    for status in statuses.iter().filter(|s| !s.available) {
        let (Some(file), Some(reason)) = (&status.file, &status.reason) else {
            continue;
        };
        if !names.iter().any(|(n, _)| n == status.configured_as()) {
            report
                .warnings
                .push(format!("refused plugin library {}: {reason}", file.display()));
        }
    }
    let available = {
        let names: Vec<&str> = statuses
            .iter()
            .filter(|s| s.available)
            .map(LibraryStatus::configured_as)
            .collect();
        if names.is_empty() {
            "none; build and install plugins with `cargo xtask build`".to_string()
        } else {
            names.join(", ")
        }
    };
    for (name, position) in names {
        let mut entry = PluginCheck {
            name: name.clone(),
            version: None,
            position,
            ok: true,
            problem: None,
        };
        let status = statuses
            .iter()
            .find(|s| s.file.is_some() && s.configured_as() == name);
        match status {
            Some(status) if status.available => {
                entry.version = status.version.clone();
                if let Some(err) = &status.config_error {
                    entry.ok = false;
                    entry.problem = Some(err.clone());
                }
            }
            Some(status) if position.is_none() => {
                report.warnings.push(format!(
                    "{}: [plugin.{name}] names a plugin that cannot be loaded: refused plugin library {}: {}",
                    config.file.display(),
                    status.file.as_deref().unwrap_or(Path::new("")).display(),
                    status.reason.as_deref().unwrap_or("unknown reason")
                ));
                continue;
            }
            Some(status) => {
                entry.ok = false;
                entry.problem = Some(format!(
                    "cannot be loaded: refused plugin library {}: {}",
                    status.file.as_deref().unwrap_or(Path::new("")).display(),
                    status.reason.as_deref().unwrap_or("unknown reason")
                ));
            }
            None if position.is_none() => {
                report.warnings.push(format!(
                    "{}: [plugin.{name}] names no available plugin (available: {available})",
                    config.file.display(),
                ));
                continue;
            }
            None => {
                entry.ok = false;
                entry.problem = Some(format!(
                    "not available in {} (available: {available})",
                    config.plugin_dir.display(),
                ));
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
    // Every library the chain maps here has loaded in a child first.
    let chain = match Chain::load(&config, &catalog) {
        Ok(chain) => chain,
        Err(err) => {
            report.problems.push(err.to_string());
            return report;
        }
    };
    let (runs, problems) = sample_runs(&chain, &config);
    report.warnings.extend(fail_open_rewriters(&config, &runs));
    report.runs = runs;
    report.problems.extend(problems);
    report
}

/// A plugin that rewrote messages on the sample history (`message-changed`: a redactor,
/// say) and is not `required`, under `on_plugin_error = "skip"`: its fault would pass its
/// input on unrewritten, with one warning (docs/chain.md#faults). One warning each.
fn fail_open_rewriters(config: &Config, runs: &[SampleRun]) -> Vec<String> {
    if config.on_plugin_error != OnPluginError::Skip {
        return Vec::new();
    }
    let mut names: Vec<&str> = Vec::new();
    for stage in runs.iter().flat_map(|run| &run.stages) {
        if stage.changed > 0
            && !config.required.contains(&stage.plugin)
            && !names.contains(&stage.plugin.as_str())
        {
            names.push(&stage.plugin);
        }
    }
    names
        .into_iter()
        .map(|name| {
            format!(
                "plugin \"{name}\" rewrites messages (message-changed on the sample history) but is not required: \
                 under on_plugin_error = \"skip\" its fault sends its input on unrewritten (a redaction lost); \
                 `agentctl history-require {name}` makes its fault fail the turn"
            )
        })
        .collect()
}

/// Runs `chain` on [`SAMPLE_HISTORY`] once per model (every listed model and `default`):
/// the runs, and every fault as a problem line. Every stage runs, so every fault is
/// reported, whatever `on_plugin_error` and `required` say; the chain's own settings are
/// put back after. `check` reports these; a reload refuses a chain with a problem.
pub fn sample_runs(chain: &Chain, config: &Config) -> (Vec<SampleRun>, Vec<String>) {
    let mut runs = Vec::new();
    // The same fault on every model is one problem, naming the models.
    let mut faults = SampleFaults::default();
    for model in config.models_for_validation() {
        let history = match history_wire::chat::history_from_str(SAMPLE_HISTORY) {
            Ok(history) => history,
            Err(err) => {
                return (
                    runs,
                    vec![format!("the built-in sample history is invalid: {err}")],
                )
            }
        };
        let turn = turns::current_turn(&history, None);
        let name = model.name.to_string();
        let effective_ctx = model.effective_ctx;
        let ctx = stateless_context(config, model, turn);
        let messages_in = history.len();
        // Every line logged during the run — the plugins' own, skips, the summary — says
        // it is the sample's (`sample_run{model=…}:`), so a reload's check is not taken
        // for a turn (docs/cli.md#logging).
        let span = tracing::info_span!("sample_run", model = %plugin_api::echo::bare(&name));
        match span.in_scope(|| chain.run_every_stage(history, &ctx, Call::Process)) {
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
                        changed: s
                            .events
                            .iter()
                            .filter(|e| e.kind == plugin_api::EventKind::MessageChanged)
                            .count(),
                    })
                    .collect();
                for stage in &stages {
                    if let Some(fault) = &stage.fault {
                        faults.add(
                            format!("plugin \"{}\" faulted on the sample history", stage.plugin),
                            fault,
                            &name,
                        );
                    }
                }
                runs.push(SampleRun {
                    model: name,
                    effective_ctx,
                    messages_in,
                    messages_out: run.history.len(),
                    stages,
                });
            }
            Err(failure) => faults.add("the sample run failed".to_string(), &failure.to_string(), &name),
        }
    }
    (runs, faults.lines().collect())
}

/// The faults of the sample runs, each once with the models it happened on, in the order
/// first seen.
#[derive(Default)]
struct SampleFaults(Vec<(String, String, Vec<String>)>);

impl SampleFaults {
    fn add(&mut self, what: String, fault: &str, model: &str) {
        let model = plugin_api::echo::bare(model).to_string();
        match self.0.iter_mut().find(|(w, f, _)| *w == what && f == fault) {
            Some((_, _, models)) => models.push(model),
            None => self.0.push((what, fault.to_string(), vec![model])),
        }
    }

    fn lines(self) -> impl Iterator<Item = String> {
        self.0.into_iter().map(|(what, fault, models)| {
            let on = match models.as_slice() {
                [one] => format!("model {one}"),
                many => format!("models {}", many.join(", ")),
            };
            format!("{what} ({on}): {fault}")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_on_every_model_is_one_problem_naming_the_models() {
        let mut faults = SampleFaults::default();
        faults.add("plugin \"x\" faulted".into(), "boom", "a");
        faults.add("plugin \"x\" faulted".into(), "boom", "default");
        faults.add("plugin \"x\" faulted".into(), "other", "a");
        faults.add("plugin \"y\" faulted".into(), "boom", "a");
        let lines: Vec<String> = faults.lines().collect();
        assert_eq!(
            lines,
            [
                "plugin \"x\" faulted (models a, default): boom",
                "plugin \"x\" faulted (model a): other",
                "plugin \"y\" faulted (model a): boom",
            ]
        );
    }

    #[test]
    fn the_sample_history_is_valid_and_well_formed() {
        let history = history_wire::chat::history_from_str(SAMPLE_HISTORY).unwrap();
        assert_eq!(history.len(), 6);
        let faults = plugin_api::structure::Faults::of(&history);
        assert_eq!(faults.count(), 0, "{:?}", faults.describe(&history));
    }
}
