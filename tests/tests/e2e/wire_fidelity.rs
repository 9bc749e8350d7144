//! Wire fidelity (docs/wire-format.md#messages): a message no plugin changed comes out as the same JSON value.

use e2e_tests::{describe, json, real_conversations, run_json, TestConfig};

/// A chain that changes nothing: `default` with a window larger than any conversation.
fn unchanged_chain() -> TestConfig {
    TestConfig::new("[history]\nagent_max_ctx = 100000\nchain = [\"default\"]\n")
}

#[test]
fn every_real_conversation_comes_out_as_the_same_json_value() {
    let config = unchanged_chain();
    let conversations = real_conversations();
    // tests/data/real: three whole conversations and twelve of the tau-bench ones.
    assert!(conversations.len() >= 15, "all real conversations are read");
    for (name, text) in &conversations {
        let run = config.run("gpt-4o", text, None).unwrap();
        assert_eq!(run_json(&run), json(text), "{name}");
    }
}

#[test]
fn real_files_through_the_binary_are_unchanged() {
    let config = unchanged_chain();
    for (name, text) in real_conversations().iter().filter(|(n, _)| n.ends_with(".json")) {
        let output = config.process(&["--model", "gpt-4o"], text);
        assert!(output.status.success(), "{name}: {}", describe(&output));
        assert_eq!(
            json(&String::from_utf8_lossy(&output.stdout)),
            json(text),
            "{name}"
        );
    }
}

#[test]
fn unknown_fields_opaque_parts_and_metadata_extras_are_kept() {
    let input = r#"[
      {"role":"developer","content":"rules","x-trace":{"span":[1,2,3]}},
      {"role":"user","content":[{"type":"text","text":"look","cache_control":{"type":"ephemeral"}},
        {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"low"}},
        {"type":"input_audio","input_audio":{"data":"UklGR","format":"wav"}}],
       "name":"alice","metadata":{"id":"m1","timestamp":"2026-01-01T00:00:00Z","turn_added":1,
         "message_type":"user-input","custom":{"nested":[true,null,1.5]},"omitted":"not a bool"}},
      {"role":"assistant","content":[{"type":"reasoning","encrypted":"opaque=="},{"type":"text","text":"calling"}],
       "tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":{"a":1}},"index":0}],
       "refusal":null},
      {"role":"tool","tool_call_id":"c1","content":"ok","name":"f","metadata":{"retention_policy":[null],
        "expiration":{"turns":3,"mode":"none","unknown":1}}},
      {"role":"assistant","content":"done","audio":null,"weird_number":12345678901234567890}
    ]"#;
    let config = unchanged_chain();
    let output = config.process(&["--turn-ignored-not-a-flag"], input);
    assert_eq!(output.status.code(), Some(64), "unknown flag is a usage error");
    let output = config.process(&[], input);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(json(&String::from_utf8_lossy(&output.stdout)), json(input));
}
