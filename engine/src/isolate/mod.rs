//! Isolated plugins (`[history] isolate`, docs/chain.md#isolation): a plugin that runs in
//! a worker process, so that its abort, exit, crash or endless call ends the worker, never
//! the host.
//!
//! The host side is [`IsolatedPlugin`]: the stage's workers, each a child process running
//! the binary's hidden worker subcommand ([`worker::serve`]) with one instance of the
//! plugin. The engine does not know which binary it runs in: the binary names its worker
//! command once, at start ([`set_worker_command`]), as it names its probe command.
//!
//! - One worker serves one call at a time; a stage keeps its idle workers for the next
//!   calls and starts another when all are busy (calls of several sessions at once), so
//!   concurrent turns never queue behind one process.
//! - A worker that dies during a call — a signal, an exit — or answers past
//!   `plugin_timeout_ms` (it is then killed) makes that call the plugin's fault, naming
//!   how it died. Nothing is restarted in the background: the next call starts a new
//!   worker, so a plugin that dies on every call costs one process start per call, never
//!   a loop. No quarantine either: a killed worker leaves nothing running.
//! - What crosses is binary ([`codec`]) in length-prefixed frames ([`framing`]); an output
//!   message that is an input message passed through comes back as its index and the
//!   host uses its own, so the output check sees what it would in-process.
//! - A plugin's `ctx.summarize()` is answered by the host: the worker sends a SUMMARIZE
//!   frame in the middle of the call, and the host answers it with its own summarizer and
//!   cache ([`crate::summarizer`], as in-process); that time is the host's, not the
//!   plugin's, so the deadline moves by it (docs/chain.md#deadline).
//! - So is its `ctx.recall()`: a RECALL frame, answered with the call's session's
//!   transcript ([`crate::recall`]); what it hands out is checked as in-process.

mod codec;
mod framing;
pub mod worker;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use plugin_api::{echo, Context, LogLevel, Message, ModelInfo, Output, RArc, RVec};

use codec::{Decoded, Decoder, Malformed};
use framing::{FrameReader, ReadFailure};

/// How long a worker may take to load its library and build its plugin at load, or in a
/// call without a deadline (a call's deadline bounds a restart and the call together).
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How a call's error about a dead worker ends.
const NEXT_CALL: &str = "a new one starts at the next call";

/// Idle workers a stage keeps; more are ended when their call is done.
const MAX_IDLE: usize = 8;

/// How a binary runs its worker: a program and the arguments that select its hidden worker
/// subcommand (`history-host worker`).
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    program: PathBuf,
    args: Vec<OsString>,
}

static WORKER_COMMAND: OnceLock<WorkerCommand> = OnceLock::new();

/// Names the command that runs a worker in this process, once, before any chain is loaded
/// (later calls change nothing). A chain that isolates a plugin cannot be loaded in a
/// process that named none.
pub fn set_worker_command<A: Into<OsString>>(program: impl Into<PathBuf>, args: impl IntoIterator<Item = A>) {
    let _ = WORKER_COMMAND.set(WorkerCommand {
        program: program.into(),
        args: args.into_iter().map(Into::into).collect(),
    });
}

/// Why an isolated plugin's first worker did not start (at load: a configuration error).
#[derive(Debug)]
pub(crate) enum StartFailure {
    /// This process named no worker command.
    NoCommand,
    /// The worker's loader refused the library (one line; a detail for debug logs).
    Refused { reason: String, detail: String },
    /// The plugin's `new` refused its table.
    Config(plugin_api::ConfigError),
    /// The worker could not be run, or died.
    Failed(String),
    /// The worker did not finish loading in time, and was killed.
    Late(String),
}

/// What a worker needs to build the plugin: the `LoadContext`'s values.
pub(crate) struct LoadRequest<'a> {
    pub(crate) config_json: &'a str,
    pub(crate) agent_max_ctx: u64,
    pub(crate) models: &'a [ModelInfo],
}

/// An isolated stage's plugin: its workers.
pub(crate) struct IsolatedPlugin {
    name: String,
    version: String,
    command: WorkerCommand,
    /// The load request's payload, sent to every worker this stage starts.
    load: Vec<u8>,
    idle: Mutex<Vec<WorkerProcess>>,
    starts: AtomicU64,
}

impl IsolatedPlugin {
    /// Starts the first worker for plugin `name` from `library`: it loads the library (the
    /// loader's checks) and builds the plugin with its table. The worker is kept for the
    /// first call.
    pub(crate) fn start(
        name: &str,
        library: &Path,
        load: LoadRequest<'_>,
    ) -> Result<IsolatedPlugin, StartFailure> {
        let command = WORKER_COMMAND.get().cloned().ok_or(StartFailure::NoCommand)?;
        let mut request = codec::Encoder::default();
        request.str(&library.to_string_lossy());
        request.str(name);
        request.str(load.config_json);
        request.u64(load.agent_max_ctx);
        request.len(load.models.len());
        for model in load.models {
            request.model(model);
        }
        let mut plugin = IsolatedPlugin {
            name: name.to_string(),
            version: String::new(),
            command,
            load: request.bytes,
            idle: Mutex::new(Vec::new()),
            starts: AtomicU64::new(0),
        };
        let (worker, version) = plugin.spawn(Instant::now() + START_TIMEOUT)?;
        plugin.version = version;
        plugin.idle_workers().push(worker);
        Ok(plugin)
    }

    /// The plugin's own version, as its worker loaded it.
    pub(crate) fn version(&self) -> &str {
        &self.version
    }

    /// How many workers this stage has started (the first one included).
    pub(crate) fn worker_starts(&self) -> u64 {
        self.starts.load(Ordering::Relaxed)
    }

    fn idle_workers(&self) -> std::sync::MutexGuard<'_, Vec<WorkerProcess>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs a worker and has it build the plugin by `deadline`; returns it with the
    /// plugin's version.
    fn spawn(&self, deadline: Instant) -> Result<(WorkerProcess, String), StartFailure> {
        let mut child = Command::new(&self.command.program)
            .args(&self.command.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|err| {
                StartFailure::Failed(format!(
                    "cannot run its worker {}: {err}",
                    self.command.program.display()
                ))
            })?;
        self.starts.fetch_add(1, Ordering::Relaxed);
        let (Some(requests), Some(answers)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(StartFailure::Failed("its worker has no pipes".into()));
        };
        framing::widen_pipe(&requests);
        framing::widen_pipe(&answers);
        let mut worker = WorkerProcess {
            child,
            requests,
            answers: FrameReader::new(answers),
        };
        let mut frame = framing::frame(framing::LOAD);
        frame.bytes.extend_from_slice(&self.load);
        if framing::send(&mut worker.requests, frame).is_err() {
            return Err(StartFailure::Failed(worker.died("while it started")));
        }
        let started = Instant::now();
        loop {
            let frame = match worker.answers.read(Some(deadline)) {
                Ok(frame) => frame,
                Err(ReadFailure::Late) => {
                    return Err(StartFailure::Late(format!(
                        "its worker (pid {}) did not finish loading the library within {} ms and was killed",
                        worker.pid(),
                        deadline.saturating_duration_since(started).as_millis()
                    )))
                }
                Err(_) => return Err(StartFailure::Failed(worker.died("while it loaded the library"))),
            };
            match self.load_answer(frame.kind(), &mut Decoder::new(frame.payload())) {
                Ok(None) => continue,
                Ok(Some(Ok(version))) => return Ok((worker, version)),
                Ok(Some(Err(failure))) => return Err(failure),
                Err(Malformed(why)) => {
                    return Err(StartFailure::Failed(format!(
                        "its worker (pid {}) answered with a broken frame ({why}) and was killed",
                        worker.pid()
                    )))
                }
            }
        }
    }

    /// One frame of a worker that loads: a log line (`None`: more to come), or how the
    /// load ended (the plugin's version, or why it failed).
    fn load_answer(
        &self,
        kind: u8,
        answer: &mut Decoder<'_>,
    ) -> Decoded<Option<Result<String, StartFailure>>> {
        let outcome = match kind {
            framing::LOG => {
                self.log(answer)?;
                None
            }
            framing::LOADED => {
                let _name = answer.str()?;
                Some(Ok(answer.str()?.to_string()))
            }
            framing::REFUSED => Some(Err(StartFailure::Refused {
                reason: answer.str()?.to_string(),
                detail: answer.str()?.to_string(),
            })),
            framing::CONFIG_ERROR => Some(Err(StartFailure::Config(plugin_api::ConfigError {
                key: answer.string()?,
                message: answer.string()?,
            }))),
            _ => return Err(Malformed(format!("an unexpected frame {kind}"))),
        };
        answer.finish()?;
        Ok(outcome)
    }

    /// Logs a plugin's line that came as a frame, under the plugin's name.
    fn log(&self, frame: &mut Decoder<'_>) -> Decoded<()> {
        let level = match frame.u8()? {
            0 => LogLevel::Error,
            1 => LogLevel::Warn,
            2 => LogLevel::Info,
            _ => LogLevel::Debug,
        };
        crate::logging::log_plugin_line(&self.name, level, frame.str()?);
        Ok(())
    }

    /// Calls the plugin in a worker: `process`, or with `switch` (old and new model)
    /// `on_model_switch`. Waits at most `limit`; past it the worker is killed. Any death
    /// of the worker is this call's error, in one line.
    pub(crate) fn call(
        &self,
        history: &[RArc<Message>],
        ctx: &Context,
        switch: Option<(&ModelInfo, &ModelInfo)>,
        limit: Option<Duration>,
    ) -> Result<Output, String> {
        // The deadline bounds the whole call, a restart of the worker included, but not the
        // host's time answering the worker's summary requests (docs/chain.md#deadline).
        let mut deadline = limit.map(|limit| Instant::now() + limit);
        let idle = self.idle_workers().pop();
        let mut worker = match idle {
            Some(worker) => worker,
            None => match self.spawn(deadline.unwrap_or_else(|| Instant::now() + START_TIMEOUT)) {
                Ok((worker, _)) => worker,
                Err(failure) => return Err(start_failure_line(failure, limit)),
            },
        };
        let mut request = framing::frame(framing::CALL);
        match switch {
            None => request.u8(0),
            Some((old, new)) => {
                request.u8(1);
                request.model(old);
                request.model(new);
            }
        }
        request.context(ctx);
        // The worker counts this call's images and documents by the run's model's rules.
        let rules = crate::tokens::current_rules().0;
        request.u8(rules.image_tokens as u8);
        request.u64(rules.image_tokens_unknown);
        request.u64(rules.document_tokens_per_page);
        request.u64(rules.audio_tokens_per_second);
        // `u64::MAX` stands for "not configured" (no count is that large).
        request.u64(rules.audio_tokens_unknown.unwrap_or(u64::MAX));
        request.len(history.len());
        for message in history {
            request.message(message);
        }
        if framing::send(&mut worker.requests, request).is_err() {
            return Err(format!("{}; {NEXT_CALL}", worker.died("during the call")));
        }
        loop {
            let frame = match worker.answers.read(deadline) {
                Ok(frame) => frame,
                Err(ReadFailure::Late) => return Err(late(worker, limit)),
                Err(_) => return Err(format!("{}; {NEXT_CALL}", worker.died("during the call"))),
            };
            let (kind, mut answer) = (frame.kind(), Decoder::new(frame.payload()));
            if kind == framing::SUMMARIZE {
                let request = summarize_request(&mut answer);
                let Ok((text, target_chars, purpose)) = request else {
                    return Err(format!(
                        "its worker (pid {}) asked for a summary in a broken frame and was killed; a new one starts at the next call",
                        worker.pid()
                    ));
                };
                // The host's own summarizer and cache, as for an in-process plugin: its
                // time is the host's (the deadline moves by it), bounded in all by
                // `[summarizer] timeout_ms` through this call's service clock.
                let asked = Instant::now();
                let summary = crate::services::summarize_text(&text, target_chars, &purpose);
                deadline = deadline.map(|d| d + asked.elapsed());
                let mut reply = framing::frame(framing::SUMMARY);
                match summary {
                    Ok(summary) => {
                        reply.u8(0);
                        reply.str(&summary);
                    }
                    Err(reason) => {
                        reply.u8(1);
                        reply.str(&reason);
                    }
                }
                if framing::send(&mut worker.requests, reply).is_err() {
                    return Err(format!("{}; {NEXT_CALL}", worker.died("during the call")));
                }
                continue;
            }
            if kind == framing::RECALL {
                let Ok(reply) = recall_reply(&mut answer, ctx, &mut deadline) else {
                    return Err(format!(
                        "its worker (pid {}) asked for a recall in a broken frame and was killed; a new one starts at the next call",
                        worker.pid()
                    ));
                };
                if framing::send(&mut worker.requests, reply).is_err() {
                    return Err(format!("{}; {NEXT_CALL}", worker.died("during the call")));
                }
                continue;
            }
            let decoded = match kind {
                framing::LOG => self.log(&mut answer).map(|_| None),
                framing::OUTPUT => decode_output(&mut answer, history).map(|output| Some(Ok(output))),
                framing::ERROR => answer.str().map(|message| Some(Err(echo::text(message)))),
                _ => Err(Malformed(format!("an unexpected frame {kind}"))),
            };
            match decoded.and_then(|outcome| answer.finish().map(|_| outcome)) {
                Ok(None) => continue,
                Ok(Some(result)) => {
                    let mut idle = self.idle_workers();
                    if idle.len() < MAX_IDLE {
                        idle.push(worker);
                    }
                    return result;
                }
                Err(Malformed(why)) => {
                    return Err(format!(
                        "its worker (pid {}) answered with a broken frame ({why}) and was killed; a new one starts at the next call",
                        worker.pid()
                    ))
                }
            }
        }
    }
}

/// The error of a call past its deadline `limit`; kills the worker.
fn late(worker: WorkerProcess, limit: Option<Duration>) -> String {
    let pid = worker.pid();
    drop(worker);
    format!(
        "did not return within {} ms (plugin_timeout_ms); its worker (pid {pid}) was killed, and a new one starts at the next call",
        limit.unwrap_or_default().as_millis()
    )
}

/// A worker's request for a summary: the text, the target in characters, the purpose.
fn summarize_request(frame: &mut Decoder<'_>) -> Decoded<(String, u64, String)> {
    let request = (frame.str()?.to_string(), frame.u64()?, frame.str()?.to_string());
    frame.finish()?;
    Ok(request)
}

/// The host's answer to a worker's RECALL frame: the session's transcript searched as
/// for an in-process plugin ([`crate::recall`]), the time it took the host's (the
/// deadline moves by it).
fn recall_reply(
    frame: &mut Decoder<'_>,
    ctx: &Context,
    deadline: &mut Option<Instant>,
) -> Decoded<codec::Encoder> {
    let (query, limit) = (frame.str()?.to_string(), frame.u64()?);
    frame.finish()?;
    let asked = Instant::now();
    let found = crate::recall::recall(ctx, &query, limit);
    *deadline = deadline.map(|d| d + asked.elapsed());
    let mut reply = framing::frame(framing::RECALLED);
    match found {
        Ok(found) => {
            reply.u8(0);
            reply.len(found.len());
            for exchange in &found {
                reply.u64(exchange.score.to_bits());
                reply.len(exchange.messages.len());
                for message in &exchange.messages {
                    reply.message(message);
                }
            }
        }
        Err(reason) => {
            reply.u8(1);
            reply.str(&reason);
        }
    }
    Ok(reply)
}

/// A worker that could not start for a call (under the deadline `limit`), in one line.
fn start_failure_line(failure: StartFailure, limit: Option<Duration>) -> String {
    let limit_ms = limit.unwrap_or_default().as_millis();
    match failure {
        StartFailure::Late(why) if limit.is_some() => {
            format!("did not return within {limit_ms} ms (plugin_timeout_ms): {why}; {NEXT_CALL}")
        }
        StartFailure::Late(why) => format!("{why}; {NEXT_CALL}"),
        StartFailure::NoCommand => "this process cannot run workers".to_string(),
        StartFailure::Refused { reason, .. } => format!("its worker refused the library: {reason}"),
        StartFailure::Config(err) => format!(
            "its worker could not build the plugin: {}: {}",
            echo::bare(&err.key),
            echo::text(&err.message)
        ),
        StartFailure::Failed(why) => format!("{why}; {NEXT_CALL}"),
    }
}

/// A call's output: each message the input's own (passed through) or one the plugin made.
fn decode_output(answer: &mut Decoder<'_>, input: &[RArc<Message>]) -> Decoded<Output> {
    let count = answer.len()?;
    let mut history = RVec::with_capacity(count);
    for _ in 0..count {
        match answer.u8()? {
            framing::SAME => {
                let index = answer.u32()? as usize;
                let message = input
                    .get(index)
                    .ok_or_else(|| Malformed(format!("input message {index} does not exist")))?;
                history.push(message.clone());
            }
            framing::MADE => history.push(answer.message()?),
            _ => return Err(Malformed("an unknown output entry".into())),
        }
    }
    let events = (0..answer.len()?)
        .map(|_| answer.event())
        .collect::<Decoded<RVec<_>>>()?;
    Ok(Output { history, events })
}

/// A worker process and its pipes. Dropping it kills and reaps it.
struct WorkerProcess {
    child: Child,
    requests: ChildStdin,
    answers: FrameReader<ChildStdout>,
}

impl WorkerProcess {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How the worker ended (its pipe closed or broke `when`), in one line. It is given a
    /// moment to finish dying; one that lingers with its pipe closed is killed.
    fn died(mut self, when: &str) -> String {
        let pid = self.pid();
        let waited = Instant::now();
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if waited.elapsed() < Duration::from_secs(2) => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                _ => break None,
            }
        };
        let how = match status {
            Some(status) => ended(status),
            None => "closed its pipe and was killed".to_string(),
        };
        format!("its worker (pid {pid}) {how} {when}")
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// How a process ended: `was killed by signal 6 (SIGABRT)`, `exited with status 1`.
fn ended(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(signal) = status.signal() {
        return match crate::probe::signal_name(signal) {
            Some(name) => format!("was killed by signal {signal} ({name})"),
            None => format!("was killed by signal {signal}"),
        };
    }
    match status.code() {
        Some(code) => format!("exited with status {code}"),
        None => "ended".to_string(),
    }
}

/// What a history costs to cross to a worker and back, for `cargo xtask bench`: encodes
/// `history` as a call does and decodes it again; returns the encoded size and the copy.
#[doc(hidden)]
pub fn codec_round_trip(history: &[RArc<Message>]) -> (usize, Vec<RArc<Message>>) {
    let mut encoder = codec::Encoder::default();
    for message in history {
        encoder.message(message);
    }
    let mut decoder = Decoder::new(&encoder.bytes);
    let copy = history.iter().filter_map(|_| decoder.message().ok()).collect();
    (encoder.bytes.len(), copy)
}
