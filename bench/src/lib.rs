//! `history-bench`: the seeded history generator and the pieces of the measurements of
//! `cargo xtask bench` (docs/chain.md#performance) that are worth testing on their own. The measuring itself
//! is the `history-bench` binary (`src/main.rs`).

pub mod generator;
pub mod hashing;

use std::time::Duration;

use plugin_api::{Message, RArc, Role};

pub use generator::{fan_out, generate, generate_messages, to_json_text};

/// Splits a history into turns (docs/wire-format.md#turns, as a session sees them arrive): a turn starts
/// at each user message; messages before the first user message belong to the first turn.
pub fn split_turns<T>(history: Vec<T>, is_user: impl Fn(&T) -> bool) -> Vec<Vec<T>> {
    let mut turns: Vec<Vec<T>> = Vec::new();
    let mut seen_user = false;
    for message in history {
        let user = is_user(&message);
        if turns.is_empty() || (user && seen_user) {
            turns.push(Vec::new());
        }
        seen_user |= user;
        turns.last_mut().expect("a turn was just opened").push(message);
    }
    turns
}

/// Whether a message is a user message (for [`split_turns`] on parsed messages).
pub fn is_user(message: &RArc<Message>) -> bool {
    message.role == Role::User
}

/// Bytes a BPE tokenizer is handed for a message (docs/plugins.md#token_budget's items): what entering
/// messages "cost" in `bytes_tokenized_ratio`.
pub fn token_item_bytes(message: &Message) -> u64 {
    message.token_items().map(|item| item.len() as u64).sum()
}

/// The `q`-quantile (0.0–1.0, nearest rank) of some durations; zero when there are none.
pub fn quantile(samples: &[Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The median of some durations (the upper one of an even count).
pub fn median(samples: &[Duration]) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    sorted[sorted.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_start_at_each_user_message() {
        let roles = ["system", "user", "assistant", "tool", "user", "assistant", "user"];
        let turns = split_turns(roles.to_vec(), |r| *r == "user");
        assert_eq!(
            turns,
            [
                vec!["system", "user", "assistant", "tool"],
                vec!["user", "assistant"],
                vec!["user"]
            ]
        );
        let leading = split_turns(vec!["assistant", "assistant"], |r| *r == "user");
        assert_eq!(leading, [vec!["assistant", "assistant"]]);
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(quantile(&samples, 0.99), Duration::from_micros(99));
        assert_eq!(quantile(&samples, 1.0), Duration::from_micros(100));
        assert_eq!(median(&samples), Duration::from_micros(51));
        assert_eq!(median(&[]), Duration::ZERO);
    }
}
