//! How the typed messages hold JSON they do not model, and the check that they are
//! written as their typed fields say (docs/wire-format.md#messages, the fidelity rule).
//!
//! Members the types do not model are kept verbatim ([`Member`]); a kept member never
//! shadows a modelled field ([`check_faithful`]): the host's output check runs it on every
//! message a plugin returns. The rest of the format — parsing whole messages, writing them —
//! is the `history-wire` crate's `chat` module; these are the pieces of the format that
//! define the types themselves (what content, a part and a tool call's `function` are), so
//! the output check and the parser agree by sharing them.

use abi_stable::std_types::{RString, RVec};
use serde_json::{Map, Value};

use crate::message::{Content, Expiration, Member, Message, Metadata, Part, Role, ToolCall};

/// A member kept verbatim: `key` and `value` as compact JSON text.
pub fn member(key: &str, value: &Value) -> Member {
    Member {
        key: key.into(),
        json: value.to_string().into(),
    }
}

/// Parses a content value: a string, an array of part objects, or null.
pub fn parse_content(value: &Value) -> Option<Content> {
    match value {
        Value::Null => Some(Content::Null),
        Value::String(text) => Some(Content::Text(text.as_str().into())),
        Value::Array(parts) => parts
            .iter()
            .map(parse_part)
            .collect::<Option<RVec<Part>>>()
            .map(Content::Parts),
        _ => None,
    }
}

/// Parses one part of an array content: a text part, or any other object kept whole.
pub fn parse_part(value: &Value) -> Option<Part> {
    let Value::Object(object) = value else {
        return None;
    };
    if let (Some(Value::String(kind)), Some(Value::String(text))) = (object.get("type"), object.get("text")) {
        if kind == "text" {
            let extra = object
                .iter()
                .filter(|(key, _)| *key != "type" && *key != "text")
                .map(|(key, value)| member(key, value))
                .collect();
            return Some(Part::Text {
                text: text.as_str().into(),
                extra,
            });
        }
    }
    Some(Part::Opaque {
        json: value.to_string().into(),
    })
}

/// The usual shape of a tool call's `function`, the one [`ToolCall`] models: a string
/// `name`, and `arguments` that are present and not null.
pub fn is_usual_function(function: &Map<String, Value>) -> bool {
    matches!(function.get("name"), Some(Value::String(_)))
        && !matches!(function.get("arguments"), None | Some(Value::Null))
}

/// What a `function` value that is not the usual shape is measured as: its name and its
/// arguments, each a string as it is and any other value as its JSON text (a non-string
/// name is counted like non-string arguments, so nothing a call carries escapes the
/// token count), a missing or null one as nothing; and whether the arguments are JSON
/// text. A `function` that is not an object has neither.
pub fn measured_function(function: &Value) -> (RString, RString, bool) {
    let Value::Object(function) = function else {
        return (RString::new(), RString::new(), false);
    };
    let text = |value: Option<&Value>| match value {
        None | Some(Value::Null) => (RString::new(), false),
        Some(Value::String(text)) => (text.as_str().into(), false),
        Some(other) => (other.to_string().into(), true),
    };
    let (name, _) = text(function.get("name"));
    let (arguments, arguments_is_json) = text(function.get("arguments"));
    (name, arguments, arguments_is_json)
}

/// The value of a kept member, or `None` when its text is not JSON.
fn kept_value(m: &Member) -> Option<Value> {
    match m.json.as_str() {
        "null" => Some(Value::Null),
        json => serde_json::from_str(json).ok(),
    }
}

/// Whether a kept member holds `null`.
fn kept_null(m: &Member) -> bool {
    matches!(kept_value(m), Some(Value::Null))
}

/// Whether a kept member holds a value that is not of the JSON type `is` tells.
fn kept_not(m: &Member, is: fn(&Value) -> bool) -> bool {
    kept_value(m).is_some_and(|value| !is(&value))
}

// The forms a kept member named like a field the types model may take (the `*_form`
// functions below, shared with the chat writer in `history-wire`, which writes a kept
// member only in such a form and only where its `*_field_set` says the field is absent): those the parser
// itself keeps verbatim — `null` (the same as absent), or a value of a type the field
// does not hold. A member in any other form could add what the types would hold (a
// call, content, metadata) past the token count and the output check, or make the output
// bad input: the host refuses a plugin's output message with one ([`check_faithful`]).
// The writer writes such a member only where the typed field is absent and the form is
// one of these; where the typed field is set (e.g. a `content: null` kept from before a
// plugin gave the message content), the typed field is written instead.

/// Whether kept member `m` of a message with role `role` is in a form the parser keeps.
pub fn message_member_form(role: Role, m: &Member) -> bool {
    match m.key.as_str() {
        "role" => false,
        "content" | "metadata" => kept_null(m),
        "tool_calls" => {
            role != Role::Assistant
                || kept_value(m).is_some_and(|v| v.is_null() || v.as_array().is_some_and(Vec::is_empty))
        }
        "tool_call_id" => {
            kept_value(m).is_some_and(|v| v.is_null() || (!v.is_string() && role != Role::Tool))
        }
        "name" => kept_not(m, Value::is_string),
        _ => true,
    }
}

/// Whether the message's typed field for `key` is set (and written instead of a member).
pub fn message_field_set(message: &Message, key: &str) -> bool {
    match key {
        "role" => true,
        "content" => message.content != Content::Null,
        "tool_calls" => !message.tool_calls.is_empty(),
        "tool_call_id" => message.tool_call_id.is_some(),
        "name" => message.name.is_some(),
        "metadata" => message.metadata.is_some(),
        _ => false,
    }
}

/// Whether kept member `m` of `metadata` is in a form the parser keeps.
pub fn metadata_member_form(m: &Member) -> bool {
    match m.key.as_str() {
        "id" | "timestamp" | "message_type" => kept_not(m, Value::is_string),
        "turn_added" | "retention_policy" | "expiration" => kept_null(m),
        "was_compacted" | "can_expand" | "is_expired" | "omitted" => kept_not(m, Value::is_boolean),
        "original_content" => kept_value(m).is_some_and(|v| v.is_null() || parse_content(&v).is_none()),
        "original_length" => kept_not(m, Value::is_u64),
        "tokens_saved" => kept_not(m, Value::is_i64),
        _ => true,
    }
}

pub fn metadata_field_set(meta: &Metadata, key: &str) -> bool {
    match key {
        "id" => meta.id.is_some(),
        "timestamp" => meta.timestamp.is_some(),
        "message_type" => meta.message_type.is_some(),
        "turn_added" => meta.turn_added.is_some(),
        "retention_policy" => meta.retention_policy.is_some(),
        "expiration" => meta.expiration.is_some(),
        "was_compacted" => meta.was_compacted.is_some(),
        "can_expand" => meta.can_expand.is_some(),
        "is_expired" => meta.is_expired.is_some(),
        "omitted" => meta.omitted.is_some(),
        "original_content" => meta.original_content.is_some(),
        "original_length" => meta.original_length.is_some(),
        "tokens_saved" => meta.tokens_saved.is_some(),
        _ => false,
    }
}

/// Whether kept member `m` of `metadata.expiration` is in a form the parser keeps.
pub fn expiration_member_form(m: &Member) -> bool {
    match m.key.as_str() {
        "turns" | "mode" | "compact_mode" | "compact_length" => kept_null(m),
        _ => true,
    }
}

pub fn expiration_field_set(expiration: &Expiration, key: &str) -> bool {
    match key {
        "turns" => expiration.turns.is_some(),
        "mode" => expiration.mode.is_some(),
        "compact_mode" => expiration.compact_mode.is_some(),
        "compact_length" => expiration.compact_length.is_some(),
        _ => false,
    }
}

/// Whether kept member `m` of a tool call is in a form the parser keeps: a `function`
/// only when it is not the usual shape.
pub fn call_member_form(m: &Member) -> bool {
    match m.key.as_str() {
        "id" => false,
        "function" => kept_value(m).is_some_and(|v| !v.as_object().is_some_and(is_usual_function)),
        _ => true,
    }
}

pub fn call_field_set(call: &ToolCall, key: &str) -> bool {
    match key {
        "id" => true,
        "function" => call.has_function,
        _ => false,
    }
}

/// Whether kept member `m` of a tool call's usual `function` object is in a form the
/// parser keeps (its name and arguments are always typed).
pub fn function_member_form(m: &Member) -> bool {
    !matches!(m.key.as_str(), "name" | "arguments")
}

/// Whether kept member `m` of a text part is in a form the parser keeps (its type and
/// text are always typed).
pub fn text_part_member_form(m: &Member) -> bool {
    !matches!(m.key.as_str(), "type" | "text")
}

/// Whether the kept member at `index` is the last one with its key (a JSON reader keeps
/// the last of a key given twice; the writer writes only that one).
pub fn last_of_its_key(extra: &[Member], index: usize) -> bool {
    let key = &extra[index].key;
    !extra[index + 1..].iter().any(|m| &m.key == key)
}

/// A key given more than once in `extra`.
pub fn repeated_key(extra: &[Member]) -> Option<&str> {
    if extra.len() < 2 {
        return None;
    }
    if extra.len() <= 16 {
        return (0..extra.len())
            .find(|&i| !last_of_its_key(extra, i))
            .map(|i| extra[i].key.as_str());
    }
    let mut seen = rustc_hash::FxHashSet::default();
    extra
        .iter()
        .find(|m| !seen.insert(m.key.as_str()))
        .map(|m| m.key.as_str())
}

/// The first fault of one extra list: a member named like a modelled field in a form the
/// parser does not keep (it would shadow the field), or a key given twice. `place` is
/// where the list is (`""` for the message itself).
fn check_kept(place: &str, extra: &[Member], form: impl Fn(&Member) -> bool) -> Result<(), String> {
    let at = |what: String| {
        if place.is_empty() {
            what
        } else {
            format!("{place}: {what}")
        }
    };
    if let Some(m) = extra.iter().find(|m| !form(m)) {
        return Err(at(format!(
            "extra member {} shadows a modelled field",
            crate::echo::quoted(&m.key)
        )));
    }
    if let Some(key) = repeated_key(extra) {
        return Err(at(format!(
            "extra member {} is given twice",
            crate::echo::quoted(key)
        )));
    }
    Ok(())
}

fn check_parts(place: &str, content: &Content) -> Result<(), String> {
    if let Content::Parts(parts) = content {
        for (i, part) in parts.iter().enumerate() {
            if let Part::Text { extra, .. } = part {
                check_kept(&format!("{place}[{i}]"), extra, text_part_member_form)?;
            }
        }
    }
    Ok(())
}

fn check_call(place: &str, call: &ToolCall) -> Result<(), String> {
    check_kept(place, &call.extra, call_member_form)?;
    if call.has_function {
        check_kept(
            &format!("{place}.function"),
            &call.function_extra,
            function_member_form,
        )?;
        if call.arguments_is_json
            && !serde_json::from_str::<Value>(&call.arguments).is_ok_and(|v| !v.is_null() && !v.is_string())
        {
            return Err(format!(
                "{place}.function: arguments kept as JSON text must be JSON other than null or a string"
            ));
        }
        return Ok(());
    }
    let measured = call
        .extra
        .iter()
        .find(|m| m.key == "function")
        .and_then(kept_value)
        .map_or_else(
            || (RString::new(), RString::new(), false),
            |f| measured_function(&f),
        );
    if measured != (call.name.clone(), call.arguments.clone(), call.arguments_is_json) {
        return Err(format!(
            "{place}: name and arguments differ from those of the function it is written with"
        ));
    }
    Ok(())
}

/// Checks that `message` is written as its typed fields say (the other half of the
/// fidelity rule): no kept member shadows a modelled field, no key is kept twice in one
/// extra list, and a tool call without the usual `function` measures as the `function`
/// it is written with. The error names where and the key:
/// `metadata: extra member "turn_added" shadows a modelled field`.
///
/// Every message [`parse_message`] returns passes. The host refuses a plugin's output
/// message that does not: such a member could add a tool call, content past the token
/// count, or metadata the host refuses as input, none of which the types show.
pub fn check_faithful(message: &Message) -> Result<(), String> {
    check_kept("", &message.extra, |m| message_member_form(message.role, m))?;
    check_parts("content", &message.content)?;
    for (i, call) in message.tool_calls.iter().enumerate() {
        check_call(&format!("tool_calls[{i}]"), call)?;
    }
    if let Some(meta) = message.meta() {
        check_kept("metadata", &meta.extra, metadata_member_form)?;
        if let Some(expiration) = meta.expiration.as_ref().into_option() {
            check_kept("metadata.expiration", &expiration.extra, expiration_member_form)?;
        }
        if let Some(original) = meta.original_content.as_ref().into_option() {
            check_parts("metadata.original_content", original)?;
        }
    }
    Ok(())
}
