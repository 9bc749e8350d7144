//! Rewriting the text a message carries, wherever it lives: [`Content::map_text`] and
//! [`Message::map_text`]. docs/abi.md#where-text-lives lists the places; a plugin that
//! rewrites text (a redactor) uses these so no place is forgotten.
//!
//! `f` is called on each text and answers `Cow::Borrowed` to leave it as it is, or
//! `Cow::Owned` with the new text. Write it inline (`message.map_text(|text| …)`) or as a
//! function `fn redact<'a>(text: &'a str) -> Cow<'a, str>`: a closure first stored in a
//! `let` does not get the lifetime that ties its answer to its argument. Identifiers are never passed to it (the role, call ids,
//! `tool_call_id`, function and message names, `metadata.id`, `timestamp`,
//! `message_type`, `summary_of`): they are structure, not text, and changing them would
//! change what answers what.

use std::borrow::Cow;

use abi_stable::std_types::{ROption, RString, RVec};
use serde_json::Value;

use crate::message::{Content, Member, Message, Part, ToolCall};

/// The text function, as the helpers pass it on.
type TextFn<'f> = dyn for<'a> FnMut(&'a str) -> Cow<'a, str> + 'f;

/// `f` on `text`: the new text, or `None` when it is unchanged.
fn changed(text: &str, f: &mut TextFn<'_>) -> Option<String> {
    match f(text) {
        Cow::Owned(new) if new != text => Some(new),
        _ => None,
    }
}

/// `f` on every string value (not the keys) of a JSON value; whether any changed.
fn map_value(value: &mut Value, f: &mut TextFn<'_>) -> bool {
    match value {
        Value::String(text) => match changed(text, f) {
            Some(new) => {
                *text = new;
                true
            }
            None => false,
        },
        Value::Array(items) => items.iter_mut().fold(false, |any, item| map_value(item, f) | any),
        Value::Object(members) => members
            .values_mut()
            .fold(false, |any, item| map_value(item, f) | any),
        _ => false,
    }
}

/// `f` on every string value of the JSON text `json`: the new JSON text, or `None` when
/// nothing changed (or the text is not JSON, which a parsed message never carries).
fn map_json(json: &str, f: &mut TextFn<'_>) -> Option<String> {
    let mut value: Value = serde_json::from_str(json).ok()?;
    map_value(&mut value, f).then(|| value.to_string())
}

/// `f` on the values of kept members (except those named in `skip`); `None` when none changed.
fn map_members(members: &[Member], skip: &[&str], f: &mut TextFn<'_>) -> Option<RVec<Member>> {
    let mut any = false;
    let mapped = members
        .iter()
        .map(|member| {
            if skip.contains(&member.key.as_str()) {
                return member.clone();
            }
            match map_json(&member.json, f) {
                Some(json) => {
                    any = true;
                    Member {
                        key: member.key.clone(),
                        json: json.into(),
                    }
                }
                None => member.clone(),
            }
        })
        .collect();
    any.then_some(mapped)
}

fn map_part(part: &Part, f: &mut TextFn<'_>) -> Option<Part> {
    match part {
        Part::Text { text, extra } => {
            let new_text = changed(text, f);
            let new_extra = map_members(extra, &[], f);
            if new_text.is_none() && new_extra.is_none() {
                return None;
            }
            Some(Part::Text {
                text: new_text.map_or_else(|| text.clone(), RString::from),
                extra: new_extra.unwrap_or_else(|| extra.clone()),
            })
        }
        Part::Opaque { json } => map_json(json, f).map(|json| Part::Opaque { json: json.into() }),
    }
}

fn map_content(content: &Content, f: &mut TextFn<'_>) -> Option<Content> {
    match content {
        Content::Null => None,
        Content::Text(text) => changed(text, f).map(|new| Content::Text(new.into())),
        Content::Parts(parts) => {
            let mapped: Vec<Option<Part>> = parts.iter().map(|part| map_part(part, f)).collect();
            if mapped.iter().all(Option::is_none) {
                return None;
            }
            Some(Content::Parts(
                parts
                    .iter()
                    .zip(mapped)
                    .map(|(part, new)| new.unwrap_or_else(|| part.clone()))
                    .collect(),
            ))
        }
    }
}

/// A call's arguments (and, for a `function` kept verbatim, the arguments inside it, the
/// measured copy kept in step so the host's output check sees the call it is written as).
fn map_call(call: &ToolCall, f: &mut TextFn<'_>) -> Option<ToolCall> {
    let mut copy = call.clone();
    let mut any = false;
    if call.has_function {
        let arguments = if call.arguments_is_json {
            map_json(&call.arguments, f)
        } else {
            changed(&call.arguments, f)
        };
        if let Some(arguments) = arguments {
            copy.arguments = arguments.into();
            any = true;
        }
        if let Some(extra) = map_members(&call.function_extra, &[], f) {
            copy.function_extra = extra;
            any = true;
        }
        return any.then_some(copy);
    }
    for member in copy.extra.iter_mut().filter(|m| m.key.as_str() == "function") {
        let Ok(mut function) = serde_json::from_str::<Value>(&member.json) else {
            continue;
        };
        let Some(arguments) = function.get_mut("arguments") else {
            continue;
        };
        if map_value(arguments, f) {
            member.json = function.to_string().into();
            (copy.name, copy.arguments, copy.arguments_is_json) =
                crate::faithful::measured_function(&function);
            any = true;
        }
    }
    any.then_some(copy)
}

impl Content {
    /// This content with `f` applied to each of its texts: a string content, each text
    /// part's text and the string values of its other members, and the string values
    /// inside each opaque part (a reasoning block, a file's text). `None` when `f` changed
    /// nothing (it answered `Cow::Borrowed`, or the same text).
    ///
    /// ```
    /// use std::borrow::Cow;
    /// use plugin_api::Content;
    /// let content = Content::Text("key sk-123".into());
    /// let redacted = content.map_text(|text| match text.contains("sk-") {
    ///     true => Cow::Owned(text.replace("sk-123", "[redacted]")),
    ///     false => Cow::Borrowed(text),
    /// });
    /// assert_eq!(redacted, Some(Content::Text("key [redacted]".into())));
    /// ```
    pub fn map_text<F>(&self, mut f: F) -> Option<Content>
    where
        F: FnMut(&str) -> Cow<'_, str>,
    {
        map_content(self, &mut f)
    }
}

impl Message {
    /// A changed copy of this message with `f` applied to every text it carries (docs/abi.md#where-text-lives):
    /// its content ([`Content::map_text`]), each tool call's arguments, the members the
    /// types do not model (a `reasoning_content`, a `refusal`, …), the kept original
    /// (`metadata.original_content`) and unmodelled metadata members. `None` when `f`
    /// changed nothing, so the message can be passed through shared.
    ///
    /// The copy keeps the message's identity and turn (a changed copy, not an invented
    /// message); report it with an [`EventKind::MessageChanged`](crate::EventKind) event.
    pub fn map_text<F>(&self, mut f: F) -> Option<Message>
    where
        F: FnMut(&str) -> Cow<'_, str>,
    {
        let f: &mut TextFn<'_> = &mut f;
        let content = map_content(&self.content, f);
        let calls: Vec<Option<ToolCall>> = self.tool_calls.iter().map(|call| map_call(call, f)).collect();
        let extra = map_members(&self.extra, &[], f);
        let meta = self.meta();
        let original = meta
            .and_then(|meta| meta.original_content.as_ref().into_option())
            .and_then(|original| map_content(original, f));
        let meta_extra = meta.and_then(|meta| map_members(&meta.extra, &["summary_of"], f));
        if content.is_none()
            && calls.iter().all(Option::is_none)
            && extra.is_none()
            && original.is_none()
            && meta_extra.is_none()
        {
            return None;
        }
        let mut copy = self.clone();
        if let Some(content) = content {
            copy.content = content;
        }
        for (slot, call) in copy.tool_calls.iter_mut().zip(calls) {
            if let Some(call) = call {
                *slot = call;
            }
        }
        if let Some(extra) = extra {
            copy.extra = extra;
        }
        if let Some(original) = original {
            copy.meta_mut().original_content = ROption::RSome(original);
        }
        if let Some(extra) = meta_extra {
            copy.meta_mut().extra = extra;
        }
        Some(copy)
    }
}
