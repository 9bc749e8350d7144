//! A `proptest` generator of conversation histories with everything real histories have,
//! for property tests of any plugin: [`history`] gives the JSON text of a history.
//!
//! What it generates:
//! - 0–2 leading `system` (or `developer`) messages, sometimes a system message mid-history;
//! - user and assistant messages in any order, so same-role runs and histories that start
//!   with the assistant occur;
//! - assistant messages with 1–3 tool calls (call ids drawn from a small pool, so ids are
//!   reused across assistant messages as in real data), with all, some or none of their
//!   results, results in any order, a second result for one call, results separated from
//!   their call by a user message, and orphan results;
//! - content as a string, an array of parts (text and opaque parts such as images or
//!   reasoning blocks) or null, with non-ASCII text;
//! - metadata: `id`, `turn_added`, `retention_policy` (usually one entry per part, null
//!   entries included, sometimes of the wrong length), `expiration`, `message_type`.
//!
//! Every text and every opaque part carries a tag unique within its history (`t12 `), so a
//! test can tell which input message (or part) an output message came from.
//!
//! The output is always valid input (docs/wire-format.md#input-checks); structural faults are intended.
//! `turn_added` values are 1–5, and a history may have fewer user messages than that: a
//! test whose plugin depends on message ages should pass an explicit `turn` (docs/wire-format.md#turns: a
//! caller sending `turn_added` must also send `turn`).

use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// Content before rendering; texts get their unique tags at render time.
#[derive(Debug, Clone)]
pub enum ContentSpec {
    Null,
    Text(String),
    /// Parts: `Ok(text)` is a text part, `Err(kind)` an opaque part of kind 0..3.
    Parts(Vec<Result<String, u8>>),
}

#[derive(Debug, Clone, Default)]
pub struct MetaSpec {
    pub id: bool,
    pub turn_added: Option<u64>,
    /// `Some(entries)`; entries beyond the part count are cut and missing ones repeated
    /// from the last, unless `policy_wrong_length`.
    pub policy: Option<Vec<Option<u64>>>,
    pub policy_wrong_length: bool,
    /// (turns, mode index, compact_length)
    pub expiration: Option<(u64, u8, u64)>,
    pub message_type: bool,
}

/// One piece of a history.
#[derive(Debug, Clone)]
pub enum Segment {
    System(ContentSpec, bool),
    User(ContentSpec, MetaSpec),
    Assistant(ContentSpec, MetaSpec),
    /// An assistant message with calls (ids from the pool) and a reasoning part or not,
    /// then results: for each call, answered or not; results reversed or not; the first
    /// result repeated or not.
    ToolUse {
        text: ContentSpec,
        reasoning: bool,
        calls: Vec<u8>,
        answered: Vec<bool>,
        reversed: bool,
        duplicate: bool,
        results: Vec<(ContentSpec, MetaSpec)>,
    },
    /// An assistant message with one call, a user message, then the call's result.
    Separated {
        call: u8,
        between: ContentSpec,
        result: ContentSpec,
    },
    /// A tool result whose id no assistant message has called (yet).
    Orphan(ContentSpec),
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[a-z ]{0,24}",
        2 => "[a-zé中😀 ]{0,12}",
        1 => "[a-z ]{40,160}",
    ]
}

fn content() -> impl Strategy<Value = ContentSpec> {
    prop_oneof![
        5 => text().prop_map(ContentSpec::Text),
        3 => prop::collection::vec(
            prop_oneof![3 => text().prop_map(Ok), 1 => (0u8..3).prop_map(Err)],
            0..4
        )
        .prop_map(ContentSpec::Parts),
        1 => Just(ContentSpec::Null),
    ]
}

fn meta() -> impl Strategy<Value = MetaSpec> {
    let policy = prop::collection::vec(prop::option::of(0u64..4), 1..4);
    (
        any::<bool>(),
        prop::option::weighted(0.2, 1u64..6),
        prop::option::weighted(0.3, policy),
        prop::bool::weighted(0.1),
        prop::option::weighted(0.2, (0u64..4, 0u8..3, 0u64..30)),
        prop::bool::weighted(0.2),
    )
        .prop_map(
            |(id, turn_added, policy, policy_wrong_length, expiration, message_type)| MetaSpec {
                id,
                turn_added,
                policy,
                policy_wrong_length,
                expiration,
                message_type,
            },
        )
}

fn segment() -> impl Strategy<Value = Segment> {
    let tool_use = (
        content(),
        prop::bool::weighted(0.3),
        prop::collection::vec(0u8..5, 1..4),
        prop::collection::vec(prop::bool::weighted(0.8), 3),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.1),
        prop::collection::vec((content(), meta()), 3),
    )
        .prop_map(
            |(text, reasoning, calls, answered, reversed, duplicate, results)| Segment::ToolUse {
                text,
                reasoning,
                calls,
                answered,
                reversed,
                duplicate,
                results,
            },
        );
    prop_oneof![
        5 => (content(), meta()).prop_map(|(c, m)| Segment::User(c, m)),
        4 => (content(), meta()).prop_map(|(c, m)| Segment::Assistant(c, m)),
        4 => tool_use,
        1 => (0u8..5, content(), content())
            .prop_map(|(call, between, result)| Segment::Separated { call, between, result }),
        1 => content().prop_map(Segment::Orphan),
        1 => (content(), any::<bool>()).prop_map(|(c, developer)| Segment::System(c, developer)),
    ]
}

/// The segments of one history: leading system messages, then the body.
pub fn segments() -> impl Strategy<Value = (Vec<(ContentSpec, bool)>, Vec<Segment>)> {
    (
        prop::collection::vec((content(), prop::bool::weighted(0.2)), 0..3),
        prop::collection::vec(segment(), 0..18),
    )
}

/// The JSON text of a generated history (see the module docs).
pub fn history() -> impl Strategy<Value = String> {
    segments().prop_map(|(systems, body)| render(&systems, &body).to_string())
}

/// Turns segments into a history (a JSON array of messages).
pub fn render(systems: &[(ContentSpec, bool)], body: &[Segment]) -> Value {
    let mut r = Renderer::default();
    for (content, developer) in systems {
        let message = r.message(if *developer { "developer" } else { "system" }, content, None);
        r.out.push(message);
    }
    for segment in body {
        r.segment(segment);
    }
    Value::Array(r.out)
}

#[derive(Default)]
struct Renderer {
    out: Vec<Value>,
    next_tag: usize,
    next_id: usize,
}

impl Renderer {
    fn tag(&mut self) -> String {
        self.next_tag += 1;
        format!("t{} ", self.next_tag)
    }

    fn content(&mut self, spec: &ContentSpec) -> (Value, usize) {
        match spec {
            ContentSpec::Null => (Value::Null, 0),
            ContentSpec::Text(text) => (Value::String(format!("{}{text}", self.tag())), 1),
            ContentSpec::Parts(parts) => {
                let parts: Vec<Value> = parts
                    .iter()
                    .map(|part| match part {
                        Ok(text) => json!({"type": "text", "text": format!("{}{text}", self.tag())}),
                        Err(kind) => self.opaque(*kind),
                    })
                    .collect();
                let count = parts.len();
                (Value::Array(parts), count)
            }
        }
    }

    fn opaque(&mut self, kind: u8) -> Value {
        let tag = self.tag();
        match kind {
            0 => {
                json!({"type": "image_url", "image_url": {"url": format!("https://example.invalid/{}.png", tag.trim()), "detail": "low"}})
            }
            1 => json!({"type": "input_audio", "input_audio": {"data": tag, "format": "wav"}}),
            _ => json!({"type": "reasoning", "summary": [{"type": "summary_text", "text": tag}], "n": 1.5}),
        }
    }

    fn metadata(&mut self, spec: &MetaSpec, parts: usize) -> Option<Value> {
        let mut meta = Map::new();
        if spec.id {
            self.next_id += 1;
            meta.insert("id".into(), json!(format!("msg-{}", self.next_id)));
        }
        if let Some(turn) = spec.turn_added {
            meta.insert("turn_added".into(), json!(turn));
        }
        if spec.message_type {
            meta.insert("message_type".into(), json!("action-result"));
        }
        if let Some(entries) = &spec.policy {
            let mut entries = entries.clone();
            if !spec.policy_wrong_length {
                let last = *entries.last().unwrap_or(&None);
                entries.resize(parts, last);
            } else if entries.len() == parts {
                entries.push(None);
            }
            meta.insert("retention_policy".into(), json!(entries));
        }
        if let Some((turns, mode, length)) = spec.expiration {
            let mode = ["none", "remove", "compact"][usize::from(mode % 3)];
            meta.insert(
                "expiration".into(),
                json!({"turns": turns, "mode": mode, "compact_mode": "first_n_chars", "compact_length": length}),
            );
        }
        (!meta.is_empty()).then_some(Value::Object(meta))
    }

    fn message(&mut self, role: &str, content: &ContentSpec, meta: Option<&MetaSpec>) -> Value {
        let (content, parts) = self.content(content);
        let mut message = Map::new();
        message.insert("role".into(), json!(role));
        message.insert("content".into(), content);
        if let Some(meta) = meta.and_then(|m| self.metadata(m, parts)) {
            message.insert("metadata".into(), meta);
        }
        Value::Object(message)
    }

    fn tool(&mut self, id: &str, content: &ContentSpec, meta: Option<&MetaSpec>) -> Value {
        let mut message = self.message("tool", content, meta);
        message
            .as_object_mut()
            .unwrap()
            .insert("tool_call_id".into(), json!(id));
        message
    }

    fn call_id(call: u8) -> String {
        format!("call_{call}")
    }

    fn assistant_with_calls(&mut self, text: &ContentSpec, reasoning: bool, calls: &[u8]) -> Value {
        let mut spec = text.clone();
        if reasoning {
            // A reasoning block that came with the calls (docs/plugins.md#role_pair: stays with them).
            let mut parts = match spec {
                ContentSpec::Null => Vec::new(),
                ContentSpec::Text(t) => vec![Ok(t)],
                ContentSpec::Parts(p) => p,
            };
            parts.insert(0, Err(2));
            spec = ContentSpec::Parts(parts);
        }
        let mut message = self.message("assistant", &spec, None);
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                let arguments = if i % 2 == 0 {
                    json!(format!("{{\"q\":\"{}\"}}", self.tag().trim()))
                } else {
                    json!({"q": self.tag().trim()})
                };
                json!({"id": Self::call_id(*call), "type": "function",
                       "function": {"name": format!("tool_{call}"), "arguments": arguments}})
            })
            .collect();
        message
            .as_object_mut()
            .unwrap()
            .insert("tool_calls".into(), Value::Array(calls));
        message
    }

    fn segment(&mut self, segment: &Segment) {
        match segment {
            Segment::System(content, developer) => {
                let message = self.message(if *developer { "developer" } else { "system" }, content, None);
                self.out.push(message);
            }
            Segment::User(content, meta) => {
                let message = self.message("user", content, Some(meta));
                self.out.push(message);
            }
            Segment::Assistant(content, meta) => {
                let message = self.message("assistant", content, Some(meta));
                self.out.push(message);
            }
            Segment::ToolUse {
                text,
                reasoning,
                calls,
                answered,
                reversed,
                duplicate,
                results,
            } => {
                let message = self.assistant_with_calls(text, *reasoning, calls);
                self.out.push(message);
                let mut order: Vec<usize> = (0..calls.len()).filter(|&i| answered[i]).collect();
                if *reversed {
                    order.reverse();
                }
                if *duplicate {
                    if let Some(&first) = order.first() {
                        order.push(first);
                    }
                }
                for i in order {
                    let (content, meta) = &results[i % results.len()];
                    let message = self.tool(&Self::call_id(calls[i]), content, Some(meta));
                    self.out.push(message);
                }
            }
            Segment::Separated {
                call,
                between,
                result,
            } => {
                let message = self.assistant_with_calls(&ContentSpec::Null, false, &[*call]);
                self.out.push(message);
                let message = self.message("user", between, None);
                self.out.push(message);
                let message = self.tool(&Self::call_id(*call), result, None);
                self.out.push(message);
            }
            Segment::Orphan(content) => {
                // An id outside the pool: it answers no call.
                let message = self.tool("call_orphan", content, None);
                self.out.push(message);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    /// The generator's output is always valid input, and over a few hundred cases it
    /// produces each kind of fault and shape the module docs promise.
    #[test]
    fn histories_are_valid_input_and_varied() {
        // Seeded: the coverage claim must not depend on luck.
        let mut runner = TestRunner::deterministic();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..300 {
            let text = history().new_tree(&mut runner).unwrap().current();
            let history = history_wire::chat::history_from_str(&text)
                .unwrap_or_else(|e| panic!("generated bad input ({e:?}): {text}"));
            let faults = plugin_api::structure::Faults::of(&history);
            if !faults.orphan_results.is_empty() {
                seen.insert("orphan");
            }
            if !faults.unanswered_calls.is_empty() {
                seen.insert("unanswered");
            }
            if faults.non_user_start.is_some() {
                seen.insert("non-user start");
            }
            let value: Value = serde_json::from_str(&text).unwrap();
            for pair in value.as_array().unwrap().windows(2) {
                if pair[0]["role"] == pair[1]["role"] && pair[0]["role"] == "user" {
                    seen.insert("user run");
                }
            }
            for (key, needle) in [
                ("retention_policy", "\"retention_policy\""),
                ("expiration", "\"expiration\""),
                ("opaque", "\"reasoning\""),
                ("null content", "\"content\":null"),
                ("developer", "\"developer\""),
            ] {
                if text.contains(needle) {
                    seen.insert(key);
                }
            }
        }
        assert_eq!(
            seen.len(),
            9,
            "the generator missed some shapes, saw only {seen:?}"
        );
    }
}
