//! Runtime commands over `POST /v1/sessions/{id}/commands` (docs/sessions.md#runtime-commands).

use e2e_tests::server::{shipped_config, Server};
use e2e_tests::store::{Kind, TestStore};
use serde_json::{json as j, Value};

const TOKEN: &str = "operator-token-for-tests";

fn start(config: &e2e_tests::TestConfig, store: &TestStore) -> Server {
    Server::start(&config.path, store.path(), &[("HISTORY_OPERATOR_TOKEN", TOKEN)])
}

fn command(server: &Server, id: &str, line: &str, operator: bool) -> e2e_tests::server::Answer {
    server.request(
        "POST",
        &format!("/v1/sessions/{id}/commands"),
        Some(&j!({ "command": line })),
        operator,
    )
}

fn turn(server: &Server, id: &str, n: u64) -> Value {
    let messages = j!([
        {"role": "user", "content": format!("step {n}")},
        {"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{n}"), "type": "function",
            "function": {"name": "read_file", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": format!("c{n}"), "content": format!("the content of file {n}: {}", "data ".repeat(60))},
        {"role": "assistant", "content": format!("done {n}")},
    ]);
    let answer = server.post(&format!("/v1/sessions/{id}/turns"), &j!({ "messages": messages }));
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.body
}

fn effective_ctx_of(server: &Server, id: &str) -> u64 {
    let answer = server.request("GET", "/v1/sessions", None, true);
    answer.body["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap()["effective_ctx"]
        .as_u64()
        .unwrap()
}

fn maxctx_is_written_keeping_the_file_and_temp_is_not_and_both_apply_to_live_sessions(kind: Kind) {
    let config = shipped_config("", &[]);
    let store = TestStore::new(kind, &config);
    let server = start(&config, &store);
    let a = server.create("default");
    let b = server.create("gpt-4o");
    let before = std::fs::read_to_string(&config.path).unwrap();

    let answer = command(&server, &a, "!maxctx 50", false);
    assert_eq!(answer.status, 401, "host-wide commands need the operator's token");
    let answer = command(&server, &a, "!maxctx 50", true);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body["written"], true);
    let after = std::fs::read_to_string(&config.path).unwrap();
    let changed: Vec<(&str, &str)> = before
        .lines()
        .zip(after.lines())
        .filter(|(x, y)| x != y)
        .collect();
    assert_eq!(
        changed,
        [("agent_max_ctx = 200", "agent_max_ctx = 50")],
        "only the value changes"
    );
    assert_eq!(
        before.lines().count(),
        after.lines().count(),
        "comments and layout kept"
    );
    assert_eq!(
        (effective_ctx_of(&server, &a), effective_ctx_of(&server, &b)),
        (50, 50)
    );
    assert_eq!(server.get("/v1/chain").body["agent_max_ctx"], 50);
    // The next turn runs on the new window.
    assert_eq!(turn(&server, &b, 1)["effective_ctx"], 50);

    let answer = command(&server, &a, "!maxctx 20 temp", true);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body["written"], false);
    assert_eq!(
        std::fs::read_to_string(&config.path).unwrap(),
        after,
        "temp is not written"
    );
    assert_eq!(
        (effective_ctx_of(&server, &a), effective_ctx_of(&server, &b)),
        (20, 20)
    );
    // Sessions created now get the live value too; local-8k's own window is smaller.
    let c = server.create("local-8k");
    assert_eq!(effective_ctx_of(&server, &c), 16);

    // After a restart the written value holds, the temporary one is gone.
    assert_eq!(server.stop().code(), Some(0));
    let server = start(&config, &store);
    assert_eq!(server.get("/v1/chain").body["agent_max_ctx"], 50);
    assert_eq!(
        effective_ctx_of(&server, &a),
        50,
        "recomputed from the configuration at start"
    );
    assert_eq!(turn(&server, &a, 1)["effective_ctx"], 50);
}

fn maxusers_and_sessiontimeout_are_written_and_applied(kind: Kind) {
    let config = shipped_config("", &[]);
    let store = TestStore::new(kind, &config);
    let server = start(&config, &store);
    let a = server.create("default");
    let answer = command(&server, &a, "!maxusers 2", true);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(std::fs::read_to_string(&config.path)
        .unwrap()
        .contains("\nmax_users = 2\n"));
    server.create("default");
    assert_eq!(server.post("/v1/sessions", &j!({})).status, 429);
    let answer = command(&server, &a, "!sessiontimeout 0", true);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(std::fs::read_to_string(&config.path)
        .unwrap()
        .contains("\nsession_idle_timeout_minutes = 0\n"));
    assert_eq!(server.get("/v1/chain").body["session_idle_timeout_minutes"], 0);
    // A refused value leaves the file untouched.
    let before = std::fs::read_to_string(&config.path).unwrap();
    let answer = command(&server, &a, "!maxusers 0", true);
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(answer.error().1.contains("!maxusers"), "{answer:?}");
    assert_eq!(std::fs::read_to_string(&config.path).unwrap(), before);
}

fn expand_history_and_clear_work_on_the_working_history(kind: Kind) {
    let config = shipped_config("", &[]);
    let store = TestStore::new(kind, &config);
    let server = start(&config, &store);
    let id = server.create("gpt-4o");
    for n in 1..=7 {
        turn(&server, &id, n);
    }
    // tool_result_filter keeps the newest 4 results: the first three are placeholders.
    let working = server.history(&id, false);
    let omitted = working
        .as_array()
        .unwrap()
        .iter()
        .position(|m| m["metadata"]["omitted"] == true)
        .expect("an omitted tool result");
    let original = working[omitted]["metadata"]["original_content"].clone();
    let answer = command(&server, &id, &format!("!expand {omitted}"), false);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body["message"]["content"], original);
    assert_eq!(answer.body["message"]["metadata"]["expanded"], true);
    assert_eq!(server.history(&id, false)[omitted], answer.body["message"]);
    // It stays expanded through the next turns.
    turn(&server, &id, 8);
    let working = server.history(&id, false);
    let expanded: Vec<&Value> = working
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["metadata"]["expanded"] == true)
        .collect();
    assert_eq!(expanded.len(), 1);
    assert_eq!(expanded[0]["content"], original);
    // By id, through the expand endpoint; a message that cannot be expanded is a 400.
    let other = working
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["metadata"]["omitted"] == true)
        .unwrap()["metadata"]["id"]
        .clone();
    let answer = server.post(&format!("/v1/sessions/{id}/expand"), &j!({ "id": other }));
    assert_eq!(answer.status, 200, "{answer:?}");
    let answer = server.post(&format!("/v1/sessions/{id}/expand"), &j!({"index": 0}));
    assert_eq!(answer.status, 400);
    assert!(answer.error().1.contains("cannot expand message 0"), "{answer:?}");

    let answer = command(&server, &id, "/history", false);
    assert_eq!(answer.status, 200);
    let lines = answer.body["lines"].as_array().unwrap();
    assert_eq!(lines.len(), server.history(&id, false).as_array().unwrap().len());
    assert!(
        lines.iter().any(|l| l.as_str().unwrap().contains("[expanded]")),
        "{lines:?}"
    );
    assert!(lines[0].as_str().unwrap().contains("user"), "{lines:?}");

    // `/clear` keeps the pinned task (the first user message: this session has no
    // system message), so the next turn still has it; `/clear all` empties.
    let transcript = server.transcript(&id);
    let answer = command(&server, &id, "/clear", false);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body["cleared_at"], transcript.len());
    assert_eq!(answer.body["working_size"], 1, "{answer:?}");
    let kept = server.history(&id, false);
    assert_eq!(kept.as_array().unwrap().len(), 1, "{kept}");
    assert_eq!(kept[0]["content"], "step 1", "{kept}");
    assert_eq!(
        server.transcript(&id),
        transcript,
        "the transcript keeps everything"
    );
    let answer = turn(&server, &id, 9);
    assert_eq!(answer["working_size"], 5, "the task and the new turn");
    assert_eq!(server.history(&id, false)[0]["content"], "step 1");
    let answer = command(&server, &id, "/clear all", false);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body["working_size"], 0, "{answer:?}");
    assert_eq!(server.history(&id, false), j!([]));
    let answer = turn(&server, &id, 10);
    assert_eq!(answer["working_size"], 4, "the working history starts again");
}

fn unknown_and_malformed_commands_are_400s_naming_them(kind: Kind) {
    let config = shipped_config("", &[]);
    let store = TestStore::new(kind, &config);
    let server = start(&config, &store);
    let id = server.create("default");
    for (line, expected) in [
        ("!frobnicate", "unknown command \"!frobnicate\""),
        ("!maxctx ten", "malformed command \"!maxctx ten\""),
        ("!model", "malformed command \"!model\""),
        ("/clear everything", "malformed command \"/clear everything\""),
        ("!expand", "malformed command \"!expand\""),
    ] {
        let answer = command(&server, &id, line, true);
        assert_eq!(answer.status, 400, "{line}: {answer:?}");
        assert!(answer.error().1.contains(expected), "{line}: {answer:?}");
    }
    let answer = server.post(&format!("/v1/sessions/{id}/commands"), &j!({"cmd": "/clear"}));
    assert_eq!(answer.status, 400);
    assert_eq!(command(&server, "nope", "/history", false).status, 404);
}

fn the_expiration_override_is_replaced_stored_and_applied_from_the_next_turn(kind: Kind) {
    let config = shipped_config("", &[]);
    let store = TestStore::new(kind, &config);
    let server = start(&config, &store);
    let id = server.create("gpt-4o");
    let put = |server: &Server, body: Value| {
        server.request(
            "PUT",
            &format!("/v1/sessions/{id}/expiration_override"),
            Some(&body),
            false,
        )
    };
    // A tool result that expires after one turn, compacted to 5 characters.
    let answer = server.post(
        &format!("/v1/sessions/{id}/turns"),
        &j!({"messages": [
            {"role": "user", "content": "read it"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "read_file", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "0123456789abcdefghij",
             "metadata": {"expiration": {"turns": 1, "mode": "compact", "compact_length": 5}}},
            {"role": "assistant", "content": "read"},
        ]}),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    let answer = put(&server, j!({"expiration_override": {"disable_expiration": true}}));
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        answer.body,
        j!({"expiration_override": {"disable_expiration": true}})
    );
    // Stored: a restart keeps it.
    assert_eq!(server.stop().code(), Some(0));
    let server = start(&config, &store);
    let tool_content = |server: &Server| server.history(&id, false)[2]["content"].clone();
    // Turns with no tool result, so only expiration can change the one above.
    let chat = |server: &Server, n: u64| {
        let answer = server.post(
            &format!("/v1/sessions/{id}/turns"),
            &j!({"messages": [{"role": "user", "content": format!("and {n}?")}, {"role": "assistant", "content": "ok"}]}),
        );
        assert_eq!(answer.status, 200, "{answer:?}");
    };
    for n in 2..=3 {
        chat(&server, n);
    }
    assert_eq!(
        tool_content(&server),
        "0123456789abcdefghij",
        "expiration disabled"
    );
    // Refused overrides change nothing.
    let bad = put(&server, j!({"expiration_override": {"mode": "explode"}}));
    assert_eq!(bad.status, 400, "{bad:?}");
    assert!(bad.error().1.contains("expiration_override"), "{bad:?}");
    assert_eq!(put(&server, j!({"override": {}})).status, 400);
    assert_eq!(put(&server, j!({})).status, 400);
    assert_eq!(
        server
            .request(
                "PUT",
                "/v1/sessions/nope/expiration_override",
                Some(&j!({"expiration_override": null})),
                false
            )
            .status,
        404
    );
    chat(&server, 4);
    assert_eq!(tool_content(&server), "0123456789abcdefghij", "still disabled");
    // Removed: the message's own expiration applies at the next turn.
    let answer = put(&server, j!({"expiration_override": null}));
    assert_eq!(answer.body, j!({"expiration_override": null}));
    chat(&server, 5);
    let compacted = tool_content(&server);
    assert!(
        compacted.as_str().unwrap().starts_with("01234...\n\n[Compacted"),
        "{compacted}"
    );
    assert_eq!(server.stop().code(), Some(0));
}

e2e_tests::store_tests!(
    maxctx_is_written_keeping_the_file_and_temp_is_not_and_both_apply_to_live_sessions,
    maxusers_and_sessiontimeout_are_written_and_applied,
    expand_history_and_clear_work_on_the_working_history,
    unknown_and_malformed_commands_are_400s_naming_them,
    the_expiration_override_is_replaced_stored_and_applied_from_the_next_turn,
);
