//! Loading a plugin library in a child process, to learn what it is without risking the
//! caller.
//!
//! Mapping a library runs its constructors and trusts its headers: a library that
//! crashes, aborts, exits or hangs while it loads takes the loading process with it. What
//! looks at every file in `plugin_dir` (`agentctl plugins` and `check`, a reload's
//! discovery) loads each one in a child instead, with a timeout, and a child that dies or
//! does not answer is that library's refusal ("the library crashed the probe (signal 7
//! SIGBUS)"); the caller carries on.
//!
//! The engine does not know which binary it runs in. The binary offers a hidden
//! subcommand that calls [`answer`], and hands [`Prober::new`] its own path and that
//! subcommand: the child is run as `PROGRAM ARGS… LIBRARY [CONFIG]` and prints one JSON
//! line (the plugin's name, version and summary — and with `CONFIG`, whether its `new`
//! accepts its `[plugin.NAME]` table — or why the library is refused).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::config::Config;
use crate::library::{instantiate_library, PluginLibrary, Refusal};

/// The key that marks the child's answer among whatever else a library prints.
const MARK: &str = "history_probe";

/// How long a child may take to load a library, unless [`Prober::timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the probe: a program (the binary itself) and the arguments that select its probe
/// subcommand.
#[derive(Debug, Clone)]
pub struct Prober {
    program: PathBuf,
    args: Vec<OsString>,
    timeout: Duration,
}

/// What a child learned from a library that loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probed {
    /// The exported chain name.
    pub name: String,
    pub version: String,
    /// The one-line summary of its description.
    pub summary: String,
    /// The keys its table accepts, each with its meaning (its description).
    pub config_keys: Vec<(String, String)>,
    /// With a configuration: the plugin's `new` refused its table, in one line.
    pub config_error: Option<String>,
}

impl Prober {
    /// A prober that runs `program` with `args`, then the library and, if any, the
    /// configuration file.
    pub fn new<A: Into<OsString>>(program: impl Into<PathBuf>, args: impl IntoIterator<Item = A>) -> Prober {
        Prober {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The longest a child may take before it is stopped and the library refused.
    pub fn timeout(mut self, timeout: Duration) -> Prober {
        self.timeout = timeout;
        self
    }

    /// Loads `library` in a child process (and with `config`, instantiates it with its
    /// table). Nothing is mapped in this process. A child that crashes, exits without
    /// answering or outlives the timeout is the library's refusal.
    pub fn probe(&self, library: &Path, config: Option<&Path>) -> Result<Probed, Refusal> {
        let refuse = |reason: String, detail: Option<String>| Refusal {
            path: library.to_path_buf(),
            reason,
            detail,
        };
        let mut command = Command::new(&self.program);
        command.args(&self.args).arg(library);
        if let Some(config) = config {
            command.arg(config);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| {
                refuse(
                    format!("cannot run the probe {}: {err}", self.program.display()),
                    None,
                )
            })?;
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());

        let deadline = Instant::now() + self.timeout;
        let mut pause = Duration::from_millis(2);
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Ok(status),
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break Err(format!(
                        "the library did not finish loading within {} ms (the probe was stopped)",
                        self.timeout.as_millis()
                    ));
                }
                Ok(None) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Err(err) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break Err(format!("cannot wait for the probe: {err}"));
                }
            }
        };
        let status = status.map_err(|reason| refuse(reason, None))?;
        // A grandchild could hold the pipes open: the output is waited for only briefly.
        let output = stdout.recv_timeout(Duration::from_secs(1)).unwrap_or_default();
        let errors = stderr.recv_timeout(Duration::from_secs(1)).unwrap_or_default();
        if status.success() {
            if let Some(answer) = parse_answer(&output) {
                return answer.map_err(|(reason, detail)| refuse(reason, detail));
            }
        }
        Err(refuse(died(status, &errors), None))
    }

    /// [`Prober::probe`] for every library, a few children at a time; the results in the
    /// order of `libraries`.
    pub fn probe_all(&self, libraries: &[&Path], config: Option<&Path>) -> Vec<Result<Probed, Refusal>> {
        let width = std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(2, 8);
        let mut results = Vec::with_capacity(libraries.len());
        for batch in libraries.chunks(width) {
            std::thread::scope(|scope| {
                let running: Vec<_> = batch
                    .iter()
                    .map(|library| scope.spawn(move || self.probe(library, config)))
                    .collect();
                for (library, thread) in batch.iter().zip(running) {
                    results.push(thread.join().unwrap_or_else(|_| {
                        Err(Refusal {
                            path: library.to_path_buf(),
                            reason: "the probe failed".into(),
                            detail: None,
                        })
                    }));
                }
            });
        }
        results
    }
}

/// Reads a child's pipe to its end on a thread; the text arrives on the channel.
fn drain(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<String> {
    let (send, receive) = mpsc::channel();
    if let Some(mut pipe) = pipe {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            let _ = send.send(String::from_utf8_lossy(&bytes).into_owned());
        });
    }
    receive
}

type Answer = Result<Probed, (String, Option<String>)>;

/// The child's answer: the last line of its output that carries the mark.
fn parse_answer(output: &str) -> Option<Answer> {
    let value = output
        .lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<Value>(line.trim()).ok())
        .find(|value| value.get(MARK).is_some())?;
    let text = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_string);
    if let Some(reason) = text("refused") {
        return Some(Err((reason, text("detail"))));
    }
    Some(Ok(Probed {
        name: text("name")?,
        version: text("version")?,
        summary: text("summary").unwrap_or_default(),
        config_keys: value
            .get("config_keys")
            .and_then(Value::as_array)
            .map(|keys| {
                keys.iter()
                    .filter_map(|pair| Some((pair[0].as_str()?.to_string(), pair[1].as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default(),
        config_error: text("config_error"),
    }))
}

/// Why a child that gave no answer ended, in one line.
fn died(status: ExitStatus, errors: &str) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return match signal_name(signal) {
                Some(name) => format!("the library crashed the probe (signal {signal} {name})"),
                None => format!("the library crashed the probe (signal {signal})"),
            };
        }
    }
    let last = errors.lines().map(str::trim).rfind(|line| !line.is_empty());
    let code = status
        .code()
        .map_or_else(|| "unknown".to_string(), |c| c.to_string());
    match last {
        Some(line) => format!("the library ended the probe (exit status {code}) before it answered: {line}"),
        None => format!("the library ended the probe (exit status {code}) before it answered"),
    }
}

#[cfg(unix)]
pub(crate) fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        libc::SIGBUS => "SIGBUS",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGSYS => "SIGSYS",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        _ => return None,
    })
}

/// The child's side: loads `library` (and with `config`, instantiates its plugin with its
/// table), prints the answer as one JSON line and returns the exit status. A binary's
/// hidden probe subcommand calls this and exits with what it returns.
pub fn answer(library: &Path, config: Option<&Path>) -> ExitCode {
    let answer = match PluginLibrary::load(library) {
        Err(refusal) => json!({ MARK: 1, "refused": refusal.reason, "detail": refusal.detail }),
        Ok(library) => {
            let config_error = config.and_then(|file| {
                Config::load(file)
                    .map_err(|err| err.to_string())
                    .and_then(|config| {
                        instantiate_library(&config, &library)
                            .map(drop)
                            .map_err(|err| err.to_string())
                    })
                    .err()
            });
            json!({
                MARK: 1,
                "name": library.name,
                "version": library.version,
                "summary": library.description.summary.as_str(),
                "config_keys": library
                    .description
                    .config_keys
                    .iter()
                    .map(|key| [key.name.as_str(), key.meaning.as_str()])
                    .collect::<Vec<_>>(),
                "config_error": config_error,
            })
        }
    };
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{answer}").and_then(|_| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn shell(script: &str) -> Prober {
        // `sh -c SCRIPT sh LIBRARY`: the library is `$1`.
        Prober::new("sh", ["-c", script, "sh"])
    }

    #[test]
    fn an_answer_is_read_among_other_output() {
        let prober = shell(
            r#"echo 'constructor noise'; echo "{\"history_probe\":1,\"name\":\"x\",\"version\":\"0.1.0\",\"summary\":\"$1\"}"; echo trailing"#,
        );
        let probed = prober.probe(Path::new("/some/lib.so"), None).unwrap();
        assert_eq!(probed.name, "x");
        assert_eq!(probed.summary, "/some/lib.so");
        assert_eq!(probed.config_error, None);
    }

    #[test]
    fn a_refusal_is_passed_on() {
        let prober = shell(r#"echo '{"history_probe":1,"refused":"truncated","detail":"more"}'"#);
        let refusal = prober.probe(Path::new("/lib.so"), None).unwrap_err();
        assert_eq!(refusal.reason, "truncated");
        assert_eq!(refusal.detail.as_deref(), Some("more"));
        assert_eq!(refusal.path, Path::new("/lib.so"));
    }

    #[test]
    fn a_child_killed_by_a_signal_is_named_with_it() {
        let refusal = shell("kill -BUS $$")
            .probe(Path::new("/lib.so"), None)
            .unwrap_err();
        assert_eq!(
            refusal.reason,
            format!("the library crashed the probe (signal {} SIGBUS)", libc::SIGBUS)
        );
    }

    #[test]
    fn a_child_that_exits_without_answering_is_refused_with_its_last_words() {
        let refusal = shell("echo 'going away' >&2; exit 3")
            .probe(Path::new("/lib.so"), None)
            .unwrap_err();
        assert_eq!(
            refusal.reason,
            "the library ended the probe (exit status 3) before it answered: going away"
        );
        let refusal = shell("exit 0").probe(Path::new("/lib.so"), None).unwrap_err();
        assert_eq!(
            refusal.reason,
            "the library ended the probe (exit status 0) before it answered"
        );
    }

    #[test]
    fn a_child_that_hangs_is_stopped() {
        let started = Instant::now();
        let refusal = shell("exec sleep 30")
            .timeout(Duration::from_millis(200))
            .probe(Path::new("/lib.so"), None)
            .unwrap_err();
        assert_eq!(
            refusal.reason,
            "the library did not finish loading within 200 ms (the probe was stopped)"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_probe_that_cannot_run_is_a_refusal() {
        let refusal = Prober::new("/nonexistent/probe", Vec::<String>::new())
            .probe(Path::new("/lib.so"), None)
            .unwrap_err();
        assert!(
            refusal
                .reason
                .starts_with("cannot run the probe /nonexistent/probe"),
            "{refusal}"
        );
    }

    #[test]
    fn many_libraries_are_probed_in_order() {
        let prober = shell(r#"echo "{\"history_probe\":1,\"name\":\"$(basename $1)\",\"version\":\"1\"}""#);
        let paths: Vec<PathBuf> = (0..11).map(|i| PathBuf::from(format!("/d/n{i}"))).collect();
        let libraries: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
        let names: Vec<String> = prober
            .probe_all(&libraries, None)
            .into_iter()
            .map(|r| r.unwrap().name)
            .collect();
        let expected: Vec<String> = (0..11).map(|i| format!("n{i}")).collect();
        assert_eq!(names, expected);
    }
}
