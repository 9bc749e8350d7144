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
        // may start with the assistant (SPEC §5, start rule).
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
