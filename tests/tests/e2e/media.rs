//! Parts the host understands (docs/wire-format.md#part-kinds): a computer-use agent's
//! screenshots through the real `openai` client and the proxy, counted by the model's
//! image rule, not as base64 text.

use e2e_tests::upstream::{Behaviour, Upstream};
use e2e_tests::TestConfig;
use history_engine::tokens::count_text;
use plugin_api::parts::samples::{image_url_part, png};
use plugin_api::Tokenizer;
use serde_json::{json as j, Value};

use super::proxy::openai_client;
use e2e_tests::server::start_proxy;

const STEPS: usize = 30;
/// 1280×800 on `openai-tiles`: 1229×768 after the shortest side goes to 768, 3 × 2 tiles:
/// 85 + 6 × 170.
const SCREENSHOT_TOKENS: u64 = 85 + 6 * 170;

/// A computer-use conversation: a task, then per step a `screenshot` call, its result,
/// and the user's message carrying the screenshot (a real 1280×800 PNG).
fn conversation() -> (Vec<Value>, String) {
    let image: Value =
        serde_json::from_str(&image_url_part("image/png", &png(1280, 800), Some("high"))).unwrap();
    let mut messages = vec![
        j!({"role": "system", "content": "You operate a desktop through the computer tool."}),
        j!({"role": "user", "content": "Open the settings and turn on dark mode."}),
    ];
    for step in 0..STEPS {
        let id = format!("call_{step}");
        messages.push(j!({"role": "assistant", "content": null, "tool_calls": [{
            "id": id, "type": "function",
            "function": {"name": "computer", "arguments": format!("{{\"action\":\"screenshot\",\"step\":{step}}}")}
        }]}));
        messages.push(j!({"role": "tool", "tool_call_id": id, "content": "screenshot taken"}));
        messages.push(j!({"role": "user", "content": [
            {"type": "text", "text": format!("Here is the screen after step {step}.")},
            image,
        ]}));
    }
    (messages, image.to_string())
}

/// Tokens by docs/plugins.md#token_budget's formula, counted here by hand: 3 per message,
/// each text and call by o200k_base, each screenshot by the tile rule.
fn expected_tokens(messages: &[Value]) -> u64 {
    let text = |t: &str| count_text(Tokenizer::O200kBase, t);
    messages
        .iter()
        .map(|m| {
            let content = match &m["content"] {
                Value::String(s) => text(s),
                Value::Array(parts) => parts
                    .iter()
                    .map(|p| match p["type"].as_str() {
                        Some("text") => text(p["text"].as_str().unwrap()),
                        _ => SCREENSHOT_TOKENS,
                    })
                    .sum(),
                _ => 0,
            };
            let calls: u64 = m["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    text(c["function"]["name"].as_str().unwrap())
                        + text(c["function"]["arguments"].as_str().unwrap())
                })
                .sum();
            3 + content + calls
        })
        .sum()
}

#[test]
fn screenshots_count_by_the_tile_rule_and_evict_no_text_through_the_proxy() {
    let (messages, image) = conversation();
    let expected = expected_tokens(&messages);
    assert_eq!(expected, expected_tokens(&messages[..]), "a sum, not a constant");
    // A budget the history fits by the tile rule, and that its screenshots alone would
    // blow ~5 times over if their JSON text were counted, as before.
    let budget = expected + 1000;
    let as_text = STEPS as u64 * count_text(Tokenizer::O200kBase, &image);
    assert!(
        as_text > 2 * budget,
        "{as_text} tokens as text vs a budget of {budget}"
    );
    let config = TestConfig::new(&format!(
        "[history]\nagent_max_ctx = 200\nchain = [\"default\", \"token_budget\"]\non_plugin_error = \"fail\"\n\
         [models.gpt-4o]\nmax_context = 200\ncontext_tokens = 128000\ntokenizer = \"o200k_base\"\n\
         [plugin.token_budget]\nmax_tokens = {budget}\n"
    ));
    let upstream = Upstream::start(Behaviour::default());
    let server = start_proxy(&config, &upstream.base_url());
    let answer = openai_client(&j!({
        "base_url": server.url("/v1"),
        "model": "gpt-4o",
        "messages": messages,
    }));
    let n = messages.len();
    assert_eq!(
        answer["headers"]["x-history-tokens"],
        format!("{expected}->{expected}"),
        "{answer}"
    );
    assert_eq!(
        answer["headers"]["x-history-messages"],
        format!("{n}->{n}"),
        "no message evicted: {answer}"
    );
    let received = upstream.requests();
    assert_eq!(received.len(), 1);
    let sent = received[0].json();
    assert_eq!(
        sent["messages"],
        Value::Array(messages),
        "every screenshot and text reached upstream unchanged"
    );
    assert_eq!(server.stop().code(), Some(0));
}

/// A conversation whose newest tool result alone is ~25,000 tokens.
fn huge_result() -> Vec<Value> {
    let body: String = (0..2500)
        .map(|i| format!("row {i}: status ok, latency {} ms\n", i % 97))
        .collect();
    vec![
        j!({"role": "user", "content": "List every row of the table."}),
        j!({"role": "assistant", "content": null, "tool_calls": [{
            "id": "call_1", "type": "function", "function": {"name": "query", "arguments": "{\"table\":\"rows\"}"}
        }]}),
        j!({"role": "tool", "tool_call_id": "call_1", "content": body}),
    ]
}

fn small_model(plugin: &str, upstream_table: &str) -> TestConfig {
    TestConfig::new(&format!(
        "[history]\nagent_max_ctx = 200\nchain = [\"default\", \"tool_result_filter\"]\non_plugin_error = \"fail\"\n\
         [models.small-8k]\nmax_context = 200\ncontext_tokens = 8192\ntokenizer = \"o200k_base\"\n\
         [plugin.tool_result_filter]\nstrategy = \"keep_all\"\n{plugin}\n{upstream_table}"
    ))
}

#[test]
fn a_25k_token_result_on_an_8k_model_is_cut_to_fit_or_refused_before_the_upstream() {
    let messages = huge_result();
    let body = messages[2]["content"].as_str().unwrap().to_string();
    assert!(count_text(Tokenizer::O200kBase, &body) > 20_000);
    let upstream = Upstream::start(Behaviour::default());

    // With max_result_tokens: cut to its head and tail, the rest of the turn fits.
    let config = small_model("max_result_tokens = 4000", "");
    let server = start_proxy(&config, &upstream.base_url());
    let answer =
        openai_client(&j!({"base_url": server.url("/v1"), "model": "small-8k", "messages": messages}));
    let tokens = answer["headers"]["x-history-tokens"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"))
        .to_string();
    let out: u64 = tokens.split("->").nth(1).unwrap().parse().unwrap();
    assert!(out <= 8192, "{tokens}");
    let sent = upstream.requests()[0].json();
    let cut = sent["messages"][2]["content"].as_str().unwrap();
    assert!(count_text(Tokenizer::O200kBase, cut) <= 4000);
    assert!(
        cut.starts_with("row 0: status ok") && cut.trim_end().ends_with("row 2499: status ok, latency 74 ms")
    );
    assert!(cut.contains("cut from the middle of this result"), "{cut}");
    assert!(
        sent["messages"][2].get("metadata").is_none(),
        "no host metadata upstream"
    );
    assert_eq!(server.stop().code(), Some(0));

    // The original is kept for expansion: the same chain, in-process, keeps it.
    let (engine_config, _, chain) = history_engine::load_chain(&config.path).unwrap();
    let history = history_wire::chat::history_from_str(&Value::Array(messages.clone()).to_string()).unwrap();
    let ctx = history_engine::stateless_context(&engine_config, engine_config.model("small-8k"), 1);
    let run = chain.run(history, &ctx, history_engine::Call::Process).unwrap();
    let restored = run.history[2]
        .restored_copy()
        .expect("the cut result can be expanded");
    assert_eq!(restored.content.text(), body);
    assert!(run
        .stages
        .iter()
        .flat_map(|s| &s.events)
        .any(|e| e.kind == plugin_api::EventKind::MessageCompacted));

    // Without a cut: a 400 in OpenAI's shape, and nothing sent upstream.
    let before = upstream.requests().len();
    let config = small_model("", "");
    let server = start_proxy(&config, &upstream.base_url());
    let answer =
        openai_client(&j!({"base_url": server.url("/v1"), "model": "small-8k", "messages": messages}));
    assert_eq!(answer["status"], 400, "{answer}");
    assert_eq!(answer["body"]["code"], "context_length_exceeded", "{answer}");
    assert!(answer["body"]["message"]
        .as_str()
        .unwrap()
        .contains("maximum context length is 8192 tokens"));
    assert_eq!(upstream.requests().len(), before, "nothing went upstream");
    assert_eq!(server.stop().code(), Some(0));

    // send_over_budget = true: sent as it is.
    let config = small_model(
        "",
        &format!(
            "[upstream]\nurl = \"{}\"\nsend_over_budget = true\n",
            upstream.base_url()
        ),
    );
    let server = start_proxy(&config, &upstream.base_url());
    let answer =
        openai_client(&j!({"base_url": server.url("/v1"), "model": "small-8k", "messages": messages}));
    assert!(answer["content"].is_string(), "{answer}");
    assert_eq!(upstream.requests().len(), before + 1);
    assert_eq!(server.stop().code(), Some(0));
}

#[test]
fn only_the_newest_screenshots_reach_the_upstream_with_media_filter() {
    let (messages, _) = conversation();
    let config = TestConfig::new(
        "[history]\nagent_max_ctx = 200\nchain = [\"default\", \"media_filter\", \"token_budget\"]\non_plugin_error = \"fail\"\n\
         [models.gpt-4o]\nmax_context = 200\ncontext_tokens = 128000\ntokenizer = \"o200k_base\"\n\
         [plugin.media_filter]\nkeep_images = 3\nmin_removal_threshold = 1\n",
    );
    let upstream = Upstream::start(Behaviour::default());
    let server = start_proxy(&config, &upstream.base_url());
    let answer = openai_client(&j!({"base_url": server.url("/v1"), "model": "gpt-4o", "messages": messages}));
    let n = messages.len();
    assert_eq!(
        answer["headers"]["x-history-messages"],
        format!("{n}->{n}"),
        "{answer}"
    );
    let sent = upstream.requests()[0].json();
    let sent = sent["messages"].as_array().unwrap();
    let with_image: Vec<usize> = (0..n)
        .filter(|&i| {
            sent[i]["content"]
                .as_array()
                .is_some_and(|p| p.iter().any(|p| p["type"] == "image_url"))
        })
        .collect();
    assert_eq!(with_image, [n - 7, n - 4, n - 1], "the newest three screenshots");
    for i in with_image {
        assert_eq!(sent[i], messages[i], "a kept screenshot goes unchanged");
    }
    let first = &sent[4]["content"];
    assert_eq!(first[0], messages[4]["content"][0], "the text part stays");
    assert_eq!(
        first[1],
        j!({"type": "text", "text": "[image omitted: 1280×800 png, 1105 tokens]"})
    );
    assert_eq!(server.stop().code(), Some(0));
}

#[test]
fn reasoning_in_both_shapes_is_counted_older_turns_cleared_and_the_open_loop_kept_byte_for_byte() {
    let thinking = |t: &str, sig: &str| j!({"type": "thinking", "thinking": t, "signature": sig});
    let messages = vec![
        j!({"role": "user", "content": "Plan the trip."}),
        j!({"role": "assistant", "content": "Booked the flight.", "reasoning_content": "The user wants a trip; flights first, then the hotel near the venue."}),
        j!({"role": "user", "content": "Now the hotel."}),
        j!({"role": "assistant", "content": [thinking("Hotels near the venue, under budget.", "EqQBCkYIBxgCKkA1"), {"type": "text", "text": "Booked the hotel."}]}),
        j!({"role": "user", "content": "And a car."}),
        j!({"role": "assistant", "content": [thinking("A car for three days; search first.", "EqQBCkYIBxgCKkB2")], "tool_calls": [{
            "id": "call_car", "type": "function", "function": {"name": "search_cars", "arguments": "{\"days\":3}"}
        }]}),
        j!({"role": "tool", "tool_call_id": "call_car", "content": "3 cars found"}),
    ];
    // Counted: the reasoning's text is in the tokens (before, reasoning_content counted 0).
    let text = |t: &str| count_text(Tokenizer::O200kBase, t);
    // Each 16-byte signature counts as bytes / 4 (it goes back to the provider).
    let expected: u64 = 7 * 3
        + 2 * 4
        + text("Plan the trip.")
        + text("Booked the flight.")
        + text("The user wants a trip; flights first, then the hotel near the venue.")
        + text("Now the hotel.")
        + text("Hotels near the venue, under budget.")
        + text("Booked the hotel.")
        + text("And a car.")
        + text("A car for three days; search first.")
        + text("search_cars")
        + text("{\"days\":3}")
        + text("3 cars found");
    let config = TestConfig::new(
        "[history]\nagent_max_ctx = 200\nchain = [\"default\", \"media_filter\"]\non_plugin_error = \"fail\"\n\
         [models.claude-sonnet-4]\nmax_context = 200\ncontext_tokens = 200000\ntokenizer = \"o200k_base\"\n\
         [plugin.media_filter]\nkeep_thinking_turns = 0\n",
    );
    let upstream = Upstream::start(Behaviour::default());
    let server = start_proxy(&config, &upstream.base_url());
    let answer =
        openai_client(&j!({"base_url": server.url("/v1"), "model": "claude-sonnet-4", "messages": messages}));
    let tokens = answer["headers"]["x-history-tokens"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"))
        .to_string();
    assert!(
        tokens.starts_with(&format!("{expected}->")),
        "{tokens} (expected {expected} in)"
    );
    let sent = upstream.requests()[0].json();
    let sent = sent["messages"].as_array().unwrap();
    assert!(
        sent[1].get("reasoning_content").is_none(),
        "an older turn's reasoning_content cleared"
    );
    assert_eq!(
        sent[3]["content"],
        j!([{"type": "text", "text": "Booked the hotel."}]),
        "an older thinking block cleared"
    );
    assert_eq!(
        sent[5], messages[5],
        "the open tool loop's thinking block, signature intact"
    );
    assert_eq!(sent[6], messages[6]);
    assert_eq!(server.stop().code(), Some(0));
}

/// A part of a kind the host does not know is kept and counted as its JSON text; each run
/// whose input carries one reports a `warning` of `host` naming the type once, about the
/// first message carrying it, through `process --explain` and a session's turn alike.
#[test]
fn an_unknown_part_kind_is_one_host_warning_per_run_naming_it() {
    let widget = |n: u32| j!({"type": "x_vendor_widget", "widget": {"n": n}});
    let messages = vec![
        j!({"role": "user", "content": [{"type": "text", "text": "Show the dashboard."}, widget(1)]}),
        j!({"role": "assistant", "content": "Here it is."}),
        j!({"role": "user", "content": [widget(2), {"type": "text", "text": "And this one?"}]}),
    ];
    let config = TestConfig::new("[history]\nagent_max_ctx = 50\nchain = [\"default\"]\n");
    let document = j!({ "messages": messages }).to_string();
    let output = config.process(&["--model", "default", "--explain"], &document);
    assert_eq!(output.status.code(), Some(0), "{}", e2e_tests::describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("host: warning")).collect();
    assert_eq!(lines.len(), 1, "one warning for the type: {stderr}");
    assert!(
        lines[0].contains("at message 0") && lines[0].contains("\"x_vendor_widget\""),
        "{}",
        lines[0]
    );
    let out = e2e_tests::json(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(out[2]["content"][0], widget(2), "kept verbatim");

    let store = e2e_tests::store::TestStore::new(e2e_tests::store::Kind::Sqlite, &config);
    let server = e2e_tests::server::Server::start(&config.path, store.path(), &[]);
    let id = server.create("default");
    let answer = server.post(&format!("/v1/sessions/{id}/turns"), &j!({ "messages": messages }));
    assert_eq!(answer.status, 200, "{}", answer.body);
    let host: Vec<&Value> = answer.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["plugin"] == "host")
        .collect();
    assert_eq!(host.len(), 1, "{}", answer.body["events"]);
    assert_eq!((&host[0]["kind"], &host[0]["index"]), (&j!("warning"), &j!(0)));
    assert!(host[0]["reason"]
        .as_str()
        .unwrap()
        .contains("\"x_vendor_widget\""));
    // The next turn's input holds the parts again: it reports them again, once.
    let next = server.post(
        &format!("/v1/sessions/{id}/turns"),
        &j!({ "messages": [{"role": "user", "content": "Thanks."}] }),
    );
    let again = next.body["events"].as_array().unwrap();
    assert_eq!(
        again.iter().filter(|e| e["plugin"] == "host").count(),
        1,
        "{}",
        next.body
    );
    assert_eq!(server.stop().code(), Some(0));
}
