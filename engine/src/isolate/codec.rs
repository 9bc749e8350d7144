//! The binary form of what crosses between the host and a worker (docs/chain.md#isolation):
//! messages field by field, contexts, events, models.
//!
//! Why not the wire JSON: the host's output check must see exactly the typed message the
//! plugin returned. JSON is the *caller's* format, and writing a plugin's message as JSON
//! and parsing it back does not always give the same typed message (a field the parser
//! keeps verbatim when it has an unusual form, say), so a fault could pass the check in a
//! worker that fails it in-process. Every field — and the host-only `turn` and identity
//! (`origin`) — is carried here as it is, so a round trip is the identity; it is also
//! cheaper than JSON (`cargo xtask bench` measures both, docs/chain.md#isolation).
//!
//! The types are abi_stable's (no serde), so the encoding is written out: integers little
//! endian, strings and lists prefixed by their length, options and enums by a tag byte.

use plugin_api::{
    CompactMode, Content, Context, Event, EventKind, Expiration, ExpirationMode, ExpirationOverride, Member,
    Message, Metadata, ModelInfo, Part, RArc, ROption, RString, RVec, Role, Tokenizer, ToolCall,
};

/// Bytes that do not decode: a worker (or host) that is broken or not what it claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Malformed(pub String);

pub(crate) type Decoded<T> = Result<T, Malformed>;

fn malformed<T>(what: &str) -> Decoded<T> {
    Err(Malformed(what.to_string()))
}

/// Appends values to a buffer.
#[derive(Default)]
pub(crate) struct Encoder {
    pub(crate) bytes: Vec<u8>,
}

impl Encoder {
    pub(crate) fn u8(&mut self, v: u8) {
        self.bytes.push(v);
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn bool(&mut self, v: bool) {
        self.u8(v as u8);
    }
    /// A length; lengths past `u32` cannot be sent (a frame is at most 4 GiB anyway).
    pub(crate) fn len(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
    pub(crate) fn str(&mut self, s: &str) {
        self.len(s.len());
        self.bytes.extend_from_slice(s.as_bytes());
    }
    fn opt<T>(&mut self, value: &ROption<T>, mut put: impl FnMut(&mut Self, &T)) {
        match value {
            ROption::RNone => self.u8(0),
            ROption::RSome(v) => {
                self.u8(1);
                put(self, v);
            }
        }
    }
    pub(crate) fn opt_str(&mut self, value: &ROption<RString>) {
        self.opt(value, |e, s| e.str(s));
    }
    fn opt_u64(&mut self, value: &ROption<u64>) {
        self.opt(value, |e, v| e.u64(*v));
    }
    fn opt_bool(&mut self, value: &ROption<bool>) {
        self.opt(value, |e, v| e.bool(*v));
    }
    fn members(&mut self, members: &[Member]) {
        self.len(members.len());
        for member in members {
            self.str(&member.key);
            self.str(&member.json);
        }
    }

    fn content(&mut self, content: &Content) {
        match content {
            Content::Null => self.u8(0),
            Content::Text(text) => {
                self.u8(1);
                self.str(text);
            }
            Content::Parts(parts) => {
                self.u8(2);
                self.len(parts.len());
                for part in parts.iter() {
                    match part {
                        Part::Text { text, extra } => {
                            self.u8(0);
                            self.str(text);
                            self.members(extra);
                        }
                        Part::Opaque { json } => {
                            self.u8(1);
                            self.str(json);
                        }
                    }
                }
            }
        }
    }

    fn tool_call(&mut self, call: &ToolCall) {
        self.str(&call.id);
        self.str(&call.name);
        self.str(&call.arguments);
        self.bool(call.arguments_is_json);
        self.bool(call.has_function);
        self.members(&call.extra);
        self.members(&call.function_extra);
    }

    fn expiration(&mut self, expiration: &Expiration) {
        self.opt_u64(&expiration.turns);
        self.opt(&expiration.mode, |e, m| e.u8(*m as u8));
        self.opt(&expiration.compact_mode, |e, m| e.u8(*m as u8));
        self.opt_u64(&expiration.compact_length);
        self.members(&expiration.extra);
    }

    fn metadata(&mut self, meta: &Metadata) {
        self.opt_str(&meta.id);
        self.opt_str(&meta.timestamp);
        self.opt_u64(&meta.turn_added);
        self.opt_str(&meta.message_type);
        self.opt(&meta.retention_policy, |e, policy| {
            e.len(policy.len());
            for entry in policy.iter() {
                e.opt_u64(entry);
            }
        });
        self.opt(&meta.expiration, |e, x| e.expiration(x));
        self.opt_bool(&meta.was_compacted);
        self.opt_bool(&meta.can_expand);
        self.opt_bool(&meta.is_expired);
        self.opt_bool(&meta.omitted);
        self.opt(&meta.original_content, |e, c| e.content(c));
        self.opt_u64(&meta.original_length);
        self.opt(&meta.tokens_saved, |e, v| e.i64(*v));
        self.members(&meta.extra);
    }

    /// A message, every field, with its derived turn and its identity.
    pub(crate) fn message(&mut self, message: &Message) {
        self.u8(message.role as u8);
        self.content(&message.content);
        self.len(message.tool_calls.len());
        for call in message.tool_calls.iter() {
            self.tool_call(call);
        }
        self.opt_str(&message.tool_call_id);
        self.opt_str(&message.name);
        self.opt(&message.metadata, |e, m| e.metadata(m));
        self.members(&message.extra);
        self.u64(message.turn);
        self.u64(message.origin());
    }

    pub(crate) fn model(&mut self, model: &ModelInfo) {
        self.str(&model.name);
        self.u64(model.max_context);
        self.u64(model.context_tokens);
        self.u8(model.tokenizer as u8);
        self.u64(model.effective_ctx);
    }

    /// A call's context, less its services (the worker hands its own).
    pub(crate) fn context(&mut self, ctx: &Context) {
        self.opt_str(&ctx.session_id);
        self.model(&ctx.model);
        self.u64(ctx.agent_max_ctx);
        self.u64(ctx.effective_ctx);
        self.u64(ctx.turn);
        self.opt_str(&ctx.last_active);
        self.opt(&ctx.expiration_override, |e, o| {
            e.opt_u64(&o.turns);
            e.opt(&o.mode, |e, m| e.u8(*m as u8));
            e.opt(&o.compact_mode, |e, m| e.u8(*m as u8));
            e.opt_u64(&o.compact_length);
            e.bool(o.disable_expiration);
        });
    }

    /// An event, its kind by name: a kind either side does not know still decodes
    /// ([`Decoder::event`]), so a new kind needs no change here.
    pub(crate) fn event(&mut self, event: &Event) {
        self.str(event.kind.as_str());
        self.u64(event.turn);
        self.opt_u64(&event.index);
        self.opt_str(&event.id);
        self.str(&event.reason);
        self.opt(&event.tokens_saved, |e, v| e.i64(*v));
    }
}

/// Reads values back, in the order they were encoded.
pub(crate) struct Decoder<'a> {
    bytes: &'a [u8],
}

impl<'a> Decoder<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Decoder<'a> {
        Decoder { bytes }
    }

    fn take(&mut self, n: usize) -> Decoded<&'a [u8]> {
        if self.bytes.len() < n {
            return malformed("cut short");
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    /// Whether everything was read (a frame with bytes left over is malformed).
    pub(crate) fn finish(&self) -> Decoded<()> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            malformed("bytes left over")
        }
    }

    pub(crate) fn u8(&mut self) -> Decoded<u8> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> Decoded<u32> {
        let bytes = self.take(4)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }
    pub(crate) fn u64(&mut self) -> Decoded<u64> {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(bytes))
    }
    fn i64(&mut self) -> Decoded<i64> {
        Ok(self.u64()? as i64)
    }
    pub(crate) fn bool(&mut self) -> Decoded<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => malformed("a flag that is neither 0 nor 1"),
        }
    }
    /// A length, checked against what is left (each item takes at least one byte), so a
    /// broken length cannot make the reader reserve gigabytes.
    pub(crate) fn len(&mut self) -> Decoded<usize> {
        let n = self.u32()? as usize;
        if n > self.bytes.len() {
            return malformed("a length past the end");
        }
        Ok(n)
    }
    pub(crate) fn str(&mut self) -> Decoded<&'a str> {
        let n = self.len()?;
        std::str::from_utf8(self.take(n)?).or_else(|_| malformed("text that is not UTF-8"))
    }
    pub(crate) fn string(&mut self) -> Decoded<RString> {
        Ok(self.str()?.into())
    }
    fn opt<T>(&mut self, mut get: impl FnMut(&mut Self) -> Decoded<T>) -> Decoded<ROption<T>> {
        match self.u8()? {
            0 => Ok(ROption::RNone),
            1 => Ok(ROption::RSome(get(self)?)),
            _ => malformed("an option tag that is neither 0 nor 1"),
        }
    }
    pub(crate) fn opt_str(&mut self) -> Decoded<ROption<RString>> {
        self.opt(|d| d.string())
    }
    fn opt_u64(&mut self) -> Decoded<ROption<u64>> {
        self.opt(|d| d.u64())
    }
    fn opt_bool(&mut self) -> Decoded<ROption<bool>> {
        self.opt(|d| d.bool())
    }
    fn list<T>(&mut self, mut get: impl FnMut(&mut Self) -> Decoded<T>) -> Decoded<RVec<T>> {
        let n = self.len()?;
        let mut items = RVec::with_capacity(n);
        for _ in 0..n {
            items.push(get(self)?);
        }
        Ok(items)
    }
    fn members(&mut self) -> Decoded<RVec<Member>> {
        self.list(|d| {
            Ok(Member {
                key: d.string()?,
                json: d.string()?,
            })
        })
    }

    fn content(&mut self) -> Decoded<Content> {
        Ok(match self.u8()? {
            0 => Content::Null,
            1 => Content::Text(self.string()?),
            2 => Content::Parts(self.list(|d| {
                Ok(match d.u8()? {
                    0 => Part::Text {
                        text: d.string()?,
                        extra: d.members()?,
                    },
                    1 => Part::Opaque { json: d.string()? },
                    _ => return malformed("an unknown part tag"),
                })
            })?),
            _ => return malformed("an unknown content tag"),
        })
    }

    fn tool_call(&mut self) -> Decoded<ToolCall> {
        Ok(ToolCall {
            id: self.string()?,
            name: self.string()?,
            arguments: self.string()?,
            arguments_is_json: self.bool()?,
            has_function: self.bool()?,
            extra: self.members()?,
            function_extra: self.members()?,
        })
    }

    fn expiration_mode(&mut self) -> Decoded<ExpirationMode> {
        Ok(match self.u8()? {
            0 => ExpirationMode::None,
            1 => ExpirationMode::Remove,
            2 => ExpirationMode::Compact,
            _ => return malformed("an unknown expiration mode"),
        })
    }

    fn compact_mode(&mut self) -> Decoded<CompactMode> {
        Ok(match self.u8()? {
            0 => CompactMode::FirstNChars,
            1 => CompactMode::AiSummary,
            _ => return malformed("an unknown compact mode"),
        })
    }

    fn metadata(&mut self) -> Decoded<Metadata> {
        Ok(Metadata {
            id: self.opt_str()?,
            timestamp: self.opt_str()?,
            turn_added: self.opt_u64()?,
            message_type: self.opt_str()?,
            retention_policy: self.opt(|d| d.list(|d| d.opt_u64()))?,
            expiration: self.opt(|d| {
                Ok(Expiration {
                    turns: d.opt_u64()?,
                    mode: d.opt(|d| d.expiration_mode())?,
                    compact_mode: d.opt(|d| d.compact_mode())?,
                    compact_length: d.opt_u64()?,
                    extra: d.members()?,
                })
            })?,
            was_compacted: self.opt_bool()?,
            can_expand: self.opt_bool()?,
            is_expired: self.opt_bool()?,
            omitted: self.opt_bool()?,
            original_content: self.opt(|d| d.content())?,
            original_length: self.opt_u64()?,
            tokens_saved: self.opt(|d| d.i64())?,
            extra: self.members()?,
        })
    }

    /// A message as [`Encoder::message`] wrote it.
    pub(crate) fn message(&mut self) -> Decoded<RArc<Message>> {
        let role = match self.u8()? {
            0 => Role::System,
            1 => Role::Developer,
            2 => Role::User,
            3 => Role::Assistant,
            4 => Role::Tool,
            _ => return malformed("an unknown role"),
        };
        let mut message = Message::new(role, self.content()?);
        message.tool_calls = self.list(|d| d.tool_call())?;
        message.tool_call_id = self.opt_str()?;
        message.name = self.opt_str()?;
        message.metadata = self.opt(|d| d.metadata())?;
        message.extra = self.members()?;
        message.turn = self.u64()?;
        message.set_origin(self.u64()?);
        Ok(RArc::new(message))
    }

    fn tokenizer(&mut self) -> Decoded<Tokenizer> {
        Ok(match self.u8()? {
            0 => Tokenizer::O200kBase,
            1 => Tokenizer::Cl100kBase,
            2 => Tokenizer::Chars4,
            _ => return malformed("an unknown tokenizer"),
        })
    }

    pub(crate) fn model(&mut self) -> Decoded<ModelInfo> {
        Ok(ModelInfo {
            name: self.string()?,
            max_context: self.u64()?,
            context_tokens: self.u64()?,
            tokenizer: self.tokenizer()?,
            effective_ctx: self.u64()?,
        })
    }

    /// A context as [`Encoder::context`] wrote it, with `services` handed in.
    pub(crate) fn context(&mut self, services: plugin_api::HostServicesRef) -> Decoded<Context> {
        Ok(Context {
            session_id: self.opt_str()?,
            model: self.model()?,
            agent_max_ctx: self.u64()?,
            effective_ctx: self.u64()?,
            turn: self.u64()?,
            last_active: self.opt_str()?,
            expiration_override: self.opt(|d| {
                Ok(ExpirationOverride {
                    turns: d.opt_u64()?,
                    mode: d.opt(|d| d.expiration_mode())?,
                    compact_mode: d.opt(|d| d.compact_mode())?,
                    compact_length: d.opt_u64()?,
                    disable_expiration: d.bool()?,
                })
            })?,
            services,
        })
    }

    /// An event as [`Encoder::event`] wrote it. A kind this side does not know (a worker
    /// of a newer build) is passed on as a `warning` that names it, never a broken frame:
    /// what the plugin reported still reaches the run's events and logs.
    pub(crate) fn event(&mut self) -> Decoded<Event> {
        let name = self.str()?;
        let known = EventKind::ALL.iter().copied().find(|kind| kind.as_str() == name);
        let mut event = Event {
            kind: known.unwrap_or(EventKind::Warning),
            turn: self.u64()?,
            index: self.opt_u64()?,
            id: self.opt_str()?,
            reason: self.string()?,
            tokens_saved: self.opt(|d| d.i64())?,
        };
        if known.is_none() {
            event.reason = format!(
                "an event of a kind this host does not know ({}): {}",
                plugin_api::echo::bare(name),
                event.reason
            )
            .into();
        }
        Ok(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field, including the host-only turn and identity, survives a round trip.
    fn round_trip(message: &Message) -> Message {
        let mut encoder = Encoder::default();
        encoder.message(message);
        let mut decoder = Decoder::new(&encoder.bytes);
        let back = decoder.message().unwrap();
        decoder.finish().unwrap();
        (*back).clone()
    }

    #[test]
    fn messages_come_back_field_for_field() {
        let json = r#"[
          {"role":"system","content":"s","x-custom":{"a":[1,2]},"name":null},
          {"role":"developer","content":[{"type":"text","text":"t","cache_control":{"type":"ephemeral"}},{"type":"image_url","image_url":{"url":"u"}}]},
          {"role":"user","content":"q","metadata":{"id":"m1","timestamp":"2024-01-01T00:00:00Z","turn_added":3,"message_type":"task",
            "retention_policy":[null,2],"expiration":{"turns":4,"mode":"compact","compact_mode":"first_n_chars","compact_length":10,"odd":1},
            "was_compacted":true,"can_expand":false,"is_expired":false,"omitted":true,"original_content":[{"type":"text","text":"o"}],
            "original_length":12,"tokens_saved":-5,"summary_of":["a"]}},
          {"role":"assistant","content":null,"tool_calls":[
            {"id":"c1","type":"function","function":{"name":"f","arguments":{"k":1},"strict":true}},
            {"id":"c2","function":{}}]},
          {"role":"tool","tool_call_id":"c1","name":"f","content":"r"}
        ]"#;
        let history = history_wire::chat::history_from_str(json).unwrap();
        for (i, message) in history.iter().enumerate() {
            let mut message = (**message).clone();
            message.turn = 7 + i as u64;
            message.set_origin((1 << 63) | (40 + i as u64));
            let back = round_trip(&message);
            assert_eq!(back, message, "message {i}");
            assert_eq!((back.turn, back.origin()), (message.turn, message.origin()));
            assert_eq!(
                history_wire::chat::message_to_string(&back),
                history_wire::chat::message_to_string(&message)
            );
        }
    }

    #[test]
    fn broken_bytes_are_refused_not_trusted() {
        let message = history_wire::chat::history_from_str(r#"[{"role":"user","content":"hello"}]"#).unwrap();
        let mut encoder = Encoder::default();
        encoder.message(&message[0]);
        for cut in 0..encoder.bytes.len() {
            assert!(
                Decoder::new(&encoder.bytes[..cut]).message().is_err(),
                "cut at {cut}"
            );
        }
        let mut bad_role = encoder.bytes.clone();
        bad_role[0] = 9;
        assert_eq!(
            Decoder::new(&bad_role).message().unwrap_err(),
            Malformed("an unknown role".into())
        );
        // A huge length is refused before anything is reserved.
        let mut huge = vec![2u8, 1];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Decoder::new(&huge).message().is_err());
    }

    #[test]
    fn every_event_kind_round_trips() {
        for (i, kind) in EventKind::ALL.iter().enumerate() {
            let mut event = Event::new(*kind, 9, format!("reason {i}"));
            if i % 2 == 0 {
                event = event.saving(i as i64 - 3);
                event.index = ROption::RSome(i as u64);
                event.id = ROption::RSome(format!("m{i}").into());
            }
            let mut encoder = Encoder::default();
            encoder.event(&event);
            let mut decoder = Decoder::new(&encoder.bytes);
            assert_eq!(decoder.event().unwrap(), event, "{}", kind.as_str());
            decoder.finish().unwrap();
        }
    }

    #[test]
    fn an_event_of_an_unknown_kind_is_passed_on_as_a_warning_naming_it() {
        // What a newer build's worker would send: a kind by a name this build lacks.
        let mut encoder = Encoder::default();
        encoder.str("message-translated");
        encoder.u64(4);
        encoder.u8(1);
        encoder.u64(2);
        encoder.opt_str(&ROption::RSome("m7".into()));
        encoder.str("into French");
        encoder.u8(0);
        let mut decoder = Decoder::new(&encoder.bytes);
        let event = decoder.event().unwrap();
        decoder.finish().unwrap();
        assert_eq!(event.kind, EventKind::Warning);
        assert_eq!(
            event.reason.as_str(),
            "an event of a kind this host does not know (message-translated): into French"
        );
        assert_eq!(
            (event.turn, event.index, event.id),
            (4, ROption::RSome(2), ROption::RSome("m7".into()))
        );
    }

    #[test]
    fn contexts_and_events_round_trip() {
        let ctx = Context {
            session_id: ROption::RSome("s1".into()),
            model: ModelInfo {
                name: "m".into(),
                max_context: 10,
                context_tokens: 1000,
                tokenizer: Tokenizer::Chars4,
                effective_ctx: 9,
            },
            agent_max_ctx: 200,
            effective_ctx: 9,
            turn: 4,
            last_active: ROption::RSome("2024-01-01T00:00:00Z".into()),
            expiration_override: ROption::RSome(ExpirationOverride {
                turns: ROption::RSome(2),
                mode: ROption::RSome(ExpirationMode::Remove),
                compact_mode: ROption::RSome(CompactMode::AiSummary),
                compact_length: ROption::RNone,
                disable_expiration: true,
            }),
            services: crate::services::SERVICES,
        };
        let event = Event::new(EventKind::OverBudget, 3, "why")
            .saving(-2)
            .at(1, &Message::new(Role::User, Content::Null));
        let mut encoder = Encoder::default();
        encoder.context(&ctx);
        encoder.event(&event);
        let mut decoder = Decoder::new(&encoder.bytes);
        let back = decoder.context(crate::services::SERVICES).unwrap();
        assert_eq!(
            (
                back.session_id,
                back.model,
                back.turn,
                back.last_active,
                back.expiration_override
            ),
            (
                ctx.session_id,
                ctx.model,
                ctx.turn,
                ctx.last_active,
                ctx.expiration_override
            )
        );
        assert_eq!(decoder.event().unwrap(), event);
        decoder.finish().unwrap();
    }
}
