//! The session service under load and under `kill -9` (docs/sessions.md#durability):
//! many concurrent sessions lose, duplicate or mix up no turn, and a host killed at a
//! random moment restarts with every acknowledged turn and no partial one. Every loop is
//! bounded in count and time; traffic goes to 127.0.0.1 only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e_tests::server::{agent, request, shipped_config, Server};
use e2e_tests::store::{Kind, TestStore};
use serde_json::{json as j, Value};

/// The shipped chain, room for the sessions, a chars4 model (quick to count).
fn config() -> e2e_tests::TestConfig {
    shipped_config("", &[("max_users", "max_users = 100")])
}

/// Turn `k` of session `s`: a user message and an answer, each naming both.
fn turn_messages(s: usize, k: u64) -> Value {
    j!([
        {"role": "user", "content": format!("s{s}-t{k} question")},
        {"role": "assistant", "content": format!("s{s}-t{k} answer")},
    ])
}

/// Checks a session's transcript holds exactly turns 1..=turns of session `s`, whole
/// and in order.
fn check_transcript(s: usize, transcript: &[Value], turns: u64) {
    assert_eq!(
        transcript.len() as u64,
        2 * turns,
        "session {s}: {} messages",
        transcript.len()
    );
    for (i, message) in transcript.iter().enumerate() {
        let k = i as u64 / 2 + 1;
        let expected = turn_messages(s, k)[i % 2].clone();
        assert_eq!(message["role"], expected["role"], "session {s} message {i}");
        assert_eq!(message["content"], expected["content"], "session {s} message {i}");
        assert_eq!(message["metadata"]["turn_added"], k, "session {s} message {i}");
    }
}

fn sixty_four_concurrent_sessions_of_fifty_turns_lose_and_mix_up_nothing(kind: Kind) {
    const SESSIONS: usize = 64;
    const TURNS: u64 = 50;
    const THREADS: usize = 8;
    let config = config();
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let ids: Vec<String> = (0..SESSIONS).map(|_| server.create("local-8k")).collect();
    let started = Instant::now();
    let deadline = Duration::from_secs(600);
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let ids = &ids;
            let url = server.url("");
            scope.spawn(move || {
                let agent = agent();
                // Each thread owns every THREADS-th session and interleaves their turns.
                for k in 1..=TURNS {
                    for s in (thread..SESSIONS).step_by(THREADS) {
                        assert!(started.elapsed() < deadline, "the load test ran out of time");
                        let answer = request(
                            &agent,
                            "POST",
                            &format!("{url}/v1/sessions/{}/turns", ids[s]),
                            Some(&j!({ "messages": turn_messages(s, k) })),
                            None,
                        );
                        assert_eq!(answer.status, 200, "session {s} turn {k}: {answer:?}");
                        assert_eq!(answer.body["turn"], k, "session {s}");
                        let sent = answer.body["history"].as_array().unwrap();
                        assert_eq!(sent.last().unwrap()["content"], format!("s{s}-t{k} answer"));
                    }
                }
            });
        }
    });
    eprintln!(
        "{} turns in {:.1} s",
        SESSIONS as u64 * TURNS,
        started.elapsed().as_secs_f64()
    );
    for (s, id) in ids.iter().enumerate() {
        check_transcript(s, &server.transcript(id), TURNS);
        let working = server.history(id, false);
        for message in working.as_array().unwrap() {
            assert!(
                message["content"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("s{s}-")),
                "session {s} holds another session's message: {message}"
            );
        }
    }
    let metrics = server.get("/metrics").body;
    assert!(
        metrics.as_str().unwrap().contains(&format!(
            "history_turns_total{{outcome=\"ok\"}} {}",
            SESSIONS as u64 * TURNS
        )),
        "{metrics}"
    );
    assert_eq!(server.stop().code(), Some(0));
}

/// A small deterministic generator for the kill moments (the seed is printed).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn kill_9_at_random_moments_loses_no_acknowledged_turn_and_leaves_no_partial_one(kind: Kind) {
    const SESSIONS: usize = 6;
    const ROUNDS: usize = 12;
    let config = config();
    let store = TestStore::new(kind, &config);
    let seed = std::env::var("KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("kill moments: KILL_SEED={seed}");
    let mut rng = Rng(seed);
    let mut ids: Vec<String> = Vec::new();
    // The last acknowledged turn of each session.
    let mut acknowledged = [0u64; SESSIONS];
    // Turns committed whose answer the kill cut off.
    let mut unacknowledged_committed = 0;
    let started = Instant::now();
    for round in 0..ROUNDS {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the kill loop ran out of time"
        );
        let server = Server::start(&config.path, store.path(), &[]);
        if ids.is_empty() {
            ids = (0..SESSIONS).map(|_| server.create("local-8k")).collect();
        }
        // Every acknowledged turn is there, whole, and at most the one in flight more.
        let mut next = Vec::with_capacity(SESSIONS);
        for (s, id) in ids.iter().enumerate() {
            let transcript = server.transcript(id);
            let turns = transcript.len() as u64 / 2;
            assert!(
                turns == acknowledged[s] || turns == acknowledged[s] + 1,
                "round {round}, session {s}: {turns} turns stored, {} acknowledged (KILL_SEED={seed})",
                acknowledged[s]
            );
            check_transcript(s, &transcript, turns);
            unacknowledged_committed += usize::from(turns > acknowledged[s]);
            let working = server.history(id, false);
            if turns > 0 {
                assert_eq!(
                    working.as_array().unwrap().last().unwrap()["content"],
                    format!("s{s}-t{turns} answer"),
                    "round {round}, session {s}: the working history is the last turn's"
                );
            }
            acknowledged[s] = turns;
            next.push(turns + 1);
        }
        // Concurrent clients, one per session, until the host dies.
        let dead = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = ids
            .iter()
            .enumerate()
            .map(|(s, id)| {
                let url = format!("{}/v1/sessions/{id}/turns", server.url(""));
                let dead = dead.clone();
                let mut k = next[s];
                std::thread::spawn(move || {
                    let agent = agent();
                    let mut acked = k - 1;
                    while !dead.load(Ordering::SeqCst) && k < next_limit(acked) {
                        let answer = request(
                            &agent,
                            "POST",
                            &url,
                            Some(&j!({ "messages": turn_messages(s, k) })),
                            None,
                        );
                        if answer.status != 200 {
                            break;
                        }
                        assert_eq!(answer.body["turn"], k, "session {s}");
                        acked = k;
                        k += 1;
                    }
                    acked
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50 + rng.below(500)));
        server.kill9();
        dead.store(true, Ordering::SeqCst);
        for (s, client) in clients.into_iter().enumerate() {
            acknowledged[s] = client.join().unwrap();
        }
    }
    let server = Server::start(&config.path, store.path(), &[]);
    for (s, id) in ids.iter().enumerate() {
        let turns = server.transcript(id).len() as u64 / 2;
        assert!(turns == acknowledged[s] || turns == acknowledged[s] + 1);
        check_transcript(s, &server.transcript(id), turns);
    }
    eprintln!(
        "{ROUNDS} kills: {} turns acknowledged, {unacknowledged_committed} committed turns found whose answer was cut off",
        acknowledged.iter().sum::<u64>()
    );
    assert!(
        acknowledged.iter().sum::<u64>() > 0,
        "no turn was acknowledged at all"
    );
    assert_eq!(server.stop().code(), Some(0));
}

/// A bound on one client's turns in one round.
fn next_limit(acked: u64) -> u64 {
    acked + 1 + 2000
}

/// Concurrent turns on one session: `threads` clients each send `turns` turns; returns
/// the turns acknowledged (with their numbers) and the refusals' codes.
fn one_session_race(
    server: &Server,
    id: &str,
    threads: usize,
    turns: usize,
) -> (Vec<(u64, String)>, Vec<String>) {
    let url = server.url(&format!("/v1/sessions/{id}/turns"));
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let url = url.clone();
                scope.spawn(move || {
                    let agent = agent();
                    let mut acked = Vec::new();
                    let mut refused = Vec::new();
                    for k in 0..turns {
                        let content = format!("client {t} turn {k}");
                        let answer = request(
                            &agent,
                            "POST",
                            &url,
                            Some(&j!({"messages": [{"role": "user", "content": content}]})),
                            None,
                        );
                        match answer.status {
                            200 => acked.push((answer.body["turn"].as_u64().unwrap(), content)),
                            _ => refused.push(answer.error().0.to_string()),
                        }
                    }
                    (acked, refused)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut acked: Vec<(u64, String)> = results.iter().flat_map(|(a, _)| a.clone()).collect();
    acked.sort();
    (acked, results.into_iter().flat_map(|(_, r)| r).collect())
}

fn turns_of_one_session_run_one_at_a_time_and_a_turn_waiting_too_long_is_a_409(kind: Kind) {
    let config = config();
    let store = TestStore::new(kind, &config);
    // The default wait: every concurrent turn gets its turn, one at a time.
    let server = Server::start(&config.path, store.path(), &[]);
    let id = server.create("local-8k");
    let (acked, refused) = one_session_race(&server, &id, 8, 5);
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(
        acked.iter().map(|(turn, _)| *turn).collect::<Vec<_>>(),
        (1..=40).collect::<Vec<_>>()
    );
    let transcript = server.transcript(&id);
    for (turn, content) in &acked {
        let message = &transcript[*turn as usize - 1];
        assert_eq!(
            (&message["content"], &message["metadata"]["turn_added"]),
            (&j!(content), &j!(turn))
        );
    }

    // A wait of 1 ms: some turns give up with 409, and nothing of them is stored.
    let store_b = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store_b.path(), &[("HISTORY_TURN_WAIT_MS", "1")]);
    let id = server.create("local-8k");
    let (acked, refused) = one_session_race(&server, &id, 8, 10);
    assert!(!refused.is_empty(), "no turn had to wait");
    assert!(refused.iter().all(|code| code == "busy"), "{refused:?}");
    let transcript = server.transcript(&id);
    assert_eq!(transcript.len(), acked.len());
    assert_eq!(
        acked.iter().map(|(turn, _)| *turn).collect::<Vec<_>>(),
        (1..=acked.len() as u64).collect::<Vec<_>>()
    );
}

#[test]
fn sigterm_under_load_keeps_every_acknowledged_turn_and_exits_0() {
    const SESSIONS: usize = 6;
    let config = config();
    let store = config.dir.path().join("sessions.db");
    let server = Server::start(&config.path, &store, &[]);
    let ids: Vec<String> = (0..SESSIONS).map(|_| server.create("local-8k")).collect();
    let clients: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(s, id)| {
            let url = format!("{}/v1/sessions/{id}/turns", server.url(""));
            std::thread::spawn(move || {
                let agent = agent();
                let mut acked = 0;
                // Bounded: at most 500 turns, or until the host stops answering.
                for k in 1..=500u64 {
                    let answer = request(
                        &agent,
                        "POST",
                        &url,
                        Some(&j!({ "messages": turn_messages(s, k) })),
                        None,
                    );
                    if answer.status != 200 {
                        break;
                    }
                    assert_eq!(answer.body["turn"], k, "session {s}");
                    acked = k;
                }
                acked
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(700));
    let status = server.stop();
    assert_eq!(status.code(), Some(0), "SIGTERM under load exits 0");
    let acknowledged: Vec<u64> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    assert!(acknowledged.iter().sum::<u64>() > 0, "no turn was acknowledged");

    let server = Server::start(&config.path, &store, &[]);
    for (s, id) in ids.iter().enumerate() {
        let transcript = server.transcript(id);
        let turns = transcript.len() as u64 / 2;
        assert!(
            turns == acknowledged[s] || turns == acknowledged[s] + 1,
            "session {s}: {turns} turns stored, {} acknowledged",
            acknowledged[s]
        );
        check_transcript(s, &transcript, turns);
    }
    assert_eq!(server.stop().code(), Some(0));
}

e2e_tests::store_tests!(
    sixty_four_concurrent_sessions_of_fifty_turns_lose_and_mix_up_nothing,
    kill_9_at_random_moments_loses_no_acknowledged_turn_and_leaves_no_partial_one,
    turns_of_one_session_run_one_at_a_time_and_a_turn_waiting_too_long_is_a_409,
);
