//! OpenAI's Responses API through the proxy (docs/proxy.md#responses): a real
//! `history-host serve --upstream` in front of the stand-in upstream, which checks each
//! Responses request as OpenAI does (`e2e_tests::responses_upstream`), driven by the real
//! `openai` Python client's `client.responses.create` and by a plain HTTP client.

use e2e_tests::responses_upstream::refusal;
use e2e_tests::server::{small_window, start_proxy, Server};
use e2e_tests::upstream::{Behaviour, Upstream};
use e2e_tests::{json, real_data_dir};
use serde_json::value::RawValue;
use serde_json::{json as j, Value};

/// Runs tests/py/openai_responses.py with `spec`; its JSON answer.
fn responses_client(spec: &Value) -> Value {
    e2e_tests::python_client("openai_responses.py", spec)
}

/// A 1×1 PNG.
const PNG: &str = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

/// A long real agent conversation (tests/data/real, 62 messages of an airline agent with
/// tools) as Responses input, the way a reasoning model's agent resends it: the system
/// text as `instructions`, each model turn a `reasoning` item (with encrypted content)
/// before its function calls or its answer, the first user message with an image.
fn agent_conversation() -> (String, Vec<Value>) {
    let text = std::fs::read_to_string(real_data_dir().join("tau-bench-airline-gpt4o.json")).unwrap();
    let messages = json(&text).as_array().unwrap().clone();
    let mut instructions = String::new();
    let mut items = Vec::new();
    let mut image = true;
    for (index, message) in messages.iter().enumerate() {
        let content = message["content"].as_str().unwrap_or("");
        match message["role"].as_str().unwrap() {
            "system" => instructions = content.to_string(),
            "user" => {
                let mut parts = vec![j!({"type": "input_text", "text": content})];
                if std::mem::take(&mut image) {
                    parts.push(j!({"type": "input_image", "image_url": PNG, "detail": "low"}));
                }
                items.push(j!({"type": "message", "role": "user", "content": parts}));
            }
            "assistant" => {
                items.push(j!({
                    "type": "reasoning", "id": format!("rs_{index}"),
                    "summary": [{"type": "summary_text", "text": format!("thinking about step {index}")}],
                    "encrypted_content": format!("gAAAAABo{index}{}", "Zm9vYmFy".repeat(40)),
                }));
                if !content.is_empty() {
                    items.push(j!({
                        "type": "message", "role": "assistant", "id": format!("msg_{index}"), "status": "completed",
                        "content": [{"type": "output_text", "text": content, "annotations": []}],
                    }));
                }
                for (k, call) in message["tool_calls"].as_array().into_iter().flatten().enumerate() {
                    items.push(j!({
                        "type": "function_call", "id": format!("fc_{index}_{k}"), "call_id": call["id"],
                        "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                        "status": "completed",
                    }));
                }
            }
            "tool" => items.push(j!({
                "type": "function_call_output", "call_id": message["tool_call_id"], "output": content,
            })),
            other => panic!("role {other}"),
        }
    }
    assert!(refusal(&j!({"model": "m", "instructions": instructions, "input": items})).is_none());
    (instructions, items)
}

/// The other members of a request, as an agent sends them.
fn extra() -> Value {
    j!({
        "tools": [{"type": "function", "name": "get_reservation_details", "description": "Get a reservation.",
                   "parameters": {"type": "object", "properties": {"reservation_id": {"type": "string"}}, "required": ["reservation_id"]},
                   "strict": false}],
        "tool_choice": "auto",
        "store": false,
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"effort": "medium", "summary": "auto"},
        "text": {"verbosity": "low"},
        "metadata": {"run": "e2e"},
        "parallel_tool_calls": true,
    })
}

fn header<'a>(headers: &'a Value, name: &str) -> &'a str {
    headers[name]
        .as_str()
        .unwrap_or_else(|| panic!("no {name} in {headers}"))
}

/// "IN->OUT" read.
fn counts(value: &str) -> (usize, usize) {
    let (a, b) = value.split_once("->").unwrap();
    (a.parse().unwrap(), b.parse().unwrap())
}

/// Every request the upstream got was one OpenAI would take.
fn all_valid(upstream: &Upstream) {
    for request in upstream.requests() {
        if request.path.ends_with("/responses") {
            assert_eq!(
                refusal(&request.json()),
                None,
                "the upstream got an invalid request"
            );
        }
    }
}

#[test]
fn the_openai_client_gets_the_answer_and_the_upstream_a_trimmed_valid_input_with_every_other_member() {
    let upstream = Upstream::start(Behaviour::default());
    let config = small_window("");
    let server = start_proxy(&config, &upstream.base_url());
    let (instructions, items) = agent_conversation();
    let mut extra = extra();
    extra["instructions"] = j!(instructions);
    let answer = responses_client(&j!({
        "base_url": server.url("/v1"), "model": "gpt-4o", "input": items, "extra": extra,
        "api_key": "sk-responses-test",
    }));
    assert!(answer.get("status").is_none(), "refused: {answer}");
    all_valid(&upstream);

    let received = upstream.requests();
    assert_eq!(received.len(), 1);
    let request = &received[0];
    assert_eq!(request.path, "/v1/responses");
    assert_eq!(request.header("authorization"), Some("Bearer sk-responses-test"));
    let body = request.json();
    let sent = body["input"].as_array().unwrap();
    assert!(
        sent.len() < items.len(),
        "the window trims: {} of {}",
        sent.len(),
        items.len()
    );
    assert_eq!(answer["output_text"], format!("answer to {} items", sent.len()));
    let headers = &answer["headers"];
    let (messages_in, messages_out) = counts(header(headers, "x-history-messages"));
    assert!(messages_out < messages_in, "{headers}");
    let (tokens_in, tokens_out) = counts(header(headers, "x-history-tokens"));
    assert!(tokens_out < tokens_in, "{headers}");
    assert_eq!(header(headers, "x-standin"), "yes");

    // Every other member as the client sent it; the pinned system text kept.
    let mut others = body.as_object().unwrap().clone();
    others.remove("input");
    let mut expected = extra.as_object().unwrap().clone();
    expected.insert("model".into(), j!("gpt-4o"));
    assert_eq!(Value::Object(others), Value::Object(expected));
    // What was kept is a suffix of what was sent, item for item, but whatever was cut.
    let last = sent.last().unwrap();
    assert_eq!(last, items.last().unwrap(), "the newest item goes upstream");
    assert!(sent
        .iter()
        .all(|item| item["type"] != "function_call" || items.contains(item)));
}

/// The conversation pretty-printed, so each item's bytes are its own.
fn raw_body(instructions: &str, items: &[Value]) -> String {
    let body = j!({"model": "gpt-4o", "instructions": instructions, "input": items, "store": false});
    serde_json::to_string_pretty(&body).unwrap()
}

fn post_raw(server: &Server, body: &str, headers: &[(&str, &str)]) -> (u16, Vec<(String, String)>, String) {
    server.post_raw("/v1/responses", body, headers)
}

fn got<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

#[test]
fn unchanged_items_go_upstream_byte_for_byte_and_previous_response_id_passes_through() {
    let upstream = Upstream::start(Behaviour::default());
    let config = small_window("");
    let server = start_proxy(&config, &upstream.base_url());
    let (instructions, items) = agent_conversation();
    let body = raw_body(&instructions, &items);
    let (status, headers, answer) = post_raw(&server, &body, &[]);
    assert_eq!(status, 200, "{answer}");
    all_valid(&upstream);
    let (messages_in, messages_out) = counts(got(&headers, "x-history-messages").unwrap());
    assert!(messages_out < messages_in);

    // The items as the client wrote them (pretty-printed) and as the upstream got them.
    let sent: Value = serde_json::from_str(&body).unwrap();
    let original: Vec<&RawValue> = raw_items(&body);
    let forwarded = String::from_utf8(upstream.requests()[0].body.clone()).unwrap();
    let received: Vec<&RawValue> = raw_items(&forwarded);
    let mut identical = 0;
    for item in &received {
        let value: Value = serde_json::from_str(item.get()).unwrap();
        if let Some(at) = sent["input"].as_array().unwrap().iter().position(|v| *v == value) {
            assert_eq!(item.get(), original[at].get(), "an unchanged item changed bytes");
            assert!(item.get().contains('\n'), "as pretty-printed");
            identical += 1;
        }
    }
    assert!(identical > 5, "{identical} unchanged items");
    assert!(received.len() < original.len());
    let upstream_body: Value = serde_json::from_str(&forwarded).unwrap();
    assert_eq!(upstream_body["instructions"], j!(instructions));

    // A continued response: the history is at the provider; the request goes through
    // untouched, byte for byte, and says so.
    let continued = format!(
        "{{ \"model\" : \"gpt-4o\",\"previous_response_id\":\"resp_1\", \"input\": [ {{\"type\":\"function_call_output\",\"call_id\":\"{}\",\"output\":\"ok\"}} ] }}",
        "call_only_at_the_provider"
    );
    let (status, headers, answer) = post_raw(&server, &continued, &[]);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(got(&headers, "x-history-messages"), Some("passthrough"));
    assert_eq!(upstream.requests().last().unwrap().body, continued.as_bytes());
    all_valid(&upstream);

    // Bad input is an OpenAI error naming where; nothing goes upstream.
    let before = upstream.requests().len();
    let (status, _, answer) = post_raw(
        &server,
        r#"{"model":"gpt-4o","input":[{"type":"message","role":"robot","content":"x"}]}"#,
        &[],
    );
    assert_eq!(status, 400);
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["error"]["type"], "invalid_request_error");
    assert!(
        answer["error"]["message"].as_str().unwrap().contains("input[0]"),
        "{answer}"
    );
    for (body, says) in [
        (r#"{"model":"gpt-4o","input":[]}"#, "at least one item"),
        (r#"{"model":"gpt-4o"}"#, r#"missing \"input\""#),
        (r#"{"model":"gpt-4o","input":7}"#, "a string or an array"),
        (r#"[1]"#, "a JSON object"),
    ] {
        let (status, _, answer) = post_raw(&server, body, &[]);
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer.contains(says), "{body}: {answer}");
    }
    assert_eq!(upstream.requests().len(), before);
}

fn raw_items(body: &str) -> Vec<&RawValue> {
    let members: std::collections::HashMap<String, &RawValue> = serde_json::from_str(body).unwrap();
    serde_json::from_str(members["input"].get()).unwrap()
}

#[test]
fn a_streamed_answer_comes_as_responses_events() {
    let upstream = Upstream::start(Behaviour {
        chunks: 4,
        gap: std::time::Duration::from_millis(100),
        ..Behaviour::default()
    });
    let config = small_window("");
    let server = start_proxy(&config, &upstream.base_url());
    let (instructions, items) = agent_conversation();
    let answer = responses_client(&j!({
        "base_url": server.url("/v1"), "model": "gpt-4o", "input": items, "stream": true,
        "extra": {"instructions": instructions, "store": false},
    }));
    assert!(answer.get("status").is_none(), "refused: {answer}");
    all_valid(&upstream);
    let events: Vec<&str> = answer["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(events.first(), Some(&"response.created"));
    assert_eq!(events.last(), Some(&"response.completed"));
    assert_eq!(
        events
            .iter()
            .filter(|e| **e == "response.output_text.delta")
            .count(),
        4
    );
    let deltas: String = answer["deltas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert_eq!(deltas, "part0 part1 part2 part3 ");
    assert_eq!(answer["output_text"], j!(deltas));
    assert_eq!(upstream.requests()[0].json()["stream"], true);
}

#[test]
fn with_a_session_header_each_request_extends_the_sessions_transcript() {
    let upstream = Upstream::start(Behaviour::default());
    let config = small_window("");
    let server = start_proxy(&config, &upstream.base_url());
    let id = server.create("gpt-4o");
    let (instructions, items) = agent_conversation();
    // Each request resends the whole conversation so far, ending before a user message.
    let cuts: Vec<usize> = [30, items.len()]
        .iter()
        .map(|&end| {
            (1..=end)
                .rev()
                .find(|&e| e == items.len() || items[e]["role"] == "user")
                .unwrap()
        })
        .collect();
    let mut lengths = Vec::new();
    for &end in &cuts {
        let answer = responses_client(&j!({
            "base_url": server.url("/v1"), "model": "gpt-4o", "input": items[..end],
            "extra": {"instructions": instructions},
            "headers": {"X-History-Session": id},
        }));
        assert!(answer.get("status").is_none(), "refused: {answer}");
        all_valid(&upstream);
        let (_, out) = counts(header(&answer["headers"], "x-history-messages"));
        let received = upstream.requests().last().unwrap().json();
        assert!(!received["input"].as_array().unwrap().is_empty());
        assert_eq!(received["instructions"], j!(instructions));
        lengths.push((server.transcript(&id).len(), out));
    }
    // The transcript grew by the new messages only (each message once).
    assert!(lengths[1].0 > lengths[0].0, "{lengths:?}");
    let sent = server.history(&id, true);
    assert_eq!(sent.as_array().unwrap().len(), lengths[1].1);
}
