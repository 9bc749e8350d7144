use plugin_api::{Content, Message, RArc, Role};
use serde_json::Value;

use super::{parse, write};

const SYSTEM: &str = r#"[{"type":"text","text":"You are terse.","cache_control":{"type":"ephemeral"}}]"#;

fn conversation() -> Vec<&'static str> {
    vec![
        r#"{"role":"user","content":"list the files"}"#,
        r#"{"role": "assistant", "content": [{"type":"thinking","thinking":"ls","signature":"sig1"},{"type":"text","text":"Looking.","citations":null},{"type":"tool_use","id":"tu1","name":"ls","input":{"path":"."}}]}"#,
        r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu1","content":"a.rs\nb.rs","is_error":false,"cache_control":{"type":"ephemeral"}},{"type":"text","text":"and?"}]}"#,
        r#"{"role":"assistant","content":[{"type":"tool_use","id":"tu2","name":"cat","input":{"f":"a.rs"}},{"type":"text","text":"between"},{"type":"tool_use","id":"tu3","name":"cat","input":{"f":"b.rs"}}]}"#,
        r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu2","content":[{"type":"text","text":"fn a"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBOR"}}]},{"type":"tool_result","tool_use_id":"tu3","content":"fn b","is_error":true}]}"#,
        r#"{"role":"assistant","content":"Done."}"#,
        r#"{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBOR"}},{"type":"text","text":"what is this?"}]}"#,
    ]
}

#[test]
fn an_unchanged_history_is_written_byte_for_byte() {
    let messages = conversation();
    let parsed = parse(Some(SYSTEM), &messages).unwrap();
    let roles: Vec<Role> = parsed.messages.iter().map(|m| m.role).collect();
    use Role::*;
    assert_eq!(
        roles,
        [System, User, Assistant, Tool, User, Assistant, Tool, Tool, Assistant, User]
    );
    assert_eq!(
        parsed.messages[2].tool_calls[0].arguments.as_str(),
        r#"{"path":"."}"#
    );
    assert_eq!(parsed.cache_breakpoints, 2);
    let written = write(&parsed, &parsed.messages);
    assert_eq!(written.system.as_deref(), Some(SYSTEM));
    assert_eq!(written.messages, format!("[{}]", messages.join(",")));
    assert_eq!(written.cache_breakpoints, 2);
}

#[test]
fn a_changed_message_keeps_its_block_order_and_a_placeholder_stays_a_tool_result() {
    let messages = conversation();
    let mut parsed = parse(None, &messages).unwrap();
    for (i, message) in parsed.messages.iter_mut().enumerate() {
        RArc::get_mut(message).unwrap().set_origin(i as u64 + 1);
    }
    parsed.note_origins();
    let mut output = parsed.messages.clone();
    // The chain shortens tu3's result, keeping its id and is_error.
    let mut placeholder: Message = (*output[6]).clone();
    placeholder.content = Content::Text("[Omitted]".into());
    output[6] = RArc::new(placeholder);
    // and changes the text between tu2 and tu3.
    let mut assistant: Message = (*output[4]).clone();
    if let Content::Parts(parts) = &mut assistant.content {
        parts[0] = plugin_api::Part::text("changed");
    }
    output[4] = RArc::new(assistant);
    let written = write(&parsed, &output);
    let expected = [
        messages[0],
        messages[1],
        messages[2],
        r#"{"role":"assistant","content":[{"type":"tool_use","id":"tu2","name":"cat","input":{"f":"a.rs"}},{"type":"text","text":"changed"},{"type":"tool_use","id":"tu3","name":"cat","input":{"f":"b.rs"}}]}"#,
        r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu2","content":[{"type":"text","text":"fn a"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBOR"}}]},{"type":"tool_result","tool_use_id":"tu3","content":"[Omitted]","is_error":true}]}"#,
        messages[5],
        messages[6],
    ];
    assert_eq!(written.messages, format!("[{}]", expected.join(",")));
    assert_eq!(written.system, None);
}

#[test]
fn a_cut_keeps_roles_alternating_and_counts_the_lost_cache_marker() {
    let messages = conversation();
    let parsed = parse(Some(SYSTEM), &messages).unwrap();
    // The chain drops the first tool exchange (assistant tu1 and its result + "and?").
    let output: Vec<_> = parsed
        .messages
        .iter()
        .enumerate()
        .filter(|(i, _)| ![2, 3, 4].contains(i))
        .map(|(_, m)| m.clone())
        .collect();
    let written = write(&parsed, &output);
    let sent: Value = serde_json::from_str(&written.messages).unwrap();
    let roles: Vec<&str> = sent
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    // "list the files" and the tu2 call are not merged: user, assistant alternate.
    assert_eq!(roles, ["user", "assistant", "user", "assistant", "user"]);
    assert_eq!(written.cache_breakpoints, 1);
    assert!(written
        .messages
        .starts_with(&format!("[{},{}", messages[0], messages[3])));
}

#[test]
fn adjacent_user_messages_left_by_a_cut_are_merged_tool_results_first() {
    let messages = vec![
        r#"{"role":"user","content":"one"}"#,
        r#"{"role":"assistant","content":"two"}"#,
        r#"{"role":"user","content":"three"}"#,
    ];
    let parsed = parse(None, &messages).unwrap();
    let output = vec![parsed.messages[0].clone(), parsed.messages[2].clone()];
    let written = write(&parsed, &output);
    assert_eq!(
        written.messages,
        r#"[{"role":"user","content":[{"type":"text","text":"one"},{"type":"text","text":"three"}]}]"#
    );
}

#[test]
fn bad_input_is_named_with_its_place() {
    let err = |system: Option<&str>, messages: &[&str]| parse(system, messages).err().unwrap().0;
    assert_eq!(
        err(None, &[r#"{"role":"tool","content":"x"}"#]),
        "messages[0]: role must be \"user\" or \"assistant\", found \"tool\""
    );
    assert_eq!(
        err(
            None,
            &[r#"{"role":"assistant","content":[{"type":"tool_use","name":"x","input":{}}]}"#]
        ),
        "messages[0]: content[0]: tool_use block without id"
    );
    assert_eq!(
        err(
            None,
            &["{}", r#"{"role":"user","content":[{"type":"tool_result"}]}"#]
        ),
        "messages[0]: missing role"
    );
    assert_eq!(
        err(None, &[r#"{"role":"user","content":[{"type":"tool_result"}]}"#]),
        "messages[0]: content[0]: tool_result block without tool_use_id"
    );
    assert!(err(Some("5"), &[]).starts_with("system: expected a string"));
    assert!(err(None, &[r#"{"role":"user","content":7}"#]).contains("content must be"));
}

#[test]
fn a_changed_message_keeps_its_unchanged_blocks_as_their_bytes() {
    let messages = vec![
        r#"{"role":"user","content":"go"}"#,
        r#"{"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}, {"type": "text", "text": "old"}, {"type": "tool_use", "id": "a", "name": "f", "input": {"x": 1}}]}"#,
        r#"{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "r"}]}"#,
    ];
    let parsed = parse(None, &messages).unwrap();
    let mut output = parsed.messages.clone();
    let mut changed: Message = (*output[1]).clone();
    if let Content::Parts(parts) = &mut changed.content {
        parts[1] = plugin_api::Part::text("new");
    }
    output[1] = RArc::new(changed);
    let written = write(&parse(None, &messages).unwrap(), &output);
    assert_eq!(
        written.messages,
        format!(
            "[{},{},{}]",
            messages[0],
            r#"{"role":"assistant","content":[{"type": "thinking", "thinking": "t", "signature": "s"},{"type":"text","text":"new"},{"type": "tool_use", "id": "a", "name": "f", "input": {"x": 1}}]}"#,
            messages[2]
        )
    );
}

/// A memory as the proxy keeps one (server/src/resent.rs), unbounded.
#[derive(Default)]
struct Remembering(std::cell::RefCell<Vec<(String, std::sync::Arc<super::Read>)>>);

impl super::Memory for Remembering {
    fn message(&self, raw: &str) -> Option<std::sync::Arc<super::Read>> {
        self.0
            .borrow()
            .iter()
            .find(|(seen, _)| seen == raw)
            .map(|(_, read)| read.clone())
    }
}

#[test]
fn a_resent_message_is_the_same_read_and_a_changed_one_keeps_its_blocks_bytes() {
    let memory = Remembering::default();
    let messages = vec![
        r#"{"role":"user","content":"go"}"#,
        r#"{"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}, {"type": "text", "text": "old"}, {"type": "tool_use", "id": "a", "name": "f", "input": {"x": 1}}]}"#,
        r#"{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "r"}]}"#,
    ];
    let first = super::parse_with(None, &messages, &memory).unwrap();
    for (raw, read) in first.reads() {
        memory
            .0
            .borrow_mut()
            .push((raw.to_string(), std::sync::Arc::new(read)));
    }
    assert_eq!(memory.0.borrow().len(), 3);
    // Resent, with one more message: the first three are the same host messages.
    let mut more = messages.clone();
    more.push(r#"{"role":"assistant","content":"done"}"#);
    let mut again = super::parse_with(None, &more, &memory).unwrap();
    assert_eq!(again.reads().count(), 1);
    for (a, b) in first.messages.iter().zip(&again.messages) {
        assert!(std::ptr::eq::<Message>(&**a, &**b));
    }
    assert_eq!(again.cache_breakpoints, 0);
    assert_eq!(
        write(&again, &again.messages).messages,
        format!("[{}]", more.join(","))
    );
    // A remembered message changed by the chain keeps its other blocks as their bytes.
    for (i, message) in again.messages.iter_mut().enumerate() {
        RArc::make_mut(message).set_origin(i as u64 + 1);
    }
    again.note_origins();
    let mut output = again.messages.clone();
    let mut changed: Message = (*output[1]).clone();
    if let Content::Parts(parts) = &mut changed.content {
        parts[1] = plugin_api::Part::text("new");
    }
    output[1] = RArc::new(changed);
    let written = write(&again, &output);
    assert!(
        written.messages.contains(r#"[{"type": "thinking", "thinking": "t", "signature": "s"},{"type":"text","text":"new"},{"type": "tool_use", "id": "a", "name": "f", "input": {"x": 1}}]"#),
        "{}",
        written.messages
    );
}
