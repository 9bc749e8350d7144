//! Runtime commands (docs/sessions.md#runtime-commands): typed in `chat` or sent to a
//! session's command endpoint.

use plugin_api::{Event, Message, RArc};

use crate::error::SessionError;
use crate::session::SwitchOutcome;

/// One parsed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `!model NAME`: switch the session's model.
    Model(String),
    /// `!maxctx N` (written to the configuration) or `!maxctx N temp` (not written).
    MaxCtx { value: u64, temporary: bool },
    /// `!maxusers N`, written to the configuration.
    MaxUsers(u64),
    /// `!sessiontimeout M` (minutes, 0 = never), written to the configuration.
    SessionTimeout(u64),
    /// `!expand I`: a working-history index, or a message id.
    Expand(String),
    /// `/history`: the working history, one line per message.
    History,
    /// `/clear`: the working history keeps only its pinned messages (the leading system
    /// messages and the task, as `default` pins them); `/clear all` empties it. The
    /// transcript keeps everything either way.
    Clear { all: bool },
}

/// What a command did (docs/sessions.md#runtime-commands), as the service answers it:
/// `server` renders it as the command endpoint's JSON, `history-host chat` as lines.
pub enum CommandAnswer {
    /// `!model`: the switch, with the working history the chain made of it.
    Model(SwitchOutcome),
    /// `!maxctx`: the new `agent_max_ctx`, whether it was written to the configuration,
    /// how many live sessions changed window, and this session's window now.
    MaxCtx {
        agent_max_ctx: u64,
        written: bool,
        sessions_updated: usize,
        effective_ctx: u64,
    },
    /// `!maxusers`, written to the configuration.
    MaxUsers(u64),
    /// `!sessiontimeout` in minutes, written to the configuration.
    SessionTimeout(u64),
    /// `!expand`: the working-history index, the restored message and the host's event.
    Expand {
        index: usize,
        message: RArc<Message>,
        event: Event,
    },
    /// `/history`: the working history's size and its one-line-per-message listing.
    History { working_size: usize, lines: Vec<String> },
    /// `/clear`: the working history's size after it and the transcript position it
    /// was cleared at.
    Clear { working_size: usize, cleared_at: u64 },
}

impl Command {
    /// Parses one command line. An unknown or malformed command is bad input naming it.
    pub fn parse(line: &str) -> Result<Command, SessionError> {
        let line = line.trim();
        let mut words = line.split_whitespace();
        let name = words.next().unwrap_or("");
        let args: Vec<&str> = words.collect();
        let malformed =
            |usage: &str| SessionError::bad_input(format!("malformed command \"{line}\": usage {usage}"));
        let number = |usage: &str, min: u64| -> Result<u64, SessionError> {
            match args.first().map(|a| a.parse::<u64>()) {
                Some(Ok(n)) if n >= min => Ok(n),
                _ => Err(malformed(usage)),
            }
        };
        match name {
            "!model" => match args.as_slice() {
                [model] => Ok(Command::Model(model.to_string())),
                _ => Err(malformed("!model NAME")),
            },
            "!maxctx" => {
                let usage = "!maxctx N [temp] (N ≥ 1)";
                let value = number(usage, 1)?;
                match args.as_slice() {
                    [_] => Ok(Command::MaxCtx {
                        value,
                        temporary: false,
                    }),
                    [_, "temp"] => Ok(Command::MaxCtx {
                        value,
                        temporary: true,
                    }),
                    _ => Err(malformed(usage)),
                }
            }
            "!maxusers" if args.len() == 1 => Ok(Command::MaxUsers(number("!maxusers N (N ≥ 1)", 1)?)),
            "!maxusers" => Err(malformed("!maxusers N (N ≥ 1)")),
            "!sessiontimeout" if args.len() == 1 => Ok(Command::SessionTimeout(number(
                "!sessiontimeout MINUTES (0 = never)",
                0,
            )?)),
            "!sessiontimeout" => Err(malformed("!sessiontimeout MINUTES (0 = never)")),
            "!expand" => match args.as_slice() {
                [target] => Ok(Command::Expand(target.to_string())),
                _ => Err(malformed("!expand INDEX|ID")),
            },
            "/history" if args.is_empty() => Ok(Command::History),
            "/clear" => match args.as_slice() {
                [] => Ok(Command::Clear { all: false }),
                ["all"] => Ok(Command::Clear { all: true }),
                _ => Err(malformed("/clear [all]")),
            },
            "/history" => Err(malformed(name)),
            "" => Err(SessionError::bad_input("empty command")),
            _ => Err(SessionError::bad_input(format!(
                "unknown command \"{name}\" (known: !model, !maxctx, !maxusers, !sessiontimeout, !expand, /history, /clear)"
            ))),
        }
    }

    /// Whether the command changes a host-wide setting (over HTTP it needs the operator's
    /// token).
    pub fn is_host_wide(&self) -> bool {
        matches!(
            self,
            Command::MaxCtx { .. } | Command::MaxUsers(_) | Command::SessionTimeout(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_and_errors_name_them() {
        assert_eq!(
            Command::parse("!maxctx 12 temp").unwrap(),
            Command::MaxCtx {
                value: 12,
                temporary: true
            }
        );
        assert_eq!(Command::parse(" /clear ").unwrap(), Command::Clear { all: false });
        assert_eq!(
            Command::parse("/clear all").unwrap(),
            Command::Clear { all: true }
        );
        assert!(Command::parse("/clear some")
            .unwrap_err()
            .message
            .contains("/clear [all]"));
        assert_eq!(
            Command::parse("!expand s-3").unwrap(),
            Command::Expand("s-3".into())
        );
        assert_eq!(
            Command::parse("!sessiontimeout 0").unwrap(),
            Command::SessionTimeout(0)
        );
        let err = |line: &str| Command::parse(line).unwrap_err().message;
        assert!(err("!frobnicate 3").contains("unknown command \"!frobnicate\""));
        assert!(err("!maxctx 0").contains("malformed command \"!maxctx 0\""));
        assert!(err("!maxctx 3 forever").contains("malformed"));
        assert!(err("!maxusers").contains("malformed command \"!maxusers\""));
        assert!(err("/history now").contains("malformed"));
        assert!(Command::parse("!maxusers 3").unwrap().is_host_wide());
        assert!(!Command::parse("!model m").unwrap().is_host_wide());
    }
}
