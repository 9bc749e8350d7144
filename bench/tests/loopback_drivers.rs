//! `history-bench serve` and `proxy` on tiny counts against the debug `history-host`: each
//! starts real `serve` processes on loopback, drives them and reports its figures. Not
//! timed (CI must not fail on a slow machine): what is checked is that every turn and
//! request went through, and that a resent conversation is not tokenized again.
//!
//! Needs the installed plugins: run with `cargo xtask test`.

use std::process::Command;

use e2e_tests::fixtures::{fixture_target, plugin_dir_with_installed};
use e2e_tests::{describe, host_bin, workspace_root};
use serde_json::Value;

/// A folder holding only the `floor` fixture built as `default` (its `as-default`
/// feature, built into the fixtures' target folder): the serve bench's floor.
fn floor_dir() -> tempfile::TempDir {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(workspace_root())
        .args([
            "build",
            "--package",
            "history_plugin_floor",
            "--features",
            "as-default",
            "--target-dir",
        ])
        .arg(fixture_target())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let built = fixture_target()
        .join("debug")
        .join(history_engine::library_file_name("floor"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        built,
        dir.path().join(history_engine::library_file_name("default")),
    )
    .unwrap();
    dir
}

fn bench(args: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_history-bench"))
        .args(args)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&output)))
}

#[test]
fn the_serve_and_proxy_drivers_report_every_turn_and_request() {
    let dir = plugin_dir_with_installed(&[]);
    let floor = floor_dir();
    let host = host_bin().display().to_string();
    let plugins = dir.path().display().to_string();
    let floor_path = floor.path().display().to_string();
    let common = ["--host", &host, "--plugin-dir", &plugins, "--json"];

    let mut args = vec!["serve", "--floor-dir", &floor_path];
    args.extend(common);
    args.extend(["--sessions", "3", "--clients", "2", "--turns", "4"]);
    let report = bench(&args);
    assert_eq!(report["store"], "sqlite");
    let case = &report["cases"][0];
    for run in ["chain", "floor"] {
        assert_eq!(case[run]["turns"], 12, "{run}: {case}");
        assert_eq!(case[run]["errors"], 0, "{run}: {case}");
        assert!(case[run]["peak_rss_mb"].as_f64().unwrap() > 1.0, "{case}");
        assert!(case[run]["latency"]["p99_ms"].as_f64().unwrap() > 0.0, "{case}");
        // CPU per turn of the hosts and clients (a dozen turns may take less than a
        // tick); no database part on SQLite.
        let cpu = &case[run]["cpu_ms_per_turn"];
        assert!(cpu["hosts"].as_f64().is_some_and(|ms| ms >= 0.0), "{case}");
        assert!(cpu["clients"].as_f64().is_some(), "{case}");
        assert!(cpu["database"].is_null(), "{case}");
    }
    assert_eq!(
        case["floor"]["stages"],
        serde_json::json!(["floor (built as default)"])
    );
    assert_eq!(case["chain"]["stages"][0], "default", "{case}");

    // The open loop, the answers as deltas: every turn sent on its slot and answered,
    // timed from the slot (so never less than from the send).
    let mut args = vec!["serve", "--floor-dir", &floor_path];
    args.extend(common);
    args.extend([
        "--sessions",
        "3",
        "--turns",
        "4",
        "--rate",
        "200",
        "--answer",
        "delta",
    ]);
    let report = bench(&args);
    assert_eq!(report["answer"], "delta", "{report}");
    let case = &report["cases"][0];
    for run in ["chain", "floor"] {
        assert_eq!(case[run]["turns"], 12, "{run}: {case}");
        assert_eq!(case[run]["errors"], 0, "{run}: {case}");
        let open = &case[run]["open_loop"];
        assert_eq!(open["rate"], 200.0, "{case}");
        let from_slot = case[run]["latency"]["max_ms"].as_f64().unwrap();
        let from_send = open["latency_from_send"]["max_ms"].as_f64().unwrap();
        assert!(from_send > 0.0 && from_slot >= from_send, "{case}");
    }

    let mut args = vec!["proxy"];
    args.extend(common);
    args.extend(["--requests", "10", "--clients", "2"]);
    let report = bench(&args);
    assert_eq!(report["latency"]["requests"], 10, "{report}");
    assert_eq!(report["throughput"]["proxy"]["capped"], false, "{report}");
    let cache = &report["token_cache"];
    assert!(
        cache["first_request"]["bytes_tokenized"].as_f64().unwrap() > 10_000.0,
        "{report}"
    );
    assert_eq!(
        cache["every_request_after"]["bytes_tokenized"].as_f64(),
        Some(0.0),
        "a resent conversation is not tokenized again: {report}"
    );
    assert_eq!(
        cache["every_request_after"]["cache_misses"].as_f64(),
        Some(0.0),
        "{report}"
    );
}
