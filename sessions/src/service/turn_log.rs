//! The last turns of each live session, in memory (docs/http-api.md#turns): what the
//! inspector page (`/ui`) draws its timeline and chart from. Bounded: at most
//! [`TURN_LOG_LEN`] turns a session, at most [`EVENTS_PER_TURN`] events a turn; lost on a
//! restart and when the session leaves this host.

use std::collections::VecDeque;

use crate::clock::now_ms;
use crate::session::TurnOutcome;

/// The turns a session's log keeps: the oldest goes when one more comes.
pub const TURN_LOG_LEN: usize = 1000;

/// The events a turn's record keeps; `events_total` counts them all.
pub const EVENTS_PER_TURN: usize = 200;

/// One stage of a turn, as its `StageReport` said.
#[derive(Debug, Clone, PartialEq)]
pub struct StageRecord {
    pub plugin: String,
    pub view: bool,
    pub ingest: bool,
    pub messages_in: usize,
    pub messages_out: usize,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub ms: f64,
    pub skipped: bool,
    pub quarantined: bool,
}

/// An event a plugin reported in a turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    pub plugin: String,
    pub kind: String,
    pub index: Option<u64>,
    pub id: Option<String>,
    pub reason: String,
    pub tokens_saved: Option<i64>,
}

/// What one turn did, in numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnRecord {
    pub turn: u64,
    /// When it ended, in ms since the epoch.
    pub at: u64,
    pub model: String,
    /// The messages the turn added to the transcript, and their tokens.
    pub entered: usize,
    pub entered_tokens: u64,
    /// The chain's input (working history and the new messages) and the sent history.
    pub messages_in: usize,
    pub messages_sent: usize,
    pub tokens_in: u64,
    pub tokens_sent: u64,
    pub working_size: usize,
    /// The transcript's tokens after this turn: the sum of `entered_tokens` over every
    /// turn this process has seen of the session (a session loaded after a restart counts
    /// from there; docs/http-api.md#turns).
    pub transcript_tokens: u64,
    pub prefix_kept: Option<usize>,
    pub stages: Vec<StageRecord>,
    pub events: Vec<EventRecord>,
    pub events_total: usize,
}

/// A session's log: the last [`TURN_LOG_LEN`] turns.
#[derive(Debug, Default)]
pub(crate) struct TurnLog {
    records: VecDeque<TurnRecord>,
    transcript_tokens: u64,
}

impl TurnLog {
    /// Records `outcome`, dropping the oldest record past the bound.
    pub(crate) fn record(&mut self, outcome: &TurnOutcome) {
        self.transcript_tokens += outcome.entered_tokens;
        let run = &outcome.run;
        let stages = outcome.switch.iter().flat_map(|s| &s.stages).chain(&run.stages);
        let mut events = Vec::new();
        let mut events_total = 0;
        for (plugin, event) in outcome.switch.iter().flat_map(|s| s.events()).chain(run.events()) {
            events_total += 1;
            if events.len() < EVENTS_PER_TURN {
                events.push(EventRecord {
                    plugin: plugin.to_string(),
                    kind: event.kind.as_str().to_string(),
                    index: event.index.into_option(),
                    id: event.id.as_ref().into_option().map(|s| s.to_string()),
                    reason: event.reason.to_string(),
                    tokens_saved: event.tokens_saved.into_option(),
                });
            }
        }
        let mut stage_records = Vec::new();
        for stage in stages {
            stage_records.push(StageRecord {
                plugin: stage.plugin.clone(),
                view: stage.view,
                ingest: stage.ingest,
                messages_in: stage.messages_in,
                messages_out: stage.messages_out,
                tokens_in: stage.tokens_in,
                tokens_out: stage.tokens_out,
                ms: stage.elapsed.as_secs_f64() * 1000.0,
                skipped: stage.skipped.is_some(),
                quarantined: stage.quarantined,
            });
        }
        if self.records.len() == TURN_LOG_LEN {
            self.records.pop_front();
        }
        self.records.push_back(TurnRecord {
            turn: outcome.turn,
            at: now_ms(),
            model: outcome.model.name.to_string(),
            entered: outcome.entered,
            entered_tokens: outcome.entered_tokens,
            messages_in: run.messages_in,
            messages_sent: run.history.len(),
            tokens_in: run.tokens_in,
            tokens_sent: run.tokens_out,
            working_size: run.working.len(),
            transcript_tokens: self.transcript_tokens,
            prefix_kept: run.prefix_kept,
            stages: stage_records,
            events,
            events_total,
        });
    }

    /// The last `last` records (all with `None`), oldest first.
    pub(crate) fn last(&self, last: Option<usize>) -> Vec<TurnRecord> {
        let skip = last.map_or(0, |n| self.records.len().saturating_sub(n));
        self.records.iter().skip(skip).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use history_engine::ChainRun;
    use plugin_api::{ModelInfo, Tokenizer};

    fn outcome(turn: u64) -> TurnOutcome {
        TurnOutcome {
            turn,
            model: ModelInfo {
                name: "default".into(),
                max_context: 200,
                context_tokens: 128_000,
                tokenizer: Tokenizer::Chars4,
                effective_ctx: 200,
            },
            run: ChainRun {
                history: Vec::new(),
                working: Vec::new(),
                input_faults: Vec::new(),
                host_events: Vec::new(),
                stages: Vec::new(),
                messages_in: 2,
                tokens_in: 100,
                tokens_out: 60,
                prefix_kept: Some(1),
            },
            switch: None,
            entered: 2,
            entered_tokens: 10,
        }
    }

    #[test]
    fn the_log_keeps_the_last_turns_and_counts_the_transcript_from_the_first() {
        let mut log = TurnLog::default();
        let total = TURN_LOG_LEN as u64 + 5;
        for turn in 1..=total {
            log.record(&outcome(turn));
        }
        let all = log.last(None);
        assert_eq!(all.len(), TURN_LOG_LEN);
        assert_eq!(all[0].turn, 6, "the oldest went first");
        let newest = all.last().unwrap();
        assert_eq!((newest.turn, newest.transcript_tokens), (total, total * 10));
        assert_eq!(
            (newest.tokens_in, newest.tokens_sent, newest.prefix_kept),
            (100, 60, Some(1))
        );
        let last3 = log.last(Some(3));
        assert_eq!(
            last3.iter().map(|r| r.turn).collect::<Vec<_>>(),
            [total - 2, total - 1, total]
        );
    }
}
