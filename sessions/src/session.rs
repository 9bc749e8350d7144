//! One session in memory and the operations on it: a turn, a model switch, `/clear`,
//! an expansion. Each runs on a blocking thread, holds the session's lock, and either
//! commits one store transaction and then changes the session in memory, or changes
//! nothing at all.

use std::collections::HashMap;

use history_engine::expand::{self, Target};
use history_engine::{stateless_context, turns, Call, Chain, ChainRun, Config};
use plugin_api::wire::{message_to_string, parse_message};
use plugin_api::{
    CompactMode, Content, Context, Event, ExpirationMode, ExpirationOverride, Message, ModelInfo, Part, RArc,
    ROption, RVec, Role, Tokenizer,
};
use serde_json::Value;

use crate::clock::rfc3339;
use crate::error::{ErrorKind, SessionError};
use crate::store::{
    decode_sent, encode_sent, CopyRow, HostCopy, SentEntry, SessionRow, SessionWrite, Store, StoredMessage,
    StoredSession, TokenCounts, TranscriptRow, WorkingRef,
};

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

/// One `context` item of a turn (docs/http-api.md): text added to the turn's newest user
/// message, in what is sent only (`display`) or stored too (`save`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextItem {
    pub text: String,
    /// `None`: display only; `Some(None)`: saved and kept; `Some(Some(n))`: saved with
    /// retention policy `n`.
    pub save: Option<Option<u64>>,
}

impl ContextItem {
    /// Parses a turn's `context` list; errors name the item and member.
    pub fn parse_list(value: &Value) -> Result<Vec<ContextItem>, SessionError> {
        let Value::Array(items) = value else {
            return Err(SessionError::bad_input(
                "context: expected an array of {text, display, save}",
            ));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let bad = |what: String| SessionError::bad_input(format!("context {i}: {what}"));
                let Value::Object(item) = item else {
                    return Err(bad("expected an object {text, display, save}".into()));
                };
                let mut text = None;
                let mut display = false;
                let mut save = None;
                for (key, value) in item {
                    match (key.as_str(), value) {
                        ("text", Value::String(s)) => text = Some(s.clone()),
                        ("display", Value::Bool(b)) => display = *b,
                        ("save", Value::Bool(true)) => save = Some(None),
                        ("save", Value::Bool(false)) | ("save", Value::Null) => save = None,
                        ("save", Value::Number(n)) if n.as_u64().is_some() => save = Some(n.as_u64()),
                        ("text" | "display" | "save", other) => {
                            return Err(bad(format!("{key}: unexpected value {other}")))
                        }
                        (other, _) => {
                            return Err(bad(format!(
                                "unknown member \"{other}\" (expected text, display, save)"
                            )))
                        }
                    }
                }
                let text = text.ok_or_else(|| bad("missing \"text\"".into()))?;
                if !display && save.is_none() {
                    return Err(bad("neither display nor save: the item would go nowhere".into()));
                }
                Ok(ContextItem { text, save })
            })
            .collect()
    }
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

    /// A session as stored: its working history's messages get their transcript
    /// identities back.
    pub fn from_stored(stored: StoredSession) -> Result<Session, SessionError> {
        Session::from_stored_reusing(stored, None)
    }

    /// [`Session::from_stored`], taking from `earlier` (this session as this host last
    /// had it, before another host changed it) every message the stored histories still
    /// reference: a transcript message or a stored copy never changes under its
    /// reference (the transcript is append-only, a copy gets a new key), so only what is
    /// new since is parsed — and, read with [`Session::host_copy`], only that is read
    /// (docs/scaling-out.md#what-is-shared-what-each-host-keeps).
    pub fn from_stored_reusing(
        stored: StoredSession,
        earlier: Option<&Session>,
    ) -> Result<Session, SessionError> {
        let held = earlier.map(Session::held_messages).unwrap_or_default();
        let missing = |what: &str, r: &WorkingRef| {
            SessionError::new(
                ErrorKind::Store,
                format!("{what} {r:?} was neither read from the store nor held by this host"),
            )
        };
        let mut working = Vec::with_capacity(stored.working.len());
        let mut refs = Vec::with_capacity(stored.working.len());
        for stored_message in stored.working {
            let StoredMessage {
                reference,
                seq,
                text,
                tokens,
            } = stored_message;
            if let Some(&message) = held.get(&reference) {
                working.push(message.clone());
                refs.push(reference);
                continue;
            }
            let text = text.ok_or_else(|| missing("working history entry", &reference))?;
            let value: Value = serde_json::from_str(&text).map_err(|e| {
                SessionError::new(ErrorKind::Store, format!("stored message is not JSON: {e}"))
            })?;
            let mut message = parse_message(&value)
                .map_err(|e| SessionError::new(ErrorKind::Store, format!("stored message: {e}")))?;
            if let Some(seq) = seq {
                message.set_origin(seq);
            }
            // Counted before it was stored: not tokenized again.
            give_token_counts(&tokens, &message);
            working.push(RArc::new(message));
            refs.push(reference);
        }
        turns::prepare(&mut working, stored.row.turn.max(1));
        let (sent, last_sent, sent_copies) = match stored.sent {
            Some((encoded, texts)) => {
                let entries = decode_sent(&encoded)?;
                // A sent message that is a working one is that very message, as before
                // the session was stored: shared, not parsed a second time.
                let in_working: HashMap<WorkingRef, &RArc<Message>> =
                    refs.iter().copied().zip(&working).collect();
                let mut messages = Vec::with_capacity(texts.len());
                for (entry, text) in entries.iter().zip(texts) {
                    if let SentEntry::Ref(reference) = entry {
                        if let Some(&message) = in_working.get(reference).or_else(|| held.get(reference)) {
                            messages.push(message.clone());
                            continue;
                        }
                    }
                    let text = match (entry, text) {
                        (_, Some(text)) => text,
                        (SentEntry::Ref(reference), None) => {
                            return Err(missing("sent history entry", reference))
                        }
                        (SentEntry::Inline(text), None) => text.clone(),
                    };
                    let value: Value = serde_json::from_str(&text).map_err(|e| {
                        SessionError::new(ErrorKind::Store, format!("stored sent message is not JSON: {e}"))
                    })?;
                    let message = parse_message(&value).map_err(|e| {
                        SessionError::new(ErrorKind::Store, format!("stored sent message: {e}"))
                    })?;
                    messages.push(RArc::new(message));
                }
                let copies = copies_of(&entries);
                (Some(encoded), Some(messages), copies)
            }
            None => (None, None, Vec::new()),
        };
        Ok(Session {
            row: stored.row,
            working,
            refs,
            last_sent,
            sent,
            sent_copies,
        })
    }

    /// The messages this session holds under a store reference: its working history's,
    /// and its last sent history's that are references.
    fn held_messages(&self) -> HashMap<WorkingRef, &RArc<Message>> {
        let mut held: HashMap<WorkingRef, &RArc<Message>> =
            self.refs.iter().copied().zip(&self.working).collect();
        for (reference, message) in self.sent_references() {
            held.entry(reference).or_insert(message);
        }
        held
    }

    /// The last sent history's messages that are store references, with them.
    fn sent_references(&self) -> impl Iterator<Item = (WorkingRef, &RArc<Message>)> {
        let entries = match (&self.sent, &self.last_sent) {
            (Some(encoded), Some(_)) => decode_sent(encoded).unwrap_or_default(),
            _ => Vec::new(),
        };
        entries
            .into_iter()
            .zip(self.last_sent.iter().flatten())
            .filter_map(|(entry, message)| match entry {
                SentEntry::Ref(reference) => Some((reference, message)),
                SentEntry::Inline(_) => None,
            })
    }

    /// What this host holds of the session, for [`Store::lock`]: a read-back after
    /// another host's change sends only the messages not among these (the references of
    /// [`Session::held_messages`], repeats and all).
    pub fn host_copy(&self) -> HostCopy {
        let sent = self.sent_references().map(|(reference, _)| reference);
        HostCopy {
            version: self.row.version,
            refs: self.refs.iter().copied().chain(sent).collect(),
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
        let working: std::collections::HashSet<usize> = self.working.iter().map(address).collect();
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
        let new = env.config.model(name);
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
        let mut known = self.known();
        for (offset, message) in entering.iter().enumerate() {
            known
                .entry(message.origin())
                .or_default()
                .push((message.clone(), WorkingRef::Transcript(first_seq + offset as u64)));
        }
        history.extend(entering.iter().cloned());
        let ctx = self.context(env, model.clone(), turn)?;
        let mut run = env
            .chain
            .run_compared(history, &ctx, Call::Process, self.last_sent.as_deref())
            .map_err(plugin_failed)?;
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
        Ok(TurnOutcome {
            turn,
            model,
            run,
            switch,
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
        for (index, row) in transcript.iter().enumerate() {
            let stored: Value = serde_json::from_str(&row.message).map_err(|e| {
                SessionError::new(ErrorKind::Store, format!("stored message is not JSON: {e}"))
            })?;
            if without_stamps(stored) != without_stamps(messages[index].clone()) {
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

    /// `/clear`: the working history becomes empty; the transcript keeps everything.
    pub fn clear(&mut self, env: &Env<'_>) -> Result<(), SessionError> {
        let mut row = self.row.clone();
        row.cleared_at = row.transcript_len;
        row.last_active = env.now;
        self.last_sent_cleared(env, row)
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

    /// `/clear`'s store write: an empty working history and no sent history.
    fn last_sent_cleared(&mut self, env: &Env<'_>, mut row: SessionRow) -> Result<(), SessionError> {
        row.version += 1;
        let dropped = self.dropped(&[], &[]);
        env.store.commit(&SessionWrite {
            row: Some(&row),
            dropped_copies: &dropped,
            sent: None,
            ..Default::default()
        })?;
        self.row = row;
        self.working = Vec::new();
        self.refs = Vec::new();
        self.last_sent = None;
        self.sent = None;
        self.sent_copies = Vec::new();
        Ok(())
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

    /// The stored working history's messages by identity, with their store entries.
    fn known(&self) -> Known {
        let mut known: Known = HashMap::with_capacity(self.working.len());
        for (message, reference) in self.working.iter().zip(&self.refs) {
            known
                .entry(message.origin())
                .or_default()
                .push((message.clone(), *reference));
        }
        known
    }

    /// What storing `working` writes: a message that is (byte for byte) one the store has
    /// keeps its entry; any other becomes a new copy.
    fn working_update(
        &self,
        row: &mut SessionRow,
        working: &[RArc<Message>],
        known: &Known,
    ) -> WorkingUpdate {
        let mut refs = Vec::with_capacity(working.len());
        let mut new_copies = Vec::new();
        for message in working {
            let found = known.get(&message.origin()).and_then(|candidates| {
                candidates
                    .iter()
                    .find(|(m, _)| std::ptr::eq::<Message>(&**m, &**message) || **m == **message)
                    .map(|(_, r)| *r)
            });
            let reference = match found {
                Some(r) => r,
                None => {
                    let key = row.next_copy;
                    row.next_copy += 1;
                    let origin = message.origin();
                    new_copies.push(CopyRow {
                        key,
                        seq: (origin != 0 && origin <= row.transcript_len).then_some(origin),
                        message: message_to_string(message),
                        tokens: token_counts(message),
                    });
                    WorkingRef::Copy(key)
                }
            };
            refs.push(reference);
        }
        WorkingUpdate { refs, new_copies }
    }

    /// The copies stored now that neither the new working history (`refs`) nor the sent
    /// history to be stored (`sent_copies`) uses: dropped by the same write.
    fn dropped(&self, refs: &[WorkingRef], sent_copies: &[u64]) -> Vec<u64> {
        let copies = |refs: &[WorkingRef]| {
            refs.iter()
                .filter_map(|r| match r {
                    WorkingRef::Copy(k) => Some(*k),
                    WorkingRef::Transcript(_) => None,
                })
                .collect::<Vec<u64>>()
        };
        let kept: std::collections::HashSet<u64> = copies(refs)
            .into_iter()
            .chain(sent_copies.iter().copied())
            .collect();
        let mut dropped: Vec<u64> = copies(&self.refs)
            .into_iter()
            .chain(self.sent_copies.iter().copied())
            .filter(|k| !kept.contains(k))
            .collect();
        dropped.sort_unstable();
        dropped.dedup();
        dropped
    }
}

/// The sent history as stored: a message that is one of the working history's (the same
/// message, or the same bytes) is its entry; any other (changed by a view stage, or by
/// the turn's display context) is stored whole.
fn sent_entries(sent: &[RArc<Message>], working: &[RArc<Message>], refs: &[WorkingRef]) -> Vec<SentEntry> {
    let mut by_origin: Known = HashMap::with_capacity(working.len());
    for (message, reference) in working.iter().zip(refs) {
        by_origin
            .entry(message.origin())
            .or_default()
            .push((message.clone(), *reference));
    }
    sent.iter()
        .map(|message| {
            by_origin
                .get(&message.origin())
                .and_then(|candidates| {
                    candidates
                        .iter()
                        .find(|(m, _)| std::ptr::eq::<Message>(&**m, &**message) || **m == **message)
                })
                .map_or_else(
                    || SentEntry::Inline(message_to_string(message)),
                    |(_, r)| SentEntry::Ref(*r),
                )
        })
        .collect()
}

/// The token counts `message` remembers, as the store keeps them beside it: a count is
/// the tokens of the message's items, which depend on its text alone, so a host reading
/// the message back takes it instead of tokenizing again (docs/sessions.md#the-store).
fn token_counts(message: &Message) -> TokenCounts {
    let memo = message.token_memo();
    let pairs: Vec<String> = Tokenizer::ALL
        .iter()
        .filter_map(|t| memo.get(t.slot()).map(|count| format!("{}:{count}", t.as_str())))
        .collect();
    TokenCounts((!pairs.is_empty()).then(|| pairs.join(",")))
}

/// Gives `message`, read back, the counts stored with it. What does not read as a count
/// is left out: they are a cache, and the message is counted again.
fn give_token_counts(counts: &TokenCounts, message: &Message) {
    let Some(text) = &counts.0 else { return };
    for pair in text.split(',') {
        let Some((name, count)) = pair.split_once(':') else {
            continue;
        };
        if let (Some(tokenizer), Ok(count)) = (Tokenizer::parse(name), count.parse::<u64>()) {
            message.token_memo().set(tokenizer.slot(), count);
        }
    }
}

/// The working copies a stored sent history references.
fn copies_of(entries: &[SentEntry]) -> Vec<u64> {
    let mut copies: Vec<u64> = entries
        .iter()
        .filter_map(|e| match e {
            SentEntry::Ref(WorkingRef::Copy(k)) => Some(*k),
            _ => None,
        })
        .collect();
    copies.sort_unstable();
    copies.dedup();
    copies
}

type Known = HashMap<u64, Vec<(RArc<Message>, WorkingRef)>>;

struct WorkingUpdate {
    refs: Vec<WorkingRef>,
    new_copies: Vec<CopyRow>,
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

/// Adds the `save` items as text parts to the stored message; with any, every part gets
/// a retention policy (the original parts `null`).
fn add_saved_context(message: &mut Message, items: &[ContextItem]) {
    let saved: Vec<&ContextItem> = items.iter().filter(|i| i.save.is_some()).collect();
    if saved.is_empty() {
        return;
    }
    let mut parts: Vec<Part> = message.content.to_parts().into_iter().collect();
    let original = parts.len();
    let mut policy: Vec<ROption<u64>> = match message
        .meta()
        .and_then(|m| m.retention_policy.as_ref().into_option())
    {
        Some(p) if p.len() == original => p.iter().cloned().collect(),
        _ => vec![ROption::RNone; original],
    };
    for item in saved {
        parts.push(Part::text(item.text.as_str()));
        policy.push(item.save.flatten().into());
    }
    message.content = Content::Parts(parts.into_iter().collect());
    message.meta_mut().retention_policy = ROption::RSome(policy.into_iter().collect::<RVec<_>>());
}

/// Adds the `display` items as text parts to the message `origin` of the sent history.
fn add_display_context(sent: &mut [RArc<Message>], origin: u64, items: &[ContextItem]) {
    let shown: Vec<&ContextItem> = items.iter().filter(|i| i.save.is_none()).collect();
    if shown.is_empty() {
        return;
    }
    let Some(message) = sent
        .iter_mut()
        .rev()
        .find(|m| m.origin() == origin && m.role == Role::User)
    else {
        return;
    };
    let mut copy = (**message).clone();
    let mut parts: Vec<Part> = copy.content.to_parts().into_iter().collect();
    let had_policy = copy
        .meta()
        .and_then(|m| m.retention_policy.as_ref().into_option())
        .is_some_and(|p| p.len() == parts.len());
    for item in &shown {
        parts.push(Part::text(item.text.as_str()));
    }
    if had_policy {
        let meta = copy.meta_mut();
        if let ROption::RSome(policy) = &mut meta.retention_policy {
            for _ in &shown {
                policy.push(ROption::RNone);
            }
        }
    }
    copy.content = Content::Parts(parts.into_iter().collect());
    *message = RArc::new(copy);
}

/// A session's expiration override from JSON: the keys of `[plugin.retention.override]`
/// (docs/plugins.md).
pub fn parse_override(value: &Value) -> Result<ExpirationOverride, SessionError> {
    let bad = |what: String| SessionError::bad_input(format!("expiration_override: {what}"));
    let Value::Object(object) = value else {
        return Err(bad("expected an object".into()));
    };
    let mut o = ExpirationOverride::default();
    for (key, value) in object {
        match key.as_str() {
            "turns" => {
                o.turns = ROption::RSome(
                    value
                        .as_u64()
                        .ok_or_else(|| bad("turns: expected an integer ≥ 0".into()))?,
                )
            }
            "compact_length" => {
                o.compact_length = ROption::RSome(
                    value
                        .as_u64()
                        .ok_or_else(|| bad("compact_length: expected an integer ≥ 0".into()))?,
                )
            }
            "mode" => {
                o.mode = ROption::RSome(
                    value
                        .as_str()
                        .and_then(ExpirationMode::parse)
                        .ok_or_else(|| bad("mode: expected none, remove or compact".into()))?,
                )
            }
            "compact_mode" => {
                o.compact_mode = ROption::RSome(
                    value
                        .as_str()
                        .and_then(CompactMode::parse)
                        .ok_or_else(|| bad("compact_mode: expected first_n_chars or ai_summary".into()))?,
                )
            }
            "disable_expiration" => {
                o.disable_expiration = value
                    .as_bool()
                    .ok_or_else(|| bad("disable_expiration: expected a boolean".into()))?
            }
            other => return Err(bad(format!("unknown key \"{other}\""))),
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_counts_are_stored_by_tokenizer_name_and_a_bad_pair_is_left_out() {
        let message = || parse_message(&serde_json::json!({"role": "user", "content": "hi"})).unwrap();
        let counted = message();
        assert_eq!(token_counts(&counted), TokenCounts(None), "nothing counted yet");
        counted.token_memo().set(Tokenizer::O200kBase.slot(), 5);
        counted.token_memo().set(Tokenizer::Chars4.slot(), 1);
        let stored = token_counts(&counted);
        assert_eq!(stored.0.as_deref(), Some("o200k_base:5,chars4:1"));

        let read_back = message();
        give_token_counts(&stored, &read_back);
        assert_eq!(token_counts(&read_back), stored);

        let damaged = message();
        give_token_counts(
            &TokenCounts(Some("o200k_base:5,bogus:3,cl100k_base:x,chars4".into())),
            &damaged,
        );
        assert_eq!(token_counts(&damaged).0.as_deref(), Some("o200k_base:5"));
    }
}
