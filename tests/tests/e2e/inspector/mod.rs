//! The inspector page at `/ui` (docs/http-api.md#the-inspector-page) in a real headless
//! Chromium, driven over WebDriver (fantoccini) through Debian's chromedriver, against a
//! real `serve` on loopback. Without chromedriver the test says `SKIPPED (no
//! chromedriver)` and passes, except under CI, where it fails. Screenshots go to
//! `target/ui-screenshots/`.

mod bodies;
mod browser;
mod scale;

use std::io::Write;
use std::time::Instant;

use browser::{browser, enter_token, have_chromedriver, shot, text_of, wait_count, Driver, WAIT};
use e2e_tests::server::{agent, shipped_config, Server};
use e2e_tests::store::{Kind, TestStore};
use fantoccini::Locator;
use serde_json::{json, Value};

pub(super) const TOKEN: &str = "inspector-operator-token";
pub(super) const TURNS: usize = 40;
const SCRIPT_TEXT: &str = "Please repeat this verbatim: <script>alert(1)</script>";

/// The original content of turn `n`'s tool result.
pub(super) fn tool_output(n: usize) -> String {
    format!("contents of file{n}.txt: {}", "line of source text; ".repeat(20))
}

/// Turn `n`'s messages: a user request, a tool call, its result, an answer. The last
/// turn's request carries a `<script>` element as text.
pub(super) fn turn_messages(n: usize) -> Vec<Value> {
    let mut messages = Vec::new();
    if n == 1 {
        messages.push(json!({"role": "system", "content": "You are a careful coding agent."}));
    }
    let request = if n == TURNS {
        SCRIPT_TEXT.to_string()
    } else {
        format!("Step {n}: read file{n}.txt")
    };
    let call = format!("call_{n}");
    messages.extend([
        json!({"role": "user", "content": request}),
        json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": call, "type": "function",
            "function": {"name": "read_file", "arguments": format!("{{\"path\":\"file{n}.txt\"}}")}
        }]}),
        json!({"role": "tool", "tool_call_id": call, "content": tool_output(n)}),
        json!({"role": "assistant", "content": format!("Read file{n}.txt.")}),
    ]);
    messages
}

#[test]
fn the_inspector_shows_a_40_turn_session_as_text_and_refuses_the_list_without_the_token() {
    let test = "the inspector page";
    if !have_chromedriver(test) {
        return;
    }
    // The shipped chain on a small window: `default` drops old turns, tool_result_filter
    // turns all but the newest 4 tool results into placeholders.
    let config = shipped_config("", &[("agent_max_ctx", "agent_max_ctx = 30")]);
    let store = TestStore::new(Kind::Sqlite, &config);
    let server = Server::start(&config.path, store.path(), &[("HISTORY_OPERATOR_TOKEN", TOKEN)]);
    let id = server.create("default");
    for n in 1..=TURNS {
        let answer = server.post(
            &format!("/v1/sessions/{id}/turns"),
            &json!({ "messages": turn_messages(n) }),
        );
        assert_eq!(answer.status, 200, "turn {n}: {answer:?}");
    }
    let turns = server.get(&format!("/v1/sessions/{id}/turns"));
    assert_eq!(turns.status, 200, "{turns:?}");
    assert_eq!(turns.body["turns"].as_array().unwrap().len(), TURNS);

    // The page's own headers.
    let page = agent().get(&server.url("/ui")).call().unwrap();
    let csp = page.header("content-security-policy").unwrap_or("").to_string();
    assert!(
        csp.contains("default-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));

    let driver = Driver::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = browser(&driver).await;
        let ui = server.url("/ui");
        let started = Instant::now();
        client.goto(&ui).await.unwrap();

        // Without the token the list is refused, and says why.
        let refused = text_of(&client, "#sessions-refused").await;
        let first_paint = started.elapsed();
        assert!(
            refused.contains("401") && refused.contains("operator"),
            "{refused}"
        );
        assert!(client
            .find_all(Locator::Css("#sessions-table"))
            .await
            .unwrap()
            .is_empty());
        shot(&client, "sessions-refused").await;

        // With it the list shows the session.
        enter_token(&client).await;
        let link = text_of(&client, "#sessions-table a.session-link").await;
        assert_eq!(link, id);
        let row = text_of(&client, "#sessions-table tbody tr").await;
        assert!(
            row.contains("default") && row.contains(&TURNS.to_string()),
            "{row}"
        );
        shot(&client, "sessions").await;

        // The session: one chart point per turn, for each series.
        client
            .find(Locator::Css("#sessions-table a.session-link"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        wait_count(&client, "#chart circle.pt-sent", TURNS).await;
        wait_count(&client, "#chart circle.pt-transcript", TURNS).await;
        let facts = text_of(&client, "#session .facts").await;
        assert!(
            facts.contains(&format!("turn {TURNS}")) && facts.contains("prefix_kept"),
            "{facts}"
        );
        shot(&client, "session").await;

        // A placeholder shows as one and expands to its original.
        let placeholder = client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::Css("#history li.mark-placeholder"))
            .await
            .unwrap();
        let badge = placeholder
            .find(Locator::Css(".badge"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(badge, "placeholder (omitted)");
        let shown = placeholder
            .find(Locator::Css("pre.content"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(shown, "[Omitted]");
        placeholder
            .find(Locator::Css("button.expand"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let original = text_of(&client, "#history li.mark-placeholder pre.original").await;
        assert!(
            (1..=TURNS).any(|n| tool_output(n).trim_end() == original.trim_end()),
            "the expanded original is one of the tool results sent: {original:?}"
        );
        shot(&client, "placeholder-expanded").await;

        // The `<script>` in a message is text: shown as typed, never run.
        let contents = client
            .find_all(Locator::Css("#history pre.content"))
            .await
            .unwrap();
        let mut shown_as_text = false;
        for content in contents {
            shown_as_text |= content.text().await.unwrap() == SCRIPT_TEXT;
        }
        assert!(shown_as_text, "the message with <script> shows as its text");
        assert!(client
            .find_all(Locator::Css("#main script"))
            .await
            .unwrap()
            .is_empty());
        let alert = client.get_alert_text().await;
        assert!(
            alert.as_ref().is_err_and(|e| e.is_no_such_alert()),
            "no alert ran: {alert:?}"
        );

        // A turn's stages and events, then the chain.
        client
            .find(Locator::Css("#timeline tr.turn-row"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let detail = text_of(&client, "#timeline tr.turn-detail").await;
        assert!(
            detail.contains("default") && detail.contains("tool_result_filter"),
            "{detail}"
        );
        shot(&client, "turn-detail").await;
        client.goto(&format!("{ui}#/chain")).await.unwrap();
        let chain = text_of(&client, "#chain-table tbody").await;
        assert!(
            chain.contains("token_budget") && chain.contains("role_pair"),
            "{chain}"
        );
        shot(&client, "chain").await;

        let _ = writeln!(
            std::io::stderr(),
            "inspector: first paint of /ui in {} ms (measured, not asserted)",
            first_paint.as_millis()
        );
        client.close().await.unwrap();
    });
    drop(driver);
    assert_eq!(server.stop().code(), Some(0));
}

/// `GET /v1/sessions/{id}/turns` (docs/http-api.md#turns): one record per turn with the
/// numbers the turn's answer had, `last` bounding it, bad parameters and ids refused.
#[test]
fn the_turns_endpoint_records_each_turn_as_its_answer_said() {
    let config = shipped_config("", &[("agent_max_ctx", "agent_max_ctx = 30")]);
    let store = TestStore::new(Kind::Sqlite, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let id = server.create("default");
    let mut answers = Vec::new();
    for n in 1..=3 {
        let answer = server.post(
            &format!("/v1/sessions/{id}/turns"),
            &json!({ "messages": turn_messages(n) }),
        );
        assert_eq!(answer.status, 200, "turn {n}: {answer:?}");
        answers.push(answer.body);
    }
    let all = server.get(&format!("/v1/sessions/{id}/turns"));
    assert_eq!(all.status, 200, "{all:?}");
    assert_eq!(all.body["kept"], 1000);
    let records = all.body["turns"].as_array().unwrap();
    assert_eq!(records.len(), 3);
    let mut transcript_tokens = 0;
    for (record, answer) in records.iter().zip(&answers) {
        assert_eq!(record["turn"], answer["turn"]);
        assert_eq!(
            record["messages_sent"],
            answer["history"].as_array().unwrap().len()
        );
        assert_eq!(record["working_size"], answer["working_size"]);
        assert_eq!(record["prefix_kept"], answer["prefix_kept"]);
        assert_eq!(
            record["events"].as_array().unwrap().len(),
            answer["events"].as_array().unwrap().len()
        );
        let stages = record["stages"].as_array().unwrap();
        let stats = answer["stats"].as_array().unwrap();
        assert_eq!(stages.len(), stats.len());
        for (stage, stat) in stages.iter().zip(stats) {
            for key in ["plugin", "messages_in", "messages_out", "tokens_in", "tokens_out"] {
                assert_eq!(stage[key], stat[key], "{key}");
            }
        }
        // The last stage's output is what was sent.
        assert_eq!(record["tokens_sent"], stats.last().unwrap()["tokens_out"]);
        transcript_tokens += record["entered_tokens"].as_u64().unwrap();
        assert_eq!(record["transcript_tokens"], transcript_tokens);
    }
    let last = server.get(&format!("/v1/sessions/{id}/turns?last=2"));
    let turns: Vec<&Value> = last.body["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["turn"])
        .collect();
    assert_eq!(turns, [&json!(2), &json!(3)]);
    let bad = server.get(&format!("/v1/sessions/{id}/turns?lats=2"));
    assert_eq!(bad.status, 400);
    assert!(bad.error().1.contains("\"lats\""), "{bad:?}");
    let bad = server.get(&format!("/v1/sessions/{id}/turns?last=x"));
    assert_eq!(bad.status, 400, "{bad:?}");
    let missing = server.get("/v1/sessions/no-such-session/turns");
    assert_eq!(missing.status, 404, "{missing:?}");
    assert_eq!(server.stop().code(), Some(0));
}
