//! The OpenAI chat format, the host's own wire format (docs/wire-format.md#messages,
//! docs/wire-format.md#metadata): parsing with the input checks of
//! docs/wire-format.md#input-checks, and writing back. Not part of the ABI — the host
//! parses once and hands plugins typed messages — but it is the contract's definition of
//! the format, and plugin authors use it to build test histories from JSON.
//!
//! Fidelity rule: `write(parse(x))` is the same JSON value as `x`. Members the types do
//! not model go to an `extra` list verbatim; a known member spelled `null` counts as
//! absent (docs/wire-format.md#input-checks) but is kept there too, so it is written back
//! as it came. And the other way round, a message is written as its typed fields say: a
//! kept member never shadows a modelled field (`plugin_api::faithful::check_faithful`,
//! which the host's output check runs on every plugin's output).

use plugin_api::abi_stable::std_types::{RArc, ROption, RString, RVec};
use plugin_api::echo;
use plugin_api::faithful::{
    call_field_set, call_member_form, expiration_field_set, expiration_member_form, function_member_form,
    is_usual_function, last_of_its_key, measured_function, member, message_field_set, message_member_form,
    metadata_field_set, metadata_member_form, parse_content, repeated_key, text_part_member_form,
};
use plugin_api::{
    CompactMode, Content, Expiration, ExpirationMode, Member, Message, Metadata, Part, Role, ToolCall,
};
use serde_json::{Map, Value};

/// A message that is bad input (docs/wire-format.md#input-checks), with the path of the offending member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError(pub String);

impl std::fmt::Display for ShapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn bad<T>(message: impl Into<String>) -> Result<T, ShapeError> {
    Err(ShapeError(message.into()))
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Parses one message object. The error says what is wrong, relative to the message.
pub fn parse_message(value: &Value) -> Result<Message, ShapeError> {
    let Value::Object(object) = value else {
        return bad(format!("expected a message object, found {}", kind(value)));
    };
    let role = match object.get("role") {
        Some(Value::String(name)) => match Role::parse(name) {
            Some(role) => role,
            None => return bad(format!("unknown role {}", echo::quoted(name))),
        },
        Some(other) => return bad(format!("role must be a string, found {}", kind(other))),
        None => return bad("missing role"),
    };
    let mut message = Message::new(role, Content::Null);
    for (key, value) in object {
        match (key.as_str(), value) {
            ("role", _) => {}
            (_, Value::Null) => message.extra.push(member(key, value)),
            ("content", _) => {
                message.content = parse_content(value).ok_or_else(|| {
                    ShapeError(format!(
                        "content must be a string, an array of part objects or null, found {}",
                        kind(value)
                    ))
                })?
            }
            ("tool_calls", Value::Array(calls)) if role == Role::Assistant && !calls.is_empty() => {
                for (i, call) in calls.iter().enumerate() {
                    message.tool_calls.push(
                        parse_tool_call(call).map_err(|e| ShapeError(format!("tool_calls[{i}]: {}", e.0)))?,
                    );
                }
            }
            ("tool_calls", Value::Array(_)) => message.extra.push(member(key, value)),
            ("tool_calls", other) if role == Role::Assistant => {
                return bad(format!("tool_calls must be an array, found {}", kind(other)))
            }
            ("tool_call_id", Value::String(id)) => message.tool_call_id = ROption::RSome(id.as_str().into()),
            ("tool_call_id", other) if role == Role::Tool => {
                return bad(format!("tool_call_id must be a string, found {}", kind(other)))
            }
            ("name", Value::String(name)) => message.name = ROption::RSome(name.as_str().into()),
            ("metadata", Value::Object(meta)) => {
                message.metadata =
                    ROption::RSome(parse_metadata(meta).map_err(|e| ShapeError(format!("metadata.{}", e.0)))?)
            }
            ("metadata", other) => return bad(format!("metadata must be an object, found {}", kind(other))),
            _ => message.extra.push(member(key, value)),
        }
    }
    if role == Role::Tool && message.tool_call_id.is_none() {
        return bad("tool message without tool_call_id");
    }
    Ok(message)
}

fn parse_tool_call(value: &Value) -> Result<ToolCall, ShapeError> {
    let Value::Object(object) = value else {
        return bad(format!("expected a tool call object, found {}", kind(value)));
    };
    let id = match object.get("id") {
        Some(Value::String(id)) => id.as_str(),
        Some(other) => return bad(format!("id must be a string, found {}", kind(other))),
        None => return bad("tool call without id"),
    };
    let mut call = ToolCall {
        id: id.into(),
        name: RString::new(),
        arguments: RString::new(),
        arguments_is_json: false,
        has_function: false,
        extra: RVec::new(),
        function_extra: RVec::new(),
    };
    for (key, value) in object {
        match (key.as_str(), value) {
            ("id", _) => {}
            ("function", Value::Object(function)) if is_usual_function(function) => {
                call.has_function = true;
                for (key, value) in function {
                    match (key.as_str(), value) {
                        ("name", Value::String(name)) => call.name = name.as_str().into(),
                        ("arguments", Value::String(arguments)) => call.arguments = arguments.as_str().into(),
                        ("arguments", other) => {
                            call.arguments = other.to_string().into();
                            call.arguments_is_json = true;
                        }
                        _ => call.function_extra.push(member(key, value)),
                    }
                }
            }
            ("function", other) => {
                // Kept as it came; the typed fields say only what it is measured as.
                call.extra.push(member(key, value));
                (call.name, call.arguments, call.arguments_is_json) = measured_function(other);
            }
            _ => call.extra.push(member(key, value)),
        }
    }
    Ok(call)
}

fn parse_u64(value: &Value) -> Option<u64> {
    value.as_u64()
}

fn parse_metadata(object: &Map<String, Value>) -> Result<Metadata, ShapeError> {
    let mut meta = Metadata::default();
    for (key, value) in object {
        let kept = match (key.as_str(), value) {
            (_, Value::Null) => false,
            ("id", Value::String(s)) => {
                meta.id = ROption::RSome(s.as_str().into());
                true
            }
            ("timestamp", Value::String(s)) => {
                meta.timestamp = ROption::RSome(s.as_str().into());
                true
            }
            ("message_type", Value::String(s)) => {
                meta.message_type = ROption::RSome(s.as_str().into());
                true
            }
            ("turn_added", value) => match parse_u64(value) {
                Some(turn) if turn >= 1 => {
                    meta.turn_added = ROption::RSome(turn);
                    true
                }
                _ => {
                    return bad(format!(
                        "turn_added must be an integer ≥ 1, found {}",
                        echo::json(value)
                    ))
                }
            },
            ("retention_policy", Value::Array(entries)) => {
                let mut policy = RVec::with_capacity(entries.len());
                for (i, entry) in entries.iter().enumerate() {
                    policy.push(match entry {
                        Value::Null => ROption::RNone,
                        other => match parse_u64(other) {
                            Some(n) => ROption::RSome(n),
                            None => {
                                return bad(format!(
                                    "retention_policy[{i}] must be an integer ≥ 0 or null, found {}",
                                    echo::json(other)
                                ))
                            }
                        },
                    });
                }
                meta.retention_policy = ROption::RSome(policy);
                true
            }
            ("retention_policy", other) => {
                return bad(format!(
                    "retention_policy must be an array, found {}",
                    kind(other)
                ))
            }
            ("expiration", Value::Object(expiration)) => {
                meta.expiration = ROption::RSome(
                    parse_expiration(expiration).map_err(|e| ShapeError(format!("expiration.{}", e.0)))?,
                );
                true
            }
            ("expiration", other) => {
                return bad(format!("expiration must be an object, found {}", kind(other)))
            }
            ("was_compacted", Value::Bool(b)) => {
                meta.was_compacted = ROption::RSome(*b);
                true
            }
            ("can_expand", Value::Bool(b)) => {
                meta.can_expand = ROption::RSome(*b);
                true
            }
            ("is_expired", Value::Bool(b)) => {
                meta.is_expired = ROption::RSome(*b);
                true
            }
            ("omitted", Value::Bool(b)) => {
                meta.omitted = ROption::RSome(*b);
                true
            }
            ("original_content", value) => match parse_content(value) {
                Some(content) => {
                    meta.original_content = ROption::RSome(content);
                    true
                }
                None => false,
            },
            ("original_length", value) => match parse_u64(value) {
                Some(n) => {
                    meta.original_length = ROption::RSome(n);
                    true
                }
                None => false,
            },
            ("tokens_saved", value) => match value.as_i64() {
                Some(n) => {
                    meta.tokens_saved = ROption::RSome(n);
                    true
                }
                None => false,
            },
            _ => false,
        };
        if !kept {
            meta.extra.push(member(key, value));
        }
    }
    Ok(meta)
}

fn parse_expiration(object: &Map<String, Value>) -> Result<Expiration, ShapeError> {
    let mut expiration = Expiration::default();
    for (key, value) in object {
        match (key.as_str(), value) {
            (_, Value::Null) => expiration.extra.push(member(key, value)),
            ("turns", value) => match parse_u64(value) {
                Some(n) => expiration.turns = ROption::RSome(n),
                None => {
                    return bad(format!(
                        "turns must be an integer ≥ 0, found {}",
                        echo::json(value)
                    ))
                }
            },
            ("compact_length", value) => match parse_u64(value) {
                Some(n) => expiration.compact_length = ROption::RSome(n),
                None => {
                    return bad(format!(
                        "compact_length must be an integer ≥ 0, found {}",
                        echo::json(value)
                    ))
                }
            },
            ("mode", value) => match value.as_str().and_then(ExpirationMode::parse) {
                Some(mode) => expiration.mode = ROption::RSome(mode),
                None => {
                    return bad(format!(
                        "mode must be one of none, remove, compact, found {}",
                        echo::json(value)
                    ))
                }
            },
            ("compact_mode", value) => match value.as_str().and_then(CompactMode::parse) {
                Some(mode) => expiration.compact_mode = ROption::RSome(mode),
                None => {
                    return bad(format!(
                        "compact_mode must be one of first_n_chars, ai_summary, found {}",
                        echo::json(value)
                    ))
                }
            },
            _ => expiration.extra.push(member(key, value)),
        }
    }
    Ok(expiration)
}

/// Parses a history: a JSON array of message objects. Errors name the message index:
/// `message 3: unknown role "robot"`.
pub fn parse_history(value: &Value) -> Result<Vec<RArc<Message>>, ShapeError> {
    let Value::Array(messages) = value else {
        return bad(format!("expected an array of messages, found {}", kind(value)));
    };
    messages
        .iter()
        .enumerate()
        .map(|(index, value)| {
            parse_message(value)
                .map(RArc::new)
                .map_err(|e| ShapeError(format!("message {index}: {}", e.0)))
        })
        .collect()
}

/// Writes compact JSON. Kept members are spliced in verbatim.
struct Writer {
    out: String,
    first: bool,
}

impl Writer {
    fn open(out: String) -> Writer {
        let mut writer = Writer { out, first: true };
        writer.out.push('{');
        writer
    }
    fn key(&mut self, key: &str) {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        write_string(&mut self.out, key);
        self.out.push(':');
    }
    fn string(&mut self, key: &str, value: &str) {
        self.key(key);
        write_string(&mut self.out, value);
    }
    fn raw(&mut self, key: &str, json: &str) {
        self.key(key);
        self.out.push_str(json);
    }
    /// Writes the kept members in a form the parser keeps (`form`) whose typed field is
    /// not set (`set`), each key once (its last): the writer never writes a member that
    /// shadows a field the types model (see `plugin_api::faithful::check_faithful`).
    fn extra(&mut self, extra: &[Member], form: impl Fn(&Member) -> bool, set: impl Fn(&str) -> bool) {
        let repeated = repeated_key(extra).is_some();
        for (i, m) in extra.iter().enumerate() {
            if !set(&m.key) && form(m) && (!repeated || last_of_its_key(extra, i)) {
                self.raw(&m.key, &m.json);
            }
        }
    }
    fn close(mut self) -> String {
        self.out.push('}');
        self.out
    }
}

/// Appends `value` as a JSON string, escaped byte for byte as serde_json escapes it (`"`,
/// `\\`, the short escapes `\b \f \n \r \t`, other control characters as `\u00xx`;
/// nothing else), straight into `out`: the unescaped runs are copied whole, and found
/// eight bytes at a time.
fn write_string(out: &mut String, value: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(value.len() + 2);
    out.push('"');
    let bytes = value.as_bytes();
    let mut run = 0;
    let mut i = 0;
    while i < bytes.len() {
        if let Some(word) = bytes.get(i..i + 8) {
            if !any_escaped(u64::from_le_bytes(word.try_into().unwrap_or_default())) {
                i += 8;
                continue;
            }
        }
        let byte = bytes[i];
        let short = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x0C => "\\f",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x00..=0x1F => "",
            _ => {
                i += 1;
                continue;
            }
        };
        // Escaped bytes are ASCII, so `run..i` lies on character boundaries.
        out.push_str(&value[run..i]);
        if short.is_empty() {
            out.push_str("\\u00");
            out.push(HEX[usize::from(byte >> 4)] as char);
            out.push(HEX[usize::from(byte & 0xF)] as char);
        } else {
            out.push_str(short);
        }
        i += 1;
        run = i;
    }
    out.push_str(&value[run..]);
    out.push('"');
}

/// Whether any of the eight bytes of `word` is one [`write_string`] escapes: below 0x20,
/// `"` or `\\`. (The zero-byte test: a borrow can mark a byte above a true match, never
/// a word without one.)
fn any_escaped(word: u64) -> bool {
    const ONES: u64 = u64::from_le_bytes([1; 8]);
    const HIGH: u64 = ONES << 7;
    let zero = |w: u64| w.wrapping_sub(ONES) & !w & HIGH;
    let control = word.wrapping_sub(ONES * 0x20) & !word & HIGH;
    control | zero(word ^ (ONES * u64::from(b'"'))) | zero(word ^ (ONES * u64::from(b'\\'))) != 0
}

fn write_content(out: &mut String, content: &Content) {
    match content {
        Content::Null => out.push_str("null"),
        Content::Text(text) => write_string(out, text),
        Content::Parts(parts) => {
            out.push('[');
            for (i, part) in parts.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                match part {
                    Part::Opaque { json } => out.push_str(json),
                    Part::Text { text, extra } => {
                        let mut w = Writer::open(std::mem::take(out));
                        w.string("type", "text");
                        w.string("text", text);
                        w.extra(extra, text_part_member_form, |_| false);
                        *out = w.close();
                    }
                }
            }
            out.push(']');
        }
    }
}

fn write_tool_call(out: &mut String, call: &ToolCall) {
    let mut w = Writer::open(std::mem::take(out));
    w.string("id", &call.id);
    if call.has_function {
        w.key("function");
        let mut f = Writer::open(std::mem::take(&mut w.out));
        f.string("name", &call.name);
        if call.arguments_is_json {
            f.raw("arguments", &call.arguments);
        } else {
            f.string("arguments", &call.arguments);
        }
        f.extra(&call.function_extra, function_member_form, |_| false);
        w.out = f.close();
    }
    w.extra(&call.extra, call_member_form, |key| call_field_set(call, key));
    *out = w.close();
}

fn write_metadata(out: &mut String, meta: &Metadata) {
    let mut w = Writer::open(std::mem::take(out));
    macro_rules! field {
        ($name:literal, $value:expr, |$w:ident, $v:ident| $write:expr) => {
            if let ROption::RSome($v) = &$value {
                let $w = &mut w;
                $w.key($name);
                $write;
            }
        };
    }
    field!("id", meta.id, |w, v| write_string(&mut w.out, v));
    field!("timestamp", meta.timestamp, |w, v| write_string(&mut w.out, v));
    field!("turn_added", meta.turn_added, |w, v| w
        .out
        .push_str(&v.to_string()));
    field!("message_type", meta.message_type, |w, v| write_string(
        &mut w.out, v
    ));
    field!("retention_policy", meta.retention_policy, |w, v| {
        w.out.push('[');
        for (i, entry) in v.iter().enumerate() {
            if i > 0 {
                w.out.push(',');
            }
            match entry {
                ROption::RSome(n) => w.out.push_str(&n.to_string()),
                ROption::RNone => w.out.push_str("null"),
            }
        }
        w.out.push(']');
    });
    field!("expiration", meta.expiration, |w, v| {
        let mut e = Writer::open(std::mem::take(&mut w.out));
        if let ROption::RSome(turns) = v.turns {
            e.raw("turns", &turns.to_string());
        }
        if let ROption::RSome(mode) = v.mode {
            e.string("mode", mode.as_str());
        }
        if let ROption::RSome(mode) = v.compact_mode {
            e.string("compact_mode", mode.as_str());
        }
        if let ROption::RSome(length) = v.compact_length {
            e.raw("compact_length", &length.to_string());
        }
        e.extra(&v.extra, expiration_member_form, |key| {
            expiration_field_set(v, key)
        });
        w.out = e.close();
    });
    field!("was_compacted", meta.was_compacted, |w, v| w
        .out
        .push_str(if *v { "true" } else { "false" }));
    field!("can_expand", meta.can_expand, |w, v| w.out.push_str(if *v {
        "true"
    } else {
        "false"
    }));
    field!("is_expired", meta.is_expired, |w, v| w.out.push_str(if *v {
        "true"
    } else {
        "false"
    }));
    field!("omitted", meta.omitted, |w, v| w.out.push_str(if *v {
        "true"
    } else {
        "false"
    }));
    field!("original_content", meta.original_content, |w, v| write_content(
        &mut w.out, v
    ));
    field!("original_length", meta.original_length, |w, v| w
        .out
        .push_str(&v.to_string()));
    field!("tokens_saved", meta.tokens_saved, |w, v| w
        .out
        .push_str(&v.to_string()));
    w.extra(&meta.extra, metadata_member_form, |key| {
        metadata_field_set(meta, key)
    });
    *out = w.close();
}

/// Appends one message as compact JSON.
pub fn write_message(out: &mut String, message: &Message) {
    write_message_as(out, message, WithMetadata::Yes);
}

/// Whether a message is written with its `metadata` member.
#[derive(Clone, Copy, PartialEq, Eq)]
enum WithMetadata {
    Yes,
    No,
}

fn write_message_as(out: &mut String, message: &Message, metadata: WithMetadata) {
    let mut w = Writer::open(std::mem::take(out));
    w.string("role", message.role.as_str());
    if message.content != Content::Null {
        w.key("content");
        write_content(&mut w.out, &message.content);
    }
    if !message.tool_calls.is_empty() {
        w.key("tool_calls");
        w.out.push('[');
        for (i, call) in message.tool_calls.iter().enumerate() {
            if i > 0 {
                w.out.push(',');
            }
            write_tool_call(&mut w.out, call);
        }
        w.out.push(']');
    }
    if let ROption::RSome(id) = &message.tool_call_id {
        w.string("tool_call_id", id);
    }
    if let ROption::RSome(name) = &message.name {
        w.string("name", name);
    }
    if let (ROption::RSome(meta), WithMetadata::Yes) = (&message.metadata, metadata) {
        w.key("metadata");
        write_metadata(&mut w.out, meta);
    }
    w.extra(
        &message.extra,
        |m| message_member_form(message.role, m),
        |key| message_field_set(message, key),
    );
    *out = w.close();
}

/// One message as compact JSON text.
pub fn message_to_string(message: &Message) -> String {
    let mut out = String::new();
    write_message(&mut out, message);
    out
}

/// A history as a compact JSON array.
pub fn history_to_string(history: &[RArc<Message>]) -> String {
    write_history(history, WithMetadata::Yes)
}

/// A history as a model provider is sent it (docs/wire-format.md#metadata): a compact
/// JSON array of the messages without their `metadata` members. Metadata is the host's
/// own (stamps, policies, the originals of omitted content): a provider has no use for
/// it, and OpenAI's API refuses a message member it does not know.
pub fn provider_history_to_string(history: &[RArc<Message>]) -> String {
    write_history(history, WithMetadata::No)
}

fn write_history(history: &[RArc<Message>], metadata: WithMetadata) -> String {
    let mut out = String::from("[");
    for (i, message) in history.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_message_as(&mut out, message, metadata);
    }
    out.push(']');
    out
}

/// Parses JSON text into a history (test and tooling convenience).
pub fn history_from_str(json: &str) -> Result<Vec<RArc<Message>>, ShapeError> {
    let value: Value = serde_json::from_str(json).map_err(|e| ShapeError(format!("not valid JSON: {e}")))?;
    parse_history(&value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_api::faithful::check_faithful;

    fn round_trip(json: &str) {
        let value: Value = serde_json::from_str(json).unwrap();
        let message = parse_message(&value).unwrap();
        let back: Value = serde_json::from_str(&message_to_string(&message)).unwrap();
        assert_eq!(value, back, "{json}");
        // What the parser keeps verbatim never shadows a modelled field.
        assert_eq!(check_faithful(&message), Ok(()), "{json}");
    }

    fn call_with(function: &str) -> String {
        format!(
            r#"{{"role":"assistant","content":null,"tool_calls":[{{"id":"c1","type":"function","function":{function}}}]}}"#
        )
    }

    fn parsed(json: &str) -> Message {
        parse_message(&serde_json::from_str(json).unwrap()).unwrap()
    }

    #[test]
    fn messages_round_trip_as_the_same_json_value() {
        round_trip(r#"{"role":"user","content":"hi"}"#);
        round_trip(r#"{"role":"user"}"#);
        round_trip(
            r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"q\":1}"}}]}"#,
        );
        round_trip(
            r#"{"role":"assistant","content":"","tool_calls":[{"id":"c1","function":{"name":"f","arguments":{"q":1},"x":2},"extra":[1]}]}"#,
        );
        round_trip(r#"{"role":"assistant","tool_calls":[]}"#);
        round_trip(
            r#"{"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":5}]}"#,
        );
        round_trip(r#"{"role":"developer","content":"d","name":null,"weird":{"a":[1,2]}}"#);
        round_trip(r#"{"role":"user","content":"x","tool_calls":[{"id":1}]}"#);
        round_trip(
            r#"{"role":"user","content":"x","metadata":{"id":"m1","turn_added":3,"retention_policy":[null,2],"expiration":{"turns":2,"mode":"compact","compact_mode":"first_n_chars","compact_length":0,"extra":true},"omitted":"yes","was_compacted":false,"original_content":[{"type":"text","text":"o"}],"original_length":10,"tokens_saved":-2,"custom":{"k":"v"},"id2":null}}"#,
        );
        round_trip(
            r#"{"role":"user","content":"x","metadata":{"id":5,"original_content":7,"turn_added":null}}"#,
        );
    }

    #[test]
    fn every_member_the_parser_keeps_verbatim_round_trips() {
        // Known members in a form the types do not hold, at every level.
        round_trip(
            r#"{"role":"assistant","content":null,"tool_calls":null,"tool_call_id":null,"name":null,"metadata":null}"#,
        );
        round_trip(
            r#"{"role":"user","content":"x","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]}"#,
        );
        round_trip(r#"{"role":"system","content":"x","tool_calls":"opaque","tool_call_id":7,"name":["n"]}"#);
        round_trip(r#"{"role":"tool","tool_call_id":"c","content":"x","name":5}"#);
        round_trip(
            r#"{"role":"user","content":"x","metadata":{"id":null,"timestamp":1,"message_type":false,"turn_added":null,"retention_policy":null,"expiration":null,"was_compacted":"no","can_expand":1,"is_expired":null,"omitted":[],"original_content":[1,2],"original_length":-1,"tokens_saved":1.5}}"#,
        );
        round_trip(
            r#"{"role":"user","content":"x","metadata":{"expiration":{"turns":null,"mode":null,"compact_mode":null,"compact_length":null}}}"#,
        );
    }

    #[test]
    fn tool_calls_of_any_function_shape_round_trip() {
        for function in [
            r#"{}"#,
            r#"{"name":null,"arguments":null}"#,
            r#"{"name":5,"arguments":"{\"q\":1}"}"#,
            r#"{"name":"f"}"#,
            r#"{"arguments":"{}","strict":true}"#,
            r#"{"name":"f","arguments":null}"#,
            r#"{"name":{"x":[1]},"arguments":{"q":2}}"#,
            r#""search""#,
            r#"null"#,
            r#"{"name":"f","arguments":{"q":3},"x":1}"#,
            r#"{"name":"","arguments":""}"#,
        ] {
            round_trip(&call_with(function));
        }
    }

    #[test]
    fn a_function_of_another_shape_is_measured_name_and_arguments_each_as_json_text() {
        let items = |function: &str| -> Vec<String> {
            let message = parsed(&call_with(function));
            message.token_items().map(str::to_string).collect()
        };
        // A string as it is; any other value as its JSON text, a non-string name too;
        // a missing or null one as nothing.
        assert_eq!(items(r#"{"name":"f","arguments":"{}"}"#), ["f", "{}"]);
        assert_eq!(items(r#"{"name":"f","arguments":{"q":1}}"#), ["f", r#"{"q":1}"#]);
        assert_eq!(
            items(r#"{"name":5,"arguments":"{\"q\":1}"}"#),
            ["5", r#"{"q":1}"#]
        );
        assert_eq!(
            items(r#"{"name":{"x":[1]},"arguments":{"q":2}}"#),
            [r#"{"x":[1]}"#, r#"{"q":2}"#]
        );
        assert_eq!(items(r#"{"name":null,"arguments":null}"#), ["", ""]);
        assert_eq!(items(r#"{}"#), ["", ""]);
        assert_eq!(items(r#"{"name":"g","arguments":null}"#), ["g", ""]);
        assert_eq!(items(r#""search""#), ["", ""]);
        let odd = parsed(&call_with(r#"{"name":null,"arguments":null}"#));
        assert!(!odd.tool_calls[0].has_function, "kept verbatim, not modelled");
    }

    #[test]
    fn a_kept_member_that_shadows_a_modelled_field_is_refused_and_never_written() {
        let member = |key: &str, json: &str| Member {
            key: key.into(),
            json: json.into(),
        };
        let assistant = parsed(&call_with(r#"{"name":"search","arguments":"{}"}"#));
        let user = parsed(
            r#"{"role":"user","content":[{"type":"text","text":"hi"}],"metadata":{"id":"m","expiration":{"turns":1}}}"#,
        );
        let cases: Vec<(Message, &str, &str)> = vec![
            (
                {
                    let mut m = parsed(r#"{"role":"assistant","content":"done"}"#);
                    m.extra.push(member(
                        "tool_calls",
                        r#"[{"id":"x","function":{"name":"rm_rf","arguments":"{}"}}]"#,
                    ));
                    m
                },
                r#"extra member "tool_calls" shadows"#,
                "rm_rf",
            ),
            (
                {
                    let mut m = assistant.clone();
                    m.extra.push(member("content", r#""hidden""#));
                    m
                },
                r#"extra member "content" shadows"#,
                "hidden",
            ),
            (
                {
                    let mut m = parsed(r#"{"role":"user","content":"u"}"#);
                    m.extra.push(member("metadata", r#"{"turn_added":0}"#));
                    m
                },
                r#"extra member "metadata" shadows"#,
                "turn_added",
            ),
            (
                {
                    let mut m = user.clone();
                    m.extra.push(member("role", r#""system""#));
                    m
                },
                r#"extra member "role" shadows"#,
                "system",
            ),
            (
                {
                    let mut m = parsed(r#"{"role":"user","content":"u"}"#);
                    m.extra.push(member("name", r#""bob""#));
                    m
                },
                r#"extra member "name" shadows"#,
                "bob",
            ),
            (
                {
                    let mut m = parsed(r#"{"role":"tool","tool_call_id":"c1","content":"r"}"#);
                    m.extra.push(member("tool_call_id", r#""c2""#));
                    m
                },
                r#"extra member "tool_call_id" shadows"#,
                "c2",
            ),
            (
                {
                    let mut m = user.clone();
                    m.extra.push(member("note", "1"));
                    m.extra.push(member("note", "2"));
                    m
                },
                r#"extra member "note" is given twice"#,
                "\"note\":1",
            ),
            (
                {
                    let mut m = user.clone();
                    m.meta_mut().extra.push(member("turn_added", "0"));
                    m
                },
                r#"metadata: extra member "turn_added" shadows"#,
                "turn_added",
            ),
            (
                {
                    let mut m = user.clone();
                    m.meta_mut().extra.push(member("id", r#""other""#));
                    m
                },
                r#"metadata: extra member "id" shadows"#,
                "other",
            ),
            (
                {
                    let mut m = user.clone();
                    m.meta_mut().extra.push(member("original_content", r#""big""#));
                    m
                },
                r#"metadata: extra member "original_content" shadows"#,
                "big",
            ),
            (
                {
                    let mut m = user.clone();
                    if let ROption::RSome(expiration) = &mut m.meta_mut().expiration {
                        expiration.extra.push(member("mode", r#""remove""#));
                    }
                    m
                },
                r#"metadata.expiration: extra member "mode" shadows"#,
                "remove",
            ),
            (
                {
                    let mut m = user.clone();
                    if let Content::Parts(parts) = &mut m.content {
                        if let Part::Text { extra, .. } = &mut parts[0] {
                            extra.push(member("text", r#""other""#));
                        }
                    }
                    m
                },
                r#"content[0]: extra member "text" shadows"#,
                "other",
            ),
            (
                {
                    let mut m = assistant.clone();
                    m.tool_calls[0].extra.push(member("id", r#""c9""#));
                    m
                },
                r#"tool_calls[0]: extra member "id" shadows"#,
                "c9",
            ),
            (
                {
                    let mut m = assistant.clone();
                    m.tool_calls[0].has_function = false;
                    m.tool_calls[0]
                        .extra
                        .push(member("function", r#"{"name":"rm_rf","arguments":"{}"}"#));
                    m
                },
                r#"tool_calls[0]: extra member "function" shadows"#,
                "rm_rf",
            ),
            (
                {
                    let mut m = assistant.clone();
                    m.tool_calls[0]
                        .function_extra
                        .push(member("arguments", r#""{\"path\":\"/\"}""#));
                    m
                },
                r#"tool_calls[0].function: extra member "arguments" shadows"#,
                "path",
            ),
            (
                {
                    // A function of another shape with arguments the typed fields do not show.
                    let mut m = parsed(&call_with(r#"{"name":null,"arguments":null}"#));
                    m.tool_calls[0].extra[1] = member(
                        "function",
                        &format!(r#"{{"name":null,"arguments":"{}"}}"#, "x".repeat(100)),
                    );
                    m
                },
                "tool_calls[0]: name and arguments differ",
                "",
            ),
        ];
        // Each case: the message, the fault the check names, and what the writer leaves out.
        for (message, fault, left_out) in cases {
            let err = check_faithful(&message).unwrap_err();
            assert!(err.starts_with(fault), "{err} (expected {fault})");
            let written = message_to_string(&message);
            let back = parse_message(&serde_json::from_str(&written).unwrap()).unwrap();
            assert_eq!(check_faithful(&back), Ok(()), "{written}");
            assert!(left_out.is_empty() || !written.contains(left_out), "{written}");
        }
    }

    #[test]
    fn a_kept_null_under_a_field_a_plugin_set_is_not_written_and_not_refused() {
        // What a plugin gets by giving content, metadata or a call's usual function to a
        // copy of a message that came with them null (or of another shape).
        let mut message = parsed(
            r#"{"role":"assistant","content":null,"metadata":null,"name":7,"tool_calls":[{"id":"c","function":{}}]}"#,
        );
        message.content = Content::Text("merged".into());
        message.meta_mut().id = ROption::RSome("m".into());
        message.name = ROption::RSome("bot".into());
        let call = &mut message.tool_calls[0];
        call.has_function = true;
        call.name = "f".into();
        call.arguments = "{}".into();
        assert_eq!(check_faithful(&message), Ok(()));
        let written: Value = serde_json::from_str(&message_to_string(&message)).unwrap();
        let expected: Value = serde_json::from_str(
            r#"{"role":"assistant","content":"merged","name":"bot","metadata":{"id":"m"},"tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]}"#,
        )
        .unwrap();
        assert_eq!(written, expected);
    }

    #[test]
    fn a_key_given_twice_is_echoed_on_one_line() {
        let mut message = parsed(r#"{"role":"user","content":"u"}"#);
        for _ in 0..2 {
            message.extra.push(Member {
                key: "a\nb\u{1b}[31m".into(),
                json: "1".into(),
            });
        }
        assert_eq!(
            check_faithful(&message),
            Err(r#"extra member "a\nb\u{1b}[31m" is given twice"#.to_string())
        );
    }

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        let mut every_ascii: String = (0u8..0x80).map(char::from).collect();
        every_ascii.push_str("é ∑ 🦀 \u{2028} \u{7f} end\\");
        // Each escaped byte at each offset of an eight-byte word, among bytes that are not.
        let mut shifted = Vec::new();
        for escaped in ['"', '\\', '\n', '\u{0}', '\u{1f}', '\u{8}'] {
            for offset in 0..17 {
                let mut text: Vec<char> = "aé~ \u{7f}z!0123456789".chars().cycle().take(20).collect();
                text.insert(offset, escaped);
                shifted.push(text.into_iter().collect::<String>());
            }
        }
        let fixed = [
            every_ascii.as_str(),
            "",
            "plain",
            "\"",
            "a\nb\u{0}c\u{1f}",
            "exactly8",
            "sixteen bytes!!!",
        ];
        for text in fixed.into_iter().chain(shifted.iter().map(String::as_str)) {
            let mut ours = String::new();
            write_string(&mut ours, text);
            assert_eq!(ours, serde_json::to_string(text).unwrap(), "{text:?}");
        }
    }

    #[test]
    fn a_provider_is_sent_the_messages_without_their_metadata() {
        let json = r#"[{"role":"user","content":"a","metadata":{"id":"m1","turn_added":1}},{"role":"tool","tool_call_id":"c","content":"[Omitted]","metadata":{"omitted":true,"original_content":"long"},"x":1}]"#;
        let history = history_from_str(json).unwrap();
        assert_eq!(
            provider_history_to_string(&history),
            r#"[{"role":"user","content":"a"},{"role":"tool","content":"[Omitted]","tool_call_id":"c","x":1}]"#
        );
        assert_eq!(
            serde_json::from_str::<Value>(&history_to_string(&history)).unwrap(),
            serde_json::from_str::<Value>(json).unwrap()
        );
    }

    #[test]
    fn shape_errors_say_what_is_wrong() {
        let err = |json: &str| parse_history(&serde_json::from_str(json).unwrap()).unwrap_err().0;
        assert_eq!(
            err(r#"[{"role":"user","content":"a"},{"role":"robot"}]"#),
            "message 1: unknown role \"robot\""
        );
        assert_eq!(
            err(r#"[{"role":"tool","content":"a"}]"#),
            "message 0: tool message without tool_call_id"
        );
        assert!(err(r#"[{"role":"user","content":5}]"#).starts_with("message 0: content must be"));
        assert!(err(r#"[{"role":"user","content":[1]}]"#).starts_with("message 0: content must be"));
        assert_eq!(
            err(r#"[{"role":"assistant","tool_calls":[{"type":"function"}]}]"#),
            "message 0: tool_calls[0]: tool call without id"
        );
        assert!(err(r#"[{"role":"user","metadata":{"turn_added":0}}]"#).contains("metadata.turn_added"));
        assert!(
            err(r#"[{"role":"user","metadata":{"retention_policy":[-1]}}]"#).contains("retention_policy[0]")
        );
        assert!(
            err(r#"[{"role":"user","metadata":{"expiration":{"mode":"later"}}}]"#)
                .contains("expiration.mode")
        );
        assert!(err(r#"[{"role":"user","metadata":[]}]"#).contains("metadata must be an object"));
        assert!(err(r#"{"role":"user"}"#).contains("expected an array"));
    }
}
