//! `agentctl`: shows and edits `plugins-enabled.toml` (docs/cli.md#agentctl).
//!
//! Edits keep the operator's comments and layout, are validated by the host's own rules
//! (the same parser, the plugins' own config validation) before anything is written, and
//! are written atomically. Exit status: 0 done (or all is well, for `check`; also when
//! the reader closed the pipe early); 1 refused, or `check` found a problem, with one line
//! on stderr saying what and why, the file untouched; 5 the report cannot be written; 6 a
//! plugin ended the process before agentctl was done; 64 a usage error.
//!
//! Reports go to stdout through [`Output`], never through fd 1 directly: fd 1 points at
//! stderr while plugins run, so a plugin's `println!` cannot corrupt `--json`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod install;
mod install_program;
mod report;

use clap::{Parser, Subcommand};
use history_engine::config::edit::Edit;
use history_engine::edit;
use history_engine::output::{error_line, ExitGuard, Output, USAGE_STATUS, WRITE_FAILED_STATUS};
use history_engine::{echo, logging, probe, selfcheck, Config, Prober};

const PROGRAM: &str = "agentctl";

#[derive(Parser)]
#[command(
    name = "agentctl",
    version,
    about = "Shows and edits the history plugin chain configuration (plugins-enabled.toml)",
    after_help = "Positions count from 0, and 0 is default's: `history-chain-move foo 1` puts foo right after default."
)]
struct Cli {
    /// The chain configuration to show or edit.
    #[arg(long, global = true, default_value = "plugins-enabled.toml")]
    config: PathBuf,
    /// Print the result as JSON (history-list, plugins, check; an edit prints what it did).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the chain, agent_max_ctx, max_users, the idle timeout, the models and the
    /// available plugins.
    HistoryList,
    /// Append an available plugin to the chain (or insert it at --at POS); with --view,
    /// to the view (run after the chain on what is sent; its changes are not kept).
    HistoryChainAdd {
        name: String,
        /// Position in the resulting list: in the chain 1 is right after default; in the
        /// view 0 is first.
        #[arg(long, value_name = "POS", allow_hyphen_values = true)]
        at: Option<String>,
        /// Add to `[history] view` instead of the chain.
        #[arg(long)]
        view: bool,
    },
    /// Remove a plugin from the chain or the view, whichever holds it.
    HistoryChainRemove { name: String },
    /// Move a plugin to position POS of the list holding it (in the chain 1 is right
    /// after default).
    HistoryChainMove {
        name: String,
        #[arg(value_name = "POS", allow_hyphen_values = true)]
        position: String,
    },
    /// Set `[history] agent_max_ctx`, the agent-wide window ceiling in messages (N ≥ 1).
    HistoryMaxctx {
        #[arg(value_name = "N", allow_hyphen_values = true)]
        n: String,
    },
    /// Set max_users, the most simultaneous sessions (N ≥ 1).
    MaxUsers {
        #[arg(value_name = "N", allow_hyphen_values = true)]
        n: String,
    },
    /// Set session_idle_timeout_minutes (0 = never reap idle sessions).
    SessionTimeout {
        #[arg(value_name = "MINUTES", allow_hyphen_values = true)]
        minutes: String,
    },
    /// Mark a plugin of the chain or the view as required: its fault fails the turn even
    /// under on_plugin_error = "skip".
    HistoryRequire { name: String },
    /// Remove a plugin from [history] required.
    HistoryUnrequire { name: String },
    /// Set KEY of [plugin.NAME] to VALUE (a TOML value: 5, true, "text", [1, 2]; anything
    /// else is taken as a string). The plugin validates its new table before anything is
    /// written.
    PluginSet {
        name: String,
        key: String,
        #[arg(allow_hyphen_values = true)]
        value: String,
    },
    /// Remove KEY from [plugin.NAME]: the plugin's default applies again.
    PluginUnset { name: String, key: String },
    /// Copy a plugin library (libhistory_plugin_NAME.so) into plugin_dir, once it has
    /// loaded in a child process, passed the plugin-api checks, exported NAME and accepted
    /// its [plugin.NAME] table; or a process plugin's NAME.plugin.toml with the files it
    /// names, once its program has started and accepted its table.
    Install {
        library: PathBuf,
        /// Replace a different library installed under the same name.
        #[arg(long)]
        force: bool,
    },
    /// Run a plugin of the chain or the view in a worker process ([history] isolate): its
    /// abort, exit or crash ends the worker, not the host.
    HistoryIsolate { name: String },
    /// Remove a plugin from [history] isolate: it runs in the host's process again.
    HistoryUnisolate { name: String },
    /// Every plugin library in plugin_dir: name, version, file, whether it loads, whether
    /// it is enabled.
    Plugins,
    /// The keys plugin NAME accepts in its [plugin.NAME] table, each with its meaning (as
    /// the plugin describes them).
    PluginKeys { name: String },
    /// Load the chain, validate every plugin's config, run the chain on a sample history.
    Check,
    /// Internal: load one plugin library in this process and print what it is as one JSON
    /// line. `plugins`, `check`, `history-list` and the edits run it per library, so a
    /// library that crashes while it loads ends this child, not them.
    #[command(name = PROBE_COMMAND, hide = true)]
    ProbeLibrary {
        library: PathBuf,
        /// The configuration whose `[plugin.NAME]` table the plugin validates.
        config_file: Option<PathBuf>,
    },
    /// Internal: serve one isolated plugin's calls over stdin and stdout (`[history]
    /// isolate`): `check` and the edits run an isolated plugin in it, as the host does.
    #[command(name = WORKER_COMMAND, hide = true)]
    Worker,
}

/// A failure: one line for stderr, and the exit status.
struct Failure {
    status: u8,
    message: String,
}

/// A refusal (status 1).
/// The hidden subcommand that probes one library.
const PROBE_COMMAND: &str = "__probe-library";

/// The hidden subcommand an isolated plugin's worker process runs.
const WORKER_COMMAND: &str = "__worker";

/// Runs this very binary's probe subcommand per library.
fn prober() -> Result<Prober, Failure> {
    let program = std::env::current_exe().map_err(|err| {
        refused(format!(
            "cannot find the agentctl binary to probe plugin libraries: {err}"
        ))
    })?;
    Ok(Prober::new(program, [PROBE_COMMAND]))
}

fn refused(message: String) -> Failure {
    Failure { status: 1, message }
}

fn main() -> ExitCode {
    logging::one_line_panics(PROGRAM);
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage(err),
    };
    // A probe child answers on its own stdout, before anything else is set up: the parent
    // reads that one line (and survives whatever the library does while it loads).
    if let Command::ProbeLibrary { library, config_file } = &cli.command {
        return probe::answer(library, config_file.as_deref());
    }
    if let Command::Worker = cli.command {
        return history_engine::isolate::worker::serve();
    }
    if let Ok(program) = std::env::current_exe() {
        history_engine::isolate::set_worker_command(program, [WORKER_COMMAND]);
    }
    let mut out = Output::take_stdout();
    // `check` and every edit load plugins, whose code can exit too.
    let guard = ExitGuard::arm(PROGRAM);
    init_logging();
    let result = catch_unwind(AssertUnwindSafe(|| run(cli, &mut out, &guard)));
    guard.disarm();
    match result {
        Ok(Ok(true)) => ExitCode::SUCCESS,
        Ok(Ok(false)) => ExitCode::FAILURE,
        Ok(Err(failure)) => {
            error_line(PROGRAM, &failure.message);
            ExitCode::from(failure.status)
        }
        // A bug: the panic hook has written its one line.
        Err(_) => ExitCode::from(101),
    }
}

/// A command-line error: clap's message and status 64 (`--help` and `--version`: their
/// text on stdout, status 0).
fn usage(err: clap::Error) -> ExitCode {
    if err.use_stderr() {
        let _ = err.print();
        return ExitCode::from(USAGE_STATUS);
    }
    match err.print() {
        Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => {
            error_line(PROGRAM, &format!("cannot write output: {err}"));
            ExitCode::from(WRITE_FAILED_STATUS)
        }
        _ => ExitCode::SUCCESS,
    }
}

/// Runs the command: `Ok(false)` when `check` found a problem.
fn run(cli: Cli, out: &mut Output, guard: &ExitGuard) -> Result<bool, Failure> {
    let (file, json) = (cli.config.as_path(), cli.json);
    let position = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let edit = match cli.command {
        Command::HistoryList => return history_list(out, file, json),
        Command::Plugins => return plugins(out, file, json),
        Command::PluginKeys { name } => return plugin_keys(out, file, &name, json),
        Command::Check => return check(out, file, json),
        Command::Install { library, force } => return install(out, file, &library, force, json, guard),
        Command::ProbeLibrary { .. } | Command::Worker => unreachable!("answered before anything else runs"),
        Command::HistoryChainAdd { name, at, view } => {
            let at = at
                .map(|at| number(&at, "history-chain-add --at POS"))
                .transpose()?
                .map(position);
            Edit::ChainAdd { name, at, view }
        }
        Command::HistoryChainRemove { name } => Edit::ChainRemove { name },
        Command::HistoryChainMove { name, position: to } => Edit::ChainMove {
            name,
            to: position(number(&to, "history-chain-move POS")?),
        },
        Command::HistoryRequire { name } => Edit::Require { name },
        Command::HistoryUnrequire { name } => Edit::Unrequire { name },
        Command::PluginSet { name, key, value } => Edit::PluginSet { name, key, value },
        Command::PluginUnset { name, key } => Edit::PluginUnset { name, key },
        Command::HistoryIsolate { name } => Edit::Isolate { name },
        Command::HistoryUnisolate { name } => Edit::Unisolate { name },
        Command::HistoryMaxctx { n } => Edit::MaxCtx(number(&n, "history-maxctx N")?),
        Command::MaxUsers { n } => Edit::MaxUsers(number(&n, "max-users N")?),
        Command::SessionTimeout { minutes } => {
            Edit::SessionTimeout(number(&minutes, "session-timeout MINUTES")?)
        }
    };
    run_edit(out, file, edit, json, &|| fault_hook(guard))
}

/// Logs to stderr; `HISTORY_LOG` sets the filter (default `error`: agentctl's reports and
/// its one-line refusals are its output).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HISTORY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_timer(tracing_subscriber::fmt::time::SystemTime)
        .with_target(false)
        .try_init();
}

/// The environment variable of the fault-injection hook for tests: `after-write` makes
/// the process exit after the temporary file is written and before it is renamed over the
/// configuration, or over the library `install` places (what a crash at the worst moment does).
const FAULT_ENV: &str = "AGENTCTL_FAULT";

/// The exit status of a process stopped by the fault hook.
const FAULT_EXIT_STATUS: i32 = 70;

fn fault_hook(guard: &ExitGuard) {
    if std::env::var(FAULT_ENV).is_ok_and(|v| v == "after-write") {
        error_line(
            PROGRAM,
            &format!(
                "{FAULT_ENV}=after-write: stopping before the rename (what it would replace is unchanged)"
            ),
        );
        guard.disarm();
        std::process::exit(FAULT_EXIT_STATUS);
    }
}

/// A whole number argument, with a one-line refusal otherwise.
fn number(text: &str, what: &str) -> Result<u64, Failure> {
    text.trim().parse::<u64>().map_err(|_| {
        refused(format!(
            "{what} must be a whole number, got {}",
            echo::quoted(text)
        ))
    })
}

/// Writes a report: a closed pipe drops it quietly, any other failure is status 5.
fn print(out: &mut Output, text: &str) -> Result<(), Failure> {
    out.write_all(text.as_bytes()).map_err(|err| Failure {
        status: WRITE_FAILED_STATUS,
        message: format!("cannot write output: {err}"),
    })
}

/// A text report, each line with its control characters escaped (a path or a plugin's
/// words cannot reach the terminal as escape sequences).
fn print_text(out: &mut Output, text: &str) -> Result<(), Failure> {
    let mut shown = String::with_capacity(text.len());
    for line in text.lines() {
        shown.push_str(&echo::line(line));
        shown.push('\n');
    }
    print(out, &shown)
}

fn print_json(out: &mut Output, value: &serde_json::Value) -> Result<(), Failure> {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    text.push('\n');
    print(out, &text)
}

fn load_config(file: &Path) -> Result<Config, Failure> {
    Config::load(file).map_err(|err| refused(err.to_string()))
}

fn run_edit(
    out: &mut Output,
    file: &Path,
    edit: Edit,
    json: bool,
    fault_hook: &dyn Fn(),
) -> Result<bool, Failure> {
    let outcome = edit::run(file, &edit, edit::Loading::Probed(prober()?), fault_hook)
        .map_err(|refusal| refused(refusal.0))?;
    let hint = edit.hint();
    if let (Some(hint), false) = (&hint, json) {
        // Beside the report, not in it: stdout stays the edit's one line.
        eprintln!("{PROGRAM}: hint: {hint}");
    }
    let printed = if json {
        let mut report = serde_json::json!({
            "file": outcome.file.display().to_string(),
            "summary": outcome.summary,
            "written": outcome.written,
        });
        if let Some(hint) = hint {
            report["hint"] = hint.into();
        }
        print_json(out, &report)
    } else if outcome.written {
        print_text(
            out,
            &format!("{} ({} updated)\n", outcome.summary, outcome.file.display()),
        )
    } else {
        print_text(out, &format!("{}\n", outcome.summary))
    };
    // The report is lost, the edit is not: say so.
    printed.map_err(|mut failure| {
        if outcome.written {
            failure.message.push_str(" (the edit was written)");
        }
        failure
    })?;
    Ok(true)
}

fn install(
    out: &mut Output,
    file: &Path,
    library: &Path,
    force: bool,
    json: bool,
    guard: &ExitGuard,
) -> Result<bool, Failure> {
    // A process plugin's manifest brings its files (docs/process-plugins.md#installing).
    let is_manifest = history_engine::process_plugin::manifest::manifest_stem(library).is_some();
    let installed = if is_manifest {
        install_program::install_program(file, library, force)
    } else {
        install::install(file, library, force, &prober()?, &|| fault_hook(guard))
    }
    .map_err(|refusal| refused(refusal.0))?;
    if json {
        print_json(
            out,
            &serde_json::json!({
                "name": installed.name,
                "version": installed.version,
                "file": installed.file.display().to_string(),
                "written": installed.written,
                "replaced": installed.replaced,
            }),
        )?;
    } else {
        let what = match (installed.written, installed.replaced) {
            (false, _) => "is already installed, identical; unchanged",
            (true, true) => "installed, replacing a different library",
            (true, false) => "installed",
        };
        print_text(
            out,
            &format!(
                "{} {} {what}: {}
next: agentctl history-chain-add {}
",
                installed.name,
                installed.version,
                installed.file.display(),
                installed.name
            ),
        )?;
    }
    Ok(true)
}

fn history_list(out: &mut Output, file: &Path, json: bool) -> Result<bool, Failure> {
    let config = load_config(file)?;
    let statuses = selfcheck::plugins(&config, &prober()?);
    let (text, value) = report::history_list(&config, &statuses);
    if json {
        print_json(out, &value)?;
    } else {
        print_text(out, &text)?;
    }
    Ok(true)
}

fn plugins(out: &mut Output, file: &Path, json: bool) -> Result<bool, Failure> {
    let config = load_config(file)?;
    let statuses = selfcheck::plugins(&config, &prober()?)
        .map_err(|err| refused(format!("{}: {err}", file.display())))?;
    let (text, value) = report::render_plugins(&config, &statuses);
    if json {
        print_json(out, &value)?;
    } else {
        print_text(out, &text)?;
    }
    Ok(true)
}

/// `plugin-keys NAME`: probes the libraries as `plugins` does (a library that crashes
/// while it loads ends a child, not agentctl) and shows NAME's keys.
fn plugin_keys(out: &mut Output, file: &Path, name: &str, json: bool) -> Result<bool, Failure> {
    let config = load_config(file)?;
    let statuses = selfcheck::plugins(&config, &prober()?)
        .map_err(|err| refused(format!("{}: {err}", file.display())))?;
    let status = statuses
        .iter()
        .find(|s| s.available && s.name == name)
        .or_else(|| statuses.iter().find(|s| s.name == name && s.file.is_some()));
    let status = match status {
        Some(status) if status.available => status,
        Some(status) => {
            return Err(refused(format!(
                "plugin \"{}\" does not load: {}",
                echo::bare(name),
                status.reason.as_deref().unwrap_or("unknown reason")
            )))
        }
        None => {
            let available: Vec<&str> = statuses
                .iter()
                .filter(|s| s.available)
                .map(|s| s.name.as_str())
                .collect();
            return Err(refused(format!(
                "plugin \"{}\" is not available in {} (available: {})",
                echo::bare(name),
                config.plugin_dir.display(),
                if available.is_empty() {
                    "none".to_string()
                } else {
                    available.join(", ")
                }
            )));
        }
    };
    let (text, value) = report::render_plugin_keys(status);
    if json {
        print_json(out, &value)?;
    } else {
        print_text(out, &text)?;
    }
    Ok(true)
}

fn check(out: &mut Output, file: &Path, json: bool) -> Result<bool, Failure> {
    let report = selfcheck::check(file, &prober()?);
    let (text, value) = report::render_check(&report);
    if json {
        print_json(out, &value)?;
    } else {
        print_text(out, &text)?;
    }
    if !report.ok() {
        error_line(
            PROGRAM,
            &format!(
                "check failed: {}",
                report.problems.first().map(String::as_str).unwrap_or("")
            ),
        );
    }
    Ok(report.ok())
}
