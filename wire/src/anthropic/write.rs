//! Writing the chain's output back in Anthropic's shape (docs/proxy.md#anthropic-messages).

use plugin_api::{Content, Member, Message, Part, RArc, Role, ToolCall};

use super::Parsed;

/// The written request members.
pub struct Written {
    /// The value of `system`, or `None` when the output has no leading system message.
    pub system: Option<String>,
    /// The value of `messages`: a JSON array.
    pub messages: String,
    /// `cache_control` markers in what is written.
    pub cache_breakpoints: usize,
}

/// Equality of what goes upstream: the host's metadata is not sent, so not compared.
fn same_wire(a: &Message, b: &Message) -> bool {
    a.role == b.role
        && a.content == b.content
        && a.tool_calls == b.tool_calls
        && a.tool_call_id == b.tool_call_id
        && a.name == b.name
        && a.extra == b.extra
}

/// One Anthropic message to write: an input message unchanged, or host messages to shape.
enum Unit<'m> {
    Raw(usize),
    Shaped {
        assistant: bool,
        messages: Vec<&'m Message>,
    },
}

/// Writes `output` (the chain's history) back against the request it came from.
pub fn write(parsed: &Parsed<'_>, output: &[RArc<Message>]) -> Written {
    let lead = output.iter().take_while(|m| m.role.is_system()).count();
    let mut marks = 0;
    let system = write_system(parsed, &output[..lead], &mut marks);
    let units = merge(parsed, units(parsed, &output[lead..]));
    let mut out = String::from("[");
    for (index, unit) in units.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        match unit {
            Unit::Raw(i) => {
                out.push_str(parsed.inputs[*i].raw);
                marks += parsed.inputs[*i].cache_breakpoints;
            }
            Unit::Shaped { assistant, messages } => {
                write_shaped(&mut out, parsed, *assistant, messages, &mut marks)
            }
        }
    }
    out.push(']');
    Written {
        system,
        messages: out,
        cache_breakpoints: marks,
    }
}

/// The input message whose host messages start `rest`, all unchanged and in order.
fn matching_input(parsed: &Parsed<'_>, rest: &[RArc<Message>], cursor: usize) -> Option<usize> {
    let covers = |i: usize| {
        let input = &parsed.inputs[i];
        let span = &parsed.messages[input.start..input.end];
        !span.is_empty()
            && span.len() <= rest.len()
            && span
                .iter()
                .zip(rest)
                .all(|(a, b)| std::ptr::eq::<Message>(&**a, &**b) || same_wire(a, b))
    };
    let first = &rest[0];
    // By identity first (a stateless run keeps the host's identities), else by content.
    if let Some(&host) = parsed.origins.get(&first.origin()) {
        if let Some(i) = parsed.inputs.iter().position(|input| input.start == host) {
            if covers(i) {
                return Some(i);
            }
        }
    }
    (cursor..parsed.inputs.len()).find(|&i| covers(i))
}

fn units<'m>(parsed: &Parsed<'_>, rest: &'m [RArc<Message>]) -> Vec<Unit<'m>> {
    let mut units = Vec::new();
    let (mut p, mut cursor) = (0, 0);
    while p < rest.len() {
        if let Some(i) = matching_input(parsed, &rest[p..], cursor) {
            units.push(Unit::Raw(i));
            p += parsed.inputs[i].end - parsed.inputs[i].start;
            cursor = i + 1;
            continue;
        }
        let message: &Message = &rest[p];
        units.push(Unit::Shaped {
            assistant: message.role == Role::Assistant,
            messages: vec![message],
        });
        p += 1;
    }
    units
}

fn is_assistant(parsed: &Parsed<'_>, unit: &Unit<'_>) -> bool {
    match unit {
        Unit::Raw(i) => parsed.messages[parsed.inputs[*i].start].role == Role::Assistant,
        Unit::Shaped { assistant, .. } => *assistant,
    }
}

/// Adjacent messages of one role merged into one, so roles alternate (tool results
/// first in their user message, see [`write_shaped`]); two input messages that were
/// adjacent in the request stay as they came.
fn merge<'m>(parsed: &'m Parsed<'_>, units: Vec<Unit<'m>>) -> Vec<Unit<'m>> {
    let mut merged: Vec<Unit<'m>> = Vec::with_capacity(units.len());
    for unit in units {
        let Some(last) = merged.last_mut() else {
            merged.push(unit);
            continue;
        };
        let same = is_assistant(parsed, last) == is_assistant(parsed, &unit);
        let adjacent_inputs = matches!((&*last, &unit), (Unit::Raw(a), Unit::Raw(b)) if *a + 1 == *b);
        if !same || adjacent_inputs {
            merged.push(unit);
            continue;
        }
        let assistant = is_assistant(parsed, &unit);
        let mut messages = shaped_messages(parsed, std::mem::replace(last, Unit::Raw(0)));
        messages.extend(shaped_messages(parsed, unit));
        *last = Unit::Shaped { assistant, messages };
    }
    merged
}

fn shaped_messages<'m>(parsed: &'m Parsed<'_>, unit: Unit<'m>) -> Vec<&'m Message> {
    match unit {
        Unit::Raw(i) => {
            let input = &parsed.inputs[i];
            parsed.messages[input.start..input.end]
                .iter()
                .map(|m| &**m)
                .collect()
        }
        Unit::Shaped { messages, .. } => messages,
    }
}

fn write_system(parsed: &Parsed<'_>, lead: &[RArc<Message>], marks: &mut usize) -> Option<String> {
    if let ([only], Some(raw)) = (lead, parsed.system) {
        if same_wire(only, &parsed.messages[0]) {
            *marks += parsed.system_marks;
            return Some(raw.to_string());
        }
    }
    match lead {
        [] => None,
        [only] if matches!(only.content, Content::Text(_)) => Some(json_string(&only.content.text())),
        _ => {
            let mut out = String::from("[");
            let mut first = true;
            for message in lead {
                write_blocks_of_content(&mut out, parsed, &mut first, &message.content, marks);
            }
            out.push(']');
            Some(out)
        }
    }
}

fn json_string(text: &str) -> String {
    serde_json::to_string(text).expect("a string is always written")
}

fn sep(out: &mut String, first: &mut bool) {
    if !*first {
        out.push(',');
    }
    *first = false;
}

fn write_extra(out: &mut String, extra: &[Member], marks: &mut usize) {
    for member in extra {
        out.push(',');
        out.push_str(&json_string(&member.key));
        out.push(':');
        out.push_str(&member.json);
        *marks += usize::from(member.key.as_str() == "cache_control");
    }
}

fn write_part(out: &mut String, parsed: &Parsed<'_>, part: &Part, marks: &mut usize) {
    let start = out.len();
    match part {
        Part::Text { text, extra } => {
            out.push_str("{\"type\":\"text\",\"text\":");
            out.push_str(&json_string(text));
            write_extra(out, extra, marks);
            out.push('}');
        }
        Part::Opaque { json } => {
            out.push_str(json);
            if json.contains("\"cache_control\"") {
                *marks += serde_json::from_str::<serde_json::Value>(json)
                    .map_or(0, |block| usize::from(block.get("cache_control").is_some()));
            }
        }
    }
    as_it_came(out, parsed, start);
}

/// The block just written at `out[start..]` as the bytes it came in, when it came so
/// (an unchanged block of a changed message, docs/proxy.md#anthropic-messages).
fn as_it_came(out: &mut String, parsed: &Parsed<'_>, start: usize) {
    if parsed.blocks.is_empty() {
        return;
    }
    if let Some(raw) = parsed.blocks.get(&out[start..]) {
        out.truncate(start);
        out.push_str(raw);
    }
}

/// A content as blocks (a string as one text block), each after a separator.
fn write_blocks_of_content(
    out: &mut String,
    parsed: &Parsed<'_>,
    first: &mut bool,
    content: &Content,
    marks: &mut usize,
) {
    match content {
        Content::Null => {}
        Content::Text(text) => {
            sep(out, first);
            out.push_str("{\"type\":\"text\",\"text\":");
            out.push_str(&json_string(text));
            out.push('}');
        }
        Content::Parts(parts) => {
            for part in parts.iter() {
                sep(out, first);
                write_part(out, parsed, part, marks);
            }
        }
    }
}

fn write_content_value(out: &mut String, parsed: &Parsed<'_>, content: &Content, marks: &mut usize) {
    match content {
        Content::Text(text) => out.push_str(&json_string(text)),
        _ => {
            out.push('[');
            let mut first = true;
            write_blocks_of_content(out, parsed, &mut first, content, marks);
            out.push(']');
        }
    }
}

fn write_tool_use(out: &mut String, parsed: &Parsed<'_>, call: &ToolCall, marks: &mut usize) {
    let start = out.len();
    out.push_str("{\"type\":\"tool_use\",\"id\":");
    out.push_str(&json_string(&call.id));
    out.push_str(",\"name\":");
    out.push_str(&json_string(&call.name));
    out.push_str(",\"input\":");
    // Arguments a plugin set as a string are JSON text when they parse, else a string.
    let is_json =
        call.arguments_is_json || serde_json::from_str::<serde_json::Value>(&call.arguments).is_ok();
    if is_json && !call.arguments.is_empty() {
        out.push_str(&call.arguments);
    } else {
        out.push_str(&json_string(&call.arguments));
    }
    write_extra(out, &call.extra, marks);
    out.push('}');
    as_it_came(out, parsed, start);
}

fn write_tool_result(out: &mut String, parsed: &Parsed<'_>, message: &Message, marks: &mut usize) {
    let start = out.len();
    out.push_str("{\"type\":\"tool_result\",\"tool_use_id\":");
    out.push_str(&json_string(message.call_id().unwrap_or_default()));
    if message.content != Content::Null {
        out.push_str(",\"content\":");
        write_content_value(out, parsed, &message.content, marks);
    }
    write_extra(out, &message.extra, marks);
    out.push('}');
    as_it_came(out, parsed, start);
}

/// An assistant message's blocks in their order: as they came when the message is a
/// changed copy with as many parts and calls, else its parts then its calls.
fn write_assistant_blocks(
    out: &mut String,
    first: &mut bool,
    parsed: &Parsed<'_>,
    message: &Message,
    marks: &mut usize,
) {
    let parts = message.content.to_parts();
    let order = parsed
        .origins
        .get(&message.origin())
        .map(|&host| &parsed.order[host])
        .filter(|order| {
            order.iter().filter(|call| **call).count() == message.tool_calls.len()
                && order.iter().filter(|call| !**call).count() == parts.len()
        });
    let default: Vec<bool> = std::iter::repeat_n(false, parts.len())
        .chain(std::iter::repeat_n(true, message.tool_calls.len()))
        .collect();
    let (mut p, mut c) = (0, 0);
    for is_call in order.unwrap_or(&default) {
        sep(out, first);
        if *is_call {
            write_tool_use(out, parsed, &message.tool_calls[c], marks);
            c += 1;
        } else {
            write_part(out, parsed, &parts[p], marks);
            p += 1;
        }
    }
}

fn write_shaped(
    out: &mut String,
    parsed: &Parsed<'_>,
    assistant: bool,
    messages: &[&Message],
    marks: &mut usize,
) {
    out.push_str(if assistant {
        "{\"role\":\"assistant\",\"content\":"
    } else {
        "{\"role\":\"user\",\"content\":"
    });
    let plain = matches!(messages, [only] if only.tool_calls.is_empty() && only.role != Role::Tool && matches!(only.content, Content::Text(_)));
    if plain {
        out.push_str(&json_string(&messages[0].content.text()));
    } else {
        out.push('[');
        let mut first = true;
        if assistant {
            for message in messages {
                write_assistant_blocks(out, &mut first, parsed, message, marks);
            }
        } else {
            // Tool results first in their user message, as Anthropic requires.
            for message in messages.iter().filter(|m| m.role == Role::Tool) {
                sep(out, &mut first);
                write_tool_result(out, parsed, message, marks);
            }
            for message in messages.iter().filter(|m| m.role != Role::Tool) {
                write_blocks_of_content(out, parsed, &mut first, &message.content, marks);
            }
        }
        out.push(']');
    }
    // Message-level members the request carried (none in today's API) on the first
    // message that has them.
    if let Some(message) = messages
        .iter()
        .find(|m| m.role != Role::Tool && !m.extra.is_empty())
    {
        write_extra(out, &message.extra, marks);
    }
    out.push('}');
}
