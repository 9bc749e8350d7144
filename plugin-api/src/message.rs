//! The message types that cross the ABI boundary (docs/wire-format.md).
//!
//! Every type here is `#[repr(C)]` + `StableAbi`: changing a field is an ABI change
//! (see the crate docs). The types are *faithful*: a message parsed from JSON and
//! written back without changes is the same JSON value. Members the types do not model
//! (unknown fields, a known field spelled `null`, a lifecycle flag that is not a bool)
//! are kept verbatim in an `extra` list and written back as they came.

use std::sync::atomic::{AtomicU64, Ordering};

use abi_stable::{
    std_types::{ROption, RString, RVec},
    StableAbi,
};

/// A message's role. `developer` is treated as `system` by every rule
/// ([`Role::is_system`]) and written back as `developer`.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

impl Role {
    /// Parses a wire role name.
    pub fn parse(name: &str) -> Option<Role> {
        Some(match name {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            _ => return None,
        })
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// `system` or `developer`.
    pub fn is_system(self) -> bool {
        matches!(self, Role::System | Role::Developer)
    }
}

/// One JSON object member kept verbatim: its key and its value as compact JSON text.
///
/// A kept member named like a field the types model (`content`, `tool_calls`, a metadata
/// field, …) only ever takes a form the parser itself keeps: `null`, or a value of a type
/// the field does not hold; it is written only while the typed field is unset. A member
/// in any other form, or a key kept twice in one list, is refused by the host's output
/// check and never written (`faithful::check_faithful`).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub key: RString,
    pub json: RString,
}

/// One part of an array content.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// `{"type": "text", "text": …}`; any other members of the part are kept in `extra`.
    Text { text: RString, extra: RVec<Member> },
    /// Any other part object (image, audio, file, a reasoning block, a text part whose
    /// `text` is not a string), carried as its compact JSON text and returned unchanged.
    Opaque { json: RString },
}

impl Part {
    /// A plain text part.
    pub fn text(text: impl Into<RString>) -> Part {
        Part::Text {
            text: text.into(),
            extra: RVec::new(),
        }
    }

    /// The part's text for measuring (docs/wire-format.md#messages): the text, or an opaque part's JSON.
    pub fn measured_text(&self) -> &str {
        match self {
            Part::Text { text, .. } => text,
            Part::Opaque { json } => json,
        }
    }
}

/// A message's `content`.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// `null` or absent.
    Null,
    /// A string: one text part for retention purposes.
    Text(RString),
    /// An array of parts.
    Parts(RVec<Part>),
}

impl Content {
    /// Number of parts: a string is one part, null none.
    pub fn part_count(&self) -> usize {
        match self {
            Content::Null => 0,
            Content::Text(_) => 1,
            Content::Parts(parts) => parts.len(),
        }
    }

    /// The items measured one by one (docs/wire-format.md#messages, docs/plugins.md#token_budget): each text part as it is, each
    /// opaque part as its compact JSON text.
    pub fn items(&self) -> impl Iterator<Item = &str> {
        let (single, parts): (Option<&str>, &[Part]) = match self {
            Content::Null => (None, &[]),
            Content::Text(text) => (Some(text.as_str()), &[]),
            Content::Parts(parts) => (None, parts.as_slice()),
        };
        single.into_iter().chain(parts.iter().map(Part::measured_text))
    }

    /// The text of the content (docs/wire-format.md#messages): its items concatenated with no separator.
    pub fn text(&self) -> String {
        match self {
            Content::Text(text) => text.to_string(),
            _ => self.items().collect(),
        }
    }

    /// Length of [`Content::text`] in characters (Unicode scalar values).
    pub fn char_count(&self) -> usize {
        self.items().map(|item| item.chars().count()).sum()
    }

    /// The content as a list of parts (a string becomes one text part, null none).
    pub fn to_parts(&self) -> RVec<Part> {
        match self {
            Content::Null => RVec::new(),
            Content::Text(text) => vec![Part::text(text.clone())].into(),
            Content::Parts(parts) => parts.clone(),
        }
    }
}

/// One entry of an assistant message's `tool_calls`.
///
/// A call whose `function` has the usual shape — an object with a string `name` and
/// `arguments` that are present and not null — has `has_function`, and its function is
/// written from `name`, `arguments` and `function_extra`. Any other `function` (`{}`, a
/// null or numeric name, null or missing arguments, a value that is not an object) is
/// kept verbatim in `extra` and written back as it came: `name` and `arguments` then only
/// say what it is measured as for tokens (each string as it is, any other value as its
/// JSON text — a non-string name like non-string arguments — a missing or null one as
/// ""), `function_extra` is empty, and a plugin does not change them (the host's output
/// check refuses a call whose fields disagree with the `function` it is written with).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The call id that a `tool` message answers with its `tool_call_id`.
    pub id: RString,
    /// `function.name` (see above for a `function` of another shape).
    pub name: RString,
    /// `function.arguments`: the string itself, or the JSON text of a non-string value.
    pub arguments: RString,
    /// `arguments` was not a string on the wire and is written back as JSON.
    pub arguments_is_json: bool,
    /// The call has a `function` object of the usual shape (name and arguments above,
    /// plus `function_extra`).
    pub has_function: bool,
    /// Other members of the call, e.g. `"type": "function"`, and a `function` that is not
    /// the usual shape.
    pub extra: RVec<Member>,
    /// Other members of the usual `function` object.
    pub function_extra: RVec<Member>,
}

/// `expiration.mode` (docs/wire-format.md#metadata, docs/plugins.md#retention).
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpirationMode {
    None,
    Remove,
    Compact,
}

impl ExpirationMode {
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "none" => Self::None,
            "remove" => Self::Remove,
            "compact" => Self::Compact,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Remove => "remove",
            Self::Compact => "compact",
        }
    }
}

/// `expiration.compact_mode` (docs/wire-format.md#metadata, docs/plugins.md#retention).
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactMode {
    FirstNChars,
    AiSummary,
}

impl CompactMode {
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "first_n_chars" => Self::FirstNChars,
            "ai_summary" => Self::AiSummary,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FirstNChars => "first_n_chars",
            Self::AiSummary => "ai_summary",
        }
    }
}

/// The `expiration` metadata object.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Default)]
pub struct Expiration {
    pub turns: ROption<u64>,
    pub mode: ROption<ExpirationMode>,
    pub compact_mode: ROption<CompactMode>,
    pub compact_length: ROption<u64>,
    /// Unknown members and members spelled `null`.
    pub extra: RVec<Member>,
}

/// The `metadata` extension object (docs/wire-format.md#metadata). Every field is optional.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Default)]
pub struct Metadata {
    pub id: ROption<RString>,
    pub timestamp: ROption<RString>,
    pub turn_added: ROption<u64>,
    pub message_type: ROption<RString>,
    /// One entry per content part; `None` entries are permanent.
    pub retention_policy: ROption<RVec<ROption<u64>>>,
    pub expiration: ROption<Expiration>,
    pub was_compacted: ROption<bool>,
    pub can_expand: ROption<bool>,
    pub is_expired: ROption<bool>,
    pub omitted: ROption<bool>,
    pub original_content: ROption<Content>,
    pub original_length: ROption<u64>,
    pub tokens_saved: ROption<i64>,
    /// Unknown members, members spelled `null`, lifecycle flags that are not bools, and
    /// known members of a type the host does not check (e.g. a numeric `id`).
    pub extra: RVec<Member>,
}

fn is_true(flag: &ROption<bool>) -> bool {
    matches!(flag, ROption::RSome(true))
}

impl Metadata {
    pub fn was_compacted(&self) -> bool {
        is_true(&self.was_compacted)
    }
    pub fn can_expand(&self) -> bool {
        is_true(&self.can_expand)
    }
    pub fn is_expired(&self) -> bool {
        is_true(&self.is_expired)
    }
    pub fn omitted(&self) -> bool {
        is_true(&self.omitted)
    }
    /// `expanded: true`: the agent asked for this message's original content, so no
    /// plugin omits, compacts, expires or prunes it again. (Kept as a verbatim member
    /// rather than a typed field, so the flag needs no change of the ABI layout.)
    pub fn expanded(&self) -> bool {
        self.extra
            .iter()
            .any(|m| m.key.as_str() == "expanded" && m.json.as_str() == "true")
    }
    /// `can_expand: true` and `original_content` (unless an earlier one is there: that is
    /// the real original).
    fn keep_original(&mut self, content: &Content) {
        self.can_expand = ROption::RSome(true);
        if self.original_content.is_none() {
            self.original_content = ROption::RSome(content.clone());
        }
    }

    /// `summary_of`: the identities ([`Message::identity`]) of the messages a summary
    /// message stands for; `None` when absent or not an array of strings. (A verbatim
    /// member, like `expanded`, so it needs no change of the ABI layout.)
    pub fn summary_of(&self) -> Option<Vec<String>> {
        let member = self.extra.iter().find(|m| m.key.as_str() == "summary_of")?;
        serde_json::from_str::<Vec<String>>(member.json.as_str()).ok()
    }

    /// Sets `summary_of`, replacing any earlier one.
    pub fn set_summary_of(&mut self, ids: &[String]) {
        self.extra.retain(|m| m.key.as_str() != "summary_of");
        self.extra.push(Member {
            key: "summary_of".into(),
            json: serde_json::to_string(ids).unwrap_or_else(|_| "[]".into()).into(),
        });
    }

    /// Sets `expanded: true`, replacing any earlier `expanded` member.
    pub fn set_expanded(&mut self) {
        self.extra.retain(|m| m.key.as_str() != "expanded");
        self.extra.push(Member {
            key: "expanded".into(),
            json: "true".into(),
        });
    }
}

/// Token counts remembered on a message, one slot per tokenizer (0 = not counted yet,
/// otherwise count + 1). It is a cache: the host fills it, a clone starts empty, and it
/// never takes part in equality or in the wire format.
#[repr(C)]
#[derive(StableAbi)]
pub struct TokenMemo {
    slots: [AtomicU64; 3],
}

impl TokenMemo {
    const fn new() -> Self {
        TokenMemo {
            slots: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
        }
    }
    /// The remembered count for tokenizer slot `slot`.
    pub fn get(&self, slot: usize) -> Option<u64> {
        match self.slots.get(slot)?.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n - 1),
        }
    }
    /// Remembers a count for tokenizer slot `slot`.
    pub fn set(&self, slot: usize, count: u64) {
        if let Some(cell) = self.slots.get(slot) {
            cell.store(count.saturating_add(1), Ordering::Relaxed);
        }
    }
}

impl Default for TokenMemo {
    fn default() -> Self {
        TokenMemo::new()
    }
}

impl std::fmt::Debug for TokenMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenMemo")
    }
}

/// One conversation message (docs/wire-format.md#messages) plus the host-derived data of docs/wire-format.md#turns.
///
/// Histories cross the boundary as `RArc<Message>`: to pass a message through, clone the
/// `RArc` (no content is copied). To change one, clone the `Message` (`(*msg).clone()`),
/// edit the copy and wrap it in a new `RArc`: the copy keeps the original's `turn` and
/// identity, which is how the host's output check knows it is a changed copy and not an
/// invented message.
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct Message {
    pub role: Role,
    pub content: Content,
    /// Tool calls of an assistant message (empty when it has none).
    pub tool_calls: RVec<ToolCall>,
    pub tool_call_id: ROption<RString>,
    pub name: ROption<RString>,
    pub metadata: ROption<Metadata>,
    /// Unknown members, and known members kept verbatim (see the module docs).
    pub extra: RVec<Member>,
    /// The turn this message belongs to, derived by the host once per chain run
    /// (docs/wire-format.md#turns). Read it; do not re-derive. Never written to the wire.
    pub turn: u64,
    origin: u64,
    memo: TokenMemo,
}

impl Clone for Message {
    fn clone(&self) -> Self {
        Message {
            role: self.role,
            content: self.content.clone(),
            tool_calls: self.tool_calls.clone(),
            tool_call_id: self.tool_call_id.clone(),
            name: self.name.clone(),
            metadata: self.metadata.clone(),
            extra: self.extra.clone(),
            turn: self.turn,
            origin: self.origin,
            // A copy is usually about to change: its counts are recomputed on demand.
            memo: TokenMemo::new(),
        }
    }
}

/// Equality of what goes on the wire (role, content, calls, ids, name, metadata,
/// extra members); the turn, identity and token cache are not compared.
impl PartialEq for Message {
    fn eq(&self, other: &Self) -> bool {
        self.role == other.role
            && self.content == other.content
            && self.tool_calls == other.tool_calls
            && self.tool_call_id == other.tool_call_id
            && self.name == other.name
            && self.metadata == other.metadata
            && self.extra == other.extra
    }
}

impl Message {
    /// A new message with no calls, ids, metadata or identity.
    ///
    /// The host's output check refuses a message that is neither an input message, a
    /// changed copy or merge of one, nor a placeholder result made with
    /// [`Message::placeholder_result`]; a plugin derives new messages from old ones.
    pub fn new(role: Role, content: Content) -> Message {
        Message {
            role,
            content,
            tool_calls: RVec::new(),
            tool_call_id: ROption::RNone,
            name: ROption::RNone,
            metadata: ROption::RNone,
            extra: RVec::new(),
            turn: 0,
            origin: 0,
            memo: TokenMemo::new(),
        }
    }

    /// A `tool` message answering `call_id` of the assistant message `call` with
    /// `content`; it takes the turn (and identity) of its call (docs/wire-format.md#turns).
    pub fn placeholder_result(call: &Message, call_id: &str, content: &str) -> Message {
        let mut message = Message::new(Role::Tool, Content::Text(content.into()));
        message.tool_call_id = ROption::RSome(call_id.into());
        message.turn = call.turn;
        message.origin = call.origin;
        message
    }

    /// A changed copy of this message whose content is `placeholder`, marked as a
    /// placeholder (`omitted: true`, `tokens_saved`) so nothing replaces, expires or
    /// prunes it again; its `retention_policy` goes with the parts it described. With
    /// `keep_original` it also gets `can_expand: true` and `original_content` (an earlier
    /// `original_content` is kept: it is the real original that expansion restores).
    pub fn omitted_copy(&self, placeholder: &str, tokens_saved: i64, keep_original: bool) -> Message {
        let mut copy = self.clone();
        copy.content = Content::Text(placeholder.into());
        let meta = copy.meta_mut();
        meta.omitted = ROption::RSome(true);
        meta.tokens_saved = ROption::RSome(tokens_saved);
        meta.retention_policy = ROption::RNone;
        if keep_original {
            meta.keep_original(&self.content);
        }
        copy
    }

    /// A changed copy of this message whose content is `text`, the compaction of content
    /// `original_length` characters long: `was_compacted` and `is_expired` set,
    /// `original_length`, `tokens_saved` (from `tokens_saved(&copy)`: the caller counts
    /// the copy's tokens), no `retention_policy`; with `keep_original` also `can_expand`
    /// and `original_content`, as [`Message::omitted_copy`].
    pub fn compacted_copy(
        &self,
        text: String,
        original_length: u64,
        keep_original: bool,
        tokens_saved: impl FnOnce(&Message) -> i64,
    ) -> Message {
        let mut copy = self.clone();
        copy.content = Content::Text(text.into());
        let saved = tokens_saved(&copy);
        let meta = copy.meta_mut();
        meta.was_compacted = ROption::RSome(true);
        meta.is_expired = ROption::RSome(true);
        meta.original_length = ROption::RSome(original_length);
        meta.tokens_saved = ROption::RSome(saved);
        meta.retention_policy = ROption::RNone;
        if keep_original {
            meta.keep_original(&self.content);
        }
        copy
    }

    /// A changed copy of this message with its original content restored: what
    /// expansion makes. `None` when the message cannot be expanded (no `can_expand`, or
    /// no `original_content`). The flags that said it was shortened become `false`,
    /// `original_content` goes, and `expanded: true` is set, so no plugin shortens it again.
    pub fn restored_copy(&self) -> Option<Message> {
        let meta = self.meta()?;
        if !meta.can_expand() {
            return None;
        }
        let original = meta.original_content.as_ref().into_option()?.clone();
        let mut copy = self.clone();
        copy.content = original;
        let meta = copy.meta_mut();
        meta.was_compacted = ROption::RSome(false);
        meta.omitted = ROption::RSome(false);
        meta.can_expand = ROption::RSome(false);
        meta.original_content = ROption::RNone;
        // A member kept verbatim under the same key would come back on the wire once the
        // typed field is gone.
        meta.extra.retain(|m| m.key.as_str() != "original_content");
        meta.set_expanded();
        Some(copy)
    }

    /// The host-assigned identity shared by a message and its changed copies
    /// (0 for a message the host has not seen).
    pub fn origin(&self) -> u64 {
        self.origin
    }

    /// Sets the identity. Only the host does this, when a message enters a chain run.
    #[doc(hidden)]
    pub fn set_origin(&mut self, origin: u64) {
        self.origin = origin;
    }

    /// The token cache (see [`TokenMemo`]); used by the host's token counter.
    #[doc(hidden)]
    pub fn token_memo(&self) -> &TokenMemo {
        &self.memo
    }

    /// The metadata, if any.
    pub fn meta(&self) -> Option<&Metadata> {
        self.metadata.as_ref().into_option()
    }

    /// The metadata, created empty when absent.
    pub fn meta_mut(&mut self) -> &mut Metadata {
        if self.metadata.is_none() {
            self.metadata = ROption::RSome(Metadata::default());
        }
        match &mut self.metadata {
            ROption::RSome(meta) => meta,
            ROption::RNone => unreachable!("metadata was just set"),
        }
    }

    /// `metadata.id`.
    pub fn id(&self) -> Option<&str> {
        self.meta()
            .and_then(|m| m.id.as_ref().into_option())
            .map(|s| s.as_str())
    }

    /// The identity a summary's `summary_of` names this message by: its `metadata.id`, or
    /// when it has none `#` and its host-assigned identity (stable within a session, where
    /// it is the transcript position; within one run for a stateless call).
    pub fn identity(&self) -> String {
        match self.id() {
            Some(id) => id.to_string(),
            None => format!("#{}", self.origin),
        }
    }

    /// `tool_call_id`.
    pub fn call_id(&self) -> Option<&str> {
        self.tool_call_id.as_ref().into_option().map(|s| s.as_str())
    }

    /// True when `metadata.<flag>` is `true` for any of `omitted`, `was_compacted` or
    /// `is_expired`: the message was already shortened by a plugin.
    pub fn is_shortened(&self) -> bool {
        self.meta()
            .is_some_and(|m| m.omitted() || m.was_compacted() || m.is_expired())
    }

    /// True when `metadata.expanded` is `true`: expanded on purpose, never shortened again.
    pub fn is_expanded(&self) -> bool {
        self.meta().is_some_and(|m| m.expanded())
    }

    /// An assistant message with at least one tool call.
    pub fn has_tool_calls(&self) -> bool {
        self.role == Role::Assistant && !self.tool_calls.is_empty()
    }

    /// The items counted by a tokenizer (docs/plugins.md#token_budget): each text part, each opaque part's
    /// JSON text, each tool call's function name and arguments string (for a `function`
    /// that is not the usual shape, what [`ToolCall`] says it is measured as).
    pub fn token_items(&self) -> impl Iterator<Item = &str> {
        self.content.items().chain(
            self.tool_calls
                .iter()
                .flat_map(|call| [call.name.as_str(), call.arguments.as_str()]),
        )
    }
}
