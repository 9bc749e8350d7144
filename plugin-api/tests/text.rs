//! Every place a message carries text (`plugin_api::text`), on messages parsed from JSON.

use std::borrow::Cow;

use plugin_api::{Content, Message};
use plugin_testing as testing;

fn redact(text: &str) -> Cow<'_, str> {
    if text.contains("SECRET") {
        Cow::Owned(text.replace("SECRET", "[redacted]"))
    } else {
        Cow::Borrowed(text)
    }
}

fn one(json: &str) -> Message {
    (*testing::history(&format!("[{json}]"))[0]).clone()
}

#[test]
fn content_reaches_strings_text_parts_and_opaque_parts() {
    assert_eq!(Content::Null.map_text(redact), None);
    assert_eq!(Content::Text("clean".into()).map_text(redact), None);
    let parts = one(
        r#"{"role":"user","content":[{"type":"text","text":"a SECRET","note":"SECRET too"},
            {"type":"text","text":"clean"},
            {"type":"thinking","thinking":"the SECRET is","signature":"s"}]}"#,
    );
    let mapped = parts.content.map_text(redact).unwrap();
    let text = history_wire::chat::message_to_string(&Message::new(plugin_api::Role::User, mapped));
    assert!(!text.contains("SECRET"), "{text}");
    assert_eq!(text.matches("[redacted]").count(), 3, "{text}");
    assert!(text.contains(r#"{"type":"text","text":"clean"}"#), "{text}");
}

#[test]
fn an_unchanged_message_is_none_and_identifiers_are_never_passed() {
    let message = one(
        r#"{"role":"assistant","content":"ok","name":"SECRET","tool_calls":[{"id":"SECRET","type":"function","function":{"name":"SECRET","arguments":"{}"}}],"metadata":{"id":"SECRET","summary_of":["SECRET"]}}"#,
    );
    assert!(message.map_text(redact).is_none());
    let mut seen = Vec::new();
    message.map_text(|text| {
        seen.push(text.to_string());
        Cow::Borrowed(text)
    });
    assert!(!seen.iter().any(|t| t.contains("SECRET")), "{seen:?}");
}

#[test]
fn a_message_reaches_arguments_kept_originals_and_unmodelled_members() {
    let message = one(
        r#"{"role":"assistant","content":"use SECRET","reasoning_content":"SECRET again",
            "tool_calls":[{"id":"c1","type":"function","function":{"name":"login","arguments":"{\"key\":\"SECRET\"}"}},
                          {"id":"c2","type":"function","function":{"name":"set","arguments":{"key":"SECRET","n":1.5}}},
                          {"id":"c3","function":{"name":null,"arguments":{"key":"SECRET"}}}],
            "metadata":{"original_content":[{"type":"text","text":"was SECRET"}],"label":"SECRET"}}"#,
    );
    let changed = message.map_text(redact).expect("changed");
    assert_eq!(
        changed.origin(),
        message.origin(),
        "a changed copy keeps its identity"
    );
    let text = history_wire::chat::message_to_string(&changed);
    assert!(!text.contains("SECRET"), "{text}");
    assert_eq!(text.matches("[redacted]").count(), 7, "{text}");
    plugin_api::faithful::check_faithful(&changed).unwrap();
    // What the host reads back is what was written.
    let reparsed = one(&text);
    assert_eq!(reparsed, changed);
    assert_eq!(
        changed.tool_calls[2].arguments.as_str(),
        r#"{"key":"[redacted]"}"#
    );
}
