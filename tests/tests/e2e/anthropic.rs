//! Anthropic's Messages API on the proxy (docs/proxy.md#anthropic-messages): a real
//! `history-host serve --upstream` in front of a stand-in Anthropic upstream
//! (`e2e_tests::anthropic_upstream`, which validates every request as Anthropic does), driven
//! by the real `anthropic` Python SDK (in the virtualenv `cargo xtask build` makes in `target/py`).

use std::collections::BTreeMap;

use e2e_tests::anthropic_shape::{compact_arguments, to_anthropic, to_chat};
use e2e_tests::anthropic_upstream::AnthropicUpstream;
use e2e_tests::real_data_dir;
use e2e_tests::server::{shipped_config, small_window, start_proxy, Server};
use serde_json::value::RawValue;
use serde_json::{json as j, Value};

/// Runs tests/py/anthropic_client.py with `spec`; its JSON answer.
fn anthropic_client(spec: &Value) -> Value {
    e2e_tests::python_client("anthropic_client.py", spec)
}

const KEY: &str = "sk-ant-test-secret-9c1e";

/// A long coding-agent conversation: a cached system prompt, twelve tool loops each with a
/// signed thinking block, text and a `tool_use`, results with an image, a user message
/// with an image, and the request ending in a tool loop with thinking enabled.
fn agent_conversation() -> (Value, Vec<Value>) {
    let system = j!([{"type": "text", "text": "You are a careful coding agent.", "cache_control": {"type": "ephemeral"}}]);
    let image = j!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"}});
    let mut messages =
        vec![j!({"role": "user", "content": "The test suite fails; find out why and fix it."})];
    for k in 0..12 {
        messages.push(j!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": format!("Step {k}: I should read file_{k}.rs."), "signature": format!("EqQBCkYIARgCKkBsig{k}")},
            {"type": "text", "text": format!("Reading file_{k}.rs.")},
            {"type": "tool_use", "id": format!("toolu_{k:02}"), "name": "bash", "input": {"command": format!("cat src/file_{k}.rs"), "timeout": 30}}
        ]}));
        let output = format!(
            "// file_{k}.rs\n{}",
            format!("fn f{k}() {{ let x = {k}; assert_eq!(x, {k}); }}\n").repeat(40)
        );
        let result = match k {
            3 => {
                j!({"type": "tool_result", "tool_use_id": format!("toolu_{k:02}"), "content": [{"type": "text", "text": output}, image.clone()]})
            }
            7 => {
                j!({"type": "tool_result", "tool_use_id": format!("toolu_{k:02}"), "content": output, "is_error": true, "cache_control": {"type": "ephemeral"}})
            }
            _ => j!({"type": "tool_result", "tool_use_id": format!("toolu_{k:02}"), "content": output}),
        };
        let mut blocks = vec![result];
        if k == 5 {
            blocks.push(j!({"type": "text", "text": "Here is a screenshot of the failure."}));
            blocks.push(image.clone());
        }
        messages.push(j!({"role": "user", "content": blocks}));
    }
    (system, messages)
}

fn extra(system: &Value) -> Value {
    j!({
        "system": system,
        "max_tokens": 2048,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "tools": [{"name": "bash", "description": "Run a shell command.", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}}, "required": ["command"]}}],
        "tool_choice": {"type": "auto"},
        "metadata": {"user_id": "user-1"},
        "stop_sequences": ["\n\nHuman:"],
    })
}

/// A body's members as their raw texts, and its messages' raw texts.
fn raw_members(body: &str) -> (BTreeMap<String, &RawValue>, Vec<&RawValue>) {
    let members: BTreeMap<String, &RawValue> = serde_json::from_str(body).unwrap();
    let messages: Vec<&RawValue> = serde_json::from_str(members["messages"].get()).unwrap();
    (members, messages)
}

fn value(raw: &RawValue) -> Value {
    serde_json::from_str(raw.get()).unwrap()
}

/// Every message the upstream got that equals one the client sent is the client's bytes;
/// how many there were.
fn unchanged_are_byte_identical(sent: &str, upstream: &str) -> usize {
    let (_, client) = raw_members(sent);
    let (_, forwarded) = raw_members(upstream);
    let mut same = 0;
    for raw in &forwarded {
        if let Some(original) = client.iter().find(|c| value(c) == value(raw)) {
            assert_eq!(
                raw.get(),
                original.get(),
                "an unchanged message went upstream as other bytes"
            );
            same += 1;
        }
    }
    same
}

/// What Anthropic's upstream got: one valid request on `path`; its body as text.
fn the_one_valid_request(upstream: &AnthropicUpstream, path: &str) -> String {
    assert_eq!(
        upstream.invalid(),
        Vec::<String>::new(),
        "the upstream refused a request"
    );
    let received = upstream.requests();
    assert_eq!(received.len(), 1, "{received:?}");
    let request = &received[0];
    assert_eq!(request.path, path);
    // The key in whichever header the SDK sends it (x-api-key, or a bearer token).
    let bearer = format!("Bearer {KEY}");
    assert!(
        request.header("x-api-key") == Some(KEY) || request.header("authorization") == Some(bearer.as_str()),
        "the API key is forwarded: {:?}",
        request.headers
    );
    assert!(
        request.header("anthropic-version").is_some(),
        "anthropic-version is forwarded"
    );
    String::from_utf8(request.body.clone()).unwrap()
}

#[test]
fn the_anthropic_sdk_gets_the_answer_and_the_upstream_a_trimmed_valid_history_with_unchanged_messages_byte_identical(
) {
    let upstream = AnthropicUpstream::start();
    let config = small_window("");
    let server = start_proxy(&config, &upstream.base_url());
    let (system, messages) = agent_conversation();
    let extra = extra(&system);
    let answer = anthropic_client(&j!({
        "base_url": server.url(""), "api_key": KEY, "model": "claude-sonnet-4-5",
        "messages": messages, "extra": extra,
    }));
    let body = the_one_valid_request(&upstream, "/v1/messages");
    let sent = answer["sent"].as_str().unwrap();
    let forwarded: Value = serde_json::from_str(&body).unwrap();
    let out = forwarded["messages"].as_array().unwrap();
    assert!(
        out.len() < messages.len(),
        "the window trims the conversation: {} of {}",
        out.len(),
        messages.len()
    );
    assert_eq!(
        answer["text"],
        format!("answer to {} messages", out.len()),
        "{answer}"
    );

    // Every other member as the client sent it; unchanged messages as their bytes.
    let (client_members, _) = raw_members(sent);
    let (upstream_members, _) = raw_members(&body);
    for (key, raw) in &client_members {
        if key != "messages" {
            assert_eq!(upstream_members[key].get(), raw.get(), "{key}");
        }
    }
    assert_eq!(client_members.len(), upstream_members.len());
    let same = unchanged_are_byte_identical(sent, &body);
    assert!(same >= 4, "only {same} messages went upstream unchanged");
    assert_eq!(out.last(), messages.last(), "the current tool loop is kept");

    let headers = &answer["headers"];
    let counts = headers["x-history-messages"].as_str().unwrap();
    let (before, after) = counts.split_once("->").unwrap();
    assert!(
        after.parse::<usize>().unwrap() < before.parse::<usize>().unwrap(),
        "{counts}"
    );
    assert!(headers["x-history-tokens"].as_str().unwrap().contains("->"));
    // Two markers came in (system, toolu_07's result); a cut one is reported.
    let marks = headers["x-history-cache-breakpoints"].as_str().unwrap();
    let kept = body.matches("\"cache_control\"").count();
    assert_eq!(marks, format!("2->{kept}"));
}

#[test]
fn a_streamed_answer_comes_back_as_anthropics_events_and_count_tokens_passes_through() {
    let upstream = AnthropicUpstream::start();
    let config = small_window("");
    let server = start_proxy(&config, &upstream.base_url());
    let (system, messages) = agent_conversation();
    let answer = anthropic_client(&j!({
        "base_url": server.url(""), "api_key": KEY, "model": "claude-sonnet-4-5",
        "messages": messages, "extra": extra(&system), "stream": true,
    }));
    let body = the_one_valid_request(&upstream, "/v1/messages");
    let forwarded: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(forwarded["stream"], true);
    let events: Vec<&str> = answer["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(events[..2], ["message_start", "content_block_start"]);
    assert_eq!(
        events[events.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert!(events[2..events.len() - 3]
        .iter()
        .all(|e| *e == "content_block_delta"));
    let n = forwarded["messages"].as_array().unwrap().len();
    assert_eq!(answer["text"], format!("answer to {n} messages"));
    assert!(unchanged_are_byte_identical(answer["sent"].as_str().unwrap(), &body) >= 4);

    let upstream = AnthropicUpstream::start();
    let server = start_proxy(&config, &upstream.base_url());
    let answer = anthropic_client(&j!({
        "base_url": server.url(""), "api_key": KEY, "model": "claude-sonnet-4-5",
        "messages": messages, "extra": {"system": system}, "count_tokens": true,
    }));
    let body = the_one_valid_request(&upstream, "/v1/messages/count_tokens");
    assert_eq!(
        body,
        answer["sent"].as_str().unwrap(),
        "passed through as it came"
    );
    assert_eq!(answer["input_tokens"], body.len() / 4);
}

fn post_messages(server: &Server, body: &Value, headers: &[(&str, &str)]) -> (u16, Value, Option<String>) {
    post_text(server, &body.to_string(), headers)
}

fn post_text(server: &Server, body: &str, headers: &[(&str, &str)]) -> (u16, Value, Option<String>) {
    let mut request = e2e_tests::server::agent()
        .post(&server.url("/v1/messages"))
        .set("Content-Type", "application/json")
        .set("x-api-key", KEY)
        .set("anthropic-version", "2023-06-01");
    for (name, value) in headers {
        request = request.set(name, value);
    }
    let response = match request.send_string(body) {
        Ok(response) => response,
        Err(ureq::Error::Status(_, response)) => response,
        Err(e) => panic!("transport error: {e}"),
    };
    let status = response.status();
    let marks = response.header("x-history-messages").map(str::to_string);
    (
        status,
        serde_json::from_str(&response.into_string().unwrap()).unwrap(),
        marks,
    )
}

#[test]
fn a_real_conversation_in_anthropics_shape_round_trips_and_extends_a_session_through_the_proxy() {
    let text = std::fs::read_to_string(real_data_dir().join("tau-bench-airline-gpt4o.json")).unwrap();
    let chat: Vec<Value> = serde_json::from_str(&text).unwrap();
    let (system, messages) = to_anthropic(&chat);
    // The conversion round-trips exactly, but for the arguments' spelling.
    let back = to_chat(&system, &messages);
    let expected = compact_arguments(&chat);
    assert_eq!(back.len(), expected.len());
    for (i, (ours, theirs)) in back.iter().zip(&expected).enumerate() {
        assert_eq!(ours, theirs, "message {i}");
    }
    let (again_system, again) = to_anthropic(&to_chat(&system, &messages));
    assert_eq!((again_system, again), (system.clone(), messages.clone()));

    let upstream = AnthropicUpstream::start();
    let config = small_window("");
    let server = start_proxy(&config, &upstream.base_url());
    let id = server.create("gpt-4o");
    // Two turns of the session, each resending the conversation so far (ending on a user
    // message), as Anthropic's clients do.
    let half = (messages.len() / 2..messages.len())
        .find(|&i| messages[i]["role"] == "user")
        .unwrap()
        + 1;
    for end in [half, messages.len()] {
        let body = j!({"model": "gpt-4o", "max_tokens": 512, "system": system, "messages": messages[..end]});
        let (status, answer, counts) = post_messages(&server, &body, &[("X-History-Session", &id)]);
        assert_eq!(status, 200, "{answer}");
        assert!(counts.is_some());
        let sent = upstream.requests().last().unwrap().json();
        assert_eq!(
            answer["content"][0]["text"],
            format!(
                "answer to {} messages",
                sent["messages"].as_array().unwrap().len()
            )
        );
        assert_eq!(
            sent["messages"].as_array().unwrap().last(),
            messages[..end].last()
        );
        assert_eq!(sent["system"], system);
    }
    assert_eq!(
        upstream.invalid(),
        Vec::<String>::new(),
        "the upstream refused a request"
    );
    assert_eq!(
        server.transcript(&id).len(),
        chat.len(),
        "each message once, as host messages"
    );
}

#[test]
fn errors_are_in_anthropics_shape() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let config = small_window("");
    let server = start_proxy(&config, &down);
    let good = j!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    let (status, body, _) = post_messages(&server, &good, &[]);
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "api_error");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("upstream"),
        "{body}"
    );

    let bad = j!({"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "name": "x", "input": {}}]}
    ]});
    let (status, body, _) = post_messages(&server, &bad, &[]);
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body,
        j!({"type": "error", "error": {"type": "invalid_request_error", "message": "messages[1]: content[0]: tool_use block without id"}})
    );
}

/// Every shipped plugin (but `summarize`, which needs a model), after `default`, on several
/// windows, on the agent conversation and the real one in Anthropic's shape: what the
/// chain gives, written back, is a request Anthropic takes ([`validate`]).
#[test]
fn every_shipped_plugins_output_written_back_is_anthropic_valid() {
    use e2e_tests::anthropic_upstream::validate;
    use history_engine::{load_chain, stateless_context, turns, Call};
    use history_wire::anthropic;

    let (agent_system, agent) = agent_conversation();
    let text = std::fs::read_to_string(real_data_dir().join("tau-bench-airline-gpt4o.json")).unwrap();
    let (real_system, real) = to_anthropic(&serde_json::from_str::<Vec<Value>>(&text).unwrap());
    let plugins = [
        "dedupe",
        "relevance",
        "retention",
        "tool_result_filter",
        "token_budget",
        "role_pair",
    ];
    let (mut checked, mut trimmed) = (0, 0);
    for plugin in plugins {
        for window in [4, 8, 16] {
            let chain = format!("chain = [\"default\", \"{plugin}\"]");
            let view = if plugin == "role_pair" {
                "view = []"
            } else {
                "view = [\"role_pair\"]"
            };
            let window = format!("agent_max_ctx = {window}");
            let config = shipped_config(
                "",
                &[("chain =", &chain), ("view =", view), ("agent_max_ctx", &window)],
            );
            let (engine_config, _, chain) = load_chain(&config.path).unwrap();
            for (system, messages, thinking) in [(&agent_system, &agent, true), (&real_system, &real, false)]
            {
                let system_text = system.to_string();
                let texts: Vec<String> = messages.iter().map(Value::to_string).collect();
                let raws: Vec<&str> = texts.iter().map(String::as_str).collect();
                let mut parsed = anthropic::parse(Some(&system_text), &raws).unwrap();
                let turn = turns::current_turn(&parsed.messages, None);
                turns::prepare(&mut parsed.messages, turn);
                parsed.note_origins();
                let ctx = stateless_context(&engine_config, engine_config.model("gpt-4o"), turn);
                let run = chain.run(parsed.messages.clone(), &ctx, Call::Process).unwrap();
                let written = anthropic::write(&parsed, &run.history);
                trimmed += usize::from(run.history.len() < parsed.messages.len());
                let mut body = j!({
                    "model": "m", "max_tokens": 10,
                    "messages": serde_json::from_str::<Value>(&written.messages).unwrap(),
                });
                if let Some(system) = &written.system {
                    body["system"] = serde_json::from_str(system).unwrap();
                }
                if thinking {
                    body["thinking"] = j!({"type": "enabled", "budget_tokens": 1024});
                }
                validate(&body).unwrap_or_else(|why| panic!("{plugin}, {window}: {why}\n{body}"));
                checked += 1;
            }
        }
    }
    assert_eq!(checked, plugins.len() * 3 * 2);
    assert!(
        trimmed >= plugins.len() * 2,
        "the windows cut the conversations: {trimmed} of {checked}"
    );
}

/// The SDK sends compact JSON; a client that indents its JSON gets its unchanged messages
/// upstream with their indentation, byte for byte, and the changed ones in compact form.
#[test]
fn an_indented_request_keeps_the_bytes_of_its_unchanged_messages() {
    let upstream = AnthropicUpstream::start();
    let config = small_window("");
    let server = start_proxy(&config, &upstream.base_url());
    let (system, messages) = agent_conversation();
    let mut body = extra(&system);
    body["model"] = j!("claude-sonnet-4-5");
    body["messages"] = Value::Array(messages.clone());
    let sent = serde_json::to_string_pretty(&body).unwrap();
    let (status, answer, _) = post_text(
        &server,
        &sent,
        &[("anthropic-beta", "interleaved-thinking-2025-05-14")],
    );
    assert_eq!(status, 200, "{answer}");
    let forwarded = the_one_valid_request(&upstream, "/v1/messages");
    assert_eq!(
        upstream.requests()[0].header("anthropic-beta"),
        Some("interleaved-thinking-2025-05-14")
    );
    let same = unchanged_are_byte_identical(&sent, &forwarded);
    assert!(same >= 4, "only {same} unchanged");
    let (members, _) = raw_members(&forwarded);
    assert!(
        members["system"].get().contains('\n'),
        "system unchanged, as it came: {}",
        members["system"]
    );
    assert!(
        members["tools"].get().contains('\n'),
        "every other member as it came"
    );
}
