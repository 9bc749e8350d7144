//! The plugin deadline (docs/chain.md#deadline): a call past `plugin_timeout_ms` is that
//! plugin's fault, the runaway call is left on its thread, and the plugin is quarantined
//! until the chain is reloaded. The fixture `sleeper` never returns (or sleeps `ms`).

use std::time::{Duration, Instant};

use e2e_tests::fixtures::{fixture_library, plugin_dir_with, plugin_dir_with_installed};
use e2e_tests::server::Server;
use e2e_tests::{describe, json, TestConfig};
use history_engine::{load_chain, stateless_context, Call, Chain};
use plugin_api::Context;
use serde_json::json as j;

const HISTORY: &str = r#"[{"role":"system","content":"s"},{"role":"user","content":"task"},
    {"role":"assistant","content":"done"}]"#;

/// Generous: the deadline is 300 ms, the machine may be loaded. The model counts with
/// `chars4`, so no tokenizer is loaded during a timed turn.
const BOUND: Duration = Duration::from_secs(15);

fn config(on_error: &str, extra: &str, dir: &std::path::Path) -> TestConfig {
    config_with("chain = [\"default\", \"sleeper\"]", on_error, extra, dir)
}

/// `history`: the `[history]` keys besides `on_plugin_error` and the 300 ms deadline.
fn config_with(history: &str, on_error: &str, extra: &str, dir: &std::path::Path) -> TestConfig {
    TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\n{history}\non_plugin_error = \"{on_error}\"\nplugin_timeout_ms = 300\n[models.default]\ntokenizer = \"chars4\"\n{extra}",
        dir.display().to_string()
    ))
}

/// The chain of `config`, loaded in this process, and a stateless call's context on
/// `[models.default]` at turn 1.
fn chain_and_context(config: &TestConfig) -> (Chain, Context) {
    let (engine_config, _catalog, chain) = load_chain(&config.path).unwrap();
    let ctx = stateless_context(&engine_config, engine_config.model("default"), 1);
    (chain, ctx)
}

#[test]
fn a_call_past_the_deadline_is_skipped_and_the_plugin_quarantined() {
    let dir = plugin_dir_with(&[&fixture_library("sleeper")]);
    let config = config("skip", "", dir.path());
    let started = Instant::now();
    let output = config.process(&["--explain"], HISTORY);
    assert!(started.elapsed() < BOUND, "{:?}", started.elapsed());
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(json(&String::from_utf8_lossy(&output.stdout)), json(HISTORY));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("plugin \"sleeper\" skipped: did not return within 300 ms"),
        "{stderr}"
    );

    // In one process: the first run times out, later runs do not call the plugin.
    let (chain, ctx) = chain_and_context(&config);
    let history = || history_wire::chat::history_from_str(HISTORY).unwrap();
    let started = Instant::now();
    let run = chain.run(history(), &ctx, Call::Process).unwrap();
    assert!(started.elapsed() < BOUND);
    let report = &run.stages[1];
    assert!(report.quarantined, "{report:?}");
    assert!(report
        .skipped
        .as_deref()
        .unwrap()
        .contains("did not return within 300 ms"));
    assert_eq!(chain.quarantined(), ["sleeper"]);
    for _ in 0..3 {
        let started = Instant::now();
        let run = chain.run(history(), &ctx, Call::Process).unwrap();
        assert!(
            started.elapsed() < Duration::from_millis(250),
            "a quarantined plugin is not called: {:?}",
            started.elapsed()
        );
        let report = &run.stages[1];
        assert!(report.quarantined);
        assert!(
            report.skipped.as_deref().unwrap().starts_with("quarantined:"),
            "{report:?}"
        );
    }
    // A reload (a new chain) calls it again.
    let (_, _, reloaded) = load_chain(&config.path).unwrap();
    assert!(reloaded.quarantined().is_empty());
}

/// A required plugin (or an ingest one) that was quarantined is not skipped on later
/// calls, which would pass on what it guards: each later call fails, naming it.
#[test]
fn a_quarantined_required_plugin_fails_every_later_call() {
    let dir = plugin_dir_with(&[&fixture_library("sleeper")]);
    let config = config_with(
        "chain = [\"default\", \"sleeper\"]\nrequired = [\"sleeper\"]",
        "skip",
        "",
        dir.path(),
    );
    let (chain, ctx) = chain_and_context(&config);
    let history = || history_wire::chat::history_from_str(HISTORY).unwrap();
    let failure = chain.run(history(), &ctx, Call::Process).unwrap_err();
    assert!(
        failure.message.contains("did not return within 300 ms"),
        "{failure}"
    );
    assert_eq!(chain.quarantined(), ["sleeper"]);
    for _ in 0..2 {
        let started = Instant::now();
        let failure = chain.run(history(), &ctx, Call::Process).unwrap_err();
        assert!(started.elapsed() < Duration::from_millis(250), "not called again");
        assert_eq!(failure.plugin, "sleeper");
        assert!(
            failure.message.starts_with("quarantined:") && failure.message.contains("a required plugin"),
            "{failure}"
        );
    }
}

#[test]
fn under_fail_the_turn_fails_naming_the_plugin_with_status_4() {
    let dir = plugin_dir_with(&[&fixture_library("sleeper")]);
    let config = config("fail", "", dir.path());
    let started = Instant::now();
    let output = config.process(&[], HISTORY);
    assert!(started.elapsed() < BOUND, "{:?}", started.elapsed());
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr
            .lines()
            .last()
            .unwrap()
            .starts_with("history-host: plugin \"sleeper\" failed: did not return within 300 ms"),
        "{stderr}"
    );
}

/// The run goes on past a late stage, from the history that stage was given (the helper
/// thread's checkpoint): the stages after it run, here `role_pair` in the view, which
/// merges the two user messages; and so on every later run, the stage quarantined.
#[test]
fn the_stages_after_a_late_one_run_on_its_input() {
    let dir = plugin_dir_with_installed(&[&fixture_library("sleeper")]);
    let config = config_with(
        "chain = [\"default\", \"sleeper\", \"tool_result_filter\"]\nview = [\"role_pair\"]",
        "skip",
        "",
        dir.path(),
    );
    let (chain, ctx) = chain_and_context(&config);
    let history = || {
        history_wire::chat::history_from_str(
            r#"[{"role":"system","content":"s"},{"role":"user","content":"task"},
                {"role":"user","content":"and more"},{"role":"assistant","content":"done"}]"#,
        )
        .unwrap()
    };
    for late in [true, false, false] {
        let started = Instant::now();
        let run = chain.run(history(), &ctx, Call::Process).unwrap();
        assert!(started.elapsed() < BOUND, "{:?}", started.elapsed());
        let names: Vec<&str> = run.stages.iter().map(|s| s.plugin.as_str()).collect();
        assert_eq!(names, ["default", "sleeper", "tool_result_filter", "role_pair"]);
        let sleeper = &run.stages[1];
        assert!(sleeper.quarantined, "{sleeper:?}");
        let why = sleeper.skipped.as_deref().unwrap();
        assert_eq!(why.starts_with("did not return within 300 ms"), late, "{why}");
        for after in &run.stages[2..] {
            assert!(after.skipped.is_none() && !after.quarantined, "{after:?}");
            assert_eq!(after.messages_in, 4, "{after:?}");
        }
        assert_eq!(
            run.working.len(),
            4,
            "the chain's output is the late stage's input"
        );
        assert_eq!(
            run.history.len(),
            3,
            "the view ran: the two user messages are one"
        );
        assert!(run.stages[3]
            .events
            .iter()
            .any(|e| e.kind.as_str() == "message-merged"));
    }
}

/// An ingest plugin past the deadline fails the call whatever `on_plugin_error` says:
/// unredacted text is never passed on (docs/chain.md#ingest).
#[test]
fn a_late_ingest_plugin_fails_the_call() {
    let dir = plugin_dir_with(&[&fixture_library("sleeper")]);
    let config = config_with(
        "chain = [\"default\"]\ningest = [\"sleeper\"]",
        "skip",
        "",
        dir.path(),
    );
    let started = Instant::now();
    let output = config.process(&[], HISTORY);
    assert!(started.elapsed() < BOUND, "{:?}", started.elapsed());
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("plugin \"sleeper\" failed: did not return within 300 ms"),
        "{stderr}"
    );
}

#[test]
fn a_call_within_the_deadline_is_not_a_fault() {
    let dir = plugin_dir_with(&[&fixture_library("sleeper")]);
    let config = config("fail", "[plugin.sleeper]\nms = 20\n", dir.path());
    for _ in 0..3 {
        let run = config.run("default", HISTORY, None).unwrap();
        assert!(run.stages.iter().all(|s| s.skipped.is_none() && !s.quarantined));
    }
    let none = TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"sleeper\"]\non_plugin_error = \"fail\"\nplugin_timeout_ms = 0\n[plugin.sleeper]\nms = 400\n",
        dir.path().display().to_string()
    ));
    assert!(none.run("default", HISTORY, None).is_ok(), "0 is no deadline");
}

#[test]
fn serve_answers_422_in_time_then_skips_the_quarantined_plugin_and_health_says_why() {
    let dir = plugin_dir_with(&[&fixture_library("sleeper")]);
    let config = config("fail", "", dir.path());
    let server = Server::start(&config.path, &config.dir.path().join("sessions.db"), &[]);
    assert_eq!(server.get("/healthz").status, 200);
    let id = server.create("default");
    let turn = |text: &str| {
        server.post(
            &format!("/v1/sessions/{id}/turns"),
            &j!({"messages": [{"role": "user", "content": text}]}),
        )
    };
    let started = Instant::now();
    let answer = turn("first");
    assert!(started.elapsed() < BOUND, "{:?}", started.elapsed());
    assert_eq!(answer.status, 422, "{answer:?}");
    let (code, message) = answer.error();
    assert_eq!(code, "plugin_failed");
    assert!(
        message.starts_with("plugin \"sleeper\" failed: did not return within 300 ms"),
        "{message}"
    );

    let health = server.get("/healthz");
    assert_eq!(health.status, 503, "{health:?}");
    let reason = health.body.as_str().unwrap_or_default().to_string();
    assert!(reason.contains("plugin \"sleeper\" quarantined"), "{reason}");

    let started = Instant::now();
    let answer = turn("second");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(answer.status, 200, "{answer:?}");
    let stats = answer.body["stats"].as_array().unwrap();
    assert!(
        stats[1]["skipped"].as_str().unwrap().starts_with("quarantined:"),
        "{stats:?}"
    );
    let metrics = server
        .get("/metrics")
        .body
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        metrics.contains("history_plugin_errors_total{plugin=\"sleeper\",kind=\"quarantined\"} 1"),
        "{metrics}"
    );
    let chain = server.get("/v1/chain");
    assert_eq!(chain.body["stages"][1]["quarantined"], true, "{chain:?}");
    assert!(
        server
            .stderr()
            .contains("plugin \"sleeper\" skipped: quarantined"),
        "a warning on every later turn: {}",
        server.stderr()
    );
}
