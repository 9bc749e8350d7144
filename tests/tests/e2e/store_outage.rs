//! A store that stops answering (docs/scaling-out.md#when-the-database-is-unreachable):
//! `serve` reaches PostgreSQL through a loopback relay (`e2e_tests::link`) that refuses,
//! then black-holes (every byte read and dropped: nothing refused, nothing answered), and
//! each time resumes. Under each fault turns answer a quick 503 `store_unavailable`, no
//! session stays busy, `/readyz` says the store is unreachable while `/livez` stays 200,
//! and the log holds a handful of lines; after resuming, turns succeed without a restart
//! and every acknowledged turn is in the transcripts. PostgreSQL only
//! (`HISTORY_TEST_POSTGRES_URL`); the SQLite side (a full disk) is in `sessions_store`.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use e2e_tests::link::Link;
use e2e_tests::server::{agent, request, shipped_config, Server};
use e2e_tests::store::{postgres_url, Kind, TestStore};
use e2e_tests::TestConfig;
use serde_json::{json as j, Value};

const CONNECT_MS: u64 = 1000;
const STATEMENT_MS: u64 = 1000;
/// How long a turn may take under an outage, by docs/scaling-out.md: the longer of the
/// connect timeout and two statement timeouts (a wait, then the probe that finds the
/// database gone).
const BOUND: Duration = Duration::from_millis(if CONNECT_MS > 2 * STATEMENT_MS {
    CONNECT_MS
} else {
    2 * STATEMENT_MS
});
/// Two clients per session, so one waits for the other's turn stuck in the outage.
const SESSIONS: usize = 3;
const CLIENTS: usize = 2;
/// How long each fault lasts.
const FAULT: Duration = Duration::from_secs(5);

const BEFORE: u8 = 0;
const DURING: u8 = 1;
const AFTER: u8 = 2;

/// What a client saw while the fault lasted: status, how long the answer took, body.
type Seen = (u16, Duration, Value);

/// Every client sends turns to its session until `AFTER` has given it 3 acknowledged
/// turns (at most 90 s). Returns each session's acknowledged `(turn, text)` pairs and
/// what was answered while the fault lasted.
fn clients_through(
    host: &Server,
    ids: &[String],
    phase: &AtomicU8,
    round: &str,
    fault: impl FnOnce(),
) -> (Vec<Vec<(u64, String)>>, Vec<Seen>) {
    let during = Mutex::new(Vec::new());
    let acked = Mutex::new(vec![Vec::new(); ids.len()]);
    std::thread::scope(|scope| {
        for (s, id) in ids.iter().enumerate() {
            for c in 0..CLIENTS {
                let (during, acked) = (&during, &acked);
                scope.spawn(move || {
                    let agent = agent();
                    let url = host.url(&format!("/v1/sessions/{id}/turns"));
                    let started = Instant::now();
                    let mut after = 0;
                    for k in 0..100_000 {
                        if after >= 3 {
                            break;
                        }
                        assert!(
                            started.elapsed() < Duration::from_secs(90),
                            "{round}: session {s} client {c}: {after} turns after resuming in 90 s"
                        );
                        let text = format!("{round} s{s} c{c} k{k}");
                        let body = j!({"messages": [{"role": "user", "content": text}]});
                        let sent_in = phase.load(Ordering::SeqCst);
                        let sent = Instant::now();
                        let answer = request(&agent, "POST", &url, Some(&body), None);
                        let took = sent.elapsed();
                        let answered_in = phase.load(Ordering::SeqCst);
                        if answer.status == 200 {
                            acked.lock().unwrap()[s].push((answer.body["turn"].as_u64().unwrap(), text));
                            if sent_in == AFTER {
                                after += 1;
                            }
                        } else if sent_in == BEFORE && answered_in == BEFORE {
                            panic!("{round}: {} before the fault: {:?}", answer.status, answer.body);
                        }
                        if sent_in == DURING || answered_in == DURING {
                            during.lock().unwrap().push((answer.status, took, answer.body));
                        }
                        std::thread::sleep(Duration::from_millis(if answer.status == 200 {
                            20
                        } else {
                            100
                        }));
                    }
                });
            }
        }
        std::thread::sleep(Duration::from_millis(800));
        fault();
    });
    (acked.into_inner().unwrap(), during.into_inner().unwrap())
}

/// A PostgreSQL database of its own, and `serve` on it through a relay, with
/// `[store]`'s bounds set to [`CONNECT_MS`] and [`STATEMENT_MS`] and the turn wait (the
/// wait for a session's lock, in the host and in the database) `turn_wait`.
fn start(turn_wait: Duration) -> (TestConfig, TestStore, Link, Server) {
    let config = shipped_config("", &[("max_users", "max_users = 100")]);
    let mut text = std::fs::read_to_string(&config.path).unwrap();
    text.push_str(&format!(
        "\n[store]\nconnect_timeout_ms = {CONNECT_MS}\nstatement_timeout_ms = {STATEMENT_MS}\n"
    ));
    std::fs::write(&config.path, text).unwrap();
    let store = TestStore::new(Kind::Postgres, &config);
    let link = Link::to(&store.server_address());
    let turn_wait = turn_wait.as_millis().to_string();
    let host = Server::start(
        &config.path,
        &store.path_via(link.port()),
        &[
            ("HISTORY_TURN_WAIT_MS", &turn_wait),
            ("HISTORY_STORE_REMIND_MS", "2000"),
        ],
    );
    (config, store, link, host)
}

#[test]
fn a_turn_waiting_for_its_lock_in_a_black_hole_ends_within_the_bound() {
    if postgres_url("store_outage::a_turn_waiting_for_its_lock_in_a_black_hole_ends_within_the_bound")
        .is_none()
    {
        return;
    }
    // The lock may rightly be waited for up to the turn wait (30 s by default): only the
    // probe after a statement's bound tells a database gone from a lock held elsewhere.
    let (_config, _store, link, host) = start(Duration::from_secs(30));
    let id = host.create("local-8k");
    let turn = |text: &str| {
        let sent = Instant::now();
        let answer = host.post(
            &format!("/v1/sessions/{id}/turns"),
            &j!({"messages": [{"role": "user", "content": text}]}),
        );
        (answer, sent.elapsed())
    };
    assert_eq!(turn("before").0.status, 200);
    // Nothing in flight: the next turn takes its lock on a pooled connection the host
    // has no reason to doubt, and waits in the black hole.
    link.black_hole();
    let (answer, took) = turn("into the black hole");
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.error().0, "store_unavailable", "{answer:?}");
    assert!(
        took < 3 * BOUND,
        "the 503 after {took:?} (the bound is {BOUND:?})"
    );
    // The session is free at once: the next turn is refused at once too, not busy.
    let (answer, took) = turn("still in the black hole");
    assert_eq!(answer.status, 503, "{answer:?}");
    assert!(took < BOUND, "{took:?}");
    link.restore();
    let started = Instant::now();
    let answer = loop {
        let (answer, _) = turn("after");
        if answer.status == 200 || started.elapsed() > Duration::from_secs(30) {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(answer.status, 200, "{answer:?}");
    let transcript = host.transcript(&id);
    assert_eq!(transcript.first().map(|m| &m["content"]), Some(&j!("before")));
    assert_eq!(transcript.last().map(|m| &m["content"]), Some(&j!("after")));
    assert_eq!(host.stop().code(), Some(0));
}

#[test]
fn a_postgres_that_refuses_or_stops_answering_gives_quick_503s_and_turns_resume() {
    if postgres_url(
        "store_outage::a_postgres_that_refuses_or_stops_answering_gives_quick_503s_and_turns_resume",
    )
    .is_none()
    {
        return;
    }
    // A session held past the turn wait would answer 409 busy: the wait is 3 bounds here.
    let (_config, _store, link, host) = start(3 * BOUND);
    let ids: Vec<String> = (0..SESSIONS).map(|_| host.create("local-8k")).collect();
    let mut acked = vec![Vec::new(); SESSIONS];
    for round in ["refuse", "black-hole"] {
        let fault = |link: &Link| match round {
            "refuse" => link.cut(),
            _ => link.black_hole(),
        };
        let phase = AtomicU8::new(BEFORE);
        let log_before = host.stderr().len();
        let (probes_during, (round_acked, during)) = {
            let probes = Mutex::new(None);
            let result = clients_through(&host, &ids, &phase, round, || {
                phase.store(DURING, Ordering::SeqCst);
                fault(&link);
                // Found out within a bound or two: readiness says so, liveness does not.
                std::thread::sleep(2 * BOUND);
                *probes.lock().unwrap() = Some((host.get("/readyz"), host.get("/livez")));
                std::thread::sleep(FAULT.saturating_sub(2 * BOUND));
                link.restore();
                phase.store(AFTER, Ordering::SeqCst);
            });
            (probes.into_inner().unwrap().unwrap(), result)
        };
        let (ready, live) = probes_during;
        assert_eq!(ready.status, 503, "{round}: /readyz during the outage: {ready:?}");
        let said = ready.body.as_str().unwrap_or_default();
        assert!(said.contains("store unreachable since"), "{round}: {said}");
        assert_eq!(live.status, 200, "{round}: /livez during the outage");
        // Quick 503s, and no session held past the turn wait (a 409).
        let refused: Vec<&Seen> = during.iter().filter(|(status, ..)| *status != 200).collect();
        assert!(
            refused.len() >= SESSIONS,
            "{round}: too few turns ran into the outage: {during:?}"
        );
        for (status, took, body) in &refused {
            assert_eq!(*status, 503, "{round}: {body}");
            assert_eq!(body["error"]["code"], "store_unavailable", "{round}: {body}");
            assert!(
                *took < 3 * BOUND,
                "{round}: a 503 after {took:?} (the bound is {BOUND:?}): {body}"
            );
        }
        // The log: the outage once, a reminder or two with a count, its end once.
        let log = host.stderr()[log_before..].to_string();
        let loud: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("ERROR") || l.contains("WARN"))
            .collect();
        assert!(
            loud.len() <= 4 && loud.iter().filter(|l| l.contains("ERROR")).count() == 1,
            "{round}: {} refusals logged in {} lines: {loud:#?}",
            refused.len(),
            loud.len()
        );
        let reminders: Vec<&&str> = loud
            .iter()
            .filter(|l| l.contains("store still unavailable"))
            .collect();
        assert!(
            !reminders.is_empty() && reminders.iter().all(|l| l.contains("operations refused")),
            "{round}: a reminder with a count: {loud:#?}"
        );
        let ended: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("store available again"))
            .collect();
        assert_eq!(ended.len(), 1, "{round}: {log}");
        assert_eq!(host.get("/readyz").status, 200, "{round}: ready again");
        for (s, turns) in round_acked.into_iter().enumerate() {
            acked[s].extend(turns);
        }
    }
    // Every acknowledged turn is there, in order (a turn whose commit reached the database
    // but whose answer was lost may be there unacknowledged).
    for (id, acked) in ids.iter().zip(&mut acked) {
        acked.sort();
        let transcript = host.transcript(id);
        for (turn, text) in acked.iter() {
            assert_eq!(
                transcript[*turn as usize - 1]["content"],
                j!(text),
                "session {id} turn {turn}"
            );
        }
        let turns: Vec<u64> = transcript
            .iter()
            .map(|m| m["metadata"]["turn_added"].as_u64().unwrap())
            .collect();
        assert_eq!(
            turns,
            (1..=transcript.len() as u64).collect::<Vec<_>>(),
            "session {id}"
        );
    }
    assert_eq!(host.stop().code(), Some(0));
}
