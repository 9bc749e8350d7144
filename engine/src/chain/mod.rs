//! The chain: loading it from the configuration and running it (docs/chain.md#the-output-check, docs/chain.md#events-and-logs).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use plugin_api::echo;
use plugin_api::parts::MediaRules;
use plugin_api::{Context, Event, Message, ModelInfo, PluginBox, RArc, ROption};

use crate::config::{Config, ConfigError, OnPluginError};
use crate::deadline::Pool;
use crate::isolate::{IsolatedPlugin, LoadRequest, StartFailure};
use crate::library::{instantiate_library, load_context, table_error};
use crate::loader::{Catalog, ProgramFile, Unavailable};
use crate::process_plugin::{ProcessPlugin, StartFailure as ProcessStart};
use crate::{services, tokens, turns};

mod run;

/// One loaded plugin instance in the chain.
pub struct Stage {
    pub name: String,
    pub version: String,
    runner: Runner,
    /// Set when a call ran past `plugin_timeout_ms`: the stage is skipped from then on,
    /// until the chain is reloaded (docs/chain.md#deadline).
    quarantined: AtomicBool,
}

/// Where a stage's plugin runs.
enum Runner {
    /// In this process. Shared with a call left running past the deadline, which may
    /// outlive the chain.
    InProcess(Arc<PluginBox>),
    /// In worker processes (`[history] isolate`, docs/chain.md#isolation).
    Isolated(IsolatedPlugin),
    /// A program speaking the process plugins' protocol (docs/process-plugins.md).
    Process(ProcessPlugin),
}

impl Stage {
    fn new(name: String, version: String, instance: PluginBox) -> Stage {
        Stage::with_runner(name, version, Runner::InProcess(Arc::new(instance)))
    }

    fn isolated(name: String, plugin: IsolatedPlugin) -> Stage {
        let version = plugin.version().to_string();
        Stage::with_runner(name, version, Runner::Isolated(plugin))
    }

    fn process(name: String, plugin: ProcessPlugin) -> Stage {
        let version = plugin.version().to_string();
        Stage::with_runner(name, version, Runner::Process(plugin))
    }

    /// A stage not quarantined: every kind of plugin starts so.
    fn with_runner(name: String, version: String, runner: Runner) -> Stage {
        Stage {
            name,
            version,
            runner,
            quarantined: AtomicBool::new(false),
        }
    }

    /// Whether the plugin is a program (a process plugin, docs/process-plugins.md).
    pub fn is_program(&self) -> bool {
        matches!(self.runner, Runner::Process(_))
    }

    /// For a process plugin, how many times its program has been started so far.
    pub fn program_starts(&self) -> Option<u64> {
        match &self.runner {
            Runner::Process(plugin) => Some(plugin.starts()),
            _ => None,
        }
    }

    /// Whether the plugin runs in a worker process (`[history] isolate`).
    pub fn is_isolated(&self) -> bool {
        matches!(self.runner, Runner::Isolated(_))
    }

    /// For an isolated plugin, how many worker processes it has started so far: the first,
    /// and one for each that died or was killed (or for calls at once).
    pub fn worker_starts(&self) -> Option<u64> {
        match &self.runner {
            Runner::Isolated(plugin) => Some(plugin.worker_starts()),
            Runner::InProcess(_) | Runner::Process(_) => None,
        }
    }

    /// Whether a call of this stage ran past the deadline.
    pub fn is_quarantined(&self) -> bool {
        self.quarantined.load(Ordering::Relaxed)
    }
}

/// The ordered stages of a run: the `chain`, whose output is the working history, then
/// the `view`, whose output is what is sent this turn and is never kept.
///
/// A `Chain` is `Send + Sync`: one loaded chain serves every session's turns at once, and
/// [`SharedChain`] swaps a reloaded one in between turns. Its parts are shared with the
/// helper thread a run goes to under a deadline ([`crate::deadline`]), which may outlive
/// the chain when a call runs late.
pub struct Chain {
    parts: Arc<ChainParts>,
}

impl std::ops::Deref for Chain {
    type Target = ChainParts;

    fn deref(&self) -> &ChainParts {
        &self.parts
    }
}

/// What a [`Chain`] holds: its stages and the rules its runs follow.
pub struct ChainParts {
    /// `[history] ingest`: run on a turn's new messages before anything is stored
    /// ([`Chain::ingest`], docs/chain.md#ingest).
    pub(crate) ingest: Vec<Stage>,
    pub(crate) stages: Vec<Stage>,
    pub(crate) view: Vec<Stage>,
    pub(crate) on_error: OnPluginError,
    /// `plugin_timeout_ms`, when not 0: each run goes to a helper thread of `runs`.
    deadline: Option<Duration>,
    runs: Pool,
    /// `[history] required`: plugins whose fault fails the turn whatever `on_error` says.
    pub(crate) required: Vec<String>,
    /// `[models.*]`, for the rules a run's model counts images and documents by
    /// ([`Chain::media_rules`]).
    models: Vec<(String, crate::config::ModelTable)>,
}

/// Which entry point a run calls.
#[derive(Debug, Clone, Copy)]
pub enum Call<'a> {
    /// `process`: every turn.
    Process,
    /// `on_model_switch`: when the session's model changes (`ctx` describes `new`).
    ModelSwitch { old: &'a ModelInfo, new: &'a ModelInfo },
}

/// What one plugin did in a run.
#[derive(Debug, Clone)]
pub struct StageReport {
    pub plugin: String,
    pub messages_in: usize,
    pub messages_out: usize,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub events: Vec<Event>,
    /// A `view` stage (its output is sent, not kept).
    pub view: bool,
    /// An `ingest` stage (it ran on the messages entering, before anything was stored).
    pub ingest: bool,
    /// Why the plugin's result was not used (`on_plugin_error = "skip"`).
    pub skipped: Option<String>,
    /// The plugin is quarantined: this call ran past `plugin_timeout_ms`, or an earlier
    /// one did and the stage was not called.
    pub quarantined: bool,
    pub elapsed: Duration,
    /// With a previous output to compare against ([`Chain::run_compared`]): the index of
    /// the first message of this stage's output whose bytes differ from it (docs/plugins.md#token_budget).
    pub prefix_kept: Option<usize>,
}

/// The result of a chain run.
#[derive(Debug, Clone)]
pub struct ChainRun {
    /// The sent history: the last `view` stage's output (the working history when there is
    /// no view), what goes to the model this turn.
    pub history: Vec<RArc<Message>>,
    /// The working history: the last `chain` stage's output, what a session keeps and the
    /// next turn's messages are appended to.
    pub working: Vec<RArc<Message>>,
    /// Structural faults of the chain's input (accepted and reported, docs/wire-format.md#input-checks).
    pub input_faults: Vec<String>,
    /// What the host itself reports of the run's input: a `warning` per content-part type
    /// it does not know (docs/wire-format.md#part-kinds). Shown beside the plugins' events
    /// as those of `host`.
    pub host_events: Vec<Event>,
    pub stages: Vec<StageReport>,
    pub messages_in: usize,
    pub tokens_in: u64,
    pub tokens_out: u64,
    /// With a previous output to compare against: the index of the first message of the
    /// final history whose bytes differ from it (docs/plugins.md#token_budget).
    pub prefix_kept: Option<usize>,
}

impl ChainRun {
    /// Every event of the run with who reported it: the host's first (`"host"`), then
    /// each stage's in order.
    pub fn events(&self) -> impl Iterator<Item = (&str, &Event)> {
        let host = self.host_events.iter().map(|event| ("host", event));
        let stages = self.stages.iter().flat_map(|stage| {
            stage
                .events
                .iter()
                .map(move |event| (stage.plugin.as_str(), event))
        });
        host.chain(stages)
    }
}

/// A turn failed by a plugin under `on_plugin_error = "fail"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginFailure {
    pub plugin: String,
    pub message: String,
}

impl std::fmt::Display for PluginFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "plugin \"{}\" failed: {}", self.plugin, self.message)
    }
}

impl std::error::Error for PluginFailure {}

impl Chain {
    /// The chain's stages, in order (`[history] chain`).
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// The view stages, run after the chain on the sent history only (`[history] view`).
    pub fn view_stages(&self) -> &[Stage] {
        &self.view
    }

    /// The ingest stages, run on a turn's new messages (`[history] ingest`).
    pub fn ingest_stages(&self) -> &[Stage] {
        &self.ingest
    }

    /// What a plugin's fault does to the turn (`[history] on_plugin_error`).
    pub fn on_error(&self) -> OnPluginError {
        self.on_error
    }

    /// Instantiates the configured chain from the discovered plugins. Every
    /// `[plugin.NAME]` table of an available plugin is validated by its plugin, in the
    /// chain or not (so `agentctl` can enable it safely); a table naming no available
    /// plugin is a warning. Only those libraries are mapped: a library nothing names is
    /// never loaded, and one refused at discovery is a warning line.
    pub fn load(config: &Config, catalog: &Catalog) -> Result<Chain, ConfigError> {
        let names = || {
            config
                .ingest
                .iter()
                .chain(&config.chain)
                .chain(&config.view)
                .chain(config.plugins.iter().map(|t| &t.name))
                .map(String::as_str)
        };
        catalog.preload(names());
        let ingest = load_stages(config, catalog, "ingest", &config.ingest)?;
        let stages = load_stages(config, catalog, "chain", &config.chain)?;
        let view = load_stages(config, catalog, "view", &config.view)?;
        // Warnings wait until nothing can fail: a refusal gets one line, never a warning
        // and then the error that carries it.
        let mut warnings = Vec::new();
        for table in &config.plugins {
            if config.place_of(&table.name).is_some()
                || config.ingest.contains(&table.name)
                || catalog.program(&table.name).is_some()
            {
                continue;
            }
            match catalog.library(&table.name) {
                Ok(library) => drop(instantiate_library(config, library)?),
                Err(Unavailable::Missing) => warnings.push(format!(
                    "{}: [plugin.{}] names no available plugin (available: {})",
                    config.file.display(),
                    table.name,
                    catalog.available_names()
                )),
                Err(Unavailable::Refused(refusal)) => warnings.push(format!(
                    "{}: [plugin.{}] names a plugin that cannot be loaded: {refusal}",
                    config.file.display(),
                    table.name,
                )),
            }
        }
        for file in catalog.files() {
            if let Some(refusal) = file.refusal().filter(|_| !names().any(|n| n == file.name)) {
                warnings.push(refusal.to_string());
            }
        }
        for warning in warnings {
            tracing::warn!("{}", echo::line(&warning));
        }
        let mut chain = Chain::assemble(config, stages, view);
        Arc::get_mut(&mut chain.parts)
            .expect("a chain being built is not shared")
            .ingest = ingest;
        Ok(chain)
    }

    /// `copies` instances of plugin `name` in a row. This bypasses the configuration's
    /// chain rules (`default` first, no name twice) and exists for measuring only:
    /// `cargo xtask bench` runs a pass-through fixture through this same [`Chain::run`],
    /// as many stages as the real chain has, to get the floor its figures are divided by.
    pub fn repeated(
        config: &Config,
        catalog: &Catalog,
        name: &str,
        copies: usize,
    ) -> Result<Chain, ConfigError> {
        let mut stages = Vec::with_capacity(copies);
        let library = catalog.library(name).map_err(|_| {
            config.error(
                None,
                format!(
                    "plugin \"{name}\" is not available in {} (available: {})",
                    config.plugin_dir.display(),
                    catalog.available_names()
                ),
            )
        })?;
        for _ in 0..copies {
            let instance = instantiate_library(config, library)?;
            stages.push(Stage::new(name.to_string(), library.version.clone(), instance));
        }
        Ok(Chain::assemble(config, stages, Vec::new()))
    }

    fn assemble(config: &Config, stages: Vec<Stage>, view: Vec<Stage>) -> Chain {
        // An ingest plugin is required by nature: what it guards (a redaction) is stored.
        let required = config.required.iter().chain(&config.ingest).cloned().collect();
        Chain {
            parts: Arc::new(ChainParts {
                ingest: Vec::new(),
                stages,
                view,
                on_error: config.on_plugin_error,
                required,
                deadline: (config.plugin_timeout_ms > 0)
                    .then(|| Duration::from_millis(config.plugin_timeout_ms)),
                runs: Pool::new(),
                models: config.models.clone(),
            }),
        }
    }

    /// The deadline of one plugin call (`plugin_timeout_ms`), if any.
    pub fn deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// The quarantined plugins, ingest, chain then view (what health reports).
    pub fn quarantined(&self) -> Vec<&str> {
        self.ingest
            .iter()
            .chain(&self.stages)
            .chain(&self.view)
            .filter(|s| s.is_quarantined())
            .map(|s| s.name.as_str())
            .collect()
    }

    /// The chain's plugin names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.stages.iter().map(|s| s.name.as_str()).collect()
    }

    /// The view's plugin names, in order.
    pub fn view_names(&self) -> Vec<&str> {
        self.view.iter().map(|s| s.name.as_str()).collect()
    }

    /// Whether the chain has ingest stages.
    pub fn has_ingest(&self) -> bool {
        !self.ingest.is_empty()
    }

    /// Runs the ingest stages on `messages`, the messages entering a session this turn (or
    /// every message of a stateless call), before anything is stored (docs/chain.md#ingest).
    /// An ingest plugin rewrites messages: its output must be its input's messages, in
    /// order, each the same message or a changed copy of it. Any fault fails the call,
    /// whatever `on_plugin_error` says: unredacted text must never be stored or sent.
    /// Messages need their identities ([`turns::stamp_entering`] or [`turns::prepare`]).
    pub fn ingest(
        &self,
        messages: Vec<RArc<Message>>,
        ctx: &Context,
    ) -> Result<(Vec<RArc<Message>>, Vec<StageReport>), PluginFailure> {
        tokens::with_media_rules(self.media_rules(&ctx.model.name), || {
            self.ingest_counted(messages, ctx)
        })
    }

    /// A call in which every message enters now (`process`, a stateless proxy request):
    /// the ingest stages run on all of them, then the chain and the view. The ingest
    /// stages' reports come first in the run's.
    pub fn run_entering(
        &self,
        mut history: Vec<RArc<Message>>,
        ctx: &Context,
        previous: Option<&[RArc<Message>]>,
    ) -> Result<ChainRun, PluginFailure> {
        if self.ingest.is_empty() {
            return self.run_compared(history, ctx, Call::Process, previous);
        }
        turns::prepare(&mut history, ctx.turn);
        let messages_in = history.len();
        let (history, mut stages) = self.ingest(history, ctx)?;
        let mut run = self.run_compared(history, ctx, Call::Process, previous)?;
        stages.append(&mut run.stages);
        run.stages = stages;
        run.messages_in = messages_in;
        Ok(run)
    }

    /// The rules a run on model `name` counts images and documents by
    /// (docs/configuration.md#models): the host's counts and the plugins' counts through
    /// the host services during the run ([`tokens::with_media_rules`]).
    pub fn media_rules(&self, name: &str) -> MediaRules {
        crate::config::media_rules(&self.models, name)
    }

    /// Runs every plugin in order, checking each output (docs/chain.md#the-output-check) and handling faults by
    /// `on_plugin_error` and `required`. Message turns and identities are derived once, here,
    /// before the first plugin (docs/wire-format.md#turns).
    pub fn run(
        &self,
        history: Vec<RArc<Message>>,
        ctx: &Context,
        call: Call<'_>,
    ) -> Result<ChainRun, PluginFailure> {
        self.run_compared(history, ctx, call, None)
    }

    /// [`Chain::run`], also reporting per stage and for the final history how much of
    /// `previous` (the previous turn's sent history) is kept byte for byte: `prefix_kept`,
    /// what each plugin costs the provider's prompt cache.
    pub fn run_compared(
        &self,
        history: Vec<RArc<Message>>,
        ctx: &Context,
        call: Call<'_>,
        previous: Option<&[RArc<Message>]>,
    ) -> Result<ChainRun, PluginFailure> {
        tokens::with_media_rules(self.media_rules(&ctx.model.name), || {
            self.run_counted(history, ctx, call, previous, false)
        })
    }

    /// [`Chain::run`] with every stage run whatever `on_plugin_error` and `required` say
    /// (the sample runs of `agentctl check` and of a reload, which report every fault).
    pub(crate) fn run_every_stage(
        &self,
        history: Vec<RArc<Message>>,
        ctx: &Context,
        call: Call<'_>,
    ) -> Result<ChainRun, PluginFailure> {
        tokens::with_media_rules(self.media_rules(&ctx.model.name), || {
            self.run_counted(history, ctx, call, None, true)
        })
    }
}

impl ChainParts {
    /// Whether `name` is required: its fault fails the turn whatever `on_error` says.
    pub fn is_required(&self, name: &str) -> bool {
        self.required.iter().any(|n| n == name)
    }
}

/// Instantiates the stages of one list (`chain` or `view`), each with its table.
fn load_stages(
    config: &Config,
    catalog: &Catalog,
    list: &str,
    names: &[String],
) -> Result<Vec<Stage>, ConfigError> {
    let mut stages = Vec::with_capacity(names.len());
    for name in names {
        if let Some(program) = catalog.program(name) {
            stages.push(load_program(config, list, program)?);
            continue;
        }
        if config.is_isolated(name) {
            stages.push(load_isolated(config, catalog, list, name)?);
            continue;
        }
        let library = catalog.library(name).map_err(|unavailable| {
            let line = config.history_key_line(list);
            let message = match unavailable {
                Unavailable::Refused(refusal) => {
                    format!("plugin \"{name}\" in the {list} cannot be loaded: {refusal}")
                }
                Unavailable::Missing => format!(
                    "plugin \"{name}\" in the {list} is not available in {} (available: {})",
                    config.plugin_dir.display(),
                    catalog.available_names()
                ),
            };
            config.error(line, message)
        })?;
        stages.push(Stage::new(
            name.clone(),
            library.version.clone(),
            instantiate_library(config, library)?,
        ));
    }
    Ok(stages)
}

/// A process plugin's stage: its program started and its table accepted
/// (docs/process-plugins.md#the-handshake). A refusal of the table is the same error a
/// library's is.
fn load_program(config: &Config, list: &str, program: &ProgramFile) -> Result<Stage, ConfigError> {
    let name = program.name.as_str();
    let cannot_load = |why: &str| {
        config.error(
            config.history_key_line(list),
            format!("plugin \"{name}\" in the {list} cannot be loaded: {why}"),
        )
    };
    let manifest = program.manifest.as_ref().map_err(|why| cannot_load(why))?;
    let load = load_context(config, name);
    match ProcessPlugin::start(manifest, &load.config_json, load.agent_max_ctx, &load.models) {
        Ok(plugin) => Ok(Stage::process(name.to_string(), plugin)),
        Err(ProcessStart::Config(err)) => Err(table_error(config, name, &err)),
        Err(ProcessStart::Failed(why)) => Err(cannot_load(&format!("{}: {why}", program.path.display()))),
    }
}

/// An isolated stage (`[history] isolate`): its first worker started, which loads the
/// library named for it in `plugin_dir` (never mapped here) and builds the plugin with its
/// table. The errors are the ones an in-process load gives, and a worker that dies while
/// it loads is this plugin's refusal.
fn load_isolated(config: &Config, catalog: &Catalog, list: &str, name: &str) -> Result<Stage, ConfigError> {
    let cannot_load = |why: String| {
        config.error(
            config.history_key_line(list),
            format!("plugin \"{name}\" in the {list} cannot be loaded: {why}"),
        )
    };
    let Some(file) = catalog.file(name) else {
        return Err(config.error(
            config.history_key_line(list),
            format!(
                "plugin \"{name}\" in the {list} is not available in {} (available: {})",
                config.plugin_dir.display(),
                catalog.available_names()
            ),
        ));
    };
    if let Some(refusal) = file.refusal() {
        return Err(cannot_load(refusal.to_string()));
    }
    let load = load_context(config, name);
    let request = LoadRequest {
        config_json: &load.config_json,
        agent_max_ctx: load.agent_max_ctx,
        models: &load.models,
    };
    match IsolatedPlugin::start(name, &file.target, request) {
        Ok(plugin) => Ok(Stage::isolated(name.to_string(), plugin)),
        Err(StartFailure::NoCommand) => Err(config.error(
            config.history_key_line("isolate"),
            format!("plugin \"{name}\" is isolated, but this program cannot run worker processes (history-host and agentctl can)"),
        )),
        Err(StartFailure::Refused { reason, detail }) => {
            if !detail.is_empty() {
                tracing::debug!("{}: {detail}", file.path.display());
            }
            Err(cannot_load(format!("refused plugin library {}: {reason}", file.path.display())))
        }
        Err(StartFailure::Config(err)) => Err(table_error(config, name, &err)),
        Err(StartFailure::Failed(why) | StartFailure::Late(why)) => {
            Err(cannot_load(format!("{}: {why}", file.path.display())))
        }
    }
}

fn log_events(plugin: &str, events: &[Event]) {
    for event in events {
        tracing::debug!(
            plugin,
            event = event.kind.as_str(),
            turn = event.turn,
            index = ?event.index.into_option(),
            id = ?event.id.as_ref().into_option().map(|s| echo::bare(s)),
            tokens_saved = ?event.tokens_saved.into_option(),
            "{}",
            echo::text(&event.reason)
        );
    }
}

/// The [`Context`] of a stateless call on `model` at `turn`.
pub fn stateless_context(config: &Config, model: ModelInfo, turn: u64) -> Context {
    Context {
        session_id: ROption::RNone,
        effective_ctx: model.effective_ctx,
        model,
        agent_max_ctx: config.agent_max_ctx,
        turn,
        last_active: ROption::RNone,
        expiration_override: ROption::RNone,
        services: services::SERVICES,
    }
}

/// The chain a service runs, swappable while turns run: a turn takes the current chain
/// ([`SharedChain::current`]) and runs wholly on it, while a reload puts a new one in
/// place ([`SharedChain::replace`]) for the turns that start after.
pub struct SharedChain {
    current: std::sync::RwLock<std::sync::Arc<Chain>>,
}

impl SharedChain {
    pub fn new(chain: Chain) -> SharedChain {
        SharedChain {
            current: std::sync::RwLock::new(std::sync::Arc::new(chain)),
        }
    }

    /// The chain to run a turn on.
    pub fn current(&self) -> std::sync::Arc<Chain> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `chain` in place for the turns that start from now on; returns the old one
    /// (turns running on it finish on it).
    pub fn replace(&self, chain: Chain) -> std::sync::Arc<Chain> {
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(&mut *current, std::sync::Arc::new(chain))
    }
}

/// The previous turn's sent history, which `prefix_kept` (docs/plugins.md#token_budget)
/// is measured against: the index of the first message of a history whose bytes (compact
/// JSON, [`history_wire::chat::message_to_string`]) differ from the previous one's. A
/// message past either end differs; two equal histories give their length.
///
/// Bytes are compared only where they must be: a message that is the previous one itself
/// (shared from turn to turn, as most are) or equal to it field by field (as a session
/// read back from its store is) is written the same, since the writer writes the fields
/// and nothing else (turn and identity are not on the wire). Only a pair that differs
/// in its fields is written and compared, which ends the prefix either way.
pub(crate) struct PreviousSent<'a> {
    messages: &'a [RArc<Message>],
    bytes: Vec<std::cell::OnceCell<String>>,
    /// The last message of a compared history that was written, and its bytes.
    current: std::cell::RefCell<Option<(RArc<Message>, String)>>,
}

impl<'a> PreviousSent<'a> {
    pub(crate) fn new(messages: &'a [RArc<Message>]) -> PreviousSent<'a> {
        PreviousSent {
            messages,
            bytes: messages.iter().map(|_| std::cell::OnceCell::new()).collect(),
            current: std::cell::RefCell::new(None),
        }
    }

    pub(crate) fn kept(&self, history: &[RArc<Message>]) -> usize {
        history
            .iter()
            .zip(self.messages)
            .zip(&self.bytes)
            .take_while(|((message, previous), bytes)| {
                std::ptr::eq::<Message>(&***message, &***previous)
                    || ***message == ***previous
                    || bytes
                        .get_or_init(|| history_wire::chat::message_to_string(previous))
                        .as_str()
                        == &*self.written(message)
            })
            .count()
    }

    /// `message`'s bytes; the last one written is kept (with the message, so its
    /// address stays its own): the stages of a run mostly end the prefix at the same
    /// message, the turn's first new one, and writing it for each was a tenth of a
    /// serve turn's instructions.
    fn written(&self, message: &RArc<Message>) -> std::cell::Ref<'_, str> {
        let same = self
            .current
            .borrow()
            .as_ref()
            .is_some_and(|(kept, _)| std::ptr::eq::<Message>(&**kept, &**message));
        if !same {
            *self.current.borrow_mut() =
                Some((message.clone(), history_wire::chat::message_to_string(message)));
        }
        std::cell::Ref::map(self.current.borrow(), |current| {
            current.as_ref().map_or("", |(_, text)| text.as_str())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_can_serve_many_threads() {
        fn shared_across_threads<T: Send + Sync>() {}
        shared_across_threads::<Chain>();
        shared_across_threads::<SharedChain>();
    }

    #[test]
    fn prefix_kept_is_the_first_index_whose_bytes_differ() {
        let parse = |json: &str| history_wire::chat::history_from_str(json).unwrap();
        let history = parse(
            r#"[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]"#,
        );
        // The same messages, and equal ones parsed apart: shared or not, the bytes count.
        let parsed_apart = parse(
            r#"[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]"#,
        );
        for previous in [&history, &parsed_apart] {
            let previous = PreviousSent::new(previous);
            assert_eq!(previous.kept(&history), 3);
            assert_eq!(previous.kept(&history[..1]), 1, "the output is shorter");
        }
        assert_eq!(
            PreviousSent::new(&history[..2]).kept(&history),
            2,
            "new messages after the previous ones"
        );
        let changed = parse(
            r#"[{"role":"user","content":"a"},{"role":"assistant","content":"B"},{"role":"user","content":"c"}]"#,
        );
        assert_eq!(PreviousSent::new(&changed).kept(&history), 1);
        assert_eq!(PreviousSent::new(&[]).kept(&history), 0);
        // A shared message whose turn (not on the wire) was set apart is still the same bytes.
        let mut turned = history.clone();
        plugin_api::RArc::make_mut(&mut turned[1]).turn = 9;
        assert_eq!(PreviousSent::new(&history).kept(&turned), 3);
    }
}
