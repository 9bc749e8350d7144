//! A stand-in Anthropic Messages upstream for the proxy's Anthropic tests: a small HTTP/1.1
//! server on a free loopback port, one thread per connection, that records every request
//! and VALIDATES `POST /v1/messages` the way Anthropic does (the rules in [`validate`]): an
//! invalid request is answered 400 with Anthropic's error shape and recorded in
//! [`AnthropicUpstream::invalid`]. A valid one gets a Messages response, or for
//! `"stream": true` the SSE events `message_start`, `content_block_start`,
//! `content_block_delta`…, `content_block_stop`, `message_delta`, `message_stop`.
//! `POST /v1/messages/count_tokens` answers `{"input_tokens": N}`.

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::upstream::{accept, read_request, Received};

/// The running stand-in; it stops accepting when dropped.
pub struct AnthropicUpstream {
    pub addr: String,
    pub received: Arc<Mutex<Vec<Received>>>,
    /// Each refused request: why.
    pub invalid: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl AnthropicUpstream {
    pub fn start() -> AnthropicUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream = AnthropicUpstream {
            addr: listener.local_addr().unwrap().to_string(),
            received: Arc::default(),
            invalid: Arc::default(),
            stop: Arc::default(),
        };
        let (received, invalid, stop) = (
            upstream.received.clone(),
            upstream.invalid.clone(),
            upstream.stop.clone(),
        );
        accept(listener, stop, move |stream| {
            let (received, invalid) = (received.clone(), invalid.clone());
            move || {
                let _ = serve(stream, &received, &invalid);
            }
        });
        upstream
    }

    /// Anthropic's own base URL form (no `/v1`), as `ANTHROPIC_BASE_URL` takes it.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    pub fn invalid(&self) -> Vec<String> {
        self.invalid.lock().unwrap().clone()
    }
}

impl Drop for AnthropicUpstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
    }
}

fn blocks(message: &Value) -> Vec<Value> {
    match &message["content"] {
        Value::Array(blocks) => blocks.clone(),
        Value::String(text) => vec![json!({"type": "text", "text": text})],
        _ => Vec::new(),
    }
}

fn kind(block: &Value) -> &str {
    block["type"].as_str().unwrap_or("")
}

/// Anthropic's rules on a request: `system` a string or text blocks; messages non-empty,
/// the first a user message, roles alternating; every `tool_use` answered by a
/// `tool_result` in the next user message, tool results before any other block there, no
/// result without its call; with `thinking` enabled, the last assistant message of a tool
/// loop starts with a signed thinking block (or a redacted one).
pub fn validate(body: &Value) -> Result<(), String> {
    match &body["system"] {
        Value::Null | Value::String(_) => {}
        Value::Array(system) if system.iter().all(|b| kind(b) == "text" && b["text"].is_string()) => {}
        other => return Err(format!("system: must be a string or text blocks, found {other}")),
    }
    if !body["model"].is_string() || !body["max_tokens"].is_u64() {
        return Err("model and max_tokens are required".into());
    }
    let messages = body["messages"]
        .as_array()
        .ok_or("messages: an array is required")?;
    if messages.first().map(|m| &m["role"]) != Some(&json!("user")) {
        return Err("messages: the first message must use the user role".into());
    }
    let mut calls: Vec<String> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or("");
        let expected = if i % 2 == 0 { "user" } else { "assistant" };
        if role != expected {
            return Err(format!(
                "messages.{i}: roles must alternate between user and assistant"
            ));
        }
        if !(message["content"].is_string() || message["content"].is_array()) {
            return Err(format!("messages.{i}.content: a string or blocks is required"));
        }
        let blocks = blocks(message);
        if role == "assistant" {
            if !calls.is_empty() {
                return Err(format!(
                    "messages.{i}: tool_use ids without tool_result: {calls:?}"
                ));
            }
            calls = blocks
                .iter()
                .filter(|b| kind(b) == "tool_use")
                .map(|b| b["id"].as_str().unwrap_or("").to_string())
                .collect();
            for (j, block) in blocks.iter().enumerate() {
                if kind(block) == "tool_use" && !block["input"].is_object() {
                    return Err(format!("messages.{i}.content.{j}.input: an object is required"));
                }
                if kind(block) == "thinking" && !block["signature"].is_string() {
                    return Err(format!("messages.{i}.content.{j}.signature: Field required"));
                }
            }
            continue;
        }
        let mut others_seen = false;
        for (j, block) in blocks.iter().enumerate() {
            if kind(block) == "tool_result" {
                if others_seen {
                    return Err(format!(
                        "messages.{i}.content.{j}: tool_result blocks must come first"
                    ));
                }
                let id = block["tool_use_id"].as_str().unwrap_or("");
                let Some(at) = calls.iter().position(|c| c == id) else {
                    return Err(format!(
                        "messages.{i}.content.{j}: unexpected tool_use_id {id:?} in tool_result blocks: each tool_result must have a tool_use in the previous message"
                    ));
                };
                calls.remove(at);
            } else {
                others_seen = true;
            }
        }
        if !calls.is_empty() {
            return Err(format!(
                "messages.{i}: tool_use ids without tool_result blocks: {calls:?}"
            ));
        }
    }
    if !calls.is_empty() {
        return Err(format!(
            "the last assistant message has unanswered tool_use ids {calls:?}"
        ));
    }
    thinking_rule(body, messages)
}

fn thinking_rule(body: &Value, messages: &[Value]) -> Result<(), String> {
    if body["thinking"]["type"] != "enabled" {
        return Ok(());
    }
    let last = messages.last().unwrap();
    let in_loop = blocks(last).iter().any(|b| kind(b) == "tool_result");
    if !in_loop {
        return Ok(());
    }
    let Some(assistant) = messages.iter().rev().find(|m| m["role"] == "assistant") else {
        return Ok(());
    };
    match blocks(assistant).first() {
        Some(b) if kind(b) == "thinking" && b["signature"].is_string() => Ok(()),
        Some(b) if kind(b) == "redacted_thinking" => Ok(()),
        _ => Err("with thinking enabled, the final assistant message of a tool loop must start with a thinking block".into()),
    }
}

fn answer(out: &mut TcpStream, status: &str, body: &Value) -> std::io::Result<()> {
    let body = body.to_string();
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    out.flush()
}

fn serve(
    stream: TcpStream,
    received: &Mutex<Vec<Received>>,
    invalid: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    while let Some(request) = read_request(&mut reader)? {
        received.lock().unwrap().push(request.clone());
        let out = reader.get_mut();
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        if request.path == "/v1/messages/count_tokens" {
            answer(out, "200 OK", &json!({"input_tokens": request.body.len() / 4}))?;
            continue;
        }
        if request.path != "/v1/messages" {
            let error = format!("no route {}", request.path);
            invalid.lock().unwrap().push(error.clone());
            answer(
                out,
                "404 Not Found",
                &json!({"type": "error", "error": {"type": "not_found_error", "message": error}}),
            )?;
            continue;
        }
        if let Err(why) = validate(&body) {
            invalid.lock().unwrap().push(why.clone());
            answer(
                out,
                "400 Bad Request",
                &json!({"type": "error", "error": {"type": "invalid_request_error", "message": why}}),
            )?;
            continue;
        }
        let model = body["model"].as_str().unwrap_or("").to_string();
        let text = format!(
            "answer to {} messages",
            body["messages"].as_array().map_or(0, Vec::len)
        );
        if body["stream"] == true {
            return stream_answer(out, &model, &text);
        }
        answer(
            out,
            "200 OK",
            &json!({
                "id": "msg_standin", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": text}],
                "stop_reason": "end_turn", "stop_sequence": null,
                "usage": {"input_tokens": 1, "output_tokens": 1}
            }),
        )?;
    }
    Ok(())
}

fn stream_answer(out: &mut TcpStream, model: &str, text: &str) -> std::io::Result<()> {
    out.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n")?;
    let mut events = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {
            "id": "msg_standin", "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 1, "output_tokens": 0}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
    ];
    for word in text.split_inclusive(' ') {
        events.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": word}}),
        ));
    }
    events.push((
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push(("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 4}})));
    events.push(("message_stop", json!({"type": "message_stop"})));
    for (name, data) in events {
        out.write_all(format!("event: {name}\ndata: {data}\n\n").as_bytes())?;
        out.flush()?;
    }
    Ok(())
}
