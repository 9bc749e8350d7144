//! Writing the chain's output back as Responses `input` items (docs/proxy.md#the-mapping):
//! a message found unchanged is its item(s)' bytes as they came; a changed one is its
//! item(s) with the changed members rewritten; a message the chain made is a new item.

use std::borrow::Cow;
use std::collections::HashMap;

use plugin_api::{Content, Message, Part, RArc, Role, ToolCall};
use serde_json::{Map, Value};

use super::{kind_of, same, Parsed, Read, Source, Unit, Written, ORIGIN_TAG};

/// One written item and what the reasoning rule needs to know of it.
struct Item<'a> {
    json: Cow<'a, str>,
    model_side: bool,
    reasoning: bool,
}

impl<'a> Item<'a> {
    fn new(json: Cow<'a, str>, item: &Map<String, Value>) -> Item<'a> {
        let kind = kind_of(item);
        let role = item.get("role").and_then(Value::as_str);
        Item {
            json,
            model_side: if kind == "message" {
                role == Some("assistant")
            } else {
                !kind.ends_with("_call_output")
            },
            reasoning: kind == "reasoning",
        }
    }

    /// An item as it came: its flags read once, with the item.
    fn raw(raw: &'a str, item: &super::Item) -> Item<'a> {
        Item {
            json: Cow::Borrowed(raw),
            model_side: item.model_side,
            reasoning: item.reasoning,
        }
    }

    fn made(item: Map<String, Value>) -> Item<'a> {
        let Item {
            model_side,
            reasoning,
            ..
        } = Item::new(Cow::Borrowed(""), &item);
        Item {
            json: Cow::Owned(Value::Object(item).to_string()),
            model_side,
            reasoning,
        }
    }
}

pub(super) fn write(parsed: &Parsed<'_>, history: &[RArc<Message>]) -> Written {
    let inputs = &parsed.messages;
    // Identities to positions: a position's own tag first, then every identity once.
    let mut by_identity: Option<HashMap<u64, usize>> = None;
    let mut position_of = |origin: u64| -> Option<usize> {
        if origin == 0 {
            return None;
        }
        let tagged = (origin >> 62 == 1)
            .then_some((origin ^ ORIGIN_TAG) as usize)
            .and_then(|position| position.checked_sub(1));
        if let Some(index) = tagged.filter(|&i| inputs.get(i).is_some_and(|m| m.origin() == origin)) {
            return Some(index);
        }
        by_identity
            .get_or_insert_with(|| {
                inputs
                    .iter()
                    .enumerate()
                    .rev()
                    .map(|(index, message)| (message.origin(), index))
                    .collect()
            })
            .get(&origin)
            .copied()
    };
    let mut found: Vec<(Option<usize>, bool)> = Vec::with_capacity(history.len());
    let mut cursor = 0;
    for message in history {
        let by_origin = position_of(message.origin()).filter(|&index| inputs[index].role == message.role);
        let entry = match by_origin {
            Some(index) => (Some(index), unchanged(&inputs[index], message)),
            // Not one of ours by identity (a session's transcript): an unchanged message
            // is found by what it says, in order.
            None => match inputs[cursor.min(inputs.len())..]
                .iter()
                .position(|input| same(input, message))
            {
                Some(offset) => {
                    cursor += offset + 1;
                    (Some(cursor - 1), true)
                }
                None => (None, false),
            },
        };
        found.push(entry);
    }

    let mut instructions = None;
    let mut rest = Vec::with_capacity(found.len());
    for (message, (index, unchanged)) in history.iter().zip(&found) {
        match index.map(|index| &parsed.units[index].source) {
            Some(Source::Instructions(raw)) if instructions.is_none() => {
                instructions = Some(if *unchanged {
                    raw.to_string()
                } else {
                    Value::String(message.content.text()).to_string()
                });
            }
            _ => rest.push((message, *index, *unchanged)),
        }
    }
    if let [(_, Some(index), true)] = rest.as_slice() {
        if let Source::InputString(raw) = parsed.units[*index].source {
            return Written {
                instructions,
                input: raw.to_string(),
            };
        }
    }

    let call_kinds: Vec<(&str, &str)> = parsed
        .units
        .iter()
        .flat_map(|unit| &unit.items)
        .filter_map(|item| match &item.read {
            Read::Call(call, kind) => Some((call.id.as_str(), kind.as_str())),
            _ => None,
        })
        .collect();
    let mut items = Vec::new();
    for (message, index, unchanged) in rest {
        match index {
            Some(index) => write_unit(
                &call_kinds,
                &parsed.units[index],
                &inputs[index],
                message,
                unchanged,
                &mut items,
            ),
            None => write_fresh(&call_kinds, message, &mut items),
        }
    }
    Written {
        instructions,
        input: join(keep_reasoning_adjacent(items)),
    }
}

/// Whether an output message is its input unchanged: the same one, or saying the same.
fn unchanged(input: &RArc<Message>, output: &RArc<Message>) -> bool {
    std::ptr::eq::<Message>(&**input, &**output) || same(input, output)
}

/// Drops a reasoning item no longer followed by a model-side item: the API refuses a
/// reasoning item without the item it preceded.
fn keep_reasoning_adjacent(items: Vec<Item<'_>>) -> Vec<Item<'_>> {
    let mut kept = Vec::with_capacity(items.len());
    let mut next_model_side = false;
    for item in items.into_iter().rev() {
        if item.reasoning && !next_model_side {
            continue;
        }
        next_model_side = item.model_side;
        kept.push(item);
    }
    kept.reverse();
    kept
}

fn join(items: Vec<Item<'_>>) -> String {
    let size = items.iter().map(|item| item.json.len() + 1).sum::<usize>();
    let mut out = String::with_capacity(size + 2);
    out.push('[');
    for (index, item) in items.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        out.push_str(&item.json);
    }
    out.push(']');
    out
}

fn write_unit<'a>(
    call_kinds: &[(&str, &str)],
    unit: &Unit<'a>,
    original: &Message,
    message: &Message,
    unchanged: bool,
    items: &mut Vec<Item<'a>>,
) {
    if let Source::Instructions(_) | Source::InputString(_) = unit.source {
        return write_fresh(call_kinds, message, items);
    }
    if unchanged {
        items.extend(
            unit.raws
                .iter()
                .zip(&unit.items)
                .map(|(raw, item)| Item::raw(raw, item)),
        );
        return;
    }
    match unit.items.as_slice() {
        [item] if matches!(item.read, Read::Message(_)) => {
            let mut out = Map::new();
            if let Some(kind) = item.map.get("type") {
                out.insert("type".into(), kind.clone());
            }
            out.insert("role".into(), message.role.as_str().into());
            out.insert("content".into(), content_value(&message.content, "input_text"));
            extend_extra(&mut out, message);
            items.push(Item::made(out));
        }
        [item] if matches!(item.read, Read::Output(_)) => {
            let mut out = Map::new();
            out.insert(
                "type".into(),
                item.map
                    .get("type")
                    .cloned()
                    .unwrap_or("function_call_output".into()),
            );
            out.insert("call_id".into(), message.call_id().unwrap_or_default().into());
            let object = matches!(item.map.get("output"), Some(Value::Object(_)));
            out.insert("output".into(), output_value(&message.content, object));
            extend_extra(&mut out, message);
            items.push(Item::made(out));
        }
        _ => write_run(unit, original, message, items),
    }
}

/// A changed run: each item whose part(s) or call came out unchanged as its bytes, the
/// rest rewritten; content the chain reshaped (e.g. one placeholder text) as one
/// assistant message item, then the calls still there.
fn write_run<'a>(unit: &Unit<'a>, original: &Message, message: &Message, items: &mut Vec<Item<'a>>) {
    let no_parts = Default::default();
    let before = match &original.content {
        Content::Parts(parts) => parts,
        _ => &no_parts,
    };
    let positional = matches!(&message.content, Content::Parts(now) if now.len() == before.len());
    let now: &[Part] = match &message.content {
        Content::Parts(now) if positional => now,
        _ => &[],
    };
    if !positional {
        write_assistant_content(&message.content, items);
    }
    let mut at = 0;
    for (raw, slot) in unit.raws.iter().zip(&unit.items) {
        match (&slot.read, positional) {
            (Read::Said { parts, string }, true) => {
                let count = parts.len();
                let (new, old) = (&now[at..at + count], &before[at..at + count]);
                at += count;
                if new == old {
                    items.push(Item::raw(raw, slot));
                } else if new.is_empty() {
                    // Nothing left of it.
                } else {
                    let mut out = slot.map.clone();
                    let content = match new {
                        [Part::Text { text, extra }] if *string && extra.is_empty() => {
                            Value::String(text.to_string())
                        }
                        _ => Value::Array(new.iter().map(|part| part_value(part, "output_text")).collect()),
                    };
                    out.insert("content".into(), content);
                    items.push(Item::made(out));
                }
            }
            (Read::Opaque(_), true) => {
                if now[at] == before[at] {
                    items.push(Item::raw(raw, slot));
                } else {
                    write_assistant_content(&Content::Parts(vec![now[at].clone()].into()), items);
                }
                at += 1;
            }
            (Read::Call(read, _), _) => {
                let id = read.id.as_str();
                let Some(call) = message.tool_calls.iter().find(|call| call.id.as_str() == id) else {
                    continue;
                };
                let old = original.tool_calls.iter().find(|call| call.id.as_str() == id);
                if old == Some(call) {
                    items.push(Item::raw(raw, slot));
                } else {
                    let mut out = slot.map.clone();
                    if out.contains_key("name") {
                        out.insert("name".into(), call.name.as_str().into());
                    }
                    for key in ["arguments", "input"] {
                        if matches!(out.get(key), Some(Value::String(_))) {
                            out.insert(key.into(), call.arguments.as_str().into());
                        }
                    }
                    items.push(Item::made(out));
                }
            }
            _ => {}
        }
    }
    // Calls the chain added to the run.
    for call in message.tool_calls.iter() {
        let known = unit
            .items
            .iter()
            .any(|slot| matches!(&slot.read, Read::Call(read, _) if read.id == call.id));
        if !known {
            items.push(Item::made(function_call(call)));
        }
    }
}

/// A message the chain made (or one of a string `input` that changed).
fn write_fresh<'a>(call_kinds: &[(&str, &str)], message: &Message, items: &mut Vec<Item<'a>>) {
    match message.role {
        Role::System | Role::Developer | Role::User => {
            let mut out = Map::new();
            out.insert("type".into(), "message".into());
            out.insert("role".into(), message.role.as_str().into());
            out.insert("content".into(), content_value(&message.content, "input_text"));
            extend_extra(&mut out, message);
            items.push(Item::made(out));
        }
        Role::Assistant => {
            write_assistant_content(&message.content, items);
            for call in message.tool_calls.iter() {
                items.push(Item::made(function_call(call)));
            }
        }
        Role::Tool => {
            let id = message.call_id().unwrap_or_default();
            // A placeholder answers the call in that call's output kind.
            let kind = call_kinds
                .iter()
                .find(|(call, _)| *call == id)
                .map_or("function_call_output".to_string(), |(_, kind)| {
                    format!("{kind}_output")
                });
            let mut out = Map::new();
            out.insert("type".into(), kind.into());
            out.insert("call_id".into(), id.into());
            out.insert("output".into(), output_value(&message.content, false));
            extend_extra(&mut out, message);
            items.push(Item::made(out));
        }
    }
}

/// An assistant's content as items: text parts in assistant `message` items, and each
/// opaque part that is an item (reasoning, …) as that item.
fn write_assistant_content<'a>(content: &Content, items: &mut Vec<Item<'a>>) {
    let parts: Vec<Part> = match content {
        Content::Null => Vec::new(),
        Content::Text(text) if text.is_empty() => Vec::new(),
        other => other.to_parts().into_iter().collect(),
    };
    let mut pending: Vec<Value> = Vec::new();
    let flush = |pending: &mut Vec<Value>, items: &mut Vec<Item<'a>>| {
        if !pending.is_empty() {
            let mut out = Map::new();
            out.insert("type".into(), "message".into());
            out.insert("role".into(), "assistant".into());
            out.insert("content".into(), Value::Array(std::mem::take(pending)));
            items.push(Item::made(out));
        }
    };
    for part in &parts {
        if let Part::Opaque { json } = part {
            if let Ok(Value::Object(item)) = serde_json::from_str::<Value>(json) {
                let kind = kind_of(&item);
                if !matches!(kind, "output_text" | "refusal") && !kind.starts_with("input_") {
                    flush(&mut pending, items);
                    items.push(Item::made(item));
                    continue;
                }
            }
        }
        pending.push(part_value(part, "output_text"));
    }
    flush(&mut pending, items);
}

fn function_call(call: &ToolCall) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("type".into(), "function_call".into());
    out.insert("call_id".into(), call.id.as_str().into());
    out.insert("name".into(), call.name.as_str().into());
    out.insert("arguments".into(), call.arguments.as_str().into());
    out
}

fn extend_extra(out: &mut Map<String, Value>, message: &Message) {
    for member in message.extra.iter() {
        let value =
            serde_json::from_str(&member.json).unwrap_or_else(|_| Value::String(member.json.to_string()));
        out.insert(member.key.to_string(), value);
    }
}

fn part_value(part: &Part, text_type: &str) -> Value {
    match part {
        Part::Text { text, extra } => {
            let mut out = Map::new();
            out.insert("type".into(), text_type.into());
            out.insert("text".into(), text.as_str().into());
            for member in extra.iter() {
                if let Ok(value) = serde_json::from_str(&member.json) {
                    out.insert(member.key.to_string(), value);
                }
            }
            Value::Object(out)
        }
        Part::Opaque { json } => {
            serde_json::from_str(json).unwrap_or_else(|_| Value::String(json.to_string()))
        }
    }
}

fn content_value(content: &Content, text_type: &str) -> Value {
    match content {
        Content::Null => Value::String(String::new()),
        Content::Text(text) => Value::String(text.to_string()),
        Content::Parts(parts) => Value::Array(parts.iter().map(|part| part_value(part, text_type)).collect()),
    }
}

/// A call output's `output`: text as a string, parts as a list, and an output that was an
/// object (a computer call's screenshot), read as one opaque part, as that object.
fn output_value(content: &Content, object: bool) -> Value {
    match content {
        Content::Parts(parts) if object && parts.len() == 1 && matches!(parts[0], Part::Opaque { .. }) => {
            part_value(&parts[0], "input_text")
        }
        other => content_value(other, "input_text"),
    }
}
