//! The xtask binary as a subprocess: its usage and exit codes.

use std::process::{Command, Output};

fn xtask() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn describe(output: &Output) -> String {
    format!(
        "{}\nstdout: {}\nstderr: {}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    )
}

#[test]
fn help_prints_the_usage_to_stdout_and_succeeds() {
    for flag in ["--help", "-h", "help"] {
        let output = xtask().arg(flag).output().unwrap();
        assert_eq!(output.status.code(), Some(0), "{flag}: {}", describe(&output));
        let stdout = text(&output.stdout);
        assert!(
            stdout.starts_with("usage: cargo xtask <task>"),
            "{flag}: {stdout}"
        );
        for task in ["build", "test", "new-plugin", "gen-history", "bench"] {
            assert!(
                stdout.contains(&format!("\n  {task} ")),
                "{flag}: {task} in {stdout}"
            );
        }
        assert!(output.stderr.is_empty(), "{flag}: {}", describe(&output));
    }
}

#[test]
fn an_unknown_or_missing_task_prints_the_usage_to_stderr_and_exits_2() {
    for args in [&["frobnicate"][..], &[], &["build", "--relase"], &["new-plugin"]] {
        let output = xtask().args(args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", describe(&output));
        assert!(output.stdout.is_empty(), "{args:?}: {}", describe(&output));
        assert!(
            text(&output.stderr).contains("usage: cargo xtask <task>"),
            "{args:?}: {}",
            describe(&output)
        );
    }
    let output = xtask().arg("frobnicate").output().unwrap();
    assert!(text(&output.stderr).starts_with("xtask: unknown task `frobnicate`"));
}
