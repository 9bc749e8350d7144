//! `token_budget` (docs/plugins.md#token_budget on the shared rules of docs/plugins.md#shared-trimming-rules) through the real libraries.
//!
//! Most histories here are counted with `chars4` and `per_message_tokens = 3`, with texts
//! of 4·n characters, so a message of text n costs exactly 3 + n tokens: every expected cut
//! below can be checked by hand from the comments.

use std::sync::atomic::{AtomicUsize, Ordering};

use e2e_tests::{json, run_json, TestConfig};
use history_engine::chain::stateless_context;
use history_engine::{load_chain, Call, ChainRun};
use plugin_api::{EventKind, Tokenizer};

/// Text of `n` ≥ 1 chars4 tokens (4·n characters), different every time so the output
/// can be matched to the input by value.
fn text(n: usize) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let tag = NEXT.fetch_add(1, Ordering::Relaxed) % 10_000;
    format!("{tag:04}{}", "abcd".repeat(n.saturating_sub(1)))
}
fn sys(n: usize) -> String {
    format!(r#"{{"role":"system","content":"{}"}}"#, text(n))
}
fn user(n: usize) -> String {
    format!(r#"{{"role":"user","content":"{}"}}"#, text(n))
}
fn asst(n: usize) -> String {
    format!(r#"{{"role":"assistant","content":"{}"}}"#, text(n))
}
/// An assistant message with text `n` and calls named `f` with arguments `{}`: each call
/// costs 2 tokens (name 1 + arguments 1).
fn calls(ids: &[&str], n: usize) -> String {
    let calls: Vec<String> = ids
        .iter()
        .map(|id| {
            format!(r#"{{"id":"{id}","type":"function","function":{{"name":"f","arguments":"{{}}"}}}}"#)
        })
        .collect();
    format!(
        r#"{{"role":"assistant","content":"{}","tool_calls":[{}]}}"#,
        text(n),
        calls.join(",")
    )
}
fn tool(id: &str, n: usize) -> String {
    format!(
        r#"{{"role":"tool","tool_call_id":"{id}","content":"{}"}}"#,
        text(n)
    )
}
fn history(messages: &[String]) -> String {
    format!("[{}]", messages.join(","))
}

/// A chars4 model `m` and a chain `default, token_budget` that fails the turn on any
/// plugin fault (so the host's output check is enforced), with `[plugin.token_budget]`
/// set to `table`.
fn config(table: &str) -> TestConfig {
    TestConfig::new(&format!(
        r#"
[history]
chain = ["default", "token_budget"]
on_plugin_error = "fail"

[models.m]
context_tokens = 100000
tokenizer = "chars4"

[plugin.token_budget]
{table}
"#
    ))
}

fn run(config: &TestConfig, history: &str) -> ChainRun {
    config
        .run("m", history, None)
        .unwrap_or_else(|e| panic!("the turn failed: {e}"))
}

/// Indices (in `input`) of the messages of the output, matched by JSON value in order.
fn kept(input: &str, run: &ChainRun) -> Vec<usize> {
    let input = json(input);
    let input = input.as_array().unwrap();
    let output = run_json(run);
    let mut indices = Vec::new();
    let mut next = 0;
    for message in output.as_array().unwrap() {
        let found = (next..input.len())
            .find(|&i| &input[i] == message)
            .unwrap_or_else(|| panic!("output message {message} is not an input message in order"));
        indices.push(found);
        next = found + 1;
    }
    indices
}

fn events(run: &ChainRun, kind: EventKind) -> usize {
    run.stages
        .iter()
        .filter(|s| s.plugin == "token_budget")
        .flat_map(|s| &s.events)
        .filter(|e| e.kind == kind)
        .count()
}

/// sys, task, a1, u2, a2, u3, a3: seven messages of 4 tokens, 28 in all.
fn seven() -> String {
    history(&[sys(1), user(1), asst(1), user(1), asst(1), user(1), asst(1)])
}

#[test]
fn a_history_that_fits_is_returned_unchanged() {
    let input = seven();
    let out = run(&config("max_tokens = 28"), &input);
    assert_eq!(kept(&input, &out), vec![0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(out.stages[1].events.len(), 0);
    // No start rule when nothing is dropped: a history that starts with the assistant
    // after its system message still fits as it is.
    let odd = history(&[sys(1), asst(1), user(1), asst(1)]);
    let out = run(&config("max_tokens = 16\npin_first_user = false"), &odd);
    assert_eq!(kept(&odd, &out), vec![0, 1, 2, 3]);
    assert!(out.stages[1].events.is_empty());
}

#[test]
fn pinned_system_and_task_are_counted_first_and_kept() {
    let input = seven();
    // Pinned: sys + task = 8, leaving 12 = a2, u3, a3. The pinned task precedes them, so
    // the kept part may start with the assistant.
    let out = run(&config("max_tokens = 20"), &input);
    assert_eq!(kept(&input, &out), vec![0, 1, 4, 5, 6]);
    assert_eq!(events(&out, EventKind::MessageRemoved), 2);
    assert_eq!(events(&out, EventKind::OverBudget), 0);
    // Removal events say what they saved.
    let saved: Vec<i64> = out.stages[1]
        .events
        .iter()
        .filter_map(|e| e.tokens_saved.into_option())
        .collect();
    assert_eq!(saved, vec![4, 4]);
}

#[test]
fn pins_can_be_switched_off_independently() {
    let input = seven();
    // Only the system message is pinned: 16 left = u2, a2, u3, a3.
    let out = run(&config("max_tokens = 20\npin_first_user = false"), &input);
    assert_eq!(kept(&input, &out), vec![0, 3, 4, 5, 6]);
    // 15 left: a2, u3, a3 fit, but the start rule drops a2.
    let out = run(&config("max_tokens = 19\npin_first_user = false"), &input);
    assert_eq!(kept(&input, &out), vec![0, 5, 6]);
    // Nothing pinned: the system message is dropped like any old message.
    let out = run(
        &config("max_tokens = 8\npin_first_user = false\npin_system = false"),
        &input,
    );
    assert_eq!(kept(&input, &out), vec![5, 6]);
    // Only the task pinned: sys is old and goes; task + u3, a3 = 12.
    let out = run(&config("max_tokens = 12\npin_system = false"), &input);
    assert_eq!(kept(&input, &out), vec![1, 5, 6]);
}

#[test]
fn units_are_kept_or_dropped_whole_at_the_cut() {
    // sys 4, task 4, [calls c1 c2 with text 1: 3+1+4 = 8, tool 4, tool 4] = 16, a 4, u 4, a 4.
    let input = history(&[
        sys(1),
        user(1),
        calls(&["c1", "c2"], 1),
        tool("c1", 1),
        tool("c2", 1),
        asst(1),
        user(1),
        asst(1),
    ]);
    // Unpinned task, budget 20: by messages the tail (tool c2, a, u, a = 16) would fit and
    // orphan a result; by units the whole tool unit goes, and then the start rule drops
    // the assistant message before the user.
    let out = run(&config("max_tokens = 20\npin_first_user = false"), &input);
    assert_eq!(kept(&input, &out), vec![0, 6, 7]);
    // Budget 36 holds the whole unit with what follows (4 + 16 + 12 = 32; + task = 36
    // would fit all): at 35 the task goes and the unit starts the kept part, which the
    // start rule refuses (no pinned user precedes it).
    let out = run(&config("max_tokens = 35\npin_first_user = false"), &input);
    assert_eq!(kept(&input, &out), vec![0, 6, 7]);
    // With the pinned task the unit may start the kept part: 8 pinned + 16 + 12 = 36.
    let out = run(&config("max_tokens = 36"), &input);
    assert_eq!(kept(&input, &out), vec![0, 1, 2, 3, 4, 5, 6, 7]);
    let out = run(&config("max_tokens = 35"), &input);
    assert_eq!(kept(&input, &out), vec![0, 1, 5, 6, 7]);
}

#[test]
fn never_empty_keeps_the_newest_valid_part_and_reports_over_budget() {
    // sys 4, u1 4, a1 4, u2 4, a2 43: the newest unit alone is over the budget.
    let input = history(&[sys(1), user(1), asst(1), user(1), asst(40)]);
    // No pinned user: everything from the last unit that starts with a user message.
    let out = run(&config("max_tokens = 20\npin_first_user = false"), &input);
    assert_eq!(kept(&input, &out), vec![0, 3, 4]);
    assert_eq!(events(&out, EventKind::OverBudget), 1);
    // The pinned task precedes the newest unit: it is kept alone.
    let out = run(&config("max_tokens = 20"), &input);
    assert_eq!(kept(&input, &out), vec![0, 1, 4]);
    assert_eq!(events(&out, EventKind::OverBudget), 1);
    let reason = out.stages[1]
        .events
        .iter()
        .find(|e| e.kind == EventKind::OverBudget)
        .unwrap()
        .reason
        .to_string();
    assert!(
        reason.contains("51 tokens") && reason.contains("budget of 20"),
        "{reason}"
    );

    // The only user message is pinned and newest: the pinned messages alone.
    let input = history(&[sys(1), asst(40), user(1)]);
    let out = run(&config("max_tokens = 10"), &input);
    assert_eq!(kept(&input, &out), vec![0, 2]);
    assert_eq!(events(&out, EventKind::OverBudget), 1);

    // No user message at all: the newest unit.
    let input = history(&[sys(1), asst(40), asst(40)]);
    let out = run(&config("max_tokens = 10"), &input);
    assert_eq!(kept(&input, &out), vec![0, 2]);
    assert_eq!(events(&out, EventKind::OverBudget), 1);

    // Pinned messages alone over the budget: still never empty.
    let input = history(&[sys(40), user(1), asst(1), user(1), asst(1)]);
    let out = run(&config("max_tokens = 20\npin_first_user = false"), &input);
    assert_eq!(kept(&input, &out), vec![0, 3, 4]);
    assert_eq!(events(&out, EventKind::OverBudget), 1);
}

#[test]
fn budget_is_the_model_window_minus_the_reserve_by_default() {
    let body = |table: &str| {
        TestConfig::new(&format!(
            r#"
[history]
chain = ["default", "token_budget"]
on_plugin_error = "fail"
[models.wide]
context_tokens = 4124
tokenizer = "chars4"
[models.narrow]
context_tokens = 4123
tokenizer = "chars4"
[plugin.token_budget]
{table}
"#
        ))
    };
    let input = seven();
    // Default reserve 4096: wide has 28 (fits), narrow 27: the pinned 8 leave 19, which
    // hold u2, a2, u3, a3 (16) but not a1 too.
    let config = body("");
    let wide = config.run("wide", &input, None).unwrap();
    assert_eq!(kept(&input, &wide), vec![0, 1, 2, 3, 4, 5, 6]);
    let narrow = config.run("narrow", &input, None).unwrap();
    assert_eq!(kept(&input, &narrow), vec![0, 1, 3, 4, 5, 6]);
    // reserve_tokens = 4104: wide has 20.
    let config = body("reserve_tokens = 4104");
    let wide = config.run("wide", &input, None).unwrap();
    assert_eq!(kept(&input, &wide), vec![0, 1, 4, 5, 6]);
    // max_tokens wins over the model's window.
    let config = body("max_tokens = 12");
    let wide = config.run("wide", &input, None).unwrap();
    assert_eq!(kept(&input, &wide), vec![0, 1, 6]);
}

#[test]
fn a_model_switch_applies_the_new_budget_at_once() {
    let config = TestConfig::new(
        r#"
[history]
chain = ["default", "token_budget"]
on_plugin_error = "fail"
[models.wide]
context_tokens = 4124
tokenizer = "chars4"
[models.narrow]
context_tokens = 4112
tokenizer = "chars4"
"#,
    );
    let input = seven();
    let (cfg, _catalog, chain) = load_chain(&config.path).unwrap();
    let old = cfg.model("wide");
    let new = cfg.model("narrow");
    let history = history_wire::chat::history_from_str(&input).unwrap();
    let ctx = stateless_context(&cfg, new.clone(), 4);
    let out = chain
        .run(history, &ctx, Call::ModelSwitch { old: &old, new: &new })
        .unwrap();
    // narrow: 4112 − 4096 = 16 = sys, task, u3... the pinned 8 leave 8: u3, a3.
    assert_eq!(kept(&input, &out), vec![0, 1, 5, 6]);
    assert_eq!(out.stages[1].messages_out, 4);
}

#[test]
fn tokenizer_and_per_message_tokens_are_configurable() {
    // The model counts with o200k_base; "hello world " is 2 BPE tokens per 12 characters
    // but 3 chars4 tokens.
    let config = |table: &str| {
        TestConfig::new(&format!(
            r#"
[history]
chain = ["default", "token_budget"]
on_plugin_error = "fail"
[models.m]
tokenizer = "o200k_base"
[plugin.token_budget]
pin_first_user = false
{table}
"#
        ))
    };
    let texts: Vec<String> = (0..4)
        .map(|i| format!("{}{i}", "hello world ".repeat(10)))
        .collect();
    let input = history(&[
        format!(r#"{{"role":"user","content":"{}"}}"#, texts[0]),
        format!(r#"{{"role":"assistant","content":"{}"}}"#, texts[1]),
        format!(r#"{{"role":"user","content":"{}"}}"#, texts[2]),
        format!(r#"{{"role":"assistant","content":"{}"}}"#, texts[3]),
    ]);
    let count = |tokenizer, per_message: u64, range: std::ops::Range<usize>| -> u64 {
        texts[range]
            .iter()
            .map(|t| per_message + history_engine::tokens::count_text(tokenizer, t))
            .sum()
    };
    let o200k_total = count(Tokenizer::O200kBase, 3, 0..4);
    // Preconditions: under chars4 (and under one more token per message) the same budget
    // holds the last two messages but not the last three.
    assert!(
        count(Tokenizer::Chars4, 3, 2..4) <= o200k_total && count(Tokenizer::Chars4, 3, 1..4) > o200k_total
    );
    assert!(count(Tokenizer::O200kBase, 4, 0..4) > o200k_total);
    // The model's tokenizer: exactly fits.
    let out = config(&format!("max_tokens = {o200k_total}"))
        .run("m", &input, None)
        .unwrap();
    assert_eq!(kept(&input, &out), vec![0, 1, 2, 3]);
    // chars4 configured: the same budget holds only the last exchange.
    let out = config(&format!("max_tokens = {o200k_total}\ntokenizer = \"chars4\""))
        .run("m", &input, None)
        .unwrap();
    assert_eq!(kept(&input, &out), vec![2, 3]);
    // One more token per message and it no longer fits either.
    let out = config(&format!("max_tokens = {o200k_total}\nper_message_tokens = 4"))
        .run("m", &input, None)
        .unwrap();
    assert_eq!(kept(&input, &out), vec![2, 3]);
}

#[test]
fn items_are_counted_separately_and_role_name_and_ids_are_not() {
    // chars4 of each item: "abcde" = 2 (not 5/4 of a joint text), parts each rounded up,
    // an opaque part of a kind the host does not know as its compact JSON (an image would
    // cost its image rule: docs/wire-format.md#part-kinds), call name and arguments; role,
    // name and ids free.
    let input = r#"[
        {"role":"user","content":[{"type":"text","text":"abcde"},{"type":"text","text":"a"}],"name":"a-very-long-name"},
        {"role":"assistant","content":[{"type":"x_custom","x_custom":{"url":"xyz"}}],
         "tool_calls":[{"id":"a-very-long-call-id","type":"function","function":{"name":"abcde","arguments":"{\"q\":1}"}}]},
        {"role":"tool","tool_call_id":"a-very-long-call-id","content":"abcd"}]"#;
    // user: 3 + 2 + 1 = 6. assistant: 3 + the opaque part's compact JSON + name "abcde" 2
    // + arguments {"q":1} 2. tool: 3 + 1 = 4.
    let opaque = r#"{"type":"x_custom","x_custom":{"url":"xyz"}}"#;
    assert_eq!(opaque.chars().count(), 44);
    // 44 chars → 11 tokens: assistant = 3 + 11 + 2 + 2 = 18; total 6 + 18 + 4 = 28.
    let fits = config("max_tokens = 28\npin_first_user = false");
    let out = run(&fits, input);
    assert_eq!(kept(input, &out), vec![0, 1, 2]);
    let cut = config("max_tokens = 27\npin_first_user = false");
    let out = run(&cut, input);
    // The tool unit (22) starts with the assistant: the start rule leaves nothing that
    // fits, so never-empty keeps from the last user unit on, over budget.
    assert_eq!(kept(input, &out), vec![0, 1, 2]);
    assert_eq!(events(&out, EventKind::OverBudget), 1);
}

#[test]
fn config_errors_name_the_key() {
    let error = |table: &str| -> String {
        let config = config(table);
        match load_chain(&config.path) {
            Ok(_) => panic!("[plugin.token_budget] {table} was accepted"),
            Err(e) => e.to_string(),
        }
    };
    let e = error("max_token = 5");
    assert!(e.contains("max_token") && e.contains("unknown key"), "{e}");
    let e = error("tokenizer = \"gpt2\"");
    assert!(e.contains("tokenizer"), "{e}");
    let e = error("max_tokens = 0");
    assert!(e.contains("max_tokens"), "{e}");
    let e = error("max_tokens = 10\ntarget_tokens = 10");
    assert!(e.contains("target_tokens"), "{e}");
    // Model-dependent values are checked against every listed model (and the default).
    let e = error("reserve_tokens = 100000");
    assert!(e.contains("reserve_tokens") && e.contains("\"m\""), "{e}");
    let e = error("target_tokens = 95904");
    assert!(e.contains("target_tokens") && e.contains("\"m\""), "{e}");
    // The line of the key is named (line 1 is plugin_dir, the table's key is on 12).
    assert!(e.contains(":12:"), "{e}");
    let config = config("target_tokens = 95903");
    assert!(load_chain(&config.path).is_ok());
}

#[test]
fn real_conversations_fit_or_report_over_budget() {
    let config = TestConfig::new(
        r#"
[history]
chain = ["default", "token_budget"]
on_plugin_error = "fail"
[plugin.token_budget]
max_tokens = 3000
"#,
    );
    for (name, conversation) in e2e_tests::real_conversations().into_iter().take(12) {
        let out = config
            .run("gpt-4o", &conversation, None)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let tokens: u64 = out
            .history
            .iter()
            .map(|m| history_engine::tokens::message_tokens(Tokenizer::O200kBase, m, 3))
            .sum();
        assert!(
            tokens <= 3000 || events(&out, EventKind::OverBudget) == 1,
            "{name}: {tokens} tokens kept with no over-budget event"
        );
        assert!(!out.history.is_empty(), "{name}");
    }
}

/// docs/plugins.md#token_budget: with `pin_first_user = false`, no target and the same counter, the
/// selection is LangChain's `trim_messages(strategy="last", start_on="human",
/// include_system=True, allow_partial=False)`, except where the spec deliberately differs.
/// The LangChain selections were computed by `tests/langchain/make_trim_fixtures.py`
/// (langchain-core) and committed; each case is asserted as the spec says.
#[test]
fn langchain_trim_messages_agrees_except_where_the_spec_differs() {
    let path = e2e_tests::workspace_root().join("tests/langchain/trim_fixtures.json");
    let fixtures = json(&std::fs::read_to_string(&path).unwrap());
    assert_eq!(fixtures["tokenizer"], "chars4");
    assert_eq!(fixtures["per_message_tokens"], 3);
    let cases = fixtures["cases"].as_array().unwrap();
    assert!(cases.len() >= 20);
    let indices = |value: &serde_json::Value| -> Vec<usize> {
        value
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as usize)
            .collect()
    };
    let (mut agree, mut fits_differ, mut systems_differ, mut never_empty) = (0, 0, 0, 0);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let history = case["history"].as_array().unwrap();
        // The fixtures' counter measured an image part as its JSON text, as the host did
        // before part kinds; the host now counts an image by its model's rule
        // (docs/wire-format.md#part-kinds). The same part under a type the host does not
        // know, of the same length, is measured as its JSON text still, so both sides count
        // alike and LangChain's selections hold.
        let input = case["history"]
            .to_string()
            .replace("\"image_url\"", "\"image_uri\"");
        let budget = case["max_tokens"].as_u64().unwrap();
        // The same counter on both sides: the host's chars4 total equals the script's.
        let parsed = history_wire::chat::history_from_str(&input).unwrap();
        let total: u64 = parsed
            .iter()
            .map(|m| history_engine::tokens::message_tokens(Tokenizer::Chars4, m, 3))
            .sum();
        assert_eq!(
            total,
            case["total_tokens"].as_u64().unwrap(),
            "{name}: counters differ"
        );

        let config = config(&format!("max_tokens = {budget}\npin_first_user = false"));
        let out = run(&config, &input);
        let got = kept(&input, &out);
        let all: Vec<usize> = (0..history.len()).collect();
        let lead = history.iter().take_while(|m| m["role"] == "system").count();
        let langchain = indices(&case["langchain"]);

        if total <= budget {
            // Deliberate difference: a history that fits is returned unchanged (LangChain
            // still applies start_on, and drops a second system message).
            assert_eq!(got, all, "{name}: fits, must be unchanged");
            assert!(out.stages[1].events.is_empty(), "{name}");
            fits_differ += usize::from(langchain != all);
            continue;
        }
        // Deliberate difference: every leading system message is pinned. LangChain on the
        // history with the leading systems as one pinned block is the spec's selection.
        let expected = if lead >= 2 {
            let block = indices(&case["langchain_system_block"]);
            systems_differ += usize::from(block != langchain);
            block
        } else {
            langchain
        };
        if expected.iter().all(|&i| i < lead) {
            // Deliberate difference: never empty. Nothing that fits starts with a user
            // message: keep everything from the last user message on, over budget.
            let last_user = history.iter().rposition(|m| m["role"] == "user").unwrap();
            let spec: Vec<usize> = (0..lead).chain(last_user..history.len()).collect();
            assert_eq!(got, spec, "{name}: never empty");
            assert_eq!(events(&out, EventKind::OverBudget), 1, "{name}");
            never_empty += 1;
        } else {
            assert_eq!(got, expected, "{name}: differs from LangChain");
            assert_eq!(events(&out, EventKind::OverBudget), 0, "{name}");
            agree += 1;
        }
    }
    eprintln!("agree {agree}, fits {fits_differ}, systems {systems_differ}, never-empty {never_empty}");
    // The fixtures cover every case, so none of the branches above is dead.
    assert!(agree >= 10, "{agree} plain agreements");
    assert!(fits_differ >= 1 && systems_differ >= 1 && never_empty >= 1);
}

/// One message of exactly 10 chars4 tokens (3 + 28 characters / 4), unique by `n`.
fn ten(role: &str, n: usize) -> String {
    format!(
        r#"{{"role":"{role}","content":"{:<28}"}}"#,
        format!("message {n}")
    )
}

/// docs/plugins.md#token_budget, cache-stable trimming: with B = 200 and T = 120 (S = 80) and a history
/// growing by 20 tokens a turn, the cut point moves only when the history has grown by
/// another S, both for an agent that resends its full transcript and for one that resends
/// the previous output plus the new messages. Without a target it moves every turn.
#[test]
fn target_tokens_keeps_the_cut_point_stable_for_many_turns() {
    const B: u64 = 200;
    const S: u64 = 80;
    let quantized = config("max_tokens = 200\ntarget_tokens = 120");
    let plain = config("max_tokens = 200");
    let pinned = [
        format!(r#"{{"role":"system","content":"{:<28}"}}"#, "system"),
        ten("user", 0),
    ];
    let turns = 40;
    // Each turn adds a user and an assistant message: 20 tokens.
    let new_messages = |turn: usize| vec![ten("user", 2 * turn + 1), ten("assistant", 2 * turn + 2)];

    // 1. The full transcript every turn.
    let mut transcript: Vec<String> = pinned.to_vec();
    let mut previous_output: Option<Vec<serde_json::Value>> = None;
    let mut plain_moves = 0;
    let mut previous_plain_cut = None;
    let mut moves = 0;
    for turn in 0..turns {
        transcript.extend(new_messages(turn));
        let input = history(&transcript);
        let total = 10 * transcript.len() as u64;
        let out = run(&quantized, &input);
        let got = kept(&input, &out);
        // The cut: the first kept message after the pinned system message and task.
        let cut = got.get(2).copied().unwrap_or(transcript.len());
        let expected_cut = if total <= B {
            2
        } else {
            // Drop the shortest prefix of 10-token units worth at least S·⌈(total − B)/S⌉.
            let must_drop = (total - B).div_ceil(S) * S;
            2 + (must_drop / 10) as usize
        };
        assert_eq!(cut, expected_cut, "turn {turn}: total {total}");
        let output = run_json(&out).as_array().unwrap().clone();
        if let Some(previous) = &previous_output {
            // The cache survives exactly when the previous output is a prefix of this one.
            let prefix_kept = output.starts_with(previous);
            let moved = output[2] != previous[2];
            assert_eq!(prefix_kept, !moved, "turn {turn}");
            // The host's own report agrees: the whole previous output is kept, byte for
            // byte, exactly on the turns the cut did not move.
            let previous_text = serde_json::Value::Array(previous.clone()).to_string();
            let compared = quantized.run_after("m", &input, &previous_text).unwrap();
            let reported = compared.prefix_kept.unwrap();
            if moved {
                assert!(
                    reported <= 2,
                    "turn {turn}: the cut moved right after the pinned messages"
                );
            } else {
                assert_eq!(reported, previous.len(), "turn {turn}");
            }
            moves += usize::from(moved);
        }
        previous_output = Some(output);

        let plain_cut = kept(&input, &run(&plain, &input)).get(2).copied();
        if previous_plain_cut.is_some() && plain_cut != previous_plain_cut {
            plain_moves += 1;
        }
        previous_plain_cut = plain_cut;
    }
    // 40 turns add 800 tokens; the history first exceeds B at turn 9, and after that the
    // cut moves once per S = 80 tokens (4 turns), while the plain cut moves every turn.
    let over_turns = (0..turns).filter(|t| 20 + 20 * (*t as u64 + 1) > B).count();
    assert_eq!(moves, (over_turns as u64 * 20).div_ceil(S) as usize);
    assert_eq!(plain_moves, over_turns);
    assert!(moves * 3 < plain_moves, "{moves} vs {plain_moves}");

    // 2. The previous output plus the new messages.
    let mut sent: Vec<String> = pinned.to_vec();
    let mut cuts = Vec::new();
    for turn in 0..turns {
        sent.extend(new_messages(turn));
        let input = history(&sent);
        let total = 10 * sent.len() as u64;
        let out = run(&quantized, &input);
        let output = run_json(&out).as_array().unwrap().clone();
        let input_json = json(&input).as_array().unwrap().clone();
        if total <= B {
            assert_eq!(output, input_json, "turn {turn}: fits, unchanged");
        } else {
            // Over B: a whole step or more is dropped, leaving at most T + one turn.
            let dropped = (total - B).div_ceil(S) * S;
            assert_eq!(10 * output.len() as u64, total - dropped, "turn {turn}");
            assert!(10 * output.len() as u64 <= 120 + 20, "turn {turn}");
            cuts.push(turn);
        }
        sent = output.iter().map(|m| m.to_string()).collect();
    }
    // Between two cuts the output only grows (the cached prefix survives): the history
    // must grow by S again before the next cut, 4 turns of 20 tokens.
    assert!(cuts.len() >= 5, "{cuts:?}");
    for pair in cuts.windows(2) {
        assert_eq!(pair[1] - pair[0], (S / 20) as usize, "{cuts:?}");
    }
}
