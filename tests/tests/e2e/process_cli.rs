//! `history-host process` as a subprocess, on the real libraries.

use e2e_tests::{describe, json, TestConfig};

#[test]
fn process_writes_the_resulting_history_and_explains() {
    let config = TestConfig::new("[history]\nagent_max_ctx = 3\n");
    let input = r#"[{"role":"system","content":"s"},{"role":"user","content":"task"},
        {"role":"assistant","content":"a1"},{"role":"user","content":"u2"},{"role":"assistant","content":"a2"},
        {"role":"user","content":"u3"},{"role":"assistant","content":"a3"}]"#;
    let output = config.process(&["--explain"], input);
    assert!(output.status.success(), "{}", describe(&output));
    let out = json(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(
        out,
        // Three unpinned messages fit; the pinned task precedes them, so the kept part
        // may start with the assistant (docs/plugins.md#shared-trimming-rules, start rule).
        json(
            r#"[{"role":"system","content":"s"},{"role":"user","content":"task"},
            {"role":"assistant","content":"a2"},{"role":"user","content":"u3"},{"role":"assistant","content":"a3"}]"#
        )
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("default"), "{stderr}");
    assert!(stderr.contains("message-removed"), "{stderr}");
    assert!(stderr.contains("chain: 7 -> 5 messages"), "{stderr}");
}

#[test]
fn the_readme_main_job_runs_on_the_shipped_config() {
    // The README's first command: the shipped chain on the shipped example conversation.
    let root = e2e_tests::workspace_root();
    let mut command = std::process::Command::new(e2e_tests::host_bin());
    command.current_dir(&root).args([
        "process",
        "--input",
        "examples/swe-agent-conversation.json",
        "--model",
        "local-8k",
        "--explain",
    ]);
    let output = e2e_tests::run_with_stdin(command, "");
    assert!(output.status.success(), "{}", describe(&output));
    let out = json(&String::from_utf8_lossy(&output.stdout));
    let input = json(&std::fs::read_to_string(root.join("examples/swe-agent-conversation.json")).unwrap());
    let (out, input) = (out.as_array().unwrap(), input.as_array().unwrap());
    assert!(
        out.len() < input.len(),
        "the small model's window trims the conversation"
    );
    assert_eq!(out[0], input[0], "the system prompt is pinned");
    assert_eq!(out[1], input[1], "the task is pinned");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("input: 28 messages") && stderr.contains("default"),
        "{stderr}"
    );
}

#[test]
fn a_model_not_in_the_configuration_is_named_with_its_fallback() {
    // `process` is stateless, like the proxy: an unlisted model gets [models.default]
    // with a warning, whatever `[models] unknown` says (sessions are refused instead).
    let models = "[models.default]\nmax_context = 10\n[models.small]\nmax_context = 4\n";
    let input = r#"[{"role":"user","content":"hi"}]"#;
    for config in [
        TestConfig::new(models),
        TestConfig::new(&format!("[models]\nunknown = \"refuse\"\n{models}")),
    ] {
        let output = config.process(&["--model", "gtp-4o"], input);
        assert!(output.status.success(), "{}", describe(&output));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("model \"gtp-4o\" is not listed")
                && stderr.contains("(listed: default, small): it gets [models.default]"),
            "{stderr}"
        );
        let listed = config.process(&["--model", "small"], input);
        assert!(
            !String::from_utf8_lossy(&listed.stderr).contains("is not listed"),
            "{}",
            describe(&listed)
        );
    }
    // A bad value is a configuration error naming the key.
    let config = TestConfig::new(&format!("[models]\nunknown = \"guess\"\n{models}"));
    let output = config.process(&[], input);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("`unknown` in [models] must be \"refuse\" or \"default\""),
        "{}",
        describe(&output)
    );
}

/// `process` reading a terminal says what it waits for; reading a pipe it says nothing.
/// The terminal is a real pseudo-terminal made by util-linux's `script`.
#[test]
fn process_at_a_terminal_says_it_reads_standard_input() {
    let config = TestConfig::new("");
    let input = r#"[{"role":"user","content":"hi"}]"#;
    let piped = config.process(&[], input);
    assert!(piped.status.success(), "{}", describe(&piped));
    assert!(
        !String::from_utf8_lossy(&piped.stderr).contains("reading the history"),
        "{}",
        describe(&piped)
    );

    let script = std::path::Path::new("/usr/bin/script");
    if !script.exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI needs util-linux's script"
        );
        eprintln!("skipped: /usr/bin/script (util-linux) is missing, so no pseudo-terminal");
        return;
    }
    let line = format!(
        "{} process --config {}",
        e2e_tests::host_bin().display(),
        config.path.display()
    );
    let mut command = std::process::Command::new(script);
    command.args(["-qec", &line, "/dev/null"]);
    // The terminal's end of input (Ctrl-D) after the history, a moment after the start so
    // the hint comes first.
    let mut child = command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(500));
        stdin.write_all(input.as_bytes()).unwrap();
        stdin.write_all(b"\n\x04").unwrap();
    }
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(
        shown.contains("reading the history from standard input") && shown.contains("Ctrl-D"),
        "{shown}"
    );
    assert!(shown.contains(r#"[{"role":"user","content":"hi"}]"#), "{shown}");
}
