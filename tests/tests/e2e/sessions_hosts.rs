//! Several hosts, one store (docs/scaling-out.md): two `history-host serve` processes on
//! one PostgreSQL database serve the same sessions, a session's turns one at a time
//! across both, and one host killed with `kill -9` leaves the other serving every
//! acknowledged turn. PostgreSQL only (`HISTORY_TEST_POSTGRES_URL`): a SQLite file is one
//! host's.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use e2e_tests::link::Link;
use e2e_tests::server::{agent, request, shipped_config, Server};
use e2e_tests::store::{postgres_url, Kind, TestStore};
use serde_json::{json as j, Value};

const SESSIONS: usize = 3;
const CLIENTS: usize = 2;
const TURNS: usize = 8;

/// The outage test's phases, as its clients see them.
const BEFORE: u8 = 0;
const DURING: u8 = 1;
const AFTER: u8 = 2;

/// Per session, its acknowledged `(turn, content)` pairs.
type Acked = Vec<Vec<(u64, String)>>;

/// What the client `c` of session `s` sends as its turn `k`.
fn content(s: usize, c: usize, k: usize) -> String {
    format!("s{s} client {c} turn {k}")
}

/// Every session's clients, `CLIENTS` each, send `TURNS` turns, alternating between the
/// hosts (a transport error, i.e. a dead host, sends the turn to the other one). Returns
/// per session the acknowledged `(turn, content)` pairs, and every other answer.
fn clients(hosts: &[&Server], ids: &[String], between: impl Fn(usize) + Sync) -> (Acked, Vec<Value>) {
    let urls: Vec<Vec<String>> = ids
        .iter()
        .map(|id| {
            hosts
                .iter()
                .map(|h| h.url(&format!("/v1/sessions/{id}/turns")))
                .collect()
        })
        .collect();
    let dead: Vec<AtomicBool> = hosts.iter().map(|_| AtomicBool::new(false)).collect();
    type Client = (usize, Vec<(u64, String)>, Vec<Value>);
    let results: Vec<Client> = std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for s in 0..ids.len() {
            for c in 0..CLIENTS {
                let (urls, dead, between) = (&urls, &dead, &between);
                handles.push(scope.spawn(move || {
                    let agent = agent();
                    let mut acked = Vec::new();
                    let mut other = Vec::new();
                    for k in 0..TURNS {
                        let text = content(s, c, k);
                        let body = j!({"messages": [{"role": "user", "content": text}]});
                        let mut host = (c + k) % urls[s].len();
                        let answer = loop {
                            if dead[host].load(Ordering::SeqCst) {
                                host = (host + 1) % urls[s].len();
                            }
                            let answer = request(&agent, "POST", &urls[s][host], Some(&body), None);
                            if answer.status == 0 {
                                // The host is gone: its turn may or may not have committed,
                                // and it was not acknowledged; the client sends a new turn.
                                dead[host].store(true, Ordering::SeqCst);
                                host = (host + 1) % urls[s].len();
                                continue;
                            }
                            break answer;
                        };
                        match answer.status {
                            200 => acked.push((answer.body["turn"].as_u64().unwrap(), text)),
                            _ => other.push(j!({"status": answer.status, "body": answer.body})),
                        }
                        between(k);
                    }
                    (s, acked, other)
                }));
            }
        }
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut acked: Acked = vec![Vec::new(); ids.len()];
    let mut other = Vec::new();
    for (s, a, o) in results {
        acked[s].extend(a);
        other.extend(o);
    }
    for a in &mut acked {
        a.sort();
    }
    (acked, other)
}

/// Every acknowledged turn is in the transcript at its place, once, with what its client
/// sent; turn numbers are consecutive from 1.
fn check(server: &Server, id: &str, acked: &[(u64, String)], all_acknowledged: bool) {
    let transcript = server.transcript(id);
    let turns: Vec<u64> = transcript
        .iter()
        .map(|m| m["metadata"]["turn_added"].as_u64().unwrap())
        .collect();
    assert_eq!(
        turns,
        (1..=transcript.len() as u64).collect::<Vec<_>>(),
        "session {id}: one message per turn, turns consecutive"
    );
    let numbers: Vec<u64> = acked.iter().map(|(turn, _)| *turn).collect();
    let mut unique = numbers.clone();
    unique.dedup();
    assert_eq!(numbers, unique, "session {id}: a turn number acknowledged twice");
    for (turn, text) in acked {
        assert_eq!(
            transcript[*turn as usize - 1]["content"],
            j!(text),
            "session {id} turn {turn}"
        );
    }
    if all_acknowledged {
        assert_eq!(transcript.len(), acked.len(), "session {id}");
    }
}

#[test]
fn two_hosts_serve_the_same_sessions_turn_by_turn() {
    if postgres_url("sessions_hosts::two_hosts_serve_the_same_sessions_turn_by_turn").is_none() {
        return;
    }
    let config = shipped_config("", &[("max_users", "max_users = 100")]);
    let store = TestStore::new(Kind::Postgres, &config);
    let a = Server::start(&config.path, store.path(), &[]);
    let b = Server::start(&config.path, store.path(), &[]);
    let ids: Vec<String> = (0..SESSIONS)
        .map(|s| {
            if s % 2 == 0 {
                a.create("local-8k")
            } else {
                b.create("local-8k")
            }
        })
        .collect();
    let (acked, other) = clients(&[&a, &b], &ids, |_| {});
    assert!(other.is_empty(), "{other:?}");
    for (id, acked) in ids.iter().zip(&acked) {
        assert_eq!(acked.len(), CLIENTS * TURNS);
        check(&a, id, acked, true);
        // Both hosts show the same session.
        assert_eq!(a.transcript(id), b.transcript(id));
        assert_eq!(a.history(id, false), b.history(id, false));
    }
    // A session deleted on one host is gone on the other.
    assert_eq!(
        a.request("DELETE", &format!("/v1/sessions/{}", ids[0]), None, false)
            .status,
        204
    );
    assert_eq!(b.get(&format!("/v1/sessions/{}/history", ids[0])).status, 404);
    assert_eq!(a.stop().code(), Some(0));
    assert_eq!(b.stop().code(), Some(0));
}

#[test]
fn kill_9_of_one_host_leaves_the_other_serving_every_acknowledged_turn() {
    if postgres_url("sessions_hosts::kill_9_of_one_host_leaves_the_other_serving_every_acknowledged_turn")
        .is_none()
    {
        return;
    }
    let config = shipped_config("", &[("max_users", "max_users = 100")]);
    let store = TestStore::new(Kind::Postgres, &config);
    let a = Server::start(&config.path, store.path(), &[]);
    let b = Server::start(&config.path, store.path(), &[]);
    let ids: Vec<String> = (0..SESSIONS).map(|_| a.create("local-8k")).collect();
    let pid = a.pid();
    let killed = AtomicBool::new(false);
    let (acked, other) = clients(&[&a, &b], &ids, |k| {
        // Mid-loop, while the other clients' turns run on both hosts.
        if k == TURNS / 2 && !killed.swap(true, Ordering::SeqCst) {
            e2e_tests::server::signal(pid, "KILL");
        }
    });
    assert!(killed.load(Ordering::SeqCst));
    assert!(other.is_empty(), "{other:?}");
    for (id, acked) in ids.iter().zip(&acked) {
        check(&b, id, acked, false);
    }
    // The survivor goes on with every session.
    for id in &ids {
        let answer = b.post(
            &format!("/v1/sessions/{id}/turns"),
            &j!({"messages": [{"role": "user", "content": "after the kill"}]}),
        );
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.body["turn"], b.transcript(id).len() as u64);
    }
    drop(a);
    assert_eq!(b.stop().code(), Some(0));
}

#[test]
fn a_database_outage_is_a_503_then_turns_recover_and_nothing_acknowledged_is_lost() {
    if postgres_url(
        "sessions_hosts::a_database_outage_is_a_503_then_turns_recover_and_nothing_acknowledged_is_lost",
    )
    .is_none()
    {
        return;
    }
    let config = shipped_config("", &[("max_users", "max_users = 100")]);
    let store = TestStore::new(Kind::Postgres, &config);
    // The host reaches the database through a link the test cuts: every connection drops
    // at once (as when the server restarts and terminates its backends), then new ones
    // are refused until the link is restored.
    let link = Link::to(&store.server_address());
    let host = Server::start(&config.path, &store.path_via(link.port()), &[]);
    let ids: Vec<String> = (0..SESSIONS).map(|_| host.create("local-8k")).collect();
    let phase = AtomicU8::new(BEFORE);
    let outage_answers = Mutex::new(Vec::new());
    let acked: Vec<Vec<(u64, String)>> = std::thread::scope(|scope| {
        let clients: Vec<_> = ids
            .iter()
            .enumerate()
            .map(|(s, id)| {
                let (host, phase, outage_answers) = (&host, &phase, &outage_answers);
                scope.spawn(move || {
                    let agent = agent();
                    let url = host.url(&format!("/v1/sessions/{id}/turns"));
                    let mut acked = Vec::new();
                    let mut after = 0;
                    let started = Instant::now();
                    // Bounded: until a few turns succeeded after the outage, or 120 s.
                    for k in 0..10_000 {
                        if after >= 5 || started.elapsed() > Duration::from_secs(120) {
                            break;
                        }
                        let text = content(s, 0, k);
                        let body = j!({"messages": [{"role": "user", "content": text}]});
                        let sent_in = phase.load(Ordering::SeqCst);
                        let answer = request(&agent, "POST", &url, Some(&body), None);
                        let answered_in = phase.load(Ordering::SeqCst);
                        match answer.status {
                            200 => {
                                acked.push((answer.body["turn"].as_u64().unwrap(), text));
                                if sent_in == AFTER {
                                    after += 1;
                                }
                            }
                            _ if answered_in != BEFORE => {
                                outage_answers.lock().unwrap().push((answer.status, answer.body))
                            }
                            status => panic!("session {s}: {status} before the outage: {answer:?}"),
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    assert!(after >= 5, "session {s}: {after} turns after the outage in 120 s");
                    acked
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        phase.store(DURING, Ordering::SeqCst);
        link.cut();
        // While it is down, health says so.
        std::thread::sleep(Duration::from_millis(500));
        let health = host.get("/healthz");
        std::thread::sleep(Duration::from_millis(1500));
        link.restore();
        phase.store(AFTER, Ordering::SeqCst);
        let acked = clients.into_iter().map(|c| c.join().unwrap()).collect();
        assert_eq!(health.status, 503, "healthz during the outage: {health:?}");
        acked
    });
    let outage_answers = outage_answers.into_inner().unwrap();
    assert!(
        !outage_answers.is_empty(),
        "no turn ran into the outage: make it longer"
    );
    for (status, body) in &outage_answers {
        assert_eq!(*status, 503, "a turn during the outage: {body}");
        assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            !message.contains('\n') && message.contains("store unavailable"),
            "{message}"
        );
    }
    // Recovered without a restart: health is back, and every session went on.
    assert_eq!(host.get("/healthz").status, 200);
    for (id, acked) in ids.iter().zip(&acked) {
        // A turn whose commit reached the database but whose answer was lost may be in
        // the transcript unacknowledged; every acknowledged one is there, in order.
        check(&host, id, acked, false);
    }
    assert_eq!(host.stop().code(), Some(0));
}

/// A host that finds a session changed by another host reads it back with the session's
/// lock, and the read leaves out the messages the host holds already: only the new
/// transcript rows and copies come back (docs/scaling-out.md#what-is-shared-what-each-host-keeps).
#[test]
fn a_read_back_leaves_out_the_messages_the_host_holds() {
    use history_sessions::store::{
        CopyRow, HostCopy, Locked, SessionRow, SessionWrite, StoredMessage, TokenCounts, TranscriptRow,
        WorkingRef::*,
    };
    if postgres_url("sessions_hosts::a_read_back_leaves_out_the_messages_the_host_holds").is_none() {
        return;
    }
    let config = shipped_config("", &[]);
    let test_store = TestStore::new(Kind::Postgres, &config);
    let store = test_store.open();
    let message = |seq: u64| format!(r#"{{"role":"user","content":"message {seq}"}}"#);
    let transcript = |seqs: std::ops::RangeInclusive<u64>| -> Vec<TranscriptRow> {
        seqs.map(|seq| TranscriptRow {
            seq,
            turn: seq.div_ceil(2),
            message: message(seq),
            tokens: TokenCounts(Some(format!("o200k_base:{seq}"))),
        })
        .collect()
    };
    let mut row = SessionRow::new("s".into(), "local-8k".into(), 8192, 1);
    store.create(&row).unwrap();
    // Turn 1, as this host ran it: it holds messages 1 and 2.
    row.turn = 1;
    row.transcript_len = 2;
    row.version = 1;
    store
        .commit(&SessionWrite {
            row: Some(&row),
            transcript: &transcript(1..=2),
            working: &[Transcript(1), Transcript(2)],
            sent: Some("1-2"),
            ..Default::default()
        })
        .unwrap();
    let held = HostCopy {
        version: 1,
        refs: vec![Transcript(1), Transcript(2)],
    };
    // Turn 2, run by another host: message 2 became a copy, 3 and 4 entered, and the sent
    // history holds a message of its own.
    row.turn = 2;
    row.transcript_len = 4;
    row.next_copy = 2;
    row.version = 2;
    let copy = r#"{"role":"user","content":"[Omitted]"}"#;
    let inline = r#"{"role":"system","content":"shown once"}"#;
    store
        .commit(&SessionWrite {
            row: Some(&row),
            transcript: &transcript(3..=4),
            working: &[Transcript(1), Copy(1), Transcript(3), Transcript(4)],
            new_copies: &[CopyRow {
                key: 1,
                seq: Some(2),
                message: copy.into(),
                tokens: TokenCounts::default(),
            }],
            sent: Some(&format!("m0,1,c1,3-4,2\n{inline}")),
            ..Default::default()
        })
        .unwrap();

    let Locked::Held(mut lock) = store.lock("s", Some(&held)).unwrap() else {
        panic!("a shared store locks");
    };
    assert_eq!(lock.version(), Some(2));
    let read = lock.load().unwrap().expect("the session");
    drop(lock);
    assert_eq!(read.row, row);
    let stored = |reference, seq: Option<u64>, text: Option<String>, tokens: Option<String>| StoredMessage {
        reference,
        seq,
        text,
        tokens: TokenCounts(tokens),
    };
    assert_eq!(
        read.working,
        [
            stored(Transcript(1), None, None, None),
            stored(Copy(1), Some(2), Some(copy.to_string()), None),
            stored(
                Transcript(3),
                Some(3),
                Some(message(3)),
                Some("o200k_base:3".into())
            ),
            stored(
                Transcript(4),
                Some(4),
                Some(message(4)),
                Some("o200k_base:4".into())
            ),
        ],
        "held messages are left out; the new ones come back, with their token counts"
    );
    let (encoded, sent) = read.sent.expect("a sent history");
    assert_eq!(encoded, format!("m0,1,c1,3-4,2\n{inline}"));
    assert_eq!(
        sent,
        [Some(inline.to_string()), None, None, None, None, None],
        "the sent history's references are the working history's or held"
    );

    // Without a host copy (a host that has not loaded the session), everything is read.
    let Locked::Held(mut lock) = store.lock("s", None).unwrap() else {
        panic!("a shared store locks");
    };
    let read = lock.load().unwrap().expect("the session");
    drop(lock);
    assert!(read.working.iter().all(|m| m.text.is_some()));
    assert_eq!(
        read.sent.unwrap().1[5],
        Some(message(2)),
        "message 2 is only the sent history's"
    );
}

/// Each write carries the session's next version, and a write that does not follow the
/// stored version — a host that missed another host's change — is refused whole, with
/// and without the session's lock (docs/scaling-out.md#how-a-turn-stays-serialized-across-hosts).
#[test]
fn a_write_that_does_not_follow_the_stored_version_is_refused_whole() {
    use history_sessions::store::{
        Locked, SessionRow, SessionWrite, TokenCounts, TranscriptRow, WorkingRef::*,
    };
    if postgres_url("sessions_hosts::a_write_that_does_not_follow_the_stored_version_is_refused_whole")
        .is_none()
    {
        return;
    }
    let config = shipped_config("", &[]);
    let test_store = TestStore::new(Kind::Postgres, &config);
    let store = test_store.open();
    let transcript = |seq: u64| TranscriptRow {
        seq,
        turn: seq,
        message: format!(r#"{{"role":"user","content":"message {seq}"}}"#),
        tokens: TokenCounts::default(),
    };
    let fresh = || SessionRow::new("s".into(), "local-8k".into(), 8192, 1);
    let mut row = fresh();
    store.create(&row).unwrap();
    let turn = |row: &SessionRow| {
        let mut next = row.clone();
        next.turn += 1;
        next.transcript_len += 1;
        next
    };
    // Turn 1 at version 1.
    let mut first = turn(&row);
    first.version = 1;
    store
        .commit(&SessionWrite {
            row: Some(&first),
            transcript: &[transcript(1)],
            working: &[Transcript(1)],
            ..Default::default()
        })
        .unwrap();
    row = first;

    // A host that missed turn 1 writes its own turn 1 at version 1 again.
    let mut stale = turn(&fresh());
    stale.version = 1;
    let error = store
        .commit(&SessionWrite {
            row: Some(&stale),
            transcript: &[transcript(1)],
            working: &[Transcript(1)],
            ..Default::default()
        })
        .expect_err("a write at the stored version is refused");
    assert!(error.to_string().contains("changed on another host"), "{error}");

    // Under the lock too: a write that skips a version is refused, and the lock goes on
    // to take a write that follows.
    let Locked::Held(mut lock) = store.lock("s", None).unwrap() else {
        panic!("a shared store locks");
    };
    assert_eq!(lock.version(), Some(1));
    let mut skipping = turn(&row);
    skipping.version = 3;
    let error = lock
        .commit(&SessionWrite {
            row: Some(&skipping),
            transcript: &[transcript(2)],
            working: &[Transcript(1), Transcript(2)],
            ..Default::default()
        })
        .expect_err("a write that skips a version is refused");
    assert!(error.to_string().contains("changed on another host"), "{error}");
    let mut second = turn(&row);
    second.version = 2;
    lock.commit(&SessionWrite {
        row: Some(&second),
        transcript: &[transcript(2)],
        working: &[Transcript(1), Transcript(2)],
        ..Default::default()
    })
    .unwrap();
    drop(lock);

    // Nothing of the refused writes is stored: the row and transcript are the two turns
    // that followed.
    let (stored, working) = store.row("s").unwrap().expect("the session");
    assert_eq!((stored.version, stored.turn, working), (2, 2, 2));
    let rows = store.transcript("s", 1, 10).unwrap();
    assert_eq!(rows, [transcript(1), transcript(2)]);
}

/// A database a host of schema 3 wrote (before lz4 and the messages' token counts) is
/// migrated on start, keeps every session, and takes turns after (docs/scaling-out.md).
#[test]
fn a_database_of_an_older_host_is_migrated_and_its_sessions_go_on() {
    if postgres_url("sessions_hosts::a_database_of_an_older_host_is_migrated_and_its_sessions_go_on")
        .is_none()
    {
        return;
    }
    let config = shipped_config("", &[]);
    let store = TestStore::new(Kind::Postgres, &config);
    let url = store.path().to_string_lossy().to_string();
    // Schema 3 as that host left it, with one session of one turn.
    let mut old = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    old.batch_execute(
        "CREATE TABLE history_schema (version BIGINT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now());
         INSERT INTO history_schema (version) VALUES (1), (2), (3);
         CREATE TABLE sessions (id TEXT PRIMARY KEY, model TEXT NOT NULL, effective_ctx BIGINT NOT NULL,
           turn BIGINT NOT NULL, transcript_len BIGINT NOT NULL, cleared_at BIGINT NOT NULL,
           expiration_override TEXT, created_at BIGINT NOT NULL, last_active BIGINT NOT NULL,
           next_copy BIGINT NOT NULL, working TEXT NOT NULL, version BIGINT NOT NULL, sent TEXT);
         CREATE TABLE transcript (session_id TEXT NOT NULL, seq BIGINT NOT NULL, turn BIGINT NOT NULL,
           message TEXT NOT NULL, PRIMARY KEY (session_id, seq));
         CREATE TABLE working_copies (session_id TEXT NOT NULL, key BIGINT NOT NULL, seq BIGINT,
           message TEXT NOT NULL, PRIMARY KEY (session_id, key));
         CREATE TABLE summaries (key TEXT PRIMARY KEY, summary TEXT NOT NULL, created_at BIGINT NOT NULL);
         INSERT INTO sessions VALUES ('old-session', 'local-8k', 8192, 1, 2, 0, NULL, 1, 1, 1, '1-2', 1, '1-2');
         INSERT INTO transcript VALUES
           ('old-session', 1, 1, '{\"role\":\"user\",\"content\":\"before the upgrade\",\"metadata\":{\"id\":\"old-session-1\",\"turn_added\":1}}'),
           ('old-session', 2, 1, '{\"role\":\"assistant\",\"content\":\"noted\",\"metadata\":{\"id\":\"old-session-2\",\"turn_added\":1}}');",
    )
    .unwrap();
    drop(old);

    let server = Server::start(&config.path, store.path(), &[]);
    let history = server.history("old-session", false);
    assert_eq!(history[0]["content"], "before the upgrade", "{history}");
    let answer = server.post(
        "/v1/sessions/old-session/turns",
        &j!({"messages": [{"role": "user", "content": "after the upgrade"}]}),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body["turn"], 2);
    assert_eq!(server.transcript("old-session").len(), 3);
    assert_eq!(server.stop().code(), Some(0));

    let mut check = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let version: i64 = check
        .query_one("SELECT max(version) FROM history_schema", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, 5);
    let counted: Vec<Option<String>> = check
        .query(
            "SELECT tokens FROM transcript WHERE session_id = 'old-session' ORDER BY seq",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        counted[..2],
        [None, None],
        "rows of the older host have no counts"
    );
    assert!(
        counted[2].is_some(),
        "the new turn's message is stored with its counts: {counted:?}"
    );
}

/// docs/scaling-out.md#round-trips: a turn is two round trips to PostgreSQL, the lock
/// with the session's reads and the write with the unlock (each pipelined), on one host
/// and alternating between two (each of those reads the session back in the first).
/// `history_store_round_trips_total` counts them; a pooled connection opened meanwhile
/// adds its one round trip of preparation, at most one per host here.
#[test]
fn a_turn_makes_two_round_trips_to_the_database() {
    if postgres_url("sessions_hosts::a_turn_makes_two_round_trips_to_the_database").is_none() {
        return;
    }
    const TRIPS: &str = "history_store_round_trips_total";
    let config = shipped_config("", &[]);
    let store = TestStore::new(Kind::Postgres, &config);
    let a = Server::start(&config.path, store.path(), &[]);
    let b = Server::start(&config.path, store.path(), &[]);
    let id = a.create("local-8k");
    let turn = |host: &Server, k: usize| {
        let body = j!({"messages": [{"role": "user", "content": format!("turn {k}")}]});
        let answer = host.post(&format!("/v1/sessions/{id}/turns"), &body);
        assert_eq!(answer.status, 200, "{answer:?}");
    };
    // Each host's pooled connection opened (and its statements prepared) first.
    turn(&a, 0);
    turn(&b, 1);
    for (hosts, turns) in [(vec![&a], 10), (vec![&a, &b], 10)] {
        let before: u64 = [&a, &b].iter().map(|h| h.metric(TRIPS)).sum();
        for k in 0..turns {
            turn(hosts[k % hosts.len()], k + 2);
        }
        let made = [&a, &b].iter().map(|h| h.metric(TRIPS)).sum::<u64>() - before;
        let turns = turns as u64;
        assert!(
            (2 * turns..=2 * turns + 2).contains(&made),
            "{made} round trips for {turns} turns on {} host(s)",
            hosts.len()
        );
    }
    assert_eq!(a.stop().code(), Some(0));
    assert_eq!(b.stop().code(), Some(0));
}
