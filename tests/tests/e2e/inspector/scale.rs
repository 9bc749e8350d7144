//! The inspector's proxy traffic view, and the page at scale: 1,000 sessions and a
//! 1,000-turn session.

use std::io::Write;
use std::time::Instant;

use super::browser::{browser, enter_token, have_chromedriver, shot, text_of, wait_count, Driver};
use super::{turn_messages, TOKEN};
use e2e_tests::server::{shipped_config, Server};
use e2e_tests::store::{Kind, TestStore};
use e2e_tests::upstream::{Behaviour, Upstream};
use fantoccini::Locator;
use serde_json::{json, Value};

/// The proxy's traffic (docs/http-api.md#proxy-traffic): the last requests' numbers, no
/// bodies, for the operator only, shown by the page in Chromium.
#[test]
fn the_inspector_shows_proxy_traffic_to_the_operator_only() {
    let test = "the inspector's proxy traffic";
    if !have_chromedriver(test) {
        return;
    }
    let upstream = Upstream::start(Behaviour::default());
    let config = shipped_config("", &[("agent_max_ctx", "agent_max_ctx = 12")]);
    let store = config.dir.path().join("sessions.db");
    let server = Server::try_start(
        &config.path,
        &store,
        &[("HISTORY_OPERATOR_TOKEN", TOKEN)],
        &["--listen", "127.0.0.1:0", "--upstream", &upstream.base_url()],
    )
    .unwrap_or_else(|e| panic!("serve did not start: {e}"));
    let mut messages: Vec<Value> = (1..=20).flat_map(turn_messages).collect();
    messages.push(json!({"role": "user", "content": "Summarize what you read."}));
    for model in ["gpt-4o", "gpt-4-turbo"] {
        let answer = server.post(
            "/v1/chat/completions",
            &json!({"model": model, "messages": messages}),
        );
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    assert_eq!(server.get("/v1/proxy/traffic").status, 401);
    let traffic = server.request("GET", "/v1/proxy/traffic", None, true);
    assert_eq!(traffic.status, 200, "{traffic:?}");
    let requests = traffic.body["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0]["model"], "gpt-4o");
    assert_eq!(requests[0]["status"], 200);
    assert_eq!(requests[0]["messages_in"], messages.len());
    assert!(requests[0]["messages_sent"].as_u64().unwrap() < messages.len() as u64);
    assert!(
        !traffic.body.to_string().contains("Summarize what you read"),
        "no bodies"
    );

    let driver = Driver::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = browser(&driver).await;
        client.goto(&server.url("/ui#/proxy")).await.unwrap();
        let refused = text_of(&client, "#traffic-refused").await;
        assert!(refused.contains("401"), "{refused}");
        enter_token(&client).await;
        wait_count(&client, "#traffic-table tbody tr", 2).await;
        let rows = text_of(&client, "#traffic-table tbody").await;
        assert!(
            rows.contains("gpt-4o") && rows.contains("gpt-4-turbo") && rows.contains("200"),
            "{rows}"
        );
        shot(&client, "proxy-traffic").await;
        client.close().await.unwrap();
    });
    drop(driver);
    assert_eq!(server.stop().code(), Some(0));
}

/// The page with 1,000 live sessions and a 1,000-turn session: it pages the lists (50
/// sessions, 10 turns a page) and draws every recorded turn; the time to the first full
/// paint of each is measured and printed, not asserted.
#[test]
fn the_inspector_pages_1000_sessions_and_a_1000_turn_session() {
    let test = "the inspector at scale";
    if !have_chromedriver(test) {
        return;
    }
    const SESSIONS: usize = 1000;
    const LONG: usize = 1000;
    let config = shipped_config(
        "",
        &[
            ("agent_max_ctx", "agent_max_ctx = 30"),
            ("max_users", "max_users = 2000"),
        ],
    );
    let store = TestStore::new(Kind::Sqlite, &config);
    let server = Server::start(&config.path, store.path(), &[("HISTORY_OPERATOR_TOKEN", TOKEN)]);
    let long = server.create("default");
    for n in 1..=LONG {
        let answer = server.post(
            &format!("/v1/sessions/{long}/turns"),
            &json!({ "messages": turn_messages(n) }),
        );
        assert_eq!(answer.status, 200, "turn {n}: {answer:?}");
    }
    for _ in 1..SESSIONS {
        server.create("default");
    }
    // What the session view reads, each timed on its own (printed below).
    let reads: Vec<(String, u128)> = ["turns", "history?view=sent&form=full", "transcript?last=200"]
        .iter()
        .map(|path| {
            let started = Instant::now();
            let answer = server.get(&format!("/v1/sessions/{long}/{path}"));
            assert_eq!(answer.status, 200, "{path}: {answer:?}");
            (path.to_string(), started.elapsed().as_millis())
        })
        .collect();

    let driver = Driver::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = browser(&driver).await;
        client.goto(&server.url("/ui")).await.unwrap();
        client
            .find(Locator::Css("#token"))
            .await
            .unwrap()
            .send_keys(TOKEN)
            .await
            .unwrap();
        let started = Instant::now();
        client
            .find(Locator::Css("#token-form button[type=submit]"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        wait_count(&client, "#sessions-table tbody tr", 50).await;
        let list_paint = started.elapsed();
        let title = text_of(&client, "#sessions h2").await;
        assert!(title.contains(&format!("({SESSIONS})")), "{title}");
        shot(&client, "sessions-1000").await;

        let started = Instant::now();
        client
            .goto(&server.url(&format!("/ui#/session/{long}")))
            .await
            .unwrap();
        wait_count(&client, "#chart circle.pt-sent", LONG).await;
        let session_paint = started.elapsed();
        wait_count(&client, "#timeline tr.turn-row", 10).await;
        shot(&client, "session-1000-turns").await;
        let _ = writeln!(
            std::io::stderr(),
            "inspector: {SESSIONS} sessions listed in {} ms, a {LONG}-turn session drawn in {} ms \
             (headless Chromium, debug serve; measured, not asserted); its reads in ms: {reads:?}",
            list_paint.as_millis(),
            session_paint.as_millis()
        );
        client.close().await.unwrap();
    });
    drop(driver);
    assert_eq!(server.stop().code(), Some(0));
}
