//! `dedupe`'s hashing over a replay (docs/chain.md#performance): a history fed turn by
//! turn through a chain with `dedupe`, each turn's working history handed back with the
//! next turn's messages as a session does, and the bytes `dedupe` hashed against the tool
//! results' bytes that entered. 1.0 is each result hashed once, whatever the history's
//! length; hashing every result again at every turn would grow with the turns.
//!
//! The count is the plugin's own: each call of `dedupe` logs at debug `hashed N bytes: …`
//! (plugins/dedupe/src/lib.rs), through the host's log callback, and this module reads
//! those lines with a tracing subscriber of its own, listening only while a replay runs.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use history_engine::chain::stateless_context;
use history_engine::{turns, Call, Chain, Config};
use plugin_api::{Message, ModelInfo, RArc, Role};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

/// Where the engine logs plugins' lines (`history_engine::logging::log_plugin_line`).
const PLUGIN_LINES: &str = "history_engine::logging";

/// A replay's hashing.
#[derive(Debug, Clone, Copy)]
pub struct Hashing {
    pub turns: usize,
    /// Bytes of the tool results' content that entered (every new tool result's items).
    pub bytes_entered: u64,
    /// Bytes `dedupe` hashed, summed from its log lines.
    pub bytes_hashed: u64,
}

impl Hashing {
    pub fn ratio(&self) -> f64 {
        self.bytes_hashed as f64 / self.bytes_entered.max(1) as f64
    }
}

/// Bytes of a message's content items: what `dedupe` hashes of a result.
pub fn content_bytes(message: &Message) -> u64 {
    message.content.items().map(|item| item.len() as u64).sum()
}

/// Replays `history` through `chain` (which must run `dedupe`) as a session does; returns
/// what entered and what `dedupe` hashed. Fails when `dedupe` did not report each call.
pub fn replay(
    chain: &Chain,
    config: &Config,
    model: &ModelInfo,
    history: Vec<RArc<Message>>,
) -> Result<Hashing, String> {
    let capture = capture()?;
    let turns_list = crate::split_turns(history, crate::is_user);
    let turns = turns_list.len();
    let bytes_entered = turns_list
        .iter()
        .flatten()
        .filter(|m| m.role == Role::Tool)
        .map(|m| content_bytes(m))
        .sum();
    let _guard = capture.listen();
    let mut previous: Vec<RArc<Message>> = Vec::new();
    for (index, mut new_messages) in turns_list.into_iter().enumerate() {
        let turn = index as u64 + 1;
        turns::stamp_entering(&mut new_messages, turn, None);
        let mut input = previous;
        input.append(&mut new_messages);
        let ctx = stateless_context(config, model.clone(), turn);
        let run = chain.run(input, &ctx, Call::Process).map_err(|e| e.to_string())?;
        // The working history is what a session keeps and appends the next turn to.
        previous = run.working;
    }
    let lines = capture.take();
    let hashed: Vec<u64> = lines.iter().filter_map(|line| hashed_bytes(line)).collect();
    if hashed.len() != turns {
        return Err(format!(
            "dedupe reported its hashing in {} of {turns} calls (is the installed dedupe older than its memo?)",
            hashed.len()
        ));
    }
    Ok(Hashing {
        turns,
        bytes_entered,
        bytes_hashed: hashed.iter().sum(),
    })
}

/// `N` of `dedupe`'s `hashed N bytes: …`.
fn hashed_bytes(line: &str) -> Option<u64> {
    line.strip_prefix("hashed ")?.split(' ').next()?.parse().ok()
}

/// The subscriber that keeps `dedupe`'s lines while a replay listens.
struct Capture {
    listening: AtomicBool,
    lines: Mutex<Vec<String>>,
}

static CAPTURE: OnceLock<Result<&'static Capture, String>> = OnceLock::new();

/// The capture, installed as this process's subscriber on first use.
fn capture() -> Result<&'static Capture, String> {
    CAPTURE
        .get_or_init(|| {
            let capture: &'static Capture = Box::leak(Box::new(Capture {
                listening: AtomicBool::new(false),
                lines: Mutex::new(Vec::new()),
            }));
            tracing::subscriber::set_global_default(Forward(capture))
                .map(|_| capture)
                .map_err(|_| "another log subscriber is installed: dedupe's lines cannot be read".to_string())
        })
        .clone()
}

struct Listening(&'static Capture);

impl Drop for Listening {
    fn drop(&mut self) {
        self.0.listening.store(false, Ordering::SeqCst);
    }
}

impl Capture {
    fn listen(&'static self) -> Listening {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.listening.store(true, Ordering::SeqCst);
        Listening(self)
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.lines.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The `plugin` and `message` fields of a plugin's line.
#[derive(Default)]
struct Fields {
    plugin: String,
    message: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            "plugin" => self.plugin = format!("{value:?}"),
            "message" => self.message = format!("{value:?}"),
            _ => {}
        }
    }
}

struct Forward(&'static Capture);

impl Subscriber for Forward {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        // Only plugins' lines, and only while listening: everything else costs nothing.
        if metadata.target() == PLUGIN_LINES {
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target() == PLUGIN_LINES && self.0.listening.load(Ordering::Relaxed)
    }

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields.plugin == "dedupe" {
            self.0
                .lines
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(fields.message);
        }
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_is_read_from_dedupes_line() {
        assert_eq!(
            hashed_bytes("hashed 1234 bytes: 3 tool results hashed, 9 remembered from earlier calls"),
            Some(1234)
        );
        assert_eq!(hashed_bytes("something else"), None);
    }
}
