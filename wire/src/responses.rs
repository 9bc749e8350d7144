//! OpenAI's Responses wire (docs/proxy.md#responses): a request's `instructions` and
//! `input` read into the host's messages, and the chain's output written back as `input`
//! items, every item whose message(s) came out unchanged as the exact bytes it came in.
//!
//! The mapping (docs/proxy.md#the-mapping):
//! - `instructions` is a leading `system` message, written back as `instructions`;
//! - a string `input` is one `user` message, written back as that string if unchanged;
//! - `message` items of role user / system / developer are messages of that role;
//! - a run of consecutive model-side items (`reasoning`, assistant `message`s, `*_call`s,
//!   and any kind this module does not know) is ONE assistant message: calls with a
//!   `call_id` are its tool calls, the rest its content parts in order, so a reasoning item
//!   is kept or dropped with the call it precedes;
//! - `*_call_output` items with a `call_id` are `tool` messages answering that call.
//!
//! A client resends its whole input every call: a [`Memory`] (the proxy's, kept by the
//! server) gives back each item read before from the same bytes, and each message made
//! before from the same items, so a resent item is neither parsed nor made again
//! (docs/proxy.md#stateless-by-default).

use std::sync::Arc;

use plugin_api::{Content, Member, Message, Part, RArc, ROption, RVec, Role, ToolCall};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// One `input` item read: its members, and what it is in the mapping. Made by [`parse`],
/// kept by a [`Memory`].
pub struct Item {
    map: Map<String, Value>,
    read: Read,
    /// The length of the text it was read from.
    len: usize,
    /// Whether it is model-side (all but user / system / developer messages and call
    /// outputs), and whether a `reasoning` item: what the write-back's reasoning rule
    /// reads of it.
    model_side: bool,
    reasoning: bool,
}

enum Read {
    /// A user / system / developer `message` item: a unit of its own, this message.
    Message(Message),
    /// A `*_call_output` item: a unit of its own, this `tool` message.
    Output(Message),
    /// An assistant `message` of a run: its content parts; whether its `content` was a
    /// string.
    Said { parts: Vec<Part>, string: bool },
    /// A call of a run: the run's tool call; its item `type`.
    Call(ToolCall, String),
    /// Any other item of a run: one opaque content part.
    Opaque(Part),
}

impl Item {
    /// Bytes it holds, for a memory's bound: its members and its parts, each counted as
    /// the text it came from.
    pub fn weight(&self) -> usize {
        2 * self.len + std::mem::size_of::<Item>()
    }
}

/// What was read before: an item from exactly these bytes, a message from exactly these
/// items (the same [`Item`]s, compared by address).
pub trait Memory {
    fn item(&self, raw: &str) -> Option<Arc<Item>>;
    fn message(&self, items: &[Arc<Item>]) -> Option<RArc<Message>>;
}

/// No memory: every item parsed.
pub struct Forgetful;

impl Memory for Forgetful {
    fn item(&self, _: &str) -> Option<Arc<Item>> {
        None
    }
    fn message(&self, _: &[Arc<Item>]) -> Option<RArc<Message>> {
        None
    }
}

/// A request's history read into host messages, with what writing it back needs.
pub struct Parsed<'a> {
    /// One per unit, in order. Prepare them in place (turns, identities) before the run:
    /// [`Parsed::write`] finds the output's messages among them by identity.
    pub messages: Vec<RArc<Message>>,
    units: Vec<Unit<'a>>,
}

/// Where one host message came from.
struct Unit<'a> {
    source: Source<'a>,
    /// The items' texts and items (none for `instructions` or a string `input`).
    raws: Vec<&'a str>,
    items: Vec<Arc<Item>>,
    /// Whether its message was made here (not given by the memory).
    made: bool,
    /// Which of its items were parsed here.
    parsed: Vec<bool>,
}

enum Source<'a> {
    /// `instructions`: its raw JSON text.
    Instructions(&'a str),
    /// A string `input`: its raw JSON text.
    InputString(&'a str),
    /// One or more items.
    Items,
}

/// The chain's output written back.
#[derive(Debug, PartialEq, Eq)]
pub struct Written {
    /// The `instructions` member's JSON text; `None`: the request's leading system text
    /// did not come out of the chain, so the member is left out.
    pub instructions: Option<String>,
    /// The `input` member's JSON text.
    pub input: String,
}

fn text_member(key: &str, value: &Value) -> Member {
    Member {
        key: key.into(),
        json: value.to_string().into(),
    }
}

fn kind_of(item: &Map<String, Value>) -> &str {
    match item.get("type") {
        Some(Value::String(kind)) => kind,
        // An item without `type` but with a `role` is a message (OpenAI's EasyInputMessage).
        _ if item.contains_key("role") => "message",
        _ => "",
    }
}

fn call_id(item: &Map<String, Value>) -> Option<&str> {
    item.get("call_id").and_then(Value::as_str)
}

/// The mark of the identities [`parse`] gives (the engine's fresh ones have the top bit,
/// a session's are its positions, far below), so the write-back never takes another
/// message's identity for one of its own.
const ORIGIN_TAG: u64 = 1 << 62;

/// Reads `instructions` (raw JSON text, if present) and `input` (raw JSON text), every
/// item parsed.
pub fn parse<'a>(instructions: Option<&'a RawValue>, input: &'a RawValue) -> Result<Parsed<'a>, String> {
    parse_with(instructions, Input::Raw(input), &Forgetful)
}

/// `input` as the caller has it: its raw JSON text, or an array's items already split.
#[derive(Clone, Copy)]
pub enum Input<'a, 'b> {
    Raw(&'a RawValue),
    Items(&'b [&'a RawValue]),
}

/// [`parse`], taking from `memory` what it read before; `input` given as the caller has it
/// (a server that split the array while reading the body does not split it again).
pub fn parse_with<'a>(
    instructions: Option<&'a RawValue>,
    input: Input<'a, '_>,
    memory: &dyn Memory,
) -> Result<Parsed<'a>, String> {
    let mut units = Vec::new();
    let mut messages = Vec::new();
    if let Some(raw) = instructions {
        match serde_json::from_str::<Value>(raw.get()) {
            Ok(Value::String(text)) => {
                messages.push(RArc::new(Message::new(Role::System, Content::Text(text.into()))));
                units.push(Unit::of(Source::Instructions(raw.get())));
            }
            Ok(Value::Null) => {}
            _ => return Err("instructions: expected a string".into()),
        }
    }
    // Told apart by the first byte: the items are parsed once, one by one, not as a whole.
    let split;
    let items = match input {
        Input::Items(items) => Some(items),
        Input::Raw(raw) if raw.get().trim_start().starts_with('[') => {
            split =
                serde_json::from_str::<Vec<&'a RawValue>>(raw.get()).map_err(|e| format!("input: {e}"))?;
            Some(split.as_slice())
        }
        Input::Raw(_) => None,
    };
    match (items, input) {
        (Some(raws), _) => {
            read_items(raws, memory, &mut units)?;
            for unit in &mut units[messages.len()..] {
                let found = memory.message(&unit.items);
                unit.made = found.is_none();
                let message = found.unwrap_or_else(|| RArc::new(unit.make()));
                messages.push(message);
            }
        }
        (None, Input::Raw(input)) if input.get().trim_start().starts_with('"') => {
            let text: String = serde_json::from_str(input.get()).map_err(|e| format!("input: {e}"))?;
            messages.push(RArc::new(Message::new(Role::User, Content::Text(text.into()))));
            units.push(Unit::of(Source::InputString(input.get())));
        }
        _ => return Err("input: expected a string or an array of items".into()),
    }
    for (index, message) in messages.iter_mut().enumerate() {
        // Positions as identities on what is made here: the chain keeps them on what it
        // passes on, so the write-back finds a message's item(s) without searching.
        if message.origin() == 0 {
            RArc::make_mut(message).set_origin(ORIGIN_TAG | (index as u64 + 1));
        }
    }
    Ok(Parsed { messages, units })
}

impl<'a> Unit<'a> {
    fn of(source: Source<'a>) -> Unit<'a> {
        Unit {
            source,
            raws: Vec::new(),
            items: Vec::new(),
            made: true,
            parsed: Vec::new(),
        }
    }

    /// The host message of this unit's items.
    fn make(&self) -> Message {
        if let [item] = self.items.as_slice() {
            if let Read::Message(message) | Read::Output(message) = &item.read {
                return message.clone();
            }
        }
        let mut parts = RVec::new();
        let mut tool_calls = RVec::new();
        for item in &self.items {
            match &item.read {
                Read::Said { parts: said, .. } => parts.extend(said.iter().cloned()),
                Read::Opaque(part) => parts.push(part.clone()),
                Read::Call(call, _) => tool_calls.push(call.clone()),
                Read::Message(_) | Read::Output(_) => unreachable!("a unit of its own"),
            }
        }
        let mut message = Message::new(Role::Assistant, Content::Parts(parts));
        message.tool_calls = tool_calls;
        message
    }
}

/// Every item read (or found in `memory`), grouped into units.
fn read_items<'a>(
    raws: &[&'a RawValue],
    memory: &dyn Memory,
    units: &mut Vec<Unit<'a>>,
) -> Result<(), String> {
    let mut run = Unit::of(Source::Items);
    let flush = |run: &mut Unit<'a>, units: &mut Vec<Unit<'a>>| {
        if !run.items.is_empty() {
            units.push(std::mem::replace(run, Unit::of(Source::Items)));
        }
    };
    for (index, raw) in raws.iter().enumerate() {
        let raw = raw.get();
        let (item, parsed) = match memory.item(raw) {
            Some(item) => (item, false),
            None => (
                Arc::new(read_item(raw).map_err(|e| format!("input[{index}]: {e}"))?),
                true,
            ),
        };
        if let Read::Message(_) | Read::Output(_) = item.read {
            flush(&mut run, units);
            let mut own = Unit::of(Source::Items);
            own.raws.push(raw);
            own.items.push(item);
            own.parsed.push(parsed);
            units.push(own);
        } else {
            run.raws.push(raw);
            run.items.push(item);
            run.parsed.push(parsed);
        }
    }
    flush(&mut run, units);
    Ok(())
}

/// One item parsed and read.
fn read_item(raw: &str) -> Result<Item, String> {
    let map = match serde_json::from_str::<Value>(raw) {
        Ok(Value::Object(map)) => map,
        Ok(_) => return Err("expected an item object".into()),
        Err(e) => return Err(e.to_string()),
    };
    let kind = kind_of(&map);
    let role = map.get("role").and_then(Value::as_str);
    let read = if kind == "message" && role != Some("assistant") {
        Read::Message(read_message(&map, role)?)
    } else if kind.ends_with("_call_output") && call_id(&map).is_some() {
        Read::Output(read_output(&map))
    } else if kind == "message" {
        match map.get("content") {
            Some(Value::String(text)) => Read::Said {
                parts: vec![Part::text(text.as_str())],
                string: true,
            },
            Some(Value::Array(list)) => Read::Said {
                parts: list.iter().map(read_part).collect(),
                string: false,
            },
            _ => return Err("an assistant message needs a string or array content".into()),
        }
    } else if kind.ends_with("_call") && call_id(&map).is_some() {
        Read::Call(read_call(&map), kind.to_string())
    } else {
        Read::Opaque(Part::Opaque {
            json: serde_json::to_string(&map).unwrap_or_default().into(),
        })
    };
    let model_side = !matches!(read, Read::Message(_) | Read::Output(_)) && !kind.ends_with("_call_output");
    let reasoning = kind == "reasoning";
    Ok(Item {
        map,
        read,
        len: raw.len(),
        model_side,
        reasoning,
    })
}
/// A content part: `input_text` / `output_text` as text (its other members kept), any
/// other part (images, files, refusals, …) opaque.
fn read_part(part: &Value) -> Part {
    if let Value::Object(object) = part {
        let kind = object.get("type").and_then(Value::as_str);
        if let (Some("input_text" | "output_text"), Some(Value::String(text))) = (kind, object.get("text")) {
            let extra = object
                .iter()
                .filter(|(key, _)| *key != "type" && *key != "text")
                .map(|(key, value)| text_member(key, value))
                .collect();
            return Part::Text {
                text: text.as_str().into(),
                extra,
            };
        }
    }
    Part::Opaque {
        json: part.to_string().into(),
    }
}

fn read_content(value: Option<&Value>) -> Option<Content> {
    match value {
        Some(Value::String(text)) => Some(Content::Text(text.as_str().into())),
        Some(Value::Array(list)) => Some(Content::Parts(list.iter().map(read_part).collect())),
        _ => None,
    }
}

fn read_message(item: &Map<String, Value>, role: Option<&str>) -> Result<Message, String> {
    let role = match role {
        Some(name @ ("user" | "system" | "developer")) => Role::parse(name).expect("a known role"),
        Some(other) => return Err(format!("unknown message role {other:?}")),
        None => return Err("a message without a role".into()),
    };
    let content =
        read_content(item.get("content")).ok_or("a message needs a string or array content".to_string())?;
    let mut message = Message::new(role, content);
    message.extra = item
        .iter()
        .filter(|(key, _)| !matches!(key.as_str(), "type" | "role" | "content"))
        .map(|(key, value)| text_member(key, value))
        .collect();
    Ok(message)
}

fn read_output(item: &Map<String, Value>) -> Message {
    let content = match item.get("output") {
        None | Some(Value::Null) => Content::Null,
        Some(value) => read_content(Some(value)).unwrap_or_else(|| {
            Content::Parts(
                vec![Part::Opaque {
                    json: value.to_string().into(),
                }]
                .into(),
            )
        }),
    };
    let mut message = Message::new(Role::Tool, content);
    message.tool_call_id = ROption::RSome(call_id(item).unwrap_or_default().into());
    message.extra = item
        .iter()
        .filter(|(key, _)| !matches!(key.as_str(), "type" | "call_id" | "output"))
        .map(|(key, value)| text_member(key, value))
        .collect();
    message
}

/// A call: its `call_id`, its name (or its kind, for calls without one), and what it is
/// measured as: `arguments` or `input` when a string, else the item's `action` text.
fn read_call(item: &Map<String, Value>) -> ToolCall {
    let name = item
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_else(|| kind_of(item));
    let arguments = match (item.get("arguments"), item.get("input"), item.get("action")) {
        (Some(Value::String(text)), _, _) | (_, Some(Value::String(text)), _) => text.clone(),
        (_, _, Some(action)) => action.to_string(),
        _ => String::new(),
    };
    ToolCall {
        id: call_id(item).unwrap_or_default().into(),
        name: name.into(),
        arguments: arguments.into(),
        arguments_is_json: false,
        has_function: true,
        extra: RVec::new(),
        function_extra: RVec::new(),
    }
}

/// Whether two messages say the same to a provider (the host's metadata, turn and
/// identity aside).
fn same(a: &Message, b: &Message) -> bool {
    a.role == b.role
        && a.content == b.content
        && a.tool_calls == b.tool_calls
        && a.tool_call_id == b.tool_call_id
        && a.name == b.name
        && a.extra == b.extra
}

mod write;

#[cfg(test)]
mod tests;

impl<'a> Parsed<'a> {
    /// Writes `history` (the chain's output on [`Parsed::messages`]) back.
    pub fn write(&self, history: &[RArc<Message>]) -> Written {
        write::write(self, history)
    }

    /// The items parsed here, for a memory to keep: each one's text and item.
    pub fn parsed_items(&self) -> impl Iterator<Item = (&'a str, &Arc<Item>)> + '_ {
        self.units.iter().flat_map(|unit| {
            unit.raws
                .iter()
                .zip(&unit.items)
                .zip(&unit.parsed)
                .filter(|(_, parsed)| **parsed)
                .map(|((raw, item), _)| (*raw, item))
        })
    }

    /// The messages made here of items, for a memory to keep: each one's items and its
    /// message as it is in [`Parsed::messages`] now (keep them once prepared).
    pub fn made_messages(&self) -> impl Iterator<Item = (&[Arc<Item>], &RArc<Message>)> + '_ {
        self.units
            .iter()
            .zip(&self.messages)
            .filter(|(unit, _)| unit.made && !unit.items.is_empty())
            .map(|(unit, message)| (unit.items.as_slice(), message))
    }
}
