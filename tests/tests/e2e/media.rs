//! Every part counted by its own rule (docs/wire-format.md#parts), end to end: a
//! computer-use conversation through the proxy and the real `openai` client, one PNG
//! screenshot a step made by the test, on `gpt-4o`. Each screenshot counts as the tile
//! rule says (1280 × 800: 6 tiles, 1,105 tokens), not as its base64 text, so no text
//! message is evicted for image tokens.

use e2e_tests::python_client;
use e2e_tests::server::{shipped_config, Server};
use e2e_tests::upstream::{Behaviour, Upstream};
use serde_json::{json, Value};

const STEPS: usize = 30;
/// What a 1280 × 800 high-detail image costs by OpenAI's tiles.
const SCREENSHOT_TOKENS: u64 = 1105;

/// A 1280 × 800 PNG of noise (about as large as a real screenshot, so its base64 text
/// alone would be tens of thousands of tokens).
fn screenshot(seed: u32) -> String {
    let (width, height) = (1280u32, 800u32);
    let mut state = seed.wrapping_mul(2_654_435_761).max(1);
    let pixels: Vec<u8> = (0..width * height * 3)
        .map(|i| {
            // Noise in blocks: compressible like a screen, not like a solid colour.
            if i % 64 == 0 {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
            }
            (state >> (i % 24)) as u8
        })
        .collect();
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(png::ColorType::Rgb);
    let mut writer = encoder.write_header().unwrap();
    writer.write_image_data(&pixels).unwrap();
    drop(writer);
    use base64::Engine as _;
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&out)
    )
}

/// The conversation: a task, then per step a click, its result and a screenshot.
fn conversation(with_images: bool) -> Vec<Value> {
    let mut messages = vec![json!({"role": "user", "content": "Book the cheapest flight to Lisbon."})];
    for step in 0..STEPS {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{step}"), "type": "function",
            "function": {"name": "computer", "arguments": format!("{{\"action\":\"click\",\"x\":{},\"y\":{}}}", 100 + step, 200 + step)}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{step}"), "content": format!("clicked; step {step} done")}));
        let mut parts = vec![json!({"type": "text", "text": format!("Screen after step {step}.")})];
        if with_images {
            parts.push(json!({"type": "image_url", "image_url": {"url": screenshot(step as u32 + 1), "detail": "high"}}));
        }
        messages.push(json!({"role": "user", "content": parts}));
    }
    messages
}

fn tokens_in(answer: &Value) -> (u64, u64, String) {
    let headers = &answer["headers"];
    let tokens = headers["x-history-tokens"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"));
    let (tin, tout) = tokens.split_once("->").unwrap();
    let messages = headers["x-history-messages"].as_str().unwrap().to_string();
    (tin.parse().unwrap(), tout.parse().unwrap(), messages)
}

#[test]
fn screenshots_count_by_the_tile_rule_and_evict_no_text() {
    let upstream = Upstream::start(Behaviour::default());
    let config = shipped_config("", &[]);
    let server = Server::try_start(
        &config.path,
        &config.dir.path().join("sessions.db"),
        &[],
        &["--listen", "127.0.0.1:0", "--upstream", &upstream.base_url()],
    )
    .unwrap();
    let ask = |messages: Vec<Value>| {
        python_client(
            "openai_client.py",
            &json!({"base_url": format!("http://{}/v1", server.addr), "model": "gpt-4o", "messages": messages}),
        )
    };
    let with = conversation(true);
    let request_bytes = serde_json::to_string(&with).unwrap().len();
    assert!(
        request_bytes > 30 * 50_000,
        "screenshots of realistic size: {request_bytes} bytes"
    );
    let images = ask(with.clone());
    let text_only = ask(conversation(false));
    let (with_in, with_out, with_messages) = tokens_in(&images);
    let (text_in, _, _) = tokens_in(&text_only);
    assert_eq!(
        with_in - text_in,
        STEPS as u64 * SCREENSHOT_TOKENS,
        "each screenshot counts 1,105 tokens"
    );
    // Everything fits gpt-4o's window: nothing evicted, every screenshot sent.
    let n = with.len();
    assert_eq!(with_messages, format!("{n}->{n}"), "{images}");
    // What the chain saved is tool_result_filter's placeholders for old results, not images.
    assert!(with_in - with_out < 200, "{with_in} -> {with_out}");
    let sent = upstream
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/chat/completions"))
        .map(|r| r.json())
        .next()
        .unwrap();
    assert_eq!(sent["messages"].as_array().unwrap().len(), n);
    assert_eq!(
        sent["messages"]
            .to_string()
            .matches("data:image/png;base64,")
            .count(),
        STEPS
    );
}
