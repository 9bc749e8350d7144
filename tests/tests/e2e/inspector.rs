//! The inspector page at `/ui` (docs/http-api.md#the-inspector-page) in a real headless
//! Chromium, driven over WebDriver (fantoccini) through Debian's chromedriver, against a
//! real `serve` on loopback. Without chromedriver the test says `SKIPPED (no
//! chromedriver)` and passes, except under CI, where it fails. Screenshots go to
//! `target/ui-screenshots/`.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use e2e_tests::server::{agent, shipped_config, Server};
use e2e_tests::store::{in_ci, Kind, TestStore};
use e2e_tests::target_dir;
use e2e_tests::upstream::{Behaviour, Upstream};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const TOKEN: &str = "inspector-operator-token";
/// Every wait on the page: the page polls every 3 s, a render takes far less.
const WAIT: Duration = Duration::from_secs(20);
const TURNS: usize = 40;
const SCRIPT_TEXT: &str = "Please repeat this verbatim: <script>alert(1)</script>";

/// chromedriver on a free loopback port, killed when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Driver {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {CHROMEDRIVER}: {e}"));
        let driver = Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let started = Instant::now();
        loop {
            let ready = agent()
                .get(&format!("{}/status", driver.url))
                .call()
                .ok()
                .and_then(|r| r.into_string().ok())
                .and_then(|text| serde_json::from_str::<Value>(&text).ok())
                .is_some_and(|v| v["value"]["ready"] == true);
            if ready {
                return driver;
            }
            assert!(started.elapsed() < WAIT, "chromedriver not ready after {WAIT:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether chromedriver is here; without it the test is skipped, saying so, except in CI.
fn have_chromedriver(test: &str) -> bool {
    if Path::new(CHROMEDRIVER).exists() {
        return true;
    }
    assert!(
        !in_ci(),
        "{CHROMEDRIVER} is missing and CI is set: {test} cannot be skipped in CI \
         (.ci/run installs Debian's chromium and chromium-driver)"
    );
    let _ = writeln!(std::io::stderr(), "SKIPPED (no chromedriver): {test}");
    false
}

/// The original content of turn `n`'s tool result.
fn tool_output(n: usize) -> String {
    format!("contents of file{n}.txt: {}", "line of source text; ".repeat(20))
}

/// Turn `n`'s messages: a user request, a tool call, its result, an answer. The last
/// turn's request carries a `<script>` element as text.
fn turn_messages(n: usize) -> Vec<Value> {
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

fn screenshots() -> PathBuf {
    let dir = target_dir().join("ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn shot(client: &Client, name: &str) {
    let png = client.screenshot().await.unwrap();
    std::fs::write(screenshots().join(format!("{name}.png")), png).unwrap();
}

async fn text_of(client: &Client, css: &str) -> String {
    let element = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css} within {WAIT:?}: {e}"));
    element.text().await.unwrap()
}

/// Waits until `css` matches `count` elements.
async fn wait_count(client: &Client, css: &str, count: usize) {
    let started = Instant::now();
    loop {
        let found = client.find_all(Locator::Css(css)).await.unwrap().len();
        if found == count {
            return;
        }
        assert!(
            started.elapsed() < WAIT,
            "{css}: {found} elements after {WAIT:?}, expected {count}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn browser(driver: &Driver) -> Client {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".to_string(),
        json!({"args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
            "--disable-gpu", "--window-size=1400,1100"]}),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .unwrap_or_else(|e| panic!("no Chromium session from chromedriver: {e}"))
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
        client
            .find(Locator::Css("#token"))
            .await
            .unwrap()
            .send_keys(TOKEN)
            .await
            .unwrap();
        client
            .find(Locator::Css("#token-form button[type=submit]"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
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
        client
            .find(Locator::Css("#token"))
            .await
            .unwrap()
            .send_keys(TOKEN)
            .await
            .unwrap();
        client
            .find(Locator::Css("#token-form button[type=submit]"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
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
