//! The OpenAI-compatible proxy (docs/proxy.md): a real `history-host serve --upstream`
//! in front of a stand-in upstream (`e2e_tests::upstream`) on free loopback ports, driven
//! by the real `openai` Python client (the virtualenv `cargo xtask test` makes in
//! `target/py`) and by a plain HTTP client.

use std::time::{Duration, Instant};

use e2e_tests::fixtures::{fixture_library, plugin_dir_with};
use e2e_tests::server::{shipped_config, small_window, start_proxy, Answer, Server};
use e2e_tests::upstream::{Behaviour, TlsIdentity, Upstream};
use e2e_tests::{json, real_data_dir, TestConfig};
use history_engine::{load_chain, stateless_context, turns, Call};
use history_wire::chat::{history_from_str, history_to_string, provider_history_to_string};
use serde_json::{json as j, Value};

/// Runs tests/py/openai_client.py with `spec`; its JSON answer.
pub(crate) fn openai_client(spec: &Value) -> Value {
    e2e_tests::python_client("openai_client.py", spec)
}

/// A raw POST of `body` (any bytes) to the proxy, with `headers`.
fn post_raw(server: &Server, body: &str, headers: &[(&str, &str)]) -> (Answer, Vec<(String, String)>) {
    let (status, headers, text) = server.post_raw("/v1/chat/completions", body, headers);
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (Answer { status, body }, headers)
}

fn post(server: &Server, body: &Value, headers: &[(&str, &str)]) -> (Answer, Vec<(String, String)>) {
    post_raw(server, &body.to_string(), headers)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// An error in OpenAI's shape: `{"error": {"message", "type", "code"}}`; its code.
fn openai_error(answer: &Answer) -> String {
    let error = &answer.body["error"];
    assert!(error["message"].is_string(), "{answer:?}");
    assert!(error["type"].is_string(), "{answer:?}");
    error["code"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer:?}"))
        .to_string()
}

/// A long real conversation (tests/data/real): 62 messages of an airline agent with tools.
fn real_conversation() -> Vec<Value> {
    let text = std::fs::read_to_string(real_data_dir().join("tau-bench-airline-gpt4o.json")).unwrap();
    json(&text).as_array().unwrap().clone()
}

#[test]
fn the_openai_client_gets_the_upstreams_answer_and_the_upstream_the_sent_history_and_every_other_member() {
    let upstream = Upstream::start(Behaviour::default());
    let config = small_window("");
    let server = start_proxy(&config, &upstream.base_url());
    let messages = real_conversation();
    let extra = j!({
        "tools": [{"type": "function", "function": {
            "name": "get_reservation_details",
            "description": "Get the details of a reservation.",
            "parameters": {"type": "object", "properties": {"reservation_id": {"type": "string"}}, "required": ["reservation_id"]}
        }}],
        "tool_choice": "auto",
        "temperature": 0.25,
        "response_format": {"type": "json_object"},
    });
    let key = "sk-test-secret-key-7f3a";
    let answer = openai_client(&j!({
        "base_url": server.url("/v1"),
        "api_key": key,
        "model": "gpt-4o",
        "messages": messages,
        "extra": extra,
    }));

    // What the chain gives on the conversation, run in-process.
    let (engine_config, _, chain) = load_chain(&config.path).unwrap();
    let history = history_from_str(&Value::Array(messages.clone()).to_string()).unwrap();
    let turn = turns::current_turn(&history, None);
    let ctx = stateless_context(&engine_config, engine_config.model("gpt-4o"), turn);
    let run = chain.run(history, &ctx, Call::Process).unwrap();
    let expected = json(&provider_history_to_string(&run.history));
    assert!(
        history_to_string(&run.history).contains("\"original_content\""),
        "the chain kept originals of what it omitted, for the host only"
    );
    assert!(
        run.history.len() < messages.len(),
        "the window trims the conversation"
    );

    let received = upstream.requests();
    assert_eq!(received.len(), 1);
    let request = &received[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {key}").as_str())
    );
    let body = request.json();
    assert_eq!(
        body["messages"], expected,
        "the upstream got the chain's sent history"
    );
    assert!(
        body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m.get("metadata").is_none()),
        "no message goes upstream with the host's metadata"
    );
    let mut others = body.as_object().unwrap().clone();
    others.remove("messages");
    let mut sent = extra.as_object().unwrap().clone();
    sent.insert("model".into(), j!("gpt-4o"));
    assert_eq!(
        Value::Object(others),
        Value::Object(sent),
        "every other member unchanged"
    );

    // The client parsed the upstream's answer; the host said what it did.
    assert_eq!(
        answer["content"],
        format!("answer to {} messages", run.history.len()),
        "{answer}"
    );
    assert_eq!(answer["model"], "gpt-4o");
    assert_eq!(
        answer["headers"]["x-history-messages"],
        format!("{}->{}", messages.len(), run.history.len())
    );
    assert_eq!(
        answer["headers"]["x-history-tokens"],
        format!("{}->{}", run.tokens_in, run.tokens_out)
    );
    assert_eq!(
        answer["headers"]["x-standin"], "yes",
        "the upstream's headers come back"
    );

    // GET /v1/models passes through.
    let models = server.get("/v1/models");
    assert_eq!(models.status, 200);
    assert_eq!(models.body["data"][0]["id"], "gpt-4o");

    // The client's key is neither logged nor stored.
    let stopped = server.stop();
    assert_eq!(stopped.code(), Some(0));
    for entry in std::fs::read_dir(config.dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap_or_default();
        assert!(
            !bytes.windows(key.len()).any(|w| w == key.as_bytes()),
            "{} holds the key",
            path.display()
        );
    }
}

#[test]
fn a_streamed_answer_reaches_the_client_chunk_by_chunk_as_the_upstream_sends_it() {
    let behaviour = Behaviour {
        chunks: 5,
        gap: Duration::from_millis(400),
        ..Behaviour::default()
    };
    let upstream = Upstream::start(behaviour);
    let config = small_window("");
    let server = start_proxy(&config, &upstream.base_url());
    let answer = openai_client(&j!({
        "base_url": server.url("/v1"),
        "model": "gpt-4o",
        "messages": real_conversation(),
        "stream": true,
    }));
    let parts: Vec<&str> = answer["parts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        parts,
        ["part0 ", "part1 ", "part2 ", "part3 ", "part4 "],
        "{answer}"
    );
    let arrived: Vec<f64> = answer["times"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_f64().unwrap())
        .collect();
    let written = upstream.chunk_times.lock().unwrap()[0].clone();
    let finished = *written.last().unwrap();
    // The first chunk arrived while the upstream was still writing the others (1.6 s of
    // gaps): nothing was buffered.
    assert!(
        arrived[0] < finished - 1.0,
        "first chunk at {}, upstream finished at {finished}",
        arrived[0]
    );
    // And each chunk arrived about when it was written, not all at the end.
    for (i, (arrived, written)) in arrived.iter().zip(&written).enumerate() {
        assert!(
            arrived - written < 0.3,
            "chunk {i} arrived {} s after it was written",
            arrived - written
        );
    }
    assert_eq!(server.stop().code(), Some(0));
}

#[test]
fn failures_are_openai_errors_502_504_400_422_and_never_a_hang() {
    // Upstream down: a port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // --upstream overrides [upstream] url; timeout_s still applies.
    let config = TestConfig::new("[upstream]\nurl = \"http://127.0.0.1:9/v1\"\ntimeout_s = 1\n");
    let server = start_proxy(&config, &format!("http://127.0.0.1:{port}/v1"));
    let request = j!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]});
    let (answer, _) = post(&server, &request, &[]);
    assert_eq!(answer.status, 502, "{answer:?}");
    assert_eq!(openai_error(&answer), "upstream_unreachable");
    // The openai client sees the same status and body.
    let seen = openai_client(&j!({
        "base_url": server.url("/v1"),
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "hello"}],
    }));
    assert_eq!(seen["status"], 502, "{seen}");
    assert_eq!(seen["body"]["code"], "upstream_unreachable", "{seen}");

    // Malformed bodies: 400, before anything goes upstream.
    for body in [
        "{not json",
        "[1]",
        r#"{"model": "gpt-4o"}"#,
        r#"{"model": "gpt-4o", "messages": [{"role": "robot"}]}"#,
    ] {
        let (answer, _) = post_raw(&server, body, &[]);
        assert_eq!(answer.status, 400, "{body}: {answer:?}");
        assert_eq!(openai_error(&answer), "invalid_request", "{body}");
    }
    drop(server);

    // An upstream slower than timeout_s: 504 after about timeout_s.
    let upstream = Upstream::start(Behaviour {
        slow: Duration::from_secs(8),
        ..Behaviour::default()
    });
    let server = start_proxy(&config, &upstream.base_url());
    // Warm up (a debug build's first count loads the tokenizer), then time a slow one.
    assert_eq!(post(&server, &request, &[]).0.status, 200);
    let started = Instant::now();
    let (answer, _) = post(
        &server,
        &j!({"model": "slow", "messages": [{"role": "user", "content": "hello"}]}),
        &[],
    );
    assert_eq!(answer.status, 504, "{answer:?}");
    assert_eq!(openai_error(&answer), "upstream_timeout");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    drop(server);

    // A plugin failing under on_plugin_error = "fail": 422 naming it; nothing sent.
    let dir = plugin_dir_with(&[&fixture_library("panicker")]);
    let failing = TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"panicker\"]\non_plugin_error = \"fail\"\n",
        dir.path().display().to_string()
    ));
    let before = upstream.requests().len();
    let server = start_proxy(&failing, &upstream.base_url());
    let (answer, _) = post(&server, &request, &[]);
    assert_eq!(answer.status, 422, "{answer:?}");
    assert_eq!(openai_error(&answer), "plugin_failed");
    assert!(answer.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("panicker"));
    assert_eq!(upstream.requests().len(), before);
    assert_eq!(server.get("/healthz").status, 200);
}

#[test]
fn a_stateless_request_naming_an_unknown_model_gets_the_default_and_says_so() {
    let upstream = Upstream::start(Behaviour::default());
    let config = small_window("");
    let server = start_proxy(&config, &upstream.base_url());
    let request = j!({"model": "gtp-4o", "messages": real_conversation()});
    let (answer, headers) = post(&server, &request, &[]);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        header(&headers, "x-history-model"),
        Some("default (unknown \"gtp-4o\")")
    );
    // The model name goes upstream as the client gave it: the upstream judges names.
    let received = upstream.requests();
    assert_eq!(received.last().unwrap().json()["model"], "gtp-4o");
    // A listed model gets no such header; the warning is logged once per name.
    let (_, headers) = post(
        &server,
        &j!({"model": "gpt-4o", "messages": real_conversation()}),
        &[],
    );
    assert_eq!(header(&headers, "x-history-model"), None);
    post(&server, &request, &[]);
    let stderr = server.stderr();
    assert_eq!(
        stderr.matches("model \"gtp-4o\" is not listed").count(),
        1,
        "{stderr}"
    );
    // With a session, the turn is refused as a session's would be.
    let id = server.create("gpt-4o");
    let (answer, _) = post(&server, &request, &[("X-History-Session", &id)]);
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(
        answer.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown model \"gtp-4o\""),
        "{answer:?}"
    );
}

#[test]
fn a_resent_conversation_is_not_tokenized_again() {
    let upstream = Upstream::start(Behaviour::default());
    let config = small_window("");
    let server = start_proxy(&config, &upstream.base_url());
    let request = j!({"model": "gpt-4o", "messages": real_conversation()});
    let (first, headers) = post(&server, &request, &[]);
    assert_eq!(first.status, 200, "{first:?}");
    let tokens = header(&headers, "x-history-tokens").unwrap().to_string();
    let counted = server.metric("history_tokens_counted_bytes_total");
    let misses = server.metric("history_token_cache_lookups_total{result=\"miss\"}");
    let hits = server.metric("history_token_cache_lookups_total{result=\"hit\"}");
    assert!(
        counted > 10_000,
        "the first request tokenized the conversation: {counted}"
    );
    assert!(server.metric("history_token_cache_entries") > 0);

    let (second, headers) = post(&server, &request, &[]);
    assert_eq!(second.status, 200);
    assert_eq!(header(&headers, "x-history-tokens").unwrap(), tokens);
    assert_eq!(
        server.metric("history_tokens_counted_bytes_total"),
        counted,
        "the second request tokenized nothing"
    );
    assert_eq!(
        server.metric("history_token_cache_lookups_total{result=\"miss\"}"),
        misses
    );
    assert!(server.metric("history_token_cache_lookups_total{result=\"hit\"}") > hits);
    assert_eq!(upstream.requests()[0].body, upstream.requests()[1].body);
}

/// How many leading messages `a` and `b` share, byte for byte.
fn prefix_kept(a: &[Value], b: &[Value]) -> usize {
    a.iter()
        .zip(b)
        .take_while(|(a, b)| a.to_string() == b.to_string())
        .count()
}

/// 50 calls of a growing conversation (a system prompt, the task, then a question and an
/// answer per call): the sent messages the upstream received, per call.
fn growing_calls(config: &TestConfig) -> Vec<Vec<Value>> {
    let upstream = Upstream::start(Behaviour::default());
    let server = start_proxy(config, &upstream.base_url());
    let mut messages = vec![
        j!({"role": "system", "content": "You are a careful assistant."}),
        j!({"role": "user", "content": "The task: keep notes on the questions that follow."}),
    ];
    for call in 0..50 {
        if call > 0 {
            messages.push(j!({"role": "assistant", "content": format!("Answer {call}: noted, with some words to count.")}));
        }
        messages
            .push(j!({"role": "user", "content": format!("Question {call}: what comes next in the list?")}));
        let (answer, _) = post(&server, &j!({"model": "gpt-4o", "messages": messages}), &[]);
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    upstream
        .requests()
        .iter()
        .map(|r| r.json()["messages"].as_array().unwrap().clone())
        .collect()
}

/// Calls whose sent history does not begin with the previous call's, byte for byte.
fn moved_cuts(sent: &[Vec<Value>]) -> usize {
    sent.windows(2)
        .filter(|pair| prefix_kept(&pair[0], &pair[1]) < pair[0].len())
        .count()
}

#[test]
fn the_sent_prefix_is_byte_stable_across_growing_calls_except_at_the_quantized_cuts() {
    // default's window of 20 messages, cut down to 10 at a time: the cut moves once every
    // 10 new messages (5 calls), not on every call.
    let quantized =
        TestConfig::new("[history]\nagent_max_ctx = 20\n[plugin.default]\ntarget_messages = 10\n");
    let sent = growing_calls(&quantized);
    assert_eq!(sent.len(), 50);
    let moved = moved_cuts(&sent);
    assert!(
        (5..=10).contains(&moved),
        "the cut moved {moved} times in 50 calls"
    );
    for (call, history) in sent.iter().enumerate() {
        assert!(history.len() <= 2 + 20, "call {call}: {} messages", history.len());
    }
    // Without a target the cut moves on nearly every call past the window.
    let plain = TestConfig::new("[history]\nagent_max_ctx = 20\n");
    let plain_moved = moved_cuts(&growing_calls(&plain));
    assert!(
        plain_moved > 30,
        "without a target the cut moved {plain_moved} times"
    );
}

/// `[history] ingest` through the proxy (docs/chain.md#ingest): a stateless request's
/// messages are all entering, so the redactor runs on them before the chain and nothing
/// with the secret goes upstream; with a session the transcript holds the redacted text,
/// and a client resending the raw conversation still extends it (the resent prefix is
/// compared as ingest would store it).
#[test]
fn ingest_redacts_what_goes_upstream_and_what_a_session_stores() {
    let upstream = Upstream::start(Behaviour::default());
    let dir = e2e_tests::fixtures::plugin_dir_with_installed(&[&fixture_library("redactor")]);
    let config = TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"tool_result_filter\"]\ningest = [\"redactor\"]\n[models.gpt-4o]\n",
        dir.path().display().to_string()
    ));
    let server = start_proxy(&config, &upstream.base_url());
    let mut conversation = real_conversation();
    conversation[1]["content"] = j!("my card is SECRET, book the flight");
    let (answer, _) = post(
        &server,
        &j!({"model": "gpt-4o", "messages": conversation[..20]}),
        &[],
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    let received = upstream.requests().last().unwrap().json();
    assert!(!received.to_string().contains("SECRET"), "{received}");
    assert_eq!(
        received["messages"][1]["content"],
        "my card is [redacted], book the flight"
    );

    let id = server.create("gpt-4o");
    for end in [20, 41] {
        let (answer, _) = post(
            &server,
            &j!({"model": "gpt-4o", "messages": conversation[..end]}),
            &[("X-History-Session", &id)],
        );
        assert_eq!(answer.status, 200, "{end}: {answer:?}");
        assert!(!upstream
            .requests()
            .last()
            .unwrap()
            .json()
            .to_string()
            .contains("SECRET"));
    }
    let transcript = server.transcript(&id);
    assert_eq!(transcript.len(), 41, "each message once");
    assert!(!Value::Array(transcript).to_string().contains("SECRET"));
}

#[test]
fn with_a_session_header_a_request_is_a_turn_and_the_transcript_holds_each_message_once() {
    let upstream = Upstream::start(Behaviour::default());
    let config = small_window("");
    let server = start_proxy(&config, &upstream.base_url());
    let id = server.create("gpt-4o");
    let conversation = real_conversation();
    // Three requests, each resending the whole conversation so far, as OpenAI clients do.
    let cuts = [20, 41, conversation.len()];
    for (turn, &end) in cuts.iter().enumerate() {
        let answer = openai_client(&j!({
            "base_url": server.url("/v1"),
            "model": "gpt-4o",
            "messages": conversation[..end],
            "headers": {"X-History-Session": id},
        }));
        assert!(answer["content"].is_string(), "turn {}: {answer}", turn + 1);
        // The upstream got this turn's sent history, as the session service gives it.
        let sent = server.history(&id, true);
        let received = upstream.requests().last().unwrap().json();
        let mut expected = sent.as_array().unwrap().clone();
        for message in &mut expected {
            // Without the host's metadata: stamps, policies, omitted originals.
            message.as_object_mut().unwrap().remove("metadata");
        }
        assert_eq!(received["messages"], Value::Array(expected), "turn {}", turn + 1);
        assert!(received.get("metadata").is_none());
    }
    let transcript = server.transcript(&id);
    assert_eq!(transcript.len(), conversation.len(), "each message once");
    for (stored, sent) in transcript.iter().zip(&conversation) {
        assert_eq!(stored["role"], sent["role"]);
        assert_eq!(stored["content"], sent["content"]);
    }
    let info = server.get("/v1/sessions").status;
    let _ = info;

    // A request that does not extend the transcript: 409 naming the first difference.
    let mut changed = conversation.clone();
    changed[3]["content"] = j!("something else");
    changed.push(j!({"role": "user", "content": "and now?"}));
    let (answer, _) = post(
        &server,
        &j!({"model": "gpt-4o", "messages": changed}),
        &[("X-History-Session", &id)],
    );
    assert_eq!(answer.status, 409, "{answer:?}");
    assert_eq!(openai_error(&answer), "transcript_conflict");
    assert!(
        answer.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("messages[3]"),
        "{answer:?}"
    );
    // One that adds nothing: also 409; the transcript is unchanged.
    let (answer, _) = post(
        &server,
        &j!({"model": "gpt-4o", "messages": conversation}),
        &[("X-History-Session", &id)],
    );
    assert_eq!(answer.status, 409, "{answer:?}");
    assert_eq!(server.transcript(&id).len(), conversation.len());
}

/// A CA made for the test (its PEM) and a certificate for 127.0.0.1 it signed.
fn test_ca_and_identity() -> (String, TlsIdentity) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    (
        ca.pem(),
        TlsIdentity {
            chain: vec![leaf.der().to_vec()],
            key: key.serialize_der(),
        },
    )
}

#[test]
fn an_https_upstream_is_reached_through_a_private_ca_and_an_untrusted_one_is_a_502_naming_tls() {
    let (ca_pem, identity) = test_ca_and_identity();
    let behaviour = Behaviour {
        chunks: 3,
        gap: Duration::from_millis(50),
        ..Behaviour::default()
    };
    let upstream = Upstream::start_tls(behaviour, identity);
    assert!(upstream.base_url().starts_with("https://127.0.0.1:"));
    let messages = real_conversation();

    // Trusted through `[upstream] ca_file` (beside the configuration).
    let config = shipped_config(
        "",
        &[(
            "[history]",
            "[upstream]\nurl = \"http://replaced.invalid/v1\"\nca_file = \"ca.pem\"\n\n[history]",
        )],
    );
    std::fs::write(config.dir.path().join("ca.pem"), &ca_pem).unwrap();
    let server = start_proxy(&config, &upstream.base_url());
    let (answer, headers) = post(&server, &j!({"model": "gpt-4o", "messages": messages}), &[]);
    assert_eq!(answer.status, 200, "{answer:?}\n{}", server.stderr());
    assert_eq!(
        answer.body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .split(' ')
            .next(),
        Some("answer")
    );
    assert_eq!(header(&headers, "x-standin"), Some("yes"));
    let (streamed, headers) = post(
        &server,
        &j!({"model": "gpt-4o", "messages": messages, "stream": true}),
        &[],
    );
    assert_eq!(streamed.status, 200, "{streamed:?}");
    assert_eq!(header(&headers, "content-type"), Some("text/event-stream"));
    let text = streamed.body.as_str().unwrap();
    let parts: Vec<&str> = text.lines().filter(|l| l.starts_with("data: ")).collect();
    assert_eq!(parts.len(), 4, "three chunks and [DONE]: {text}");
    assert!(parts[0].contains("part0") && parts[2].contains("part2"), "{text}");
    assert_eq!(parts[3], "data: [DONE]");
    let received = upstream.requests();
    assert_eq!(received.len(), 2, "both requests reached the upstream over TLS");
    assert_eq!(received[0].path, "/v1/chat/completions");
    drop(server);

    // Not trusted: no `ca_file`, and the test's CA is in no root store.
    let untrusted = small_window("");
    let server = start_proxy(&untrusted, &upstream.base_url());
    let (answer, _) = post(&server, &j!({"model": "gpt-4o", "messages": messages}), &[]);
    assert_eq!(answer.status, 502, "{answer:?}");
    assert_eq!(openai_error(&answer), "upstream_tls");
    let message = answer.body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("TLS with the upstream failed:") && message.contains("certificate"),
        "{message}"
    );
    assert_eq!(upstream.requests().len(), 2, "nothing reached the upstream");
    drop(server);

    // A ca_file that is not a certificate: serve refuses to start, naming it.
    let broken = shipped_config(
        "",
        &[(
            "[history]",
            "[upstream]\nurl = \"https://127.0.0.1:1/v1\"\nca_file = \"key.pem\"\n\n[history]",
        )],
    );
    std::fs::write(broken.dir.path().join("key.pem"), "not a certificate\n").unwrap();
    let store = broken.dir.path().join("sessions.db");
    let err = Server::try_start(&broken.path, &store, &[], &["--listen", "127.0.0.1:0"])
        .err()
        .expect("serve refuses a ca_file without a certificate");
    assert!(
        err.contains("`ca_file` in [upstream]")
            && err.contains("key.pem")
            && err.contains("no PEM certificate"),
        "{err}"
    );
}
