//! What a plugin returns: the new history and its lifecycle events (docs/chain.md#events-and-logs).

use abi_stable::{
    std_types::{RArc, ROption, RString, RVec},
    StableAbi,
};

use crate::message::Message;

/// The kinds of lifecycle events (docs/chain.md#events-and-logs), plus `Warning` for a report that is not a
/// fault (e.g. a retention policy of the wrong length).
///
/// Event kinds only flow out of plugins (in an [`Output`]), so a variant appended at the
/// end is a patch release: a plugin built before it never reports it, and the host accepts
/// its shorter copy of the enum (the crate docs, "ABI stability"). Never insert, reorder
/// or remove a variant.
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
    /// A message's text was rewritten in place (a redaction, a normalization): a changed
    /// copy with the same role and place. Since 0.2.2.
    MessageChanged,
    /// Messages were replaced by a summary of them. Since 0.2.2.
    MessageSummarized,
    /// A message of the session's transcript, not in the plugin's input, was put back
    /// into the history (`ctx.recall`). Since 0.2.3.
    MessageRecalled,
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
            Self::MessageChanged => "message-changed",
            Self::MessageSummarized => "message-summarized",
            Self::MessageRecalled => "message-recalled",
        }
    }

    /// Every kind, in declaration order.
    pub const ALL: [EventKind; 11] = [
        Self::MessageExpired,
        Self::MessageCompacted,
        Self::MessageRemoved,
        Self::MessageOmitted,
        Self::MessageMerged,
        Self::MessageExpanded,
        Self::OverBudget,
        Self::Warning,
        Self::MessageChanged,
        Self::MessageSummarized,
        Self::MessageRecalled,
    ];
}

/// One lifecycle event.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    /// The turn in which it happened. The host sets it to the turn of the run on every
    /// event it receives, so a plugin need not fill it ([`Event::of`]).
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
    /// An event of `kind` with its reason. The host fills in the turn (the run's).
    pub fn of(kind: EventKind, reason: impl Into<RString>) -> Event {
        Event {
            kind,
            turn: 0,
            index: ROption::RNone,
            id: ROption::RNone,
            reason: reason.into(),
            tokens_saved: ROption::RNone,
        }
    }

    /// The older form of [`Event::of`], from before the host filled in the turn; kept so
    /// plugins written for it still compile. The `turn` given is replaced by the run's.
    pub fn new(kind: EventKind, turn: u64, reason: impl Into<RString>) -> Event {
        Event {
            turn,
            ..Event::of(kind, reason)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_name() {
        let names: std::collections::HashSet<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), EventKind::ALL.len());
        assert_eq!(EventKind::MessageChanged.as_str(), "message-changed");
        assert_eq!(EventKind::MessageSummarized.as_str(), "message-summarized");
        // ALL lists the variants in declaration order, the last one last.
        for (i, kind) in EventKind::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, i);
        }
    }

    #[test]
    fn an_event_needs_no_turn() {
        let event = Event::of(EventKind::MessageChanged, "redacted");
        assert_eq!((event.turn, event.reason.as_str()), (0, "redacted"));
        assert_eq!(Event::new(EventKind::Warning, 4, "w").turn, 4);
    }
}
