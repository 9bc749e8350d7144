//! What a turn adds besides its messages: its `context` items (docs/http-api.md), shown
//! in what is sent only or saved with the newest user message, and a session's
//! expiration override.

use plugin_api::{
    CompactMode, Content, ExpirationMode, ExpirationOverride, Message, Part, RArc, ROption, RVec, Role,
};
use serde_json::Value;

use crate::error::SessionError;

/// One `context` item of a turn (docs/http-api.md): text added to the turn's newest user
/// message, in what is sent only (`display`) or stored too (`save`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextItem {
    pub text: String,
    /// `None`: display only; `Some(None)`: saved and kept; `Some(Some(n))`: saved with
    /// retention policy `n`.
    pub save: Option<Option<u64>>,
}

impl ContextItem {
    /// Parses a turn's `context` list; errors name the item and member.
    pub fn parse_list(value: &Value) -> Result<Vec<ContextItem>, SessionError> {
        let Value::Array(items) = value else {
            return Err(SessionError::bad_input(
                "context: expected an array of {text, display, save}",
            ));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let bad = |what: String| SessionError::bad_input(format!("context {i}: {what}"));
                let Value::Object(item) = item else {
                    return Err(bad("expected an object {text, display, save}".into()));
                };
                let mut text = None;
                let mut display = false;
                let mut save = None;
                for (key, value) in item {
                    match (key.as_str(), value) {
                        ("text", Value::String(s)) => text = Some(s.clone()),
                        ("display", Value::Bool(b)) => display = *b,
                        ("save", Value::Bool(true)) => save = Some(None),
                        ("save", Value::Bool(false)) | ("save", Value::Null) => save = None,
                        ("save", Value::Number(n)) if n.as_u64().is_some() => save = Some(n.as_u64()),
                        ("text" | "display" | "save", other) => {
                            return Err(bad(format!("{key}: unexpected value {other}")))
                        }
                        (other, _) => {
                            return Err(bad(format!(
                                "unknown member \"{other}\" (expected text, display, save)"
                            )))
                        }
                    }
                }
                let text = text.ok_or_else(|| bad("missing \"text\"".into()))?;
                if !display && save.is_none() {
                    return Err(bad("neither display nor save: the item would go nowhere".into()));
                }
                Ok(ContextItem { text, save })
            })
            .collect()
    }
}

/// Adds the `save` items as text parts to the stored message; with any, every part gets
/// a retention policy (the original parts `null`).
pub(super) fn add_saved_context(message: &mut Message, items: &[ContextItem]) {
    let saved: Vec<&ContextItem> = items.iter().filter(|i| i.save.is_some()).collect();
    if saved.is_empty() {
        return;
    }
    let mut parts: Vec<Part> = message.content.to_parts().into_iter().collect();
    let original = parts.len();
    let mut policy: Vec<ROption<u64>> = match message
        .meta()
        .and_then(|m| m.retention_policy.as_ref().into_option())
    {
        Some(p) if p.len() == original => p.iter().cloned().collect(),
        _ => vec![ROption::RNone; original],
    };
    for item in saved {
        parts.push(Part::text(item.text.as_str()));
        policy.push(item.save.flatten().into());
    }
    message.content = Content::Parts(parts.into_iter().collect());
    message.meta_mut().retention_policy = ROption::RSome(policy.into_iter().collect::<RVec<_>>());
}

/// Adds the `display` items as text parts to the message `origin` of the sent history.
pub(super) fn add_display_context(sent: &mut [RArc<Message>], origin: u64, items: &[ContextItem]) {
    let shown: Vec<&ContextItem> = items.iter().filter(|i| i.save.is_none()).collect();
    if shown.is_empty() {
        return;
    }
    let Some(message) = sent
        .iter_mut()
        .rev()
        .find(|m| m.origin() == origin && m.role == Role::User)
    else {
        return;
    };
    let mut copy = (**message).clone();
    let mut parts: Vec<Part> = copy.content.to_parts().into_iter().collect();
    let had_policy = copy
        .meta()
        .and_then(|m| m.retention_policy.as_ref().into_option())
        .is_some_and(|p| p.len() == parts.len());
    for item in &shown {
        parts.push(Part::text(item.text.as_str()));
    }
    if had_policy {
        let meta = copy.meta_mut();
        if let ROption::RSome(policy) = &mut meta.retention_policy {
            for _ in &shown {
                policy.push(ROption::RNone);
            }
        }
    }
    copy.content = Content::Parts(parts.into_iter().collect());
    *message = RArc::new(copy);
}

/// A session's expiration override from JSON: the keys of `[plugin.retention.override]`
/// (docs/plugins.md).
pub fn parse_override(value: &Value) -> Result<ExpirationOverride, SessionError> {
    let bad = |what: String| SessionError::bad_input(format!("expiration_override: {what}"));
    let Value::Object(object) = value else {
        return Err(bad("expected an object".into()));
    };
    let mut o = ExpirationOverride::default();
    for (key, value) in object {
        match key.as_str() {
            "turns" => {
                o.turns = ROption::RSome(
                    value
                        .as_u64()
                        .ok_or_else(|| bad("turns: expected an integer ≥ 0".into()))?,
                )
            }
            "compact_length" => {
                o.compact_length = ROption::RSome(
                    value
                        .as_u64()
                        .ok_or_else(|| bad("compact_length: expected an integer ≥ 0".into()))?,
                )
            }
            "mode" => {
                o.mode = ROption::RSome(
                    value
                        .as_str()
                        .and_then(ExpirationMode::parse)
                        .ok_or_else(|| bad("mode: expected none, remove or compact".into()))?,
                )
            }
            "compact_mode" => {
                o.compact_mode = ROption::RSome(
                    value
                        .as_str()
                        .and_then(CompactMode::parse)
                        .ok_or_else(|| bad("compact_mode: expected first_n_chars or ai_summary".into()))?,
                )
            }
            "disable_expiration" => {
                o.disable_expiration = value
                    .as_bool()
                    .ok_or_else(|| bad("disable_expiration: expected a boolean".into()))?
            }
            other => return Err(bad(format!("unknown key \"{other}\""))),
        }
    }
    Ok(o)
}
