//! `history-bench proxy --wire responses`: the same resent conversation as OpenAI
//! Responses input (docs/proxy.md#responses), through `POST /v1/responses` beside the
//! direct call, so the Responses wire's added latency stands beside the chat wire's in one
//! run (issue #28's target: within 1.2× of the chat wire's). [`measure`] measures every
//! other wire so, interleaved with the chat wire (`proxy_anthropic.rs` gives the
//! Anthropic request).

use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::loopback::{latency, ms, round, HttpClient, Serve};
use crate::proxy::{timed, BLOCK};
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

/// A wire measured beside the chat wire: its name, its path under `/v1`, its request.
pub struct Wire {
    pub name: &'static str,
    pub path: &'static str,
    pub body: Bytes,
}

/// The chat wire and each of `wires`, direct and proxied, all interleaved in blocks of
/// [`BLOCK`] (so a change in the machine's load falls on every wire alike); each wire's
/// added latency against the chat wire's in the same loop.
pub async fn measure(
    client: &HttpClient,
    server: &Serve,
    upstream: &str,
    chat: &Bytes,
    wires: &[Wire],
    requests: usize,
) -> Result<Value> {
    let mut all = vec![("chat", "/chat/completions", chat.clone())];
    all.extend(wires.iter().map(|w| (w.name, w.path, w.body.clone())));
    let urls: Vec<(String, String)> = all
        .iter()
        .map(|(_, path, _)| (format!("{upstream}{path}"), server.url(&format!("/v1{path}"))))
        .collect();
    // Warm: the first request reads and tokenizes the conversation.
    for ((_, proxied), (_, _, body)) in urls.iter().zip(&all) {
        for _ in 0..BLOCK {
            timed(client, proxied, body, false).await?;
        }
    }
    let mut taken: Vec<(Vec<Duration>, Vec<Duration>)> = vec![Default::default(); all.len()];
    while taken[0].0.len() < requests {
        let n = BLOCK.min(requests - taken[0].0.len());
        for (((direct, proxied), (_, _, body)), (on_direct, on_proxy)) in
            urls.iter().zip(&all).zip(&mut taken)
        {
            for _ in 0..n {
                on_direct.push(timed(client, direct, body, false).await?);
            }
            for _ in 0..n {
                on_proxy.push(timed(client, proxied, body, false).await?);
            }
        }
    }
    let added = |(on_direct, on_proxy): &(Vec<Duration>, Vec<Duration>), q: f64| {
        let at = |s: &[Duration]| ms(history_bench::quantile(s, q));
        round(at(on_proxy) - at(on_direct), 3)
    };
    let chat_added = (added(&taken[0], 0.5), added(&taken[0], 0.99));
    let mut out = serde_json::Map::new();
    out.insert(
        "chat".into(),
        json!({
            "path": "/v1/chat/completions",
            "request_bytes": chat.len(),
            "requests": requests,
            "direct": latency(&taken[0].0),
            "proxy": latency(&taken[0].1),
            "added_p50_ms": chat_added.0,
            "added_p99_ms": chat_added.1,
        }),
    );
    for ((name, path, body), measured) in all.iter().zip(&taken).skip(1) {
        let (p50, p99) = (added(measured, 0.5), added(measured, 0.99));
        out.insert(
            name.to_string(),
            json!({
                "path": format!("/v1{path}"),
                "request_bytes": body.len(),
                "requests": requests,
                "direct": latency(&measured.0),
                "proxy": latency(&measured.1),
                "added_p50_ms": p50,
                "added_p99_ms": p99,
                "added_p50_over_chat": round(p50 / chat_added.0.max(1e-9), 3),
                "added_p99_over_chat": round(p99 / chat_added.1.max(1e-9), 3),
                "target_over_chat": 1.2,
            }),
        );
    }
    Ok(Value::Object(out))
}
