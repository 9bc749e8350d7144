//! The session service over HTTP (docs/http-api.md, docs/sessions.md): a real
//! `history-host serve` on a free loopback port with a temporary store, driven by a real
//! HTTP client.

use e2e_tests::fixtures::{fixture_library, plugin_dir_with};
use e2e_tests::server::{shipped_config, split_turns, with_stamps, Server};
use e2e_tests::store::{Kind, TestStore};
use e2e_tests::{json, real_conversations, TestConfig};
use history_engine::{load_chain, stateless_context, Call};
use history_wire::chat::{history_from_str, history_to_string};
use plugin_api::structure::Faults;
use serde_json::{json as j, Value};

/// Messages of a working history past the pinned ones (leading system messages and the
/// task): what `default`'s window (`effective_ctx`) bounds.
fn unpinned(working: &Value) -> usize {
    let messages = working.as_array().unwrap();
    let system = messages.iter().take_while(|m| m["role"] == "system").count();
    let task = usize::from(messages.get(system).is_some_and(|m| m["role"] == "user"));
    messages.len() - system - task
}

/// The shipped chain on a small window, so the real conversations get trimmed.
fn small_window_config() -> TestConfig {
    shipped_config("", &[("agent_max_ctx", "agent_max_ctx = 12")])
}

fn real_conversations_turn_by_turn_give_what_the_chain_gives_and_the_transcript_keeps_them(kind: Kind) {
    let config = small_window_config();
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let (engine_config, _, chain) = load_chain(&config.path).unwrap();
    for (name, text) in real_conversations() {
        let conversation = json(&text);
        let model = "local-8k";
        let id = server.create(model);
        let mut working = Value::Array(Vec::new());
        let mut sent_all: Vec<Value> = Vec::new();
        for (index, messages) in split_turns(&conversation).into_iter().enumerate() {
            let turn = index as u64 + 1;
            let answer = server.post(&format!("/v1/sessions/{id}/turns"), &j!({ "messages": messages }));
            assert_eq!(answer.status, 200, "{name} turn {turn}: {answer:?}");
            assert_eq!(answer.body["turn"], turn);
            let sent = answer.body["history"].clone();
            let sent_history = history_from_str(&sent.to_string()).unwrap();
            assert_eq!(
                Faults::of(&sent_history).count(),
                0,
                "{name} turn {turn}: the sent history has structural faults"
            );
            let new_working = server.history(&id, false);
            assert_eq!(answer.body["working_size"], new_working.as_array().unwrap().len());
            assert!(unpinned(&new_working) <= 12, "{name} turn {turn}");

            // What the chain gives on the previous working history plus the stamped
            // messages (as the transcript holds them), run in-process.
            let transcript = server.transcript(&id);
            let entered = &transcript[sent_all.len()..];
            assert_eq!(entered.len(), messages.len(), "{name} turn {turn}");
            let mut input = working.as_array().unwrap().clone();
            input.extend(entered.iter().cloned());
            let ctx = stateless_context(&engine_config, engine_config.model(model), turn);
            let run = chain
                .run(
                    history_from_str(&Value::Array(input).to_string()).unwrap(),
                    &ctx,
                    Call::Process,
                )
                .unwrap();
            assert_eq!(
                json(&history_to_string(&run.history)),
                sent,
                "{name} turn {turn}: sent"
            );
            assert_eq!(
                json(&history_to_string(&run.working)),
                new_working,
                "{name} turn {turn}: working"
            );
            sent_all.extend(messages);
            working = new_working;
        }
        // The transcript is what was sent plus the host's stamps, as JSON values.
        let transcript = server.transcript(&id);
        assert_eq!(transcript.len(), sent_all.len(), "{name}");
        for (seq, (stored, sent)) in transcript.iter().zip(&sent_all).enumerate() {
            assert_eq!(*stored, with_stamps(sent, stored), "{name} message {}", seq + 1);
            assert_eq!(stored["metadata"]["id"], format!("{id}-{}", seq + 1));
            assert!(stored["metadata"]["timestamp"].as_str().unwrap().ends_with('Z'));
        }
    }
    assert_eq!(server.stop().code(), Some(0));
}

fn bad_input_is_a_400_naming_the_message_and_field_and_changes_nothing(kind: Kind) {
    let config = small_window_config();
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let id = server.create("default");
    let good = j!({"messages": [{"role": "user", "content": "hello"}]});
    assert_eq!(
        server.post(&format!("/v1/sessions/{id}/turns"), &good).status,
        200
    );
    let working = server.history(&id, false);
    let transcript = server.transcript(&id);
    for (body, expected) in [
        (
            j!({"messages": [{"role": "user", "content": "ok"}, {"role": "robot", "content": "x"}]}),
            "message 1: unknown role \"robot\"",
        ),
        (j!({"messages": [{"role": "user", "content": 5}]}), "message 0: "),
        (j!({"messages": "nope"}), "messages: expected an array"),
        (j!({"mesages": []}), "unknown member \"mesages\""),
        (
            j!({"messages": [{"role": "user", "content": "a"}], "context": [{"txt": "x"}]}),
            "context 0",
        ),
    ] {
        let answer = server.post(&format!("/v1/sessions/{id}/turns"), &body);
        assert_eq!(answer.status, 400, "{body}: {answer:?}");
        let (code, message) = answer.error();
        assert_eq!(code, "bad_input");
        assert!(message.contains(expected), "{body}: {message}");
    }
    let answer = server.request("POST", &format!("/v1/sessions/{id}/turns"), None, false);
    assert_eq!(answer.status, 400, "{answer:?}");
    // A field of a message is named.
    let answer = server.post(
        &format!("/v1/sessions/{id}/turns"),
        &j!({"messages": [{"role": "tool", "content": "x"}]}),
    );
    assert_eq!(answer.status, 400);
    assert!(answer.error().1.contains("tool_call_id"), "{answer:?}");
    assert_eq!(server.history(&id, false), working);
    assert_eq!(server.transcript(&id), transcript);
    let answer = server.post(&format!("/v1/sessions/{id}/turns"), &good);
    assert_eq!(answer.body["turn"], 2, "the refused turns counted no turn");
    // Unknown session, unknown endpoint.
    let answer = server.post("/v1/sessions/nope/turns", &good);
    assert_eq!((answer.status, answer.error().0), (404, "not_found"));
    assert_eq!(server.get("/v2/what").status, 404);
}

fn a_plugin_failing_under_fail_is_a_422_naming_it_and_nothing_is_stored(kind: Kind) {
    let dir = plugin_dir_with(&[&fixture_library("panicker")]);
    let config = TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"panicker\"]\non_plugin_error = \"fail\"\n",
        dir.path().display().to_string()
    ));
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let id = server.create("default");
    let answer = server.post(
        &format!("/v1/sessions/{id}/turns"),
        &j!({"messages": [{"role": "user", "content": "hello"}]}),
    );
    assert_eq!(answer.status, 422, "{answer:?}");
    let (code, message) = answer.error();
    assert_eq!(code, "plugin_failed");
    assert!(message.starts_with("plugin \"panicker\" failed"), "{message}");
    assert!(server.transcript(&id).is_empty());
    assert_eq!(server.history(&id, false), j!([]));
    let answer = server.request("GET", "/v1/sessions", None, false);
    assert_eq!(answer.status, 401);
    // The host keeps serving.
    assert_eq!(server.get("/healthz").status, 200);
    let metrics = server.get("/metrics").body;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("history_plugin_errors_total{plugin=\"panicker\",kind=\"failed\"} 1"),
        "{metrics}"
    );
}

/// `turns` turns of a user question, a tool call, its result and an answer.
fn agent_turns(server: &Server, id: &str, turns: std::ops::Range<u64>) {
    for turn in turns {
        let messages = j!([
            {"role": "user", "content": format!("step {turn}")},
            {"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{turn}"), "type": "function",
                "function": {"name": "read_file", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": format!("c{turn}"), "content": format!("file {turn}")},
            {"role": "assistant", "content": format!("done {turn}")},
        ]);
        let answer = server.post(&format!("/v1/sessions/{id}/turns"), &j!({ "messages": messages }));
        assert_eq!(answer.status, 200, "{answer:?}");
    }
}

fn a_model_switch_runs_on_model_switch_and_applies_the_new_window_at_once(kind: Kind) {
    let config = shipped_config("", &[]);
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    for via_command in [false, true] {
        let id = server.create("gpt-4o");
        agent_turns(&server, &id, 1..11);
        assert_eq!(server.history(&id, false).as_array().unwrap().len(), 40);
        let answer = if via_command {
            server.post(
                &format!("/v1/sessions/{id}/commands"),
                &j!({"command": "!model local-8k"}),
            )
        } else {
            server.post(&format!("/v1/sessions/{id}/model"), &j!({"model": "local-8k"}))
        };
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.body["model"], "local-8k");
        assert_eq!(answer.body["effective_ctx"], 16);
        let working = server.history(&id, false);
        let size = unpinned(&working);
        assert!(
            size <= 16,
            "default's new window applies at once: {size} unpinned messages"
        );
        assert_eq!(answer.body["history"], working);
        assert_eq!(working[0]["content"], "step 1", "the task stays pinned");
        // The next turn runs on the new model.
        let answer = server.post(
            &format!("/v1/sessions/{id}/turns"),
            &j!({"messages": [{"role": "user", "content": "next"}]}),
        );
        assert_eq!(
            (
                answer.body["model"].as_str(),
                answer.body["effective_ctx"].as_u64()
            ),
            (Some("local-8k"), Some(16))
        );
        // A turn naming another model switches first.
        let answer = server.post(
            &format!("/v1/sessions/{id}/turns"),
            &j!({"messages": [{"role": "user", "content": "bigger"}], "model": "gpt-4o"}),
        );
        assert_eq!(answer.body["effective_ctx"], 200, "{answer:?}");
    }
}

fn max_users_refuses_the_next_session_with_429(kind: Kind) {
    let config = shipped_config("", &[("max_users", "max_users = 3")]);
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let ids: Vec<String> = (0..3).map(|_| server.create("default")).collect();
    let answer = server.post("/v1/sessions", &j!({}));
    assert_eq!(answer.status, 429, "{answer:?}");
    assert!(answer.error().1.contains("max_users = 3"), "{answer:?}");
    let answer = server.request("DELETE", &format!("/v1/sessions/{}", ids[0]), None, false);
    assert_eq!(answer.status, 204);
    assert_eq!(
        server.get(&format!("/v1/sessions/{}/history", ids[0])).status,
        404
    );
    server.create("default");
}

fn the_reaper_closes_an_idle_session_and_logs_it(kind: Kind) {
    let config = shipped_config("", &[]);
    let store = TestStore::new(kind, &config);
    let server = Server::start(
        &config.path,
        store.path(),
        // Long enough that `busy`, kept active below, never looks idle on a loaded machine
        // (a debug build's turn there can take most of a second).
        &[("HISTORY_SESSION_TIMEOUT_SECONDS", "4")],
    );
    let idle = server.create("default");
    let busy = server.create("default");
    let started = std::time::Instant::now();
    let mut reaped = false;
    while started.elapsed() < std::time::Duration::from_secs(40) {
        // Keep `busy` active.
        agent_turns(&server, &busy, 1..2);
        if server.get(&format!("/v1/sessions/{idle}/history")).status == 404 {
            reaped = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(reaped, "the idle session was not reaped: {}", server.stderr());
    assert_eq!(server.get(&format!("/v1/sessions/{busy}/history")).status, 200);
    assert!(
        server.stderr().contains("session reaped: idle"),
        "{}",
        server.stderr()
    );
    assert!(server.stderr().contains(&idle));
}

fn operator_endpoints_need_the_token(kind: Kind) {
    let config = shipped_config("", &[]);
    let store = TestStore::new(kind, &config);
    let server = Server::start(
        &config.path,
        store.path(),
        &[("HISTORY_OPERATOR_TOKEN", "s3cret-token")],
    );
    let id = server.create("default");
    let answer = server.request("GET", "/v1/sessions", None, false);
    assert_eq!(
        (answer.status, answer.error().0),
        (401, "unauthorized"),
        "{answer:?}"
    );
    let answer = server.post(
        &format!("/v1/sessions/{id}/commands"),
        &j!({"command": "!maxusers 9"}),
    );
    assert_eq!(answer.status, 401, "{answer:?}");
    let wrong = e2e_tests::server::request(
        &e2e_tests::server::agent(),
        "GET",
        &server.url("/v1/sessions"),
        None,
        Some("s3cret-tokeN"),
    );
    assert_eq!(wrong.status, 403);
    let answer = server.request("GET", "/v1/sessions", None, true);
    assert_eq!(answer.status, 200, "{answer:?}");
    let sessions = answer.body["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0]["id"], id);
    assert_eq!(sessions[0]["turn"], 0);
    assert!(!server.stderr().contains("s3cret"), "the token is never logged");
    // Per-session commands need no token.
    let answer = server.post(
        &format!("/v1/sessions/{id}/commands"),
        &j!({"command": "/history"}),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
}

fn a_non_loopback_listen_without_a_token_refuses_to_start(kind: Kind) {
    let config = shipped_config("", &[]);
    let store = TestStore::new(kind, &config);
    let refused = Server::try_start(&config.path, store.path(), &[], &["--listen", "0.0.0.0:0"])
        .err()
        .expect("serve refused to start");
    assert!(refused.contains("without an operator token"), "{refused}");
    assert!(refused.starts_with("status Some(3)"), "{refused}");
}

/// `--listen` takes a host name; without a configured token an operator endpoint's 401
/// says that none is configured and how to set one.
fn listen_takes_a_host_name_and_the_401_without_a_token_says_none_is_configured(kind: Kind) {
    let config = shipped_config("", &[]);
    let store = TestStore::new(kind, &config);
    let server = Server::try_start(&config.path, store.path(), &[], &["--listen", "localhost:0"])
        .unwrap_or_else(|e| panic!("serve refused localhost:0: {e}"));
    let id = server.create("default");
    let answer = server.post(
        &format!("/v1/sessions/{id}/commands"),
        &j!({"command": "!maxusers 9"}),
    );
    assert_eq!(answer.status, 401, "{answer:?}");
    assert!(
        answer.error().1.contains("none is configured")
            && answer.error().1.contains("HISTORY_OPERATOR_TOKEN"),
        "{answer:?}"
    );
    let answer = server.request("GET", "/v1/sessions", None, false);
    assert!(answer.error().1.contains("none is configured"), "{answer:?}");
}

fn a_body_over_max_body_mb_is_a_413(kind: Kind) {
    let config = shipped_config("max_body_mb = 1", &[]);
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let id = server.create("default");
    // Only the head is sent: the 413 comes before the body is read.
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(&server.addr).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "POST /v1/sessions/{id}/turns HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{{\"messages\": [",
        server.addr,
        2 << 20
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    assert!(response.starts_with("HTTP/1.1 413"), "{response}");
    assert!(
        response.contains(r#"{"error":{"code":"body_too_large""#),
        "{response}"
    );
    assert!(server.transcript(&id).is_empty());
    // Under the limit is fine.
    let answer = server.post(
        &format!("/v1/sessions/{id}/turns"),
        &j!({"messages": [{"role": "user", "content": "word ".repeat(100_000)}]}),
    );
    assert_eq!(answer.status, 200);
}

fn a_restart_restores_every_session_and_sigterm_exits_0(kind: Kind) {
    let config = small_window_config();
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let a = server.create("local-8k");
    let b = server.create("default");
    agent_turns(&server, &a, 1..8);
    agent_turns(&server, &b, 1..3);
    let (working_a, transcript_a) = (server.history(&a, false), server.transcript(&a));
    let (working_b, transcript_b) = (server.history(&b, false), server.transcript(&b));
    assert_eq!(server.stop().code(), Some(0));

    let server = Server::start(&config.path, store.path(), &[]);
    assert_eq!(server.history(&a, false), working_a);
    assert_eq!(server.transcript(&a), transcript_a);
    assert_eq!(server.history(&b, false), working_b);
    assert_eq!(server.transcript(&b), transcript_b);
    agent_turns(&server, &a, 8..9);
    let answer = server.post(
        &format!("/v1/sessions/{a}/turns"),
        &j!({"messages": [{"role": "user", "content": "after the restart"}]}),
    );
    assert_eq!(answer.body["turn"], 9);
    assert_eq!(server.transcript(&a).len(), transcript_a.len() + 5);
    assert_eq!(server.stop().code(), Some(0));
}

/// The members OpenAI's chat completions take on a message: anything else is a 400 there.
const OPENAI_MESSAGE_MEMBERS: &[&str] = &[
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "refusal",
    "audio",
];

fn the_provider_form_is_the_sent_history_as_the_proxy_sends_it(kind: Kind) {
    let config = small_window_config();
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    // Two sessions given the same real conversation, one answered in each form.
    let (_, text) = real_conversations()
        .into_iter()
        .find(|(name, _)| name.contains("swe-agent"))
        .unwrap();
    let (full, provider) = (server.create("local-8k"), server.create("local-8k"));
    let mut omitted = 0;
    for (index, messages) in split_turns(&json(&text)).into_iter().enumerate() {
        let full_answer = server.post(
            &format!("/v1/sessions/{full}/turns"),
            &j!({ "messages": messages }),
        );
        let provider_answer = server.post(
            &format!("/v1/sessions/{provider}/turns"),
            &j!({ "messages": messages, "form": "provider" }),
        );
        assert_eq!(
            provider_answer.status,
            200,
            "turn {}: {provider_answer:?}",
            index + 1
        );
        let full_history = full_answer.body["history"].as_array().unwrap();
        let provider_history = provider_answer.body["history"].as_array().unwrap();
        assert_eq!(full_history.len(), provider_history.len());
        for (full_message, provider_message) in full_history.iter().zip(provider_history) {
            omitted += usize::from(full_message["metadata"]["omitted"] == true);
            // The same message less the host's metadata (ids differ between the sessions,
            // nothing else does).
            let mut expected = full_message.clone();
            expected.as_object_mut().unwrap().remove("metadata");
            assert_eq!(provider_message, &expected);
            for key in provider_message.as_object().unwrap().keys() {
                assert!(
                    OPENAI_MESSAGE_MEMBERS.contains(&key.as_str()),
                    "member {key:?} would be refused by a provider: {provider_message}"
                );
            }
        }
        // The rest of the answer is the same in both forms.
        assert_eq!(
            full_answer.body["working_size"],
            provider_answer.body["working_size"]
        );
        assert_eq!(
            full_answer.body["stats"].as_array().unwrap().len(),
            provider_answer.body["stats"].as_array().unwrap().len()
        );
    }
    assert!(
        omitted > 0,
        "the conversation must have omitted results, whose originals the full form carries"
    );
    // The last sent history in either form; a form that does not exist is refused.
    let sent = server.get(&format!(
        "/v1/sessions/{provider}/history?view=sent&form=provider"
    ));
    assert_eq!(sent.status, 200, "{sent:?}");
    assert!(sent.body["history"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m.get("metadata").is_none()));
    let full_sent = server.get(&format!("/v1/sessions/{provider}/history?view=sent"));
    assert!(full_sent.body["history"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m.get("metadata").is_some()));
    let bad = server.post(
        &format!("/v1/sessions/{provider}/turns"),
        &j!({"messages": [{"role": "user", "content": "x"}], "form": "openai"}),
    );
    assert_eq!(bad.status, 400);
    assert!(
        bad.error().1.contains("form: expected \"full\" or \"provider\""),
        "{bad:?}"
    );
    let bad = server.get(&format!(
        "/v1/sessions/{provider}/history?view=sent&format=provider"
    ));
    assert_eq!(bad.status, 400);
    assert!(
        bad.error().1.contains("unknown query parameter \"format\""),
        "{bad:?}"
    );
}

fn the_transcript_pages_from_a_position_or_gives_the_last_n_and_refuses_unknown_parameters(kind: Kind) {
    let config = small_window_config();
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let id = server.create("local-8k");
    agent_turns(&server, &id, 1..4);
    let all = server.transcript(&id);
    assert_eq!(all.len(), 12);
    let last = server.get(&format!("/v1/sessions/{id}/transcript?last=2"));
    assert_eq!(last.status, 200, "{last:?}");
    assert_eq!(last.body["from"], 11);
    assert_eq!(last.body["messages"], j!(all[10..]));
    assert_eq!(last.body["next"], Value::Null);
    let more = server.get(&format!("/v1/sessions/{id}/transcript?last=50"));
    assert_eq!(more.body["from"], 1);
    assert_eq!(more.body["messages"], j!(all));
    let page = server.get(&format!("/v1/sessions/{id}/transcript?from=3&limit=2"));
    assert_eq!(page.body["messages"], j!(all[2..4]));
    assert_eq!(page.body["next"], 5);
    for (query, expected) in [
        (
            "lst=2",
            "unknown query parameter \"lst\" (expected from, limit, last)",
        ),
        ("last=2&from=1", "give either last=N or from=N&limit=L"),
        ("last=two", "last: expected an integer"),
    ] {
        let answer = server.get(&format!("/v1/sessions/{id}/transcript?{query}"));
        assert_eq!(answer.status, 400, "{query}: {answer:?}");
        assert!(answer.error().1.contains(expected), "{query}: {answer:?}");
    }
}

fn a_session_or_command_naming_an_unknown_model_is_refused_naming_the_known_ones(kind: Kind) {
    let config = small_window_config();
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let known = "(known: default, gpt-4o, gpt-4-turbo";
    let answer = server.post("/v1/sessions", &j!({"model": "gtp-4o"}));
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(
        answer.error().1.contains("unknown model \"gtp-4o\" ") && answer.error().1.contains(known),
        "{answer:?}"
    );
    let id = server.create("gpt-4o");
    let answer = server.post(
        &format!("/v1/sessions/{id}/commands"),
        &j!({"command": "!model gtp-4o"}),
    );
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(answer.error().1.contains(known), "{answer:?}");
    let answer = server.post(
        &format!("/v1/sessions/{id}/turns"),
        &j!({"messages": [{"role": "user", "content": "hi"}], "model": "gtp-4o"}),
    );
    assert_eq!(answer.status, 400, "{answer:?}");
    assert_eq!(
        server.transcript(&id).len(),
        0,
        "nothing is stored of a refused turn"
    );
    let answer = server.post(&format!("/v1/sessions/{id}/model"), &j!({"model": "gtp-4o"}));
    assert_eq!(answer.status, 400, "{answer:?}");
    drop(server);

    // `[models] unknown = "default"` lets any name in, with the default's settings.
    let config = shipped_config("", &[("unknown = ", "unknown = \"default\"")]);
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let answer = server.post("/v1/sessions", &j!({"model": "gtp-4o"}));
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(answer.body["effective_ctx"], 200, "[models.default]'s window");
}

e2e_tests::store_tests!(
    a_session_or_command_naming_an_unknown_model_is_refused_naming_the_known_ones,
    the_provider_form_is_the_sent_history_as_the_proxy_sends_it,
    the_transcript_pages_from_a_position_or_gives_the_last_n_and_refuses_unknown_parameters,
    real_conversations_turn_by_turn_give_what_the_chain_gives_and_the_transcript_keeps_them,
    bad_input_is_a_400_naming_the_message_and_field_and_changes_nothing,
    a_plugin_failing_under_fail_is_a_422_naming_it_and_nothing_is_stored,
    a_model_switch_runs_on_model_switch_and_applies_the_new_window_at_once,
    max_users_refuses_the_next_session_with_429,
    the_reaper_closes_an_idle_session_and_logs_it,
    operator_endpoints_need_the_token,
    a_non_loopback_listen_without_a_token_refuses_to_start,
    listen_takes_a_host_name_and_the_401_without_a_token_says_none_is_configured,
    a_body_over_max_body_mb_is_a_413,
    a_restart_restores_every_session_and_sigterm_exits_0,
);
