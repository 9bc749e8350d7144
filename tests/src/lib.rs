//! Helpers for the end-to-end tests in `tests/tests/`: where the real built binaries and
//! plugin libraries are, temporary configurations, running `history-host` as a subprocess
//! and running a chain in-process through the real loader.
//!
//! The plugins must have been built and installed first: `cargo xtask test` does it
//! (`cargo xtask build` + `cargo test --workspace`).

pub mod anthropic_shape;
pub mod anthropic_upstream;
pub mod fixtures;
pub mod histories;
pub mod link;
pub mod responses_upstream;
pub mod server;
pub mod store;
pub mod upstream;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use history_engine::chain::stateless_context;
use history_engine::{load_chain, Call, ChainRun, PluginFailure};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The cargo target folder.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// `target/plugins`, where `cargo xtask build` installs the shipped plugins.
pub fn plugin_dir() -> PathBuf {
    let dir = target_dir().join("plugins");
    assert!(
        dir.join(history_engine::library_file_name("default")).exists(),
        "{} has no plugins: run the tests with `cargo xtask test` (or `cargo xtask build` first)",
        dir.display()
    );
    dir
}

/// The `history-host` binary built by `cargo xtask build`.
pub fn host_bin() -> PathBuf {
    let bin = target_dir()
        .join("debug")
        .join(format!("history-host{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is missing: run `cargo xtask test`",
        bin.display()
    );
    bin
}

/// The `agentctl` binary built by `cargo xtask build` (a second binary of history-host).
pub fn agentctl_bin() -> PathBuf {
    let bin = target_dir()
        .join("debug")
        .join(format!("agentctl{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is missing: run `cargo xtask test`",
        bin.display()
    );
    bin
}

/// Runs `agentctl --config CONFIG ARGS…` with `envs` set, collecting its output.
pub fn agentctl(config: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut command = Command::new(agentctl_bin());
    command
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("AGENTCTL_FAULT")
        .env_remove("HISTORY_LOG");
    for (key, value) in envs {
        command.env(key, value);
    }
    run_with_stdin(command, "")
}

/// `tests/data/real/`: real agent conversations written by others (see its SOURCES.md).
pub fn real_data_dir() -> PathBuf {
    workspace_root().join("tests/data/real")
}

/// Every real conversation: (name, JSON array text). `.jsonl` files give one per line.
pub fn real_conversations() -> Vec<(String, String)> {
    let mut conversations = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(real_data_dir())
        .expect("tests/data/real")
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") => conversations.push((name, text)),
            Some("jsonl") => {
                for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
                    conversations.push((format!("{name}:{}", i + 1), line.to_string()));
                }
            }
            _ => {}
        }
    }
    conversations
}

/// A configuration file in a fresh temporary folder (removed on drop).
pub struct TestConfig {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl TestConfig {
    /// Writes `plugins-enabled.toml` with `body`; unless `body` sets `plugin_dir`, it
    /// points at the installed plugins (`target/plugins`).
    pub fn new(body: &str) -> TestConfig {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugins-enabled.toml");
        let text = if body.contains("plugin_dir") {
            body.to_string()
        } else {
            format!("plugin_dir = {:?}\n{body}", plugin_dir().display().to_string())
        };
        std::fs::write(&path, text).unwrap();
        TestConfig { dir, path }
    }

    /// Runs `history-host process --config <this> ARGS…` with `stdin`.
    pub fn process(&self, args: &[&str], stdin: &str) -> Output {
        let mut command = Command::new(host_bin());
        command.arg("process").arg("--config").arg(&self.path).args(args);
        run_with_stdin(command, stdin)
    }

    /// Runs the chain in-process (real loading of the real libraries) on `history_json`
    /// with model `model` at `turn` (default: the number of user messages).
    pub fn run(&self, model: &str, history_json: &str, turn: Option<u64>) -> Result<ChainRun, PluginFailure> {
        let (config, _catalog, chain) = load_chain(&self.path).unwrap_or_else(|e| panic!("{e}"));
        let history = history_wire::chat::history_from_str(history_json).unwrap();
        let turn = history_engine::turns::current_turn(&history, turn);
        let ctx = stateless_context(&config, config.model(model), turn);
        chain.run(history, &ctx, Call::Process)
    }
}

impl TestConfig {
    /// Like [`TestConfig::run`], with the previous turn's output (JSON text) to compare
    /// against: the run reports `prefix_kept` (docs/plugins.md#token_budget).
    pub fn run_after(
        &self,
        model: &str,
        history_json: &str,
        previous_json: &str,
    ) -> Result<ChainRun, PluginFailure> {
        let (config, _catalog, chain) = load_chain(&self.path).unwrap_or_else(|e| panic!("{e}"));
        let history = history_wire::chat::history_from_str(history_json).unwrap();
        let previous = history_wire::chat::history_from_str(previous_json).unwrap();
        let turn = history_engine::turns::current_turn(&history, None);
        let ctx = stateless_context(&config, config.model(model), turn);
        chain.run_compared(history, &ctx, Call::Process, Some(&previous))
    }
}

/// Runs a command with `stdin`, collecting its output.
pub fn run_with_stdin(command: Command, stdin: &str) -> Output {
    run_with_stdin_to(command, stdin, Stdio::piped())
}

/// [`run_with_stdin`] with the child's stdout going to `stdout` (a file, a closed pipe…).
pub fn run_with_stdin_to(mut command: Command, stdin: &str, stdout: Stdio) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_string();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(stdin.as_bytes());
    });
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap();
    output
}

/// A history as JSON values (for comparing outputs).
/// Runs the Python client `tests/py/SCRIPT` in the tests' virtualenv (`target/py`, which
/// `cargo xtask test` makes with the real `openai`, `anthropic` and `mcp` packages), `spec`
/// on its stdin; the JSON it prints.
pub fn python_client(script: &str, spec: &serde_json::Value) -> serde_json::Value {
    use std::io::Write;
    let python = target_dir().join("py").join("bin").join("python");
    assert!(
        python.exists(),
        "{} is missing: run the tests with `cargo xtask test` (it creates target/py with the Python clients)",
        python.display()
    );
    let mut child = std::process::Command::new(python)
        .arg(workspace_root().join("tests/py").join(script))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(spec.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{script} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The messages of a chain run as JSON values.
pub fn run_json(run: &ChainRun) -> serde_json::Value {
    json(&history_wire::chat::history_to_string(&run.history))
}

/// Stdout and stderr of a finished command, for assertion messages.
pub fn describe(output: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
