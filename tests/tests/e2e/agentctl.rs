//! `agentctl` as a subprocess (docs/cli.md#agentctl): every command against an operator's file full
//! of comments and odd formatting, asserting the exact resulting text; every refusal
//! (non-zero exit, one line, file byte-for-byte unchanged); a plugin added with agentctl
//! then running in `history-host process`; an interrupted write; the JSON outputs.
//!
//! The chain edits need plugins besides `default`: two fixture plugins are scaffolded with
//! `xtask new-plugin` and built once per run into the fixtures' target folder
//! (`target/fixtures`, where the other fixture plugins' dependencies are already built),
//! then installed with a copy of the real `default` in `target/agentctl-fixtures/plugins`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use e2e_tests::fixtures::{cargo_in_fixture_target, fixture_target};
use e2e_tests::{agentctl, describe, json, plugin_dir, target_dir, workspace_root};

use history_engine::library_file_name as library_file;

fn run_ok(command: &mut Command) {
    let output = command.output().unwrap();
    assert!(output.status.success(), "{command:?}\n{}", describe(&output));
}

/// Where the fixture plugins are built.
fn fixture_build() -> PathBuf {
    fixture_target().join("debug")
}

/// A plugin folder with `default`, `fixture_a` and `fixture_b` (scaffolded plugins that
/// pass the history through and log `fixture_a: N messages at turn T`). `fixture_fault`,
/// whose `process` always fails, is built too (see [`fixture_build`]) but not installed here.
fn fixture_plugins() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = target_dir().join("agentctl-fixtures");
        let plugins = root.join("plugins");
        let _ = std::fs::remove_dir_all(&plugins);
        std::fs::create_dir_all(&plugins).unwrap();
        std::fs::copy(
            plugin_dir().join(library_file("default")),
            plugins.join(library_file("default")),
        )
        .unwrap();
        for name in ["fixture_a", "fixture_b", "fixture_fault"] {
            let source = root.join("src").join(name);
            let _ = std::fs::remove_dir_all(&source);
            // The built xtask itself: no cargo run, no wait on the main target folder.
            let xtask = target_dir()
                .join("debug")
                .join(format!("xtask{}", std::env::consts::EXE_SUFFIX));
            run_ok(
                Command::new(xtask)
                    .args(["new-plugin", name, "--dir"])
                    .arg(&source),
            );
            if name == "fixture_fault" {
                let lib = source.join("src/lib.rs");
                let code = std::fs::read_to_string(&lib).unwrap();
                let passthrough = "Ok(Output::unchanged(history))";
                assert!(
                    code.contains(passthrough),
                    "the scaffold changed: {}",
                    lib.display()
                );
                let failing = "Err(format!(\"fixture_fault refuses {} messages\", history.len()))";
                std::fs::write(&lib, code.replace(passthrough, failing)).unwrap();
            }
            // With the workspace's lock file: the same dependency versions, no resolution.
            cargo_in_fixture_target(&source.join("Cargo.toml"), &["build", "--quiet"]);
            if name != "fixture_fault" {
                std::fs::copy(
                    fixture_build().join(library_file(name)),
                    plugins.join(library_file(name)),
                )
                .unwrap();
            }
        }
        plugins
    })
}

/// An operator's configuration: comments everywhere, odd spacing, a multi-line chain.
const OPERATOR: &str = r#"# Operator's chain configuration: hand edited, keep the comments!
plugin_dir = "@DIR@"   # the fixtures

max_users=50 # simultaneous sessions
  session_idle_timeout_minutes   =   60   # an hour

[history]  # the chain and its window
# the agent-wide ceiling
agent_max_ctx    = 200        # messages
chain = [
    "default",     # always first
    # experiments below
    "fixture_a",   # the a
]
on_plugin_error = 'skip'

[models.local-8k]   # a small model
max_context=16

[plugin.default]
pin_system = true  # keep the system prompt
"#;

/// A configuration file in a fresh folder, pointing at the fixture plugins.
struct Operator {
    _dir: tempfile::TempDir,
    path: PathBuf,
    original: String,
}

impl Operator {
    fn new(text: &str) -> Operator {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugins-enabled.toml");
        let text = text.replace("@DIR@", &fixture_plugins().display().to_string());
        std::fs::write(&path, &text).unwrap();
        Operator {
            _dir: dir,
            path,
            original: text,
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        agentctl(&self.path, args, &[])
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.path).unwrap()
    }

    /// Runs an edit that must succeed and returns the new file text.
    fn edit(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(output.status.success(), "{args:?}: {}", describe(&output));
        self.text()
    }

    /// Runs an edit that must be refused: non-zero exit, exactly one line on stderr
    /// containing `message`, nothing on stdout, the file byte-for-byte unchanged.
    fn refused(&self, args: &[&str], message: &str) {
        let output = self.run(args);
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        assert!(
            !output.status.success(),
            "{args:?} was not refused: {}",
            describe(&output)
        );
        assert_eq!(stderr.lines().count(), 1, "{args:?}: not one line: {stderr}");
        assert!(stderr.starts_with("agentctl: "), "{args:?}: {stderr}");
        assert!(
            stderr.contains(message),
            "{args:?}: expected {message:?} in: {stderr}"
        );
        assert!(output.stdout.is_empty(), "{args:?}: {}", describe(&output));
        assert_eq!(
            std::fs::read(&self.path).unwrap(),
            self.original.as_bytes(),
            "{args:?} changed the file"
        );
    }

    /// The original text with `from` replaced by `to` (exactly once).
    fn expected(&self, from: &str, to: &str) -> String {
        assert_eq!(self.original.matches(from).count(), 1, "{from:?}");
        self.original.replace(from, to)
    }
}

#[test]
fn chain_add_appends_keeping_the_layout_and_comments() {
    let op = Operator::new(OPERATOR);
    let text = op.edit(&["history-chain-add", "fixture_b"]);
    assert_eq!(
        text,
        op.expected(
            "    \"fixture_a\",   # the a\n]",
            "    \"fixture_a\",   # the a\n    \"fixture_b\",\n]"
        )
    );
    let stdout = String::from_utf8_lossy(&op.run(&["history-list"]).stdout).to_string();
    assert!(stdout.contains("  2  fixture_b"), "{stdout}");
}

#[test]
fn chain_add_at_a_position_inserts_there() {
    let op = Operator::new(OPERATOR);
    let text = op.edit(&["history-chain-add", "fixture_b", "--at", "1"]);
    assert_eq!(
        text,
        op.expected(
            "    \"default\",     # always first\n    # experiments below\n",
            "    \"default\",     # always first\n    \"fixture_b\",\n    # experiments below\n"
        )
    );
}

#[test]
fn chain_move_moves_the_entry_with_its_comment() {
    let op = Operator::new(&OPERATOR.replace(
        "    \"fixture_a\",   # the a\n",
        "    \"fixture_a\",   # the a\n    \"fixture_b\",   # the b\n",
    ));
    let text = op.edit(&["history-chain-move", "fixture_b", "1"]);
    assert_eq!(
        text,
        op.expected(
            "    \"default\",     # always first\n    # experiments below\n    \"fixture_a\",   # the a\n    \"fixture_b\",   # the b\n",
            "    \"default\",     # always first\n    \"fixture_b\",   # the b\n    # experiments below\n    \"fixture_a\",   # the a\n"
        )
    );
    // Moving back restores the order (the comment line stays where the operator put it).
    let op2 = Operator::new(&text.replace(&fixture_plugins().display().to_string(), "@DIR@"));
    let back = op2.edit(&["history-chain-move", "fixture_b", "2"]);
    assert_eq!(
        back,
        op2.expected(
            "    \"fixture_b\",   # the b\n    # experiments below\n    \"fixture_a\",   # the a\n",
            "    # experiments below\n    \"fixture_a\",   # the a\n    \"fixture_b\",   # the b\n"
        )
    );
}

#[test]
fn chain_remove_removes_only_the_entry_line() {
    let op = Operator::new(OPERATOR);
    let text = op.edit(&["history-chain-remove", "fixture_a"]);
    assert_eq!(text, op.expected("    \"fixture_a\",   # the a\n", ""));
}

#[test]
fn single_line_chains_stay_on_one_line() {
    let op = Operator::new(&OPERATOR.replace(
        "chain = [\n    \"default\",     # always first\n    # experiments below\n    \"fixture_a\",   # the a\n]\n",
        "chain = [ \"default\",\"fixture_a\" ]   # one line\n",
    ));
    let text = op.edit(&["history-chain-add", "fixture_b", "--at", "1"]);
    assert_eq!(
        text,
        op.expected(
            "[ \"default\",\"fixture_a\" ]",
            "[ \"default\",\"fixture_b\",\"fixture_a\" ]"
        )
    );
}

#[test]
fn settings_change_only_their_value() {
    let op = Operator::new(OPERATOR);
    let text = op.edit(&["history-maxctx", "150"]);
    assert_eq!(
        text,
        op.expected(
            "agent_max_ctx    = 200        # messages",
            "agent_max_ctx    = 150        # messages"
        )
    );

    let op = Operator::new(OPERATOR);
    let text = op.edit(&["max-users", "80"]);
    assert_eq!(
        text,
        op.expected("max_users=50 # simultaneous", "max_users=80 # simultaneous")
    );

    let op = Operator::new(OPERATOR);
    let text = op.edit(&["session-timeout", "0"]);
    assert_eq!(
        text,
        op.expected(
            "  session_idle_timeout_minutes   =   60   # an hour",
            "  session_idle_timeout_minutes   =   0   # an hour"
        )
    );
    let output = op.run(&["session-timeout", "0"]);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("unchanged"),
        "{}",
        describe(&output)
    );
}

#[test]
fn missing_keys_are_inserted_in_their_table() {
    let bare = "# minimal\nplugin_dir = \"@DIR@\"\n\n# the models\n[models.m]\nmax_context = 10\n";
    let op = Operator::new(bare);
    let text = op.edit(&["history-maxctx", "9"]);
    assert_eq!(
        text,
        op.expected(
            "\n\n# the models\n",
            "\n\n[history]\nagent_max_ctx = 9\n\n# the models\n"
        )
    );
    let op = Operator::new(bare);
    let text = op.edit(&["history-chain-add", "fixture_a"]);
    assert_eq!(
        text,
        op.expected(
            "\n\n# the models\n",
            "\n\n[history]\nchain = [\"default\", \"fixture_a\"]\n\n# the models\n"
        )
    );
    let op = Operator::new(bare);
    let text = op.edit(&["max-users", "3"]);
    let dir_line = format!("plugin_dir = \"{}\"\n", fixture_plugins().display());
    assert_eq!(
        text,
        op.expected(&dir_line, &format!("{dir_line}max_users = 3\n"))
    );
}

#[test]
fn refusals_leave_the_file_untouched() {
    let op = Operator::new(OPERATOR);
    op.refused(
        &["history-chain-add", "nope"],
        "unknown plugin \"nope\": no library in",
    );
    op.refused(
        &["history-chain-add", "nope"],
        "(available: default, fixture_a, fixture_b)",
    );
    op.refused(
        &["history-chain-add", "fixture_a"],
        "plugin \"fixture_a\" is already in the chain, at position 1",
    );
    op.refused(
        &["history-chain-add", "default"],
        "already in the chain, at position 0",
    );
    op.refused(
        &["history-chain-remove", "default"],
        "\"default\" cannot be removed: it is always first",
    );
    op.refused(
        &["history-chain-move", "default", "1"],
        "\"default\" cannot be moved: it is always first",
    );
    op.refused(
        &["history-chain-add", "fixture_b", "--at", "0"],
        "--at 0 is default's",
    );
    op.refused(
        &["history-chain-add", "fixture_b", "--at", "3"],
        "--at 3 is out of range: the chain is default, fixture_a (2 plugins), positions run from 1 (right after default) to 2",
    );
    op.refused(
        &["history-chain-move", "fixture_a", "0"],
        "position 0 is default's",
    );
    op.refused(
        &["history-chain-move", "fixture_a", "2"],
        "position 2 is out of range",
    );
    op.refused(
        &["history-chain-remove", "fixture_b"],
        "plugin \"fixture_b\" is not in the chain (chain: default, fixture_a)",
    );
    op.refused(&["history-chain-add", "../evil"], "is not a plugin name");
    op.refused(
        &["history-maxctx", "0"],
        "history-maxctx 0: agent_max_ctx must be at least 1",
    );
    op.refused(&["max-users", "0"], "max-users 0: max_users must be at least 1");
    op.refused(
        &["history-maxctx", "lots"],
        "history-maxctx N must be a whole number, got \"lots\"",
    );
    op.refused(
        &["session-timeout", "-5"],
        "session-timeout MINUTES must be a whole number, got \"-5\"",
    );
    assert_eq!(temporaries(op.path.parent().unwrap()), Vec::<String>::new());
}

#[test]
fn an_edit_the_plugins_reject_is_refused() {
    // default's target_messages must stay below every model's window: lowering the
    // ceiling under it is refused by the plugin's own validation, before writing.
    let op = Operator::new(&OPERATOR.replace(
        "pin_system = true  # keep the system prompt\n",
        "pin_system = true  # keep the system prompt\ntarget_messages = 12\n",
    ));
    op.refused(
        &["history-maxctx", "10"],
        "refused: after this edit the configuration would not load: ",
    );
    op.refused(
        &["history-maxctx", "10"],
        "[plugin.default] target_messages: 12 is not below the window of model",
    );
    // A plugin table the plugin refuses: adding it to the chain is refused.
    let op = Operator::new(&format!("{OPERATOR}\n[plugin.fixture_b]\nlog_size = \"yes\"\n"));
    op.refused(&["history-chain-add", "fixture_b"], "[plugin.fixture_b] log_size");
}

#[test]
fn a_config_that_does_not_parse_is_refused_with_the_parsers_line() {
    let op = Operator::new(&OPERATOR.replace("on_plugin_error = 'skip'", "on_plugin_eror = 'skip'"));
    op.refused(
        &["max-users", "5"],
        "plugins-enabled.toml:15: unknown key `on_plugin_eror` in [history]",
    );
    let op = Operator::new(&OPERATOR.replace("[models.local-8k]", "[models.local-8k"));
    op.refused(
        &["history-chain-add", "fixture_b"],
        "plugins-enabled.toml:17: not valid TOML",
    );
    let op = Operator::new(&OPERATOR.replace("\"default\",     # always first\n", ""));
    op.refused(&["history-maxctx", "5"], "the chain must start with \"default\"");
    let missing = tempfile::tempdir().unwrap();
    let output = agentctl(&missing.path().join("nope.toml"), &["max-users", "5"], &[]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot read") && stderr.contains("nope.toml"),
        "{stderr}"
    );
    assert!(
        !missing.path().join("nope.toml").exists(),
        "an edit never creates the file"
    );
}

#[test]
fn a_plugin_added_with_agentctl_runs_in_history_host_process() {
    let op = Operator::new(&OPERATOR.replace("    \"fixture_a\",   # the a\n", ""));
    let history = r#"[{"role":"system","content":"s"},{"role":"user","content":"task"},{"role":"assistant","content":"done"}]"#;
    let run = |op: &Operator| {
        let mut command = Command::new(e2e_tests::host_bin());
        command
            .args(["process", "--config"])
            .arg(&op.path)
            .env("HISTORY_LOG", "info");
        e2e_tests::run_with_stdin(command, history)
    };
    let before = run(&op);
    assert!(before.status.success(), "{}", describe(&before));
    assert!(!String::from_utf8_lossy(&before.stderr).contains("fixture_b: "));

    op.edit(&["history-chain-add", "fixture_b"]);
    let after = run(&op);
    assert!(after.status.success(), "{}", describe(&after));
    let stderr = String::from_utf8_lossy(&after.stderr);
    assert!(stderr.contains("fixture_b: 3 messages at turn 1"), "{stderr}");
    assert_eq!(json(&String::from_utf8_lossy(&after.stdout)), json(history));

    op.edit(&["history-chain-remove", "fixture_b"]);
    assert_eq!(op.text(), op.original);
    let removed = run(&op);
    assert!(!String::from_utf8_lossy(&removed.stderr).contains("fixture_b: "));
}

/// agentctl's own files beside a configuration: temporary files and the edit lock.
fn temporaries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.contains(".agentctl"))
        .collect();
    names.sort();
    names
}

#[test]
fn an_edit_interrupted_before_the_rename_leaves_the_original() {
    let op = Operator::new(OPERATOR);
    let folder = op.path.parent().unwrap().to_path_buf();
    let output = agentctl(
        &op.path,
        &["history-chain-add", "fixture_b"],
        &[("AGENTCTL_FAULT", "after-write")],
    );
    assert_eq!(output.status.code(), Some(70), "{}", describe(&output));
    assert_eq!(std::fs::read(&op.path).unwrap(), op.original.as_bytes());
    // The crash left its lock and its temporary file, whole, beside the configuration.
    let left = temporaries(&folder);
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(
        left.contains(&".plugins-enabled.toml.agentctl.lock".to_string()),
        "{left:?}"
    );
    let temporary = left
        .iter()
        .find(|n| n.ends_with(".tmp"))
        .expect("a temporary file");
    let temporary = std::fs::read_to_string(folder.join(temporary)).unwrap();
    assert!(temporary.contains("\"fixture_b\""), "{temporary}");

    // The host still loads the untouched file; the next edit works and cleans up.
    let check = op.run(&["check"]);
    assert!(check.status.success(), "{}", describe(&check));
    let text = op.edit(&["history-maxctx", "150"]);
    assert_eq!(
        text,
        op.expected("agent_max_ctx    = 200", "agent_max_ctx    = 150")
    );
    assert_eq!(temporaries(&folder), Vec::<String>::new());
}

#[test]
fn history_list_shows_the_chain_settings_models_and_available_plugins() {
    let op = Operator::new(OPERATOR);
    let output = op.run(&["history-list"]);
    assert!(output.status.success(), "{}", describe(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    for expected in [
        "chain:\n  0  default    sliding window: ",
        "  1  fixture_a  passes the history through",
        "agent_max_ctx: 200\n",
        "max_users: 50\n",
        "session_idle_timeout_minutes: 60\n",
        "on_plugin_error: skip\n",
        "  local-8k  effective_ctx   16",
        "available, not in the chain:\n  fixture_b  passes the history through",
    ] {
        assert!(text.contains(expected), "{expected:?} not in:\n{text}");
    }

    let output = op.run(&["history-list", "--json"]);
    assert!(output.status.success(), "{}", describe(&output));
    let value = json(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(value["chain"][0]["name"], "default");
    assert_eq!(value["chain"][1]["name"], "fixture_a");
    assert_eq!(value["chain"][1]["position"], 1);
    assert!(value["chain"][1]["description"]
        .as_str()
        .unwrap()
        .starts_with("passes"));
    assert_eq!(value["agent_max_ctx"], 200);
    assert_eq!(value["max_users"], 50);
    assert_eq!(value["session_idle_timeout_minutes"], 60);
    assert_eq!(value["on_plugin_error"], "skip");
    let models = value["models"].as_array().unwrap();
    let local = models.iter().find(|m| m["name"] == "local-8k").unwrap();
    assert_eq!(local["effective_ctx"], 16);
    let default = models.iter().find(|m| m["name"] == "default").unwrap();
    assert_eq!(default["effective_ctx"], 200);
    assert_eq!(value["available"][0]["name"], "fixture_b");
    assert_eq!(value["available"].as_array().unwrap().len(), 1);
}

#[test]
fn plugins_lists_every_library_with_whether_it_loads_and_is_enabled() {
    // A folder with the fixtures and a file that is not a loadable library.
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    for name in ["default", "fixture_a", "fixture_b"] {
        std::fs::copy(
            fixture_plugins().join(library_file(name)),
            plugins.join(library_file(name)),
        )
        .unwrap();
    }
    std::fs::write(plugins.join(library_file("broken")), b"not a library").unwrap();
    let op = Operator::new(&OPERATOR.replace("@DIR@", &plugins.display().to_string()));

    let output = op.run(&["plugins"]);
    assert!(output.status.success(), "{}", describe(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no line for {name}:\n{text}"))
            .to_string()
    };
    assert!(line("default").contains("0.1.0"), "{text}");
    assert!(line("default").contains(&library_file("default")), "{text}");
    assert!(line("default").ends_with("loads; enabled (position 0)"), "{text}");
    assert!(
        line("fixture_a").ends_with("loads; enabled (position 1)"),
        "{text}"
    );
    assert!(line("fixture_b").ends_with("loads; not enabled"), "{text}");
    assert!(line("broken").contains("DOES NOT LOAD: cannot open it"), "{text}");

    let output = op.run(&["plugins", "--json"]);
    assert!(output.status.success(), "{}", describe(&output));
    let value = json(&String::from_utf8_lossy(&output.stdout));
    let all = value["plugins"].as_array().unwrap();
    let find = |name: &str| all.iter().find(|p| p["name"] == name).unwrap().clone();
    let default = find("default");
    assert_eq!(default["version"], "0.1.0");
    assert_eq!(default["loads"], true);
    assert_eq!(default["enabled"], true);
    assert_eq!(default["position"], 0);
    assert!(default["file"]
        .as_str()
        .unwrap()
        .ends_with(&library_file("default")));
    assert_eq!(find("fixture_b")["enabled"], false);
    let broken = find("broken");
    assert_eq!(broken["loads"], false);
    assert!(
        broken["reason"].as_str().unwrap().contains("cannot open it"),
        "{broken}"
    );

    op.refused(
        &["history-chain-add", "broken"],
        "plugin \"broken\" cannot be loaded: refused plugin library",
    );
}

#[test]
fn check_runs_the_chain_on_a_sample_and_reports_each_plugin() {
    let op = Operator::new(OPERATOR);
    let output = op.run(&["check"]);
    assert!(output.status.success(), "{}", describe(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("plugin default 0.1.0 (position 0): loads, config ok"),
        "{text}"
    );
    assert!(
        text.contains("plugin fixture_a 0.1.0 (position 1): loads, config ok"),
        "{text}"
    );
    assert!(
        text.contains("sample run, model local-8k (effective_ctx 16): 6 -> 6 messages"),
        "{text}"
    );
    assert!(text.contains("  fixture_a  6 -> 6 messages  ok"), "{text}");
    assert!(text.contains("\nsummarizer: none (plugins fall back"), "{text}");
    assert!(text.trim_end().ends_with("check: ok"), "{text}");

    let output = op.run(&["check", "--json"]);
    assert!(output.status.success(), "{}", describe(&output));
    let value = json(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(value["ok"], true);
    assert_eq!(value["problems"].as_array().unwrap().len(), 0);
    assert_eq!(value["plugins"][1]["name"], "fixture_a");
    assert_eq!(value["plugins"][1]["ok"], true);
    let run = &value["runs"][0];
    assert_eq!(run["model"], "local-8k");
    assert_eq!(run["stages"][0]["plugin"], "default");
    assert_eq!(run["stages"][0]["messages_in"], 6);
    assert_eq!(run["stages"][1]["ok"], true);
    assert!(run["stages"][1]["tokens_in"].as_u64().unwrap() > 0);
}

#[test]
fn check_fails_on_a_config_a_plugin_rejects() {
    let op = Operator::new(&format!("{OPERATOR}\n[plugin.fixture_a]\nlog_size = 3\n"));
    let output = op.run(&["check", "--json"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let value = json(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(value["ok"], false);
    assert_eq!(value["plugins"][1]["ok"], false);
    assert!(
        value["problems"][0]
            .as_str()
            .unwrap()
            .contains("[plugin.fixture_a] log_size"),
        "{value}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("agentctl: check failed: "), "{stderr}");

    let op = Operator::new(&OPERATOR.replace("\"fixture_a\",   # the a", "\"fixture_z\","));
    let output = op.run(&["check"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("plugin fixture_z - (position 1): FAULT: not available"),
        "{text}"
    );
}

#[test]
fn edits_print_what_they_did_as_json() {
    let op = Operator::new(OPERATOR);
    let output = op.run(&["history-maxctx", "120", "--json"]);
    assert!(output.status.success(), "{}", describe(&output));
    let value = json(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(value["summary"], "agent_max_ctx: 200 -> 120");
    assert_eq!(value["written"], true);
}

#[test]
fn a_plugin_whose_library_is_gone_can_still_be_removed() {
    let op = Operator::new(&OPERATOR.replace("\"fixture_a\",   # the a", "\"fixture_z\",   # uninstalled"));
    // Any other edit leaves the configuration broken, and says it was broken before.
    op.refused(
        &["max-users", "5"],
        "refused: the configuration does not load, and this edit does not fix it: ",
    );
    op.refused(
        &["max-users", "5"],
        "plugin \"fixture_z\" in the chain is not available",
    );
    let text = op.edit(&["history-chain-remove", "fixture_z"]);
    assert_eq!(text, op.expected("    \"fixture_z\",   # uninstalled\n", ""));
}

#[cfg(unix)]
#[test]
fn a_symlinked_config_stays_a_symlink_and_keeps_its_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let op = Operator::new(OPERATOR);
    std::fs::set_permissions(&op.path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let link_dir = tempfile::tempdir().unwrap();
    let link = link_dir.path().join("plugins-enabled.toml");
    std::os::unix::fs::symlink(&op.path, &link).unwrap();

    let output = agentctl(&link, &["max-users", "7"], &[]);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(op.text(), op.expected("max_users=50", "max_users=7"));
    let mode = std::fs::metadata(&op.path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
    assert_eq!(temporaries(op.path.parent().unwrap()), Vec::<String>::new());
}

#[test]
fn plugins_shows_two_libraries_exporting_one_name() {
    let dir = tempfile::tempdir().unwrap();
    for (from, to) in [
        ("default", "default"),
        ("fixture_a", "fixture_a"),
        ("fixture_a", "fixture_copy"),
    ] {
        std::fs::copy(
            fixture_plugins().join(library_file(from)),
            dir.path().join(library_file(to)),
        )
        .unwrap();
    }
    let op = Operator::new(&OPERATOR.replace("@DIR@", &dir.path().display().to_string()));
    let output = op.run(&["plugins", "--json"]);
    assert!(output.status.success(), "{}", describe(&output));
    let value = json(&String::from_utf8_lossy(&output.stdout));
    let clashing: Vec<&serde_json::Value> = value["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"] == "fixture_a")
        .collect();
    assert_eq!(clashing.len(), 2, "{value}");
    // The file named for fixture_a is fixture_a; the copy, named for fixture_copy, is the
    // one at fault, and its reason names both files.
    let both = format!(
        "two plugin libraries export the name \"fixture_a\": {} and {}",
        dir.path().join(library_file("fixture_a")).display(),
        dir.path().join(library_file("fixture_copy")).display()
    );
    for plugin in clashing {
        let file = plugin["file"].as_str().unwrap();
        if file.ends_with(&library_file("fixture_a")) {
            assert_eq!(plugin["loads"], true, "{plugin}");
        } else {
            assert!(file.ends_with(&library_file("fixture_copy")), "{plugin}");
            assert_eq!(plugin["loads"], false);
            let reason = plugin["reason"].as_str().unwrap();
            assert!(reason.contains(&both), "{reason}");
        }
    }
    // The host maps only what the configuration names: enabling the copy is refused,
    // naming both files; while it is not named, edits go through.
    op.refused(&["history-chain-add", "fixture_copy"], &both);
    op.edit(&["max-users", "5"]);
}

#[test]
fn check_reports_a_plugin_that_faults_on_the_sample() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture_plugins().join(library_file("default")),
        dir.path().join(library_file("default")),
    )
    .unwrap();
    std::fs::copy(
        fixture_build().join(library_file("fixture_fault")),
        dir.path().join(library_file("fixture_fault")),
    )
    .unwrap();
    let text = OPERATOR
        .replace("@DIR@", &dir.path().display().to_string())
        .replace("\"fixture_a\",   # the a", "\"fixture_fault\",")
        .replace("on_plugin_error = 'skip'", "on_plugin_error = 'fail'");
    let op = Operator::new(&text);
    let output = op.run(&["check"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The plugin loads and its config is fine; it is its run that fails, on every model.
    assert!(
        stdout.contains("plugin fixture_fault 0.1.0 (position 1): loads, config ok"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  default        6 -> 6 messages  ok"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  fixture_fault  6 -> 6 messages  FAULT (see the problem below)"),
        "{stdout}"
    );
    // The same fault on both models: printed once, naming both.
    assert_eq!(
        stdout.matches("fixture_fault refuses 6 messages").count(),
        1,
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "problem: plugin \"fixture_fault\" faulted on the sample history (models local-8k, default): \
             fixture_fault refuses 6 messages"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("check: FAILED (1 problem(s))"), "{stdout}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(
            "check failed: plugin \"fixture_fault\" faulted on the sample history (models local-8k, default)"
        ),
        "{stderr}"
    );
}

#[test]
fn edits_of_the_shipped_configuration_touch_only_their_line() {
    let shipped = std::fs::read_to_string(workspace_root().join("plugins-enabled.toml")).unwrap();
    let dir_line = "plugin_dir = \"target/plugins\"\n";
    assert!(shipped.contains(dir_line), "the shipped file changed");
    // The shipped chain needs every shipped plugin; the fixtures come on top.
    let plugins = tempfile::tempdir().unwrap();
    for dir in [plugin_dir(), fixture_plugins().to_path_buf()] {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            // The libraries only: a serve test leaves its shadow copies in `.shadow/`.
            if path.is_file() {
                std::fs::copy(&path, plugins.path().join(path.file_name().unwrap())).unwrap();
            }
        }
    }
    let op = Operator::new(&shipped.replace(
        dir_line,
        &format!("plugin_dir = {:?}\n", plugins.path().display().to_string()),
    ));
    let chain = "chain = [\"default\", \"tool_result_filter\", \"retention\", \"token_budget\"]\n";
    let text = op.edit(&["history-chain-add", "fixture_a"]);
    assert_eq!(
        text,
        op.expected(
            chain,
            "chain = [\"default\", \"tool_result_filter\", \"retention\", \"token_budget\", \"fixture_a\"]\n"
        )
    );
    let text = op.edit(&["history-chain-add", "fixture_b", "--at", "1"]);
    assert_eq!(
        text,
        op.expected(
            chain,
            "chain = [\"default\", \"fixture_b\", \"tool_result_filter\", \"retention\", \"token_budget\", \"fixture_a\"]\n"
        )
    );
    op.edit(&["history-chain-move", "fixture_b", "2"]);
    op.edit(&["history-chain-remove", "fixture_a"]);
    let text = op.edit(&["history-chain-remove", "fixture_b"]);
    assert_eq!(text, op.original, "adding and removing gives back the file");
    let text = op.edit(&["history-maxctx", "300"]);
    assert_eq!(
        text,
        op.expected("agent_max_ctx = 200\n", "agent_max_ctx = 300\n")
    );
}

#[test]
fn the_view_is_edited_like_the_chain_and_listed_beside_it() {
    let op = Operator::new(&OPERATOR.replace(
        "on_plugin_error",
        "view = [\"fixture_b\"]  # sent only\non_plugin_error",
    ));
    assert!(op.original.contains("view = [\"fixture_b\"]  # sent only\n"));
    let listed = String::from_utf8_lossy(&op.run(&["history-list"]).stdout).to_string();
    assert!(
        listed.contains("view (run after the chain on what is sent; not kept):\n  0  fixture_b"),
        "{listed}"
    );
    let json = json(&String::from_utf8_lossy(
        &op.run(&["history-list", "--json"]).stdout,
    ));
    assert_eq!(json["view"][0]["name"], "fixture_b");
    // A plugin is in one list: the chain's plugins cannot join the view, and back.
    op.refused(
        &["history-chain-add", "fixture_b"],
        "already in the view, at position 0",
    );
    op.refused(
        &["history-chain-add", "fixture_a", "--view"],
        "already in the chain",
    );
    // Remove and move find the plugin in whichever list holds it.
    let text = op.edit(&["history-chain-remove", "fixture_b"]);
    assert_eq!(
        text,
        op.expected(
            "view = [\"fixture_b\"]  # sent only\n",
            "view = []  # sent only\n"
        )
    );
    let text = op.edit(&["history-chain-remove", "fixture_a"]);
    assert!(!text.contains("fixture_a"), "{text}");
    op.edit(&["history-chain-add", "fixture_a", "--view"]);
    let text = op.edit(&["history-chain-add", "fixture_b", "--view", "--at", "0"]);
    assert!(
        text.contains("view = [\"fixture_b\", \"fixture_a\"]  # sent only\n"),
        "{text}"
    );
    let text = op.edit(&["history-chain-move", "fixture_b", "1"]);
    assert!(
        text.contains("view = [\"fixture_a\", \"fixture_b\"]  # sent only\n"),
        "{text}"
    );
    let before = op.text();
    let output = op.run(&["history-chain-move", "fixture_b", "2"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("out of range: the view is fixture_a, fixture_b"),
        "{stderr}"
    );
    assert_eq!(op.text(), before);
    let listed = String::from_utf8_lossy(&op.run(&["plugins"]).stdout).to_string();
    assert!(listed.contains("enabled (view position 1)"), "{listed}");
}

#[test]
fn an_edit_is_refused_while_another_agentctl_edits() {
    let op = Operator::new(OPERATOR);
    let lock = op
        .path
        .parent()
        .unwrap()
        .join(".plugins-enabled.toml.agentctl.lock");
    // A running process holds the lock (this test's own process stands in for it).
    std::fs::write(&lock, std::process::id().to_string()).unwrap();
    op.refused(
        &["max-users", "5"],
        &format!("agentctl (pid {}) is editing", std::process::id()),
    );
    assert!(lock.exists(), "someone else's lock is left alone");

    // A lock whose process is gone is taken over, and removed after the edit.
    let mut finished = Command::new(e2e_tests::agentctl_bin())
        .arg("--version")
        .spawn()
        .unwrap();
    let gone = finished.id();
    finished.wait().unwrap();
    std::fs::write(&lock, gone.to_string()).unwrap();
    let text = op.edit(&["max-users", "5"]);
    assert_eq!(text, op.expected("max_users=50", "max_users=5"));
    assert!(!lock.exists());
}

#[test]
fn history_require_and_unrequire_edit_the_required_list() {
    let op = Operator::new(OPERATOR);
    let text = op.edit(&["history-require", "fixture_a"]);
    assert_eq!(
        text,
        op.expected(
            "on_plugin_error = 'skip'\n",
            "on_plugin_error = 'skip'\nrequired = [\"fixture_a\"]\n"
        )
    );
    let listed = String::from_utf8_lossy(&op.run(&["history-list"]).stdout).to_string();
    assert!(
        listed.contains("required (a fault fails the turn even under skip): fixture_a\n"),
        "{listed}"
    );
    let value = json(&String::from_utf8_lossy(
        &op.run(&["history-list", "--json"]).stdout,
    ));
    assert_eq!(value["required"], serde_json::json!(["fixture_a"]));
    assert_eq!(value["chain"][1]["required"], true);

    // A required plugin cannot leave the chain while it is required.
    let output = op.run(&["history-chain-remove", "fixture_a"]);
    assert!(!output.status.success(), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("in `required` is in neither the chain nor the view"),
        "{}",
        describe(&output)
    );
    assert_eq!(op.text(), text, "refused: unchanged");

    assert_eq!(op.edit(&["history-unrequire", "fixture_a"]), op.original);

    op.refused(
        &["history-require", "fixture_b"],
        "plugin \"fixture_b\" is not in the chain",
    );
    op.refused(
        &["history-unrequire", "fixture_a"],
        "plugin \"fixture_a\" is not required",
    );
}
