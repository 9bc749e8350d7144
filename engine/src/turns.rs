//! Turns (docs/wire-format.md#turns) and message identity, derived once before the first plugin runs.

use rustc_hash::FxHashSet as HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use plugin_api::{Message, RArc, Role};

/// The current turn of a stateless call: the document's `turn`, else the number of user
/// messages (at least 1).
pub fn current_turn(history: &[RArc<Message>], given: Option<u64>) -> u64 {
    given.unwrap_or_else(|| (history.iter().filter(|m| m.role == Role::User).count() as u64).max(1))
}

/// What a run does first: every message gets a unique identity and its turn. Done ahead
/// of a run (while the messages are not shared yet) it saves the run copying them to set
/// these; a run then finds them set and changes nothing.
pub fn prepare(history: &mut [RArc<Message>], current: u64) {
    assign_origins(history);
    derive_turns(history, current);
}

/// Sets every message's `turn` (docs/wire-format.md#turns): its own `turn_added` if present; otherwise the
/// k-th newest user message belongs to turn `current − k + 1` (at least 1), any other
/// message to the turn of the nearest user message before it; messages before the first
/// user message take the first user message's turn; with no user message, the current turn.
pub(crate) fn derive_turns(history: &mut [RArc<Message>], current: u64) {
    let mut derived = vec![current; history.len()];
    let mut users_seen = 0u64;
    for (index, message) in history.iter().enumerate().rev() {
        if message.role == Role::User {
            users_seen += 1;
            derived[index] =
                own_turn(message).unwrap_or_else(|| current.saturating_sub(users_seen - 1).max(1));
        }
    }
    let first_user = history.iter().position(|m| m.role == Role::User);
    let mut nearest_user_turn = first_user.map_or(current, |i| derived[i]);
    for (index, message) in history.iter().enumerate() {
        if message.role == Role::User {
            nearest_user_turn = derived[index];
        } else {
            derived[index] = own_turn(message).unwrap_or(nearest_user_turn);
        }
    }
    for (message, turn) in history.iter_mut().zip(derived) {
        if message.turn != turn {
            RArc::make_mut(message).turn = turn;
        }
    }
}

fn own_turn(message: &Message) -> Option<u64> {
    message.meta().and_then(|m| m.turn_added.into_option())
}

/// Identities the process makes up have the top bit set; identities below it are a
/// store's: a message's position in its session's transcript (from 1). The two never
/// collide, so a working history restored from a store keeps identities that mean the
/// same after a restart.
const FRESH_ORIGIN_BIT: u64 = 1 << 63;

static NEXT_ORIGIN: AtomicU64 = AtomicU64::new(1);

/// A fresh message identity, unique in this process.
pub(crate) fn fresh_origin() -> u64 {
    FRESH_ORIGIN_BIT | NEXT_ORIGIN.fetch_add(1, Ordering::Relaxed)
}

/// Stamps the messages entering a session at `turn`, before they are appended to the
/// working history: `metadata.turn_added`, the derived turn the plugins read, and an
/// identity — `first_seq`, `first_seq + 1`, … when a store numbers the transcript (the
/// messages' positions in it, from 1), otherwise fresh ones. Call it while the messages
/// are not shared yet, so nothing is copied.
pub fn stamp_entering(messages: &mut [RArc<Message>], turn: u64, first_seq: Option<u64>) {
    for (offset, message) in messages.iter_mut().enumerate() {
        let origin = match first_seq {
            Some(first) => first + offset as u64,
            None => fresh_origin(),
        };
        debug_assert!(origin & FRESH_ORIGIN_BIT == 0 || first_seq.is_none());
        let message = RArc::make_mut(message);
        message.meta_mut().turn_added = plugin_api::ROption::RSome(turn);
        message.turn = turn;
        message.set_origin(origin);
    }
}

/// Gives every message a unique identity, so the output check can tell a changed copy
/// from an invented message. Messages that already have a unique one keep it.
pub(crate) fn assign_origins(history: &mut [RArc<Message>]) {
    // Identities in increasing order are unique without hashing them: a session's history
    // (what entered later was numbered later) and any history numbered here before.
    let first_numbered = history.first().map(|m| m.origin()) != Some(0);
    if first_numbered && history.windows(2).all(|w| w[0].origin() < w[1].origin()) {
        return;
    }
    let mut seen = HashSet::with_capacity_and_hasher(history.len(), Default::default());
    for message in history.iter_mut() {
        let origin = message.origin();
        if origin == 0 || !seen.insert(origin) {
            let fresh = fresh_origin();
            RArc::make_mut(message).set_origin(fresh);
            seen.insert(fresh);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use history_wire::chat::history_from_str;

    fn turns(json: &str, current: Option<u64>) -> Vec<u64> {
        let mut history = history_from_str(json).unwrap();
        let now = current_turn(&history, current);
        derive_turns(&mut history, now);
        history.iter().map(|m| m.turn).collect()
    }

    #[test]
    fn turns_are_counted_backward_from_the_newest_user_message() {
        let json = r#"[{"role":"system","content":"s"},{"role":"assistant","content":"hi"},
            {"role":"user","content":"1"},{"role":"assistant","content":"a"},
            {"role":"user","content":"2"},{"role":"tool","tool_call_id":"x","content":"t"},
            {"role":"user","content":"3"},{"role":"assistant","content":"b"}]"#;
        assert_eq!(turns(json, None), [1, 1, 1, 1, 2, 2, 3, 3]);
        assert_eq!(turns(json, Some(7)), [5, 5, 5, 5, 6, 6, 7, 7]);
    }

    #[test]
    fn turn_added_wins_and_others_follow_their_user_message() {
        let json = r#"[{"role":"user","content":"1","metadata":{"turn_added":4}},
            {"role":"assistant","content":"a"},
            {"role":"tool","tool_call_id":"x","content":"t","metadata":{"turn_added":9}},
            {"role":"user","content":"2"}]"#;
        assert_eq!(turns(json, Some(10)), [4, 4, 9, 10]);
        assert_eq!(turns(r#"[{"role":"assistant","content":"a"}]"#, Some(3)), [3]);
    }

    #[test]
    fn entering_messages_are_stamped_with_their_turn_and_identity() {
        let mut new =
            history_from_str(r#"[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]"#)
                .unwrap();
        stamp_entering(&mut new, 7, Some(41));
        assert_eq!(new.iter().map(|m| m.turn).collect::<Vec<_>>(), [7, 7]);
        assert_eq!(new.iter().map(|m| m.origin()).collect::<Vec<_>>(), [41, 42]);
        assert_eq!(new[1].meta().unwrap().turn_added, plugin_api::ROption::RSome(7));
        // Without a store: fresh identities, which never collide with a store's.
        stamp_entering(&mut new, 8, None);
        assert!(new.iter().all(|m| m.origin() & FRESH_ORIGIN_BIT != 0));
        assert_ne!(new[0].origin(), new[1].origin());
    }

    #[test]
    fn origins_are_unique() {
        let mut history =
            history_from_str(r#"[{"role":"user","content":"1"},{"role":"user","content":"2"}]"#).unwrap();
        history.push(history[0].clone());
        assign_origins(&mut history);
        let origins: HashSet<u64> = history.iter().map(|m| m.origin()).collect();
        assert_eq!(origins.len(), 3);
        // Numbered histories keep their identities; a repeated one out of order is renumbered.
        let before: Vec<u64> = history.iter().map(|m| m.origin()).collect();
        assign_origins(&mut history);
        assert_eq!(history.iter().map(|m| m.origin()).collect::<Vec<_>>(), before);
        history.push(history[1].clone());
        assign_origins(&mut history);
        let origins: HashSet<u64> = history.iter().map(|m| m.origin()).collect();
        assert_eq!(origins.len(), 4);
    }
}
