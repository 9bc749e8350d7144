//! `agentctl`: shows and edits `plugins-enabled.toml` (SPEC §6.2).
//!
//! Edits keep the operator's comments and layout, are validated by the host's own rules
//! (the same parser, the plugins' own config validation) before anything is written, and
//! are written atomically. Exit status: 0 done (or all is well, for `check`); 1 refused,
//! or `check` found a problem, with one line on stderr saying what and why, the file
//! untouched; 2 a usage error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use agentctl::edit::{self, Edit};
use agentctl::report;
use clap::{Parser, Subcommand};
use history_engine::{logging, selfcheck, Catalog, Config};

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
    /// Every plugin library in plugin_dir: name, version, file, whether it loads, whether
    /// it is enabled.
    Plugins,
    /// Load the chain, validate every plugin's config, run the chain on a sample history.
    Check,
}

/// A failure: one line for stderr.
struct Failure(String);

fn main() -> ExitCode {
    logging::one_line_panics("agentctl");
    init_logging();
    let cli = Cli::parse();
    let json = cli.json;
    let result = match cli.command {
        Command::HistoryList => history_list(&cli.config, json),
        Command::Plugins => plugins(&cli.config, json),
        Command::Check => check(&cli.config, json),
        Command::HistoryChainAdd { name, at, view } => at
            .map(|at| number(&at, "history-chain-add --at POS"))
            .transpose()
            .and_then(|at| {
                let at = at.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
                run_edit(&cli.config, Edit::ChainAdd { name, at, view }, json)
            }),
        Command::HistoryChainRemove { name } => run_edit(&cli.config, Edit::ChainRemove { name }, json),
        Command::HistoryChainMove { name, position } => {
            number(&position, "history-chain-move POS").and_then(|to| {
                let to = usize::try_from(to).unwrap_or(usize::MAX);
                run_edit(&cli.config, Edit::ChainMove { name, to }, json)
            })
        }
        Command::HistoryMaxctx { n } => {
            number(&n, "history-maxctx N").and_then(|n| run_edit(&cli.config, Edit::MaxCtx(n), json))
        }
        Command::MaxUsers { n } => {
            number(&n, "max-users N").and_then(|n| run_edit(&cli.config, Edit::MaxUsers(n), json))
        }
        Command::SessionTimeout { minutes } => number(&minutes, "session-timeout MINUTES")
            .and_then(|m| run_edit(&cli.config, Edit::SessionTimeout(m), json)),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(Failure(message)) => {
            eprintln!("agentctl: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr; `HISTORY_LOG` sets the filter (default `error`: agentctl's reports and
/// its one-line refusals are its output).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HISTORY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .try_init();
}

/// The environment variable of the fault-injection hook for tests: `after-write` makes
/// the process exit after the temporary file is written and before it is renamed over the
/// configuration (what a crash at the worst moment does).
const FAULT_ENV: &str = "AGENTCTL_FAULT";

/// The exit status of a process stopped by the fault hook.
const FAULT_EXIT_STATUS: i32 = 70;

fn fault_hook() {
    if std::env::var(FAULT_ENV).is_ok_and(|v| v == "after-write") {
        eprintln!(
            "agentctl: {FAULT_ENV}=after-write: stopping before the rename (the configuration is unchanged)"
        );
        std::process::exit(FAULT_EXIT_STATUS);
    }
}

/// A whole number argument, with a one-line refusal otherwise.
fn number(text: &str, what: &str) -> Result<u64, Failure> {
    text.trim()
        .parse::<u64>()
        .map_err(|_| Failure(format!("{what} must be a whole number, got \"{text}\"")))
}

fn print_json(value: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

fn load_config(file: &Path) -> Result<Config, Failure> {
    Config::load(file).map_err(|err| Failure(err.to_string()))
}

fn run_edit(file: &Path, edit: Edit, json: bool) -> Result<bool, Failure> {
    let outcome = edit::run(file, &edit, &fault_hook).map_err(|refused| Failure(refused.0))?;
    if json {
        print_json(&serde_json::json!({
            "file": outcome.file.display().to_string(),
            "summary": outcome.summary,
            "written": outcome.written,
        }));
    } else if outcome.written {
        println!("{} ({} updated)", outcome.summary, outcome.file.display());
    } else {
        println!("{}", outcome.summary);
    }
    Ok(true)
}

fn history_list(file: &Path, json: bool) -> Result<bool, Failure> {
    let config = load_config(file)?;
    let catalog = Catalog::discover(&config.plugin_dir);
    let (text, value) = report::history_list(&config, &catalog);
    if json {
        print_json(&value);
    } else {
        print!("{text}");
    }
    Ok(true)
}

fn plugins(file: &Path, json: bool) -> Result<bool, Failure> {
    let config = load_config(file)?;
    let statuses =
        selfcheck::plugins(&config).map_err(|err| Failure(format!("{}: {err}", file.display())))?;
    let (text, value) = report::render_plugins(&config, &statuses);
    if json {
        print_json(&value);
    } else {
        print!("{text}");
    }
    Ok(true)
}

fn check(file: &Path, json: bool) -> Result<bool, Failure> {
    let report = selfcheck::check(file);
    let (text, value) = report::render_check(&report);
    if json {
        print_json(&value);
    } else {
        print!("{text}");
    }
    if !report.ok() {
        eprintln!(
            "agentctl: check failed: {}",
            report.problems.first().map(String::as_str).unwrap_or("")
        );
    }
    Ok(report.ok())
}
