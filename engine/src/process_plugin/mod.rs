//! Process plugins (docs/process-plugins.md): a plugin that is a program in any language,
//! named by a manifest `NAME.plugin.toml` in `plugin_dir` ([`manifest`]), speaking JSON
//! lines on its stdin and stdout ([`protocol`]). It is one more kind of stage plugin: the
//! chain calls it where it would call a library, so the output check, `plugin_timeout_ms`,
//! `on_plugin_error`, `required`, events and quarantine apply unchanged.
//!
//! The host starts the program once per stage and keeps it. As with isolated workers
//! (`crate::isolate`): a call that finds it dead starts it again; a death during a call is
//! that call's fault; past the deadline it is killed — and, unlike a worker, the stage is
//! also quarantined, since a program that hung once is expected to hang again and each
//! restart costs an interpreter's start (docs/process-plugins.md#faults). Calls of
//! several sessions at once take turns on the one process. Its stderr goes to the host's
//! log, a line at a time, under the plugin's name.

pub mod manifest;
pub mod protocol;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use plugin_api::{echo, Context, LogLevel, Message, ModelInfo, Output, RArc};

use manifest::Manifest;
use protocol::Line;

/// How long a program may take to start and answer the hello at load, or at a restart in
/// a call without a deadline.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How a call's error about a dead program ends.
const NEXT_CALL: &str = "it is started again at the next call";

/// Why a program did not start (at load: a configuration error).
#[derive(Debug)]
pub(crate) enum StartFailure {
    /// The plugin refused its `[plugin.NAME]` table.
    Config(plugin_api::ConfigError),
    /// It could not be run, died, broke the protocol or was late.
    Failed(String),
}

/// A call's fault; `late` when it ran past the deadline (the program was killed and the
/// stage is to be quarantined).
#[derive(Debug)]
pub(crate) struct CallFailure {
    pub(crate) message: String,
    pub(crate) late: bool,
}

/// A process plugin of a stage: its manifest, its hello, the running program.
pub(crate) struct ProcessPlugin {
    name: String,
    version: String,
    manifest: Manifest,
    hello: String,
    running: Mutex<Option<Running>>,
    starts: AtomicU64,
    calls: AtomicU64,
}

/// The running program: its stdin, and its stdout's lines from a reader thread (so a read
/// can wait with a deadline). Dropping it kills and reaps the program.
struct Running {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Running {
    /// How the program ended, in words, giving it a moment to finish dying.
    fn ended(&mut self) -> String {
        let waited = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return describe(status),
                Ok(None) if waited.elapsed() < Duration::from_secs(2) => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                _ => return "closed its stdout and was killed".to_string(),
            }
        }
    }
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (_, Some(signal)) => format!("was killed by signal {signal}"),
        _ => "ended".to_string(),
    }
}

impl ProcessPlugin {
    /// Starts `manifest`'s program and has it accept its table: the plugin, with its first
    /// process kept for the first call.
    pub(crate) fn start(
        manifest: &Manifest,
        config_json: &str,
        agent_max_ctx: u64,
        models: &[ModelInfo],
    ) -> Result<ProcessPlugin, StartFailure> {
        let mut plugin = ProcessPlugin {
            name: manifest.name.clone(),
            version: String::new(),
            manifest: manifest.clone(),
            hello: protocol::hello(&manifest.name, config_json, agent_max_ctx, models),
            running: Mutex::new(None),
            starts: AtomicU64::new(0),
            calls: AtomicU64::new(0),
        };
        let (running, version) = plugin.spawn(Instant::now() + START_TIMEOUT)?;
        plugin.version = version;
        *plugin.running.get_mut().unwrap_or_else(|e| e.into_inner()) = Some(running);
        Ok(plugin)
    }

    pub(crate) fn version(&self) -> &str {
        &self.version
    }

    /// How many times its program was started (the first included).
    pub(crate) fn starts(&self) -> u64 {
        self.starts.load(Ordering::Relaxed)
    }

    /// Runs the program, sends the hello and waits for its `ready` by `deadline`.
    fn spawn(&self, deadline: Instant) -> Result<(Running, String), StartFailure> {
        let program = &self.manifest.command[0];
        let dir = self.manifest.path.parent().unwrap_or(std::path::Path::new("."));
        let mut child = Command::new(program)
            .args(&self.manifest.command[1..])
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| StartFailure::Failed(format!("cannot run {}: {e}", echo::quoted(program))))?;
        self.starts.fetch_add(1, Ordering::Relaxed);
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(StartFailure::Failed("its pipes could not be opened".into()));
        };
        let (send, lines) = std::sync::mpsc::channel();
        let name = self.name.clone();
        let _ = std::thread::Builder::new()
            .name(format!("plugin-{name}-out"))
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if send.send(line).is_err() {
                        break;
                    }
                }
            });
        let last_words = std::sync::Arc::new(Mutex::new(String::new()));
        let last = last_words.clone();
        let _ = std::thread::Builder::new()
            .name(format!("plugin-{name}-err"))
            .spawn(move || {
                // stderr into the host's log, a line at a time (docs/process-plugins.md#logs).
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    crate::logging::log_plugin_line(&name, LogLevel::Warn, &line);
                    if !line.trim().is_empty() {
                        *last.lock().unwrap_or_else(|e| e.into_inner()) = line;
                    }
                }
            });
        let mut running = Running { child, stdin, lines };
        // A program that dies before it is ready usually said why on stderr (a traceback's
        // last line): the refusal carries it.
        let said = || {
            std::thread::sleep(Duration::from_millis(20));
            let line = last_words.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if line.is_empty() {
                String::new()
            } else {
                format!(" (its stderr's last line: {})", echo::text(&line))
            }
        };
        let mut hello = self.hello.clone();
        hello.push('\n');
        if running
            .stdin
            .write_all(hello.as_bytes())
            .and_then(|_| running.stdin.flush())
            .is_err()
        {
            return Err(StartFailure::Failed(format!(
                "{} before its hello",
                running.ended()
            )));
        }
        loop {
            let wait = deadline.saturating_duration_since(Instant::now());
            let line = match running.lines.recv_timeout(wait) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(StartFailure::Failed(format!(
                        "it did not answer the hello within {} ms and was killed",
                        START_TIMEOUT.as_millis()
                    )))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let ended = running.ended();
                    return Err(StartFailure::Failed(format!(
                        "it {ended} before it was ready{}",
                        said()
                    )));
                }
            };
            match protocol::read_line(&line, &[]) {
                Ok(Line::Ready { version }) => return Ok((running, version)),
                Ok(Line::ConfigError { key, message }) => {
                    return Err(StartFailure::Config(plugin_api::ConfigError {
                        key: key.into(),
                        message: message.into(),
                    }))
                }
                Ok(Line::Log { level, message }) => {
                    crate::logging::log_plugin_line(&self.name, level, &message)
                }
                Ok(_) => {
                    return Err(StartFailure::Failed(
                        "it answered the hello with a call's answer".into(),
                    ))
                }
                Err(why) => return Err(StartFailure::Failed(format!("it {why}"))),
            }
        }
    }

    /// Calls the plugin: `process`, or with `switch` `on_model_switch`, within `limit`.
    pub(crate) fn call(
        &self,
        history: &[RArc<Message>],
        ctx: &Context,
        switch: Option<(&ModelInfo, &ModelInfo)>,
        limit: Option<Duration>,
    ) -> Result<Output, CallFailure> {
        let fault = |message: String| CallFailure { message, late: false };
        let mut guard = self.running.lock().unwrap_or_else(|e| e.into_inner());
        // The deadline starts once it is this call's turn on the process.
        let deadline = limit.map(|limit| Instant::now() + limit);
        let alive = guard
            .take()
            .and_then(|mut running| matches!(running.child.try_wait(), Ok(None)).then_some(running));
        let mut running = match alive {
            Some(running) => running,
            None => match self.spawn(deadline.unwrap_or_else(|| Instant::now() + START_TIMEOUT)) {
                Ok((running, _)) => running,
                Err(StartFailure::Config(err)) => {
                    return Err(fault(format!(
                        "restarted, it refused its table: {}: {}",
                        echo::bare(&err.key),
                        echo::text(&err.message)
                    )))
                }
                Err(StartFailure::Failed(why)) => return Err(fault(format!("{why}; {NEXT_CALL}"))),
            },
        };
        let id = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let request = protocol::call(id, history, ctx, switch);
        if running
            .stdin
            .write_all(request.as_bytes())
            .and_then(|_| running.stdin.flush())
            .is_err()
        {
            return Err(fault(format!(
                "its process {} during the call; {NEXT_CALL}",
                running.ended()
            )));
        }
        loop {
            let line = match deadline {
                Some(deadline) => running
                    .lines
                    .recv_timeout(deadline.saturating_duration_since(Instant::now())),
                None => running.lines.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            let line = match line {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => {
                    let pid = running.child.id();
                    drop(running);
                    return Err(CallFailure {
                        message: format!(
                            "did not return within {} ms (plugin_timeout_ms); its process (pid {pid}) was killed and the plugin quarantined until the chain is reloaded",
                            limit.unwrap_or_default().as_millis()
                        ),
                        late: true,
                    });
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(fault(format!(
                        "its process (pid {}) {} during the call; {NEXT_CALL}",
                        running.child.id(),
                        running.ended()
                    )))
                }
            };
            match protocol::read_line(&line, history) {
                Ok(Line::Log { level, message }) => crate::logging::log_plugin_line(&self.name, level, &message),
                Ok(Line::Result { id: answered, output }) if answered == id => {
                    *guard = Some(running);
                    return Ok(output);
                }
                Ok(Line::Error { id: answered, message }) if answered == id => {
                    *guard = Some(running);
                    return Err(fault(echo::text(&message)));
                }
                Ok(_) => {
                    return Err(fault(format!(
                        "its process answered out of turn (not call {id}'s result or error) and was killed; {NEXT_CALL}"
                    )))
                }
                // A broken line leaves the conversation in an unknown state: the process
                // is killed and started again (docs/process-plugins.md#faults).
                Err(why) => return Err(fault(format!("it {why}; it was killed and {NEXT_CALL}"))),
            }
        }
    }
}

/// Reads a call's answer line for a plugin author's test (`history-host check-plugin-output`):
/// `input_json`, a history in the host's format numbered as the host numbers it, and
/// `result_json`, one `result` line; the output resolved and put through the host's own
/// output check (`plugin_api::check`). `Err` is what the host would report.
pub fn check_result(input_json: &str, result_json: &str) -> Result<Output, String> {
    let mut input =
        history_wire::chat::history_from_str(input_json).map_err(|e| format!("the input: {e}"))?;
    for (i, message) in input.iter_mut().enumerate() {
        RArc::make_mut(message).set_origin(i as u64 + 1);
    }
    let value: serde_json::Value =
        serde_json::from_str(result_json).map_err(|e| format!("the result is not JSON: {e}"))?;
    let object = value.as_object().ok_or("the result is not a JSON object")?;
    let output = protocol::output(object, &input)?;
    let faults = plugin_api::structure::Faults::of(&input).count();
    plugin_api::check::check_stage(&input, faults, &output.history)?;
    Ok(output)
}

/// Starts `manifest`'s program with plugin `manifest.name`'s table in `config`, and ends
/// it: its version, or why it does not start or refuses its table (one line). What
/// `agentctl install` checks before it copies a process plugin.
pub fn check_program(config: &crate::Config, manifest: &Manifest) -> Result<String, String> {
    let load = crate::library::load_context(config, &manifest.name);
    match ProcessPlugin::start(manifest, &load.config_json, load.agent_max_ctx, &load.models) {
        Ok(plugin) => Ok(plugin.version().to_string()),
        Err(StartFailure::Config(err)) => Err(format!(
            "it refuses its [plugin.{}] table in {}: {}",
            manifest.name,
            config.file.display(),
            crate::library::table_error(config, &manifest.name, &err)
        )),
        Err(StartFailure::Failed(why)) => Err(why),
    }
}
