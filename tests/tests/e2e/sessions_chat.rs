//! `history-host chat` driven through a pipe: turns, the other roles, the runtime
//! commands, and a stored session resumed with `--session`.

use e2e_tests::server::shipped_config;
use e2e_tests::{describe, host_bin, run_with_stdin};
use history_sessions::store::{SqliteStore, Store};

fn chat(config: &e2e_tests::TestConfig, args: &[&str], input: &str) -> String {
    let mut command = std::process::Command::new(host_bin());
    command
        .arg("chat")
        .arg("--config")
        .arg(&config.path)
        .arg("--store")
        .arg(config.dir.path().join("sessions.db"))
        .args(args)
        .env("HISTORY_LOG", "warn");
    let output = run_with_stdin(command, input);
    assert!(output.status.success(), "{}", describe(&output));
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn chat_runs_turns_and_commands_and_resumes_a_stored_session() {
    // local-8k (chars4: nothing to load) with room for the whole conversation.
    let config = shipped_config("", &[("max_context = 16", "max_context = 100")]);
    let mut input = String::from("Fix the parser bug.\n");
    for k in 1..=6 {
        input.push_str(&format!(
            ":tool read_file contents of file {k}: {}\n",
            "data ".repeat(40)
        ));
        input.push_str(&format!("question {k}\n"));
    }
    input.push_str("/history\n!frobnicate\n:bogus\n");
    let out = chat(&config, &["--model", "local-8k"], &input);
    let first = out.lines().next().unwrap();
    let id = first
        .strip_prefix("session ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{out}"))
        .to_string();
    assert!(first.contains("(model local-8k, effective_ctx 100"), "{first}");
    // The --explain table after each turn, and the sent history's size.
    assert!(out.contains("input: 1 messages"), "{out}");
    assert!(out.contains("tool_result_filter"), "{out}");
    assert!(out.contains("turn 7: sent history"), "{out}");
    assert!(out.contains("error: unknown command \"!frobnicate\""), "{out}");
    assert!(out.contains("error: unknown \":bogus\""), "{out}");
    // /history: one line per message; the old tool results are placeholders.
    let history_at = out
        .find("working history: 19 messages\n")
        .unwrap_or_else(|| panic!("{out}"));
    let lines: Vec<&str> = out[history_at..].lines().skip(1).take(19).collect();
    let omitted = lines
        .iter()
        .find(|l| l.contains("omitted"))
        .unwrap_or_else(|| panic!("{out}"));
    let index: usize = omitted.split_whitespace().next().unwrap().parse().unwrap();

    // Resume: expand it, look, clear, one more turn.
    let out = chat(
        &config,
        &["--session", &id],
        &format!("!expand {index}\n/history\n/clear\n/history\nlast question\n"),
    );
    assert!(out.starts_with(&format!("session {id} (model local-8k")), "{out}");
    // Told as text, the restored content below its header, not as JSON.
    let header = format!("message {index} expanded (tool, turn ");
    let at = out.find(&header).unwrap_or_else(|| panic!("{out}"));
    let expanded: Vec<&str> = out[at..].lines().take(2).collect();
    assert!(
        expanded[0].contains(", result of chat_call_")
            && expanded[0].contains("): restored the original content (")
            && expanded[1].starts_with("  contents of file ")
            && expanded[1].ends_with("data data"),
        "{out}"
    );
    assert!(!out.contains("\"expanded\":true"), "{out}");
    assert!(out.contains("[expanded]"), "{out}");
    // /clear keeps the pinned task, so the last turn is sent with it (merged with the
    // new question by role_pair, as two adjacent user messages are).
    assert!(out.contains("working history: 1 messages"), "{out}");
    assert!(out.contains("turn 8: sent history 1 messages"), "{out}");
    assert!(out.contains("; working history 2 messages"), "{out}");

    // The transcript holds every message, stamped.
    let store = SqliteStore::open(&config.dir.path().join("sessions.db")).unwrap();
    let transcript = store.transcript(&id, 1, 1000).unwrap();
    assert_eq!(transcript.len(), 1 + 6 * 3 + 1);
    let last: serde_json::Value = serde_json::from_str(&transcript.last().unwrap().message).unwrap();
    assert_eq!(last["content"], "last question");
    assert_eq!(last["metadata"]["turn_added"], 8);
    assert_eq!(last["metadata"]["id"], format!("{id}-20"));

    // An unknown session is refused.
    let mut command = std::process::Command::new(host_bin());
    command
        .args(["chat", "--session", "nope", "--config"])
        .arg(&config.path)
        .arg("--store")
        .arg(config.dir.path().join("sessions.db"));
    let output = run_with_stdin(command, "");
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no session \"nope\""));
}

#[test]
fn chat_with_an_upstream_prints_and_stores_the_models_replies_and_survives_it_being_down() {
    use e2e_tests::upstream::{Behaviour, Upstream};
    let upstream = Upstream::start(Behaviour {
        chunks: 3,
        gap: std::time::Duration::from_millis(20),
        ..Behaviour::default()
    });
    let config = shipped_config("", &[("max_context = 16", "max_context = 100")]);
    let out = chat(
        &config,
        &[
            "--model",
            "local-8k",
            "--upstream",
            &upstream.base_url(),
            "--upstream-model",
            "gpt-4o",
        ],
        "Fix the parser bug.\nAnd the tests?\n",
    );
    let id = out
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("session "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{out}"))
        .to_string();
    assert!(
        out.contains(&format!("replies from {} (model gpt-4o)", upstream.base_url())),
        "{out}"
    );
    let replies: Vec<&str> = out.lines().filter(|l| l.starts_with("assistant: ")).collect();
    assert_eq!(replies, ["assistant: part0 part1 part2 "; 2], "{out}");
    assert!(out.contains("turn 2: the reply stored"), "{out}");
    assert!(out.contains("turn 4: the reply stored"), "{out}");

    // The upstream got the sent history, without the host's stamps, streamed, on gpt-4o.
    let received = upstream.requests();
    assert_eq!(received.len(), 2);
    let first = received[0].json();
    assert_eq!(first["model"], "gpt-4o");
    assert_eq!(first["stream"], true);
    assert_eq!(
        first["messages"],
        serde_json::json!([{"role": "user", "content": "Fix the parser bug."}])
    );
    let second = received[1].json();
    let roles: Vec<&str> = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user"]);
    assert_eq!(second["messages"][1]["content"], "part0 part1 part2 ");
    assert!(second["messages"][1].get("metadata").is_none(), "{second}");

    // The replies are in the transcript as the assistant's turns.
    let store = SqliteStore::open(&config.dir.path().join("sessions.db")).unwrap();
    let transcript: Vec<serde_json::Value> = store
        .transcript(&id, 1, 100)
        .unwrap()
        .iter()
        .map(|m| serde_json::from_str(&m.message).unwrap())
        .collect();
    let turns: Vec<(String, u64)> = transcript
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap().to_string(),
                m["metadata"]["turn_added"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        turns,
        [
            ("user".to_string(), 1),
            ("assistant".to_string(), 2),
            ("user".to_string(), 3),
            ("assistant".to_string(), 4)
        ]
    );
    assert_eq!(transcript[3]["content"], "part0 part1 part2 ");

    // Upstream down: one error line per user line, and the REPL goes on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let out = chat(
        &config,
        &["--session", &id, "--upstream", &down],
        "Still there?\n/history\n",
    );
    let errors: Vec<&str> = out.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{out}");
    assert!(
        errors[0].contains("cannot reach") && errors[0].contains(&down),
        "{out}"
    );
    assert!(out.contains("turn 5: sent history"), "{out}");
    assert!(out.contains("working history: 5 messages"), "{out}");
}

/// `chat --upstream` on a session of model `default` would ask the upstream for a model
/// named "default", which no provider has: refused at start with the way out.
#[test]
fn chat_with_an_upstream_refuses_to_ask_for_model_default_and_a_bare_tool_line_gets_its_usage() {
    let config = shipped_config("", &[]);
    let mut command = std::process::Command::new(host_bin());
    command
        .args(["chat", "--config"])
        .arg(&config.path)
        .arg("--store")
        .arg(config.dir.path().join("sessions.db"))
        .args(["--upstream", "http://127.0.0.1:9/v1"])
        .env("HISTORY_LOG", "warn");
    let output = run_with_stdin(command, "hello\n");
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the session's model is \"default\"") && stderr.contains("--upstream-model NAME"),
        "{stderr}"
    );

    let out = chat(&config, &[], ":tool\n:assistant\n");
    assert!(
        out.contains(
            "error: :tool needs its arguments (usage: :assistant TEXT, :tool NAME TEXT, :load FILE)"
        ),
        "{out}"
    );
    assert!(out.contains("error: :assistant needs its arguments"), "{out}");
}

/// Session ids are URL-safe base64, so one in 32 starts with `-`: `--session` takes it as
/// the id, not as an option (it was a usage error, exit 64, before).
#[test]
fn a_session_id_starting_with_a_dash_is_taken_as_the_id() {
    let config = shipped_config("", &[]);
    let mut command = std::process::Command::new(host_bin());
    command
        .args(["chat", "--config"])
        .arg(&config.path)
        .arg("--store")
        .arg(config.dir.path().join("sessions.db"))
        .args(["--session", "-5AbC_unknown"])
        .env("HISTORY_LOG", "warn");
    let output = run_with_stdin(command, "");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    assert!(
        stderr.contains("no session \"-5AbC_unknown\""),
        "{}",
        describe(&output)
    );
}

/// `chat`'s terminal is the conversation: by default it logs warnings and errors only, so
/// no INFO line lands among the turns; `HISTORY_LOG` still asks for more, each line
/// timestamped.
#[test]
fn chat_keeps_info_lines_out_of_the_conversation() {
    let config = shipped_config("", &[("max_context = 16", "max_context = 100")]);
    let input = "Fix the parser bug.\n:tool read_file fn main() {}\nand now?\n";
    let run = |log: Option<&str>| {
        let mut command = std::process::Command::new(host_bin());
        command
            .args(["chat", "--model", "local-8k", "--config"])
            .arg(&config.path)
            .arg("--store")
            .arg(config.dir.path().join("sessions.db"));
        match log {
            Some(filter) => command.env("HISTORY_LOG", filter),
            None => command.env_remove("HISTORY_LOG"),
        };
        let output = run_with_stdin(command, input);
        assert!(output.status.success(), "{}", describe(&output));
        output
    };
    let quiet = run(None);
    assert!(
        String::from_utf8_lossy(&quiet.stdout).contains("turn 2: sent history"),
        "{}",
        describe(&quiet)
    );
    assert!(quiet.stderr.is_empty(), "{}", describe(&quiet));
    let asked = run(Some("info"));
    let stderr = String::from_utf8_lossy(&asked.stderr);
    let info: Vec<&str> = stderr.lines().filter(|l| l.contains(" INFO ")).collect();
    assert!(
        info.iter().any(|l| l.contains("plugin=tool_result_filter")),
        "{stderr}"
    );
    // `2026-11-28T22:14:59.703296Z  INFO …`
    assert!(
        info.iter()
            .all(|l| l.len() > 30 && &l[4..5] == "-" && &l[10..11] == "T" && &l[26..29] == "Z  "),
        "{stderr}"
    );
}
