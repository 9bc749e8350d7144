//! Expansion (docs/plugins.md#expansion): restoring the original content of a message that a plugin
//! compacted or replaced with a placeholder.
//!
//! It is a host operation on a working history (a session's `!expand I`, docs/sessions.md), not a
//! plugin: it needs the message the agent points at, by index or id, and it must refuse
//! clearly — never panic — when that message cannot be expanded.

use plugin_api::{Event, EventKind, Message, RArc};

/// Which message to expand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// Position in the working history (0-based).
    ByIndex(usize),
    /// `metadata.id`.
    ById(&'a str),
}

/// Why a message could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpandError {
    /// The index is past the end of the history.
    OutOfRange { index: usize, len: usize },
    /// No message has this `metadata.id`.
    UnknownId(String),
    /// The message has no `can_expand: true` or no `original_content`.
    NotExpandable { index: usize, reason: &'static str },
}

impl std::fmt::Display for ExpandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExpandError::OutOfRange { index, len } => {
                write!(f, "cannot expand message {index}: the history has {len} messages")
            }
            ExpandError::UnknownId(id) => write!(
                f,
                "cannot expand message {}: no message has that id",
                plugin_api::echo::quoted(id)
            ),
            ExpandError::NotExpandable { index, reason } => {
                write!(f, "cannot expand message {index}: {reason}")
            }
        }
    }
}

impl std::error::Error for ExpandError {}

/// Expands one message of `history` in place: its content becomes `original_content`,
/// `was_compacted`, `omitted` and `can_expand` become `false`, `original_content` is
/// removed and `expanded: true` is set. Returns the `message-expanded` event (at `turn`, with the message's index
/// and id); the history is untouched on error.
pub fn expand(history: &mut [RArc<Message>], target: Target<'_>, turn: u64) -> Result<Event, ExpandError> {
    let index = match target {
        Target::ByIndex(index) if index < history.len() => index,
        Target::ByIndex(index) => {
            return Err(ExpandError::OutOfRange {
                index,
                len: history.len(),
            })
        }
        Target::ById(id) => history
            .iter()
            .position(|m| m.id() == Some(id))
            .ok_or_else(|| ExpandError::UnknownId(id.to_string()))?,
    };
    let message = &history[index];
    let Some(meta) = message.meta() else {
        return Err(ExpandError::NotExpandable {
            index,
            reason: "it has no metadata (it was never compacted or omitted)",
        });
    };
    if !meta.can_expand() {
        return Err(ExpandError::NotExpandable {
            index,
            reason: "it is not marked can_expand",
        });
    }
    // A fresh copy, not `make_mut`: the copy starts with an empty token cache, and the
    // cached counts of the shortened content must not survive the change.
    let Some(copy) = message.restored_copy() else {
        return Err(ExpandError::NotExpandable {
            index,
            reason: "its original content was not kept",
        });
    };
    let shortened_chars = message.content.char_count();
    let restored_chars = copy.content.char_count();
    let event = Event::new(
        EventKind::MessageExpanded,
        turn,
        format!("restored the original content ({shortened_chars} -> {restored_chars} characters)"),
    )
    .at(index, message);
    history[index] = RArc::new(copy);
    Ok(event)
}

#[cfg(test)]
mod tests {
    use super::*;
    use history_wire::chat::{history_from_str, history_to_string};

    #[test]
    fn errors_name_the_message_and_leave_the_history_alone() {
        let mut history = history_from_str(
            r#"[{"role":"user","content":"a","metadata":{"id":"m1"}},
                {"role":"tool","tool_call_id":"c","content":"[Omitted]","metadata":{"omitted":true,"can_expand":true}},
                {"role":"tool","tool_call_id":"c","content":"x","metadata":{"original_content":"y"}},
                {"role":"user","content":"b"}]"#,
        )
        .unwrap();
        let before = history_to_string(&history);
        let err =
            |history: &mut Vec<RArc<Message>>, target| expand(history, target, 1).unwrap_err().to_string();
        assert_eq!(
            err(&mut history, Target::ByIndex(4)),
            "cannot expand message 4: the history has 4 messages"
        );
        assert_eq!(
            err(&mut history, Target::ById("nope")),
            "cannot expand message \"nope\": no message has that id"
        );
        assert_eq!(
            err(&mut history, Target::ById("m1")),
            "cannot expand message 0: it is not marked can_expand"
        );
        assert!(
            err(&mut history, Target::ByIndex(3)).starts_with("cannot expand message 3: it has no metadata")
        );
        assert!(err(&mut history, Target::ByIndex(1)).contains("original content was not kept"));
        assert!(err(&mut history, Target::ByIndex(2)).contains("not marked can_expand"));
        assert_eq!(history_to_string(&history), before);
    }
}
