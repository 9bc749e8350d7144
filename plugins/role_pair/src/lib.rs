//! `role_pair`: makes a history acceptable to the strictest providers (docs/plugins.md#role_pair).
//!
//! After the leading system messages the history starts with `user`; user and assistant
//! turns alternate (a tool loop is one assistant turn: only *adjacent* same-role messages
//! form a run); every tool call has exactly one result right after its assistant message
//! and every result has a call. The five steps of docs/plugins.md#role_pair run in order and are repeated until
//! none changes anything, so the repair is idempotent by construction:
//!
//! 1. results that answer no call are dropped; of two results for one call the first stays;
//! 2. a result separated from its call moves up to join its call's other results;
//! 3. runs of adjacent user (or assistant) messages are merged (`mode = "merge"`) or cut
//!    down to their first message (`mode = "drop"`);
//! 4. calls without a result get a placeholder result;
//! 5. leading messages that are neither user nor system are dropped.
//!
//! Which call a result answers is always [`answered_calls`] (docs/wire-format.md#messages: the nearest earlier
//! assistant message with that call id), the same definition the host's check uses.

use std::collections::{HashMap, HashSet};

use plugin_api::structure::answered_calls;
use plugin_api::{
    ConfigError, ConfigTable, Content, Context, Event, EventKind, HistoryPlugin, LoadContext, Message,
    Output, Part, RArc, ROption, RVec, Role,
};

// docs/plugins.md#token_budget's per-message overhead, used for the tokens saved by a removal.
use plugin_api::DEFAULT_PER_MESSAGE_TOKENS as PER_MESSAGE_TOKENS;

/// The placeholder content of a result made for a call that had none.
pub use plugin_api::DEFAULT_PLACEHOLDER;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Join each run into one message (default).
    Merge,
    /// Keep the first message of each run (the source document's behaviour).
    Drop,
}

pub struct RolePair {
    mode: Mode,
    placeholder: String,
}

/// A message of the history being repaired.
#[derive(Clone)]
struct Node {
    message: RArc<Message>,
    /// Index in the plugin's input of the message this node stands for (a merge: its
    /// first message; a placeholder: its call's message), for events.
    index: usize,
    /// The input messages whose tool calls this node carries, in order. A placeholder
    /// result must be made from the message its call came from: the host checks that the
    /// call is among that message's calls, and the placeholder takes that message's turn.
    call_sources: Vec<RArc<Message>>,
}

impl Node {
    fn role(&self) -> Role {
        self.message.role
    }
}

/// The repair of one history: the working list and the events so far.
struct Repair<'a> {
    nodes: Vec<Node>,
    events: Vec<Event>,
    plugin: &'a RolePair,
    ctx: &'a Context,
    turn: u64,
}

impl<'a> Repair<'a> {
    fn new(history: &[RArc<Message>], plugin: &'a RolePair, ctx: &'a Context) -> Repair<'a> {
        Repair {
            nodes: history
                .iter()
                .enumerate()
                .map(|(index, message)| Node {
                    message: message.clone(),
                    index,
                    call_sources: vec![message.clone()],
                })
                .collect(),
            events: Vec::new(),
            plugin,
            ctx,
            turn: ctx.turn,
        }
    }

    /// One pass of the five steps, in order: whether any changed anything.
    fn pass(&mut self) -> bool {
        let mut changed = self.drop_orphans_and_duplicates();
        changed |= self.move_results_to_calls();
        changed |= self.collapse_runs();
        changed |= self.answer_unanswered_calls();
        changed |= self.drop_leading_non_user();
        changed
    }

    fn answers(&self) -> Vec<Option<usize>> {
        let messages: Vec<RArc<Message>> = self.nodes.iter().map(|n| n.message.clone()).collect();
        answered_calls(&messages)
    }

    fn removed(&mut self, node: &Node, reason: String) {
        // What the removal saved, with the model's tokenizer and docs/plugins.md#token_budget's default
        // overhead (counts are memoized on the message, so this costs nothing twice).
        let saved = self
            .ctx
            .tokens()
            .message(self.ctx.model.tokenizer, &node.message, PER_MESSAGE_TOKENS);
        self.events.push(
            Event::new(EventKind::MessageRemoved, self.turn, reason)
                .at(node.index, &node.message)
                .saving(i64::try_from(saved).unwrap_or(i64::MAX)),
        );
    }

    /// Step 1: orphan results and second results for one call are dropped.
    fn drop_orphans_and_duplicates(&mut self) -> bool {
        let answers = self.answers();
        let mut seen: HashSet<(usize, String)> = HashSet::new();
        let mut kept = Vec::with_capacity(self.nodes.len());
        let mut changed = false;
        for (node, answer) in std::mem::take(&mut self.nodes).into_iter().zip(answers) {
            if node.role() != Role::Tool {
                kept.push(node);
                continue;
            }
            let id = node.message.call_id().unwrap_or("").to_string();
            let reason = match answer {
                None => Some(format!("tool result \"{id}\" answers no call")),
                Some(call) if !seen.insert((call, id.clone())) => Some(format!(
                    "second result for tool call \"{id}\" (the first is kept)"
                )),
                Some(_) => None,
            };
            match reason {
                Some(reason) => {
                    self.removed(&node, reason);
                    changed = true;
                }
                None => kept.push(node),
            }
        }
        self.nodes = kept;
        changed
    }

    /// Step 2: every result joins its call's other results, right after the call's
    /// message; results keep their relative order.
    fn move_results_to_calls(&mut self) -> bool {
        let answers = self.answers();
        let mut results_of: HashMap<usize, Vec<usize>> = HashMap::new();
        for (index, answer) in answers.iter().enumerate() {
            if let Some(call) = answer {
                results_of.entry(*call).or_default().push(index);
            }
        }
        let mut order = Vec::with_capacity(self.nodes.len());
        for (index, answer) in answers.iter().enumerate() {
            if answer.is_some() {
                continue; // emitted with its call
            }
            order.push(index);
            if let Some(results) = results_of.get(&index) {
                order.extend(results);
            }
        }
        if order
            .iter()
            .enumerate()
            .all(|(position, &index)| position == index)
        {
            return false;
        }
        let nodes = std::mem::take(&mut self.nodes);
        self.nodes = order.into_iter().map(|index| nodes[index].clone()).collect();
        true
    }

    /// Step 3: runs of adjacent user messages and of adjacent assistant messages become
    /// one message (merge) or their first message (drop).
    fn collapse_runs(&mut self) -> bool {
        let nodes = std::mem::take(&mut self.nodes);
        let mut changed = false;
        let mut start = 0;
        while start < nodes.len() {
            let role = nodes[start].role();
            let mut end = start + 1;
            if matches!(role, Role::User | Role::Assistant) {
                while end < nodes.len() && nodes[end].role() == role {
                    end += 1;
                }
            }
            let run = &nodes[start..end];
            if run.len() == 1 {
                self.nodes.push(run[0].clone());
            } else {
                changed = true;
                match self.plugin.mode {
                    Mode::Merge => {
                        for node in &run[1..] {
                            let reason = format!(
                                "adjacent {} messages: merged into message {}",
                                role.as_str(),
                                run[0].index
                            );
                            self.events.push(
                                Event::new(EventKind::MessageMerged, self.turn, reason)
                                    .at(node.index, &node.message),
                            );
                        }
                        self.nodes.push(merge(run));
                    }
                    Mode::Drop => {
                        for node in &run[1..] {
                            let reason = format!(
                                "adjacent {} messages: only the first (message {}) is kept",
                                role.as_str(),
                                run[0].index
                            );
                            self.removed(node, reason);
                        }
                        self.nodes.push(run[0].clone());
                    }
                }
            }
            start = end;
        }
        changed
    }

    /// Step 4: a call without a result gets a placeholder result after its call's
    /// existing results, in `tool_calls` order.
    fn answer_unanswered_calls(&mut self) -> bool {
        let answers = self.answers();
        // Per assistant node: the ids answered and the position of its last result.
        let mut answered: HashMap<usize, (HashSet<&str>, usize)> = HashMap::new();
        for (index, answer) in answers.iter().enumerate() {
            if let Some(call) = *answer {
                let entry = answered.entry(call).or_insert_with(|| (HashSet::new(), call));
                entry.0.insert(self.nodes[index].message.call_id().unwrap_or(""));
                entry.1 = entry.1.max(index);
            }
        }
        // (insert after this position, placeholder nodes), collected first and inserted
        // from the back so positions stay valid.
        let mut insertions: Vec<(usize, Vec<Node>)> = Vec::new();
        let none_answered = HashSet::new();
        for (index, node) in self.nodes.iter().enumerate() {
            if !node.message.has_tool_calls() {
                continue;
            }
            let (ids, last) = answered
                .get(&index)
                .map_or((&none_answered, index), |(ids, last)| (ids, *last));
            let mut made: HashSet<&str> = HashSet::new();
            let mut placeholders = Vec::new();
            // Call id -> the first of the node's input messages with a call of that id;
            // made once per node, when it has a call to answer (a message may have
            // thousands of calls: no scan of them per call).
            let mut sources: Option<HashMap<&str, &RArc<Message>>> = None;
            for call in node.message.tool_calls.iter() {
                let id = call.id.as_str();
                if ids.contains(id) || !made.insert(id) {
                    continue;
                }
                let source = sources
                    .get_or_insert_with(|| {
                        let mut first: HashMap<&str, &RArc<Message>> = HashMap::new();
                        for source in &node.call_sources {
                            for call in source.tool_calls.iter() {
                                first.entry(call.id.as_str()).or_insert(source);
                            }
                        }
                        first
                    })
                    .get(id)
                    .copied()
                    .unwrap_or(&node.message);
                let message = Message::placeholder_result(source, id, &self.plugin.placeholder);
                self.events.push(
                    Event::new(
                        EventKind::MessageOmitted,
                        self.turn,
                        format!("tool call \"{id}\" had no result: added a placeholder result"),
                    )
                    .at(node.index, &node.message),
                );
                placeholders.push(Node {
                    message: RArc::new(message),
                    index: node.index,
                    call_sources: Vec::new(),
                });
            }
            if !placeholders.is_empty() {
                insertions.push((last, placeholders));
            }
        }
        let changed = !insertions.is_empty();
        for (after, placeholders) in insertions.into_iter().rev() {
            self.nodes.splice(after + 1..after + 1, placeholders);
        }
        changed
    }

    /// Step 5: messages before the first user message that are not system messages are
    /// dropped (with no user message: every one that is not a system message).
    fn drop_leading_non_user(&mut self) -> bool {
        let first_user = self
            .nodes
            .iter()
            .position(|n| n.role() == Role::User)
            .unwrap_or(self.nodes.len());
        if self.nodes[..first_user].iter().all(|n| n.role().is_system()) {
            return false;
        }
        let nodes = std::mem::take(&mut self.nodes);
        for (position, node) in nodes.into_iter().enumerate() {
            if position < first_user && !node.role().is_system() {
                let reason = format!("{} message before the first user message", node.role().as_str());
                self.removed(&node, reason);
            } else {
                self.nodes.push(node);
            }
        }
        true
    }
}

/// One message made of a run of adjacent same-role messages (docs/plugins.md#role_pair step 3, merge):
/// the first message's fields and metadata, all the run's parts in order, the tool calls
/// concatenated and the retention policies concatenated (null entries for the parts of
/// messages that had none; none at all when no message of the run had one).
fn merge(run: &[Node]) -> Node {
    let first = &run[0];
    let mut merged = (*first.message).clone();
    let mut parts: Vec<Part> = Vec::new();
    let mut calls = Vec::new();
    let mut call_sources = Vec::new();
    let any_policy = run.iter().any(|n| policy(&n.message).is_some());
    let mut policies: Vec<ROption<u64>> = Vec::new();
    for node in run {
        let message = &node.message;
        parts.extend(message.content.to_parts());
        calls.extend(message.tool_calls.iter().cloned());
        call_sources.extend(node.call_sources.iter().cloned());
        if any_policy {
            match policy(message) {
                // As they are, even of another length than the parts: retention reports
                // such a policy; the merge does not second-guess it.
                Some(entries) => policies.extend(entries.iter().cloned()),
                None => policies.extend((0..message.content.part_count()).map(|_| ROption::RNone)),
            }
        }
    }
    if merged.role == plugin_api::Role::Assistant {
        // Reasoning (a thinking block) first, as Anthropic requires of an assistant turn:
        // a merge never puts one after the earlier message's text (docs/plugins.md#role_pair).
        reasoning_first(&mut parts, any_policy.then_some(&mut policies));
    }
    merged.content = if parts.is_empty() {
        Content::Null
    } else {
        Content::Parts(parts.into())
    };
    merged.tool_calls = calls.into();
    if any_policy {
        merged.meta_mut().retention_policy = ROption::RSome(RVec::from(policies));
    }
    Node {
        message: RArc::new(merged),
        index: first.index,
        call_sources,
    }
}

/// Moves the reasoning parts before the others, each group in its order, and the
/// retention policy's entries with them when it has one per part.
fn reasoning_first(parts: &mut Vec<Part>, policies: Option<&mut Vec<ROption<u64>>>) {
    let is_reasoning = |p: &Part| p.kind() == plugin_api::parts::PartKind::Reasoning;
    if !parts.iter().skip_while(|p| is_reasoning(p)).any(is_reasoning) {
        return;
    }
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by_key(|&i| !is_reasoning(&parts[i]));
    if let Some(policies) = policies.filter(|p| p.len() == parts.len()) {
        *policies = order.iter().map(|&i| policies[i]).collect();
    }
    *parts = order.iter().map(|&i| parts[i].clone()).collect();
}

fn policy(message: &Message) -> Option<&RVec<ROption<u64>>> {
    message
        .meta()
        .and_then(|m| m.retention_policy.as_ref().into_option())
}

/// True when a first pass of the five steps would change nothing, so the repair's answer
/// is the history unchanged: the common case, a history the chain kept well formed, read
/// in one pass with one map instead of the five steps' lists and maps. It reads each
/// step's own condition on the input (a step that changes nothing hands the next the same
/// input); `false` is always safe, and a message with very many calls takes the steps.
fn already_repaired(history: &[RArc<Message>]) -> bool {
    let answers = answered_calls(history);
    let first_user = history
        .iter()
        .position(|m| m.role == Role::User)
        .unwrap_or(history.len());
    // Step 5.
    if !history[..first_user].iter().all(|m| m.role.is_system()) {
        return false;
    }
    let mut index = 0;
    while index < history.len() {
        let message = &history[index];
        // Step 3: no two adjacent user, or assistant, messages.
        if matches!(message.role, Role::User | Role::Assistant)
            && history
                .get(index + 1)
                .is_some_and(|next| next.role == message.role)
        {
            return false;
        }
        match message.role {
            // Steps 1 and 2: a result that did not come right after its call's message, with
            // its call's other results, answers no call or is out of place.
            Role::Tool => return false,
            Role::Assistant => {
                // Its results: the tool messages right after it, every one answering it.
                let block_end = history[index + 1..]
                    .iter()
                    .position(|m| m.role != Role::Tool)
                    .map_or(history.len(), |n| index + 1 + n);
                if answers[index + 1..block_end].iter().any(|&a| a != Some(index)) {
                    return false;
                }
                let ids = || {
                    history[index + 1..block_end]
                        .iter()
                        .map(|m| m.call_id().unwrap_or(""))
                };
                let calls = message.tool_calls.len();
                let results = block_end - index - 1;
                if calls.saturating_mul(results) > 1024 || results.saturating_mul(results) > 1024 {
                    return false;
                }
                // Step 1: one result per call.
                if ids()
                    .enumerate()
                    .any(|(n, id)| ids().skip(n + 1).any(|other| other == id))
                {
                    return false;
                }
                // Step 4: every call answered.
                if message
                    .tool_calls
                    .iter()
                    .any(|call| !ids().any(|id| id == call.id.as_str()))
                {
                    return false;
                }
                index = block_end;
                continue;
            }
            _ => {}
        }
        index += 1;
    }
    true
}

impl RolePair {
    pub fn repair(&self, history: &[RArc<Message>], ctx: &Context) -> Result<Output, String> {
        if already_repaired(history) {
            return Ok(Output::unchanged(history));
        }
        let mut repair = Repair::new(history, self, ctx);
        // Each pass either changes nothing (done) or removes messages, merges them, or
        // answers calls that a later pass cannot unanswer; the bound is a safety net so a
        // mistake here becomes an error, never a hung host.
        let max_passes = history.len() + 8;
        let mut changed_at_all = false;
        for _ in 0..max_passes {
            if !repair.pass() {
                if !changed_at_all {
                    return Ok(Output::unchanged(history));
                }
                let summary = format!(
                    "role_pair: {} -> {} messages ({} merged, {} removed, {} placeholder results)",
                    history.len(),
                    repair.nodes.len(),
                    count(&repair.events, EventKind::MessageMerged),
                    count(&repair.events, EventKind::MessageRemoved),
                    count(&repair.events, EventKind::MessageOmitted),
                );
                ctx.log().debug(&summary);
                return Ok(Output::new(
                    repair.nodes.into_iter().map(|n| n.message),
                    repair.events,
                ));
            }
            changed_at_all = true;
        }
        Err(format!(
            "the repair did not settle after {max_passes} passes (a role_pair bug; input of {} messages)",
            history.len()
        ))
    }
}

fn count(events: &[Event], kind: EventKind) -> usize {
    events.iter().filter(|e| e.kind == kind).count()
}

impl HistoryPlugin for RolePair {
    const NAME: &'static str = "role_pair";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const SUMMARY: &'static str =
        "repairs roles and tool pairing for strict providers: user first, alternating turns, every call answered once";
    const CONFIG_KEYS: &'static [(&'static str, &'static str)] = &[
        (
            "mode",
            "merge (default): join adjacent same-role messages | drop: keep the first of each run",
        ),
        (
            "placeholder",
            "content of the result added for a call that has none (default \"[Omitted]\")",
        ),
    ];

    fn new(load: &LoadContext) -> Result<Self, ConfigError> {
        let mut config = ConfigTable::parse(&load.config_json)?;
        let mode = config
            .one_of("mode", &[("merge", Mode::Merge), ("drop", Mode::Drop)])?
            .unwrap_or(Mode::Merge);
        let placeholder = config
            .string("placeholder")?
            .unwrap_or_else(|| DEFAULT_PLACEHOLDER.to_string());
        config.finish()?;
        Ok(RolePair { mode, placeholder })
    }

    fn process(&self, history: &[RArc<Message>], ctx: &Context) -> Result<Output, String> {
        self.repair(history, ctx)
    }
}

plugin_api::export_plugin!(RolePair);

#[cfg(test)]
mod tests {
    use super::*;
    use history_wire::chat::{history_from_str, history_to_string};
    use plugin_testing::{context, load_context};

    fn run(config: &str, history: &str) -> Output {
        let plugin = RolePair::new(&load_context(config)).unwrap();
        let history = history_from_str(history).unwrap();
        plugin.repair(&history, &context(100, 1)).unwrap()
    }

    fn text(output: &Output) -> String {
        history_to_string(&output.history)
    }

    #[test]
    fn config_is_validated() {
        let err = RolePair::new(&load_context(r#"{"mode": "squash"}"#))
            .err()
            .unwrap();
        assert_eq!(err.key.as_str(), "mode");
        let err = RolePair::new(&load_context(r#"{"placeholders": "x"}"#))
            .err()
            .unwrap();
        assert_eq!(err.key.as_str(), "placeholders");
    }

    #[test]
    fn a_valid_history_passes_through() {
        let out = run(
            "{}",
            r#"[{"role":"system","content":"s"},{"role":"user","content":"u"},
               {"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},
               {"role":"tool","tool_call_id":"c","content":"r"},{"role":"assistant","content":"a"}]"#,
        );
        assert!(out.events.is_empty());
        assert_eq!(out.history.len(), 5);
    }

    #[test]
    fn a_merge_never_puts_a_thinking_block_after_text() {
        let history = plugin_testing::history(
            r#"[{"role":"user","content":"q"},
                {"role":"assistant","content":"first answer"},
                {"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"sig"},{"type":"text","text":"second"}]}]"#,
        );
        let plugin = RolePair::new(&plugin_testing::load_context(r#"{"mode":"merge"}"#)).unwrap();
        let out = plugin
            .process(&history, &plugin_testing::context(200, 1))
            .unwrap();
        assert_eq!(out.history.len(), 2);
        let parts = out.history[1].content.to_parts();
        let kinds: Vec<&str> = parts.iter().map(|p| p.type_name().unwrap_or("")).collect();
        assert_eq!(kinds, ["thinking", "text", "text"]);
        assert_eq!(
            parts[0],
            history[2].content.to_parts()[0],
            "the block byte for byte"
        );
    }

    /// Whether one pass of the five steps changes `history`: what [`already_repaired`]
    /// must answer exactly (`false` where it gives up on a message with very many calls).
    fn first_pass_changes(history: &[RArc<Message>]) -> bool {
        let plugin = RolePair::new(&load_context("{}")).unwrap();
        let ctx = context(100, 1);
        Repair::new(history, &plugin, &ctx).pass()
    }

    #[test]
    fn the_one_pass_check_agrees_with_the_steps_on_random_histories() {
        // A small linear congruential generator: the same 20,000 histories every run.
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: u64| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) % n
        };
        let (mut repaired, mut not) = (0, 0);
        for _ in 0..20_000 {
            let length = 1 + next(7);
            let messages: Vec<String> = (0..length)
                .map(|_| match next(5) {
                    0 => r#"{"role":"system","content":"s"}"#.to_string(),
                    1 => r#"{"role":"user","content":"u"}"#.to_string(),
                    2 => r#"{"role":"assistant","content":"a"}"#.to_string(),
                    3 => {
                        let calls: Vec<String> = (0..1 + next(2))
                            .map(|_| {
                                format!(
                                    r#"{{"id":"{}","type":"function","function":{{"name":"f","arguments":"{{}}"}}}}"#,
                                    ["x", "y", "z"][next(3) as usize]
                                )
                            })
                            .collect();
                        format!(r#"{{"role":"assistant","content":null,"tool_calls":[{}]}}"#, calls.join(","))
                    }
                    _ => format!(
                        r#"{{"role":"tool","tool_call_id":"{}","content":"r"}}"#,
                        ["x", "y", "z"][next(3) as usize]
                    ),
                })
                .collect();
            let history = history_from_str(&format!("[{}]", messages.join(","))).unwrap();
            let quick = already_repaired(&history);
            assert_eq!(quick, !first_pass_changes(&history), "{}", messages.join(","));
            if quick {
                repaired += 1;
            } else {
                not += 1;
            }
        }
        assert!(
            repaired > 1_000 && not > 1_000,
            "both cases are drawn: {repaired} / {not}"
        );
    }

    #[test]
    fn merged_calls_get_placeholders_from_their_own_message() {
        let plugin = RolePair::new(&load_context("{}")).unwrap();
        let mut history = history_from_str(
            r#"[{"role":"user","content":"u"},
               {"role":"assistant","content":"x","tool_calls":[{"id":"a","function":{"name":"f","arguments":"{}"}}]},
               {"role":"assistant","content":null,"tool_calls":[{"id":"b","function":{"name":"f","arguments":"{}"}}]},
               {"role":"tool","tool_call_id":"b","content":"rb"}]"#,
        )
        .unwrap();
        RArc::make_mut(&mut history[1]).turn = 5;
        RArc::make_mut(&mut history[2]).turn = 7;
        let out = plugin.repair(&history, &context(100, 7)).unwrap();
        assert!(
            text(&out).ends_with(
                r#"{"role":"tool","content":"rb","tool_call_id":"b"},{"role":"tool","content":"[Omitted]","tool_call_id":"a"}]"#
            ),
            "{}",
            text(&out)
        );
        // The placeholder for "a" is made from "a"'s own message and takes its turn.
        assert_eq!(out.history[3].call_id(), Some("a"));
        assert_eq!(out.history[3].turn, 5);
        assert_eq!(out.history[1].turn, 5);
    }
}
