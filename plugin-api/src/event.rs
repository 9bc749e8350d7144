//! What a plugin returns: the new history and its lifecycle events (docs/chain.md#events-and-logs).

use abi_stable::{
    std_types::{RArc, ROption, RString, RVec},
    StableAbi,
};

use crate::message::Message;

/// The kinds of lifecycle events (docs/chain.md#events-and-logs), plus `Warning` for a report that is not a
/// fault (e.g. a retention policy of the wrong length).
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    MessageExpired,
    MessageCompacted,
    MessageRemoved,
    MessageOmitted,
    MessageMerged,
    MessageExpanded,
    OverBudget,
    Warning,
}

impl EventKind {
    /// The event's name in logs and reports, e.g. `message-expired`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MessageExpired => "message-expired",
            Self::MessageCompacted => "message-compacted",
            Self::MessageRemoved => "message-removed",
            Self::MessageOmitted => "message-omitted",
            Self::MessageMerged => "message-merged",
            Self::MessageExpanded => "message-expanded",
            Self::OverBudget => "over-budget",
            Self::Warning => "warning",
        }
    }
}

/// One lifecycle event.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    /// The turn in which it happened.
    pub turn: u64,
    /// The message's index in the history the plugin received, when about one message.
    pub index: ROption<u64>,
    /// The message's `metadata.id`, when it has one.
    pub id: ROption<RString>,
    pub reason: RString,
    /// Tokens saved, where known.
    pub tokens_saved: ROption<i64>,
}

impl Event {
    pub fn new(kind: EventKind, turn: u64, reason: impl Into<RString>) -> Event {
        Event {
            kind,
            turn,
            index: ROption::RNone,
            id: ROption::RNone,
            reason: reason.into(),
            tokens_saved: ROption::RNone,
        }
    }

    /// About the message at `index` of the plugin's input.
    pub fn at(mut self, index: usize, message: &Message) -> Event {
        self.index = ROption::RSome(index as u64);
        self.id = message.id().map(RString::from).into();
        self
    }

    /// With the tokens it saved.
    pub fn saving(mut self, tokens: i64) -> Event {
        self.tokens_saved = ROption::RSome(tokens);
        self
    }
}

/// A plugin's result: the new history and what happened.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Default)]
pub struct Output {
    pub history: RVec<RArc<Message>>,
    pub events: RVec<Event>,
}

impl Output {
    /// The history passed through as it came (shared, nothing copied).
    pub fn unchanged(history: &[RArc<Message>]) -> Output {
        Output {
            history: history.iter().cloned().collect(),
            events: RVec::new(),
        }
    }

    pub fn new(history: impl IntoIterator<Item = RArc<Message>>, events: Vec<Event>) -> Output {
        Output {
            history: history.into_iter().collect(),
            events: events.into(),
        }
    }
}
