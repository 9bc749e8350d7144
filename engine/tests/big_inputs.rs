//! Big inputs, at sizes the test suite can afford (`cargo xtask bench --big` runs the
//! rest through the real binary: a 100 MB message, a 300 MB document, 1,000,000 tiny
//! messages): each gets a result or a clear error, never a panic or a stack overflow.
//! See docs/limits.md.

use history_engine::document::parse_document;
use history_engine::tokens::{count_text, history_tokens};
use plugin_api::Tokenizer;

#[test]
fn a_10_mb_message_is_parsed_and_counted() {
    // 2,000,000 words: "word" then " word" are each one token, the last space one more.
    let text = "word ".repeat(2_000_000);
    let document = format!(r#"[{{"role":"user","content":"{text}"}}]"#);
    let parsed = parse_document(document.as_bytes()).unwrap();
    assert_eq!(parsed.messages.len(), 1);
    assert_eq!(count_text(Tokenizer::O200kBase, &text), 2_000_001);
    assert_eq!(count_text(Tokenizer::Cl100kBase, &text), 2_000_001);
    assert!(history_tokens(Tokenizer::O200kBase, &parsed.messages) > 2_000_001);
}

#[test]
fn ten_thousand_levels_of_nesting_are_a_clear_error() {
    let cases = [
        ("", "", "a document"),
        (r#"[{"role":"user","content":"#, "}]", "a message's content"),
        (
            r#"[{"role":"user","content":"x","metadata":{"note":"#,
            "}}]",
            "a member kept verbatim",
        ),
    ];
    for (open, close, what) in cases {
        let document = format!("{open}{}{}{close}", "[".repeat(10_000), "]".repeat(10_000));
        let error = parse_document(document.as_bytes()).expect_err(what);
        assert!(error.0.contains("recursion limit"), "{what}: {}", error.0);
    }
}

#[test]
fn a_hundred_thousand_tiny_messages_are_parsed_and_counted() {
    let mut document = String::from("[");
    for i in 0..100_000 {
        if i > 0 {
            document.push(',');
        }
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        document.push_str(&format!(r#"{{"role":"{role}","content":"hi {i}"}}"#));
    }
    document.push(']');
    let parsed = parse_document(document.as_bytes()).unwrap();
    assert_eq!(parsed.messages.len(), 100_000);
    assert!(history_tokens(Tokenizer::O200kBase, &parsed.messages) > 300_000);
}
