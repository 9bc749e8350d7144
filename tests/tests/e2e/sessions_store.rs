//! What the store keeps (docs/sessions.md#the-store): the transcript once, and the working
//! history as references to it plus copies of exactly the messages whose bytes differ.

use e2e_tests::server::{shipped_config, Server};
use e2e_tests::store::{Kind, TestStore};
use history_sessions::store::WorkingRef;
use serde_json::{json as j, Value};

fn the_working_history_is_stored_as_references_plus_changed_copies(kind: Kind) {
    let config = shipped_config("", &[]);
    let store = TestStore::new(kind, &config);
    let server = Server::start(&config.path, store.path(), &[]);
    let id = server.create("gpt-4o");
    for n in 1..=30u64 {
        let messages = j!([
            {"role": "user", "content": format!("step {n}")},
            {"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{n}"), "type": "function",
                "function": {"name": "read_file", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": format!("c{n}"), "content": format!("file {n}: {}", "text ".repeat(50))},
            {"role": "assistant", "content": format!("done {n}")},
        ]);
        let answer = server.post(&format!("/v1/sessions/{id}/turns"), &j!({ "messages": messages }));
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    let working = server.history(&id, false);
    let transcript = server.transcript(&id);
    assert_eq!(server.stop().code(), Some(0));

    let store = store.open();
    assert_eq!(
        store.transcript(&id, 1, 10_000).unwrap().len(),
        120,
        "each message once"
    );
    let stored = store.load(&id).unwrap().unwrap();
    assert_eq!(stored.working.len(), working.as_array().unwrap().len());
    let mut copies = 0;
    for ((reference, seq, text), message) in stored.working.iter().zip(working.as_array().unwrap()) {
        let stored_message: Value = serde_json::from_str(text).unwrap();
        assert_eq!(&stored_message, message);
        let seq = seq.expect("every working message comes from the transcript here") as usize;
        let original = &transcript[seq - 1];
        match reference {
            WorkingRef::Transcript(s) => {
                assert_eq!(*s as usize, seq);
                assert_eq!(message, original, "a reference is the transcript's bytes");
            }
            WorkingRef::Copy(_) => {
                copies += 1;
                assert_ne!(message, original, "a copy only where the bytes differ");
            }
        }
    }
    // tool_result_filter keeps the newest 4 results: the 26 older ones are placeholders,
    // the only copies.
    assert_eq!(copies, 26);
    assert_eq!(stored.row.turn, 30);
}

e2e_tests::store_tests!(the_working_history_is_stored_as_references_plus_changed_copies,);
