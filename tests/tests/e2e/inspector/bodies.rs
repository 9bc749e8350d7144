//! The proxy traffic of every wire, and its bodies under `[ui] keep_bodies = true`
//! (docs/configuration.md#ui, docs/http-api.md#proxy-traffic): kept cut at `max_body_kb`,
//! shown by the page as text.

use super::browser::{browser, enter_token, have_chromedriver, shot, text_of, wait_count, Driver};
use super::{turn_messages, TOKEN};
use e2e_tests::anthropic_upstream::AnthropicUpstream;
use e2e_tests::server::{small_window, start_proxy_with, Server};
use e2e_tests::upstream::{Behaviour, Upstream};
use fantoccini::Locator;
use serde_json::{json, Value};

fn traffic(server: &Server) -> Value {
    let traffic = server.request("GET", "/v1/proxy/traffic", None, true);
    assert_eq!(traffic.status, 200, "{traffic:?}");
    traffic.body
}

/// A long chat conversation (20 turns of tool use), trimmed by the small window.
fn conversation() -> Vec<Value> {
    let mut messages: Vec<Value> = (1..=20).flat_map(turn_messages).collect();
    messages.push(json!({"role": "user", "content": "Summarize what you read."}));
    messages
}

#[test]
fn the_traffic_records_every_wire_and_keeps_bodies_only_when_told() {
    let env = [("HISTORY_OPERATOR_TOKEN", TOKEN)];
    // Bodies kept, cut at 2 KiB: the chat and Responses wires.
    let upstream = Upstream::start(Behaviour::default());
    let config = small_window("[ui]\nkeep_bodies = true\nmax_body_kb = 2\n");
    let server = start_proxy_with(&config, &upstream.base_url(), &env);
    let messages = conversation();
    let chat = server.post(
        "/v1/chat/completions",
        &json!({"model": "gpt-4o", "messages": messages}),
    );
    assert_eq!(chat.status, 200, "{chat:?}");
    let responses = server.post(
        "/v1/responses",
        &json!({"model": "gpt-4o", "store": false, "instructions": "Be brief.",
                "input": [{"type": "message", "role": "user", "content": "Say hi."}]}),
    );
    assert_eq!(responses.status, 200, "{responses:?}");
    let received = upstream.requests();
    assert_eq!(received.len(), 2);

    let body = traffic(&server);
    assert_eq!(body["bodies"], true);
    let requests = body["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 2, "{body}");
    let (chat_row, responses_row) = (&requests[0], &requests[1]);
    assert_eq!(chat_row["wire"], "chat");
    assert_eq!(responses_row["wire"], "responses");
    assert_eq!(responses_row["messages_in"], 2, "instructions and the message");
    assert_eq!(responses_row["status"], 200);
    // What went upstream, as it went: its whole length, its first 2 KiB, said to be cut.
    let sent = &chat_row["bodies"]["sent"];
    assert_eq!(sent["bytes"], received[0].body.len(), "{sent}");
    assert!(received[0].body.len() > 2048);
    assert_eq!(sent["cut"], true);
    let text = sent["text"].as_str().unwrap();
    assert_eq!(text.len(), 2048);
    assert!(String::from_utf8_lossy(&received[0].body).starts_with(text));
    // The answer, as the client read it.
    let answer = &chat_row["bodies"]["answer"];
    assert_eq!(answer["cut"], false);
    let read: Value = serde_json::from_str(answer["text"].as_str().unwrap()).unwrap();
    assert_eq!(read, chat.body, "{answer}");
    let sent = &responses_row["bodies"]["sent"];
    assert_eq!(sent["cut"], false);
    assert_eq!(sent["text"].as_str().unwrap().as_bytes(), &received[1].body[..]);
    let read: Value =
        serde_json::from_str(responses_row["bodies"]["answer"]["text"].as_str().unwrap()).unwrap();
    assert_eq!(read, responses.body);
    drop(server);

    // Never kept by default: the Anthropic wire recorded, numbers only.
    let upstream = AnthropicUpstream::start();
    let config = small_window("");
    let server = start_proxy_with(&config, &upstream.base_url(), &env);
    let answer = server.post(
        "/v1/messages",
        &json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "system": "Be brief.",
                "messages": [{"role": "user", "content": "Say hi, secret-word-7."}]}),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    let body = traffic(&server);
    assert_eq!(body["bodies"], false);
    let row = &body["requests"][0];
    assert_eq!(row["wire"], "anthropic");
    assert_eq!(row["model"], "claude-sonnet-4-5");
    assert_eq!(row["messages_in"], 2);
    assert_eq!(row["status"], 200);
    assert!(row.get("bodies").is_none());
    assert!(!body.to_string().contains("secret-word-7"), "no bodies: {body}");
}

#[test]
fn with_keep_bodies_the_page_shows_the_bodies_as_text() {
    let test = "the inspector's proxy bodies";
    if !have_chromedriver(test) {
        return;
    }
    let upstream = Upstream::start(Behaviour::default());
    let config = small_window("[ui]\nkeep_bodies = true\n");
    let server = start_proxy_with(
        &config,
        &upstream.base_url(),
        &[("HISTORY_OPERATOR_TOKEN", TOKEN)],
    );
    let messages = json!([{"role": "user", "content": "Repeat: <script>alert(1)</script>"}]);
    let answer = server.post(
        "/v1/chat/completions",
        &json!({"model": "gpt-4o", "messages": messages}),
    );
    assert_eq!(answer.status, 200, "{answer:?}");

    let driver = Driver::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = browser(&driver).await;
        client.goto(&server.url("/ui#/proxy")).await.unwrap();
        enter_token(&client).await;
        wait_count(&client, "#traffic-table tbody tr.bodies", 1).await;
        client
            .find(Locator::Css("#traffic-table tr.bodies summary"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let sent = text_of(&client, "pre.body-sent").await;
        assert!(
            sent.contains("<script>alert(1)</script>"),
            "shown as text: {sent}"
        );
        let answered = text_of(&client, "pre.body-answer").await;
        assert!(answered.contains("chat.completion"), "{answered}");
        // Rendered as text: no element came of it, nothing ran.
        let scripts = client.find_all(Locator::Css("#traffic script")).await.unwrap();
        assert!(scripts.is_empty());
        let alerted = client.get_alert_text().await;
        assert!(alerted.is_err(), "an alert opened: {alerted:?}");
        shot(&client, "proxy-bodies").await;
        client.close().await.unwrap();
    });
    drop(driver);
    assert_eq!(server.stop().code(), Some(0));
}
