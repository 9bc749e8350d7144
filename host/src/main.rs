//! `history-host`: runs the configured chain of history plugins (docs/cli.md#history-host-process).
//!
//! Exit status: 0 done (also when the reader closed the pipe early); 2 bad input; 3 a
//! configuration or plugin-loading error; 4 a turn failed by a plugin under
//! `on_plugin_error = "fail"`; 5 an output cannot be written (stdout, or the
//! `--working-out` file); 6 a plugin ended the process before the output was written;
//! 64 a usage error. On any error one line goes to stderr and nothing to stdout.
//!
//! The output goes to stdout through [`Output`], never through fd 1 directly: fd 1 points
//! at stderr while plugins run, so a plugin's `println!` cannot corrupt the JSON.

use std::io::{Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use history_engine::document::parse_document;
use history_engine::expand::{expand as expand_message, Target};
use history_engine::output::{error_line, ExitGuard, Output, USAGE_STATUS, WRITE_FAILED_STATUS};
use history_engine::{load_chain, logging, stateless_context, turns, Config};
use history_wire::chat::write_message;
use plugin_api::{Message, RArc};

const PROGRAM: &str = "history-host";

mod chat;
mod explain;

#[derive(Parser)]
#[command(
    name = "history-host",
    version,
    about = "Runs a chain of LLM conversation-history plugins"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Reads a history, runs the chain once, writes the resulting history (a JSON array).
    Process {
        /// The chain configuration.
        #[arg(long, default_value = "plugins-enabled.toml")]
        config: PathBuf,
        /// The model of the call (wins over the document's `model`; default `default`).
        #[arg(long)]
        model: Option<String>,
        /// The input document: a JSON array of messages or {"model", "turn", "messages"};
        /// `-` reads stdin.
        #[arg(long, default_value = "-")]
        input: String,
        /// Prints to stderr, per plugin: messages and tokens in and out, and its events.
        #[arg(long)]
        explain: bool,
        /// A previous output of this chain (e.g. last turn's stdout): the report shows,
        /// per plugin and for the final output, the first message whose bytes differ
        /// from it (`prefix_kept`, what each plugin costs the provider's prompt cache).
        #[arg(long, value_name = "FILE")]
        previous: Option<String>,
        /// Also writes the working history (the chain's output before the view stages) to
        /// FILE: what a stateless caller resends next turn instead of its whole transcript.
        #[arg(long, value_name = "FILE")]
        working_out: Option<PathBuf>,
    },
    /// Restores the original content of one compacted or omitted message of a history and
    /// writes the history; the message is marked `expanded` so no plugin shortens it again.
    Expand {
        /// The message's position in the history (0-based).
        #[arg(long, value_name = "I", conflicts_with = "id", required_unless_present = "id")]
        index: Option<usize>,
        /// The message's `metadata.id`.
        #[arg(long, value_name = "ID")]
        id: Option<String>,
        /// The history: a JSON array of messages or {"model", "turn", "messages"}; `-` reads stdin.
        #[arg(long, default_value = "-")]
        input: String,
    },
    /// The session service over HTTP (see docs/http-api.md) until SIGTERM or Ctrl-C.
    Serve {
        /// The chain configuration.
        #[arg(long, default_value = "plugins-enabled.toml")]
        config: PathBuf,
        /// The address to listen on (default 127.0.0.1:7878; port 0 picks a free one).
        /// A non-loopback address needs an operator token.
        #[arg(long, value_name = "ADDR", value_parser = listen_address)]
        listen: Option<std::net::SocketAddr>,
        /// The session store (overrides the configuration's `store`).
        #[arg(long, value_name = "PATH")]
        store: Option<PathBuf>,
        /// Also serve the OpenAI-compatible proxy (docs/proxy.md), forwarding chat
        /// completions to this base URL (overrides `[upstream] url`), e.g.
        /// http://127.0.0.1:8000/v1.
        #[arg(long, value_name = "URL")]
        upstream: Option<String>,
    },
    /// A session in the terminal on the embedded store, no server: each line is a user
    /// message and runs a turn (see docs/cli.md).
    Chat {
        /// The chain configuration.
        #[arg(long, default_value = "plugins-enabled.toml")]
        config: PathBuf,
        /// The model (a new session's, or a switch for a resumed one).
        #[arg(long)]
        model: Option<String>,
        /// Resume this stored session. An id may start with `-` (ids are URL-safe
        /// base64), so the value is taken as it is.
        #[arg(long, value_name = "ID", allow_hyphen_values = true)]
        session: Option<String>,
        /// The session store (overrides the configuration's `store`).
        #[arg(long, value_name = "PATH")]
        store: Option<PathBuf>,
        /// The assistant's replies come from this OpenAI-compatible base URL (e.g.
        /// https://api.openai.com/v1; `OPENAI_API_KEY` is sent as the key): after each
        /// user line the sent history goes there and the reply is stored as the next turn.
        #[arg(long, value_name = "URL")]
        upstream: Option<String>,
        /// The model asked upstream (default: the session's model name).
        #[arg(long, value_name = "NAME", requires = "upstream")]
        upstream_model: Option<String>,
    },
    /// Internal: serve one isolated plugin's calls over stdin and stdout
    /// (`[history] isolate`, docs/chain.md#isolation). The host runs it, never a person.
    #[command(name = WORKER_COMMAND, hide = true)]
    Worker,
    /// Internal: the host's output check on a process plugin's answer, for the Python SDK's
    /// test helper (docs/process-plugins.md#testing): reads `{"input": [...], "result":
    /// {...}}` on stdin, prints the resolved history and exits 0, or prints the host's
    /// refusal on stderr and exits 1.
    #[command(name = "check-plugin-output", hide = true)]
    CheckPluginOutput,
}

/// The hidden subcommand an isolated plugin's worker process runs.
const WORKER_COMMAND: &str = "worker";

/// An error with its exit status.
struct Failure {
    status: u8,
    message: String,
}

/// `--listen`: an address (`127.0.0.1:7878`, `[::1]:0`) or a host name and port
/// (`localhost:0`), resolved once at start; an IPv4 address is preferred when the name has
/// both, as clients asking `localhost` mostly try it first.
fn listen_address(text: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let addresses: Vec<std::net::SocketAddr> = text
        .to_socket_addrs()
        .map_err(|e| format!("expected HOST:PORT (e.g. 127.0.0.1:7878 or localhost:0): {e}"))?
        .collect();
    addresses
        .iter()
        .find(|a| a.is_ipv4())
        .or(addresses.first())
        .copied()
        .ok_or_else(|| format!("{text} resolves to no address"))
}

/// `check-plugin-output`: the SDK's test helper's way to the host's own output check.
fn check_plugin_output() -> ExitCode {
    use std::io::Read;
    let mut text = String::new();
    let checked = std::io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read stdin: {e}"))
        .and_then(|_| {
            serde_json::from_str::<serde_json::Value>(&text).map_err(|e| format!("stdin is not JSON: {e}"))
        })
        .and_then(|value| {
            let input = value.get("input").ok_or("stdin has no \"input\"")?.to_string();
            let result = value.get("result").ok_or("stdin has no \"result\"")?.to_string();
            history_engine::process_plugin::check_result(&input, &result)
        });
    match checked {
        Ok(output) => {
            println!("{}", history_wire::chat::history_to_string(&output.history));
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("{message}");
            ExitCode::from(1)
        }
    }
}

fn bad_input(message: String) -> Failure {
    Failure { status: 2, message }
}

fn main() -> ExitCode {
    logging::one_line_panics(PROGRAM);
    // Every command that loads a chain connects its `[summarizer]` with this client.
    history_engine::summarizer::set_client(history_summarizer::connect);
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage(err),
    };
    if let Command::Worker = cli.command {
        return history_engine::isolate::worker::serve();
    }
    if let Command::CheckPluginOutput = cli.command {
        return check_plugin_output();
    }
    // Isolated plugins run in this very binary's worker subcommand.
    if let Ok(program) = std::env::current_exe() {
        history_engine::isolate::set_worker_command(program, [WORKER_COMMAND]);
    }
    // The service and the terminal session run for long and own their output: they are
    // not one run whose result is written at the end.
    let command = match cli.command {
        Command::Serve {
            config,
            listen,
            store,
            upstream,
        } => {
            init_logging("info");
            let served = history_server::serve(history_server::ServeOptions {
                config_file: config,
                listen,
                store,
                upstream,
            });
            return finish(served.map_err(|message| Failure { status: 3, message }));
        }
        Command::Chat {
            config,
            model,
            session,
            store,
            upstream,
            upstream_model,
        } => {
            init_logging("warn");
            return finish(chat::chat(chat::ChatArgs {
                config,
                model,
                session,
                store,
                upstream,
                upstream_model,
            }));
        }
        command => command,
    };
    let mut out = Output::take_stdout();
    // Armed before any plugin is loaded: its load-time code can exit too.
    let guard = ExitGuard::arm(PROGRAM);
    init_logging("info");
    let result = catch_unwind(AssertUnwindSafe(|| match command {
        Command::Process {
            config,
            model,
            input,
            explain,
            previous,
            working_out,
        } => process(
            &mut out,
            &ProcessArgs {
                config_file: &config,
                model,
                input: &input,
                explain,
                previous: previous.as_deref(),
                working_out: working_out.as_deref(),
            },
        ),
        Command::Expand { index, id, input } => expand(&mut out, index, id.as_deref(), &input),
        Command::Serve { .. } | Command::Chat { .. } | Command::Worker | Command::CheckPluginOutput => {
            unreachable!("run above")
        }
    }));
    guard.disarm();
    match result {
        Ok(result) => finish(result),
        // A bug in the host: the panic hook has written its one line.
        Err(_) => ExitCode::from(101),
    }
}

/// The exit status of a command's result; a failure is one line on stderr.
fn finish(result: Result<(), Failure>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            error_line(PROGRAM, &failure.message);
            ExitCode::from(failure.status)
        }
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

/// Logs to stderr, one line per event, each starting with its UTC time (RFC 3339, to the
/// microsecond); `HISTORY_LOG` sets the filter (`tracing_subscriber::EnvFilter` syntax),
/// else `default`: `info` (one summary line per run or turn), `warn` for `chat`, whose
/// terminal is the conversation (docs/cli.md#logging).
fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HISTORY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_timer(tracing_subscriber::fmt::time::SystemTime)
        .with_target(false)
        .try_init();
}

fn read_input(input: &str) -> Result<Vec<u8>, Failure> {
    let mut bytes = Vec::new();
    let result = if input == "-" {
        // At a terminal, a silent wait looks like a hang: say what is awaited.
        if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
            eprintln!(
                "{PROGRAM}: reading the history from standard input (a JSON array of messages or \
                 a document); end it with Ctrl-D, or give --input FILE"
            );
        }
        std::io::stdin().read_to_end(&mut bytes).map(|_| ())
    } else {
        std::fs::File::open(input)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map(|_| ())
    };
    result.map_err(|err| bad_input(format!("cannot read input {input}: {err}")))?;
    Ok(bytes)
}

/// What `process` was asked to do.
struct ProcessArgs<'a> {
    config_file: &'a Path,
    model: Option<String>,
    input: &'a str,
    explain: bool,
    previous: Option<&'a str>,
    working_out: Option<&'a Path>,
}

fn process(out: &mut Output, args: &ProcessArgs<'_>) -> Result<(), Failure> {
    let ProcessArgs {
        config_file,
        input,
        explain,
        previous,
        ..
    } = *args;
    let (config, _catalog, chain) = load_chain(config_file).map_err(|err| Failure {
        status: 3,
        message: err.to_string(),
    })?;
    let document = parse_document(&read_input(input)?).map_err(|err| bad_input(err.0))?;
    let previous = match previous {
        None => None,
        Some("-") => return Err(bad_input("--previous must name a file, not stdin".into())),
        Some(file) => Some(
            parse_document(&read_input(file)?)
                .map_err(|err| bad_input(format!("previous output {file}: {}", err.0)))?
                .messages,
        ),
    };

    let model_name = args
        .model
        .clone()
        .or(document.model)
        .unwrap_or_else(|| "default".to_string());
    // A stateless call, like the proxy's: an unlisted model gets `[models.default]` and a
    // warning naming it (docs/configuration.md#unknown-models); input documents from
    // elsewhere name models this file need not list.
    if let Some(warning) = config.unlisted_model(&model_name) {
        tracing::warn!("{}", plugin_api::echo::line(&warning));
    }
    let model = config.model(&model_name);
    let turn = turns::current_turn(&document.messages, document.turn);
    let tokenizer = model.tokenizer.as_str();
    let ctx = stateless_context(&config, model, turn);
    // Shared, not copied: only --explain reads it afterwards.
    let input = explain.then(|| document.messages.clone());
    let run = chain
        .run_entering(document.messages, &ctx, previous.as_deref())
        .map_err(|failure| Failure {
            status: 4,
            message: failure.to_string(),
        })?;

    tracing::info!("{}", history_engine::summary::summary_line(&run));
    if explain {
        let pinned = history_trim::pinned_messages(input.as_deref().unwrap_or(&[]), default_pins(&config));
        let report = explain::explain(&run, &model_name, tokenizer, turn, ctx.effective_ctx, &pinned);
        let _ = std::io::stderr().lock().write_all(report.as_bytes());
    } else if let Some(kept) = run.prefix_kept {
        tracing::info!(
            "prefix_kept: {kept} of {} messages as in the previous output",
            run.history.len()
        );
    }
    if let Some(file) = args.working_out {
        std::fs::write(file, history_json(&run.working)).map_err(|err| Failure {
            status: WRITE_FAILED_STATUS,
            message: format!("cannot write the working history to {}: {err}", file.display()),
        })?;
    }
    write_history(out, &run.history)
}

/// What `default` pins, by its `[plugin.default]` table (docs/plugins.md#default; both
/// pins are on unless the table turns one off).
fn default_pins(config: &Config) -> history_trim::Pins {
    let table = config.plugins.iter().find(|table| table.name == "default");
    let pin = |key: &str| {
        table
            .and_then(|table| table.json.get(key))
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(true)
    };
    history_trim::Pins {
        system: pin("pin_system"),
        first_user: pin("pin_first_user"),
    }
}

/// `expand`: one message of a stateless history restored.
fn expand(out: &mut Output, index: Option<usize>, id: Option<&str>, input: &str) -> Result<(), Failure> {
    let document = parse_document(&read_input(input)?).map_err(|err| bad_input(err.0))?;
    let mut history = document.messages;
    let turn = turns::current_turn(&history, document.turn);
    let target = match (index, id) {
        (_, Some(id)) => Target::ById(id),
        (Some(index), None) => Target::ByIndex(index),
        (None, None) => return Err(bad_input("expand needs --index I or --id ID".into())),
    };
    let event = expand_message(&mut history, target, turn).map_err(|err| bad_input(err.to_string()))?;
    tracing::info!("{}: {}", event.kind.as_str(), event.reason);
    write_history(out, &history)
}

/// A history as the JSON array `process` prints: one message per line.
fn history_json(history: &[RArc<Message>]) -> String {
    let mut out = String::from("[");
    for (i, message) in history.iter().enumerate() {
        out.push_str(if i == 0 { "\n" } else { ",\n" });
        write_message(&mut out, message);
    }
    out.push_str("\n]\n");
    out
}

fn write_history(out: &mut Output, history: &[RArc<Message>]) -> Result<(), Failure> {
    // A closed pipe (e.g. `| head`) is the reader's choice, not an error; a full disk is.
    out.write_all(history_json(history).as_bytes())
        .map_err(|err| Failure {
            status: WRITE_FAILED_STATUS,
            message: format!("cannot write output: {err}"),
        })
}
