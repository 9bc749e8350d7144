//! `history-bench proxy --wire anthropic`: the same resent conversation as an Anthropic
//! Messages request (docs/proxy.md#anthropic-messages), through `POST /v1/messages` beside
//! the direct call, so the Anthropic wire's added latency stands beside the chat wire's in
//! one run (issue #27's target: within 1.2× of the chat wire's).

use bytes::Bytes;
use serde_json::{json, Map, Value};

/// The Message the stand-in answers `/v1/messages` with.
pub const MESSAGE: &str = r#"{"id":"msg_bench","type":"message","role":"assistant","model":"default","content":[{"type":"text","text":"Done: the tests pass."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":5}}"#;

/// A chat conversation as an Anthropic request: the system text as `system`, each
/// assistant turn a signed thinking block, its text and its `tool_use` blocks, each tool
/// result a `tool_result` block of the next user message (consecutive same-role messages
/// merged, so roles alternate as Anthropic requires).
pub fn request(conversation: &[Value]) -> Bytes {
    let text = |m: &Value| match &m["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    };
    let mut system = Value::Null;
    let mut messages: Vec<(String, Vec<Value>)> = Vec::new();
    for (index, message) in conversation.iter().enumerate() {
        let (role, blocks) = match message["role"].as_str().unwrap_or("") {
            "system" | "developer" if index == 0 => {
                system = json!(text(message));
                continue;
            }
            "assistant" => {
                let mut blocks = vec![json!({"type": "thinking", "thinking": format!("step {index}"),
                                             "signature": format!("sig{index:08}{}", "x".repeat(300))})];
                if !text(message).is_empty() {
                    blocks.push(json!({"type": "text", "text": text(message)}));
                }
                for call in message["tool_calls"].as_array().into_iter().flatten() {
                    let input = match serde_json::from_str::<Value>(
                        call["function"]["arguments"].as_str().unwrap_or("{}"),
                    ) {
                        Ok(Value::Object(object)) => Value::Object(object),
                        _ => Value::Object(Map::new()),
                    };
                    blocks.push(
                        json!({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                                       "input": input}),
                    );
                }
                ("assistant", blocks)
            }
            "tool" => (
                "user",
                vec![
                    json!({"type": "tool_result", "tool_use_id": message["tool_call_id"],
                            "content": text(message)}),
                ],
            ),
            _ => ("user", vec![json!({"type": "text", "text": text(message)})]),
        };
        match messages.last_mut() {
            Some((last, same)) if last == role => same.extend(blocks),
            _ => messages.push((role.to_string(), blocks)),
        }
    }
    let messages: Vec<Value> = messages
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    let body = json!({"model": "default", "max_tokens": 1024, "system": system, "messages": messages});
    Bytes::from(body.to_string())
}
