//! Hot reload of a running `serve` (docs/chain.md#hot-reload): while clients run turns on
//! live sessions, a rebuilt library, an `agentctl` edit, a broken hand edit and its fix
//! are picked up or refused, and no turn fails.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e_tests::fixtures::{fixture_library, plugin_dir_with, plugin_dir_with_installed};
use e2e_tests::server::{agent, request, Server};
use e2e_tests::{agentctl, describe, TestConfig};
use history_engine::shadow::ShadowLibraries;
use history_engine::{library_file_name, Catalog};
use prometheus_parse::{Scrape, Value as Metric};
use serde_json::{json as j, Value};

const TOKEN: &str = "operator-token-for-reload-tests";

/// How long a change may take to be picked up on a loaded machine (debounce, loading the
/// chain, the sample run).
const PICKUP: Duration = Duration::from_secs(60);

/// Polls `done` every 50 ms for at most [`PICKUP`]; panics with `what` past it.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < PICKUP, "not within {PICKUP:?}: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn reloads(server: &Server, outcome: &str) -> f64 {
    let answer = server.get("/metrics");
    assert_eq!(answer.status, 200, "{answer:?}");
    let text = answer.body.as_str().expect("text").to_string();
    let scrape = Scrape::parse(text.as_bytes().lines()).expect("the Prometheus text format");
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == "history_reloads_total" && s.labels.get("outcome") == Some(outcome))
        .unwrap_or_else(|| panic!("no history_reloads_total{{outcome={outcome:?}}}:\n{text}"));
    match sample.value {
        Metric::Counter(v) | Metric::Untyped(v) => v,
        ref other => panic!("history_reloads_total is not a counter: {other:?}"),
    }
}

/// The running chain's stages as `name@version`.
fn stages(server: &Server) -> Vec<String> {
    let chain = server.get("/v1/chain").body;
    chain["stages"]
        .as_array()
        .unwrap_or_else(|| panic!("{chain}"))
        .iter()
        .map(|s| {
            format!(
                "{}@{}",
                s["name"].as_str().unwrap(),
                s["version"].as_str().unwrap()
            )
        })
        .collect()
}

/// One turn whose user message says `TAG step N`: the build of `tagger` that ran it, as
/// its sent history shows (`build one` / `build two`), or the failure.
fn tagged_turn(agent: &ureq::Agent, url: &str, n: u64) -> Result<String, String> {
    let messages = j!([
        {"role": "user", "content": format!("TAG step {n}")},
        {"role": "assistant", "content": format!("done {n}")},
    ]);
    let answer = request(agent, "POST", url, Some(&j!({ "messages": messages })), None);
    if answer.status != 200 {
        return Err(format!("turn {n}: {answer:?}"));
    }
    let history = answer.body["history"].as_array().cloned().unwrap_or_default();
    let user = history
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string();
    match user.strip_suffix(&format!(" step {n}")) {
        Some(build) => Ok(build.to_string()),
        None => Err(format!("turn {n}: the last user message is {user:?}")),
    }
}

/// What one client of the loop saw: the build of each turn, and every failure.
#[derive(Debug, Default)]
struct ClientLog {
    builds: Vec<String>,
    failures: Vec<String>,
}

/// A client running turns on its own session until `stop` (at most 5,000 turns, 5 min).
struct Client {
    thread: std::thread::JoinHandle<ClientLog>,
    /// Turns answered so far.
    turns: Arc<AtomicUsize>,
}

impl Client {
    fn start(server: &Server, stop: Arc<AtomicBool>) -> Client {
        let id = server.create("default");
        let url = server.url(&format!("/v1/sessions/{id}/turns"));
        let turns = Arc::new(AtomicUsize::new(0));
        let counted = turns.clone();
        let thread = std::thread::spawn(move || {
            let agent = agent();
            let started = Instant::now();
            let mut log = ClientLog::default();
            for n in 1..=5000 {
                if stop.load(Ordering::SeqCst) || started.elapsed() > Duration::from_secs(300) {
                    break;
                }
                match tagged_turn(&agent, &url, n) {
                    Ok(build) => log.builds.push(build),
                    Err(failure) => log.failures.push(failure),
                }
                counted.fetch_add(1, Ordering::SeqCst);
            }
            log
        });
        Client { thread, turns }
    }
}

/// Waits until every client has answered another turn: the loop runs through each step.
fn clients_move_on(clients: &[Client], step: &str) {
    let before: Vec<usize> = clients.iter().map(|c| c.turns.load(Ordering::SeqCst)).collect();
    wait_until(&format!("every client runs turns {step}"), || {
        clients
            .iter()
            .zip(&before)
            .all(|(c, b)| c.turns.load(Ordering::SeqCst) > *b)
    });
}

/// The shadow copies of `file_name` in `plugin_dir`.
fn shadow_copies(plugin_dir: &Path, file_name: &str) -> Vec<PathBuf> {
    let Ok(folders) = std::fs::read_dir(plugin_dir.join(".shadow")) else {
        return Vec::new();
    };
    let mut copies: Vec<PathBuf> = folders
        .map(|f| f.unwrap().path().join(file_name))
        .filter(|copy| copy.exists())
        .collect();
    copies.sort();
    copies
}

#[test]
fn serve_reloads_a_rebuilt_library_and_config_edits_and_refuses_a_broken_edit_while_turns_run() {
    let (one, two) = (fixture_library("tagger_one"), fixture_library("tagger_two"));
    let tagger = library_file_name("tagger");
    let plugins = plugin_dir_with_installed(&[]);
    let installed = plugins.path().join(&tagger);
    std::fs::copy(&one, &installed).unwrap();
    // A copy a previous run left, which no process uses: removed at start.
    let stale = plugins
        .path()
        .join(".shadow")
        .join("0123456789abcdef0123456789abcdef");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join(&tagger), "an old build").unwrap();
    let config = TestConfig::new(&format!(
        "plugin_dir = {:?}\nmax_users = 50\n\n[history]\nchain = [\"default\", \"tagger\"]\non_plugin_error = \"fail\"\n",
        plugins.path().display().to_string()
    ));
    let server = Server::start(
        &config.path,
        &config.dir.path().join("sessions.db"),
        &[("HISTORY_OPERATOR_TOKEN", TOKEN)],
    );
    assert!(!stale.exists(), "the unused shadow copy is removed at start");
    assert_eq!(stages(&server), ["default@0.1.0", "tagger@1.0.0"]);
    assert_eq!(
        shadow_copies(plugins.path(), &tagger).len(),
        1,
        "loaded from a shadow copy"
    );
    assert_eq!(server.get("/v1/chain").body["last_reload"], Value::Null);

    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<Client> = (0..3).map(|_| Client::start(&server, stop.clone())).collect();
    clients_move_on(&clients, "on the first build");
    let probe = server.create("default");
    let probe_url = server.url(&format!("/v1/sessions/{probe}/turns"));
    let probe_agent = agent();
    let mut probe_turn = 0;
    let mut probe_build = || {
        probe_turn += 1;
        tagged_turn(&probe_agent, &probe_url, probe_turn).unwrap()
    };
    assert_eq!(probe_build(), "build one");

    // A rebuild: the new library is written over the file in plugin_dir.
    std::fs::copy(&two, &installed).unwrap();
    wait_until("the rebuilt tagger serves", || {
        stages(&server) == ["default@0.1.0", "tagger@2.0.0"]
    });
    assert_eq!(probe_build(), "build two", "the next turn uses the new build");
    let copies = shadow_copies(plugins.path(), &tagger);
    assert_eq!(copies.len(), 2, "one shadow copy per content: {copies:?}");
    let new_copy = std::fs::read(&two).unwrap();
    assert!(
        copies.iter().any(|copy| std::fs::read(copy).unwrap() == new_copy),
        "the new build runs from its own shadow copy"
    );
    assert_eq!(reloads(&server, "ok"), 1.0);
    clients_move_on(&clients, "after the rebuild");
    let last = server.get("/v1/chain").body["last_reload"].clone();
    assert_eq!(
        (last["outcome"].as_str(), &last["error"]),
        (Some("ok"), &Value::Null),
        "{last}"
    );

    // agentctl's edit.
    let added = agentctl(&config.path, &["history-chain-add", "dedupe"], &[]);
    assert!(added.status.success(), "{}", describe(&added));
    wait_until("agentctl's history-chain-add is picked up", || {
        stages(&server) == ["default@0.1.0", "tagger@2.0.0", "dedupe@0.1.0"]
    });
    assert_eq!(reloads(&server, "ok"), 2.0);
    clients_move_on(&clients, "after agentctl's edit");

    // A runtime command writes the file itself: applied at once, and not reloaded again.
    let answer = server.request(
        "POST",
        &format!("/v1/sessions/{probe}/commands"),
        Some(&j!({"command": "!maxusers 40"})),
        true,
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(std::fs::read_to_string(&config.path)
        .unwrap()
        .contains("max_users = 40"));
    assert_eq!(server.get("/v1/chain").body["max_users"], 40);
    // Past the debounce, the command's own write has reloaded nothing.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(reloads(&server, "ok"), 2.0, "{}", server.stderr());
    assert_eq!(server.get("/v1/chain").body["max_users"], 40);

    // A hand edit that breaks the configuration: a plugin name mistyped.
    let good = std::fs::read_to_string(&config.path).unwrap();
    let broken = good.replace("\"dedupe\"", "\"dedup\"");
    assert_ne!(broken, good);
    save(&config.path, &broken);
    wait_until("the broken edit is refused", || reloads(&server, "failed") == 1.0);
    // The old chain serves: the host is alive and ready (a liveness probe must not
    // restart it onto the bad file), and readiness says what was refused as a note.
    assert_eq!(server.get("/livez").status, 200);
    for probe in ["/readyz", "/healthz"] {
        let health = server.get(probe);
        assert_eq!(health.status, 200, "{probe} after a refused reload: {health:?}");
        let said = health.body.as_str().unwrap_or_default();
        assert!(
            said.starts_with("ok\n")
                && said.contains("note: chain reload failed")
                && said.contains("\"dedup\"")
                && said.contains("previous chain keeps serving"),
            "{probe}: {said}"
        );
    }
    let last = server.get("/v1/chain").body["last_reload"].clone();
    assert_eq!(last["outcome"], "failed", "{last}");
    assert!(
        last["error"].as_str().unwrap_or_default().contains("\"dedup\""),
        "{last}"
    );
    assert!(last["at"].as_str().is_some_and(|at| at.ends_with('Z')), "{last}");
    assert_eq!(
        stages(&server),
        ["default@0.1.0", "tagger@2.0.0", "dedupe@0.1.0"],
        "the old chain serves"
    );
    assert_eq!(probe_build(), "build two");
    let errors: Vec<String> = server
        .stderr()
        .lines()
        .filter(|l| l.contains("chain reload refused"))
        .map(str::to_string)
        .collect();
    assert_eq!(errors.len(), 1, "one logged error line: {errors:?}");
    clients_move_on(&clients, "while the broken edit is refused");

    // Fixed: reloaded, healthy again.
    let fixed = good.replace("\"dedupe\"]", "\"dedupe\", \"role_pair\"]");
    assert_ne!(fixed, good);
    save(&config.path, &fixed);
    wait_until("the fix is reloaded", || reloads(&server, "ok") == 3.0);
    let health = server.get("/readyz");
    assert_eq!(health.status, 200, "{health:?}");
    assert_eq!(health.body, "ok\n", "the note is gone");
    assert_eq!(server.get("/v1/chain").body["last_reload"]["outcome"], "ok");
    assert_eq!(
        stages(&server),
        ["default@0.1.0", "tagger@2.0.0", "dedupe@0.1.0", "role_pair@0.1.0"]
    );
    assert_eq!(reloads(&server, "failed"), 1.0, "{}", server.stderr());
    assert_eq!(
        shadow_copies(plugins.path(), &tagger).len(),
        2,
        "reloads of an unchanged library reuse the one loaded: no new copy"
    );
    assert_eq!(
        shadow_copies(plugins.path(), &library_file_name("dedupe")).len(),
        1
    );
    clients_move_on(&clients, "after the fix");

    stop.store(true, Ordering::SeqCst);
    for client in clients {
        let log = client.thread.join().unwrap();
        assert!(log.failures.is_empty(), "a turn failed: {:?}", log.failures);
        let first_two = log.builds.iter().position(|b| b == "build two");
        let first_two =
            first_two.unwrap_or_else(|| panic!("this client never ran on the new build: {:?}", log.builds));
        assert!(first_two > 0, "this client ran no turn on the old build");
        assert!(
            log.builds[..first_two].iter().all(|b| b == "build one")
                && log.builds[first_two..].iter().all(|b| b == "build two"),
            "once a turn ran on the new build, every later one does: {:?}",
            log.builds
        );
    }
    assert!(server.stop().success());
}

#[test]
fn a_reload_ends_a_quarantine_and_a_chain_that_hangs_on_the_sample_is_refused() {
    let plugins = plugin_dir_with(&[&fixture_library("sleeper")]);
    // `sleeper` never returns without `ms`; the deadline quarantines it.
    let body = format!(
        "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"sleeper\"]\non_plugin_error = \"skip\"\nplugin_timeout_ms = 300\n[models.default]\ntokenizer = \"chars4\"\n",
        plugins.path().display().to_string()
    );
    let config = TestConfig::new(&body);
    let server = Server::start(&config.path, &config.dir.path().join("sessions.db"), &[]);
    let id = server.create("default");
    let turn = |text: &str| {
        let answer = server.post(
            &format!("/v1/sessions/{id}/turns"),
            &j!({"messages": [{"role": "user", "content": text}]}),
        );
        assert_eq!(answer.status, 200, "{answer:?}");
        answer.body["stats"][1].clone()
    };
    assert_eq!(turn("first")["quarantined"], true);
    let health = server.get("/healthz");
    assert_eq!(health.status, 503, "{health:?}");

    // The same plugin still hanging: the new chain hangs on the sample and is refused.
    std::fs::write(&config.path, format!("{body}\n# touched\n")).unwrap();
    wait_until("the hanging chain is refused", || {
        reloads(&server, "failed") == 1.0
    });
    let reason = server
        .get("/healthz")
        .body
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        reason.contains("chain reload failed")
            && reason.contains("plugin \"sleeper\" faulted on the sample history"),
        "{reason}"
    );
    assert_eq!(turn("second")["quarantined"], true, "the old chain serves");

    // Fixed: the new chain serves, with no plugin quarantined.
    std::fs::write(&config.path, format!("{body}[plugin.sleeper]\nms = 5\n")).unwrap();
    wait_until("the fix is reloaded", || reloads(&server, "ok") == 1.0);
    let health = server.get("/healthz");
    assert_eq!(health.status, 200, "{health:?}");
    let stage = turn("third");
    assert_eq!(
        (&stage["plugin"], &stage["quarantined"], &stage["skipped"]),
        (&j!("sleeper"), &j!(false), &Value::Null)
    );
    assert!(server.stop().success());
}

#[test]
fn shadow_copies_load_each_content_once_and_a_rebuild_as_new_code() {
    let (one, two) = (fixture_library("tagger_one"), fixture_library("tagger_two"));
    let plugins = plugin_dir_with(&[]);
    let installed = plugins.path().join(library_file_name("tagger"));
    std::fs::copy(&one, &installed).unwrap();
    let libraries = Arc::new(ShadowLibraries::new());
    let load = || {
        let catalog = Catalog::discover(plugins.path())
            .unwrap()
            .shadowed(libraries.clone());
        let library = catalog.library("tagger").unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(library.path, installed, "named by its file in plugin_dir");
        library.version.clone()
    };
    let copies = || shadow_copies(plugins.path(), &library_file_name("tagger")).len();
    assert_eq!(load(), "1.0.0");
    assert_eq!(load(), "1.0.0");
    assert_eq!(
        (libraries.hashes().len(), copies()),
        (1, 1),
        "the same content loads once"
    );

    std::fs::copy(&two, &installed).unwrap();
    assert_eq!(load(), "2.0.0", "the rebuilt file is new code");
    assert_eq!((libraries.hashes().len(), copies()), (2, 2));
    std::fs::copy(&one, &installed).unwrap();
    assert_eq!(
        load(),
        "1.0.0",
        "back to the first build: the library already loaded"
    );
    assert_eq!((libraries.hashes().len(), copies()), (2, 2));

    // Only the copies are mapped, never the file a rebuild overwrites.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let installed_text = installed.display().to_string();
    assert!(
        !maps.lines().any(|l| l.ends_with(&installed_text)),
        "{installed_text} is mapped"
    );
    let shadow = plugins.path().join(".shadow").display().to_string();
    assert_eq!(
        maps.lines()
            .filter(|l| l.contains(&shadow) && l.contains(" r-xp "))
            .count(),
        2,
        "each build's copy mapped once:\n{maps}"
    );

    // In use by this process: no cleanup removes them, this process's or another's.
    assert!(libraries.remove_unused(plugins.path()).is_empty());
    assert!(ShadowLibraries::new().remove_unused(plugins.path()).is_empty());
    assert_eq!(copies(), 2);
}

/// Saves an edit of the configuration as an editor's safe save does, whole at once (a
/// temporary file renamed over it): written in place, the watch could read it between
/// the truncation and the write, and report that empty file's error instead.
fn save(path: &std::path::Path, text: &str) {
    let temporary = path.with_extension("toml.saving");
    std::fs::write(&temporary, text).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

/// A configuration saved in place in two writes, the watch waking between them: the
/// half-written file fails to load, but it changes again within a moment, so it is not
/// refused (no failed reload, health stays 200); the whole file then reloads.
#[test]
fn a_file_still_being_written_is_not_refused_and_reloads_once_whole() {
    use std::io::Write;
    let plugins = plugin_dir_with_installed(&[]);
    let head = format!(
        "plugin_dir = {:?}\nmax_users = 50\n\n[history]\n",
        plugins.path().display().to_string()
    );
    let config = TestConfig::new(&format!("{head}chain = [\"default\"]\n"));
    let server = Server::start(&config.path, &config.dir.path().join("sessions.db"), &[]);
    assert_eq!(stages(&server), ["default@0.1.0"]);

    // The first half: the chain's line cut short, not TOML. Past the watch's debounce,
    // so the watch wakes and loads it; the rest comes while that load settles.
    let mut file = std::fs::File::create(&config.path).unwrap();
    file.write_all(format!("{head}chain = [\"default\", ").as_bytes())
        .unwrap();
    file.sync_all().unwrap();
    std::thread::sleep(history_engine::reload::DEBOUNCE + Duration::from_millis(150));
    file.write_all(b"\"role_pair\"]\n").unwrap();
    file.sync_all().unwrap();
    drop(file);

    wait_until("the whole file is reloaded", || reloads(&server, "ok") == 1.0);
    assert_eq!(stages(&server), ["default@0.1.0", "role_pair@0.1.0"]);
    assert_eq!(
        reloads(&server, "failed"),
        0.0,
        "the half-written file was refused: {}",
        server.stderr()
    );
    assert_eq!(server.get("/healthz").status, 200);
    assert!(server.stop().success());
}

/// Whether `line` starts with an RFC 3339 UTC time to the microsecond and two spaces.
fn timestamped(line: &str) -> bool {
    let bytes = line.as_bytes();
    bytes.len() > 29
        && line[..27].chars().enumerate().all(|(i, c)| match i {
            4 | 7 => c == '-',
            10 => c == 'T',
            13 | 16 => c == ':',
            19 => c == '.',
            26 => c == 'Z',
            _ => c.is_ascii_digit(),
        })
}

/// Every log line of `serve` starts with its time, and what a reload's check on the sample
/// history logs says so (`sample_run{model=…}:`), while a real turn's lines do not.
#[test]
fn logs_are_timestamped_and_a_reloads_sample_run_is_told_from_a_turn() {
    let config = e2e_tests::server::shipped_config("", &[]);
    let server = Server::start(&config.path, &config.dir.path().join("sessions.db"), &[]);
    let id = server.create("gpt-4o");
    let turn = |text: &str| {
        let answer = server.post(
            &format!("/v1/sessions/{id}/turns"),
            &j!({"messages": [
                {"role": "user", "content": text},
                {"role": "assistant", "content": null, "tool_calls": [{"id": format!("c-{text}"), "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": format!("c-{text}"), "content": "fn main() {}"}
            ]}),
        );
        assert_eq!(answer.status, 200, "{answer:?}");
    };
    turn("first");
    let text = std::fs::read_to_string(&config.path).unwrap();
    std::fs::write(
        &config.path,
        text.replace("agent_max_ctx = 200", "agent_max_ctx = 150"),
    )
    .unwrap();
    wait_until("the reload", || server.stderr().contains("chain reloaded"));
    turn("second");
    wait_until("the second turn's lines", || {
        let stderr = server.stderr();
        stderr.matches("INFO tool results: ").count() >= 2
    });
    let stderr = server.stderr();
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(lines.len() > 5, "{stderr}");
    for line in &lines {
        assert!(timestamped(line), "not timestamped: {line:?}");
    }
    // tool_result_filter logs one line per call: on the sample once per model, labelled.
    let plugin_lines: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("plugin=tool_result_filter"))
        .collect();
    let sample: Vec<&&&str> = plugin_lines
        .iter()
        .filter(|l| l.contains(" sample_run{model="))
        .collect();
    assert!(sample.len() >= 4, "every model's sample run: {stderr}");
    assert!(
        sample
            .iter()
            .any(|l| l.contains("sample_run{model=local-8k}: tool results:")),
        "{stderr}"
    );
    assert_eq!(
        plugin_lines.len() - sample.len(),
        2,
        "the two turns' lines, not labelled: {stderr}"
    );
    assert!(server.stop().success());
}
