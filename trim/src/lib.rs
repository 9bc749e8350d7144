//! The rules docs/plugins.md#shared-trimming-rules gives every plugin that drops old messages to fit a window
//! (`default` in messages, `token_budget` in tokens), in one place:
//!
//! - leading `system` messages and the first `user` message are pinned (switchable);
//! - whole units are kept or dropped ([`plugin_api::structure::units`]);
//! - the kept part is the pinned messages plus the longest suffix of units that fits, or
//!   with a target, a cut quantized in steps of `budget − target` so it stays put for many
//!   turns (cache-stable);
//! - the start rule and the never-empty rule, with an `over-budget` event;
//! - a history that fits is returned unchanged.
//!
//! The caller supplies each message's cost (1 per message, or its tokens).

use plugin_api::structure::{answered_calls, leading_system_count, units_with_answers};
use plugin_api::{Context, Event, EventKind, Message, Output, RArc, Role};

/// Which messages are pinned (kept in place whatever the window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pins {
    /// The leading `system`/`developer` messages.
    pub system: bool,
    /// The first `user` message of the history, wherever it is.
    pub first_user: bool,
}

/// The window a history must fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// B: the most the kept history may cost. ≤ 0 keeps only what never-empty keeps.
    pub budget: i64,
    /// T: the cache-stable target, used only when `0 ≤ T < B`.
    pub target: Option<u64>,
    /// Whether pinned messages count against the budget (`token_budget` counts them
    /// first; `default` does not count them).
    pub count_pinned: bool,
}

/// What to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Per message: kept?
    pub keep: Vec<bool>,
    /// The never-empty rule had to keep more than fits (or nothing fit).
    pub over_budget: bool,
}

struct Unit {
    /// The unit's unpinned messages, in order.
    members: Vec<usize>,
    cost: u64,
}

/// Plans the cut of `history` with per-message `costs`; `None` when it fits as it is.
pub fn plan(history: &[RArc<Message>], costs: &[u64], pins: Pins, window: Window) -> Option<Plan> {
    debug_assert_eq!(history.len(), costs.len());
    let pinned = pinned_messages(history, pins);
    let counted = |i: usize| window.count_pinned || !pinned[i];
    let total: u64 = (0..history.len()).filter(|&i| counted(i)).map(|i| costs[i]).sum();
    if window.budget >= 0 && total <= window.budget as u64 {
        return None;
    }

    let answers = answered_calls(history);
    let units: Vec<Unit> = units_with_answers(history.len(), &answers)
        .into_iter()
        .map(|range| {
            let members: Vec<usize> = range.filter(|&i| !pinned[i]).collect();
            let cost = members.iter().map(|&i| costs[i]).sum();
            Unit { members, cost }
        })
        .filter(|unit| !unit.members.is_empty())
        .collect();
    let pinned_cost: u64 = (0..history.len())
        .filter(|&i| pinned[i] && window.count_pinned)
        .map(|i| costs[i])
        .sum();
    let pinned_user = pinned
        .iter()
        .enumerate()
        .find(|&(i, &p)| p && history[i].role == Role::User)
        .map(|(i, _)| i);
    let starts_with_user = |u: &Unit| history[u.members[0]].role == Role::User;
    let preceded_by_pinned_user = |u: &Unit| pinned_user.is_some_and(|p| p < u.members[0]);

    // Start rule: something was dropped, so the kept suffix must start with a user
    // message unless the pinned user message precedes it.
    let start_rule = |mut first: usize| {
        while first < units.len()
            && !starts_with_user(&units[first])
            && !preceded_by_pinned_user(&units[first])
        {
            first += 1;
        }
        first
    };
    let mut first_kept = start_rule(first_unit_that_fits(&units, window, total, pinned_cost));
    if first_kept == units.len() && quantized(window) {
        // The quantized threshold can exceed everything droppable (a large newest unit):
        // then the plain cut, if one fits and starts validly, is the right answer rather
        // than an over-budget result that would keep less (or more) than fits.
        first_kept = start_rule(plain_cut(&units, window.budget, pinned_cost));
    }

    let mut over_budget = false;
    if first_kept == units.len() {
        // Never empty: no suffix that fits satisfies the start rule.
        over_budget = true;
        first_kept = match units.last() {
            None => units.len(),
            Some(newest) if preceded_by_pinned_user(newest) => units.len() - 1,
            Some(_) => match units.iter().rposition(starts_with_user) {
                Some(last_user_unit) => last_user_unit,
                // The only user message is pinned and newest: the pinned messages alone.
                None if pinned_user.is_some() => units.len(),
                None => units.len() - 1,
            },
        };
    }

    let mut keep = pinned;
    for unit in &units[first_kept..] {
        for &i in &unit.members {
            keep[i] = true;
        }
    }
    Some(Plan { keep, over_budget })
}

/// The history's units with their pinned messages left out, each a list of message
/// indices in order; units left with no message are dropped (what a plugin that chooses
/// among the unpinned units works on).
pub fn unpinned_units(history: &[RArc<Message>], pinned: &[bool]) -> Vec<Vec<usize>> {
    units_with_answers(history.len(), &answered_calls(history))
        .into_iter()
        .map(|range| range.filter(|&i| !pinned[i]).collect::<Vec<usize>>())
        .filter(|members| !members.is_empty())
        .collect()
}

/// Per message: pinned by `pins` (the leading system messages, the first user message)?
pub fn pinned_messages(history: &[RArc<Message>], pins: Pins) -> Vec<bool> {
    let mut pinned = vec![false; history.len()];
    if pins.system {
        for flag in pinned.iter_mut().take(leading_system_count(history)) {
            *flag = true;
        }
    }
    if pins.first_user {
        if let Some(first_user) = history.iter().position(|m| m.role == Role::User) {
            pinned[first_user] = true;
        }
    }
    pinned
}

fn quantized(window: Window) -> bool {
    window.budget > 0
        && window
            .target
            .is_some_and(|target| i64::try_from(target).is_ok_and(|t| t < window.budget))
}

/// Index of the first kept unit before the start rule: the plain cut (longest suffix that
/// fits what the pinned messages leave) or, with a valid target, the quantized one.
fn first_unit_that_fits(units: &[Unit], window: Window, total: u64, pinned_cost: u64) -> usize {
    let budget = window.budget;
    if budget <= 0 {
        return units.len();
    }
    match window.target {
        Some(target) if quantized(window) => {
            // Drop the shortest unit prefix costing at least S·⌈(total − B) / S⌉.
            let step = (budget - target as i64) as u64;
            let over = total - budget as u64;
            let must_drop = over.div_ceil(step) * step;
            let mut dropped = 0u64;
            for (index, unit) in units.iter().enumerate() {
                if dropped >= must_drop {
                    return index;
                }
                dropped += unit.cost;
            }
            units.len()
        }
        _ => plain_cut(units, budget, pinned_cost),
    }
}

/// The longest suffix of units that fits what the pinned messages leave of `budget`.
fn plain_cut(units: &[Unit], budget: i64, pinned_cost: u64) -> usize {
    let Some(room) = u64::try_from(budget)
        .ok()
        .and_then(|b| b.checked_sub(pinned_cost))
    else {
        return units.len();
    };
    let mut used = 0u64;
    for (index, unit) in units.iter().enumerate().rev() {
        used += unit.cost;
        if used > room {
            return index + 1;
        }
    }
    0
}

/// Builds the plugin output of a plan: kept messages shared, a `message-removed` event per
/// dropped message and an `over-budget` event when the never-empty rule applied.
pub fn apply(history: &[RArc<Message>], plan: Option<Plan>, ctx: &Context, why: &str) -> Output {
    let Some(plan) = plan else {
        return Output::unchanged(history);
    };
    let mut events = Vec::new();
    let mut kept = Vec::with_capacity(plan.keep.iter().filter(|k| **k).count());
    for (index, (message, keep)) in history.iter().zip(&plan.keep).enumerate() {
        if *keep {
            kept.push(message.clone());
        } else {
            events.push(Event::new(EventKind::MessageRemoved, ctx.turn, why).at(index, message));
        }
    }
    if plan.over_budget {
        events.push(Event::new(
            EventKind::OverBudget,
            ctx.turn,
            format!("{why}: no suffix that fits starts validly; kept the newest valid part"),
        ));
    }
    Output::new(kept, events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use history_wire::chat::history_from_str;

    fn history(n_pairs: usize) -> Vec<RArc<Message>> {
        let mut items = vec![r#"{"role":"system","content":"s"}"#.to_string()];
        for i in 0..n_pairs {
            items.push(format!(r#"{{"role":"user","content":"u{i}"}}"#));
            items.push(format!(r#"{{"role":"assistant","content":"a{i}"}}"#));
        }
        history_from_str(&format!("[{}]", items.join(","))).unwrap()
    }

    #[test]
    fn quantized_cut_that_would_drop_everything_falls_back_to_the_plain_cut() {
        // system(10), u0(10), a0(10), u1(10), a1(60): total 100, B = 90, T = 10, S = 80.
        // The quantized threshold is 80, but only 30 tokens precede the newest unit: the
        // literal rule would drop every unit and fall to never-empty with over-budget,
        // although dropping u0..a0 (20) fits (system 10 + u1 10 + a1 60 = 80 ≤ 90).
        let history = history(2);
        let costs = [10, 10, 10, 10, 60];
        let pins = Pins {
            system: true,
            first_user: false,
        };
        let window = Window {
            budget: 90,
            target: Some(10),
            count_pinned: true,
        };
        let plan = plan(&history, &costs, pins, window).unwrap();
        assert_eq!(plan.keep, vec![true, false, false, true, true]);
        assert!(!plan.over_budget);
    }

    #[test]
    fn quantized_cut_drops_whole_steps() {
        // 1 system + 6 pairs at 10 each = 130; B = 100, T = 60, S = 40:
        // over = 30 → drop ≥ 40 → u0 a0 u1 a1 (40) dropped.
        let history = history(6);
        let costs = vec![10; history.len()];
        let pins = Pins {
            system: true,
            first_user: false,
        };
        let window = Window {
            budget: 100,
            target: Some(60),
            count_pinned: true,
        };
        let plan = plan(&history, &costs, pins, window).unwrap();
        let kept: Vec<usize> = (0..history.len()).filter(|&i| plan.keep[i]).collect();
        assert_eq!(kept, vec![0, 5, 6, 7, 8, 9, 10, 11, 12]);
    }
}
