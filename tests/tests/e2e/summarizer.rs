//! The host's summarizer (docs/plugins.md#the-summarizer) against a stand-in
//! OpenAI-compatible server on a free loopback port (`e2e_tests::upstream`), through the
//! real `history-host`: `retention`'s `ai_summary` uses its answer, a text is summarized
//! once (in memory for `process`; in the session store for `serve`, across turns and
//! restarts), and a server that is down or slow is a fallback to `first_n_chars` with the
//! reason in the event.

use std::time::Duration;

use e2e_tests::server::Server;
use e2e_tests::store::{Kind, TestStore};
use e2e_tests::upstream::{Behaviour, Received, Upstream};
use e2e_tests::{describe, json, TestConfig};
use serde_json::{json as j, Value};

/// The summarizer's model; the stand-in keeps a `"slow"` one waiting.
const MODEL: &str = "summarizer-small";
/// What the stand-in answers a request with two messages (the prompt and the text).
const ANSWER: &str = "answer to 2 messages";
const PREFIX: &str = "[AI Summary of 600 characters. Agent can request expansion if needed.]\n\n";

/// `default` + `retention` compacting `search` results older than one turn with
/// `ai_summary` to 100 characters, the summarizer at `url` answering within `timeout_ms`.
fn config(url: &str, model: &str, timeout_ms: u64) -> TestConfig {
    config_with(url, model, timeout_ms, "plugin_timeout_ms = 10000")
}

/// [`config`] with other `[history]` lines (`isolate`, the deadline).
fn config_with(url: &str, model: &str, timeout_ms: u64, history: &str) -> TestConfig {
    TestConfig::new(&format!(
        "[history]\nchain = [\"default\", \"retention\"]\non_plugin_error = \"fail\"\n{history}\n\
         [summarizer]\nurl = \"{url}\"\nmodel = \"{model}\"\ntimeout_ms = {timeout_ms}\n\
         [plugin.retention.tools.search]\nturns = 1\nmode = \"compact\"\ncompact_mode = \"ai_summary\"\ncompact_length = 100\n\
         [models.gpt-4o]\n"
    ))
}

/// 600 characters of a search result (`n` tells results apart).
fn result_text(n: usize) -> String {
    let line = format!("result {n}: /srv/app/config.toml says port = 8080, owner = Ada; ");
    line.repeat(20).chars().take(600).collect()
}

/// One turn: a question, a `search` call and its result `text`, an answer.
fn turn(n: usize, text: &str) -> Vec<Value> {
    vec![
        j!({"role": "user", "content": format!("question {n}")}),
        j!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("s{n}"), "type": "function",
            "function": {"name": "search", "arguments": "{}"}}]}),
        j!({"role": "tool", "tool_call_id": format!("s{n}"), "content": text}),
        j!({"role": "assistant", "content": format!("answer {n}")}),
    ]
}

/// Turns 1 and 2 with the same result text, then turns 3 and 4 (turn 4 expires both).
fn history_with_a_text_twice() -> Value {
    let mut messages = Vec::new();
    let short = "short".to_string();
    for (n, text) in [
        (1, result_text(0)),
        (2, result_text(0)),
        (3, short.clone()),
        (4, short),
    ] {
        for mut message in turn(n, &text) {
            message["metadata"] = j!({ "turn_added": n });
            messages.push(message);
        }
    }
    Value::Array(messages)
}

fn chat_requests(upstream: &Upstream) -> Vec<Received> {
    upstream
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/chat/completions"))
        .collect()
}

/// `process --explain` on `history`: the output and stderr (the report and the log).
fn process(config: &TestConfig, history: &Value) -> (Value, String) {
    let output = config.process(&["--explain"], &history.to_string());
    assert!(output.status.success(), "{}", describe(&output));
    (
        json(&String::from_utf8_lossy(&output.stdout)),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

#[test]
fn ai_summary_sends_the_prompt_and_the_text_uses_the_answer_and_asks_once_per_text() {
    let upstream = Upstream::start(Behaviour::default());
    let config = config(&upstream.base_url(), MODEL, 5000);
    let (out, stderr) = process(&config, &history_with_a_text_twice());

    // Both results were compacted with the stand-in's answer, behind the prefix.
    for index in [2, 6] {
        let message = &out[index];
        assert_eq!(message["content"], format!("{PREFIX}{ANSWER}"), "{stderr}");
        let meta = &message["metadata"];
        assert_eq!(
            (
                &meta["was_compacted"],
                &meta["original_length"],
                &meta["can_expand"]
            ),
            (&j!(true), &j!(600), &j!(true))
        );
        assert_eq!(meta["original_content"], result_text(0));
    }
    assert!(
        stderr.contains("summarized by the host's summarizer (ai_summary, at most 100 characters)"),
        "{stderr}"
    );

    // The same text twice: one upstream call, which carried the prompt and the text.
    let requests = chat_requests(&upstream);
    assert_eq!(requests.len(), 1, "{requests:?}");
    let request = &requests[0];
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(
        request.header("authorization"),
        None,
        "no api_key_env: no key sent"
    );
    let body = request.json();
    assert_eq!(body["model"], MODEL);
    let system = body["messages"][0]["content"].as_str().unwrap();
    assert_eq!(body["messages"][0]["role"], "system");
    for words in ["file paths", "decisions", "at most 100 characters"] {
        assert!(system.contains(words), "{system}");
    }
    let user = body["messages"][1]["content"].as_str().unwrap();
    assert!(user.contains("the expired result of tool search"), "{user}");
    assert!(user.ends_with(&result_text(0)), "the whole text: {user}");
}

#[test]
fn an_isolated_retention_gets_its_summary_from_the_hosts_summarizer_and_cache() {
    // The worker connects no summarizer: the summary must come from the host's, over the
    // pipes, and the host's cache answers the second result (one upstream call).
    let upstream = Upstream::start(Behaviour::default());
    let config = config_with(
        &upstream.base_url(),
        MODEL,
        5000,
        "plugin_timeout_ms = 10000\nisolate = [\"retention\"]",
    );
    let (out, stderr) = process(&config, &history_with_a_text_twice());
    for index in [2, 6] {
        assert_eq!(out[index]["content"], format!("{PREFIX}{ANSWER}"), "{stderr}");
        assert_eq!(out[index]["metadata"]["original_content"], result_text(0));
    }
    assert!(!stderr.contains("fell back"), "{stderr}");
    let requests = chat_requests(&upstream);
    assert_eq!(requests.len(), 1, "{requests:?}");
    let user = requests[0].json()["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(user.ends_with(&result_text(0)), "the whole text: {user}");
}

#[test]
fn an_isolated_plugin_gets_the_hosts_failure_and_falls_back_with_the_reason() {
    // The host's summarizer gives up at its timeout_ms: its error crosses back to the
    // worker, which falls back.
    let upstream = Upstream::start(Behaviour {
        slow: Duration::from_secs(60),
        ..Behaviour::default()
    });
    let config = config_with(
        &upstream.base_url(),
        "slow",
        500,
        "plugin_timeout_ms = 5000\nisolate = [\"retention\"]",
    );
    let (out, stderr) = process(&config, &history_with_a_text_twice());
    assert_fell_back(
        &out,
        &stderr,
        &format!(
            "no answer from the summarizer at {}/chat/completions within timeout_ms (500 ms)",
            upstream.base_url()
        ),
    );
    assert_eq!(chat_requests(&upstream).len(), 1);
}

#[test]
fn the_api_key_goes_as_a_bearer_token_and_an_unset_variable_refuses_the_load() {
    let upstream = Upstream::start(Behaviour::default());
    let config = config(&upstream.base_url(), MODEL, 5000);
    let text = std::fs::read_to_string(&config.path).unwrap();
    std::fs::write(
        &config.path,
        text.replace(
            "timeout_ms = 5000\n",
            "timeout_ms = 5000\napi_key_env = \"SUMMARIZER_TEST_KEY\"\n",
        ),
    )
    .unwrap();
    let history = history_with_a_text_twice().to_string();

    let mut command = std::process::Command::new(e2e_tests::host_bin());
    command
        .args(["process", "--config"])
        .arg(&config.path)
        .env("SUMMARIZER_TEST_KEY", "sk-test");
    let output = e2e_tests::run_with_stdin(command, &history);
    assert!(output.status.success(), "{}", describe(&output));
    let requests = chat_requests(&upstream);
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].header("authorization"), Some("Bearer sk-test"));

    let mut command = std::process::Command::new(e2e_tests::host_bin());
    command
        .args(["process", "--config"])
        .arg(&config.path)
        .env_remove("SUMMARIZER_TEST_KEY");
    let output = e2e_tests::run_with_stdin(command, &history);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "plugins-enabled.toml:10: [summarizer]: api_key_env names SUMMARIZER_TEST_KEY, which is not set"
        ),
        "{stderr}"
    );
}

/// What a failed summarizer leaves: both results compacted to their first 100
/// characters, the reason in the event and the log.
fn assert_fell_back(out: &Value, stderr: &str, reason: &str) {
    let first: String = result_text(0).chars().take(100).collect();
    for index in [2, 6] {
        let content = out[index]["content"].as_str().unwrap();
        assert!(
            content.starts_with(&format!(
                "{first}...\n\n[Compacted: showing first 100 of 600 characters."
            )),
            "{content}"
        );
        assert_eq!(out[index]["metadata"]["was_compacted"], true);
    }
    assert!(
        stderr.contains(&format!(
            "compacted to the first 100 characters (ai_summary failed: {reason}"
        )),
        "the event's reason: {stderr}"
    );
    assert!(
        stderr.contains("retention: ai_summary fell back to first_n_chars:"),
        "the log: {stderr}"
    );
}

#[test]
fn a_summarizer_that_is_down_is_a_fallback_to_first_n_chars_with_the_reason() {
    // A port nothing listens on any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/v1");
    let config = config(&url, MODEL, 2000);
    let (out, stderr) = process(&config, &history_with_a_text_twice());
    assert_fell_back(
        &out,
        &stderr,
        &format!("cannot reach the summarizer at {url}/chat/completions"),
    );
}

#[test]
fn a_summarizer_slower_than_timeout_ms_is_a_fallback_with_the_reason() {
    // The stand-in answers a "slow" request after a minute: only the timeout ends the call.
    let upstream = Upstream::start(Behaviour {
        slow: Duration::from_secs(60),
        ..Behaviour::default()
    });
    let config = config(&upstream.base_url(), "slow", 500);
    let (out, stderr) = process(&config, &history_with_a_text_twice());
    assert_fell_back(
        &out,
        &stderr,
        &format!(
            "no answer from the summarizer at {}/chat/completions within timeout_ms (500 ms)",
            upstream.base_url()
        ),
    );
    // The second result did not wait again: one call, then the rest of the turn fell back.
    assert_eq!(chat_requests(&upstream).len(), 1);
    assert!(stderr.contains("(an earlier call in this turn)"), "{stderr}");
}

#[test]
fn waiting_for_the_summarizer_does_not_count_against_the_plugin_deadline() {
    for history in [
        "plugin_timeout_ms = 300",
        "plugin_timeout_ms = 300\nisolate = [\"retention\"]",
    ] {
        waiting_for_the_summarizer_is_the_hosts_time(history);
    }
}

fn waiting_for_the_summarizer_is_the_hosts_time(history_lines: &str) {
    // The summary takes 800 ms; retention's own deadline is 300 ms. Under `fail` a late
    // call would fail the run: the wait is the host's, so the summary is used.
    let upstream = Upstream::start(Behaviour {
        slow: Duration::from_millis(800),
        ..Behaviour::default()
    });
    let config = config_with(&upstream.base_url(), "slow", 5000, history_lines);
    let (out, stderr) = process(&config, &history_with_a_text_twice());
    for index in [2, 6] {
        assert_eq!(out[index]["content"], format!("{PREFIX}{ANSWER}"), "{stderr}");
    }
    assert!(!stderr.contains("did not return within"), "{stderr}");
    assert_eq!(chat_requests(&upstream).len(), 1);
}

#[test]
fn one_plugin_call_waits_for_summaries_at_most_timeout_ms_in_all() {
    // Under a deadline and without one (the call then runs on the turn's own thread).
    for deadline in ["plugin_timeout_ms = 300", "plugin_timeout_ms = 0"] {
        a_call_shares_its_timeout_ms_between_its_summaries(deadline);
    }
}

fn a_call_shares_its_timeout_ms_between_its_summaries(deadline: &str) {
    // Two texts, 700 ms each, with timeout_ms = 1000 for the whole call: the first is
    // answered, the second may wait only what is left (about 300 ms) and falls back.
    let upstream = Upstream::start(Behaviour {
        slow: Duration::from_millis(700),
        ..Behaviour::default()
    });
    let config = config_with(&upstream.base_url(), "slow", 1000, deadline);
    let mut history = history_with_a_text_twice();
    for message in history.as_array_mut().unwrap().iter_mut() {
        if message["role"] == "tool" && message["tool_call_id"] == "s2" {
            message["content"] = j!(result_text(1));
        }
    }
    let started = std::time::Instant::now();
    let (out, stderr) = process(&config, &history);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let summarized = [2, 6]
        .iter()
        .filter(|&&i| out[i]["content"] == format!("{PREFIX}{ANSWER}"))
        .count();
    assert_eq!(summarized, 1, "one text summarized, one fell back: {stderr}");
    assert!(
        stderr.contains("ms this plugin call had left of timeout_ms (1000 ms)"),
        "the reason names the call's budget: {stderr}"
    );
    assert!(!stderr.contains("did not return within"), "{stderr}");
}

/// Runs `turns` (each a turn's messages) in a new session; returns the working history.
fn session_turns(server: &Server, turns: &[Vec<Value>]) -> Value {
    let id = server.create("gpt-4o");
    for messages in turns {
        let answer = server.post(&format!("/v1/sessions/{id}/turns"), &j!({ "messages": messages }));
        assert_eq!(answer.status, 200, "{answer:?}\n{}", server.stderr());
    }
    server.history(&id, false)
}

fn a_served_text_is_summarized_once_across_turns_sessions_and_restarts(kind: Kind) {
    let upstream = Upstream::start(Behaviour::default());
    let config = config(&upstream.base_url(), MODEL, 5000);
    let store = TestStore::new(kind, &config);
    let text = result_text(0);
    let turns: Vec<Vec<Value>> = (1..=4)
        .map(|n| turn(n, if n <= 2 { &text } else { "short" }))
        .collect();

    let server = Server::start(&config.path, store.path(), &[]);
    // Turn 3 expires turn 1's result, turn 4 turn 2's: the same text, a turn apart.
    let working = session_turns(&server, &turns);
    for index in [2, 6] {
        assert_eq!(
            working[index]["content"],
            format!("{PREFIX}{ANSWER}"),
            "{working}"
        );
    }
    assert_eq!(chat_requests(&upstream).len(), 1, "one call across turns");
    // Another session, the same text: from the store.
    session_turns(&server, &turns);
    assert_eq!(chat_requests(&upstream).len(), 1, "one call across sessions");
    assert_eq!(server.stop().code(), Some(0));

    let kept = store.open();
    let key = history_engine::summarizer::cache_key(
        MODEL,
        100,
        "the expired result of tool search, kept for the agent's later turns",
        &text,
    );
    assert_eq!(kept.summary(&key).unwrap().as_deref(), Some(ANSWER));
    drop(kept);

    // After a restart, from the store again.
    let server = Server::start(&config.path, store.path(), &[]);
    let working = session_turns(&server, &turns);
    assert_eq!(working[2]["content"], format!("{PREFIX}{ANSWER}"));
    assert_eq!(chat_requests(&upstream).len(), 1, "one call across restarts");
    assert_eq!(server.stop().code(), Some(0));
}

e2e_tests::store_tests!(a_served_text_is_summarized_once_across_turns_sessions_and_restarts,);

/// `default` + `summarize` over 1500 tokens keeping 600, the summarizer at `url`.
fn summarize_config(url: &str) -> TestConfig {
    TestConfig::new(&format!(
        "[history]\nchain = [\"default\", \"summarize\"]\non_plugin_error = \"fail\"\nplugin_timeout_ms = 10000\n\
         [summarizer]\nurl = \"{url}\"\nmodel = \"{MODEL}\"\ntimeout_ms = 5000\n\
         [plugin.summarize]\ntrigger_tokens = 1500\nkeep_tokens = 600\ntarget_chars = 300\n"
    ))
}

/// Turns `from..to` of a user question and a long answer.
fn chat_turns(from: usize, to: usize) -> Vec<Value> {
    (from..to)
        .flat_map(|n| {
            [
                j!({"role": "user", "content": format!("Question {n}: what does /srv/app/file{n}.toml set?")}),
                j!({"role": "assistant", "content": format!("File {n} sets {}", "port = 8080 and owner = Ada; ".repeat(6))}),
            ]
        })
        .collect()
}

#[test]
fn the_running_summary_is_the_summarizers_and_folds_the_previous_one_in() {
    let upstream = Upstream::start(Behaviour::default());
    let config = summarize_config(&upstream.base_url());
    let summaries = |out: &Value| -> Vec<Value> {
        out.as_array()
            .unwrap()
            .iter()
            .filter(|m| m["metadata"]["summary_of"].is_array())
            .cloned()
            .collect()
    };

    let first = Value::Array(chat_turns(0, 30));
    let (out, stderr) = process(&config, &first);
    let found = summaries(&out);
    assert_eq!(found.len(), 1, "{stderr}");
    let content = found[0]["content"].as_str().unwrap();
    assert!(
        content.ends_with(&format!("earlier messages]\n\n{ANSWER}")),
        "{content}"
    );
    assert!(
        stderr.contains("(summarizer)"),
        "the event says who wrote it: {stderr}"
    );
    let requests = chat_requests(&upstream);
    assert_eq!(requests.len(), 1);
    let sent = requests[0].json()["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        sent.contains("running summary of the earlier conversation"),
        "{sent}"
    );
    // The pinned task stays; the replaced messages are sent as `role: text` lines.
    assert!(
        sent.contains("user: Question 1: what does /srv/app/file1.toml set?"),
        "{sent}"
    );
    assert!(!sent.contains("Question 0"), "{sent}");

    // The next call: the output plus more turns. The earlier summary is folded into the
    // new one, which is again the summarizer's.
    let mut next = out.as_array().unwrap().clone();
    next.extend(chat_turns(30, 60));
    let (out, stderr) = process(&config, &Value::Array(next));
    let found = summaries(&out);
    assert_eq!(found.len(), 1, "one summary, run forward: {stderr}");
    let requests = chat_requests(&upstream);
    assert_eq!(requests.len(), 2);
    let sent = requests[1].json()["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(sent.contains(&format!("(earlier summary) {ANSWER}")), "{sent}");
    let content = found[0]["content"].as_str().unwrap();
    assert!(
        content.ends_with(&format!("earlier messages]\n\n{ANSWER}")),
        "{content}"
    );
}

#[test]
fn agentctl_check_shows_the_summarizer_and_an_unset_key_variable_as_a_problem() {
    let config = config("http://127.0.0.1:9/v1", MODEL, 5000);
    let text = std::fs::read_to_string(&config.path).unwrap();
    std::fs::write(
        &config.path,
        text.replace(
            "timeout_ms = 5000\n",
            "timeout_ms = 5000\napi_key_env = \"SUMMARIZER_CHECK_KEY\"\n",
        ),
    )
    .unwrap();
    let output = e2e_tests::agentctl(&config.path, &["check"], &[("SUMMARIZER_CHECK_KEY", "sk-x")]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(
        stdout.contains(&format!(
            "summarizer: http://127.0.0.1:9/v1/chat/completions model {MODEL}, key from SUMMARIZER_CHECK_KEY, timeout_ms 5000"
        )),
        "{stdout}"
    );

    let output = e2e_tests::agentctl(&config.path, &["check", "--json"], &[]);
    assert!(!output.status.success(), "{}", describe(&output));
    let value = json(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(value["summarizer"]["api_key_set"], false);
    let problems = value["problems"].to_string();
    assert!(
        problems.contains(":10: [summarizer] api_key_env names SUMMARIZER_CHECK_KEY, which is not set"),
        "{problems}"
    );
}
