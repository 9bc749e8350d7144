//! The structure of a history, as docs/wire-format.md#messages, docs/plugins.md#shared-trimming-rules define it: which call a tool result
//! answers, structural faults, and units. The host, its output check and every plugin use
//! these same definitions, so they agree on what "valid" means.

use std::ops::Range;

// Call ids are short strings hashed once or twice per message on every call of every
// plugin: FxHash, not SipHash (no untrusted-key DoS concern inside one history).
use rustc_hash::FxHashMap as HashMap;

use abi_stable::std_types::RArc;

use crate::message::{Message, Role};

/// The call a tool result answers: the assistant message's index and the call's position
/// in that message's `tool_calls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallRef {
    pub message: usize,
    pub call: usize,
}

/// For each message, the index of the assistant message a `tool` message answers: the
/// nearest earlier assistant message with a tool call of that id (real histories reuse
/// ids across assistant messages). `None` for orphan results and for other roles.
pub fn answered_calls(history: &[RArc<Message>]) -> Vec<Option<usize>> {
    answered_call_refs(history)
        .into_iter()
        .map(|answer| answer.map(|at| at.message))
        .collect()
}

/// [`answered_calls`] with the call itself: for each `tool` message, the assistant message
/// it answers and the position of the call there (the first call with that id, when a
/// message gives one id to several calls). One pass with a map from call id to call, so a
/// message with thousands of calls costs no more per result than one with a single call.
pub fn answered_call_refs(history: &[RArc<Message>]) -> Vec<Option<CallRef>> {
    let mut latest_call: HashMap<&str, CallRef> = HashMap::default();
    history
        .iter()
        .enumerate()
        .map(|(index, message)| match message.role {
            Role::Assistant => {
                // From the last call back, so an id given twice ends up at its first call.
                for (call, tool_call) in message.tool_calls.iter().enumerate().rev() {
                    latest_call.insert(tool_call.id.as_str(), CallRef { message: index, call });
                }
                None
            }
            Role::Tool => message.call_id().and_then(|id| latest_call.get(id).copied()),
            _ => None,
        })
        .collect()
}

/// The tool name of the result at `index`: the `function.name` of the call it answers
/// (`answers` from [`answered_call_refs`]), else the message's own `name`. An empty
/// `function.name` means the call did not name one.
pub fn tool_name<'a>(
    history: &'a [RArc<Message>],
    answers: &[Option<CallRef>],
    index: usize,
) -> Option<&'a str> {
    let from_call = answers[index]
        .and_then(|at| history[at.message].tool_calls.get(at.call))
        .map(|call| call.name.as_str())
        .filter(|name| !name.is_empty());
    from_call.or_else(|| history[index].name.as_ref().into_option().map(|s| s.as_str()))
}

/// Number of leading `system`/`developer` messages.
pub fn leading_system_count(history: &[RArc<Message>]) -> usize {
    history
        .iter()
        .take_while(|message| message.role.is_system())
        .count()
}

/// The structural faults of docs/wire-format.md#input-checks: not bad input, but what `role_pair` repairs and
/// what no plugin may add (docs/chain.md#the-output-check).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// Indices of tool results that answer no call.
    pub orphan_results: Vec<usize>,
    /// (assistant index, call id) of calls with no result.
    pub unanswered_calls: Vec<(usize, String)>,
    /// Index of the first message after the leading system messages, when it is not a
    /// `user` message.
    pub non_user_start: Option<usize>,
}

impl Faults {
    /// Finds the faults of a history.
    pub fn of(history: &[RArc<Message>]) -> Faults {
        let answers = answered_calls(history);
        Faults::with_answers(history, &answers)
    }

    /// Same as [`Faults::of`] when [`answered_calls`] is already known.
    pub fn with_answers(history: &[RArc<Message>], answers: &[Option<usize>]) -> Faults {
        let mut faults = Faults::default();
        let mut answered: HashMap<(usize, &str), usize> = HashMap::default();
        for (index, message) in history.iter().enumerate() {
            if message.role != Role::Tool {
                continue;
            }
            match (answers[index], message.call_id()) {
                (Some(call), Some(id)) => *answered.entry((call, id)).or_default() += 1,
                _ => faults.orphan_results.push(index),
            }
        }
        for (index, message) in history.iter().enumerate() {
            if message.role != Role::Assistant {
                continue;
            }
            for call in message.tool_calls.iter() {
                if !answered.contains_key(&(index, call.id.as_str())) {
                    faults.unanswered_calls.push((index, call.id.to_string()));
                }
            }
        }
        let start = leading_system_count(history);
        if let Some(first) = history.get(start) {
            if first.role != Role::User {
                faults.non_user_start = Some(start);
            }
        }
        faults
    }

    /// Total number of faults.
    pub fn count(&self) -> usize {
        self.orphan_results.len() + self.unanswered_calls.len() + usize::from(self.non_user_start.is_some())
    }

    /// One line per fault, for reports.
    pub fn describe(&self, history: &[RArc<Message>]) -> Vec<String> {
        let mut lines = Vec::new();
        for &index in &self.orphan_results {
            let id = history[index].call_id().unwrap_or("");
            lines.push(format!(
                "message {index}: tool result {} answers no call",
                crate::echo::quoted(id)
            ));
        }
        for (index, id) in &self.unanswered_calls {
            lines.push(format!(
                "message {index}: tool call {} has no result",
                crate::echo::quoted(id)
            ));
        }
        if let Some(index) = self.non_user_start {
            lines.push(format!(
                "message {index}: history starts with {} after the system messages",
                history[index].role.as_str()
            ));
        }
        lines
    }
}

/// The units of docs/plugins.md#shared-trimming-rules: an assistant message with tool calls together with everything up
/// to its last answering tool message (overlapping spans join into one unit); any other
/// message is a unit by itself. Returned in order, covering `0..history.len()`.
pub fn units(history: &[RArc<Message>]) -> Vec<Range<usize>> {
    let answers = answered_calls(history);
    units_with_answers(history.len(), &answers)
}

/// Same as [`units`] when [`answered_calls`] is already known.
pub fn units_with_answers(len: usize, answers: &[Option<usize>]) -> Vec<Range<usize>> {
    // span_end[a] = last index answering assistant a (a itself when none).
    let mut span_end: Vec<usize> = (0..len).collect();
    for (index, answer) in answers.iter().enumerate() {
        if let Some(call) = *answer {
            span_end[call] = span_end[call].max(index);
        }
    }
    let mut units = Vec::new();
    let mut start = 0;
    while start < len {
        let mut end = span_end[start];
        let mut next = start + 1;
        while next <= end {
            end = end.max(span_end[next]);
            next += 1;
        }
        units.push(start..end + 1);
        start = end + 1;
    }
    units
}
