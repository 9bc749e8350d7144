//! The recall tools at `/mcp` (docs/mcp.md) through the real MCP Python SDK: a 60-turn
//! session whose old tool results are placeholders naming their id, and whose oldest
//! turns left the working history. The agent searches the whole transcript for a fact
//! dropped 40 turns ago and finds it first, expands an omitted result (the session keeps
//! it expanded) and reads messages by id. Through the proxy, a stand-in model calls
//! `expand_message` and the proxy runs it (`[upstream] recall_tools`). `retention`'s
//! compaction note names the id `expand_message` takes.

use e2e_tests::python_client;
use e2e_tests::server::{agent, shipped_config, Server};
use e2e_tests::upstream::{chat_problem, Behaviour, Upstream};
use serde_json::{json, Value};

const PLACEHOLDER: &str = r#"placeholder = "[Omitted: call expand_message with id \"{id}\" to read it]""#;

fn turn_messages(turn: u64) -> Value {
    turn_messages_of(turn, 40)
}

/// Turn `turn`'s messages: a question, a file read and its result (`words` words of
/// filler); turn 5's result holds the fact asked for on a later turn.
pub(super) fn turn_messages_of(turn: u64, words: usize) -> Value {
    let result = match turn {
        5 => "deploy notes: the staging database password rotates on the zebra-quartz schedule".to_string(),
        _ => format!("contents of file_{turn}.txt: {}", "data ".repeat(words)),
    };
    json!([
        {"role": "user", "content": format!("step {turn}: read file_{turn}.txt")},
        {"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{turn}"), "type": "function",
            "function": {"name": "read_file", "arguments": format!("{{\"path\":\"file_{turn}.txt\"}}")}}]},
        {"role": "tool", "tool_call_id": format!("c{turn}"), "content": result},
        {"role": "assistant", "content": format!("done {turn}")},
    ])
}

fn mcp(server: &Server, headers: Value, calls: Value) -> Value {
    python_client(
        "mcp_client.py",
        &json!({"url": format!("http://{}/mcp", server.addr), "headers": headers, "calls": calls}),
    )
}

#[test]
fn an_agent_finds_expands_and_reads_what_the_chain_trimmed_over_mcp() {
    let config = shipped_config(
        "",
        &[(r#"placeholder = "[Omitted]"         # byte-stable"#, PLACEHOLDER)],
    );
    let server = Server::start(&config.path, &config.dir.path().join("sessions.db"), &[]);
    let id = server.create("gpt-4o");
    for turn in 1..=60 {
        let answer = server.post(
            &format!("/v1/sessions/{id}/turns"),
            &json!({ "messages": turn_messages(turn) }),
        );
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    let working = server.history(&id, false);
    let text = working.to_string();
    assert!(
        !text.contains("zebra-quartz"),
        "the fact is out of the working history"
    );
    // Turn 50's result is a placeholder naming its id.
    let omitted = working
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["tool_call_id"] == "c50")
        .unwrap_or_else(|| panic!("{text}"));
    let content = omitted["content"].as_str().unwrap();
    let omitted_id = content
        .strip_prefix("[Omitted: call expand_message with id \"")
        .and_then(|rest| rest.strip_suffix("\" to read it]"))
        .unwrap_or_else(|| panic!("{content}"))
        .to_string();
    // The host stamps every session message with an id (docs/wire-format.md#metadata).
    assert!(omitted_id.starts_with(&format!("{id}-")), "{omitted_id}");

    let headers = json!({"X-History-Session": id});
    let out = mcp(
        &server,
        headers.clone(),
        json!([
            {"name": "search_history", "arguments": {"query": "staging database password rotation", "limit": 3}},
            {"name": "expand_message", "arguments": {"id": omitted_id}},
        ]),
    );
    assert_eq!(
        out["tools"],
        json!(["expand_message", "get_messages", "search_history"]),
        "{out}"
    );
    assert!(
        out["schemas"]["search_history"]["properties"]["query"].is_object(),
        "{out}"
    );
    let search = &out["calls"][0];
    assert_eq!(search["is_error"], false, "{search}");
    let first = &search["structured"]["matches"][0];
    assert!(
        first["text"].as_str().unwrap().contains("zebra-quartz"),
        "the dropped fact comes first: {search}"
    );
    assert_eq!(first["turn"], 5, "{search}");
    assert_eq!(first["role"], "tool", "{search}");
    let expand = &out["calls"][1];
    assert_eq!(expand["is_error"], false, "{expand}");
    assert!(
        expand["structured"]["text"]
            .as_str()
            .unwrap()
            .starts_with("contents of file_50.txt"),
        "{expand}"
    );
    // The session keeps it expanded: the next turn sends the original.
    let answer = server.post(
        &format!("/v1/sessions/{id}/turns"),
        &json!({ "messages": turn_messages(61) }),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    let sent = answer.body["history"].to_string();
    assert!(sent.contains("contents of file_50.txt"), "{sent}");

    // Messages by id (e.g. what a summary stands for), the session given as an argument
    // this time; an unknown id is named, not an error of the call.
    let found_id = first["id"].as_str().unwrap().to_string();
    let out = mcp(
        &server,
        json!({}),
        json!([
            {"name": "get_messages", "arguments": {"session": id, "ids": [found_id, "#999999"]}},
            {"name": "search_history", "arguments": {"query": "zebra"}},
            {"name": "expand_message", "arguments": {"session": "no-such-session", "id": "#1"}},
        ]),
    );
    let messages = &out["calls"][0]["structured"]["messages"];
    assert!(
        messages[0]["text"].as_str().unwrap().contains("zebra-quartz"),
        "{out}"
    );
    assert!(
        messages[1]["error"].as_str().unwrap().contains("no message"),
        "{out}"
    );
    let no_session = &out["calls"][1];
    assert_eq!(no_session["is_error"], true, "{no_session}");
    assert!(
        no_session["text"][0]
            .as_str()
            .unwrap()
            .contains("X-History-Session"),
        "{no_session}"
    );
    let unknown = &out["calls"][2];
    assert_eq!(unknown["is_error"], true, "{unknown}");
    assert!(
        unknown["text"][0].as_str().unwrap().contains("no-such-session"),
        "{unknown}"
    );
}

/// `[upstream] recall_tools`: a session's request reaches a stand-in model that calls
/// `expand_message` for the placeholder it sees; the proxy runs the call and asks again,
/// and the client gets one answer, made from the original. Every request the upstream got
/// was valid (the stand-in refuses a result without its call, as OpenAI does).
#[test]
fn through_the_proxy_the_model_recalls_an_omitted_result_and_the_client_sees_one_answer() {
    let upstream = Upstream::start(Behaviour::default());
    // Tables of their own, put before the shipped file's first plugin table.
    let tables = format!(
        "[upstream]\nurl = \"{}\"\nrecall_tools = true\n\n[models.recall-agent]\nmax_context = 200\n\n[plugin.default]",
        upstream.base_url()
    );
    let config = shipped_config(
        "",
        &[
            (r#"placeholder = "[Omitted]"         # byte-stable"#, PLACEHOLDER),
            ("[plugin.default]", &tables),
        ],
    );
    let server = Server::start(&config.path, &config.dir.path().join("sessions.db"), &[]);
    let id = server.create("recall-agent");
    let mut conversation: Vec<Value> = Vec::new();
    for turn in 1..=8 {
        conversation.extend(turn_messages(turn).as_array().unwrap().iter().cloned());
    }
    conversation.push(json!({"role": "user", "content": "what did the first file say?"}));
    let response = agent()
        .post(&format!("http://{}/v1/chat/completions", server.addr))
        .set("Content-Type", "application/json")
        .set("X-History-Session", &id)
        .send_string(&json!({"model": "recall-agent", "messages": conversation}).to_string())
        .unwrap();
    assert_eq!(response.header("x-history-recall"), Some("1"));
    let answer: Value = serde_json::from_str(&response.into_string().unwrap()).unwrap();
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content.starts_with("recalled: "), "{answer}");
    assert!(content.contains("contents of file_1.txt"), "{answer}");

    let requests: Vec<Value> = upstream
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/chat/completions"))
        .map(|r| r.json())
        .collect();
    assert_eq!(requests.len(), 2, "{requests:?}");
    for request in &requests {
        assert_eq!(chat_problem(request), None, "{request}");
    }
    let offered: Vec<&str> = requests[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert_eq!(offered, ["expand_message", "search_history", "get_messages"]);
    // The first request sent the placeholder; the second carries the call and the original.
    assert!(
        requests[0].to_string().contains("call expand_message with id"),
        "{}",
        requests[0]
    );
    let second = requests[1]["messages"].as_array().unwrap();
    let result = second.last().unwrap();
    assert_eq!(result["role"], "tool");
    assert!(
        result["content"]
            .as_str()
            .unwrap()
            .contains("contents of file_1.txt"),
        "{result}"
    );
    // The session keeps the result expanded: its working history has the original.
    let working = server.history(&id, false).to_string();
    assert!(working.contains("contents of file_1.txt"), "{working}");
}

/// `retention`'s compaction note names the message and the tool (`annotation` with `{id}`,
/// docs/mcp.md#placeholders), and the id it names is the one `expand_message` takes: the
/// agent reads the note, expands the message over MCP, and the next turn sends it whole.
#[test]
fn a_compaction_note_names_the_id_that_expand_message_takes() {
    const NOTE: &str = r#"annotation = "[Compacted: {shown} of {total} characters shown; call expand_message with id \"{id}\" to read it all]""#;
    let retention = format!(
        "[plugin.retention.tools.read_file]\nturns = 2\nmode = \"compact\"\ncompact_length = 20\n\n[plugin.retention]\n{NOTE}"
    );
    let config = shipped_config(
        "",
        &[
            // Results keep their content in tool_result_filter, so retention compacts them.
            (r#"strategy = "keep_last""#, r#"strategy = "keep_all""#),
            ("[plugin.retention]", &retention),
        ],
    );
    let server = Server::start(&config.path, &config.dir.path().join("sessions.db"), &[]);
    let id = server.create("gpt-4o");
    for turn in 1..=5 {
        let answer = server.post(
            &format!("/v1/sessions/{id}/turns"),
            &json!({ "messages": turn_messages(turn) }),
        );
        assert_eq!(answer.status, 200, "{answer:?}\n{}", server.stderr());
    }
    let working = server.history(&id, false);
    let compacted = working
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["tool_call_id"] == "c1")
        .unwrap_or_else(|| panic!("{working}"));
    let content = compacted["content"].as_str().unwrap();
    let note = content
        .strip_prefix("contents of file_1.t...\n\n[Compacted: 20 of 224 characters shown; call expand_message with id \"")
        .and_then(|rest| rest.strip_suffix("\" to read it all]"))
        .unwrap_or_else(|| panic!("{content}"));
    assert!(note.starts_with(&format!("{id}-")), "{note}");

    let out = mcp(
        &server,
        json!({"X-History-Session": id}),
        json!([{"name": "expand_message", "arguments": {"id": note}}]),
    );
    let expand = &out["calls"][0];
    assert_eq!(expand["is_error"], false, "{expand}");
    let answer = server.post(
        &format!("/v1/sessions/{id}/turns"),
        &json!({ "messages": turn_messages(6) }),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    let sent = answer.body["history"].to_string();
    assert!(
        sent.contains(&format!(
            "contents of file_1.txt: {}",
            "data ".repeat(40).trim_end()
        )),
        "{sent}"
    );
}
