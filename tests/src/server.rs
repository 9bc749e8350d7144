//! A real `history-host serve` process for the session service's tests: started on a free
//! loopback port with a temporary store, driven with a real HTTP client (`ureq`), stopped
//! with SIGTERM or killed with SIGKILL. Traffic goes to 127.0.0.1 only.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{host_bin, plugin_dir, workspace_root, TestConfig};

/// The shipped configuration pointed at the installed plugins, failing on any plugin
/// fault, with `extra` (top-level keys) put first and each `(prefix, line)` replacing the
/// line that starts with `prefix`.
pub fn shipped_config(extra: &str, replace: &[(&str, &str)]) -> TestConfig {
    let shipped = std::fs::read_to_string(workspace_root().join("plugins-enabled.toml")).unwrap();
    let mut text = String::from(extra);
    text.push('\n');
    for line in shipped.lines() {
        let line = if line.starts_with("plugin_dir") {
            format!("plugin_dir = {:?}", plugin_dir().display().to_string())
        } else if line.starts_with("on_plugin_error") {
            "on_plugin_error = \"fail\"".to_string()
        } else if let Some((_, with)) = replace.iter().find(|(prefix, _)| line.starts_with(prefix)) {
            with.to_string()
        } else {
            line.to_string()
        };
        text.push_str(&line);
        text.push('\n');
    }
    TestConfig::new(&text)
}

/// The shipped chain on a small window (`agent_max_ctx = 12`), so a long conversation
/// gets trimmed, with `tables` (TOML tables, e.g. `[ui]`) added at the end.
pub fn small_window(tables: &str) -> TestConfig {
    let config = shipped_config("", &[("agent_max_ctx", "agent_max_ctx = 12")]);
    if !tables.is_empty() {
        let mut text = std::fs::read_to_string(&config.path).unwrap();
        text.push('\n');
        text.push_str(tables);
        std::fs::write(&config.path, text).unwrap();
    }
    config
}

/// `serve --upstream UPSTREAM` on a free loopback port (the proxy's tests), its store in
/// the configuration's folder.
pub fn start_proxy(config: &TestConfig, upstream: &str) -> Server {
    start_proxy_with(config, upstream, &[])
}

/// [`start_proxy`] with `env` set.
pub fn start_proxy_with(config: &TestConfig, upstream: &str, env: &[(&str, &str)]) -> Server {
    let store = config.dir.path().join("sessions.db");
    Server::try_start(
        &config.path,
        &store,
        env,
        &["--listen", "127.0.0.1:0", "--upstream", upstream],
    )
    .unwrap_or_else(|e| panic!("serve did not start: {e}"))
}

/// A running `history-host serve`.
pub struct Server {
    child: Option<Child>,
    pub addr: String,
    pub config: PathBuf,
    pub store: PathBuf,
    stderr: Arc<Mutex<String>>,
    agent: ureq::Agent,
    pub token: Option<String>,
}

/// An HTTP answer: status and body (JSON when it parses, else a string value).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Answer {
    /// The error's `code` and `message`, for error answers.
    pub fn error(&self) -> (&str, &str) {
        (
            self.body["error"]["code"].as_str().unwrap_or(""),
            self.body["error"]["message"].as_str().unwrap_or(""),
        )
    }
}

impl Server {
    /// Starts `serve --config CONFIG --listen 127.0.0.1:0 --store STORE` with `envs`, and
    /// waits for its `listening on ADDR` line.
    pub fn start(config: &Path, store: &Path, envs: &[(&str, &str)]) -> Server {
        Server::try_start(config, store, envs, &["--listen", "127.0.0.1:0"])
            .unwrap_or_else(|e| panic!("serve did not start: {e}"))
    }

    /// Like [`Server::start`], the process's `RLIMIT_NOFILE` set to `nofile` (soft and
    /// hard) by util-linux's `prlimit`, which execs `serve` in its place.
    pub fn start_with_nofile(config: &Path, store: &Path, nofile: u64) -> Server {
        let mut command = Command::new("prlimit");
        command.arg(format!("--nofile={nofile}:{nofile}")).arg(host_bin());
        Server::launch(command, config, store, &[], &["--listen", "127.0.0.1:0"])
            .unwrap_or_else(|e| panic!("serve did not start under prlimit: {e}"))
    }

    /// Like [`Server::start`] with other arguments; `Err(stderr)` when it exits instead.
    pub fn try_start(
        config: &Path,
        store: &Path,
        envs: &[(&str, &str)],
        args: &[&str],
    ) -> Result<Server, String> {
        Server::launch(Command::new(host_bin()), config, store, envs, args)
    }

    fn launch(
        mut command: Command,
        config: &Path,
        store: &Path,
        envs: &[(&str, &str)],
        args: &[&str],
    ) -> Result<Server, String> {
        command
            .arg("serve")
            .arg("--config")
            .arg(config)
            .arg("--store")
            .arg(store)
            .args(args)
            .env_remove("HISTORY_OPERATOR_TOKEN")
            .env_remove("HISTORY_SESSION_TIMEOUT_SECONDS")
            .env("HISTORY_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut token = None;
        for (key, value) in envs {
            command.env(key, value);
            if *key == "HISTORY_OPERATOR_TOKEN" {
                token = Some(value.to_string());
            }
        }
        let mut child = command.spawn().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        {
            let mut pipe = child.stderr.take().unwrap();
            let stderr = stderr.clone();
            std::thread::spawn(move || {
                let mut buffer = [0u8; 8192];
                while let Ok(n) = pipe.read(&mut buffer) {
                    if n == 0 {
                        break;
                    }
                    stderr
                        .lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buffer[..n]));
                }
            });
        }
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let _ = stdout.read_line(&mut line);
        let Some(addr) = line.trim().strip_prefix("listening on ") else {
            let status = child.wait().unwrap();
            std::thread::sleep(Duration::from_millis(100));
            return Err(format!("status {:?}: {}", status.code(), stderr.lock().unwrap()));
        };
        let addr = addr.to_string();
        assert!(addr.starts_with("127.0.0.1:"), "{addr}");
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = stdout.read_to_string(&mut rest);
        });
        Ok(Server {
            child: Some(child),
            addr,
            config: config.to_path_buf(),
            store: store.to_path_buf(),
            stderr,
            agent: agent(),
            token,
        })
    }

    /// What the server wrote on stderr so far.
    /// A raw POST of `body` (any bytes) to `path` with `headers`: the status, the headers
    /// (names in lower case) and the body's text, whatever the status.
    pub fn post_raw(
        &self,
        path: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> (u16, Vec<(String, String)>, String) {
        let mut request = agent()
            .post(&self.url(path))
            .set("Content-Type", "application/json");
        for (name, value) in headers {
            request = request.set(name, value);
        }
        let response = match request.send_string(body) {
            Ok(response) => response,
            Err(ureq::Error::Status(_, response)) => response,
            Err(e) => panic!("transport error: {e}"),
        };
        let headers = response
            .headers_names()
            .iter()
            .map(|n| {
                (
                    n.to_ascii_lowercase(),
                    response.header(n).unwrap_or("").to_string(),
                )
            })
            .collect();
        (response.status(), headers, response.into_string().unwrap())
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The server's stderr from byte `from` on, once it holds `needle` or 10 s have passed:
    /// a line logged just before an answer may reach the reading thread just after it.
    pub fn stderr_once(&self, from: usize, needle: &str) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let log = self.stderr()[from..].to_string();
            if log.contains(needle) || std::time::Instant::now() >= deadline {
                return log;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A request; `auth` sends the operator's token.
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>, auth: bool) -> Answer {
        request(
            &self.agent,
            method,
            &self.url(path),
            body,
            auth.then_some(self.token.as_deref()).flatten(),
        )
    }

    pub fn post(&self, path: &str, body: &Value) -> Answer {
        self.request("POST", path, Some(body), false)
    }

    pub fn get(&self, path: &str) -> Answer {
        self.request("GET", path, None, false)
    }

    /// Creates a session on `model`; returns its id.
    pub fn create(&self, model: &str) -> String {
        let answer = self.post("/v1/sessions", &serde_json::json!({ "model": model }));
        assert_eq!(answer.status, 201, "{answer:?}");
        answer.body["id"].as_str().unwrap().to_string()
    }

    /// The whole transcript of a session.
    pub fn transcript(&self, id: &str) -> Vec<Value> {
        let mut messages = Vec::new();
        let mut from = 1;
        loop {
            let answer = self.get(&format!("/v1/sessions/{id}/transcript?from={from}"));
            assert_eq!(answer.status, 200, "{answer:?}");
            messages.extend(answer.body["messages"].as_array().unwrap().iter().cloned());
            match answer.body["next"].as_u64() {
                Some(next) => from = next,
                None => return messages,
            }
        }
    }

    /// The working history (or with `sent`, the last sent one).
    pub fn history(&self, id: &str, sent: bool) -> Value {
        let view = if sent { "?view=sent" } else { "" };
        let answer = self.get(&format!("/v1/sessions/{id}/history{view}"));
        assert_eq!(answer.status, 200, "{answer:?}");
        answer.body["history"].clone()
    }

    /// The value of metric `name` on `/metrics` (labels included as it writes them:
    /// `name{label="value"}`).
    pub fn metric(&self, name: &str) -> u64 {
        let text = self.get("/metrics").body;
        let text = text.as_str().expect("/metrics is text");
        text.lines()
            .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// SIGTERM, then waits (at most 30 s) for the exit status.
    pub fn stop(mut self) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        signal(child.id(), "TERM");
        wait_at_most(&mut child, Duration::from_secs(30))
    }

    /// SIGKILL (`kill -9`), then reaps the process.
    pub fn kill9(mut self) {
        let mut child = self.child.take().unwrap();
        let _ = child.kill();
        let _ = child.wait();
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sends `SIG<name>` to process `pid`.
pub fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

fn wait_at_most(child: &mut Child, limit: Duration) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("the process did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An HTTP client with bounded timeouts.
pub fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(5))
        .timeout(Duration::from_secs(60))
        .build()
}

/// One request with `agent`; any status is an [`Answer`]. A transport error (e.g. the
/// server was killed) is status 0 with the error as the body.
pub fn request(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    body: Option<&Value>,
    token: Option<&str>,
) -> Answer {
    let mut request = agent.request(method, url);
    if let Some(token) = token {
        request = request.set("Authorization", &format!("Bearer {token}"));
    }
    let result = match body {
        Some(body) => request
            .set("Content-Type", "application/json")
            .send_string(&body.to_string()),
        None => request.call(),
    };
    let response = match result {
        Ok(response) => response,
        Err(ureq::Error::Status(_, response)) => response,
        Err(e) => {
            return Answer {
                status: 0,
                body: Value::String(e.to_string()),
            }
        }
    };
    let status = response.status();
    let text = response.into_string().unwrap_or_default();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Answer { status, body }
}

/// A conversation split into turns: each turn starts at a user message (messages before
/// the first user message go with it).
pub fn split_turns(conversation: &Value) -> Vec<Vec<Value>> {
    let mut turns: Vec<Vec<Value>> = Vec::new();
    let mut current = Vec::new();
    let mut seen_user = false;
    for message in conversation.as_array().unwrap() {
        if message["role"] == "user" && seen_user {
            turns.push(std::mem::take(&mut current));
        }
        if message["role"] == "user" {
            seen_user = true;
        }
        current.push(message.clone());
    }
    if !current.is_empty() {
        turns.push(current);
    }
    turns
}

/// `message` with the host's stamps taken from `stored` (`metadata.id`, `timestamp`,
/// `turn_added`): what the transcript must hold for what was sent.
pub fn with_stamps(message: &Value, stored: &Value) -> Value {
    let mut expected = message.clone();
    let object = expected.as_object_mut().unwrap();
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Default::default()));
    if metadata.is_null() {
        *metadata = Value::Object(Default::default());
    }
    let metadata = metadata.as_object_mut().unwrap();
    for key in ["id", "timestamp", "turn_added"] {
        if key == "id" && metadata.contains_key("id") {
            continue;
        }
        metadata.insert(key.to_string(), stored["metadata"][key].clone());
    }
    expected
}
