//! The working history and the sent history: a caller that feeds the working history back
//! each turn, as a session does, keeps the pinned task as it was; `role_pair`'s merges
//! live only in what is sent.

use e2e_tests::{plugin_dir, workspace_root, TestConfig};
use history_engine::{load_chain, stateless_context, turns, Call};
use plugin_api::structure::Faults;
use plugin_api::{Message, RArc, Role};

/// The shipped configuration pointed at the installed plugins, failing on any fault,
/// with `chain`'s line replaced by `chain_line` when given.
fn shipped_config(chain_line: Option<&str>) -> TestConfig {
    let shipped = std::fs::read_to_string(workspace_root().join("plugins-enabled.toml")).unwrap();
    let mut text = String::new();
    for line in shipped.lines() {
        let line = if line.starts_with("plugin_dir") {
            format!("plugin_dir = {:?}", plugin_dir().display().to_string())
        } else if line.starts_with("on_plugin_error") {
            "on_plugin_error = \"fail\"".to_string()
        } else if let (Some(chain), true) = (chain_line, line.starts_with("chain =")) {
            chain.to_string()
        } else if chain_line.is_some() && line.starts_with("view =") {
            String::new()
        } else {
            line.to_string()
        };
        text.push_str(&line);
        text.push('\n');
    }
    TestConfig::new(&text)
}

/// One agent turn: the user's question, a tool call, its result and the answer.
fn turn_messages(turn: u64) -> Vec<RArc<Message>> {
    let json = format!(
        r#"[{{"role":"user","content":"Step {turn}: look at file_{turn}.rs"}},
            {{"role":"assistant","content":null,"tool_calls":[{{"id":"call_{turn}","type":"function","function":{{"name":"read_file","arguments":"{{\"path\":\"file_{turn}.rs\"}}"}}}}]}},
            {{"role":"tool","tool_call_id":"call_{turn}","content":"fn f{turn}() {{ /* {body} */ }}"}},
            {{"role":"assistant","content":"Read file_{turn}.rs."}}]"#,
        body = "x".repeat(200)
    );
    history_wire::chat::history_from_str(&json).unwrap()
}

/// Replays `turns` turns, feeding the working history back each turn; returns the pinned
/// task (the first user message of the working history) after each turn, and checks
/// every sent history is valid for a provider.
fn replay(config: &TestConfig, turns_to_run: u64) -> Vec<RArc<Message>> {
    let (config, _, chain) = load_chain(&config.path).unwrap();
    let model = config.model("local-8k");
    let task = history_wire::chat::history_from_str(
        r#"[{"role":"system","content":"You are a coding agent."},
            {"role":"user","content":"Fix the failing test in the parser crate."}]"#,
    )
    .unwrap();
    let mut working: Vec<RArc<Message>> = Vec::new();
    let mut tasks = Vec::new();
    for turn in 1..=turns_to_run {
        let mut entering = if turn == 1 { task.clone() } else { Vec::new() };
        entering.extend(turn_messages(turn));
        turns::stamp_entering(&mut entering, turn, None);
        let mut input = std::mem::take(&mut working);
        input.extend(entering);
        let ctx = stateless_context(&config, model.clone(), turn);
        let run = chain.run(input, &ctx, Call::Process).unwrap();
        let faults = Faults::of(&run.history);
        assert_eq!(
            faults.count(),
            0,
            "turn {turn}: {:?}",
            faults.describe(&run.history)
        );
        working = run.working;
        tasks.push(working.iter().find(|m| m.role == Role::User).unwrap().clone());
    }
    tasks
}

#[test]
fn the_pinned_task_stays_the_same_when_the_working_history_is_fed_back() {
    let config = shipped_config(None);
    let tasks = replay(&config, 200);
    let first = history_wire::chat::message_to_string(&tasks[0]);
    for (turn, task) in tasks.iter().enumerate() {
        assert_eq!(
            history_wire::chat::message_to_string(task),
            first,
            "turn {}: the pinned task changed",
            turn + 1
        );
    }
}

#[test]
fn role_pair_in_the_chain_grows_the_pinned_task_which_is_why_it_ships_in_the_view() {
    // The fault the view fixes: kept in the working history, role_pair's merge of the
    // pinned task with the next kept user message is pinned again next turn.
    let config = shipped_config(Some(
        r#"chain = ["default", "tool_result_filter", "retention", "token_budget", "role_pair"]"#,
    ));
    let tasks = replay(&config, 30);
    let parts = |m: &Message| m.content.part_count();
    assert!(
        parts(&tasks[29]) > parts(&tasks[0]) + 10,
        "the merged task has {} parts after turn 1 and {} after 30 turns",
        parts(&tasks[0]),
        parts(&tasks[29])
    );
}

#[test]
fn process_writes_the_working_history_with_working_out() {
    let config = shipped_config(None);
    let dir = tempfile::tempdir().unwrap();
    let working = dir.path().join("working.json");
    let input =
        std::fs::read_to_string(workspace_root().join("examples/swe-agent-conversation.json")).unwrap();
    let output = config.process(
        &["--model", "local-8k", "--working-out", working.to_str().unwrap()],
        &input,
    );
    assert!(output.status.success(), "{}", e2e_tests::describe(&output));
    let sent = history_wire::chat::history_from_str(std::str::from_utf8(&output.stdout).unwrap()).unwrap();
    let kept = history_wire::chat::history_from_str(&std::fs::read_to_string(&working).unwrap()).unwrap();
    // role_pair (the view) repairs only what is sent: the working history may keep the
    // pinned task beside the next user message, the sent one never does.
    assert!(!kept.is_empty() && !sent.is_empty());
    assert!(sent
        .windows(2)
        .all(|w| !(w[0].role == Role::User && w[1].role == Role::User)));
    let (config, _, chain) = load_chain(&config.path).unwrap();
    assert_eq!(chain.view_names(), ["role_pair"]);
    assert_eq!(config.view, ["role_pair"]);
}
