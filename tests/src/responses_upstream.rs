//! The stand-in upstream's OpenAI Responses endpoint (`POST /v1/responses`, used by
//! [`crate::upstream`]): it checks a request the way OpenAI's API does, answering 400 with
//! an OpenAI error naming what is wrong, and otherwise answers a Response object, or for
//! `"stream": true` Responses' server-sent events (`event:` + `data:`), one at a time.

use std::io::Write;
use std::time::Duration;

use serde_json::{json, Value};

/// Why OpenAI's API would refuse `body`, if it would.
pub fn refusal(body: &Value) -> Option<String> {
    check(body).err()
}

fn check(body: &Value) -> Result<(), String> {
    let body = body.as_object().ok_or("the body is not an object")?;
    if !body.get("model").is_some_and(Value::is_string) {
        return Err("model: a string is required".into());
    }
    if let Some(instructions) = body.get("instructions") {
        if !(instructions.is_string() || instructions.is_null()) {
            return Err("instructions: expected a string".into());
        }
    }
    // A continued response: the calls the input's outputs answer are at the provider.
    let continued = body.get("previous_response_id").is_some_and(|id| !id.is_null());
    match body.get("input") {
        Some(Value::String(_)) => Ok(()),
        Some(Value::Array(items)) => check_items(items, continued),
        _ => Err("input: a string or an array of items is required".into()),
    }
}

fn kind(item: &Value) -> &str {
    match item.get("type").and_then(Value::as_str) {
        Some(kind) => kind,
        None if item.get("role").is_some() => "message",
        None => "",
    }
}

fn model_side(item: &Value) -> bool {
    match kind(item) {
        "message" => item["role"] == "assistant",
        other => !other.ends_with("_call_output"),
    }
}

fn check_items(items: &[Value], continued: bool) -> Result<(), String> {
    let mut ids = std::collections::HashSet::new();
    for (index, item) in items.iter().enumerate() {
        let at = |what: &str| format!("input[{index}]: {what}");
        if let Some(id) = item.get("id").and_then(Value::as_str) {
            if !ids.insert(id.to_string()) {
                return Err(at(&format!("Duplicate item found with id {id}")));
            }
        }
        let string = |key: &str| item.get(key).is_some_and(Value::is_string);
        match kind(item) {
            "message" => check_message(item).map_err(|e| at(&e))?,
            "reasoning" => {
                if !item.get("summary").is_some_and(Value::is_array) {
                    return Err(at("reasoning: summary must be an array"));
                }
                let next = items.get(index + 1);
                if !next.is_some_and(model_side) {
                    return Err(at(&format!(
                        "Item '{}' of type 'reasoning' was provided without its required following item.",
                        item["id"].as_str().unwrap_or("")
                    )));
                }
            }
            call @ ("function_call" | "custom_tool_call") => {
                let argument = if call == "function_call" {
                    "arguments"
                } else {
                    "input"
                };
                if !(string("call_id") && string("name") && string(argument)) {
                    return Err(at(&format!(
                        "{call}: call_id, name and {argument} must be strings"
                    )));
                }
                let output = format!("{call}_output");
                let answered = items[index + 1..]
                    .iter()
                    .any(|o| kind(o) == output && o["call_id"] == item["call_id"]);
                if !answered {
                    return Err(at(&format!(
                        "No tool output found for function call {}.",
                        item["call_id"].as_str().unwrap_or("")
                    )));
                }
            }
            output @ ("function_call_output" | "custom_tool_call_output") => {
                if !string("call_id") || !(string("output") || item["output"].is_array()) {
                    return Err(at(&format!("{output}: call_id and output are required")));
                }
                let call = output.trim_end_matches("_output");
                let called = items[..index]
                    .iter()
                    .any(|c| kind(c) == call && c["call_id"] == item["call_id"]);
                if !called && !continued {
                    return Err(at(&format!(
                        "No tool call found for function call output with call_id {}.",
                        item["call_id"].as_str().unwrap_or("")
                    )));
                }
            }
            "web_search_call" | "item_reference" => {
                if !string("id") {
                    return Err(at("an id is required"));
                }
            }
            other => return Err(at(&format!("Invalid value: '{other}'"))),
        }
    }
    Ok(())
}

fn check_message(item: &Value) -> Result<(), String> {
    let role = item["role"].as_str().unwrap_or("");
    let allowed: &[&str] = match role {
        "user" | "system" | "developer" => &["input_text", "input_image", "input_file"],
        "assistant" => &["output_text", "refusal"],
        other => return Err(format!("message: invalid role '{other}'")),
    };
    match &item["content"] {
        Value::String(_) => Ok(()),
        Value::Array(parts) => {
            for (index, part) in parts.iter().enumerate() {
                let kind = part["type"].as_str().unwrap_or("");
                if !allowed.contains(&kind) {
                    return Err(format!(
                        "content[{index}]: '{kind}' is not valid in a {role} message"
                    ));
                }
                let text_ok = !kind.ends_with("_text") || part["text"].is_string();
                let image_ok =
                    kind != "input_image" || part["image_url"].is_string() || part["file_id"].is_string();
                if !(text_ok && image_ok) {
                    return Err(format!("content[{index}]: a malformed {kind} part"));
                }
            }
            Ok(())
        }
        _ => Err("message: content must be a string or an array".into()),
    }
}

/// The Response object answering `body`: its text says how many input items it got.
pub fn response(body: &Value, status: &str, text: Option<&str>) -> Value {
    let output = match text {
        Some(text) => json!([message(text, "completed")]),
        None => json!([]),
    };
    json!({
        "id": "resp_standin",
        "object": "response",
        "created_at": 1_700_000_000u64,
        "status": status,
        "model": body["model"],
        "output": output,
        "parallel_tool_calls": true,
        "tool_choice": "auto",
        "tools": [],
        "error": null,
        "incomplete_details": null,
        "instructions": body.get("instructions").cloned().unwrap_or(Value::Null),
        "metadata": {},
        "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                  "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}}
    })
}

fn message(text: &str, status: &str) -> Value {
    json!({
        "type": "message", "id": "msg_standin", "status": status, "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]
    })
}

/// What the stand-in says to `body`.
pub fn answer_text(body: &Value) -> String {
    match &body["input"] {
        Value::Array(items) => format!("answer to {} items", items.len()),
        _ => "answer to a text".into(),
    }
}

/// Writes the Responses SSE stream for `body`: `chunks` text deltas `gap` apart between
/// the events OpenAI sends around them. The times each event was written.
pub fn stream(out: &mut impl Write, body: &Value, chunks: usize, gap: Duration) -> std::io::Result<()> {
    let parts: Vec<String> = (0..chunks).map(|i| format!("part{i} ")).collect();
    let text = parts.concat();
    let mut sequence = 0u64;
    let mut event = |out: &mut dyn Write, kind: &str, mut data: Value| -> std::io::Result<()> {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(sequence);
        sequence += 1;
        out.write_all(format!("event: {kind}\ndata: {data}\n\n").as_bytes())?;
        out.flush()
    };
    let ids = json!({"item_id": "msg_standin", "output_index": 0, "content_index": 0});
    let with = |mut extra: Value| {
        for (key, value) in ids.as_object().unwrap() {
            extra[key] = value.clone();
        }
        extra
    };
    event(
        out,
        "response.created",
        json!({"response": response(body, "in_progress", None)}),
    )?;
    event(
        out,
        "response.in_progress",
        json!({"response": response(body, "in_progress", None)}),
    )?;
    event(
        out,
        "response.output_item.added",
        json!({"output_index": 0, "item": {"type": "message", "id": "msg_standin", "status": "in_progress", "role": "assistant", "content": []}}),
    )?;
    event(
        out,
        "response.content_part.added",
        with(json!({"part": {"type": "output_text", "text": "", "annotations": []}})),
    )?;
    for (index, part) in parts.iter().enumerate() {
        if index > 0 {
            std::thread::sleep(gap);
        }
        event(
            out,
            "response.output_text.delta",
            with(json!({"delta": part, "logprobs": []})),
        )?;
    }
    event(
        out,
        "response.output_text.done",
        with(json!({"text": text, "logprobs": []})),
    )?;
    event(
        out,
        "response.content_part.done",
        with(json!({"part": {"type": "output_text", "text": text, "annotations": []}})),
    )?;
    event(
        out,
        "response.output_item.done",
        json!({"output_index": 0, "item": message(&text, "completed")}),
    )?;
    event(
        out,
        "response.completed",
        json!({"response": response(body, "completed", Some(&text))}),
    )
}
