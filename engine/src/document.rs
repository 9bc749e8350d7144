//! The input document of `history-host process` (docs/cli.md#history-host-process): a bare array of messages, or
//! `{"model": …, "turn": …, "messages": [...]}`.

use plugin_api::echo;
use plugin_api::wire::{parse_history, ShapeError};
use plugin_api::{Message, RArc};
use serde_json::Value;

/// A parsed input document.
#[derive(Debug)]
pub struct InputDocument {
    pub model: Option<String>,
    pub turn: Option<u64>,
    pub messages: Vec<RArc<Message>>,
}

/// Parses the document's bytes; errors are bad input (docs/wire-format.md#input-checks) and say what and where.
pub fn parse_document(bytes: &[u8]) -> Result<InputDocument, ShapeError> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| ShapeError(format!("input is not valid JSON: {e}")))?;
    match value {
        Value::Array(_) => Ok(InputDocument {
            model: None,
            turn: None,
            messages: parse_history(&value)?,
        }),
        Value::Object(object) => {
            let mut document = InputDocument {
                model: None,
                turn: None,
                messages: Vec::new(),
            };
            let mut has_messages = false;
            for (key, value) in &object {
                match (key.as_str(), value) {
                    (_, Value::Null) => {}
                    ("model", Value::String(model)) => document.model = Some(model.clone()),
                    ("model", other) => {
                        return Err(ShapeError(format!(
                            "document: model must be a string, found {}",
                            echo::json(other)
                        )))
                    }
                    ("turn", value) => match value.as_u64() {
                        Some(turn) if turn >= 1 => document.turn = Some(turn),
                        _ => {
                            return Err(ShapeError(format!(
                                "document: turn must be an integer ≥ 1, found {}",
                                echo::json(value)
                            )))
                        }
                    },
                    ("messages", value) => {
                        document.messages = parse_history(value)?;
                        has_messages = true;
                    }
                    (other, _) => {
                        return Err(ShapeError(format!(
                            "document: unknown member {} (expected model, turn, messages)",
                            echo::quoted(other)
                        )))
                    }
                }
            }
            if !has_messages {
                return Err(ShapeError("document: missing \"messages\"".into()));
            }
            Ok(document)
        }
        other => Err(ShapeError(format!(
            "input must be an array of messages or a {{model, turn, messages}} object, found {}",
            match other {
                Value::String(_) => "a string",
                Value::Number(_) => "a number",
                Value::Bool(_) => "a boolean",
                _ => "null",
            }
        ))),
    }
}
