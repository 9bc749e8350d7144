//! Generated histories for property tests.
//!
//! A minimal version so the `tool_result_filter` and `retention` property tests compile
//! on this branch; the shared, fuller generator replaces it at merge with the same
//! signature: [`history`] yields the JSON text of a history with system messages,
//! multi-call units, orphan results, same-role runs, string / parts / null content,
//! opaque parts, and metadata (id, turn_added, retention_policy, expiration, lifecycle
//! flags).

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

fn text() -> BoxedStrategy<String> {
    "[a-zé😀 ]{0,40}".boxed()
}

fn part() -> BoxedStrategy<Value> {
    prop_oneof![
        3 => text().prop_map(|t| json!({"type": "text", "text": t})),
        1 => text().prop_map(|u| json!({"type": "image_url", "image_url": {"url": u}})),
    ]
    .boxed()
}

fn content() -> BoxedStrategy<Value> {
    prop_oneof![
        4 => text().prop_map(Value::String),
        3 => vec(part(), 0..4).prop_map(Value::Array),
        1 => Just(Value::Null),
    ]
    .boxed()
}

fn parts_of(content: &Value) -> usize {
    match content {
        Value::String(_) => 1,
        Value::Array(parts) => parts.len(),
        _ => 0,
    }
}

fn expiration() -> BoxedStrategy<Value> {
    (
        option::of(0u64..4),
        option::of(prop_oneof![Just("none"), Just("remove"), Just("compact")]),
        option::of(prop_oneof![Just("first_n_chars"), Just("ai_summary")]),
        option::of(0u64..30),
    )
        .prop_map(|(turns, mode, compact_mode, compact_length)| {
            let mut e = Map::new();
            if let Some(t) = turns {
                e.insert("turns".into(), json!(t));
            }
            if let Some(m) = mode {
                e.insert("mode".into(), json!(m));
            }
            if let Some(m) = compact_mode {
                e.insert("compact_mode".into(), json!(m));
            }
            if let Some(l) = compact_length {
                e.insert("compact_length".into(), json!(l));
            }
            Value::Object(e)
        })
        .boxed()
}

/// Metadata for a message with `parts` content parts (a policy mostly of that length).
fn metadata(parts: usize) -> BoxedStrategy<Option<Value>> {
    let policy = prop_oneof![
        6 => vec(option::of(0u64..4), parts..=parts),
        1 => vec(option::of(0u64..4), 0..4),
    ];
    option::of((
        option::of(0u32..1000),
        option::of(1u64..7),
        option::of(policy),
        option::of(expiration()),
        prop_oneof![8 => Just(None), 1 => Just(Some("omitted")), 1 => Just(Some("was_compacted"))],
    ))
    .prop_map(|meta| {
        meta.map(|(id, turn_added, policy, expiration, flag)| {
            let mut m = Map::new();
            if let Some(id) = id {
                m.insert("id".into(), json!(format!("m{id}")));
            }
            if let Some(t) = turn_added {
                m.insert("turn_added".into(), json!(t));
            }
            if let Some(p) = policy {
                m.insert("retention_policy".into(), json!(p));
            }
            if let Some(e) = expiration {
                m.insert("expiration".into(), e);
            }
            if let Some(flag) = flag {
                m.insert(flag.into(), json!(true));
                m.insert("can_expand".into(), json!(true));
                m.insert("original_content".into(), json!("the original"));
            }
            Value::Object(m)
        })
    })
    .boxed()
}

/// A message of `role` with generated content and metadata.
fn message(role: &'static str, extra: Value) -> BoxedStrategy<Value> {
    content()
        .prop_flat_map(move |content| {
            let extra = extra.clone();
            metadata(parts_of(&content)).prop_map(move |meta| {
                let mut m = Map::new();
                m.insert("role".into(), json!(role));
                m.insert("content".into(), content.clone());
                if let Value::Object(extra) = &extra {
                    for (k, v) in extra {
                        m.insert(k.clone(), v.clone());
                    }
                }
                if let Some(meta) = meta {
                    m.insert("metadata".into(), meta);
                }
                Value::Object(m)
            })
        })
        .boxed()
}

const TOOLS: [&str; 3] = ["search", "read_file", "delete"];

/// An assistant message with 1–3 calls and, for most calls, a result right after.
fn unit(tag: u32) -> BoxedStrategy<Vec<Value>> {
    (
        vec((0..TOOLS.len(), any::<bool>(), any::<bool>()), 1..4),
        option::of(text()),
    )
        .prop_flat_map(move |(calls, assistant_text)| {
            let tool_calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(i, (tool, _, _))| {
                    json!({"id": format!("call_{tag}_{i}"), "type": "function",
                       "function": {"name": TOOLS[*tool], "arguments": format!("{{\"n\":{i}}}")}})
                })
                .collect();
            let assistant = json!({"role": "assistant", "content": assistant_text, "tool_calls": tool_calls});
            let results: Vec<_> = calls
                .iter()
                .enumerate()
                .filter(|(_, (_, answered, _))| *answered || calls.len() == 1)
                .map(|(i, (tool, _, named))| {
                    let mut extra = json!({"tool_call_id": format!("call_{tag}_{i}")});
                    if *named {
                        extra["name"] = json!(TOOLS[*tool]);
                    }
                    message("tool", extra)
                })
                .collect();
            results.prop_map(move |results| {
                let mut unit = vec![assistant.clone()];
                unit.extend(results);
                unit
            })
        })
        .boxed()
}

fn item(tag: u32) -> BoxedStrategy<Vec<Value>> {
    prop_oneof![
        4 => message("user", json!({})).prop_map(|m| vec![m]),
        2 => message("assistant", json!({})).prop_map(|m| vec![m]),
        3 => unit(tag),
        1 => message("tool", json!({"tool_call_id": format!("orphan_{tag}"), "name": "search"})).prop_map(|m| vec![m]),
        1 => message("system", json!({})).prop_map(|m| vec![m]),
    ]
    .boxed()
}

/// The JSON text of a generated history (a JSON array of messages).
pub fn history() -> impl Strategy<Value = String> {
    (
        vec(message("system", json!({})), 0..2),
        vec(any::<u32>(), 0..14).prop_flat_map(|tags| {
            tags.into_iter()
                .enumerate()
                .map(|(i, tag)| item(tag.wrapping_mul(31).wrapping_add(i as u32)))
                .collect::<Vec<_>>()
        }),
    )
        .prop_map(|(system, items)| {
            let mut messages = system;
            messages.extend(items.into_iter().flatten());
            Value::Array(messages).to_string()
        })
}
