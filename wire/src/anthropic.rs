//! Anthropic's Messages API (docs/proxy.md#anthropic-messages): a request's `system` and
//! `messages` read into the host's messages, and the chain's output written back.
//!
//! The mapping (lossless): `system` is one leading system message; an assistant message is
//! one assistant message whose `tool_use` blocks are its tool calls (the `input` as JSON
//! arguments) and whose other blocks are its content parts (`text` typed, every other
//! block opaque, verbatim); a user message is one `tool` message per `tool_result` block,
//! then one user message with the other blocks. Writing back, an Anthropic message whose
//! host messages all came out of the chain unchanged is written as the bytes it came in.

use std::collections::HashMap;
use std::sync::Arc;

use plugin_api::{Content, Member, Message, Part, RArc, Role, ToolCall};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

mod write;

pub use write::{write, Written};

/// A request that is not Anthropic's shape, with the path of the offending member.
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

/// A parsed request: the host messages, and what writing back needs.
pub struct Parsed<'a> {
    /// The host messages: the system message (if any) first, then each Anthropic message's.
    pub messages: Vec<RArc<Message>>,
    /// The raw text of `system`, and whether it gave a host message.
    system: Option<&'a str>,
    /// `cache_control` markers in `system`.
    system_marks: usize,
    /// Each Anthropic message: its raw text, the range of its host messages in `messages`,
    /// and its `cache_control` markers.
    inputs: Vec<Input<'a>>,
    /// Per host message: for an assistant message, its blocks' order (`true` = a tool call).
    order: Vec<Vec<bool>>,
    /// `cache_control` markers in the request (system and messages).
    pub cache_breakpoints: usize,
    /// Each block whose bytes are not its compact JSON: compact JSON → the bytes it came
    /// in, so a changed message's unchanged blocks are written as they came.
    blocks: HashMap<String, &'a str>,
    /// Host identity (set by the host after parsing) → host message index.
    origins: HashMap<u64, usize>,
}

struct Input<'a> {
    raw: &'a str,
    start: usize,
    end: usize,
    cache_breakpoints: usize,
    /// Read here (not given by the memory): the blocks not written as their compact JSON,
    /// for [`Read`].
    fresh: Option<Vec<(String, usize, usize)>>,
}

/// One Anthropic message read: its host messages and what writing them back needs. Made
/// by [`parse_with`] (see [`Parsed::reads`]), kept by a [`Memory`], so a resent message
/// is neither parsed nor made again (docs/proxy.md#stateless-by-default).
pub struct Read {
    messages: Vec<RArc<Message>>,
    order: Vec<Vec<bool>>,
    marks: usize,
    /// Each block not written as its compact JSON: that JSON, and where the block is in
    /// the message's text.
    blocks: Vec<(String, usize, usize)>,
    len: usize,
}

impl Read {
    /// Bytes it holds, for a memory's bound: its messages counted as the text they came
    /// from.
    pub fn weight(&self) -> usize {
        2 * self.len + std::mem::size_of::<Read>()
    }
}

/// What was read before: an Anthropic message from exactly these bytes.
pub trait Memory {
    fn message(&self, raw: &str) -> Option<Arc<Read>>;
}

/// No memory: every message parsed.
pub struct Forgetful;

impl Memory for Forgetful {
    fn message(&self, _: &str) -> Option<Arc<Read>> {
        None
    }
}

impl<'a> Parsed<'a> {
    /// The messages read here, for a memory to keep: each one's text and what it was read
    /// into, its host messages as they are in [`Parsed::messages`] now (keep them once
    /// prepared, with their identities).
    pub fn reads(&self) -> impl Iterator<Item = (&'a str, Read)> + '_ {
        self.inputs.iter().filter_map(|input| {
            let blocks = input.fresh.as_ref()?;
            Some((
                input.raw,
                Read {
                    messages: self.messages[input.start..input.end].to_vec(),
                    order: self.order[input.start..input.end].to_vec(),
                    marks: input.cache_breakpoints,
                    blocks: blocks.clone(),
                    len: input.raw.len(),
                },
            ))
        })
    }

    /// Remembers the identities the host gave the messages (after `turns::prepare`), so
    /// that a changed copy's blocks are written back in their order.
    pub fn note_origins(&mut self) {
        self.origins = self
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| (m.origin(), i))
            .collect();
    }
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

fn member(key: &str, value: &Value) -> Member {
    Member {
        key: key.into(),
        json: value.to_string().into(),
    }
}

fn others(object: &Map<String, Value>, skip: &[&str]) -> plugin_api::RVec<Member> {
    object
        .iter()
        .filter(|(key, _)| !skip.contains(&key.as_str()))
        .map(|(key, value)| member(key, value))
        .collect()
}

fn has_cache_control(block: &Value) -> usize {
    usize::from(block.get("cache_control").is_some())
}

/// Parses `system` (raw JSON text, if present) and each message's raw JSON text.
pub fn parse<'a>(system: Option<&'a str>, messages: &[&'a str]) -> Result<Parsed<'a>, ShapeError> {
    parse_with(system, messages, &Forgetful)
}

/// [`parse`], taking from `memory` the messages it read before.
pub fn parse_with<'a>(
    system: Option<&'a str>,
    messages: &[&'a str],
    memory: &dyn Memory,
) -> Result<Parsed<'a>, ShapeError> {
    let mut parsed = Parsed {
        messages: Vec::with_capacity(messages.len() + 1),
        system: None,
        system_marks: 0,
        inputs: Vec::with_capacity(messages.len()),
        order: Vec::new(),
        cache_breakpoints: 0,
        blocks: HashMap::new(),
        origins: HashMap::new(),
    };
    if let Some(raw) = system {
        let value: Value = serde_json::from_str(raw).map_err(|e| ShapeError(format!("system: {e}")))?;
        if !value.is_null() {
            let (content, marks) = parse_system(&value)?;
            if let Value::Array(system_blocks) = &value {
                let mut blocks = Vec::new();
                remember_array(raw, system_blocks, &mut blocks);
                parsed.blocks.extend(blocks);
            }
            parsed.cache_breakpoints += marks;
            parsed.system_marks = marks;
            parsed
                .messages
                .push(RArc::new(Message::new(Role::System, content)));
            parsed.order.push(Vec::new());
            parsed.system = Some(raw);
        }
    }
    for (index, raw) in messages.iter().enumerate() {
        let start = parsed.messages.len();
        if let Some(read) = memory.message(raw) {
            parsed.messages.extend(read.messages.iter().cloned());
            parsed.order.extend(read.order.iter().cloned());
            for (compact, from, to) in &read.blocks {
                parsed.blocks.insert(compact.clone(), &raw[*from..*to]);
            }
            parsed.cache_breakpoints += read.marks;
            parsed.inputs.push(Input {
                raw,
                start,
                end: parsed.messages.len(),
                cache_breakpoints: read.marks,
                fresh: None,
            });
            continue;
        }
        let value: Value =
            serde_json::from_str(raw).map_err(|e| ShapeError(format!("messages[{index}]: {e}")))?;
        let mut blocks = Vec::new();
        remember_blocks(raw, &value, &mut blocks);
        let marks = parse_message(&value, &mut parsed)
            .map_err(|e| ShapeError(format!("messages[{index}]: {}", e.0)))?;
        parsed.cache_breakpoints += marks;
        let mut fresh = Vec::with_capacity(blocks.len());
        for (compact, block) in blocks {
            // Where the block is in the message's text: it was read from it.
            let from = block.as_ptr() as usize - raw.as_ptr() as usize;
            fresh.push((compact.clone(), from, from + block.len()));
            parsed.blocks.insert(compact, block);
        }
        parsed.inputs.push(Input {
            raw,
            start,
            end: parsed.messages.len(),
            cache_breakpoints: marks,
            fresh: Some(fresh),
        });
    }
    Ok(parsed)
}

/// The bytes of each block of a message's content array that did not come as its compact
/// JSON, with that JSON.
fn remember_blocks<'a>(raw: &'a str, value: &Value, blocks: &mut Vec<(String, &'a str)>) {
    let Some(Value::Array(content)) = value.get("content") else {
        return;
    };
    let Ok(object) = serde_json::from_str::<std::collections::BTreeMap<String, &'a RawValue>>(raw) else {
        return;
    };
    if let Some(raw_content) = object.get("content") {
        remember_array(raw_content.get(), content, blocks);
    }
}

/// The same for an array of blocks given as its raw text and its value.
fn remember_array<'a>(raw: &'a str, content: &[Value], blocks: &mut Vec<(String, &'a str)>) {
    let Ok(raw_blocks) = serde_json::from_str::<Vec<&'a RawValue>>(raw) else {
        return;
    };
    for (block, raw_block) in content.iter().zip(raw_blocks) {
        let compact = block.to_string();
        if compact != raw_block.get() {
            blocks.push((compact, raw_block.get()));
        }
    }
}

fn parse_system(value: &Value) -> Result<(Content, usize), ShapeError> {
    match value {
        Value::String(text) => Ok((Content::Text(text.as_str().into()), 0)),
        Value::Array(blocks) => {
            let mut parts = plugin_api::RVec::new();
            let mut marks = 0;
            for (i, block) in blocks.iter().enumerate() {
                if !block.is_object() {
                    return bad(format!(
                        "system[{i}]: expected a block object, found {}",
                        kind(block)
                    ));
                }
                marks += has_cache_control(block);
                parts.push(parse_part(block));
            }
            Ok((Content::Parts(parts), marks))
        }
        other => bad(format!(
            "system: expected a string or an array of blocks, found {}",
            kind(other)
        )),
    }
}

/// A content block as a part: `text` typed (its other members kept), any other opaque.
fn parse_part(block: &Value) -> Part {
    match (block.get("type"), block.get("text"), block.as_object()) {
        (Some(Value::String(t)), Some(Value::String(text)), Some(object)) if t == "text" => Part::Text {
            text: text.as_str().into(),
            extra: others(object, &["type", "text"]),
        },
        _ => Part::Opaque {
            json: block.to_string().into(),
        },
    }
}

/// One Anthropic message into its host messages; the number of `cache_control` markers.
fn parse_message(value: &Value, parsed: &mut Parsed<'_>) -> Result<usize, ShapeError> {
    let Value::Object(object) = value else {
        return bad(format!("expected a message object, found {}", kind(value)));
    };
    let role = match object.get("role") {
        Some(Value::String(role)) if role == "user" => Role::User,
        Some(Value::String(role)) if role == "assistant" => Role::Assistant,
        Some(other) => return bad(format!("role must be \"user\" or \"assistant\", found {other}")),
        None => return bad("missing role"),
    };
    let extra = others(object, &["role", "content"]);
    let blocks = match object.get("content") {
        Some(Value::String(text)) => {
            let mut message = Message::new(role, Content::Text(text.as_str().into()));
            message.extra = extra;
            parsed.messages.push(RArc::new(message));
            parsed.order.push(Vec::new());
            return Ok(0);
        }
        Some(Value::Array(blocks)) => blocks,
        Some(other) => {
            return bad(format!(
                "content must be a string or an array of blocks, found {}",
                kind(other)
            ))
        }
        None => return bad("missing content"),
    };
    let mut marks = 0;
    let mut message = Message::new(role, Content::Parts(plugin_api::RVec::new()));
    message.extra = extra;
    let mut parts = plugin_api::RVec::new();
    let mut order = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        let Value::Object(fields) = block else {
            return bad(format!(
                "content[{i}]: expected a block object, found {}",
                kind(block)
            ));
        };
        marks += has_cache_control(block);
        let block_type = fields.get("type").and_then(Value::as_str);
        match (role, block_type) {
            (Role::Assistant, Some("tool_use")) => {
                message
                    .tool_calls
                    .push(parse_tool_use(fields).map_err(|e| ShapeError(format!("content[{i}]: {}", e.0)))?);
                order.push(true);
            }
            (Role::User, Some("tool_result")) => {
                let tool =
                    parse_tool_result(fields).map_err(|e| ShapeError(format!("content[{i}]: {}", e.0)))?;
                parsed.messages.push(RArc::new(tool));
                parsed.order.push(Vec::new());
            }
            _ => {
                parts.push(parse_part(block));
                order.push(false);
            }
        }
    }
    // A user message of tool results only is its tool messages alone.
    if role == Role::Assistant || !parts.is_empty() || blocks.is_empty() {
        message.content = Content::Parts(parts);
        parsed.messages.push(RArc::new(message));
        parsed.order.push(order);
    }
    Ok(marks)
}

fn parse_tool_use(fields: &Map<String, Value>) -> Result<ToolCall, ShapeError> {
    let id = match fields.get("id") {
        Some(Value::String(id)) => id,
        Some(other) => return bad(format!("tool_use id must be a string, found {}", kind(other))),
        None => return bad("tool_use block without id"),
    };
    let name = match fields.get("name") {
        Some(Value::String(name)) => name,
        Some(other) => return bad(format!("tool_use name must be a string, found {}", kind(other))),
        None => return bad("tool_use block without name"),
    };
    let Some(input) = fields.get("input") else {
        return bad("tool_use block without input");
    };
    Ok(ToolCall {
        id: id.as_str().into(),
        name: name.as_str().into(),
        arguments: input.to_string().into(),
        arguments_is_json: true,
        has_function: true,
        extra: others(fields, &["type", "id", "name", "input"]),
        function_extra: plugin_api::RVec::new(),
    })
}

fn parse_tool_result(fields: &Map<String, Value>) -> Result<Message, ShapeError> {
    let id = match fields.get("tool_use_id") {
        Some(Value::String(id)) => id,
        Some(other) => return bad(format!("tool_use_id must be a string, found {}", kind(other))),
        None => return bad("tool_result block without tool_use_id"),
    };
    let content = match fields.get("content") {
        None => Content::Null,
        Some(Value::String(text)) => Content::Text(text.as_str().into()),
        Some(Value::Array(blocks)) => {
            let mut parts = plugin_api::RVec::new();
            for (i, block) in blocks.iter().enumerate() {
                if !block.is_object() {
                    return bad(format!(
                        "tool_result content[{i}]: expected a block object, found {}",
                        kind(block)
                    ));
                }
                parts.push(parse_part(block));
            }
            Content::Parts(parts)
        }
        Some(other) => {
            return bad(format!(
                "tool_result content must be a string or an array of blocks, found {}",
                kind(other)
            ))
        }
    };
    let mut message = Message::new(Role::Tool, content);
    message.tool_call_id = plugin_api::ROption::RSome(id.as_str().into());
    message.extra = others(fields, &["type", "tool_use_id", "content"]);
    Ok(message)
}

#[cfg(test)]
mod tests;
