//! `history-host chat`: a terminal session on the embedded store, no server (see
//! docs/cli.md#history-host-chat). Each line is a user message and runs a turn; `:assistant TEXT`,
//! `:tool NAME TEXT` and `:load FILE` feed the other roles; `!…` and `/…` are the runtime
//! commands. After each turn it prints the `--explain` table and the sent history's size.
//! With `--upstream URL` the assistant's replies come from a model: after each user line's
//! turn the sent history goes to URL's chat completions, the reply is printed as it
//! streams in and stored as the next turn.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;

use history_engine::document::parse_document;
use history_server::ModelClient;
use history_sessions::{Command, CommandAnswer, Options, Service, TurnInput};
use plugin_api::{Content, Message, Part, RArc};

use crate::{explain, Failure};

/// What `chat` was asked.
pub struct ChatArgs {
    pub config: PathBuf,
    pub model: Option<String>,
    pub session: Option<String>,
    pub store: Option<PathBuf>,
    /// `--upstream URL`: the replies come from this OpenAI-compatible base URL.
    pub upstream: Option<String>,
    /// `--upstream-model NAME`: the model asked upstream (default: the session's model).
    pub upstream_model: Option<String>,
}

pub fn chat(args: ChatArgs) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure {
            status: 3,
            message: format!("cannot start the runtime: {e}"),
        })?;
    runtime.block_on(run(args))
}

struct Chat {
    service: Arc<Service>,
    id: String,
    /// Messages typed with `:assistant` and `:tool`, sent with the next turn.
    pending: Vec<RArc<Message>>,
    calls: u64,
    out: std::io::Stdout,
    /// The model the replies come from, and its name there.
    model: Option<(ModelClient, Option<String>)>,
}

async fn run(args: ChatArgs) -> Result<(), Failure> {
    // On a blocking thread: a store's client may block (PostgreSQL's does).
    let options = Options {
        config_file: args.config.clone(),
        store: args.store.clone(),
    };
    let service = tokio::task::spawn_blocking(move || Service::open(&options))
        .await
        .map_err(|e| e.to_string())
        .and_then(|opened| opened.map_err(|e| e.to_string()))
        .map_err(|message| Failure { status: 3, message })?;
    let model = match &args.upstream {
        Some(url) => {
            let key = std::env::var("OPENAI_API_KEY").ok().filter(|k| !k.is_empty());
            let client = ModelClient::new(url, service.config().upstream.as_ref(), key.as_deref())
                .map_err(|message| Failure { status: 3, message })?;
            Some((client, args.upstream_model.clone()))
        }
        None => None,
    };
    let id = match &args.session {
        Some(id) => {
            service.info(id).map_err(|e| Failure {
                status: 2,
                message: format!("{e} in {}", service.store_path().display()),
            })?;
            if let Some(model) = args
                .model
                .clone()
                .filter(|m| *m != service.info(id).unwrap().model)
            {
                service.switch_model(id, model).await.map_err(|e| Failure {
                    status: 4,
                    message: e.message,
                })?;
            }
            id.clone()
        }
        None => {
            service
                .create(args.model.clone(), None)
                .await
                .map_err(|e| Failure {
                    status: 3,
                    message: e.message,
                })?
                .id
        }
    };
    let mut chat = Chat {
        service,
        id,
        pending: Vec::new(),
        calls: 0,
        out: std::io::stdout(),
        model,
    };
    let info = chat.service.info(&chat.id).unwrap();
    if let Some((_, name)) = &chat.model {
        upstream_model(name.as_deref(), &info.model).map_err(|message| Failure { status: 2, message })?;
    }
    chat.say(&format!(
        "session {} (model {}, effective_ctx {}, turn {}); resume with --session {}",
        info.id, info.model, info.effective_ctx, info.turn, info.id
    ));
    if let Some((client, name)) = &chat.model {
        let line = format!(
            "replies from {} (model {})",
            client.url(),
            name.as_deref().unwrap_or(&info.model)
        );
        chat.say(&line);
    }
    chat.say("type a message; :assistant TEXT, :tool NAME TEXT, :load FILE, !model NAME, !maxctx N [temp], !expand I, /history, /clear [all]; :quit or end of input leaves");
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let line = line.trim_end();
        if line.trim().is_empty() {
            continue;
        }
        if line == ":quit" || line == ":q" {
            break;
        }
        chat.line(line).await;
    }
    if !chat.pending.is_empty() {
        chat.say(&format!(
            "{} typed messages were not sent (no user line followed)",
            chat.pending.len()
        ));
    }
    Ok(())
}

impl Chat {
    fn say(&mut self, text: &str) {
        let _ = writeln!(self.out, "{text}");
        let _ = self.out.flush();
    }

    async fn line(&mut self, line: &str) {
        if let Some(text) = line.strip_prefix(":assistant ") {
            self.pending
                .push(message(serde_json::json!({"role": "assistant", "content": text})));
            self.say("(assistant message queued for the next turn)");
        } else if let Some(rest) = line.strip_prefix(":tool ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            self.calls += 1;
            let call = format!(
                "chat_call_{}_{}",
                self.service.info(&self.id).map_or(0, |i| i.turn),
                self.calls
            );
            self.pending.push(message(serde_json::json!({"role": "assistant", "content": null,
                "tool_calls": [{"id": call, "type": "function", "function": {"name": name, "arguments": "{}"}}]})));
            self.pending.push(message(
                serde_json::json!({"role": "tool", "tool_call_id": call, "content": text}),
            ));
            self.say(&format!(
                "(call {call} to {name} and its result queued for the next turn)"
            ));
        } else if let Some(file) = line.strip_prefix(":load ") {
            match std::fs::read(file.trim())
                .map_err(|e| format!("cannot read {file}: {e}"))
                .and_then(|bytes| parse_document(&bytes).map_err(|e| format!("{file}: {}", e.0)))
            {
                Ok(document) => {
                    let mut messages = std::mem::take(&mut self.pending);
                    messages.extend(document.messages);
                    self.turn(messages).await;
                }
                Err(e) => self.say(&format!("error: {e}")),
            }
        } else if line.starts_with('!') || line.starts_with('/') {
            self.command(line).await;
        } else if matches!(line.trim_end(), ":assistant" | ":tool" | ":load") {
            self.say(&format!(
                "error: {} needs its arguments (usage: :assistant TEXT, :tool NAME TEXT, :load FILE)",
                line.trim_end()
            ));
        } else if line.starts_with(':') {
            self.say(&format!(
                "error: unknown \"{}\" (known: :assistant TEXT, :tool NAME TEXT, :load FILE, :quit)",
                line.split_whitespace().next().unwrap_or(line)
            ));
        } else {
            let mut messages = std::mem::take(&mut self.pending);
            messages.push(message(serde_json::json!({"role": "user", "content": line})));
            if let Some(sent) = self.turn(messages).await {
                if self.model.is_some() {
                    self.reply(sent).await;
                }
            }
        }
    }

    /// The model's reply to the sent history, printed as it streams in, then stored as the
    /// session's next turn. A failure is one line; the session keeps what it had.
    async fn reply(&mut self, sent: serde_json::Value) {
        let Some((client, name)) = &self.model else { return };
        let name = match self.service.info(&self.id) {
            Ok(info) => match upstream_model(name.as_deref(), &info.model) {
                Ok(name) => name,
                Err(e) => return self.say(&format!("error: {e}")),
            },
            Err(e) => return self.say(&format!("error: {}", e.message)),
        };
        let out = &mut self.out;
        let mut started = false;
        let answer = client
            .complete(&name, sent, |text| {
                if !started {
                    let _ = write!(out, "assistant: ");
                    started = true;
                }
                let _ = write!(out, "{text}");
                let _ = out.flush();
            })
            .await;
        if started {
            let _ = writeln!(out);
        }
        let text = match answer {
            Ok(text) => text,
            Err(e) => return self.say(&format!("error: {}", history_engine::echo::line(&e))),
        };
        let input = TurnInput {
            messages: vec![message(serde_json::json!({"role": "assistant", "content": text}))],
            model: None,
            context: Vec::new(),
        };
        match self.service.turn(&self.id, input).await {
            Ok(outcome) => self.say(&format!(
                "turn {}: the reply stored; working history {} messages",
                outcome.turn,
                outcome.run.working.len()
            )),
            Err(e) => self.say(&format!("error: the reply was not stored: {}", e.message)),
        }
    }

    /// Runs a turn and prints what the chain did; the sent history, when it ran.
    async fn turn(&mut self, messages: Vec<RArc<Message>>) -> Option<serde_json::Value> {
        let input = TurnInput {
            messages,
            model: None,
            context: Vec::new(),
        };
        match self.service.turn(&self.id, input).await {
            Ok(outcome) => {
                let report = explain::explain(
                    &outcome.run,
                    &outcome.model.name,
                    outcome.model.tokenizer.as_str(),
                    outcome.turn,
                    outcome.model.effective_ctx,
                    // The session's input is not at hand here: no pinned line.
                    &[],
                );
                let _ = write!(self.out, "{report}");
                self.say(&format!(
                    "turn {}: sent history {} messages, {} tokens; working history {} messages",
                    outcome.turn,
                    outcome.run.history.len(),
                    history_engine::summary::thousands(outcome.run.tokens_out),
                    outcome.run.working.len()
                ));
                // As the proxy sends it: without the host's metadata.
                serde_json::from_str(&history_wire::chat::provider_history_to_string(
                    &outcome.run.history,
                ))
                .ok()
            }
            Err(e) => {
                self.say(&format!("error: {}", e.message));
                None
            }
        }
    }

    async fn command(&mut self, line: &str) {
        let command = match Command::parse(line) {
            Ok(command) => command,
            Err(e) => return self.say(&format!("error: {}", e.message)),
        };
        match self.service.command(&self.id, command).await {
            Ok(answer) => {
                let text = answer_text(&answer);
                self.say(text.trim_end());
            }
            Err(e) => self.say(&format!("error: {}", e.message)),
        }
    }
}

/// A command's answer as a person reads it (the JSON form is the HTTP API's,
/// docs/http-api.md, not the terminal's).
fn answer_text(answer: &CommandAnswer) -> String {
    let written = |yes: bool| {
        if yes {
            "written to the configuration"
        } else {
            "this run only"
        }
    };
    match answer {
        CommandAnswer::Model(outcome) => format!(
            "model {} (was {}): effective_ctx {}, working history {} messages",
            outcome.model.name.as_str(),
            outcome.old,
            outcome.model.effective_ctx,
            outcome.run.working.len()
        ),
        CommandAnswer::MaxCtx {
            agent_max_ctx,
            written: yes,
            sessions_updated,
            effective_ctx,
        } => format!(
            "agent_max_ctx {agent_max_ctx} ({}): effective_ctx {effective_ctx}, {sessions_updated} sessions updated",
            written(*yes)
        ),
        CommandAnswer::MaxUsers(value) => format!("max_users {value} ({})", written(true)),
        CommandAnswer::SessionTimeout(minutes) => {
            format!("session_idle_timeout_minutes {minutes} ({})", written(true))
        }
        CommandAnswer::Expand { index, message, event } => expanded_text(*index, message, event),
        CommandAnswer::History { lines, .. } => {
            let mut text = format!("working history: {} messages\n", lines.len());
            for line in lines {
                text.push_str(line);
                text.push('\n');
            }
            text
        }
        CommandAnswer::Clear { working_size, .. } => {
            format!("cleared: working history {working_size} messages")
        }
    }
}

/// `!expand`'s answer as a person reads it: which message came back and why, then its
/// restored text (and tool calls), indented.
fn expanded_text(index: usize, message: &Message, event: &plugin_api::Event) -> String {
    let meta = message.meta();
    let mut about = vec![message.role.as_str().to_string()];
    if let Some(turn) = meta.and_then(|m| m.turn_added.into_option()) {
        about.push(format!("turn {turn}"));
    }
    if let Some(id) = message.id() {
        about.push(format!("id {}", history_engine::echo::bare(id)));
    }
    if let Some(call) = message.call_id() {
        about.push(format!("result of {}", history_engine::echo::bare(call)));
    }
    let reason = match event.reason.as_str() {
        "" => "expanded",
        reason => reason,
    };
    let mut text = format!(
        "message {index} expanded ({}): {}\n",
        about.join(", "),
        history_engine::echo::line(reason)
    );
    let mut body = match &message.content {
        Content::Null => String::new(),
        Content::Text(content) => content.to_string(),
        Content::Parts(parts) => parts
            .iter()
            .map(|part| match part {
                Part::Text { text, .. } => text.to_string(),
                Part::Opaque { json } => {
                    let kind = serde_json::from_str::<serde_json::Value>(json)
                        .ok()
                        .and_then(|v| v["type"].as_str().map(str::to_string));
                    format!("[{} part]", kind.as_deref().unwrap_or("non-text"))
                }
            })
            .collect::<Vec<_>>()
            .join("\n"),
    };
    for call in &message.tool_calls {
        body.push_str(&format!(
            "\ncall {}({})",
            call.name.as_str(),
            call.arguments.as_str()
        ));
    }
    for line in body.trim_start_matches('\n').lines() {
        // The conversation's own text, but no escape sequence reaches the terminal.
        let line: String = line
            .chars()
            .map(|c| {
                if c.is_control() && c != '\t' {
                    '\u{fffd}'
                } else {
                    c
                }
            })
            .collect();
        text.push_str(&format!("  {line}\n"));
    }
    text
}

fn message(value: serde_json::Value) -> RArc<Message> {
    RArc::new(history_wire::chat::parse_message(&value).expect("a well-formed message"))
}

/// The model name asked upstream: `--upstream-model`, else the session's model. `default`
/// is the configuration's fallback settings, not a model any provider serves: sending it
/// would be refused upstream, so it is refused here with the way out.
fn upstream_model(asked: Option<&str>, session_model: &str) -> Result<String, String> {
    match asked {
        Some(name) => Ok(name.to_string()),
        None if session_model == "default" => Err(
            "the session's model is \"default\", which no provider serves: name the model asked \
             upstream with --upstream-model NAME, or give the session a listed model with \
             --model NAME (or !model NAME)"
                .to_string(),
        ),
        None => Ok(session_model.to_string()),
    }
}
