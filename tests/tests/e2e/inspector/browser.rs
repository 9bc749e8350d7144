//! Headless Chromium for the inspector's tests: Debian's chromedriver on a free loopback
//! port, a WebDriver client (fantoccini) over plain HTTP, bounded waits, screenshots into
//! `target/ui-screenshots/`.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use e2e_tests::server::agent;
use e2e_tests::store::in_ci;
use e2e_tests::target_dir;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

pub(super) const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// Every wait on the page: the page polls every 3 s, a render takes far less.
pub(super) const WAIT: Duration = Duration::from_secs(20);

/// chromedriver on a free loopback port, killed when dropped.
pub(super) struct Driver {
    child: Child,
    pub(super) url: String,
}

impl Driver {
    pub(super) fn start() -> Driver {
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
pub(super) fn have_chromedriver(test: &str) -> bool {
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

pub(super) fn screenshots() -> PathBuf {
    let dir = target_dir().join("ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub(super) async fn shot(client: &Client, name: &str) {
    let png = client.screenshot().await.unwrap();
    std::fs::write(screenshots().join(format!("{name}.png")), png).unwrap();
}

pub(super) async fn text_of(client: &Client, css: &str) -> String {
    let element = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css} within {WAIT:?}: {e}"));
    element.text().await.unwrap()
}

/// Waits until `css` matches `count` elements.
pub(super) async fn wait_count(client: &Client, css: &str, count: usize) {
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

/// Gives the page the operator token through its form, as an operator does once.
pub(super) async fn enter_token(client: &Client) {
    client
        .find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(super::TOKEN)
        .await
        .unwrap();
    client
        .find(Locator::Css("#token-form button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

pub(super) async fn browser(driver: &Driver) -> Client {
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
