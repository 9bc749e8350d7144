//! Fuzz targets: each takes arbitrary bytes and panics when an invariant breaks. A panic
//! (or a crash) is a finding; anything the parsers refuse with an error is fine.
//! `cargo xtask fuzz --time S` runs them under this crate's driver (`src/main.rs`): every
//! input of `fuzz/corpus/<target>/`, then mutations of them until the time is up. The
//! corpus also runs as a test (`tests/corpus.rs`), so each fixed finding stays fixed.

pub mod edit;
pub mod gen;

use std::path::Path;

use history_engine::document::parse_document;
use history_engine::tokens;
use history_engine::Config;
use history_wire::chat::{history_to_string, parse_history};
use plugin_api::{Message, RArc, Tokenizer};

/// A target: its name (its corpus folder) and the function that checks one input.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
    /// Fragments the mutator inserts (what the format is made of).
    pub dictionary: &'static [&'static str],
}

const JSON_WORDS: &[&str] = &[
    "\"role\"",
    "\"content\"",
    "\"user\"",
    "\"assistant\"",
    "\"system\"",
    "\"tool\"",
    "\"tool_calls\"",
    "\"tool_call_id\"",
    "\"function\"",
    "\"name\"",
    "\"arguments\"",
    "\"id\"",
    "\"metadata\"",
    "\"turn_added\"",
    "\"expiration\"",
    "\"pinned\"",
    "\"type\"",
    "\"text\"",
    "\"messages\"",
    "\"model\"",
    "\"turn\"",
    "null",
    "true",
    "false",
    "0",
    "-1",
    "1e999",
    "18446744073709551616",
    "[]",
    "{}",
    "\"\\ud800\"",
    "\"\\u0000\"",
    ":",
    ",",
    "[",
    "]",
    "{",
    "}",
    "\"",
    "\\",
];

const TOML_WORDS: &[&str] = &[
    "[history]",
    "chain = [",
    "view = [",
    "\"default\"",
    "\"retention\"",
    "agent_max_ctx = ",
    "max_users = ",
    "session_idle_timeout_minutes = ",
    "plugin_dir = ",
    "[plugin.default]",
    "[models.gpt-4o]",
    "tokenizer = ",
    "context_tokens = ",
    "max_context = ",
    "# ",
    "\n",
    "\r\n",
    "\"\"\"",
    "'''",
    "=",
    "[[",
    "]]",
    ".",
    "-0",
    "9223372036854775808",
    "inf",
    "nan",
    "1979-05-27",
    "{ }",
    "\u{feff}",
];

const SERVER_WORDS: &[&str] = &[
    "\"messages\"",
    "\"context\"",
    "\"model\"",
    "\"command\"",
    "\"index\"",
    "\"id\"",
    "\"expiration_override\"",
    "\"role\"",
    "\"content\"",
    "\"user\"",
    "\"!model x\"",
    "\"!maxctx 5 temp\"",
    "\"!expand 3\"",
    "\"/clear\"",
    "\"/history\"",
    "\"!maxusers 0\"",
    "\"!sessiontimeout -1\"",
    "18446744073709551616",
    "-1",
    "null",
    "[]",
    "{}",
    ":",
    ",",
];

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "wire_messages",
        run: wire_messages,
        dictionary: JSON_WORDS,
    },
    Target {
        name: "document",
        run: document,
        dictionary: JSON_WORDS,
    },
    Target {
        name: "config",
        run: config,
        dictionary: TOML_WORDS,
    },
    Target {
        name: "server_bodies",
        run: server_bodies,
        dictionary: SERVER_WORDS,
    },
    Target {
        name: "agentctl_edit",
        run: edit::agentctl_edit,
        dictionary: &[],
    },
];

/// A history that parsed: written out, it parses again to the same text, and every
/// tokenizer counts it.
fn check_history(history: &[RArc<Message>]) {
    let written = history_to_string(history);
    let value: serde_json::Value = serde_json::from_str(&written).expect("written history is JSON");
    let again = parse_history(&value).expect("a written history parses again");
    assert_eq!(
        history_to_string(&again),
        written,
        "a history's written form is stable"
    );
    for tokenizer in Tokenizer::ALL {
        tokens::history_tokens(tokenizer, history);
    }
}

/// The wire format's message array (`history_wire::chat::parse_history`).
pub fn wire_messages(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(history) = parse_history(&value) {
        check_history(&history);
    }
}

/// `history-host process`'s input document (`history_engine::document`).
pub fn document(data: &[u8]) {
    if let Ok(document) = parse_document(data) {
        check_history(&document.messages);
    }
}

/// The configuration parser; what parses answers the questions the host asks of it.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data).into_owned();
    if let Ok(config) = Config::parse(Path::new("fuzz/plugins-enabled.toml"), text) {
        for name in config.chain.iter().chain(&config.view) {
            config.place_of(name);
            config.plugin_table(name);
        }
        config.model("gpt-4o");
        config.model("");
        config.models_for_validation();
    }
}

/// The session API's request bodies (`history_server::bodies`): the first byte picks the
/// endpoint, the rest is its body. Every refusal is a 400 with a message; a turn that is
/// accepted has messages, and they pass the history checks.
pub fn server_bodies(data: &[u8]) {
    use history_server::bodies;
    let Some((&endpoint, body)) = data.split_first() else {
        return;
    };
    let refusal = match endpoint % 5 {
        0 => bodies::create(body).err(),
        1 => match bodies::turn(body) {
            Ok(input) => {
                assert!(!input.messages.is_empty(), "an accepted turn has messages");
                check_history(&input.messages);
                None
            }
            Err(refusal) => Some(refusal),
        },
        2 => bodies::model(body).err(),
        3 => bodies::command(body).err(),
        _ => bodies::expand(body).err(),
    };
    if let Some((status, message)) = refusal {
        assert!(
            status == 400 || status == 404,
            "a body is refused with a 400, not {status}: {message}"
        );
        assert!(!message.is_empty(), "a refusal says why");
    }
}
