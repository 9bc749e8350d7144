//! Isolated plugins (docs/chain.md#isolation): `[history] isolate` runs a plugin in a
//! worker process of `history-host`, so its abort, exit, segfault or endless loop is that
//! call's fault — named, with how the worker died — and the host carries on: `process`
//! reports it, `serve` keeps serving on a new worker. The fixture `faulter` faults on
//! `FAULT NOW` in the history and otherwise tags its output with the pid it ran in.

use std::time::{Duration, Instant};

use e2e_tests::fixtures::{fixture_library, plugin_dir_with, plugin_dir_with_installed};
use e2e_tests::server::{shipped_config, Server};
use e2e_tests::{agentctl, describe, host_bin, json, real_conversations, TestConfig};
use history_engine::{load_chain, stateless_context, Call};
use serde_json::json as j;

const HISTORY: &str = r#"[{"role":"system","content":"You are terse."},
    {"role":"user","content":"Find the flights to Lisbon"},
    {"role":"assistant","content":"Three flights leave tomorrow morning."}]"#;

const FAULTING: &str = r#"[{"role":"system","content":"You are terse."},
    {"role":"user","content":"FAULT NOW"},
    {"role":"assistant","content":"ok"}]"#;

/// Each fault, and how the worker's death is told.
const FAULTS: [(&str, &str); 4] = [
    ("abort", "was killed by signal 6 (SIGABRT) during the call"),
    ("exit", "exited with status 1 during the call"),
    ("segfault", "was killed by signal 11 (SIGSEGV) during the call"),
    (
        "loop",
        "did not return within 1500 ms (plugin_timeout_ms); its worker (pid ",
    ),
];

/// Generous: the deadline is 1.5 s, the machine may be loaded.
const BOUND: Duration = Duration::from_secs(30);

/// `chain = [default, faulter]` with faulter isolated (unless `isolated` is false) and
/// faulting with `fault`. The model counts with `chars4`, so no tokenizer loads in a timed
/// call.
fn config(fault: &str, on_error: &str, isolated: bool, dir: &std::path::Path) -> TestConfig {
    TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"faulter\"]\non_plugin_error = \"{on_error}\"\n\
         plugin_timeout_ms = 1500\n{}\n[models.default]\ntokenizer = \"chars4\"\n[plugin.faulter]\nfault = \"{fault}\"\n",
        dir.display().to_string(),
        if isolated { "isolate = [\"faulter\"]" } else { "" }
    ))
}

/// The pid the faulter's last tag names in `text`.
fn tagged_pid(text: &str) -> u32 {
    let at = text
        .rfind("[faulter pid ")
        .unwrap_or_else(|| panic!("no tag in {text}"));
    text[at + 13..].split(' ').next().unwrap().parse().unwrap()
}

/// The worker command of the real `history-host`, for chains loaded in this test process.
fn with_workers() {
    history_engine::isolate::set_worker_command(host_bin(), ["worker"]);
}

#[test]
fn each_fault_of_an_isolated_plugin_is_reported_and_skipped_under_skip() {
    let dir = plugin_dir_with(&[&fixture_library("faulter")]);
    for (fault, told) in FAULTS {
        let config = config(fault, "skip", true, dir.path());
        let started = Instant::now();
        let output = config.process(&["--explain"], FAULTING);
        assert!(started.elapsed() < BOUND, "{fault}: {:?}", started.elapsed());
        assert!(output.status.success(), "{fault}: {}", describe(&output));
        assert_eq!(
            json(&String::from_utf8_lossy(&output.stdout)),
            json(FAULTING),
            "{fault}: the history passed on as the plugin received it"
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        let warning = stderr
            .lines()
            .find(|line| line.contains("plugin \"faulter\" skipped: "))
            .unwrap_or_else(|| panic!("{fault}: {stderr}"));
        assert!(warning.contains(told), "{fault}: {warning}");
        assert!(
            stderr.contains("[skipped: faulter]") || stderr.contains("skipped (history passed on unchanged)"),
            "{fault}: {stderr}"
        );
    }
}

#[test]
fn each_fault_of_an_isolated_plugin_fails_the_turn_under_fail_with_status_4() {
    let dir = plugin_dir_with(&[&fixture_library("faulter")]);
    for (fault, told) in FAULTS {
        let config = config(fault, "fail", true, dir.path());
        let output = config.process(&[], FAULTING);
        assert_eq!(output.status.code(), Some(4), "{fault}: {}", describe(&output));
        assert!(output.stdout.is_empty(), "{fault}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("history-host: plugin \"faulter\" failed: ") && last.contains(told),
            "{fault}: {stderr}"
        );
    }
    // The same abort in-process takes the host down: what isolation is for.
    let output = config("abort", "fail", false, dir.path()).process(&[], FAULTING);
    assert_eq!(
        output.status.code(),
        None,
        "killed by SIGABRT: {}",
        describe(&output)
    );
}

/// Code that runs when the library is opened runs in the worker: a constructor that
/// raises SIGBUS is that plugin's refusal at load (status 3), and the host says how.
#[test]
fn a_library_that_crashes_while_it_loads_is_refused_not_fatal() {
    let dir = plugin_dir_with(&[&fixture_library("crasher")]);
    let config = TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"crasher\"]\nisolate = [\"crasher\"]\n",
        dir.path().display().to_string()
    ));
    let output = config.process(&[], HISTORY);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains("plugin \"crasher\" in the chain cannot be loaded: ")
            && stderr.contains("was killed by signal 7 (SIGBUS) while it loaded the library"),
        "{stderr}"
    );
}

#[test]
fn an_isolated_plugin_runs_in_a_worker_with_the_hosts_services() {
    let dir = plugin_dir_with(&[&fixture_library("faulter")]);
    let config = config("abort", "fail", true, dir.path());
    let output = config.process(&[], HISTORY);
    assert!(output.status.success(), "{}", describe(&output));
    let out = json(&String::from_utf8_lossy(&output.stdout));
    let first = out[0]["content"].as_str().unwrap();
    // The tokens the worker counted are the host's count of the same content.
    let history = history_wire::chat::history_from_str(HISTORY).unwrap();
    let tokens: u64 = history
        .iter()
        .map(|m| history_engine::tokens::message_tokens(plugin_api::Tokenizer::Chars4, m, 0))
        .sum();
    assert!(
        first.starts_with("You are terse. [faulter pid ") && first.ends_with(&format!(" tokens {tokens}]")),
        "{first}"
    );
    assert_eq!(out[1], json(HISTORY)[1], "the rest passed through as it came");
    // Its log lines reach the host's log under its name, from `new` and from the call.
    let stderr = String::from_utf8_lossy(&output.stderr);
    for line in ["faulter built", "faulter saw 3 messages"] {
        assert!(
            stderr
                .lines()
                .any(|l| l.contains(line) && l.contains("plugin=faulter")),
            "{line}: {stderr}"
        );
    }

    // In this process: the plugin ran in another one, for `process` and `on_model_switch`.
    with_workers();
    let (loaded, _catalog, chain) = load_chain(&config.path).unwrap();
    assert!(chain.stages()[1].is_isolated() && !chain.stages()[0].is_isolated());
    assert_eq!(chain.stages()[1].version, "0.1.0");
    let ctx = stateless_context(&loaded, loaded.model("default"), 1);
    let history = || history_wire::chat::history_from_str(HISTORY).unwrap();
    let run = chain.run(history(), &ctx, Call::Process).unwrap();
    let pid = tagged_pid(run.history[0].content.text().as_str());
    assert_ne!(pid, std::process::id());
    let (old, new) = (loaded.model("default"), loaded.model("other"));
    let switched = chain
        .run(history(), &ctx, Call::ModelSwitch { old: &old, new: &new })
        .unwrap();
    assert_eq!(
        tagged_pid(switched.history[0].content.text().as_str()),
        pid,
        "the idle worker serves the next call"
    );
    let faulting = history_wire::chat::history_from_str(FAULTING).unwrap();
    let failure = chain
        .run(faulting, &ctx, Call::ModelSwitch { old: &old, new: &new })
        .unwrap_err();
    assert_eq!(failure.plugin, "faulter");
    assert!(
        failure.message.contains(&format!(
            "its worker (pid {pid}) was killed by signal 6 (SIGABRT)"
        )),
        "{failure}"
    );
    // The next call starts a new worker.
    let run = chain.run(history(), &ctx, Call::Process).unwrap();
    assert_ne!(tagged_pid(run.history[0].content.text().as_str()), pid);
    assert_eq!(chain.stages()[1].worker_starts(), Some(2));
}

#[test]
fn serve_keeps_serving_on_a_new_worker_after_each_fault() {
    let dir = plugin_dir_with(&[&fixture_library("faulter")]);
    for (fault, told) in FAULTS {
        let config = config(fault, "fail", true, dir.path());
        let server = Server::start(&config.path, &config.dir.path().join("sessions.db"), &[]);
        let turn = |id: &str, text: &str| {
            server.post(
                &format!("/v1/sessions/{id}/turns"),
                &j!({"messages": [{"role": "user", "content": text}]}),
            )
        };
        let healthy = server.create("default");
        let answer = turn(&healthy, "hello");
        assert_eq!(answer.status, 200, "{fault}: {answer:?}");
        let first_pid = tagged_pid(answer.body["history"][0]["content"].as_str().unwrap());
        assert_ne!(first_pid, server.pid(), "{fault}: it runs in a worker");

        let faulting = server.create("default");
        let started = Instant::now();
        let answer = turn(&faulting, "FAULT NOW");
        assert!(started.elapsed() < BOUND, "{fault}: {:?}", started.elapsed());
        assert_eq!(answer.status, 422, "{fault}: {answer:?}");
        let (code, message) = answer.error();
        assert_eq!(code, "plugin_failed", "{fault}");
        assert!(
            message.starts_with("plugin \"faulter\" failed: ") && message.contains(told),
            "{fault}: {message}"
        );
        assert!(
            message.contains(&format!("(pid {first_pid})")),
            "{fault}: the worker that served the first turn: {message}"
        );

        // The service goes on: the next turns run the plugin on a new worker.
        for text in ["again", "and again"] {
            let answer = turn(&healthy, text);
            assert_eq!(answer.status, 200, "{fault}: {answer:?}");
            let pid = tagged_pid(answer.body["history"][0]["content"].as_str().unwrap());
            assert_ne!(pid, first_pid, "{fault}: a new worker");
        }
        assert_eq!(server.get("/healthz").status, 200, "{fault}: not quarantined");
        let chain = server.get("/v1/chain");
        assert_eq!(chain.body["stages"][0]["worker_starts"], j!(null), "{chain:?}");
        assert_eq!(
            chain.body["stages"][1]["worker_starts"],
            j!(2),
            "{fault}: the first worker, then one after the fault: {chain:?}"
        );
        assert!(server.stop().success(), "{fault}");
    }
}

/// The shipped chain with every stage isolated gives, on every real conversation, the
/// very bytes the same chain gives in-process — and the same events and counts per stage.
#[test]
fn isolated_shipped_plugins_give_byte_identical_output_on_real_conversations() {
    let in_process = shipped_config("", &[]);
    let isolated = shipped_config(
        "",
        &[(
            "view = ",
            "view = [\"role_pair\"]\nisolate = [\"default\", \"tool_result_filter\", \"retention\", \"token_budget\", \"role_pair\"]",
        )],
    );
    with_workers();
    let (config, _, direct) = load_chain(&in_process.path).unwrap();
    let (_, _, workers) = load_chain(&isolated.path).unwrap();
    assert!(workers
        .stages()
        .iter()
        .chain(workers.view_stages())
        .all(|s| s.is_isolated()));
    let conversations = real_conversations();
    assert!(conversations.len() >= 4);
    for (name, text) in &conversations {
        for model in ["default", "local-8k", "gpt-4-turbo"] {
            let history = || history_wire::chat::history_from_str(text).unwrap();
            let turn = history_engine::turns::current_turn(&history(), None);
            let ctx = stateless_context(&config, config.model(model), turn);
            let a = direct.run(history(), &ctx, Call::Process).unwrap();
            let b = workers.run(history(), &ctx, Call::Process).unwrap();
            let bytes =
                |h: &[plugin_api::RArc<plugin_api::Message>]| history_wire::chat::history_to_string(h);
            assert_eq!(bytes(&b.history), bytes(&a.history), "{name} {model}: sent");
            assert_eq!(bytes(&b.working), bytes(&a.working), "{name} {model}: working");
            for (x, y) in a.stages.iter().zip(&b.stages) {
                assert_eq!(
                    (&y.plugin, y.messages_out, y.tokens_out, &y.events, &y.skipped),
                    (&x.plugin, x.messages_out, x.tokens_out, &x.events, &x.skipped),
                    "{name} {model}"
                );
            }
        }
    }
    // And through the binary, byte for byte on stdout.
    for (name, text) in conversations.iter().take(3) {
        let a = in_process.process(&["--model", "local-8k"], text);
        let b = isolated.process(&["--model", "local-8k"], text);
        assert!(
            a.status.success() && b.status.success(),
            "{name}: {}",
            describe(&b)
        );
        assert_eq!(b.stdout, a.stdout, "{name}");
    }
}

#[test]
fn isolate_must_name_a_plugin_that_runs_and_agentctl_shows_it() {
    let dir = plugin_dir_with_installed(&[&fixture_library("faulter")]);
    let path = dir.path().display().to_string();
    let refused = TestConfig::new(&format!(
        "plugin_dir = {path:?}\n[history]\nchain = [\"default\"]\n\nisolate = [\"faulter\"]\n"
    ));
    let output = refused.process(&[], HISTORY);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(":5: plugin \"faulter\" in `isolate` is in neither the chain nor the view"),
        "{stderr}"
    );
    let check = agentctl(&refused.path, &["check"], &[]);
    assert_eq!(check.status.code(), Some(1), "{}", describe(&check));

    let config = TestConfig::new(&format!(
        "plugin_dir = {path:?}\n[history]\nchain = [\"default\", \"faulter\"]\nisolate = [\"faulter\"]\n"
    ));
    let check = agentctl(&config.path, &["check", "--json"], &[]);
    assert!(check.status.success(), "{}", describe(&check));
    let report = json(&String::from_utf8_lossy(&check.stdout));
    assert_eq!(report["isolate"], j!(["faulter"]), "{report}");
    let text = agentctl(&config.path, &["check"], &[]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("isolated (run in a worker process): faulter"),
        "{}",
        describe(&text)
    );
    let listed = agentctl(&config.path, &["plugins", "--json"], &[]);
    let value = json(&String::from_utf8_lossy(&listed.stdout));
    let entry = |name: &str| {
        value["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{value}"))
            .clone()
    };
    assert_eq!(entry("faulter")["isolated"], true, "{value}");
    assert_eq!(entry("default")["isolated"], false, "{value}");

    // The edits, by the same rules as `required`.
    let edited = TestConfig::new(&format!(
        "plugin_dir = {path:?}\n[history]\nchain = [\"default\", \"faulter\"]  # the chain\n"
    ));
    let output = agentctl(&edited.path, &["history-isolate", "faulter"], &[]);
    assert!(output.status.success(), "{}", describe(&output));
    let text = std::fs::read_to_string(&edited.path).unwrap();
    assert!(
        text.contains("chain = [\"default\", \"faulter\"]  # the chain\nisolate = [\"faulter\"]\n"),
        "{text}"
    );
    let output = agentctl(&edited.path, &["history-isolate", "role_pair"], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("plugin \"role_pair\" is not in the chain"),
        "{}",
        describe(&output)
    );
    let output = agentctl(&edited.path, &["history-unisolate", "faulter"], &[]);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(!std::fs::read_to_string(&edited.path).unwrap().contains("isolate"));
}

/// `text` with the faulter's pid tag blanked: the one thing an isolated run differs in.
fn without_pid(text: &str) -> String {
    match text.find("[faulter pid ") {
        Some(at) => {
            let rest = &text[at + 13..];
            let end = rest.find(' ').unwrap_or(rest.len());
            format!("{}[faulter pid P{}", &text[..at], &rest[end..])
        }
        None => text.to_string(),
    }
}

/// Every event kind crosses the worker's pipe as it is (docs/chain.md#isolation): the
/// fixture's one event of each kind there is (`EventKind::ALL`, so a kind added later is
/// tested as soon as it exists), the redactor's `message-changed` and the shipped
/// `summarize`'s `message-summarized`, each plugin isolated, give the events and the bytes
/// they give in-process — under `on_plugin_error = "fail"`, where a frame the host could not
/// read would fail the turn.
#[test]
fn every_event_kind_crosses_the_workers_pipe_as_in_process() {
    with_workers();
    let dir = plugin_dir_with_installed(&[&fixture_library("faulter"), &fixture_library("redactor")]);
    let body = |isolate: &str| {
        format!(
            "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"redactor\", \"summarize\", \"faulter\"]\n\
             agent_max_ctx = 100000\non_plugin_error = \"fail\"\n{isolate}\n\
             [models.c4]\ntokenizer = \"chars4\"\nmax_context = 100000\n\
             [plugin.summarize]\ntrigger_tokens = 12000\nkeep_tokens = 6000\ntarget_chars = 2000\n\
             [plugin.faulter]\nevents = true\n",
            dir.path().display().to_string()
        )
    };
    let in_process = TestConfig::new(&body(""));
    let isolated = TestConfig::new(&body("isolate = [\"redactor\", \"summarize\", \"faulter\"]"));
    // A long generated conversation (summarize summarizes) whose newest turn has a secret;
    // each message with an id, so a summary names the same messages in both runs.
    let mut messages = history_bench::generate(300, 11);
    messages.push(j!({"role": "user", "content": "The deploy key is SECRET; use it."}));
    for (i, message) in messages.iter_mut().enumerate() {
        message["metadata"] = j!({"id": format!("g{i}")});
    }
    let text = serde_json::Value::Array(messages).to_string();
    crate::common::on_big_stack(|| {
        let a = in_process.run("c4", &text, None).unwrap();
        let b = isolated.run("c4", &text, None).unwrap();
        let bytes = |h: &[plugin_api::RArc<plugin_api::Message>]| {
            without_pid(&history_wire::chat::history_to_string(h))
        };
        assert_eq!(bytes(&b.history), bytes(&a.history));
        assert!(!bytes(&b.history).contains("SECRET"), "redacted in the worker");
        for (x, y) in a.stages.iter().zip(&b.stages) {
            assert_eq!(y.skipped, None, "{}", y.plugin);
            assert_eq!(y.events, x.events, "{}: the same events", y.plugin);
        }
        let kinds = |plugin: &str| -> Vec<&str> {
            let stage = b.stages.iter().find(|s| s.plugin == plugin).unwrap();
            stage.events.iter().map(|e| e.kind.as_str()).collect()
        };
        assert_eq!(kinds("redactor"), ["message-changed"]);
        let summarized = kinds("summarize");
        assert!(
            summarized.len() > 10 && summarized.iter().all(|k| *k == "message-summarized"),
            "{summarized:?}"
        );
        let every: Vec<&str> = plugin_api::EventKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(kinds("faulter"), every);
    });
    // Through the binary: the turn succeeds with every plugin isolated, the same output.
    let a = in_process.process(&["--model", "c4"], &text);
    let b = isolated.process(&["--model", "c4", "--explain"], &text);
    assert!(b.status.success(), "{}", describe(&b));
    assert_eq!(
        without_pid(&String::from_utf8_lossy(&b.stdout)),
        without_pid(&String::from_utf8_lossy(&a.stdout))
    );
    let stderr = String::from_utf8_lossy(&b.stderr);
    assert!(
        !stderr.contains("broken frame") && !stderr.contains("skipped"),
        "{stderr}"
    );
}
