//! `default` (docs/plugins.md#default and the shared rules of docs/plugins.md#shared-trimming-rules), through the real library.

use e2e_tests::{json, run_json, TestConfig};
use history_engine::chain::stateless_context;
use history_engine::{load_chain, Call};
use plugin_api::EventKind;

/// Runs the chain `["default"]` with `agent_max_ctx = window` and `[plugin.default]` settings.
fn window(window: u64, settings: &str, history: &str) -> history_engine::ChainRun {
    let config = TestConfig::new(&format!(
        "[history]\nagent_max_ctx = {window}\non_plugin_error = \"fail\"\n[plugin.default]\n{settings}\n"
    ));
    config.run("default", history, None).unwrap()
}

fn contents(run: &history_engine::ChainRun) -> Vec<String> {
    run.history
        .iter()
        .map(|m| match &m.content {
            plugin_api::Content::Text(t) => t.to_string(),
            other => format!("{other:?}"),
        })
        .collect()
}

const CHAT: &str = r#"[{"role":"system","content":"s1"},{"role":"developer","content":"s2"},
    {"role":"user","content":"task"},{"role":"assistant","content":"a1"},
    {"role":"user","content":"u2"},{"role":"assistant","content":"a2"},
    {"role":"user","content":"u3"},{"role":"assistant","content":"a3"}]"#;

#[test]
fn a_history_that_fits_is_returned_unchanged_with_no_event() {
    let run = window(6, "", CHAT);
    assert_eq!(run_json(&run), json(CHAT));
    assert!(run.stages[0].events.is_empty());
}

#[test]
fn leading_system_messages_and_the_task_are_pinned_and_not_counted() {
    let run = window(2, "", CHAT);
    assert_eq!(contents(&run), ["s1", "s2", "task", "u3", "a3"]);
    let removed: Vec<u64> = run.stages[0]
        .events
        .iter()
        .filter(|e| e.kind == EventKind::MessageRemoved)
        .map(|e| e.index.unwrap())
        .collect();
    assert_eq!(removed, [3, 4, 5]);
}

#[test]
fn pins_can_be_switched_off() {
    let run = window(2, "pin_system = false\npin_first_user = false", CHAT);
    assert_eq!(contents(&run), ["u3", "a3"]);
    let run = window(3, "pin_first_user = false", CHAT);
    // a2 would fit but the kept part must start with a user message: dropped too.
    assert_eq!(contents(&run), ["s1", "s2", "u3", "a3"]);
}

const TOOLS: &str = r#"[{"role":"system","content":"s"},{"role":"user","content":"task"},
    {"role":"assistant","content":"plan"},
    {"role":"assistant","content":null,"tool_calls":[
        {"id":"c1","type":"function","function":{"name":"a","arguments":"{}"}},
        {"id":"c2","type":"function","function":{"name":"b","arguments":"{}"}}]},
    {"role":"tool","tool_call_id":"c1","content":"r1"},
    {"role":"tool","tool_call_id":"c2","content":"r2"},
    {"role":"assistant","content":"summary"},
    {"role":"user","content":"next"},
    {"role":"assistant","content":"answer"}]"#;

#[test]
fn tool_units_are_kept_or_dropped_whole_at_the_cut() {
    // 4 unpinned messages fit: the 3-message unit would be split, so it goes whole.
    let run = window(4, "", TOOLS);
    assert_eq!(contents(&run), ["s", "task", "summary", "next", "answer"]);
    // 6 fit: the unit is kept whole, and a pinned user precedes, so it may start the kept part.
    let run = window(6, "", TOOLS);
    assert_eq!(
        contents(&run)[..3],
        ["s".to_string(), "task".into(), "Null".into()]
    );
    assert_eq!(run.history.len(), 8);
}

#[test]
fn leading_assistant_or_tool_after_the_cut_is_dropped_without_a_pinned_user() {
    let run = window(5, "pin_first_user = false", TOOLS);
    // The 5 newest are [c1,c2 unit…] → the suffix fitting 5 starts with the tool unit;
    // no pinned user precedes, so units are dropped until a user message starts it.
    assert_eq!(contents(&run), ["s", "next", "answer"]);
}

#[test]
fn never_empty_keeps_the_newest_valid_part_and_reports_over_budget() {
    let history = r#"[{"role":"user","content":"task"},{"role":"assistant","content":null,"tool_calls":[
        {"id":"c1","function":{"name":"a","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"r"},
        {"role":"tool","tool_call_id":"c1","content":"r-again"}]"#;
    // The newest unit (3 messages) does not fit a window of 1; the pinned task precedes it.
    let run = window(1, "", history);
    assert_eq!(run.history.len(), 4);
    assert!(run.stages[0]
        .events
        .iter()
        .any(|e| e.kind == EventKind::OverBudget));

    let no_pin = window(1, "pin_first_user = false", CHAT);
    // "a3" alone fits but does not start with a user: fall back to the last user unit on.
    assert_eq!(contents(&no_pin), ["s1", "s2", "u3", "a3"]);
    assert!(no_pin.stages[0]
        .events
        .iter()
        .any(|e| e.kind == EventKind::OverBudget));

    let only_pinned = r#"[{"role":"system","content":"s"},{"role":"assistant","content":"x"},{"role":"user","content":"only"}]"#;
    let run = window(1, "", only_pinned);
    assert_eq!(run_json(&run), json(only_pinned), "fits: one unpinned message");
    let run = window(
        1,
        "pin_system = false",
        r#"[{"role":"assistant","content":"x"},{"role":"assistant","content":"y"},{"role":"user","content":"only"}]"#,
    );
    // The only user message is pinned and newest: the pinned messages alone.
    assert_eq!(contents(&run), ["only"]);
}

#[test]
fn target_messages_quantizes_the_cut_so_it_stays_put() {
    // B = 10, T = 6: S = 4. Grow a chat one message at a time and watch the first kept
    // unpinned message: it moves only in steps of S.
    let mut messages = vec![
        r#"{"role":"system","content":"s"}"#.to_string(),
        r#"{"role":"user","content":"task"}"#.to_string(),
    ];
    let mut starts = Vec::new();
    for i in 0..20 {
        let role = if i % 2 == 0 { "assistant" } else { "user" };
        messages.push(format!(r#"{{"role":"{role}","content":"m{i}"}}"#));
        let run = window(10, "target_messages = 6", &format!("[{}]", messages.join(",")));
        assert!(run.history.len() - 2 <= 10, "never above the window");
        starts.push(contents(&run)[2].clone());
    }
    // Up to 10 unpinned messages fit: no cut. Past B the history drops the shortest
    // prefix of at least S·⌈(n − B)/S⌉ messages: the cut moves only every S = 4 messages
    // (the pinned task precedes the kept part, so it may start with any message).
    let expected: Vec<String> = (1..=20u64)
        .map(|n| if n <= 10 { 0 } else { 4 * (n - 10).div_ceil(4) })
        .map(|first| format!("m{first}"))
        .collect();
    assert_eq!(starts, expected);
}

#[test]
fn a_model_switch_applies_the_new_window_at_once() {
    let config = TestConfig::new(
        "[history]\nagent_max_ctx = 100\non_plugin_error = \"fail\"\n[models.big]\nmax_context = 100\n[models.small]\nmax_context = 2\n",
    );
    let (loaded, _catalog, chain) = load_chain(&config.path).unwrap();
    let history = history_wire::chat::history_from_str(CHAT).unwrap();
    let old = loaded.model("big");
    let new = loaded.model("small");
    let ctx = stateless_context(&loaded, new.clone(), 3);
    let run = chain
        .run(history, &ctx, Call::ModelSwitch { old: &old, new: &new })
        .unwrap();
    assert_eq!(contents(&run), ["s1", "s2", "task", "u3", "a3"]);
}

#[test]
fn passed_through_messages_cross_the_boundary_shared_not_copied() {
    let config = TestConfig::new("[history]\nagent_max_ctx = 100\non_plugin_error = \"fail\"\n");
    let (loaded, _catalog, chain) = load_chain(&config.path).unwrap();
    let ctx = stateless_context(&loaded, loaded.model("default"), 3);
    let history = history_wire::chat::history_from_str(CHAT).unwrap();
    // The first run gives messages their identity and turn (as a session stores them).
    let first = chain.run(history, &ctx, Call::Process).unwrap();
    let second = chain.run(first.history.clone(), &ctx, Call::Process).unwrap();
    assert_eq!(second.history.len(), first.history.len());
    for (out, input) in second.history.iter().zip(&first.history) {
        assert!(std::ptr::eq(&**out, &**input), "the same message, not a copy");
    }
}
