//! Process plugins (docs/process-plugins.md): programs named by `NAME.plugin.toml`,
//! speaking JSON lines. The example Python redactor (on the SDK, installed into the
//! tests' virtualenv by `cargo xtask test` with `pip install ./sdk/python`) and the Node
//! `keep_recent` run in the shipped chain through `process` and `serve`, checked by the
//! host; an orphan tool result is refused in the host's words; a hang is killed at
//! `plugin_timeout_ms` and quarantined; an exit is restarted; hot reload picks up an
//! edited script.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e_tests::fixtures::{plugin_dir_with, plugin_dir_with_installed};
use e2e_tests::server::{shipped_config, Server};
use e2e_tests::{describe, json, target_dir, workspace_root, TestConfig};
use serde_json::{json as j, Value};

/// The tests' virtualenv's Python, which has the SDK installed.
fn python() -> PathBuf {
    let python = target_dir().join("py").join("bin").join("python");
    assert!(
        python.exists(),
        "{} is missing: run the tests with `cargo xtask test` (it installs the SDK there)",
        python.display()
    );
    python
}

/// Puts the example plugins into `dir`: the redactor run by the virtualenv's Python.
fn add_examples(dir: &Path) {
    let examples = workspace_root().join("examples/process-plugins");
    for file in [
        "redact.py",
        "keep_recent.mjs",
        "keep_recent.d.ts",
        "keep_recent.plugin.toml",
    ] {
        std::fs::copy(examples.join(file), dir.join(file)).unwrap();
    }
    let manifest = std::fs::read_to_string(examples.join("redact.plugin.toml")).unwrap();
    let manifest = manifest.replace("\"python3\"", &format!("{:?}", python().display().to_string()));
    std::fs::write(dir.join("redact.plugin.toml"), manifest).unwrap();
}

/// A Python plugin `name` in `dir` whose `process` body is `body` (indented by 8),
/// on the SDK.
fn add_python(dir: &Path, name: &str, body: &str) {
    let script = format!(
        "import os, sys, time\nfrom history_plugin import Plugin, run\n\n\
         class P(Plugin):\n    name = {name:?}\n    version = \"1.0.0\"\n\n\
         \x20   def process(self, messages, ctx):\n{body}\n\nrun(P())\n"
    );
    std::fs::write(dir.join(format!("{name}.py")), script).unwrap();
    std::fs::write(
        dir.join(format!("{name}.plugin.toml")),
        format!(
            "protocol = 1\ncommand = [{:?}, \"{name}.py\"]\n",
            python().display().to_string()
        ),
    )
    .unwrap();
}

/// A chain `default` then `name` in `dir`, `chars4` tokens.
fn config(dir: &Path, name: &str, extra: &str) -> TestConfig {
    TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"{name}\"]\n{extra}\n[models.default]\ntokenizer = \"chars4\"\n",
        dir.display().to_string()
    ))
}

const SECRET: &str = "sk-abcdefghijklmnopqrstuvwxyz0123";

fn turn(server: &Server, id: &str, text: &str) -> Value {
    let answer = server.post(
        &format!("/v1/sessions/{id}/turns"),
        &j!({"messages": [{"role": "user", "content": text}]}),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.body
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not within 30 s: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn python_and_node_plugins_run_in_the_shipped_chain_through_process_and_serve() {
    let plugins = plugin_dir_with_installed(&[]);
    add_examples(plugins.path());
    let shipped = shipped_config(
        "",
        &[(
            "chain =",
            "chain = [\"default\", \"redact\", \"tool_result_filter\", \"retention\", \"token_budget\", \"keep_recent\"]",
        )],
    );
    let text = std::fs::read_to_string(&shipped.path).unwrap();
    let text = text
        .lines()
        .map(|line| {
            if line.starts_with("plugin_dir") {
                format!("plugin_dir = {:?}", plugins.path().display().to_string())
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n[plugin.keep_recent]\nkeep = 3\n";
    std::fs::write(&shipped.path, text).unwrap();

    let history = j!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": format!("my key is {SECRET}")},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": "a.txt b.txt"},
        {"role": "user", "content": format!("and again {SECRET}, thanks")}
    ]);
    let output = shipped.process(&["--explain"], &history.to_string());
    assert!(output.status.success(), "{}", describe(&output));
    let sent = json(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(
        sent,
        j!([
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "list the files"},
            {"role": "assistant", "content": "a.txt b.txt"},
            {"role": "user", "content": "and again [REDACTED], thanks"}
        ]),
        "redacted by Python, cut by Node to the last user-led three"
    );
    let explain = String::from_utf8_lossy(&output.stderr);
    assert!(explain.contains("message-changed ×2"), "{explain}");
    assert!(explain.contains("message-removed"), "{explain}");

    let server = Server::start(&shipped.path, &shipped.dir.path().join("sessions.db"), &[]);
    let id = server.create("default");
    let answer = turn(&server, &id, &format!("the key {SECRET}"));
    let stages: Vec<&str> = answer["stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["plugin"].as_str().unwrap())
        .collect();
    assert!(
        stages.contains(&"redact") && stages.contains(&"keep_recent"),
        "{stages:?}"
    );
    let working = server.history(&id, false);
    assert!(
        working.to_string().contains("the key [REDACTED]") && !working.to_string().contains(SECRET),
        "{working}"
    );
    assert!(server.stop().success());
}

#[test]
fn an_orphan_tool_result_is_refused_with_the_hosts_message() {
    let plugins = plugin_dir_with(&[]);
    add_python(
        plugins.path(),
        "orphaner",
        "        return [m for m in messages if not m.tool_calls]",
    );
    let history = r#"[{"role":"user","content":"read it"},
        {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read","arguments":"{}"}}]},
        {"role":"tool","tool_call_id":"c1","content":"the file"}]"#;
    let output = config(plugins.path(), "orphaner", "on_plugin_error = \"fail\"").process(&[], history);
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("plugin \"orphaner\" failed: invalid output")
            && stderr.contains("structural fault")
            && stderr.contains("tool"),
        "{stderr}"
    );
    // Under "skip": the history is passed on as the plugin received it.
    let output = config(plugins.path(), "orphaner", "on_plugin_error = \"skip\"").process(&[], history);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(json(&String::from_utf8_lossy(&output.stdout)), json(history));
}

#[test]
fn a_plugin_that_hangs_is_killed_at_the_deadline_and_quarantined() {
    let plugins = plugin_dir_with(&[]);
    add_python(
        plugins.path(),
        "hanger",
        "        open('hanger.pid', 'w').write(str(os.getpid()))\n        time.sleep(3600)",
    );
    let config = config(
        plugins.path(),
        "hanger",
        "on_plugin_error = \"skip\"\nplugin_timeout_ms = 700",
    );
    let server = Server::start(&config.path, &config.dir.path().join("sessions.db"), &[]);
    let id = server.create("default");
    let started = Instant::now();
    let first = turn(&server, &id, "hello");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let stage = &first["stats"][1];
    assert_eq!(
        (&stage["plugin"], &stage["quarantined"]),
        (&j!("hanger"), &j!(true)),
        "{first}"
    );
    assert!(
        stage["skipped"]
            .as_str()
            .unwrap_or_default()
            .contains("did not return within 700 ms (plugin_timeout_ms)"),
        "{stage}"
    );
    // Its process is gone: killed and reaped, nothing left running.
    let pid = std::fs::read_to_string(plugins.path().join("hanger.pid")).unwrap();
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "pid {pid} still runs"
    );
    let second = turn(&server, &id, "again");
    assert!(
        second["stats"][1]["skipped"]
            .as_str()
            .unwrap_or_default()
            .starts_with("quarantined"),
        "{second}"
    );
    assert_eq!(server.get("/healthz").status, 503);
    assert!(server.stop().success());
}

#[test]
fn a_plugin_that_exits_is_restarted_at_the_next_call() {
    let plugins = plugin_dir_with(&[]);
    add_python(
        plugins.path(),
        "quitter",
        "        if any('EXIT NOW' in m.text() for m in messages):\n            sys.exit(3)\n        \
         last = messages[-1]\n        return messages[:-1] + [last.changed(content=last.text() + f' [pid {os.getpid()}]')]",
    );
    let config = config(plugins.path(), "quitter", "on_plugin_error = \"skip\"");
    let server = Server::start(&config.path, &config.dir.path().join("sessions.db"), &[]);
    let pid_of = |answer: &Value| -> String {
        let text = answer["history"].as_array().unwrap().last().unwrap()["content"]
            .as_str()
            .unwrap()
            .to_string();
        text.rsplit("[pid ")
            .next()
            .unwrap()
            .trim_end_matches(']')
            .to_string()
    };
    let (one, two) = (server.create("default"), server.create("default"));
    let first = pid_of(&turn(&server, &one, "hello"));
    let died = turn(&server, &two, "EXIT NOW");
    let skipped = died["stats"][1]["skipped"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        skipped.contains("exited with status 3 during the call; it is started again at the next call"),
        "{died}"
    );
    let after = pid_of(&turn(&server, &one, "still there?"));
    assert_ne!(first, after, "a new process serves the next call");
    assert_eq!(server.get("/healthz").status, 200, "an exit is no quarantine");
    // The operator sees it: the program started twice, a library has no such count.
    let chain = server.get("/v1/chain").body;
    let stage = |name: &str| {
        chain["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {chain}"))
            .clone()
    };
    assert_eq!(stage("quitter")["program_starts"], j!(2), "{chain}");
    assert_eq!(stage("default")["program_starts"], Value::Null, "{chain}");
    assert!(server.stop().success());
}

#[test]
fn hot_reload_picks_up_an_edited_script() {
    let plugins = plugin_dir_with(&[]);
    add_python(
        plugins.path(),
        "tagger",
        "        last = messages[-1]\n        return messages[:-1] + [last.changed(content=last.text() + ' [v1]')]",
    );
    let config = config(plugins.path(), "tagger", "on_plugin_error = \"fail\"");
    let server = Server::start(&config.path, &config.dir.path().join("sessions.db"), &[]);
    let id = server.create("default");
    let last = |answer: &Value| answer["history"].as_array().unwrap().last().unwrap()["content"].clone();
    assert_eq!(last(&turn(&server, &id, "one")), j!("one [v1]"));
    // Only the script changes: the manifest is as it was.
    let script = plugins.path().join("tagger.py");
    let edited = std::fs::read_to_string(&script).unwrap().replace("[v1]", "[v2]");
    std::fs::write(&script, edited).unwrap();
    wait_until("the edited script is reloaded", || {
        server.get("/v1/chain").body["last_reload"]["outcome"] == j!("ok")
    });
    assert_eq!(last(&turn(&server, &id, "two")), j!("two [v2]"));
    assert!(server.stop().success());
}

#[test]
fn agentctl_installs_a_manifest_with_its_files_and_lists_its_kind() {
    let plugins = plugin_dir_with(&[]);
    let config = TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = [\"default\"]\n",
        plugins.path().display().to_string()
    ));
    let manifest = workspace_root().join("examples/process-plugins/keep_recent.plugin.toml");
    let manifest = manifest.to_str().unwrap();
    let output = e2e_tests::agentctl(&config.path, &["install", manifest], &[]);
    assert!(output.status.success(), "{}", describe(&output));
    for file in ["keep_recent.plugin.toml", "keep_recent.mjs", "keep_recent.d.ts"] {
        assert!(plugins.path().join(file).is_file(), "{file} installed");
    }
    let again = e2e_tests::agentctl(&config.path, &["install", manifest], &[]);
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("is already installed, identical"),
        "{}",
        describe(&again)
    );
    let added = e2e_tests::agentctl(&config.path, &["history-chain-add", "keep_recent"], &[]);
    assert!(added.status.success(), "{}", describe(&added));
    // Its table is checked by the program itself, through the handshake.
    let refused = e2e_tests::agentctl(&config.path, &["plugin-set", "keep_recent", "keep", "0"], &[]);
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("[plugin.keep_recent] keep: must be a whole number of at least 1"),
        "{}",
        describe(&refused)
    );
    let listed = e2e_tests::agentctl(&config.path, &["--json", "plugins"], &[]);
    let listed = json(&String::from_utf8_lossy(&listed.stdout));
    let kinds: Vec<(&str, &str, bool)> = listed["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap(),
                p["kind"].as_str().unwrap(),
                p["loads"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [("default", "library", true), ("keep_recent", "program", true)]
    );
    // A different file under its name is a clash, refused unless --force.
    std::fs::write(plugins.path().join("keep_recent.d.ts"), "// changed\n").unwrap();
    let clash = e2e_tests::agentctl(&config.path, &["install", manifest], &[]);
    assert!(
        String::from_utf8_lossy(&clash.stderr).contains("a different file is already installed"),
        "{}",
        describe(&clash)
    );
    let forced = e2e_tests::agentctl(&config.path, &["install", "--force", manifest], &[]);
    assert!(forced.status.success(), "{}", describe(&forced));
}

#[test]
fn new_plugin_python_scaffolds_a_plugin_whose_test_passes_and_that_runs_in_a_chain() {
    let xtask = target_dir().join("debug").join("xtask");
    assert!(xtask.exists(), "{} is built by `cargo xtask`", xtask.display());
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("my_filter");
    let output = std::process::Command::new(&xtask)
        .args(["new-plugin", "my_filter", "--python", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    // Its own test, through the host's output check.
    let test = std::process::Command::new(python())
        .args(["-m", "unittest", "discover", "-s"])
        .arg(&dir)
        .env("HISTORY_HOST", e2e_tests::host_bin())
        .output()
        .unwrap();
    assert!(test.status.success(), "{}", describe(&test));
    assert!(
        String::from_utf8_lossy(&test.stderr).contains("Ran 1 test"),
        "{}",
        describe(&test)
    );
    // Installed beside `default`, run by the virtualenv's Python: it passes the history on.
    let plugins = plugin_dir_with(&[]);
    std::fs::copy(dir.join("my_filter.py"), plugins.path().join("my_filter.py")).unwrap();
    let manifest = std::fs::read_to_string(dir.join("my_filter.plugin.toml")).unwrap();
    let manifest = manifest.replace("\"python3\"", &format!("{:?}", python().display().to_string()));
    std::fs::write(plugins.path().join("my_filter.plugin.toml"), manifest).unwrap();
    let history = r#"[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]"#;
    let output = config(plugins.path(), "my_filter", "on_plugin_error = \"fail\"").process(&[], history);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(json(&String::from_utf8_lossy(&output.stdout)), json(history));
}
