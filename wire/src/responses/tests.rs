use plugin_api::{Content, Message, RArc, ROption, Role};
use serde_json::value::RawValue;
use serde_json::Value;

use super::parse;

fn raw(text: &str) -> &RawValue {
    serde_json::from_str(text).unwrap()
}

/// A Codex-like input: spacing and member order as a client wrote them.
const INPUT: &str = r#"[
  {"type":"message","role":"user","content":[{"type":"input_text","text":"fix the bug"},{"type":"input_image","image_url":"data:image/png;base64,iVBORw0KGgo=","detail":"low"}]},
  {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"look first"}],"encrypted_content":"gAAAA-one"},
  {"type":"function_call","id":"fc_1","call_id":"call_1","name":"read_file","arguments":"{\"path\": \"a.rs\"}","status":"completed"},
  {"type":"function_call_output","call_id":"call_1","output":"fn main() {}"},
  {"type":"reasoning","id":"rs_2","summary":[],"encrypted_content":"gAAAA-two"},
  {"type":"custom_tool_call","id":"ctc_1","call_id":"call_2","name":"apply_patch","input":"*** Begin Patch"},
  {"type":"custom_tool_call_output","call_id":"call_2","output":"done"},
  {"type":"web_search_call","id":"ws_1","status":"completed","action":{"type":"search","query":"rust"}},
  {"type":"message","role":"assistant","id":"msg_1","content":[{"type":"output_text","text":"Fixed.","annotations":[]}],"status":"completed"},
  {"role":"developer","content":"be brief"},
  {"type":"item_reference","id":"x_1"},
  {"type":"message","role":"user","content":"thanks"}
]"#;

#[test]
fn an_unchanged_input_is_written_back_byte_for_byte() {
    let instructions = raw(r#""You are Codex.""#);
    let parsed = parse(Some(instructions), raw(INPUT)).unwrap();
    let roles: Vec<Role> = parsed.messages.iter().map(|m| m.role).collect();
    use Role::*;
    assert_eq!(
        roles,
        [System, User, Assistant, Tool, Assistant, Tool, Assistant, Developer, Assistant, User]
    );
    // The first run: the reasoning item as an opaque part, the call as a tool call.
    let run = &parsed.messages[2];
    assert_eq!(run.tool_calls.len(), 1);
    assert_eq!(run.tool_calls[0].id.as_str(), "call_1");
    assert_eq!(parsed.messages[3].call_id(), Some("call_1"));
    let written = parsed.write(&parsed.messages);
    assert_eq!(written.instructions.as_deref(), Some(r#""You are Codex.""#));
    // Items as they came, joined by commas (the whitespace between items is not theirs).
    let items: Vec<&RawValue> = serde_json::from_str(INPUT).unwrap();
    let expected = format!(
        "[{}]",
        items.iter().map(|i| i.get()).collect::<Vec<_>>().join(",")
    );
    assert_eq!(written.input, expected);
}

#[test]
fn a_string_input_comes_back_as_that_string() {
    let parsed = parse(None, raw(r#""hello \u00e9""#)).unwrap();
    assert_eq!(parsed.messages.len(), 1);
    let written = parsed.write(&parsed.messages);
    assert_eq!(written.instructions, None);
    assert_eq!(written.input, r#""hello \u00e9""#);
}

fn items(written: &str) -> Vec<Value> {
    serde_json::from_str::<Vec<Value>>(written).unwrap()
}

/// What the API refuses: a call without its output (or the reverse), a reasoning item
/// not immediately followed by a model-side item.
fn valid(items: &[Value]) -> Result<(), String> {
    for (index, item) in items.iter().enumerate() {
        let kind = item["type"].as_str().unwrap_or("message");
        if kind.ends_with("_call") && item.get("call_id").is_some() {
            let paired = items[index + 1..]
                .iter()
                .any(|o| o["call_id"] == item["call_id"] && o["type"] == format!("{kind}_output"));
            if !paired {
                return Err(format!("input[{index}]: {kind} without its output"));
            }
        }
        if kind.ends_with("_call_output") {
            let call = kind.trim_end_matches("_output");
            if !items[..index]
                .iter()
                .any(|c| c["call_id"] == item["call_id"] && c["type"] == call)
            {
                return Err(format!("input[{index}]: output without its call"));
            }
        }
        if kind == "reasoning" {
            let next = items.get(index + 1).ok_or("reasoning at the end")?;
            let next_kind = next["type"].as_str().unwrap_or("message");
            let model_side = match next_kind {
                "message" => next["role"] == "assistant",
                other => !other.ends_with("_call_output"),
            };
            if !model_side {
                return Err(format!("input[{index}]: reasoning not followed by its item"));
            }
        }
    }
    Ok(())
}

#[test]
fn a_trimmed_output_keeps_reasoning_adjacent_and_calls_paired() {
    let parsed = parse(None, raw(INPUT)).unwrap();
    let m = &parsed.messages;
    // Drop the first call with its output (the unit a plugin keeps or drops together).
    let trimmed: Vec<RArc<Message>> = [0, 3, 4, 5, 6, 7, 8].iter().map(|&i| m[i].clone()).collect();
    let written = parsed.write(&trimmed);
    let out = items(&written.input);
    valid(&out).unwrap();
    assert!(
        !written.input.contains("gAAAA-one"),
        "the reasoning went with its call"
    );
    assert!(written.input.contains("gAAAA-two"));
    // Unchanged items kept as their bytes.
    let source: Vec<&RawValue> = serde_json::from_str(INPUT).unwrap();
    for index in [0, 4, 5, 6, 11] {
        assert!(written.input.contains(source[index].get()), "item {index}");
    }

    // The run's content replaced by a placeholder: the call stays, its reasoning goes
    // (nothing model-side follows it any more), the output is a placeholder text.
    let mut run = (*m[3]).clone();
    run.content = Content::Text("[omitted]".into());
    let placeholder = Message::placeholder_result(&m[3], "call_2", "[output omitted]");
    let changed = vec![m[0].clone(), RArc::new(run), RArc::new(placeholder)];
    let written = parsed.write(&changed);
    let out = items(&written.input);
    valid(&out).unwrap();
    assert_eq!(out[1]["role"], "assistant");
    assert_eq!(out[1]["content"][0]["text"], "[omitted]");
    assert!(
        written.input.contains(source[5].get()),
        "the unchanged call as it came"
    );
    assert_eq!(out[3]["type"], "custom_tool_call_output");
    assert_eq!(out[3]["output"], "[output omitted]");
}

#[test]
fn a_changed_message_keeps_its_other_members_and_a_lone_reasoning_item_is_dropped() {
    let parsed = parse(None, raw(INPUT)).unwrap();
    let m = &parsed.messages;
    let mut user = (*m[8]).clone();
    user.content = Content::Text("thanks!".into());
    let mut output = (*m[2]).clone();
    output.content = Content::Text("[cut]".into());
    output.tool_call_id = ROption::RSome("call_1".into());
    // A run whose only call the chain removed: its reasoning must not stay alone.
    let mut run = (*m[1]).clone();
    run.tool_calls = Default::default();
    let written = parsed.write(&[RArc::new(run), RArc::new(output), RArc::new(user)]);
    let out = items(&written.input);
    assert_eq!(out.len(), 2, "{}", written.input);
    assert_eq!(out[0]["type"], "function_call_output");
    assert_eq!(out[0]["output"], "[cut]");
    assert_eq!(
        out[1],
        serde_json::json!({"type":"message","role":"user","content":"thanks!"})
    );
}

#[test]
fn bad_input_is_named_with_where_it_is() {
    for (input, expected) in [
        ("3", "input: expected a string or an array of items"),
        ("[1]", "input[0]: expected an item object"),
        (
            r#"[{"type":"message","role":"robot","content":"x"}]"#,
            "input[0]: unknown message role \"robot\"",
        ),
        (
            r#"[{"type":"message","role":"user"}]"#,
            "input[0]: a message needs a string or array content",
        ),
    ] {
        match parse(None, raw(input)) {
            Err(e) => assert_eq!(e, expected),
            Ok(_) => panic!("{input} was read"),
        }
    }
    assert_eq!(
        parse(Some(raw("[1]")), raw("\"x\"")).err().as_deref(),
        Some("instructions: expected a string")
    );
}

#[test]
fn a_message_kept_in_the_chat_format_reads_back_as_the_same_message() {
    // A session keeps its transcript in the chat format: what comes back from it must be
    // found unchanged, so its items go upstream as they came.
    let parsed = parse(Some(raw(r#""be""#)), raw(INPUT)).unwrap();
    let back: Vec<RArc<Message>> = parsed
        .messages
        .iter()
        .map(|message| {
            let text = crate::chat::message_to_string(message);
            let value: Value = serde_json::from_str(&text).unwrap();
            let mut read = crate::chat::parse_message(&value).unwrap();
            read.set_origin(1000 + message.origin() % 1000);
            RArc::new(read)
        })
        .collect();
    let written = parsed.write(&back);
    let items: Vec<&RawValue> = serde_json::from_str(INPUT).unwrap();
    let expected = format!(
        "[{}]",
        items.iter().map(|i| i.get()).collect::<Vec<_>>().join(",")
    );
    assert_eq!(written.input, expected);
    assert_eq!(written.instructions.as_deref(), Some(r#""be""#));
}

#[test]
fn a_changed_call_or_output_keeps_its_kind_and_other_members() {
    let input = r#"[{"type":"message","role":"user","content":"click it"},
      {"type":"computer_call","id":"cu_1","call_id":"call_c","action":{"type":"click","x":1,"y":2},"pending_safety_checks":[],"status":"completed"},
      {"type":"computer_call_output","call_id":"call_c","output":{"type":"computer_screenshot","image_url":"data:image/png;base64,AAAA"}},
      {"type":"function_call","id":"fc_9","call_id":"call_f","name":"grep","arguments":"{\"q\":\"x\"}","status":"completed"},
      {"type":"function_call_output","call_id":"call_f","output":[{"type":"input_text","text":"found"}]}]"#;
    let parsed = parse(None, raw(input)).unwrap();
    let m = &parsed.messages;
    assert_eq!(m.len(), 5);
    assert_eq!(m[1].tool_calls[0].name.as_str(), "computer_call");
    // The computer call's output, unchanged, as its bytes; the function call's arguments
    // and its output's text changed.
    let mut call = (*m[3]).clone();
    call.tool_calls[0].arguments = r#"{"q":"y"}"#.into();
    let mut output = (*m[4]).clone();
    output.content = Content::Text("[cut]".into());
    let written = parsed.write(&[
        m[0].clone(),
        m[1].clone(),
        m[2].clone(),
        RArc::new(call),
        RArc::new(output),
    ]);
    let out = items(&written.input);
    valid(&out).unwrap();
    let source: Vec<&RawValue> = serde_json::from_str(input).unwrap();
    assert!(written.input.contains(source[2].get()));
    assert_eq!(
        out[3],
        serde_json::json!({"type":"function_call","id":"fc_9","call_id":"call_f","name":"grep","arguments":"{\"q\":\"y\"}","status":"completed"})
    );
    assert_eq!(
        out[4],
        serde_json::json!({"type":"function_call_output","call_id":"call_f","output":"[cut]"})
    );
    // A changed object output stays an object.
    let mut screenshot = (*m[2]).clone();
    screenshot.content = Content::Parts(
        vec![plugin_api::Part::Opaque {
            json: r#"{"type":"computer_screenshot","file_id":"f"}"#.into(),
        }]
        .into(),
    );
    let written = parsed.write(&[m[0].clone(), m[1].clone(), RArc::new(screenshot)]);
    assert_eq!(items(&written.input)[2]["output"]["file_id"], "f");
}

/// A message and the items it was made of.
type MadeOf = (Vec<std::sync::Arc<super::Item>>, RArc<Message>);

/// A memory as the proxy keeps one (server/src/resent.rs), unbounded.
#[derive(Default)]
struct Remembering {
    items: std::cell::RefCell<Vec<(String, std::sync::Arc<super::Item>)>>,
    messages: std::cell::RefCell<Vec<MadeOf>>,
}

impl super::Memory for Remembering {
    fn item(&self, raw: &str) -> Option<std::sync::Arc<super::Item>> {
        self.items
            .borrow()
            .iter()
            .find(|(seen, _)| seen == raw)
            .map(|(_, item)| item.clone())
    }
    fn message(&self, items: &[std::sync::Arc<super::Item>]) -> Option<RArc<Message>> {
        self.messages
            .borrow()
            .iter()
            .find(|(seen, _)| {
                seen.len() == items.len() && seen.iter().zip(items).all(|(a, b)| std::sync::Arc::ptr_eq(a, b))
            })
            .map(|(_, message)| message.clone())
    }
}

impl Remembering {
    fn keep(&self, parsed: &super::Parsed<'_>) {
        for (raw, item) in parsed.parsed_items() {
            self.items.borrow_mut().push((raw.to_string(), item.clone()));
        }
        for (items, message) in parsed.made_messages() {
            self.messages.borrow_mut().push((items.to_vec(), message.clone()));
        }
    }
}

#[test]
fn a_resent_item_is_the_same_item_and_message_and_writes_back_wherever_it_now_is() {
    let memory = Remembering::default();
    let first = super::parse_with(None, super::Input::Raw(raw(INPUT)), &memory).unwrap();
    memory.keep(&first);
    assert_eq!(first.parsed_items().count(), 12);
    // The same input again: nothing parsed or made, the same messages.
    // Given as the server has it: the items already split.
    let split: Vec<&RawValue> = serde_json::from_str(INPUT).unwrap();
    let again = super::parse_with(None, super::Input::Items(&split), &memory).unwrap();
    assert_eq!(again.parsed_items().count(), 0);
    assert_eq!(again.made_messages().count(), 0);
    for (a, b) in first.messages.iter().zip(&again.messages) {
        assert!(std::ptr::eq::<Message>(&**a, &**b));
    }
    // The client dropped its first two items and added one: the remembered messages sit
    // at other positions now, and still write back as their bytes, a changed one rewritten.
    let source: Vec<&RawValue> = serde_json::from_str(INPUT).unwrap();
    let mut shifted: Vec<&str> = source[2..].iter().map(|i| i.get()).collect();
    shifted.push(r#"{"type":"message","role":"user","content":"more"}"#);
    let shifted = format!("[{}]", shifted.join(","));
    let parsed = super::parse_with(None, super::Input::Raw(raw(&shifted)), &memory).unwrap();
    assert_eq!(parsed.parsed_items().count(), 1);
    let m = &parsed.messages;
    let expected = format!(
        "[{}]",
        source[4..].iter().map(|i| i.get()).collect::<Vec<_>>().join(",")
    );
    // The first call (now a lone call item at the front) dropped, its output too.
    let mut kept: Vec<RArc<Message>> = m[2..].to_vec();
    let written = parsed.write(&kept);
    assert!(
        written.input.starts_with(&expected[..expected.len() - 1]),
        "{}",
        written.input
    );
    assert!(written
        .input
        .ends_with(r#"{"type":"message","role":"user","content":"more"}]"#));
    // A changed remembered message is found by its identity and rewritten in place.
    let at = kept.iter().position(|m| m.role == Role::Developer).unwrap();
    let mut developer = (*kept[at]).clone();
    developer.content = Content::Text("be very brief".into());
    kept[at] = RArc::new(developer);
    let out = items(&parsed.write(&kept).input);
    valid(&out).unwrap();
    assert!(out
        .iter()
        .any(|i| i["role"] == "developer" && i["content"] == "be very brief"));
    assert!(!out.iter().any(|i| i["content"] == "be brief"));
}
