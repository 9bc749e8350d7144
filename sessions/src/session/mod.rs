//! One session in memory and the operations on it: a turn, a model switch, `/clear`,
//! an expansion. Each runs on a blocking thread, holds the session's lock, and either
//! commits one store transaction and then changes the session in memory, or changes
//! nothing at all.

use history_engine::expand::{self, Target};
use history_engine::{stateless_context, turns, Call, Chain, ChainRun, Config};
use history_wire::chat::{message_to_string, parse_message};
use plugin_api::{Context, Event, Message, ModelInfo, RArc, ROption, Role};
use serde_json::Value;

use crate::clock::rfc3339;
use crate::error::{ErrorKind, SessionError};
use crate::store::{encode_sent, SessionRow, SessionWrite, Store, TranscriptRow, WorkingRef};

mod context;
mod stored;

use context::{add_display_context, add_saved_context};
pub use context::{parse_override, ContextItem};
use stored::{copies_of, sent_entries, token_counts, Known};

/// A session in memory: its row, its working history (each message with the store entry
/// it is) and the last sent history, stored with the turn that sent it as references to
/// the working history's entries plus the messages only the view made
/// (docs/sessions.md#the-store).
pub struct Session {
    pub row: SessionRow,
    working: Vec<RArc<Message>>,
    refs: Vec<WorkingRef>,
    last_sent: Option<Vec<RArc<Message>>>,
    /// The last sent history as stored ([`encode_sent`]), written again unchanged by the
    /// operations that are not turns.
    sent: Option<String>,
    /// The working copies the stored sent history references: kept while it is.
    sent_copies: Vec<u64>,
}

/// A turn's input, already parsed (bad input is refused before a turn starts).
pub struct TurnInput {
    pub messages: Vec<RArc<Message>>,
    pub model: Option<String>,
    pub context: Vec<ContextItem>,
}

/// What a turn did.
pub struct TurnOutcome {
    pub turn: u64,
    pub model: ModelInfo,
    /// The chain run: `history` is the sent history (with the turn's display context),
    /// `working` what is stored now.
    pub run: ChainRun,
    /// The model switch run first, when the turn asked for another model.
    pub switch: Option<ChainRun>,
    /// The messages the turn added to the transcript, and their tokens in the model's
    /// tokenizer (the inspector's timeline, docs/http-api.md#turns).
    pub entered: usize,
    pub entered_tokens: u64,
}

/// What a model switch did.
pub struct SwitchOutcome {
    pub old: String,
    pub model: ModelInfo,
    pub run: ChainRun,
}

/// The host-wide things an operation reads: the chain, the live configuration, the store.
pub struct Env<'a> {
    pub chain: &'a Chain,
    pub config: &'a Config,
    pub store: &'a dyn Store,
    pub now: u64,
}

impl Session {
    /// A new, empty session.
    pub fn new(row: SessionRow) -> Session {
        Session {
            row,
            working: Vec::new(),
            refs: Vec::new(),
            last_sent: None,
            sent: None,
            sent_copies: Vec::new(),
        }
    }

    pub fn working(&self) -> &[RArc<Message>] {
        &self.working
    }

    /// About how many bytes of memory this session holds: its working history's messages
    /// (each message's fields and texts, with the originals kept for expansion), the
    /// messages only its last sent history holds, and the sent history as stored.
    /// What `session_memory_mb` counts (docs/sessions.md#memory).
    pub fn memory_estimate(&self) -> usize {
        fn bytes(message: &Message) -> usize {
            let original = message
                .meta()
                .and_then(|meta| meta.original_content.as_ref().into_option())
                .map_or(0, |content| content.items().map(str::len).sum());
            std::mem::size_of::<Message>() + message.token_items().map(str::len).sum::<usize>() + original
        }
        let address = |m: &RArc<Message>| std::ptr::from_ref::<Message>(m) as usize;
        let working: rustc_hash::FxHashSet<usize> = self.working.iter().map(address).collect();
        let sent_only: usize = self
            .last_sent
            .iter()
            .flatten()
            .filter(|m| !working.contains(&address(m)))
            .map(|m| bytes(m))
            .sum();
        let working: usize = self.working.iter().map(|m| bytes(m)).sum();
        working + sent_only + self.sent.as_ref().map_or(0, String::len)
    }

    /// The last sent history (none before the first turn and after `/clear`).
    pub fn last_sent(&self) -> Option<&[RArc<Message>]> {
        self.last_sent.as_deref()
    }

    /// The model's settings with this session's window.
    fn model_info(&self, config: &Config, name: &str, effective_ctx: u64) -> ModelInfo {
        let mut model = config.model(name);
        model.effective_ctx = effective_ctx;
        model
    }

    fn context(&self, env: &Env<'_>, model: ModelInfo, turn: u64) -> Result<Context, SessionError> {
        // The stateless context (the host's services, the model's window) plus what the
        // session knows.
        let mut ctx = stateless_context(env.config, model, turn);
        ctx.session_id = ROption::RSome(self.row.id.as_str().into());
        ctx.last_active = ROption::RSome(rfc3339(self.row.last_active).into());
        ctx.expiration_override = match &self.row.expiration_override {
            Some(json) => ROption::RSome(parse_override(
                &serde_json::from_str(json).unwrap_or(Value::Null),
            )?),
            None => ROption::RNone,
        };
        Ok(ctx)
    }

    /// Runs `on_model_switch` on every stage on `history`, for a switch to `name`.
    fn switch_run(
        &self,
        env: &Env<'_>,
        history: Vec<RArc<Message>>,
        name: &str,
    ) -> Result<(ModelInfo, ChainRun), SessionError> {
        let old = self.model_info(env.config, &self.row.model, self.row.effective_ctx);
        let new = env
            .config
            .known_model(name)
            .map_err(|e| SessionError::bad_input(format!("model: {e}")))?;
        let ctx = self.context(env, new.clone(), self.row.turn.max(1))?;
        let run = env
            .chain
            .run(history, &ctx, Call::ModelSwitch { old: &old, new: &new })
            .map_err(plugin_failed)?;
        Ok((new, run))
    }

    /// One turn (docs/sessions.md#a-turn). On error nothing is stored or changed.
    pub fn turn(&mut self, env: &Env<'_>, input: TurnInput) -> Result<TurnOutcome, SessionError> {
        let turn = self.row.turn + 1;
        let mut row = self.row.clone();
        let mut history = self.working.clone();
        let mut switch = None;
        if let Some(name) = input.model.as_deref().filter(|m| *m != self.row.model) {
            let (model, run) = self.switch_run(env, history, name)?;
            history = run.working.clone();
            row.model = name.to_string();
            row.effective_ctx = model.effective_ctx;
            switch = Some(run);
        }
        let model = self.model_info(env.config, &row.model, row.effective_ctx);

        let mut entering = input.messages;
        let newest_user = entering.iter().rposition(|m| m.role == Role::User);
        if !input.context.is_empty() && newest_user.is_none() {
            return Err(SessionError::bad_input(
                "context: the turn has no user message to add it to",
            ));
        }
        let first_seq = row.transcript_len + 1;
        let stamp = rfc3339(env.now);
        for (offset, message) in entering.iter_mut().enumerate() {
            let message = RArc::make_mut(message);
            if Some(offset) == newest_user {
                add_saved_context(message, &input.context);
            }
            let meta = message.meta_mut();
            if meta.id.is_none() {
                meta.id = ROption::RSome(format!("{}-{}", row.id, first_seq + offset as u64).into());
            }
            meta.timestamp = ROption::RSome(stamp.as_str().into());
        }
        turns::stamp_entering(&mut entering, turn, Some(first_seq));
        let ctx = self.context(env, model.clone(), turn)?;
        // The ingest stages (a redactor) before anything is stored: what they return is
        // the transcript (docs/chain.md#ingest). A fault fails the turn.
        let mut ingest_stages = Vec::new();
        if env.chain.has_ingest() {
            let (ingested, reports) = env.chain.ingest(entering, &ctx).map_err(plugin_failed)?;
            entering = ingested;
            ingest_stages = reports;
        }
        let mut known = self.known();
        for (offset, message) in entering.iter().enumerate() {
            known.add(message, WorkingRef::Transcript(first_seq + offset as u64));
        }
        history.extend(entering.iter().cloned());
        let mut run = env
            .chain
            .run_compared(history, &ctx, Call::Process, self.last_sent.as_deref())
            .map_err(plugin_failed)?;
        if !ingest_stages.is_empty() {
            ingest_stages.append(&mut run.stages);
            run.stages = ingest_stages;
        }
        if let Some(index) = newest_user {
            add_display_context(&mut run.history, entering[index].origin(), &input.context);
        }

        row.turn = turn;
        row.transcript_len += entering.len() as u64;
        row.last_active = env.now;
        row.version += 1;
        let update = self.working_update(&mut row, &run.working, &known);
        let sent_entries = sent_entries(&run.history, &run.working, &update.refs);
        let sent_copies = copies_of(&sent_entries);
        let sent = encode_sent(&sent_entries);
        let dropped = self.dropped(&update.refs, &sent_copies);
        // After the chain, which counted them: stored with their counts, so a read-back
        // does not count them again.
        let transcript: Vec<TranscriptRow> = entering
            .iter()
            .enumerate()
            .map(|(offset, m)| TranscriptRow {
                seq: first_seq + offset as u64,
                turn,
                message: message_to_string(m),
                tokens: token_counts(m),
            })
            .collect();
        // The answer writes the new messages the chain kept as their transcript rows are
        // written: it copies those texts instead (docs/sessions.md#answers).
        for (message, row) in entering.iter().zip(&transcript) {
            if run
                .working
                .iter()
                .any(|kept| std::ptr::eq::<Message>(&**kept, &**message))
            {
                history_engine::written::remember(message, &row.message);
            }
        }
        env.store.commit(&SessionWrite {
            row: Some(&row),
            transcript: &transcript,
            working: &update.refs,
            new_copies: &update.new_copies,
            dropped_copies: &dropped,
            sent: Some(&sent),
        })?;
        self.row = row;
        self.working = run.working.clone();
        self.refs = update.refs;
        self.last_sent = Some(run.history.clone());
        self.sent = Some(sent);
        self.sent_copies = sent_copies;
        let entered_tokens = history_engine::tokens::history_tokens(model.tokenizer, &entering);
        Ok(TurnOutcome {
            turn,
            model,
            run,
            switch,
            entered: entering.len(),
            entered_tokens,
        })
    }

    /// A turn given as the whole conversation (docs/proxy.md): the transcript must be a
    /// prefix of `messages`, compared as JSON values with the host's stamps aside; the
    /// rest are the turn's new messages.
    pub fn turn_resent(
        &mut self,
        env: &Env<'_>,
        messages: Vec<Value>,
        model: Option<String>,
    ) -> Result<TurnOutcome, SessionError> {
        let known = self.row.transcript_len;
        if (messages.len() as u64) <= known {
            return Err(SessionError::new(
                ErrorKind::Conflict,
                format!(
                    "the request has {} messages and adds none to the session's {known}: \
                     send the whole conversation with the new messages at its end",
                    messages.len()
                ),
            ));
        }
        let transcript = env.store.transcript(&self.row.id, 1, known.max(1))?;
        let resent = self.as_ingested(env, &messages[..transcript.len()])?;
        for (index, row) in transcript.iter().enumerate() {
            let stored: Value = serde_json::from_str(&row.message).map_err(|e| {
                SessionError::new(ErrorKind::Store, format!("stored message is not JSON: {e}"))
            })?;
            if without_stamps(stored) != without_stamps(resent[index].clone()) {
                return Err(SessionError::new(
                    ErrorKind::Conflict,
                    format!(
                        "messages[{index}] differs from the session's transcript (message {}): \
                         a request must resend the conversation so far unchanged",
                        row.seq
                    ),
                ));
            }
        }
        let mut entering = Vec::with_capacity(messages.len() - transcript.len());
        for (index, value) in messages.iter().enumerate().skip(transcript.len()) {
            let message = parse_message(value)
                .map_err(|e| SessionError::bad_input(format!("messages[{index}]: {e}")))?;
            entering.push(RArc::new(message));
        }
        self.turn(
            env,
            TurnInput {
                messages: entering,
                model,
                context: Vec::new(),
            },
        )
    }

    /// Resent messages as the transcript holds them: through the ingest stages when there
    /// are any (the transcript holds their output, docs/chain.md#ingest), else as they came.
    fn as_ingested(&self, env: &Env<'_>, messages: &[Value]) -> Result<Vec<Value>, SessionError> {
        if !env.chain.has_ingest() || messages.is_empty() {
            return Ok(messages.to_vec());
        }
        let mut parsed = Vec::with_capacity(messages.len());
        for (index, value) in messages.iter().enumerate() {
            let message = parse_message(value)
                .map_err(|e| SessionError::bad_input(format!("messages[{index}]: {e}")))?;
            parsed.push(RArc::new(message));
        }
        turns::stamp_entering(&mut parsed, self.row.turn.max(1), Some(1));
        let model = self.model_info(env.config, &self.row.model, self.row.effective_ctx);
        let ctx = self.context(env, model, self.row.turn.max(1))?;
        let (ingested, _) = env.chain.ingest(parsed, &ctx).map_err(plugin_failed)?;
        Ok(ingested
            .iter()
            .map(|m| serde_json::from_str(&message_to_string(m)).unwrap_or(Value::Null))
            .collect())
    }

    /// A model switch (docs/sessions.md#model-switch): `on_model_switch` on every stage,
    /// its result stored as the working history, `effective_ctx` recomputed.
    pub fn switch_model(&mut self, env: &Env<'_>, name: &str) -> Result<SwitchOutcome, SessionError> {
        let (model, run) = self.switch_run(env, self.working.clone(), name)?;
        let mut row = self.row.clone();
        let old = std::mem::replace(&mut row.model, name.to_string());
        row.effective_ctx = model.effective_ctx;
        row.last_active = env.now;
        let known = self.known();
        self.store_working(env, row, run.working.clone(), &known)?;
        Ok(SwitchOutcome { old, model, run })
    }

    /// Replaces the session's expiration override (`None` removes it); it applies from
    /// the next turn. `json` has been checked with [`parse_override`].
    pub fn set_expiration_override(
        &mut self,
        env: &Env<'_>,
        json: Option<String>,
    ) -> Result<(), SessionError> {
        let mut row = self.row.clone();
        row.expiration_override = json;
        row.last_active = env.now;
        let known = self.known();
        self.store_working(env, row, self.working.clone(), &known)
    }

    /// The expiration override as stored (JSON), if any.
    pub fn expiration_override(&self) -> Option<&str> {
        self.row.expiration_override.as_deref()
    }

    /// `/clear` (docs/sessions.md#runtime-commands): the working history keeps only its
    /// pinned messages, the leading system messages and the task, as `default` pins them,
    /// so the next turn still has its instructions; `all` empties it. The transcript keeps
    /// everything, and the last sent history is forgotten either way. Returns the working
    /// history's new length.
    pub fn clear(&mut self, env: &Env<'_>, all: bool) -> Result<usize, SessionError> {
        let mut row = self.row.clone();
        row.cleared_at = row.transcript_len;
        row.last_active = env.now;
        let kept = if all {
            Vec::new()
        } else {
            let pins = history_trim::Pins {
                system: true,
                first_user: true,
            };
            let pinned = history_trim::pinned_messages(&self.working, pins);
            self.working
                .iter()
                .zip(pinned)
                .filter(|(_, pinned)| *pinned)
                .map(|(message, _)| message.clone())
                .collect()
        };
        self.last_sent_cleared(env, row, kept)
    }

    /// Expands one message of the working history (docs/plugins.md, expansion): it is
    /// marked `expanded`, so it stays expanded. Returns its index, the message and the event.
    pub fn expand(
        &mut self,
        env: &Env<'_>,
        target: &str,
    ) -> Result<(usize, RArc<Message>, Event), SessionError> {
        let mut working = self.working.clone();
        let target = match target.parse::<usize>() {
            Ok(index) => Target::ByIndex(index),
            Err(_) => Target::ById(target),
        };
        let event = expand::expand(&mut working, target, self.row.turn.max(1))
            .map_err(|e| SessionError::bad_input(e.to_string()))?;
        let index = event.index.into_option().unwrap_or(0) as usize;
        let mut row = self.row.clone();
        row.last_active = env.now;
        let known = self.known();
        let message = working[index].clone();
        self.store_working(env, row, working, &known)?;
        Ok((index, message, event))
    }

    /// `/history`: one line per working message: index, role, turn, characters, flags.
    pub fn history_lines(&self) -> Vec<String> {
        self.working
            .iter()
            .enumerate()
            .map(|(index, m)| {
                let mut line = format!(
                    "{index:>4} {:<9} turn {:<4} {:>7} chars",
                    m.role.as_str(),
                    m.turn,
                    m.content.char_count()
                );
                if !m.tool_calls.is_empty() {
                    line.push_str(&format!(" {} tool calls", m.tool_calls.len()));
                }
                if let Some(meta) = m.meta() {
                    let flags: Vec<&str> = [
                        (meta.was_compacted(), "compacted"),
                        (meta.omitted(), "omitted"),
                        (meta.is_expired(), "expired"),
                        (meta.can_expand(), "can_expand"),
                        (meta.expanded(), "expanded"),
                    ]
                    .iter()
                    .filter(|(set, _)| *set)
                    .map(|(_, name)| *name)
                    .collect();
                    if let Some(id) = m.id() {
                        line.push_str(&format!(" id {id}"));
                    }
                    if !flags.is_empty() {
                        line.push_str(&format!(" [{}]", flags.join(", ")));
                    }
                }
                line
            })
            .collect()
    }

    /// `/clear`'s store write: `working` (what it keeps) and no sent history.
    fn last_sent_cleared(
        &mut self,
        env: &Env<'_>,
        mut row: SessionRow,
        working: Vec<RArc<Message>>,
    ) -> Result<usize, SessionError> {
        row.version += 1;
        let known = self.known();
        let update = self.working_update(&mut row, &working, &known);
        let dropped = self.dropped(&update.refs, &[]);
        env.store.commit(&SessionWrite {
            row: Some(&row),
            transcript: &[],
            working: &update.refs,
            new_copies: &update.new_copies,
            dropped_copies: &dropped,
            sent: None,
        })?;
        self.row = row;
        self.working = working;
        self.refs = update.refs;
        self.last_sent = None;
        self.sent = None;
        self.sent_copies = Vec::new();
        Ok(self.working.len())
    }

    /// Stores `working` as the working history with `row`, then keeps both in memory.
    /// The last sent history stays as stored.
    fn store_working(
        &mut self,
        env: &Env<'_>,
        mut row: SessionRow,
        working: Vec<RArc<Message>>,
        known: &Known,
    ) -> Result<(), SessionError> {
        row.version += 1;
        let update = self.working_update(&mut row, &working, known);
        let dropped = self.dropped(&update.refs, &self.sent_copies);
        env.store.commit(&SessionWrite {
            row: Some(&row),
            transcript: &[],
            working: &update.refs,
            new_copies: &update.new_copies,
            dropped_copies: &dropped,
            sent: self.sent.as_deref(),
        })?;
        self.row = row;
        self.working = working;
        self.refs = update.refs;
        Ok(())
    }
}

/// A message's JSON value without the stamps the host adds when it enters a session
/// (`metadata.id`, `timestamp`, `turn_added`); an emptied `metadata` goes too.
fn without_stamps(mut value: Value) -> Value {
    if let Some(object) = value.as_object_mut() {
        if let Some(Value::Object(meta)) = object.get_mut("metadata") {
            for stamp in ["id", "timestamp", "turn_added"] {
                meta.remove(stamp);
            }
            if meta.is_empty() {
                object.remove("metadata");
            }
        }
    }
    value
}

fn plugin_failed(failure: history_engine::PluginFailure) -> SessionError {
    SessionError {
        plugin: Some(failure.plugin.clone()),
        ..SessionError::new(ErrorKind::PluginFailed, failure.to_string())
    }
}
