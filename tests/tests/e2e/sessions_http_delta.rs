//! A turn's answer as a delta against the previous answer (docs/http-api.md#deltas): a
//! real `serve` given a real conversation turn by turn; a client keeping the last sent
//! history and applying `{keep, append}` has, every turn, what the host sent, in either
//! form, across a restart and after `/clear`.

use e2e_tests::server::{shipped_config, Server};
use e2e_tests::store::{Kind, TestStore};
use e2e_tests::{json, real_conversations};
use serde_json::{json as j, Value};

/// What a client keeps: the last sent history it rebuilt, and its turn.
#[derive(Default)]
struct Client {
    history: Vec<Value>,
    turn: Option<u64>,
    /// Messages appended over all turns, against the messages the whole answers carried.
    appended: usize,
    whole: usize,
    /// Turns whose delta kept less than the whole previous history (a message before the
    /// end changed).
    cut: usize,
}

impl Client {
    /// Applies a delta answer; checks it names the turn this client last saw.
    fn apply(&mut self, answer: &Value) {
        let delta = &answer["delta"];
        assert!(answer.get("history").is_none(), "{answer}");
        let keep = delta["keep"].as_u64().unwrap() as usize;
        match delta["base_turn"].as_u64() {
            Some(base) => {
                assert_eq!(Some(base), self.turn, "{delta}");
                assert!(keep <= self.history.len(), "{delta}");
            }
            None => assert_eq!(keep, 0, "{delta}"),
        }
        if keep < self.history.len() {
            self.cut += 1;
        }
        self.history.truncate(keep);
        let append = delta["append"].as_array().unwrap();
        self.appended += append.len();
        self.history.extend(append.iter().cloned());
        self.whole += self.history.len();
        self.turn = answer["turn"].as_u64();
    }
}

fn the_sent_history(server: &Server, id: &str, form: &str) -> Vec<Value> {
    let sent = server.get(&format!("/v1/sessions/{id}/history?view=sent&form={form}"));
    assert_eq!(sent.status, 200, "{sent:?}");
    sent.body["history"].as_array().unwrap().clone()
}

fn a_delta_answer_rebuilds_the_sent_history_in_either_form(kind: Kind) {
    let config = shipped_config("", &[]);
    let store = TestStore::new(kind, &config);
    let mut server = Server::start(&config.path, store.path(), &[]);
    // A real conversation four messages a turn (it has only four user messages): the
    // shipped chain keeps its start and replaces older tool results as it grows.
    let (_, text) = real_conversations()
        .into_iter()
        .find(|(name, _)| name == "tau-bench-airline-gpt4o.json")
        .unwrap();
    let conversation = json(&text);
    let turns: Vec<Value> = conversation
        .as_array()
        .unwrap()
        .chunks(4)
        .map(|chunk| Value::Array(chunk.to_vec()))
        .collect();
    assert!(turns.len() > 6, "the conversation has {} turns", turns.len());
    let (full, provider) = (server.create("local-8k"), server.create("local-8k"));
    let mut clients = [
        (full.clone(), "full", Client::default()),
        (provider.clone(), "provider", Client::default()),
    ];
    let restart_at = turns.len() / 2;
    for (index, messages) in turns.iter().enumerate() {
        if index == restart_at {
            // The previous sent history is stored: a delta after a restart still keeps.
            assert_eq!(server.stop().code(), Some(0));
            server = Server::start(&config.path, store.path(), &[]);
        }
        for (id, form, client) in &mut clients {
            let answer = server.post(
                &format!("/v1/sessions/{id}/turns"),
                &j!({ "messages": messages, "form": form, "delta": true }),
            );
            assert_eq!(answer.status, 200, "turn {}: {answer:?}", index + 1);
            if index > 0 {
                assert_eq!(answer.body["delta"]["base_turn"], index as u64, "{}", answer.body);
            }
            client.apply(&answer.body);
            assert_eq!(
                client.history,
                the_sent_history(&server, id, form),
                "turn {}",
                index + 1
            );
        }
    }
    for (_, form, client) in &clients {
        assert!(client.cut > 0, "{form}: no turn changed a message before the end");
        // Older tool results turn into placeholders as the conversation grows, which
        // ends the kept prefix there; still, a delta carries fewer messages.
        assert!(
            client.appended < client.whole,
            "{form}: {} messages appended, {} in the whole answers",
            client.appended,
            client.whole
        );
    }

    // After `/clear` there is no previous sent history to keep from.
    let cleared = server.post(
        &format!("/v1/sessions/{full}/commands"),
        &j!({"command": "/clear"}),
    );
    assert_eq!(cleared.status, 200, "{cleared:?}");
    let answer = server.post(
        &format!("/v1/sessions/{full}/turns"),
        &j!({"messages": [{"role": "user", "content": "after the clear"}], "delta": true}),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body["delta"]["base_turn"], Value::Null);
    assert_eq!(answer.body["delta"]["keep"], 0);
    assert_eq!(
        answer.body["delta"]["append"].as_array().unwrap(),
        &the_sent_history(&server, &full, "full")
    );
    // Without `delta` the answer is whole, as before.
    let answer = server.post(
        &format!("/v1/sessions/{full}/turns"),
        &j!({"messages": [{"role": "user", "content": "whole"}], "delta": false}),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.body.get("delta").is_none());
    assert_eq!(
        answer.body["history"].as_array().unwrap(),
        &the_sent_history(&server, &full, "full")
    );
    // `delta` is a boolean.
    let bad = server.post(
        &format!("/v1/sessions/{full}/turns"),
        &j!({"messages": [{"role": "user", "content": "x"}], "delta": "yes"}),
    );
    assert_eq!(bad.status, 400, "{bad:?}");
    assert!(
        bad.error()
            .1
            .contains("delta: expected true or false, found \"yes\""),
        "{bad:?}"
    );
}

e2e_tests::store_tests!(a_delta_answer_rebuilds_the_sent_history_in_either_form,);
