//! Running a chain's stages (docs/chain.md#the-output-check, docs/chain.md#deadline): a
//! pass over the ingest stages, or over the chain then the view, each call's output
//! checked and each fault handled by `on_plugin_error` and `required`; under a deadline,
//! the pass on a helper thread while the caller watches the call in progress and goes on
//! from a late call's checkpoint.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use plugin_api::echo;
use plugin_api::structure::Faults;
use plugin_api::{Context, Event, Message, ModelInfo, PluginBox, RArc, RResult, RSlice};

use super::{
    log_events, Call, Chain, ChainParts, ChainRun, PluginFailure, PreviousSent, Runner, Stage, StageReport,
};
use crate::config::OnPluginError;
use crate::deadline::{Watch, Watched};
use crate::{logging, tokens, turns};

/// What a plugin call answers.
pub(super) type CallResult = Result<plugin_api::Output, String>;

impl Chain {
    /// [`Chain::ingest`] on a thread counting by the model's rules.
    pub(super) fn ingest_counted(
        &self,
        messages: Vec<RArc<Message>>,
        ctx: &Context,
    ) -> Result<(Vec<RArc<Message>>, Vec<StageReport>), PluginFailure> {
        let progress = RunProgress {
            state: RunState {
                messages_in: messages.len(),
                tokens: 0,
                faults: Faults::of(&messages).count(),
                history: messages,
            },
            stages: Vec::with_capacity(self.ingest.len()),
            ..RunProgress::default()
        };
        let progress = self.run_pass(Pass::Ingest, progress, ctx, Call::Process, None)?;
        Ok((progress.state.history, progress.stages))
    }

    /// [`Chain::run_compared`] on a thread counting by the model's rules.
    pub(super) fn run_counted(
        &self,
        mut history: Vec<RArc<Message>>,
        ctx: &Context,
        call: Call<'_>,
        previous: Option<&[RArc<Message>]>,
        every_stage: bool,
    ) -> Result<ChainRun, PluginFailure> {
        turns::prepare(&mut history, ctx.turn);
        let input_faults = Faults::of(&history);
        let input_fault_lines = input_faults.describe(&history);
        for line in &input_fault_lines {
            tracing::warn!("structural fault in the input: {line}");
        }
        let mut host_events = tokens::unknown_part_events(&history);
        for event in &mut host_events {
            event.turn = ctx.turn;
        }
        log_events("host", &host_events);
        let progress = RunProgress {
            state: RunState {
                messages_in: history.len(),
                tokens: tokens::history_tokens(ctx.model.tokenizer, &history),
                faults: input_faults.count(),
                history,
            },
            stages: Vec::with_capacity(self.stages.len() + self.view.len()),
            every_stage,
            ..RunProgress::default()
        };
        let tokens_in = progress.state.tokens;
        let RunProgress {
            state,
            stages,
            working,
            prefix_kept,
            ..
        } = self.run_pass(Pass::Main, progress, ctx, call, previous)?;
        let history = state.history;
        Ok(ChainRun {
            prefix_kept,
            working: working.unwrap_or_else(|| history.clone()),
            history,
            input_faults: input_fault_lines,
            host_events,
            stages,
            messages_in: state.messages_in,
            tokens_in,
            tokens_out: state.tokens,
        })
    }

    /// Runs the stages of `pass` over `progress`: on this thread when there is no
    /// deadline; under one, on a helper thread while this one waits, each plugin call at
    /// most `plugin_timeout_ms`. A call past it is left running, its stage quarantined and
    /// its fault handled as any other, and the run goes on from the checkpoint the helper
    /// left before that call, on another helper (docs/chain.md#deadline).
    fn run_pass(
        &self,
        pass: Pass,
        mut progress: RunProgress,
        ctx: &Context,
        call: Call<'_>,
        previous: Option<&[RArc<Message>]>,
    ) -> Result<RunProgress, PluginFailure> {
        let Some(limit) = self.deadline else {
            let previous = previous.map(PreviousSent::new);
            self.run_stages(pass, 0, &mut progress, RunEnv::here(ctx, call, previous.as_ref()))
                .map_err(Stop::into_failure)?;
            return Ok(progress);
        };
        // What the helper needs, owned: it may outlive this call.
        let shared_ctx = Arc::new(ctx.clone());
        let owned_previous = previous.map(|previous| Arc::new(previous.to_vec()));
        let owned_call = Arc::new(OwnedCall::of(call));
        // The helper counts by the run's model too (docs/configuration.md#models), and
        // the plugins' log lines carry the caller's span (a sample run's).
        let rules = tokens::current_rules().0;
        let span = tracing::Span::current();
        let mut from = 0;
        loop {
            let job = {
                let (parts, ctx, previous, call, span) = (
                    self.parts.clone(),
                    shared_ctx.clone(),
                    owned_previous.clone(),
                    owned_call.clone(),
                    span.clone(),
                );
                move |watch: &RunWatch| {
                    span.in_scope(|| {
                        tokens::with_media_rules(rules, || {
                            let previous = previous.as_deref().map(|p| PreviousSent::new(p));
                            let env = RunEnv {
                                ctx: &ctx,
                                call: call.as_call(),
                                previous: previous.as_ref(),
                                watch: Some(watch),
                            };
                            parts
                                .run_stages(pass, from, &mut progress, env)
                                .map(|()| progress)
                        })
                    })
                }
            };
            match self.runs.run(limit, job) {
                Watched::Done(result) => return result.map_err(Stop::into_failure),
                Watched::Lost(reason) => {
                    return Err(PluginFailure {
                        plugin: "host".to_string(),
                        message: reason,
                    })
                }
                Watched::Late {
                    index,
                    elapsed,
                    checkpoint,
                } => {
                    progress = checkpoint.progress;
                    // The late call still holds its input: the run goes on with a copy.
                    progress.state.history =
                        Arc::try_unwrap(checkpoint.input).unwrap_or_else(|shared| (*shared).clone());
                    let stage = self.stage_at(pass, index);
                    stage.quarantined.store(true, Ordering::Relaxed);
                    let mut report = StageReport::before(stage, &progress.state);
                    report.quarantined = true;
                    let late = Err(format!(
                        "{QUARANTINE_PREFIX} {} ms (plugin_timeout_ms); the call is left running and the plugin quarantined until the chain is reloaded",
                        limit.as_millis()
                    ));
                    report.elapsed = elapsed;
                    let previous = previous.map(PreviousSent::new);
                    let here = RunEnv::here(ctx, call, previous.as_ref());
                    self.finish_stage(pass, index, report, &mut progress, here, late)
                        .map_err(Stop::into_failure)?;
                    from = index + 1;
                }
            }
        }
    }
}

impl ChainParts {
    /// How many stages `pass` has, and its stage `index`.
    fn pass_len(&self, pass: Pass) -> usize {
        match pass {
            Pass::Ingest => self.ingest.len(),
            Pass::Main => self.stages.len() + self.view.len(),
        }
    }

    fn stage_at(&self, pass: Pass, index: usize) -> &Stage {
        match pass {
            Pass::Ingest => &self.ingest[index],
            Pass::Main if index < self.stages.len() => &self.stages[index],
            Pass::Main => &self.view[index - self.stages.len()],
        }
    }

    /// Runs stages `from..` of `pass` on this thread, each output checked
    /// (docs/chain.md#the-output-check) and each fault handled by `on_plugin_error` and
    /// `required`; with a `watch`, each in-process call under its deadline.
    fn run_stages(
        &self,
        pass: Pass,
        from: usize,
        progress: &mut RunProgress,
        env: RunEnv<'_>,
    ) -> Result<(), Stop> {
        for index in from..self.pass_len(pass) {
            if matches!(pass, Pass::Main) && index == self.stages.len() {
                progress.working = Some(progress.state.history.clone());
            }
            self.run_stage(pass, index, progress, env)?;
        }
        if matches!(pass, Pass::Main) {
            progress.prefix_kept = env
                .previous
                .map(|previous| previous.kept(&progress.state.history));
        }
        Ok(())
    }

    /// Calls stage `index` of `pass` on the current history, then [`ChainParts::finish_stage`].
    fn run_stage(
        &self,
        pass: Pass,
        index: usize,
        progress: &mut RunProgress,
        env: RunEnv<'_>,
    ) -> Result<(), Stop> {
        let RunEnv { ctx, call, watch, .. } = env;
        let stage = self.stage_at(pass, index);
        let started = Instant::now();
        let mut report = StageReport::before(stage, &progress.state);
        if report.quarantined {
            // Not called: skipped whatever on_plugin_error says, until a reload; a required
            // plugin's turn fails instead, as what it guards cannot go on without it.
            let message = format!(
                "quarantined: a call ran past plugin_timeout_ms ({} ms); not called until the chain is reloaded",
                self.deadline.unwrap_or_default().as_millis()
            );
            if progress.is_required(self, &stage.name) {
                return Err(Stop::Failed(PluginFailure {
                    plugin: stage.name.clone(),
                    message: format!("{message} (a required plugin: the turn fails)"),
                }));
            }
            tracing::warn!("plugin \"{}\" skipped: {message}", stage.name);
            report.skipped = Some(message);
            self.record(pass, index, report, progress, env.previous);
            return Ok(());
        }
        let switch = match call {
            Call::Process => None,
            Call::ModelSwitch { old, new } => Some((old, new)),
        };
        let result = match (&stage.runner, watch) {
            // Past the deadline its worker is killed: nothing is left running, so an
            // isolated plugin is not quarantined.
            (Runner::Isolated(plugin), _) => crate::deadline::with_service_clock(|| {
                plugin.call(&progress.state.history, ctx, switch, self.deadline)
            }),
            // Past the deadline its process is killed and, as a call left running would
            // be, the stage quarantined (docs/process-plugins.md#faults).
            (Runner::Process(plugin), _) => {
                let result = crate::deadline::with_service_clock(|| {
                    plugin.call(&progress.state.history, ctx, switch, self.deadline)
                });
                result.map_err(|failure| {
                    if failure.late {
                        stage.quarantined.store(true, Ordering::Relaxed);
                        report.quarantined = true;
                    }
                    failure.message
                })
            }
            // Under the deadline: the history goes into the checkpoint the waiter goes on
            // from should the call run late, and comes back without copying (the call's
            // reference is dropped before it answers).
            (Runner::InProcess(instance), Some(watch)) => {
                let input = Arc::new(std::mem::take(&mut progress.state.history));
                let checkpoint = Checkpoint {
                    progress: std::mem::take(progress),
                    input: input.clone(),
                };
                let answer = watch.call(index, checkpoint, || {
                    logging::with_plugin(&stage.name, || call_instance(instance, &input, ctx, call))
                });
                let Some((result, checkpoint)) = answer else {
                    return Err(Stop::Abandoned);
                };
                drop(checkpoint.input);
                *progress = checkpoint.progress;
                progress.state.history = Arc::try_unwrap(input).unwrap_or_else(|shared| (*shared).clone());
                result
            }
            // No deadline: the call runs here, with a service clock of its own so its
            // waiting for summaries is still bounded by `[summarizer] timeout_ms` in all.
            (Runner::InProcess(instance), None) => crate::deadline::with_service_clock(|| {
                logging::with_plugin(&stage.name, || {
                    call_instance(instance, &progress.state.history, ctx, call)
                })
            }),
        };
        report.elapsed = started.elapsed();
        self.finish_stage(pass, index, report, progress, env, result)
    }

    /// Checks a call's output and, when it passes, makes it the current history; a fault
    /// is skipped or fails the run by `on_plugin_error` (a required or ingest plugin's
    /// always fails it). Then the stage's report joins the run's.
    fn finish_stage(
        &self,
        pass: Pass,
        index: usize,
        mut report: StageReport,
        progress: &mut RunProgress,
        env: RunEnv<'_>,
        result: CallResult,
    ) -> Result<(), Stop> {
        let (stage, ctx) = (self.stage_at(pass, index), env.ctx);
        let required = progress.is_required(self, &stage.name);
        let on_error = if progress.every_stage {
            OnPluginError::Skip
        } else {
            self.on_error
        };
        let state = &mut progress.state;
        let before: Option<Vec<u64>> =
            matches!(pass, Pass::Ingest).then(|| state.history.iter().map(|m| m.origin()).collect());
        let history = &state.history;
        let checking = Instant::now();
        // Identities are unique here (assign_origins), as check_stage requires.
        let checked = result.and_then(|output| {
            let output_faults = crate::recall::check_stage(ctx, history, state.faults, &output.history)?;
            Ok((output, output_faults))
        });
        // A stage's time is its call's and its output check's.
        report.elapsed += checking.elapsed();
        match checked {
            Ok((output, output_faults)) => {
                state.history = output.history.into_iter().collect();
                state.faults = output_faults;
                state.tokens = tokens::history_tokens(ctx.model.tokenizer, &state.history);
                report.messages_out = state.history.len();
                report.tokens_out = state.tokens;
                // Events are the run's: the host fills the turn (plugin_api::Event::of).
                report.events = output
                    .events
                    .into_iter()
                    .map(|event| Event {
                        turn: ctx.turn,
                        ..event
                    })
                    .collect();
                log_events(&stage.name, &report.events);
            }
            Err(message) => match on_error {
                // A required plugin's fault fails the turn even under "skip": what it
                // guards (a redaction, say) must never be passed on without it.
                _ if required => {
                    return Err(Stop::Failed(PluginFailure {
                        plugin: stage.name.clone(),
                        message: format!("{message} (a required plugin: the turn fails)"),
                    }))
                }
                OnPluginError::Fail => {
                    return Err(Stop::Failed(PluginFailure {
                        plugin: stage.name.clone(),
                        message,
                    }))
                }
                OnPluginError::Skip => {
                    tracing::warn!("plugin \"{}\" skipped: {message}", stage.name);
                    report.skipped = Some(message);
                }
            },
        }
        if let Some(before) = before {
            let after = state.history.iter().map(|m| m.origin());
            if !after.eq(before.iter().copied()) {
                return Err(Stop::Failed(PluginFailure {
                    plugin: stage.name.clone(),
                    message: format!(
                        "an ingest plugin must return its input's {} messages in order, each \
                         unchanged or rewritten, and returned {}: it may not drop, add or \
                         reorder messages (docs/chain.md#ingest)",
                        before.len(),
                        state.history.len()
                    ),
                }));
            }
        }
        self.record(pass, index, report, progress, env.previous);
        Ok(())
    }

    /// Adds a stage's report to the run's, with what the pass tells of it.
    fn record(
        &self,
        pass: Pass,
        index: usize,
        mut report: StageReport,
        progress: &mut RunProgress,
        previous: Option<&PreviousSent>,
    ) {
        match pass {
            Pass::Ingest => report.ingest = true,
            Pass::Main => {
                report.view = index >= self.stages.len();
                report.prefix_kept = previous.map(|previous| previous.kept(&progress.state.history));
            }
        }
        progress.stages.push(report);
    }
}

impl StageReport {
    /// A stage's report before its call: the history it is given, as it is.
    fn before(stage: &Stage, state: &RunState) -> StageReport {
        StageReport {
            plugin: stage.name.clone(),
            view: false,
            ingest: false,
            messages_in: state.history.len(),
            messages_out: state.history.len(),
            tokens_in: state.tokens,
            tokens_out: state.tokens,
            events: Vec::new(),
            skipped: None,
            quarantined: stage.is_quarantined(),
            elapsed: Duration::ZERO,
            prefix_kept: None,
        }
    }
}

/// What every stage of one run is called with.
#[derive(Clone, Copy)]
struct RunEnv<'a> {
    ctx: &'a Context,
    call: Call<'a>,
    /// The previous sent history, for `prefix_kept`.
    previous: Option<&'a PreviousSent<'a>>,
    /// Under a deadline: the waiter watching this run's calls.
    watch: Option<&'a RunWatch>,
}

impl<'a> RunEnv<'a> {
    /// Stages run on this thread, with no deadline to watch: a whole run without a
    /// deadline, or a late call's stage after it.
    fn here(ctx: &'a Context, call: Call<'a>, previous: Option<&'a PreviousSent<'a>>) -> RunEnv<'a> {
        RunEnv {
            ctx,
            call,
            previous,
            watch: None,
        }
    }
}

/// Which stages a run goes through.
#[derive(Clone, Copy)]
enum Pass {
    /// `[history] ingest`, on the messages entering.
    Ingest,
    /// The chain, then the view.
    Main,
}

/// What a run carries from stage to stage, and hands between threads under a deadline.
#[derive(Default)]
struct RunProgress {
    state: RunState,
    stages: Vec<StageReport>,
    /// The chain's output, taken when the view starts.
    working: Option<Vec<RArc<Message>>>,
    /// The final history's `prefix_kept`, once the pass is done.
    prefix_kept: Option<usize>,
    /// Every stage runs, whatever `on_plugin_error` and `required` say
    /// ([`Chain::run_every_stage`]).
    every_stage: bool,
}

impl RunProgress {
    fn is_required(&self, chain: &ChainParts, name: &str) -> bool {
        !self.every_stage && chain.is_required(name)
    }
}

/// What a run leaves with its waiter while one of its plugin calls runs: the run so far,
/// and the history the call was given.
struct Checkpoint {
    progress: RunProgress,
    input: Arc<Vec<RArc<Message>>>,
}

type RunWatch = Watch<Checkpoint, Result<RunProgress, Stop>>;

/// Why stages stopped before the end.
enum Stop {
    Failed(PluginFailure),
    /// The waiter gave up on a late call and goes on without this thread.
    Abandoned,
}

impl Stop {
    fn into_failure(self) -> PluginFailure {
        match self {
            Stop::Failed(failure) => failure,
            // Only the abandoned helper sees it, and nobody reads its answer.
            Stop::Abandoned => PluginFailure {
                plugin: "host".to_string(),
                message: "the run went on without this thread".to_string(),
            },
        }
    }
}

/// How the message of a call that ran past its deadline starts.
const QUARANTINE_PREFIX: &str = "did not return within";

/// [`Call`] with its models owned, to move to a helper thread.
enum OwnedCall {
    Process,
    ModelSwitch { old: ModelInfo, new: ModelInfo },
}

impl OwnedCall {
    fn of(call: Call<'_>) -> OwnedCall {
        match call {
            Call::Process => OwnedCall::Process,
            Call::ModelSwitch { old, new } => OwnedCall::ModelSwitch {
                old: old.clone(),
                new: new.clone(),
            },
        }
    }

    fn as_call(&self) -> Call<'_> {
        match self {
            OwnedCall::Process => Call::Process,
            OwnedCall::ModelSwitch { old, new } => Call::ModelSwitch { old, new },
        }
    }
}

/// The history of a run between two stages.
#[derive(Default)]
struct RunState {
    history: Vec<RArc<Message>>,
    messages_in: usize,
    /// Tokens of `history` (the default per-message overhead).
    tokens: u64,
    /// Structural faults of `history`: no stage may add to them.
    faults: usize,
}

/// Calls one plugin instance.
fn call_instance(
    instance: &PluginBox,
    history: &[RArc<Message>],
    ctx: &Context,
    call: Call<'_>,
) -> CallResult {
    {
        let input = RSlice::from_slice(history);
        let result = match call {
            Call::Process => instance.process(input, ctx),
            Call::ModelSwitch { old, new } => instance.on_model_switch(input, ctx, old, new),
        };
        match result {
            RResult::ROk(output) => Ok(output),
            // The plugin's own words: escaped and cut, so they stay one line.
            RResult::RErr(message) => Err(echo::text(&message)),
        }
    }
}
