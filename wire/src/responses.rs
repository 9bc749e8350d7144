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

use plugin_api::{Content, Member, Message, Part, RArc, ROption, RVec, Role, ToolCall};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// A request's history read into host messages, with what writing it back needs.
pub struct Parsed<'a> {
    pub messages: Vec<RArc<Message>>,
    pub record: Record<'a>,
}

/// Where each host message came from: one unit per message, in order.
pub struct Record<'a> {
    units: Vec<Unit<'a>>,
    /// Each call's item `type` by its `call_id`, so a placeholder answer is written as
    /// that call's output kind.
    call_kinds: Vec<(String, String)>,
}

struct Unit<'a> {
    message: RArc<Message>,
    source: Source<'a>,
}

enum Source<'a> {
    /// `instructions`: its raw JSON text.
    Instructions(&'a str),
    /// A string `input`: its raw JSON text.
    InputString(&'a str),
    /// A user / system / developer `message` item.
    Message { raw: &'a str, item: Map<String, Value> },
    /// A `*_call_output` item.
    Output { raw: &'a str, item: Map<String, Value> },
    /// A run of model-side items.
    Run(Vec<Slot<'a>>),
}

/// One item of a model-side run.
struct Slot<'a> {
    raw: &'a str,
    item: Map<String, Value>,
    kind: SlotKind,
}

enum SlotKind {
    /// An assistant `message`: `parts` content parts of the run's message; whether its
    /// `content` was a string.
    Message { parts: usize, string: bool },
    /// Any other non-call item: one opaque content part.
    Opaque,
    /// A call: the run's tool call with this id.
    Call(String),
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

fn is_call(item: &Map<String, Value>) -> bool {
    kind_of(item).ends_with("_call") && call_id(item).is_some()
}

fn is_output(item: &Map<String, Value>) -> bool {
    kind_of(item).ends_with("_call_output") && call_id(item).is_some()
}

/// The mark of the identities [`parse`] gives (the engine's fresh ones have the top bit,
/// a session's are its positions, far below), so the write-back never takes another
/// message's identity for one of its own.
const ORIGIN_TAG: u64 = 1 << 62;

/// Reads `instructions` (raw JSON text, if present) and `input` (raw JSON text).
pub fn parse<'a>(instructions: Option<&'a RawValue>, input: &'a RawValue) -> Result<Parsed<'a>, String> {
    let mut units = Vec::new();
    if let Some(raw) = instructions {
        match serde_json::from_str::<Value>(raw.get()) {
            Ok(Value::String(text)) => {
                let message = Message::new(Role::System, Content::Text(text.into()));
                units.push(Unit {
                    message: RArc::new(message),
                    source: Source::Instructions(raw.get()),
                });
            }
            Ok(Value::Null) => {}
            _ => return Err("instructions: expected a string".into()),
        }
    }
    let mut call_kinds = Vec::new();
    // Told apart by the first byte: the items are parsed once, one by one, not as a whole.
    match input.get().trim_start().as_bytes().first() {
        Some(b'"') => {
            let text: String = serde_json::from_str(input.get()).map_err(|e| format!("input: {e}"))?;
            let message = Message::new(Role::User, Content::Text(text.into()));
            units.push(Unit {
                message: RArc::new(message),
                source: Source::InputString(input.get()),
            });
        }
        Some(b'[') => {
            let items: Vec<&'a RawValue> =
                serde_json::from_str(input.get()).map_err(|e| format!("input: {e}"))?;
            read_items(&items, &mut units, &mut call_kinds)?;
        }
        _ => return Err("input: expected a string or an array of items".into()),
    }
    let messages = units
        .iter_mut()
        .enumerate()
        .map(|(index, unit)| {
            // Positions as identities: the chain keeps them on what it passes on, so the
            // write-back finds a message's item(s) without searching.
            RArc::make_mut(&mut unit.message).set_origin(ORIGIN_TAG | (index as u64 + 1));
            unit.message.clone()
        })
        .collect();
    Ok(Parsed {
        messages,
        record: Record { units, call_kinds },
    })
}

fn read_items<'a>(
    items: &[&'a RawValue],
    units: &mut Vec<Unit<'a>>,
    call_kinds: &mut Vec<(String, String)>,
) -> Result<(), String> {
    let mut run: Vec<Slot<'a>> = Vec::new();
    let mut run_message = Message::new(Role::Assistant, Content::Parts(RVec::new()));
    for (index, raw) in items.iter().enumerate() {
        let where_ = |what: String| format!("input[{index}]: {what}");
        let item = match serde_json::from_str::<Value>(raw.get()) {
            Ok(Value::Object(item)) => item,
            Ok(_) => return Err(where_("expected an item object".into())),
            Err(e) => return Err(where_(e.to_string())),
        };
        let kind = kind_of(&item).to_string();
        let role = item.get("role").and_then(Value::as_str).map(str::to_string);
        let own_unit = (kind == "message" && role.as_deref() != Some("assistant")) || is_output(&item);
        if own_unit {
            flush_run(&mut run, &mut run_message, units);
            let (message, source) = if kind == "message" {
                let message = read_message(&item, role.as_deref()).map_err(where_)?;
                (message, Source::Message { raw: raw.get(), item })
            } else {
                (read_output(&item), Source::Output { raw: raw.get(), item })
            };
            units.push(Unit {
                message: RArc::new(message),
                source,
            });
            continue;
        }
        let parts = match &mut run_message.content {
            Content::Parts(parts) => parts,
            _ => unreachable!("a run's content is parts"),
        };
        let slot_kind = if kind == "message" {
            let (content, string) = match item.get("content") {
                Some(Value::String(text)) => (vec![Part::text(text.as_str())], true),
                Some(Value::Array(list)) => (list.iter().map(read_part).collect(), false),
                _ => {
                    return Err(where_(
                        "an assistant message needs a string or array content".into(),
                    ))
                }
            };
            let count = content.len();
            parts.extend(content);
            SlotKind::Message { parts: count, string }
        } else if is_call(&item) {
            let call = read_call(&item);
            call_kinds.push((call.id.to_string(), kind.clone()));
            let id = call.id.to_string();
            run_message.tool_calls.push(call);
            SlotKind::Call(id)
        } else {
            parts.push(Part::Opaque {
                json: Value::Object(item.clone()).to_string().into(),
            });
            SlotKind::Opaque
        };
        run.push(Slot {
            raw: raw.get(),
            item,
            kind: slot_kind,
        });
    }
    flush_run(&mut run, &mut run_message, units);
    Ok(())
}

fn flush_run<'a>(run: &mut Vec<Slot<'a>>, message: &mut Message, units: &mut Vec<Unit<'a>>) {
    if run.is_empty() {
        return;
    }
    let message = std::mem::replace(
        message,
        Message::new(Role::Assistant, Content::Parts(RVec::new())),
    );
    units.push(Unit {
        message: RArc::new(message),
        source: Source::Run(std::mem::take(run)),
    });
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

impl Record<'_> {
    /// Writes `history` (the chain's output on [`parse`]'s messages) back.
    pub fn write(&self, history: &[RArc<Message>]) -> Written {
        write::write(self, history)
    }
}
