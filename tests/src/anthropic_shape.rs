//! An OpenAI chat conversation in Anthropic's Messages shape and back, for the Anthropic
//! wire's tests (tests/tests/e2e/anthropic.rs): the conversion is the test's own, so the
//! host's mapping (history_wire::anthropic) is checked against an independent one.

use serde_json::{json as j, Value};

/// A chat conversation with each tool call's arguments spelled as compact JSON: a
/// `tool_use` block's `input` is an object, so the spelling of the arguments text (the
/// real data mixes `", "` and `","`) is the one thing the mapping does not carry.
pub fn compact_arguments(chat: &[Value]) -> Vec<Value> {
    let mut chat = chat.to_vec();
    for message in &mut chat {
        let calls = message.get_mut("tool_calls").and_then(Value::as_array_mut);
        for call in calls.into_iter().flatten() {
            let arguments: Value =
                serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
            call["function"]["arguments"] = Value::String(arguments.to_string());
        }
    }
    chat
}

/// An OpenAI chat conversation in Anthropic's shape: the system message as `system`, tool
/// calls as `tool_use` blocks after the text, each run of tool messages as one user message
/// of `tool_result` blocks.
pub fn to_anthropic(chat: &[Value]) -> (Value, Vec<Value>) {
    let mut system = Value::Null;
    let mut out: Vec<Value> = Vec::new();
    for message in chat {
        match message["role"].as_str().unwrap() {
            "system" => system = message["content"].clone(),
            "user" => out.push(j!({"role": "user", "content": message["content"]})),
            "assistant" => match message["tool_calls"].as_array() {
                Some(calls) => {
                    let mut blocks = Vec::new();
                    if let Some(text) = message["content"].as_str() {
                        blocks.push(j!({"type": "text", "text": text}));
                    }
                    for call in calls {
                        let input: Value =
                            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
                        blocks.push(j!({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": input}));
                    }
                    out.push(j!({"role": "assistant", "content": blocks}));
                }
                None => out.push(j!({"role": "assistant", "content": message["content"]})),
            },
            "tool" => {
                let block = j!({"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": message["content"]});
                match out.last_mut() {
                    Some(last) if last["role"] == "user" && last["content"].is_array() => {
                        last["content"].as_array_mut().unwrap().push(block)
                    }
                    _ => out.push(j!({"role": "user", "content": [block]})),
                }
            }
            other => panic!("role {other}"),
        }
    }
    (system, out)
}

/// And back: the exact inverse of [`to_anthropic`].
pub fn to_chat(system: &Value, messages: &[Value]) -> Vec<Value> {
    let mut chat = Vec::new();
    if !system.is_null() {
        chat.push(j!({"role": "system", "content": system}));
    }
    for message in messages {
        let (role, content) = (message["role"].as_str().unwrap(), &message["content"]);
        let Some(blocks) = content.as_array() else {
            chat.push(j!({"role": role, "content": content}));
            continue;
        };
        if role == "user" {
            for block in blocks {
                chat.push(
                    j!({"role": "tool", "tool_call_id": block["tool_use_id"], "content": block["content"]}),
                );
            }
            continue;
        }
        let text = blocks
            .iter()
            .find(|b| b["type"] == "text")
            .map_or(Value::Null, |b| b["text"].clone());
        let calls: Vec<Value> = blocks
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .map(|b| j!({"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": b["input"].to_string()}}))
            .collect();
        chat.push(j!({"role": "assistant", "content": text, "tool_calls": calls}));
    }
    chat
}
