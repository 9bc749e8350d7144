//! `bench serve --rate R`: the open loop (docs/sessions.md#open-loop). The turns are sent
//! on a fixed schedule, R a second in all, whatever the server does, and each turn's
//! latency is counted from the time it was *scheduled*, not from when it left: a server
//! that falls behind is charged the wait its backlog causes (no coordinated omission,
//! which a closed loop of clients hides by sending less when answers are slow).
//!
//! Slot `i` of the schedule, at `i / R` seconds, is turn `i / S` of session `i % S` (S
//! sessions), so every session's turns are spaced `S / R` apart and all sessions grow
//! together. A session's turns stay in order: a turn whose previous turn is not answered
//! by its slot leaves when that answer comes, and is still timed from its slot (those
//! are counted as `sent_late`). Bounded by the turn count and the time cap: no slot after
//! the cap is sent.

use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Method;

use super::Load;
use crate::loopback::{self, HttpClient};

/// A send that leaves later than this after its slot is counted as late (tokio's timer
/// wakes within a millisecond of the slot; later means the session's previous turn was
/// still running).
const LATE: Duration = Duration::from_millis(2);

/// The schedule's start and rate, shared by every session's task.
#[derive(Clone, Copy)]
pub(super) struct Schedule {
    pub start: Instant,
    pub rate: f64,
    pub sessions: usize,
    pub deadline: Instant,
}

impl Schedule {
    /// When turn `turn` of session `session` is due.
    fn slot(&self, session: usize, turn: usize) -> Instant {
        let slot = (turn * self.sessions + session) as f64;
        self.start + Duration::from_secs_f64(slot / self.rate)
    }
}

/// One session's turns on the schedule: latencies from each turn's slot (and, in
/// `from_send`, from when it left).
pub(super) async fn session_loop(
    client: HttpClient,
    addrs: Rc<Vec<String>>,
    id: String,
    bodies: Vec<Bytes>,
    session: usize,
    sticky: bool,
    schedule: Schedule,
) -> Load {
    let mut load = Load::empty();
    for (turn, body) in bodies.into_iter().enumerate() {
        let due = schedule.slot(session, turn);
        if due > schedule.deadline {
            load.capped = true;
            break;
        }
        tokio::time::sleep_until(due.into()).await;
        let url = format!(
            "http://{}/v1/sessions/{id}/turns",
            addrs[if sticky { session } else { session + turn } % addrs.len()],
        );
        let sent = Instant::now();
        if sent.duration_since(due) > LATE {
            load.sent_late += 1;
        }
        let answer = loopback::request(&client, Method::POST, &url, body).await;
        let answered = Instant::now();
        match answer {
            Ok(answer) if answer.status == 200 => {
                load.latencies.push(answered.duration_since(due));
                load.from_send.push(answered.duration_since(sent));
                load.sent.push(due);
            }
            Ok(answer) => {
                load.errors += 1;
                load.first_error.get_or_insert_with(|| answer.describe());
            }
            Err(e) => {
                load.errors += 1;
                load.first_error.get_or_insert(e);
            }
        }
    }
    load
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_go_round_the_sessions_at_the_rate() {
        let start = Instant::now();
        let schedule = Schedule {
            start,
            rate: 1000.0,
            sessions: 4,
            deadline: start + Duration::from_secs(1),
        };
        let at = |s, t| schedule.slot(s, t).duration_since(start);
        assert_eq!(at(0, 0), Duration::ZERO);
        assert_eq!(at(3, 0), Duration::from_millis(3));
        // A session's next turn comes S slots later.
        assert_eq!(at(3, 1), Duration::from_millis(7));
        assert_eq!(at(1, 10), Duration::from_millis(41));
    }
}
