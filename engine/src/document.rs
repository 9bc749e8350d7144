//! The input document of `history-host process` (docs/cli.md#history-host-process): a bare array of messages, or
//! `{"model": …, "turn": …, "messages": [...]}`.
//!
//! Messages are made one at a time as the parser reaches them, each JSON value dropped as
//! soon as its message is made, so the parsed JSON of the whole history is never held
//! beside its messages: a history of many small messages peaks at about half the memory
//! it would (docs/limits.md).

use std::cell::RefCell;
use std::fmt;

use history_wire::chat::{parse_message, ShapeError};
use plugin_api::echo;
use plugin_api::{Message, RArc};
use serde::de::{self, DeserializeSeed, Deserializer as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
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
    // A shape error travels through serde as an opaque error; the words are kept here, so
    // they reach the user without serde_json's position suffix.
    let shape = RefCell::new(None);
    let mut parser = serde_json::Deserializer::from_slice(bytes);
    let parsed = parser
        .deserialize_any(DocumentVisitor { shape: &shape })
        .and_then(|document| parser.end().map(|()| document));
    match parsed {
        Ok(document) => document,
        Err(e) => Err(shape
            .into_inner()
            .unwrap_or_else(|| ShapeError(format!("input is not valid JSON: {e}")))),
    }
}

/// The error serde carries for a shape error, whose words are in the visitor's slot.
fn shape_error<E: de::Error>(slot: &RefCell<Option<ShapeError>>, error: ShapeError) -> E {
    *slot.borrow_mut() = Some(error);
    E::custom("the input's shape is wrong")
}

/// The whole document. Its `Ok` holds a shape error found after the JSON was read whole
/// (a missing `messages`), which is not a reason to stop reading.
struct DocumentVisitor<'a> {
    shape: &'a RefCell<Option<ShapeError>>,
}

impl<'de> Visitor<'de> for DocumentVisitor<'_> {
    type Value = Result<InputDocument, ShapeError>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of messages or a {model, turn, messages} object")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Ok(Ok(InputDocument {
            model: None,
            turn: None,
            messages: messages(seq, self.shape)?,
        }))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut document = InputDocument {
            model: None,
            turn: None,
            messages: Vec::new(),
        };
        let mut has_messages = false;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "messages" => {
                    // null: as if absent.
                    if let Some(messages) = map.next_value_seed(MessagesSeed { shape: self.shape })? {
                        document.messages = messages;
                        has_messages = true;
                    }
                    continue;
                }
                "model" | "turn" => {}
                other => {
                    map.next_value::<IgnoredAny>()?;
                    return Err(shape_error(
                        self.shape,
                        ShapeError(format!(
                            "document: unknown member {} (expected model, turn, messages)",
                            echo::quoted(other)
                        )),
                    ));
                }
            }
            let value: Value = map.next_value()?;
            match (key.as_str(), value) {
                (_, Value::Null) => {}
                ("model", Value::String(model)) => document.model = Some(model),
                ("model", other) => {
                    return Err(shape_error(
                        self.shape,
                        ShapeError(format!(
                            "document: model must be a string, found {}",
                            echo::json(&other)
                        )),
                    ))
                }
                (_, value) => match value.as_u64() {
                    Some(turn) if turn >= 1 => document.turn = Some(turn),
                    _ => {
                        return Err(shape_error(
                            self.shape,
                            ShapeError(format!(
                                "document: turn must be an integer ≥ 1, found {}",
                                echo::json(&value)
                            )),
                        ))
                    }
                },
            }
        }
        if !has_messages {
            return Ok(Err(ShapeError("document: missing \"messages\"".into())));
        }
        Ok(Ok(document))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Err(shape_error(self.shape, not_a_document("a string")))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Err(shape_error(self.shape, not_a_document("a boolean")))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Err(shape_error(self.shape, not_a_document("a number")))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Err(shape_error(self.shape, not_a_document("a number")))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Err(shape_error(self.shape, not_a_document("a number")))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Err(shape_error(self.shape, not_a_document("null")))
    }
}

fn not_a_document(found: &str) -> ShapeError {
    ShapeError(format!(
        "input must be an array of messages or a {{model, turn, messages}} object, found {found}"
    ))
}

/// The messages of an array, each made as soon as its JSON value is read. Errors name
/// the message index: `message 3: unknown role "robot"`.
fn messages<'de, A: SeqAccess<'de>>(
    mut seq: A,
    shape: &RefCell<Option<ShapeError>>,
) -> Result<Vec<RArc<Message>>, A::Error> {
    let mut messages = Vec::with_capacity(seq.size_hint().unwrap_or(0));
    while let Some(value) = seq.next_element::<Value>()? {
        let message = parse_message(&value)
            .map_err(|e| shape_error(shape, ShapeError(format!("message {}: {}", messages.len(), e.0))))?;
        messages.push(RArc::new(message));
    }
    messages.shrink_to_fit();
    Ok(messages)
}

/// The `messages` member: an array of messages, or null (`None`).
struct MessagesSeed<'a> {
    shape: &'a RefCell<Option<ShapeError>>,
}

impl<'de> DeserializeSeed<'de> for MessagesSeed<'_> {
    type Value = Option<Vec<RArc<Message>>>;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MessagesSeed<'_> {
    type Value = Option<Vec<RArc<Message>>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of messages")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        messages(seq, self.shape).map(Some)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Err(shape_error(self.shape, not_an_array("an object")))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Err(shape_error(self.shape, not_an_array("a string")))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Err(shape_error(self.shape, not_an_array("a boolean")))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Err(shape_error(self.shape, not_an_array("a number")))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Err(shape_error(self.shape, not_an_array("a number")))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Err(shape_error(self.shape, not_an_array("a number")))
    }
}

fn not_an_array(found: &str) -> ShapeError {
    ShapeError(format!("expected an array of messages, found {found}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> String {
        parse_document(text.as_bytes()).expect_err(text).0
    }

    #[test]
    fn both_forms_parse() {
        let bare = parse_document(br#"[{"role":"user","content":"a"}]"#).unwrap();
        assert_eq!((bare.messages.len(), bare.model, bare.turn), (1, None, None));
        let document =
            parse_document(br#"{"turn":3,"model":"m","messages":[{"role":"user","content":"a"}]}"#).unwrap();
        assert_eq!(document.messages.len(), 1);
        assert_eq!((document.model.as_deref(), document.turn), (Some("m"), Some(3)));
        let nulls = parse_document(br#"{"turn":null,"model":null,"messages":[]}"#).unwrap();
        assert_eq!((nulls.messages.len(), nulls.model, nulls.turn), (0, None, None));
    }

    #[test]
    fn shape_errors_name_what_and_where_without_a_json_position() {
        assert_eq!(
            error(r#"[{"role":"user","content":"a"},{"role":"robot","content":"b"}]"#),
            r#"message 1: unknown role "robot""#
        );
        assert_eq!(
            error(r#"{"messages":[],"extra":1}"#),
            r#"document: unknown member "extra" (expected model, turn, messages)"#
        );
        assert_eq!(
            error(r#"{"model":[1],"messages":[]}"#),
            "document: model must be a string, found [1]"
        );
        assert_eq!(
            error(r#"{"turn":0,"messages":[]}"#),
            "document: turn must be an integer ≥ 1, found 0"
        );
        assert_eq!(error(r#"{"messages":null}"#), r#"document: missing "messages""#);
        assert_eq!(
            error(r#"{"messages":{"a":1}}"#),
            "expected an array of messages, found an object"
        );
        assert_eq!(
            error(r#""text""#),
            "input must be an array of messages or a {model, turn, messages} object, found a string"
        );
    }

    #[test]
    fn json_errors_say_so_with_the_position() {
        let e = error(r#"[{"role":"user","content":"a"}] x"#);
        assert!(
            e.starts_with("input is not valid JSON: trailing characters at line 1"),
            "{e}"
        );
        let e = error(r#"[{"role":"user","content":"a"},"#);
        assert!(e.starts_with("input is not valid JSON: "), "{e}");
    }
}
