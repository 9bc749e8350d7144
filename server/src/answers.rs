//! The JSON forms of what the service's operations give (docs/http-api.md): a turn's
//! answer, a model switch's, a command's, a session's, messages, histories and events.
//! The service answers in types; the routes render them here. The sent history of a turn
//! is written straight as text (docs/sessions.md#answers).

use history_sessions::clock::rfc3339;
use history_sessions::reload::LastReload;
use history_sessions::session::{SwitchOutcome, TurnOutcome};
use history_sessions::{CommandAnswer, SessionInfo, TurnRecord};
use serde_json::{json, Value};

/// The form a history is answered in (docs/http-api.md#forms): `full`, each message with
/// the host's `metadata` (stamps, flags, the originals of omitted content), or `provider`,
/// the messages as the proxy sends them upstream, which a provider accepts as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum HistoryForm {
    #[default]
    Full,
    Provider,
}

impl HistoryForm {
    /// `"full"` or `"provider"`; anything else is an error naming both.
    pub(crate) fn parse(name: &str) -> Result<HistoryForm, String> {
        match name {
            "full" => Ok(HistoryForm::Full),
            "provider" => Ok(HistoryForm::Provider),
            other => Err(format!(
                "form: expected \"full\" or \"provider\", found {}",
                history_engine::echo::quoted(other)
            )),
        }
    }
}

/// How a turn's answer carries its sent history (docs/http-api.md#deltas): in `form`,
/// whole (`history`) or, with `delta`, as what changed since the previous turn's answer
/// (`delta: {base_turn, keep, append}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct AnswerShape {
    pub(crate) form: HistoryForm,
    pub(crate) delta: bool,
}

/// A message as its JSON value.
pub(crate) fn message_json(message: &plugin_api::Message) -> Value {
    serde_json::from_str(&history_wire::chat::message_to_string(message)).unwrap_or(Value::Null)
}

/// A history as a JSON array.
fn history_json(history: &[plugin_api::RArc<plugin_api::Message>]) -> Value {
    history_json_as(history, HistoryForm::Full)
}

/// A history as a JSON array in `form`.
pub(crate) fn history_json_as(history: &[plugin_api::RArc<plugin_api::Message>], form: HistoryForm) -> Value {
    let text = match form {
        HistoryForm::Full => history_wire::chat::history_to_string(history),
        HistoryForm::Provider => history_wire::chat::provider_history_to_string(history),
    };
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

/// An event as JSON, with the plugin that reported it.
pub(crate) fn event_json(plugin: &str, event: &plugin_api::Event) -> Value {
    json!({
        "plugin": plugin,
        "kind": event.kind.as_str(),
        "turn": event.turn,
        "index": event.index.into_option(),
        "id": event.id.as_ref().into_option().map(|s| s.as_str()),
        "reason": event.reason.as_str(),
        "tokens_saved": event.tokens_saved.into_option(),
    })
}

/// An event in a turn's answer, with the plugin that reported it (as [`event_json`]).
#[derive(serde::Serialize)]
struct EventOut<'a> {
    plugin: &'a str,
    kind: &'a str,
    turn: u64,
    index: Option<u64>,
    id: Option<&'a str>,
    reason: &'a str,
    tokens_saved: Option<i64>,
}

impl<'a> EventOut<'a> {
    fn of(plugin: &'a str, event: &'a plugin_api::Event) -> EventOut<'a> {
        EventOut {
            plugin,
            kind: event.kind.as_str(),
            turn: event.turn,
            index: event.index.into_option(),
            id: event.id.as_ref().into_option().map(|s| s.as_str()),
            reason: event.reason.as_str(),
            tokens_saved: event.tokens_saved.into_option(),
        }
    }
}

/// A stage's figures in a turn's answer; `ingest` only when true.
#[derive(serde::Serialize)]
struct StatOut<'a> {
    plugin: &'a str,
    view: bool,
    messages_in: usize,
    messages_out: usize,
    tokens_in: u64,
    tokens_out: u64,
    ms: f64,
    prefix_kept: Option<usize>,
    skipped: Option<&'a str>,
    quarantined: bool,
    #[serde(skip_serializing_if = "is_false")]
    ingest: bool,
}

fn is_false(value: &bool) -> bool {
    !value
}

/// A model switch's result: `{model, effective_ctx, history}` (the working history).
pub(crate) fn switch_json(outcome: &SwitchOutcome) -> Value {
    json!({
        "model": outcome.model.name.as_str(),
        "previous_model": outcome.old,
        "effective_ctx": outcome.model.effective_ctx,
        "history": history_json(&outcome.run.working),
        "working_size": outcome.run.working.len(),
    })
}

/// A turn's result as JSON text: `{turn, model, effective_ctx, history, working_size, events, stats, prefix_kept, input_faults}`,
/// its sent history in `shape` (`delta` instead of `history` for a delta).
pub(crate) fn turn_json(outcome: &TurnOutcome, shape: AnswerShape) -> String {
    let run = &outcome.run;
    let events: Vec<EventOut<'_>> = outcome
        .switch
        .iter()
        .flat_map(|s| s.events())
        .chain(run.events())
        .map(|(plugin, event)| EventOut::of(plugin, event))
        .collect();
    let stats: Vec<StatOut<'_>> = run
        .stages
        .iter()
        .map(|stage| StatOut {
            plugin: &stage.plugin,
            view: stage.view,
            messages_in: stage.messages_in,
            messages_out: stage.messages_out,
            tokens_in: stage.tokens_in,
            tokens_out: stage.tokens_out,
            ms: stage.elapsed.as_secs_f64() * 1000.0,
            prefix_kept: stage.prefix_kept,
            skipped: stage.skipped.as_deref(),
            quarantined: stage.quarantined,
            ingest: stage.ingest,
        })
        .collect();
    // The sent history is most of the answer: written straight as text, not parsed into
    // a `Value` and serialized again; the rest through serde's derives, not `Value`s
    // (docs/sessions.md#answers). The members keep the order docs/http-api.md shows.
    #[derive(serde::Serialize)]
    struct Head<'a> {
        turn: u64,
        model: &'a str,
        effective_ctx: u64,
    }
    #[derive(serde::Serialize)]
    struct Tail<'a> {
        working_size: usize,
        events: Vec<EventOut<'a>>,
        stats: Vec<StatOut<'a>>,
        prefix_kept: Option<usize>,
        input_faults: &'a [String],
    }
    let head = Head {
        turn: outcome.turn,
        model: outcome.model.name.as_str(),
        effective_ctx: outcome.model.effective_ctx,
    };
    let tail = Tail {
        working_size: run.working.len(),
        events,
        stats,
        prefix_kept: run.prefix_kept,
        input_faults: &run.input_faults,
    };
    // Neither can fail: strings, numbers and options of them.
    let head = serde_json::to_string(&head).unwrap_or_else(|_| "{}".to_string());
    let tail = serde_json::to_string(&tail).unwrap_or_else(|_| "{}".to_string());
    // Sized for the sent history at about a kilobyte and a half a message (the bench's
    // agent conversations average 1.3 KB): growing a string of hundreds of kilobytes by
    // doubling copies it about twice over.
    let messages = if shape.delta {
        run.history.len() - run.prefix_kept.unwrap_or(0)
    } else {
        run.history.len()
    };
    let mut out = String::with_capacity(head.len() + tail.len() + 64 + messages * 1536);
    // `{"turn":…,"effective_ctx":…` + `,"history":[…]` + `,"working_size":…}`; each
    // message the last turn's answer carried too is copied from its text then
    // (history_engine::written).
    out.push_str(&head[..head.len() - 1]);
    if shape.delta {
        // The previous answer's first `keep` messages are this one's, byte for byte
        // (`prefix_kept` compares the full form's bytes; the provider form writes a subset
        // of the same fields, so it is kept as well). docs/http-api.md#deltas
        let keep = run.prefix_kept.unwrap_or(0);
        let base_turn = run.prefix_kept.map(|_| outcome.turn - 1);
        out.push_str(&format!(
            ",\"delta\":{{\"base_turn\":{},\"keep\":{keep},\"append\":",
            base_turn.map_or("null".to_string(), |t| t.to_string())
        ));
        write_sent(&mut out, &run.history[keep..], &run.working, shape.form);
        out.push('}');
    } else {
        out.push_str(",\"history\":");
        write_sent(&mut out, &run.history, &run.working, shape.form);
    }
    out.push(',');
    out.push_str(&tail[1..]);
    out
}

/// `sent` (all or the end of a turn's sent history) as a JSON array in `form`; the full
/// form copies each lasting message's text remembered from an earlier answer.
fn write_sent(
    out: &mut String,
    sent: &[plugin_api::RArc<plugin_api::Message>],
    working: &[plugin_api::RArc<plugin_api::Message>],
    form: HistoryForm,
) {
    match form {
        HistoryForm::Full => history_engine::written::write_history(out, sent, working),
        HistoryForm::Provider => out.push_str(&history_wire::chat::provider_history_to_string(sent)),
    }
}

/// A runtime command's answer (docs/sessions.md#runtime-commands, docs/http-api.md#endpoints).
pub(crate) fn command_json(answer: &CommandAnswer) -> Value {
    match answer {
        CommandAnswer::Model(outcome) => switch_json(outcome),
        CommandAnswer::MaxCtx {
            agent_max_ctx,
            written,
            sessions_updated,
            effective_ctx,
        } => json!({
            "agent_max_ctx": agent_max_ctx,
            "written": written,
            "sessions_updated": sessions_updated,
            "effective_ctx": effective_ctx,
        }),
        CommandAnswer::MaxUsers(value) => json!({"max_users": value, "written": true}),
        CommandAnswer::SessionTimeout(minutes) => {
            json!({"session_idle_timeout_minutes": minutes, "written": true})
        }
        CommandAnswer::Expand {
            index,
            message,
            event,
        } => json!({
            "index": index,
            "message": message_json(message),
            "event": event_json("host", event),
        }),
        CommandAnswer::History { working_size, lines } => {
            json!({"working_size": working_size, "lines": lines})
        }
        CommandAnswer::Clear {
            working_size,
            cleared_at,
        } => json!({"working_size": working_size, "cleared_at": cleared_at}),
    }
}

/// A session as `GET /v1/sessions` lists it (times as RFC 3339).
pub(crate) fn session_json(info: &SessionInfo) -> Value {
    json!({
        "id": info.id,
        "model": info.model,
        "effective_ctx": info.effective_ctx,
        "turn": info.turn,
        "transcript_size": info.transcript_size,
        "working_size": info.working_size,
        "created_at": rfc3339(info.created_at),
        "last_active": rfc3339(info.last_active),
    })
}

/// The last reload as `GET /v1/chain` shows it: `{at, outcome, error}`.
pub(crate) fn last_reload_json(last: &LastReload) -> Value {
    json!({
        "at": rfc3339(last.at),
        "outcome": if last.error.is_none() { "ok" } else { "failed" },
        "error": last.error,
    })
}

/// `GET /v1/sessions/{id}/turns`' answer as JSON text (docs/http-api.md#turns): written
/// through serde's derives straight to text, not built as `Value`s first — a full log is
/// 1000 records with their stages and events.
pub(crate) fn turn_records_json(kept: usize, records: &[TurnRecord]) -> String {
    #[derive(serde::Serialize)]
    struct Stage<'a> {
        plugin: &'a str,
        view: bool,
        ingest: bool,
        messages_in: usize,
        messages_out: usize,
        tokens_in: u64,
        tokens_out: u64,
        ms: f64,
        skipped: bool,
        quarantined: bool,
    }
    #[derive(serde::Serialize)]
    struct Event<'a> {
        plugin: &'a str,
        kind: &'a str,
        index: Option<u64>,
        id: Option<&'a str>,
        reason: &'a str,
        tokens_saved: Option<i64>,
    }
    #[derive(serde::Serialize)]
    struct Turn<'a> {
        turn: u64,
        at: String,
        model: &'a str,
        entered: usize,
        entered_tokens: u64,
        messages_in: usize,
        messages_sent: usize,
        tokens_in: u64,
        tokens_sent: u64,
        working_size: usize,
        transcript_tokens: u64,
        prefix_kept: Option<usize>,
        stages: Vec<Stage<'a>>,
        events: Vec<Event<'a>>,
        events_total: usize,
    }
    #[derive(serde::Serialize)]
    struct Turns<'a> {
        kept: usize,
        turns: Vec<Turn<'a>>,
    }
    let turns = records
        .iter()
        .map(|r| Turn {
            turn: r.turn,
            at: rfc3339(r.at),
            model: &r.model,
            entered: r.entered,
            entered_tokens: r.entered_tokens,
            messages_in: r.messages_in,
            messages_sent: r.messages_sent,
            tokens_in: r.tokens_in,
            tokens_sent: r.tokens_sent,
            working_size: r.working_size,
            transcript_tokens: r.transcript_tokens,
            prefix_kept: r.prefix_kept,
            stages: r
                .stages
                .iter()
                .map(|s| Stage {
                    plugin: &s.plugin,
                    view: s.view,
                    ingest: s.ingest,
                    messages_in: s.messages_in,
                    messages_out: s.messages_out,
                    tokens_in: s.tokens_in,
                    tokens_out: s.tokens_out,
                    ms: s.ms,
                    skipped: s.skipped,
                    quarantined: s.quarantined,
                })
                .collect(),
            events: r
                .events
                .iter()
                .map(|e| Event {
                    plugin: &e.plugin,
                    kind: &e.kind,
                    index: e.index,
                    id: e.id.as_deref(),
                    reason: &e.reason,
                    tokens_saved: e.tokens_saved,
                })
                .collect(),
            events_total: r.events_total,
        })
        .collect();
    serde_json::to_string(&Turns { kept, turns }).unwrap_or_else(|_| "{}".to_string())
}
