//! What `history-bench serve` and `history-bench proxy` share: a real `history-host serve`
//! process on a free loopback port (started, its peak memory read, stopped with SIGTERM),
//! its configuration, a pooled HTTP client, and the figures of a latency sample.
//! Traffic goes to 127.0.0.1 only.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use crate::Result;

/// The full chain of docs/configuration.md, in order; a bench runs the part installed.
pub const FULL_CHAIN: [&str; 5] = [
    "default",
    "tool_result_filter",
    "retention",
    "token_budget",
    "role_pair",
];

/// Which chain a `serve` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chain {
    /// The shipped chain, as installed in the plugin folder.
    Shipped,
    /// The floor: one stage that does no work — the `floor` fixture built under the name
    /// `default` (a configured chain must start with `default`), in a folder of its own.
    /// What the service costs around a chain. One stage, not one per shipped stage (a
    /// configured chain refuses a name twice); a stage's own cost is microseconds
    /// (`cargo xtask bench`'s floor).
    Floor,
}

impl Chain {
    pub fn name(self) -> &'static str {
        match self {
            Chain::Shipped => "chain",
            Chain::Floor => "floor",
        }
    }
}

/// The stages of the shipped chain installed in `plugin_dir`.
pub fn shipped_stages(plugin_dir: &Path) -> Result<Vec<String>> {
    let stages: Vec<String> = FULL_CHAIN
        .iter()
        .filter(|name| {
            plugin_dir
                .join(plugin_api::naming::library_file_name(name))
                .exists()
        })
        .map(|name| name.to_string())
        .collect();
    if stages.first().map(String::as_str) != Some("default") {
        return Err(format!(
            "{} has no default plugin: run the bench with `cargo xtask bench serve|proxy`",
            plugin_dir.display()
        ));
    }
    Ok(stages)
}

/// Writes the configuration of a bench `serve` into `dir`, the plugin folder (the shipped
/// defaults' window, o200k_base, failing on any plugin fault so a fault cannot flatter a
/// figure); its path.
pub fn write_config(dir: &Path, stages: &[String], label: &str, top_level: &str) -> Result<PathBuf> {
    let list = stages
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let text = format!(
        "# Written by `cargo xtask bench serve|proxy`.\n\
         plugin_dir = \".\"\n\
         max_users = 1000000\n\
         session_idle_timeout_minutes = 0\n\
         {top_level}\n\
         [history]\n\
         agent_max_ctx = 200\n\
         chain = [{list}]\n\
         on_plugin_error = \"fail\"\n\n\
         [models.default]\n\
         max_context = 200\n\
         context_tokens = 128000\n\
         tokenizer = \"o200k_base\"\n"
    );
    let file = dir.join(format!("bench-{label}.toml"));
    std::fs::write(&file, text).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    Ok(file)
}

/// A running `history-host serve`; SIGKILLed if dropped without [`Serve::stop`].
pub struct Serve {
    child: Child,
    pub addr: String,
    log: PathBuf,
}

impl Serve {
    /// Starts `HOST serve --config CONFIG --listen 127.0.0.1:0 ARGS…`, its log in `log`,
    /// and waits for its `listening on ADDR` line.
    pub fn start(host: &Path, config: &Path, args: &[&str], log: &Path) -> Result<Serve> {
        Serve::start_under(&[], host, config, args, log)
    }

    /// [`Serve::start`] with the host run by `wrapper` (a command and its arguments, e.g.
    /// `valgrind --tool=callgrind`; none when empty).
    pub fn start_under(
        wrapper: &[&str],
        host: &Path,
        config: &Path,
        args: &[&str],
        log: &Path,
    ) -> Result<Serve> {
        let stderr = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut command = match wrapper.split_first() {
            Some((program, wrapper_args)) => {
                let mut command = Command::new(program);
                command.args(wrapper_args).arg(host);
                command
            }
            None => Command::new(host),
        };
        let mut child = command
            .arg("serve")
            .arg("--config")
            .arg(config)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("HISTORY_OPERATOR_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot run {} {}: {e}", wrapper.join(" "), host.display()))?;
        let mut line = String::new();
        let _ = BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line);
        let Some(addr) = line.trim().strip_prefix("listening on ") else {
            let status = child.wait().map_err(|e| e.to_string())?;
            return Err(format!("serve did not start ({status}): {}", last_lines(log, 3)));
        };
        Ok(Serve {
            addr: addr.to_string(),
            child,
            log: log.to_path_buf(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The process's peak resident set so far, in MB (VmHWM from /proc/PID/status).
    pub fn peak_rss_mb(&self) -> Result<f64> {
        let file = format!("/proc/{}/status", self.child.id());
        let status = std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .ok_or(format!("{file} has no VmHWM"))
    }

    /// SIGTERM, then the exit (the service finishes running turns and exits 0).
    pub fn stop(mut self) -> Result<()> {
        // SAFETY: a signal to our own child, which has not been reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                return if status.success() {
                    Ok(())
                } else {
                    Err(format!(
                        "serve exited with {status}: {}",
                        last_lines(&self.log, 3)
                    ))
                };
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return Err("serve did not stop within 30 s of SIGTERM".to_string());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn last_lines(file: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// A pooled HTTP/1.1 client (keep-alive, no Nagle delay).
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn http_client(connections: usize) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(connections)
        .build(connector)
}

/// One request's answer: status and the whole body.
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The status and the start of the body, for an error line.
    pub fn describe(&self) -> String {
        let text = String::from_utf8_lossy(&self.body[..self.body.len().min(300)]).into_owned();
        format!("status {}: {text}", self.status)
    }
}

pub async fn request(client: &HttpClient, method: Method, url: &str, body: Bytes) -> Result<Answer> {
    let request = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let response = client.request(request).await.map_err(|e| format!("{url}: {e}"))?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{url}: {e}"))?
        .to_bytes();
    Ok(Answer { status, body })
}

/// A metric's value in a Prometheus text page (`name` with its labels, as printed).
pub fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|value| value.trim().parse().ok())
}

/// p50, p99 and max of a sample, in milliseconds.
pub fn latency(samples: &[Duration]) -> Value {
    json!({
        "p50_ms": round(ms(crate::quantile(samples, 0.50)), 3),
        "p99_ms": round(ms(crate::quantile(samples, 0.99)), 3),
        "max_ms": round(ms(crate::quantile(samples, 1.0)), 3),
    })
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Rounds for the report (figures are not more precise than this).
pub fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

/// The 1-minute load average and the CPUs (Linux; `null` elsewhere).
pub fn machine() -> Value {
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<f64>().ok());
    json!({
        "load_average": load,
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
    })
}
