//! The process plugins' protocol, version 1, in JSON lines (docs/process-plugins.md#the-protocol):
//! what the host writes (the hello, a call) and how it reads a plugin's lines (its ready
//! or config error, logs, a call's result or error). No I/O: `super` moves the lines.

use plugin_api::{echo, Context, Event, EventKind, LogLevel, Message, ModelInfo, Output, RArc, RVec};
use serde_json::{json, Map, Value};

use super::manifest::PROTOCOL;
use crate::tokens::PER_MESSAGE_TOKENS;

/// The hello line: the protocol, the plugin's name, its `[plugin.NAME]` table (for the
/// plugin to validate), `agent_max_ctx` and the configured models.
pub(crate) fn hello(name: &str, config_json: &str, agent_max_ctx: u64, models: &[ModelInfo]) -> String {
    let config: Value = serde_json::from_str(config_json).unwrap_or_else(|_| json!({}));
    let line = json!({
        "type": "hello",
        "protocol": PROTOCOL,
        "name": name,
        "config": config,
        "agent_max_ctx": agent_max_ctx,
        "models": models.iter().map(model).collect::<Vec<_>>(),
    });
    line.to_string()
}

fn model(model: &ModelInfo) -> Value {
    json!({
        "name": model.name.as_str(),
        "max_context": model.max_context,
        "context_tokens": model.context_tokens,
        "tokenizer": model.tokenizer.as_str(),
        "effective_ctx": model.effective_ctx,
    })
}

/// A call line: `process`, or with `switch` `on_model_switch`, with the context, the
/// messages in the host's wire format and each one's tokens, counted by the host with the
/// call's model's tokenizer (no call back to the host: docs/process-plugins.md#calls).
pub(crate) fn call(
    id: u64,
    history: &[RArc<Message>],
    ctx: &Context,
    switch: Option<(&ModelInfo, &ModelInfo)>,
) -> String {
    let mut out = String::with_capacity(64 + history.len() * 128);
    let mut context = json!({
        "session_id": ctx.session_id.as_ref().map(|s| s.as_str()).into_option(),
        "model": model(&ctx.model),
        "agent_max_ctx": ctx.agent_max_ctx,
        "effective_ctx": ctx.effective_ctx,
        "turn": ctx.turn,
        "last_active": ctx.last_active.as_ref().map(|s| s.as_str()).into_option(),
        "per_message_tokens": PER_MESSAGE_TOKENS,
    });
    if let Some((old, new)) = switch {
        context["old_model"] = model(old);
        context["new_model"] = model(new);
    }
    let kind = if switch.is_some() {
        "on_model_switch"
    } else {
        "process"
    };
    out.push_str(&format!(
        "{{\"type\":\"{kind}\",\"id\":{id},\"context\":{context},\"messages\":["
    ));
    for (i, message) in history.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        history_wire::chat::write_message(&mut out, message);
    }
    out.push_str("],\"tokens\":[");
    for (i, message) in history.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let tokens = crate::tokens::message_tokens(ctx.model.tokenizer, message, PER_MESSAGE_TOKENS);
        out.push_str(&tokens.to_string());
    }
    out.push_str("]}\n");
    out
}

/// One line a plugin wrote, read.
#[derive(Debug)]
pub(crate) enum Line {
    Ready { version: String },
    ConfigError { key: String, message: String },
    Log { level: LogLevel, message: String },
    Result { id: u64, output: Output },
    Error { id: u64, message: String },
}

/// Reads one line of a plugin against the call's `input`. The error is the protocol
/// fault, in words for the plugin's author.
pub(crate) fn read_line(line: &str, input: &[RArc<Message>]) -> Result<Line, String> {
    let value: Value = serde_json::from_str(line)
        .map_err(|e| format!("wrote a line that is not JSON ({e}): {}", echo::text(line)))?;
    let Value::Object(object) = value else {
        return Err(format!(
            "wrote a line that is not a JSON object: {}",
            echo::text(line)
        ));
    };
    let text = |key: &str| {
        object
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let id = || {
        object
            .get("id")
            .and_then(Value::as_u64)
            .ok_or_else(|| "answered without a numeric \"id\"".to_string())
    };
    match object.get("type").and_then(Value::as_str) {
        Some("ready") => {
            match object.get("protocol").and_then(Value::as_i64) {
                Some(PROTOCOL) => {}
                other => {
                    return Err(format!(
                        "speaks protocol {}, this host speaks {PROTOCOL}",
                        other.map_or("(none given)".to_string(), |p| p.to_string())
                    ))
                }
            }
            Ok(Line::Ready {
                version: text("version"),
            })
        }
        Some("config_error") => Ok(Line::ConfigError {
            key: text("key"),
            message: text("message"),
        }),
        Some("log") => Ok(Line::Log {
            level: match object.get("level").and_then(Value::as_str) {
                Some("error") => LogLevel::Error,
                Some("warn") => LogLevel::Warn,
                Some("debug") => LogLevel::Debug,
                _ => LogLevel::Info,
            },
            message: text("message"),
        }),
        Some("result") => Ok(Line::Result {
            id: id()?,
            output: output(&object, input)?,
        }),
        Some("error") => Ok(Line::Error {
            id: id()?,
            message: text("message"),
        }),
        Some(other) => Err(format!("wrote a line of unknown type {}", echo::quoted(other))),
        None => Err("wrote a line without a \"type\"".to_string()),
    }
}

/// A result's history and events: each history entry an input index (that message,
/// unchanged: the host's own, identity and all), `{"from": i, "message": m}` (a changed
/// copy of input `i`: its turn and identity), or `{"message": m}` (a new message).
pub fn output(object: &Map<String, Value>, input: &[RArc<Message>]) -> Result<Output, String> {
    let Some(Value::Array(entries)) = object.get("history") else {
        return Err("answered a result without a \"history\" array".to_string());
    };
    let mut history = RVec::with_capacity(entries.len());
    for (at, entry) in entries.iter().enumerate() {
        let wrong = |why: String| format!("result history entry {at}: {why}");
        let index = |value: &Value| -> Result<&RArc<Message>, String> {
            let i = value.as_u64().ok_or_else(|| {
                wrong(format!(
                    "an index must be a whole number, found {}",
                    echo::json(value)
                ))
            })?;
            input.get(i as usize).ok_or_else(|| {
                wrong(format!(
                    "input message {i} does not exist ({} were sent)",
                    input.len()
                ))
            })
        };
        match entry {
            Value::Number(_) => history.push(index(entry)?.clone()),
            Value::Object(entry) => {
                let value = entry
                    .get("message")
                    .ok_or_else(|| wrong("an object entry needs \"message\"".to_string()))?;
                let mut message = history_wire::chat::parse_message(value).map_err(|e| wrong(e.0))?;
                if let Some(from) = entry.get("from") {
                    let original = index(from)?;
                    message.turn = original.turn;
                    message.set_origin(original.origin());
                }
                history.push(RArc::new(message));
            }
            other => {
                return Err(wrong(format!(
                    "expected an index or an object, found {}",
                    echo::json(other)
                )))
            }
        }
    }
    let mut events = RVec::new();
    if let Some(list) = object.get("events") {
        let list = list.as_array().ok_or("\"events\" must be an array")?;
        for (at, value) in list.iter().enumerate() {
            events.push(event(value).map_err(|why| format!("event {at}: {why}"))?);
        }
    }
    Ok(Output { history, events })
}

fn event(value: &Value) -> Result<Event, String> {
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or_default();
    let kind = EventKind::ALL
        .iter()
        .copied()
        .find(|k| k.as_str() == kind)
        .ok_or_else(|| format!("unknown kind {}", echo::quoted(kind)))?;
    Ok(Event {
        kind,
        turn: 0,
        index: value.get("index").and_then(Value::as_u64).into(),
        id: value.get("id").and_then(Value::as_str).map(Into::into).into(),
        reason: value
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .into(),
        tokens_saved: value.get("tokens_saved").and_then(Value::as_i64).into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> Vec<RArc<Message>> {
        let mut history = history_wire::chat::history_from_str(
            r#"[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]"#,
        )
        .unwrap();
        for (i, message) in history.iter_mut().enumerate() {
            let message = RArc::make_mut(message);
            message.set_origin(10 + i as u64);
            message.turn = 4;
        }
        history
    }

    #[test]
    fn indices_are_the_hosts_own_messages_and_a_changed_copy_keeps_its_identity() {
        let input = input();
        let line = r#"{"type":"result","id":3,"history":[0,{"from":1,"message":{"role":"assistant","content":"B"}},{"message":{"role":"user","content":"new"}}],
            "events":[{"kind":"message-changed","index":1,"reason":"upper"}]}"#;
        let Ok(Line::Result { id: 3, output }) = read_line(line, &input) else {
            panic!("not a result")
        };
        assert!(
            std::ptr::eq(&*output.history[0], &*input[0]),
            "the same message, not a copy"
        );
        assert_eq!((output.history[1].origin(), output.history[1].turn), (11, 4));
        assert_eq!(output.history[2].origin(), 0, "a made-up message has no identity");
        assert_eq!(output.events[0].kind, EventKind::MessageChanged);
        assert_eq!(output.events[0].index.into_option(), Some(1));
    }

    #[test]
    fn protocol_faults_say_what_and_where() {
        let input = input();
        for (line, expected) in [
            ("not json", "not JSON"),
            ("[1]", "not a JSON object"),
            (r#"{"id":1}"#, "without a \"type\""),
            (r#"{"type":"resul","id":1}"#, "unknown type \"resul\""),
            (r#"{"type":"result","history":[]}"#, "without a numeric \"id\""),
            (r#"{"type":"result","id":1}"#, "without a \"history\" array"),
            (
                r#"{"type":"result","id":1,"history":[5]}"#,
                "entry 0: input message 5 does not exist (2 were sent)",
            ),
            (
                r#"{"type":"result","id":1,"history":[0,"x"]}"#,
                "entry 1: expected an index or an object",
            ),
            (
                r#"{"type":"result","id":1,"history":[{"message":{"role":"robot"}}]}"#,
                "entry 0: unknown role \"robot\"",
            ),
            (
                r#"{"type":"result","id":1,"history":[0],"events":[{"kind":"gone"}]}"#,
                "event 0: unknown kind \"gone\"",
            ),
            (
                r#"{"type":"ready","protocol":2}"#,
                "speaks protocol 2, this host speaks 1",
            ),
        ] {
            let err = read_line(line, &input).unwrap_err();
            assert!(err.contains(expected), "{line}: {err}");
        }
    }

    #[test]
    fn a_call_carries_the_context_the_messages_and_their_tokens() {
        let input = input();
        let model = ModelInfo {
            name: "m".into(),
            max_context: 10,
            context_tokens: 100,
            tokenizer: plugin_api::Tokenizer::Chars4,
            effective_ctx: 10,
        };
        let ctx = Context {
            session_id: plugin_api::ROption::RNone,
            model: model.clone(),
            agent_max_ctx: 10,
            effective_ctx: 10,
            turn: 4,
            last_active: plugin_api::ROption::RNone,
            expiration_override: plugin_api::ROption::RNone,
            services: crate::services::SERVICES,
        };
        let line = call(9, &input, &ctx, Some((&model, &model)));
        assert!(line.ends_with('\n'));
        let value: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["type"], "on_model_switch");
        assert_eq!(value["id"], 9);
        assert_eq!(value["context"]["turn"], 4);
        assert_eq!(value["context"]["new_model"]["tokenizer"], "chars4");
        assert_eq!(value["messages"][1], json!({"role":"assistant","content":"b"}));
        assert_eq!(
            value["tokens"],
            json!([4, 4]),
            "1 character's token and the per-message 3"
        );
    }
}
