//! A store that cannot be reached (or take writes), as the log and readiness see it: one
//! line when it starts, a reminder with a count at most every [`Outage::remind_every`]
//! while it lasts, one line when it ends (docs/scaling-out.md#when-the-database-is-unreachable).
//! The requests refused meanwhile are each a 503 to their client and a count here, not a
//! log line each.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::clock::{now_ms, rfc3339};
use crate::store::StoreError;

/// The reminder's period unless `HISTORY_STORE_REMIND_MS` (hidden, for tests) says.
const REMIND_EVERY: Duration = Duration::from_secs(60);

pub(crate) struct Outage {
    down: Mutex<Option<Down>>,
    remind_every: Duration,
    /// What readiness says the store is while down: "unreachable" (a database server) or
    /// "unavailable" (a file that cannot take writes).
    word: &'static str,
}

struct Down {
    since: Instant,
    since_ms: u64,
    /// Operations refused since it started, and since the last line.
    refused: u64,
    refused_since_line: u64,
    last_line: Instant,
    last_error: String,
}

impl Outage {
    pub(crate) fn new(word: &'static str) -> Outage {
        let remind_every = std::env::var("HISTORY_STORE_REMIND_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis)
            .unwrap_or(REMIND_EVERY);
        Outage {
            down: Mutex::new(None),
            remind_every,
            word,
        }
    }

    /// What a store operation `started` then gave. Only an operation that `wrote` (or
    /// took a lock) ends an outage — a store that cannot take writes may still answer
    /// reads — and only one started after the outage began: one answered before it began
    /// may return after the first refusal.
    pub(crate) fn saw<T>(&self, result: &Result<T, StoreError>, wrote: bool, started: Instant) {
        match result {
            Err(e) if e.unavailable => self.failed(e),
            // An error of the store's own (a refused write, bad data) is an answer.
            _ if wrote => self.answered(started),
            _ => {}
        }
    }

    fn failed(&self, e: &StoreError) {
        let mut down = self.down.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match down.as_mut() {
            None => {
                tracing::error!(
                    "{e}; operations that need the store answer 503 until it is back \
                     (refusals are counted, not logged each)"
                );
                *down = Some(Down {
                    since: now,
                    since_ms: now_ms(),
                    refused: 1,
                    refused_since_line: 1,
                    last_line: now,
                    last_error: e.message.clone(),
                });
            }
            Some(down) => {
                down.refused += 1;
                down.refused_since_line += 1;
                down.last_error.clone_from(&e.message);
                if now.duration_since(down.last_line) >= self.remind_every {
                    tracing::warn!(
                        "store still unavailable after {} s: {} operations refused ({} since the last line); last: {}",
                        down.since.elapsed().as_secs(),
                        down.refused,
                        down.refused_since_line,
                        down.last_error
                    );
                    down.last_line = now;
                    down.refused_since_line = 0;
                }
            }
        }
    }

    fn answered(&self, started: Instant) {
        let mut down = self.down.lock().unwrap_or_else(|e| e.into_inner());
        if down.as_ref().is_some_and(|down| started < down.since) {
            return;
        }
        if let Some(ended) = down.take() {
            tracing::info!(
                "store available again after {} ms; {} operations were refused meanwhile",
                ended.since.elapsed().as_millis(),
                ended.refused
            );
        }
    }

    /// Readiness's reason while the store is unavailable.
    pub(crate) fn reason(&self) -> Option<String> {
        let down = self.down.lock().unwrap_or_else(|e| e.into_inner());
        down.as_ref().map(|down| {
            format!(
                "store {} since {} ({} operations refused): {}",
                self.word,
                rfc3339(down.since_ms),
                down.refused,
                down.last_error
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_counted_and_ends_with_the_first_answer() {
        let outage = Outage::new("unreachable");
        assert_eq!(outage.reason(), None);
        outage.saw::<()>(&Err(StoreError::new("a refused write")), true, Instant::now());
        assert_eq!(outage.reason(), None, "the store answered");
        for _ in 0..3 {
            outage.saw::<()>(
                &Err(StoreError::unavailable("cannot connect")),
                false,
                Instant::now(),
            );
        }
        let reason = outage.reason().expect("down");
        assert!(
            reason.contains("(3 operations refused): cannot connect"),
            "{reason}"
        );
        assert!(reason.contains("store unreachable since "), "{reason}");
        let before = Instant::now() - Duration::from_secs(1);
        outage.saw(&Ok(()), false, Instant::now());
        assert!(outage.reason().is_some(), "a read does not end it");
        outage.saw(&Ok(()), true, before);
        assert!(outage.reason().is_some(), "nor a write that began before it");
        outage.saw(&Ok(()), true, Instant::now());
        assert_eq!(outage.reason(), None);
    }
}
