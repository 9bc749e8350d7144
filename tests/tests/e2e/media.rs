//! Parts the host understands (docs/wire-format.md#part-kinds): a computer-use agent's
//! screenshots through the real `openai` client and the proxy, counted by the model's
//! image rule, not as base64 text.

use e2e_tests::upstream::{Behaviour, Upstream};
use e2e_tests::TestConfig;
use history_engine::tokens::count_text;
use plugin_api::parts::samples::{image_url_part, png};
use plugin_api::Tokenizer;
use serde_json::{json as j, Value};

use super::proxy::{openai_client, start};

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
    let server = start(&config, &upstream.base_url());
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
