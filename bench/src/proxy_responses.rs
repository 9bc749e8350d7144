//! `history-bench proxy --wire responses`: the same resent conversation as OpenAI
//! Responses input (docs/proxy.md#responses), through `POST /v1/responses` beside the
//! direct call, so the Responses wire's added latency stands beside the chat wire's in one
//! run (issue #28's target: within 1.2× of the chat wire's). [`measure`] measures any
//! other wire so (`proxy_anthropic.rs` gives the Anthropic request).

use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::loopback::{latency, ms, round, HttpClient, Serve};
use crate::proxy::{alternating, timed, BLOCK};
use crate::Result;

/// The Response object the stand-in answers `/responses` with.
pub const RESPONSE: &str = r#"{"id":"resp_bench","object":"response","created_at":1700000000,"status":"completed","model":"default","output":[{"type":"message","id":"msg_bench","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Done: the tests pass.","annotations":[]}]}],"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"usage":{"input_tokens":1,"output_tokens":5,"total_tokens":6}}"#;

/// A chat conversation as a Responses request: the system text as `instructions`, each
/// assistant turn a reasoning item (encrypted content) before its message and calls.
pub fn request(conversation: &[Value]) -> Bytes {
    let text = |m: &Value| match &m["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    };
    let mut instructions = Value::Null;
    let mut items = Vec::new();
    for (index, message) in conversation.iter().enumerate() {
        match message["role"].as_str().unwrap_or("") {
            "system" | "developer" if index == 0 => instructions = json!(text(message)),
            "assistant" => {
                items.push(
                    json!({"type": "reasoning", "id": format!("rs_{index}"), "summary": [],
                                  "encrypted_content": format!("gAAAAB{index:08}{}", "x".repeat(400))}),
                );
                if !text(message).is_empty() {
                    items.push(json!({"type": "message", "role": "assistant", "id": format!("msg_{index}"),
                                      "content": [{"type": "output_text", "text": text(message), "annotations": []}]}));
                }
                for call in message["tool_calls"].as_array().into_iter().flatten() {
                    items.push(json!({"type": "function_call", "call_id": call["id"],
                                      "name": call["function"]["name"], "arguments": call["function"]["arguments"]}));
                }
            }
            "tool" => items.push(
                json!({"type": "function_call_output", "call_id": message["tool_call_id"],
                                        "output": text(message)}),
            ),
            role => items.push(json!({"type": "message", "role": role,
                                      "content": [{"type": "input_text", "text": text(message)}]})),
        }
    }
    let body = json!({"model": "default", "store": false, "instructions": instructions, "input": items,
                      "include": ["reasoning.encrypted_content"]});
    Bytes::from(body.to_string())
}

/// Another wire's direct and proxied calls (`body` to `path` on the stand-in and on the
/// host), alternating; the added latency against the chat wire's (`chat_added`: its added
/// p50 and p99, in ms).
pub async fn measure(
    client: &HttpClient,
    server: &Serve,
    upstream: &str,
    path: &str,
    body: Bytes,
    requests: usize,
    chat_added: (f64, f64),
) -> Result<Value> {
    let direct = format!("{upstream}{path}");
    let proxied = server.url(&format!("/v1{path}"));
    // Warm: the first request tokenizes the conversation.
    for _ in 0..BLOCK {
        timed(client, &proxied, &body, false).await?;
    }
    let (on_direct, on_proxy) = alternating(client, &direct, &proxied, &body, requests, false).await?;
    let added = |q: f64| {
        let at = |s: &[Duration]| ms(history_bench::quantile(s, q));
        round(at(&on_proxy) - at(&on_direct), 3)
    };
    let (p50, p99) = (added(0.5), added(0.99));
    Ok(json!({
        "path": format!("/v1{path}"),
        "request_bytes": body.len(),
        "requests": requests,
        "direct": latency(&on_direct),
        "proxy": latency(&on_proxy),
        "added_p50_ms": p50,
        "added_p99_ms": p99,
        "added_p50_over_chat": round(p50 / chat_added.0.max(1e-9), 3),
        "added_p99_over_chat": round(p99 / chat_added.1.max(1e-9), 3),
        "target_over_chat": 1.2,
    }))
}
