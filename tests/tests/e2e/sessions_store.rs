//! What the store keeps (docs/sessions.md#the-store): the transcript once, and the working
//! history as references to it plus copies of exactly the messages whose bytes differ.

use e2e_tests::server::{shipped_config, Server};
use e2e_tests::store::{Kind, TestStore};
use history_sessions::store::WorkingRef;
use serde_json::{json as j, Value};

fn the_working_history_is_stored_as_references_plus_changed_copies(kind: Kind) {
    let config = shipped_config("", &[]);
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let id = server.create("gpt-4o");
    for n in 1..=30u64 {
        let messages = j!([
            {"role": "user", "content": format!("step {n}")},
            {"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{n}"), "type": "function",
                "function": {"name": "read_file", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": format!("c{n}"), "content": format!("file {n}: {}", "text ".repeat(50))},
            {"role": "assistant", "content": format!("done {n}")},
        ]);
        let answer = server.post(&format!("/v1/sessions/{id}/turns"), &j!({ "messages": messages }));
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    let working = server.history(&id, false);
    let transcript = server.transcript(&id);
    assert_eq!(server.stop().code(), Some(0));

    let store = store.open();
    assert_eq!(
        store.transcript(&id, 1, 10_000).unwrap().len(),
        120,
        "each message once"
    );
    let stored = store.load(&id).unwrap().unwrap();
    assert_eq!(stored.working.len(), working.as_array().unwrap().len());
    let mut copies = 0;
    for (stored, message) in stored.working.iter().zip(working.as_array().unwrap()) {
        let (reference, seq) = (&stored.reference, stored.seq);
        let text = stored
            .text
            .as_deref()
            .expect("a load without a host copy reads every message");
        assert!(
            stored
                .tokens
                .0
                .as_deref()
                .is_some_and(|t| t.starts_with("o200k_base:")),
            "counted by the chain, stored with its count: {:?}",
            stored.tokens
        );
        let stored_message: Value = serde_json::from_str(text).unwrap();
        assert_eq!(&stored_message, message);
        let seq = seq.expect("every working message comes from the transcript here") as usize;
        let original = &transcript[seq - 1];
        match reference {
            WorkingRef::Transcript(s) => {
                assert_eq!(*s as usize, seq);
                assert_eq!(message, original, "a reference is the transcript's bytes");
            }
            WorkingRef::Copy(_) => {
                copies += 1;
                assert_ne!(message, original, "a copy only where the bytes differ");
            }
        }
    }
    // tool_result_filter keeps the newest 4 results: the 26 older ones are placeholders,
    // the only copies.
    assert_eq!(copies, 26);
    assert_eq!(stored.row.turn, 30);
}

e2e_tests::store_tests!(the_working_history_is_stored_as_references_plus_changed_copies,);

/// A message's token counts are stored beside it: after a restart, a turn tokenizes its
/// new messages only, not the history it reads back (docs/sessions.md#the-store).
fn after_a_restart_a_turn_tokenizes_only_its_new_messages(kind: Kind) {
    let config = shipped_config("", &[]);
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let id = server.create("gpt-4o");
    let note = |n: usize| {
        format!(
            "note {n}: {}",
            "the quick brown fox jumps over the lazy dog ".repeat(200)
        )
    };
    for n in 1..=3 {
        let turn = j!({"messages": [
            {"role": "user", "content": note(n)},
            {"role": "assistant", "content": format!("noted {n}")},
        ]});
        assert_eq!(
            server.post(&format!("/v1/sessions/{id}/turns"), &turn).status,
            200
        );
    }
    let history = server.history(&id, false);
    assert_eq!(
        history.as_array().unwrap().len(),
        6,
        "every note stays in the window"
    );
    assert_eq!(server.stop().code(), Some(0));

    let server = Server::start(&config.path, store.path(), &[]);
    let counted = || server.metric("history_tokens_counted_bytes_total");
    let before = counted();
    let turn = j!({"messages": [{"role": "user", "content": "and now?"}]});
    assert_eq!(
        server.post(&format!("/v1/sessions/{id}/turns"), &turn).status,
        200
    );
    let tokenized = counted() - before;
    assert!(
        tokenized < 100,
        "{tokenized} bytes tokenized after the restart; the notes read back are {} bytes",
        3 * note(1).len()
    );
    assert_eq!(server.history(&id, false).as_array().unwrap().len(), 7);
    assert_eq!(server.stop().code(), Some(0));
}

e2e_tests::store_tests!(after_a_restart_a_turn_tokenizes_only_its_new_messages,);

/// A small tmpfs mounted for one test (unmounted when dropped), or `None` after saying
/// loudly that the test is skipped: mounting needs root (CI runs as root).
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str, test: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match mounted {
            Ok(out) if out.status.success() => Some(Tmpfs { dir }),
            other => {
                eprintln!("SKIPPED (cannot mount a tmpfs: needs root): {test}: {other:?}");
                None
            }
        }
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    fn remount(&self, option: &str) {
        let status = std::process::Command::new("mount")
            .args(["-o", &format!("remount,{option}")])
            .arg(self.dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "remount {option}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

fn turn(server: &Server, id: &str, text: &str) -> e2e_tests::server::Answer {
    server.post(
        &format!("/v1/sessions/{id}/turns"),
        &j!({"messages": [{"role": "user", "content": text}]}),
    )
}

/// Asserts `answer` is the one-line 503 a store that cannot be written gives.
fn assert_unwritable(answer: &e2e_tests::server::Answer, what: &str) {
    assert_eq!(answer.status, 503, "{what}: {answer:?}");
    let (code, message) = answer.error();
    assert_eq!(code, "store_unavailable", "{what}: {message}");
    assert!(
        message.starts_with("store unavailable:") && !message.contains('\n'),
        "{what}: {message}"
    );
}

#[test]
fn a_full_store_refuses_turns_with_a_503_and_serves_again_once_there_is_room() {
    let Some(disk) = Tmpfs::mount("3m", "sessions_store::a_full_store_…") else {
        return;
    };
    let config = shipped_config("", &[]);
    let store = disk.path().join("sessions.db");
    let server = Server::start(&config.path, &store, &[]);
    let id = server.create("local-8k");
    for n in 0..3 {
        assert_eq!(turn(&server, &id, &format!("before {n}")).status, 200);
    }
    let before = (server.transcript(&id), server.history(&id, false));
    // Fill the disk to the last byte.
    let filler = disk.path().join("filler");
    let mut file = std::fs::File::create(&filler).unwrap();
    let block = vec![b'x'; 64 * 1024];
    while std::io::Write::write_all(&mut file, &block).is_ok() {}
    while std::io::Write::write_all(&mut file, b"x").is_ok() {}
    drop(file);
    let big = "word ".repeat(50_000);
    let log_before = server.stderr().len();
    let answer = turn(&server, &id, &big);
    assert_unwritable(&answer, "a turn on a full disk");
    assert!(answer.error().1.contains("full"), "{answer:?}");
    for n in 0..4 {
        assert_unwritable(
            &turn(&server, &id, &format!("{big} {n}")),
            "more turns on a full disk",
        );
    }
    assert_eq!(server.get("/healthz").status, 503, "health on a full disk");
    let ready = server.get("/readyz");
    assert_eq!(ready.status, 503, "{ready:?}");
    let said = ready.body.as_str().unwrap_or_default();
    assert!(
        said.contains("store unavailable since") && said.contains("full"),
        "{said}"
    );
    assert_eq!(
        server.get("/livez").status,
        200,
        "alive: a restart would not make room"
    );
    // The outage is logged once, not once per refused turn.
    let log = server.stderr()[log_before..].to_string();
    let loud: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ERROR") || l.contains("WARN"))
        .collect();
    assert_eq!(loud.len(), 1, "{loud:#?}");
    assert!(
        loud[0].contains("store unavailable") && loud[0].contains("full"),
        "{loud:?}"
    );
    // Nothing changed, and the service still answers what it can without writing.
    assert_eq!((server.transcript(&id), server.history(&id, false)), before);
    std::fs::remove_file(&filler).unwrap();
    let answer = turn(&server, &id, &big);
    assert_eq!(answer.status, 200, "after freeing room: {answer:?}");
    assert_eq!(answer.body["turn"], 4);
    assert_eq!(server.get("/healthz").status, 200);
    let log = server.stderr_once(log_before, "store available again");
    let ended: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("store available again"))
        .collect();
    assert!(
        ended.len() == 1 && ended[0].contains("operations were refused meanwhile"),
        "{log}"
    );
    assert_eq!(server.stop().code(), Some(0));
}

#[test]
fn a_read_only_store_is_refused_at_start_in_one_line() {
    let Some(disk) = Tmpfs::mount("16m", "sessions_store::a_read_only_store_…") else {
        return;
    };
    let config = shipped_config("", &[]);
    let store = disk.path().join("sessions.db");
    let server = Server::start(&config.path, &store, &[]);
    let id = server.create("local-8k");
    assert_eq!(turn(&server, &id, "before").status, 200);
    assert_eq!(server.stop().code(), Some(0));
    disk.remount("ro");
    let refused = Server::try_start(&config.path, &store, &[], &[]);
    let Err(stderr) = refused else {
        panic!("serve started on a read-only store")
    };
    let line = stderr
        .lines()
        .find(|l| l.contains("history-host:"))
        .unwrap_or_default();
    assert!(
        line.contains("store unavailable: the store")
            && line.contains("sessions.db cannot be written")
            && line.contains("Read-only file system"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("history-host:").count(), 1, "one line: {stderr}");
    disk.remount("rw");
    let server = Server::start(&config.path, &store, &[]);
    let answer = turn(&server, &id, "writable again");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body["turn"], 2);
    assert_eq!(server.stop().code(), Some(0));
}

/// The last sent history is stored with its turn (docs/sessions.md#the-store): after a
/// restart `?view=sent` gives it unchanged, and the next turn's `prefix_kept` is measured
/// against it.
fn the_last_sent_history_survives_a_restart(kind: Kind) {
    let config = shipped_config("", &[]);
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let id = server.create("gpt-4o");
    let turn_body = |n: u64, display: bool| {
        let mut body = j!({ "messages": [
            {"role": "user", "content": format!("step {n}")},
            {"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{n}"), "type": "function",
                "function": {"name": "read_file", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": format!("c{n}"), "content": format!("file {n}: {}", "text ".repeat(50))},
            {"role": "assistant", "content": format!("done {n}")},
        ]});
        if display {
            body["context"] = j!([{"text": "shown this turn only", "display": true}]);
        }
        body
    };
    let mut last = Value::Null;
    for n in 1..=8u64 {
        let answer = server.post(&format!("/v1/sessions/{id}/turns"), &turn_body(n, n == 8));
        assert_eq!(answer.status, 200, "{answer:?}");
        last = answer.body;
    }
    let sent = server.history(&id, true);
    assert_eq!(sent, last["history"], "the sent view is the last turn's answer");
    // The display context is in the sent history only, and older tool results are
    // placeholders (copies): the stored sent history has references of both kinds and a
    // message of its own.
    let sent_messages = sent.as_array().unwrap();
    let shown = sent_messages
        .iter()
        .rposition(|m| m.to_string().contains("shown this turn only"))
        .expect("the display context is sent");
    assert_ne!(
        sent,
        server.history(&id, false),
        "the sent history differs from the working one"
    );
    assert_eq!(server.stop().code(), Some(0));

    let server = Server::start(&config.path, store.path(), &[]);
    assert_eq!(
        server.history(&id, true),
        sent,
        "the sent view after a restart, before any turn"
    );
    let next = server.post(&format!("/v1/sessions/{id}/turns"), &turn_body(9, false));
    assert_eq!(next.status, 200, "{next:?}");
    // The first message that differs from the stored sent history: at the latest the user
    // message that carried the display context last turn and carries none now (before
    // it, the tool result that tool_result_filter turns into a placeholder this turn).
    let new_sent = next.body["history"].as_array().unwrap();
    let expected = sent_messages
        .iter()
        .zip(new_sent)
        .position(|(a, b)| a != b)
        .unwrap_or(sent_messages.len().min(new_sent.len()));
    assert!(
        expected <= shown,
        "the display context is gone from the prefix: {expected} > {shown}"
    );
    assert_eq!(
        next.body["prefix_kept"],
        j!(expected),
        "prefix_kept is measured against the stored sent history: {}",
        next.body
    );
    assert_eq!(server.stop().code(), Some(0));

    // In the store: a sent history of references plus the one message of its own.
    let stored = store.open().load(&id).unwrap().unwrap();
    let (encoded, messages) = stored.sent.expect("a sent history is stored");
    assert_eq!(messages.len(), new_sent.len());
    assert!(
        !encoded.contains('\n'),
        "no display context this turn: every sent message is a reference ({encoded:?})"
    );
}

e2e_tests::store_tests!(the_last_sent_history_survives_a_restart,);

/// Past `session_memory_mb` the least recently active sessions are put out of memory and
/// read back from the store when used again (docs/sessions.md#memory): nothing a client
/// sees changes. The same interleaved turns go to a host with 1 MiB for sessions and to
/// one without a limit; every answer, working and sent history and transcript is the
/// same on both (the host's stamps aside), and only the first put sessions out.
fn sessions_put_out_of_memory_are_read_back_unchanged(kind: Kind) {
    let limited = shipped_config("session_memory_mb = 1\n", &[]);
    let unlimited = shipped_config("session_memory_mb = 0\n", &[]);
    let (limited_store, unlimited_store) = (TestStore::new(kind, &limited), TestStore::new(kind, &unlimited));
    let limited = Server::start(&limited.path, limited_store.path(), &[]);
    let unlimited = Server::start(&unlimited.path, unlimited_store.path(), &[]);
    same_answers(&[&limited], &unlimited);
    assert!(put_out(&limited) > 0, "the 1 MiB host put sessions out of memory");
    assert_eq!(put_out(&unlimited), 0, "the host without a limit kept them all");
    for host in [limited, unlimited] {
        assert_eq!(host.stop().code(), Some(0));
    }
}

e2e_tests::store_tests!(sessions_put_out_of_memory_are_read_back_unchanged,);

/// Two hosts on one PostgreSQL store, each session's turns alternating between them: a
/// host that finds a session changed by the other reads it back, keeping the messages it
/// already had (docs/scaling-out.md#what-is-shared-what-each-host-keeps). Every answer is what one host
/// alone gives.
#[test]
fn two_hosts_alternating_answer_as_one_host_alone() {
    let Some(_) =
        e2e_tests::store::postgres_url("sessions_store::two_hosts_alternating_answer_as_one_host_alone")
    else {
        return;
    };
    let shared = shipped_config("", &[]);
    let alone = shipped_config("", &[]);
    let (shared_store, alone_store) = (
        TestStore::new(Kind::Postgres, &shared),
        TestStore::new(Kind::Postgres, &alone),
    );
    let hosts = [
        Server::start(&shared.path, shared_store.path(), &[]),
        Server::start(&shared.path, shared_store.path(), &[]),
    ];
    let reference = Server::start(&alone.path, alone_store.path(), &[]);
    same_answers(&[&hosts[0], &hosts[1]], &reference);
    for host in hosts.into_iter().chain([reference]) {
        assert_eq!(host.stop().code(), Some(0));
    }
}

/// Sends the same turns to `hosts` (turn `n` of session `s` to host `(s + n) % len`, the
/// sessions interleaved) and to `reference`, and checks every answer, working and sent
/// history and transcript is the same on both sides, the host's stamps aside. About 1.5
/// MiB of tool results in all, kept whole in the working histories (the placeholders keep
/// their originals for expansion).
fn same_answers(hosts: &[&Server], reference: &Server) {
    const SESSIONS: usize = 8;
    let ids: Vec<[String; 2]> = (0..SESSIONS)
        .map(|s| {
            [
                hosts[s % hosts.len()].create("gpt-4o"),
                reference.create("gpt-4o"),
            ]
        })
        .collect();
    let turn_body = |session: usize, n: usize| {
        let call = format!("c{session}-{n}");
        let result: String = (0..400)
            .map(|line| format!("s{session} t{n} line {line}: {}\n", "x".repeat(40)))
            .collect();
        j!({ "messages": [
            {"role": "user", "content": format!("session {session}, step {n}")},
            {"role": "assistant", "content": null, "tool_calls": [{"id": call, "type": "function",
                "function": {"name": "read_file", "arguments": format!("{{\"path\": \"f{n}.rs\"}}")}}]},
            {"role": "tool", "tool_call_id": call, "content": result},
            {"role": "assistant", "content": format!("read f{n}.rs")},
        ]})
    };
    let host_of = |session: usize, n: usize| hosts[(session + n) % hosts.len()];
    for n in 1..=8 {
        for (session, [id, reference_id]) in ids.iter().enumerate() {
            let answers: Vec<Value> = [(host_of(session, n), id), (reference, reference_id)]
                .into_iter()
                .map(|(host, id)| {
                    let answer = host.post(&format!("/v1/sessions/{id}/turns"), &turn_body(session, n));
                    assert_eq!(answer.status, 200, "session {session} turn {n}: {answer:?}");
                    answer.body
                })
                .collect();
            for member in ["turn", "working_size", "prefix_kept"] {
                assert_eq!(
                    answers[0][member], answers[1][member],
                    "session {session} turn {n}: {member}"
                );
            }
            assert_eq!(
                unstamped(&answers[0]["history"]),
                unstamped(&answers[1]["history"]),
                "session {session} turn {n}: the sent history"
            );
            let prefixes = |answer: &Value| -> Vec<Value> {
                answer["stats"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s["prefix_kept"].clone())
                    .collect()
            };
            assert_eq!(
                prefixes(&answers[0]),
                prefixes(&answers[1]),
                "session {session} turn {n}"
            );
        }
    }
    for (session, [id, reference_id]) in ids.iter().enumerate() {
        let host = host_of(session, 9);
        for sent in [false, true] {
            assert_eq!(
                unstamped(&host.history(id, sent)),
                unstamped(&reference.history(reference_id, sent)),
                "session {session}, sent {sent}"
            );
        }
        assert_eq!(
            unstamped(&Value::Array(host.transcript(id))),
            unstamped(&Value::Array(reference.transcript(reference_id))),
            "session {session}: transcript"
        );
    }
}

/// `history_sessions_put_out_total` of a host.
fn put_out(host: &Server) -> u64 {
    let text = host.get("/metrics").body;
    text.as_str()
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("history_sessions_put_out_total "))
        .expect("history_sessions_put_out_total in /metrics")
        .trim()
        .parse()
        .unwrap()
}

/// A history with the host's per-session stamps (`metadata.id`, `timestamp`) taken off.
fn unstamped(history: &Value) -> Value {
    let mut history = history.clone();
    for message in history.as_array_mut().unwrap() {
        if let Some(meta) = message.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("id");
            meta.remove("timestamp");
        }
    }
    history
}

/// A PostgreSQL test without `HISTORY_TEST_POSTGRES_URL` says it was skipped — and under
/// `CI=true` fails, so a CI run that skipped PostgreSQL cannot pass. The test binary itself,
/// run on one such test with the variable removed.
#[test]
fn a_skipped_postgres_test_fails_a_ci_run() {
    let test = "sessions_commands::unknown_and_malformed_commands_are_400s_naming_them::postgres";
    let run = |ci: Option<&str>| {
        let mut command = std::process::Command::new(std::env::current_exe().unwrap());
        command
            .args([test, "--exact", "--test-threads=1"])
            .env_remove("HISTORY_TEST_POSTGRES_URL");
        match ci {
            Some(value) => command.env("CI", value),
            None => command.env_remove("CI"),
        };
        command.output().unwrap()
    };
    for ci in [None, Some("false")] {
        let skipped = run(ci);
        let stderr = String::from_utf8_lossy(&skipped.stderr);
        assert!(
            skipped.status.success(),
            "CI={ci:?}: {}",
            e2e_tests::describe(&skipped)
        );
        assert!(
            stderr.contains(&format!("SKIPPED (no PostgreSQL): e2e::{test}")),
            "CI={ci:?}: {stderr}"
        );
    }
    let failed = run(Some("true"));
    assert_eq!(
        failed.status.code(),
        Some(101),
        "{}",
        e2e_tests::describe(&failed)
    );
    let stdout = String::from_utf8_lossy(&failed.stdout);
    assert!(
        stdout.contains("HISTORY_TEST_POSTGRES_URL is unset and CI is set") && stdout.contains("1 failed"),
        "{stdout}"
    );
}
