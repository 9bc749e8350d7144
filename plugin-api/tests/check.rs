//! The output check (`plugin_api::check`) on histories parsed from JSON.

use history_wire::chat::history_from_str;
use plugin_api::check::*;
use plugin_api::{Content, Message, RArc, Role};

fn summary(of: &[&str]) -> RArc<Message> {
    let mut message = Message::new(
        Role::User,
        Content::Text("[Summary of 2 earlier messages]\n\nx".into()),
    );
    let ids: Vec<String> = of.iter().map(|s| s.to_string()).collect();
    message.meta_mut().set_summary_of(&ids);
    RArc::new(message)
}

/// Numbered as the host numbers a history before the chain.
fn numbered(json: &str) -> Vec<RArc<Message>> {
    plugin_testing::history(json)
}

#[test]
fn a_summary_of_input_messages_none_of_them_kept_is_accepted() {
    let input = numbered(
        r#"[{"role":"user","content":"1","metadata":{"id":"a"}},{"role":"assistant","content":"2","metadata":{"id":"b"}},
            {"role":"user","content":"3"},{"role":"assistant","content":"4"}]"#,
    );
    let by_origin = input[2].identity();
    assert!(by_origin.starts_with('#'));
    let output = vec![summary(&["a", "b", &by_origin]), input[3].clone()];
    check_output(&input, 0, &output).unwrap();
}

#[test]
fn a_summary_listing_a_kept_or_unknown_message_is_refused() {
    let input = numbered(
        r#"[{"role":"user","content":"1","metadata":{"id":"a"}},{"role":"assistant","content":"2","metadata":{"id":"b"}},
            {"role":"user","content":"3","metadata":{"id":"c"}}]"#,
    );
    let kept = check_output(&input, 0, &[summary(&["a", "c"]), input[2].clone()]).unwrap_err();
    assert!(kept.contains("\"c\", which is still in the output"), "{kept}");
    let mut copy = (*input[2]).clone();
    copy.content = Content::Text("changed".into());
    let copied = check_output(&input, 0, &[summary(&["a", "c"]), RArc::new(copy)]).unwrap_err();
    assert!(copied.contains("still in the output"), "{copied}");
    let unknown = check_output(&input, 0, &[summary(&["a", "zz"]), input[2].clone()]).unwrap_err();
    assert!(
        unknown.contains("\"zz\", which is not an input message"),
        "{unknown}"
    );
    let empty = check_output(&input, 0, &[summary(&[]), input[2].clone()]).unwrap_err();
    assert!(empty.contains("lists no message"), "{empty}");
    let two = check_output(&input, 0, &[summary(&["a"]), summary(&["b"]), input[2].clone()]).unwrap_err();
    assert!(two.contains("a second summary"), "{two}");
    // An assistant message cannot be a summary: it is invented.
    let mut assistant = (*summary(&["a"])).clone();
    assistant.role = Role::Assistant;
    let invented = check_output(&input, 0, &[RArc::new(assistant), input[2].clone()]).unwrap_err();
    assert!(invented.contains("invented"), "{invented}");
}

#[test]
fn a_selection_keeps_shared_messages_in_input_order() {
    let input = history_from_str(
        r#"[{"role":"user","content":"1"},{"role":"assistant","content":"2"},{"role":"user","content":"3"}]"#,
    )
    .unwrap();
    let pick = |indices: &[usize]| indices.iter().map(|&i| input[i].clone()).collect::<Vec<_>>();
    assert!(is_selection(&input, &pick(&[0, 2])));
    assert!(is_selection(&input, &pick(&[])));
    assert!(!is_selection(&input, &pick(&[2, 0])), "reordered");
    assert!(!is_selection(&input, &pick(&[0, 0])), "repeated");
    let copy = RArc::new((*input[1]).clone());
    assert!(
        !is_selection(&input, &[input[0].clone(), copy]),
        "a changed copy is not shared"
    );
}
