"""The plugin's side of protocol 1 (docs/process-plugins.md#the-protocol)."""

import json
import sys
import traceback

PROTOCOL = 1

EVENT_KINDS = {
    "message-expired", "message-compacted", "message-removed", "message-omitted",
    "message-merged", "message-expanded", "over-budget", "warning", "message-changed",
    "message-summarized",
}


class ConfigError(Exception):
    """Raised by ``Plugin.validate`` to refuse the plugin's ``[plugin.NAME]`` table."""

    def __init__(self, key, message):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


class Model:
    """A model's settings, as the host sends them."""

    def __init__(self, data):
        self.name = data.get("name", "")
        self.max_context = data.get("max_context", 0)
        self.context_tokens = data.get("context_tokens", 0)
        self.tokenizer = data.get("tokenizer", "")
        self.effective_ctx = data.get("effective_ctx", 0)


class Context:
    """A call's context: the model, the turn, the budgets."""

    def __init__(self, data):
        self.session_id = data.get("session_id")
        self.model = Model(data.get("model", {}))
        self.agent_max_ctx = data.get("agent_max_ctx", 0)
        self.effective_ctx = data.get("effective_ctx", 0)
        self.turn = data.get("turn", 0)
        self.last_active = data.get("last_active")
        self.per_message_tokens = data.get("per_message_tokens", 3)
        self.old_model = Model(data["old_model"]) if "old_model" in data else None
        self.new_model = Model(data["new_model"]) if "new_model" in data else None


class Message:
    """One message of the history: its JSON object in the host's wire format
    (``data``), its place in the call's input (``index``) and its tokens as the host
    counted them. A message returned as it came is sent back by index; one made with
    :meth:`changed` says which input message it came from; one made with
    :meth:`Message.new` is new."""

    def __init__(self, data, index=None, tokens=0, source=None):
        self.data = data
        self.index = index
        self.tokens = tokens
        # The input message a changed copy comes from (its index), or None.
        self.source = source

    @classmethod
    def new(cls, role, content, **members):
        """A message the plugin makes up (the output check refuses most of these:
        a plugin derives new messages from old ones)."""
        data = {"role": role, "content": content}
        data.update(members)
        return cls(data)

    @property
    def role(self):
        return self.data.get("role")

    @property
    def metadata(self):
        return self.data.get("metadata") or {}

    @property
    def tool_calls(self):
        return self.data.get("tool_calls") or []

    @property
    def tool_call_id(self):
        return self.data.get("tool_call_id")

    def text(self):
        """The message's text: its string content, or its text parts joined."""
        content = self.data.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        return ""

    def changed(self, **members):
        """A changed copy: the same message with ``members`` replaced (``content=...``).
        It keeps this message's identity, so the host knows what it is a copy of."""
        data = json.loads(json.dumps(self.data))
        data.update(members)
        origin = self.index if self.source is None else self.source
        return Message(data, None, 0, origin)

    def map_text(self, fn):
        """A changed copy with ``fn`` applied to every text: the string content or each
        text part (tool calls' arguments are left as they are)."""
        content = self.data.get("content")
        if isinstance(content, str):
            return self.changed(content=fn(content))
        if isinstance(content, list):
            parts = [dict(p, text=fn(p["text"])) if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) else p for p in content]
            return self.changed(content=parts)
        return self

    def __repr__(self):
        return f"Message({self.data!r}, index={self.index})"


class Event:
    """What a plugin did, for the host's log and the turn's report."""

    def __init__(self, kind, reason, index=None, id=None, tokens_saved=None):
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r} (known: {', '.join(sorted(EVENT_KINDS))})")
        self.kind = kind
        self.reason = reason
        self.index = index
        self.id = id
        self.tokens_saved = tokens_saved

    def to_json(self):
        out = {"kind": self.kind, "reason": self.reason}
        for key in ("index", "id", "tokens_saved"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


class Result:
    """What ``process`` may return instead of a bare list: the history and events."""

    def __init__(self, messages, events=()):
        self.messages = list(messages)
        self.events = list(events)


class Plugin:
    """Subclass it; set ``name`` and ``version``; define ``process``."""

    name = "plugin"
    version = "0.1.0"

    def validate(self, config, agent_max_ctx, models):
        """Checks the plugin's ``[plugin.NAME]`` table (a dict); raise ConfigError to
        refuse it. Keep what you need on ``self``."""
        self.config = config

    def process(self, messages, ctx):
        """Returns the new history: a list of Messages (or a Result with events)."""
        return messages

    def on_model_switch(self, messages, ctx):
        """Called instead of ``process`` when the session's model changes
        (``ctx.old_model`` and ``ctx.new_model``)."""
        return self.process(messages, ctx)


def encode_result(call_id, answer):
    """The ``result`` line's object for ``answer`` (a list of Messages or a Result):
    unchanged input messages by index, changed copies with ``from``, new ones bare."""
    if not isinstance(answer, Result):
        answer = Result(answer)
    history = []
    for message in answer.messages:
        if not isinstance(message, Message):
            raise TypeError(f"process returned {type(message).__name__}, not a Message")
        if message.index is not None:
            history.append(message.index)
        elif message.source is not None:
            history.append({"from": message.source, "message": message.data})
        else:
            history.append({"message": message.data})
    return {
        "type": "result",
        "id": call_id,
        "history": history,
        "events": [e.to_json() for e in answer.events],
    }


def messages_of(call):
    tokens = call.get("tokens") or []
    return [
        Message(data, i, tokens[i] if i < len(tokens) else 0)
        for i, data in enumerate(call.get("messages", []))
    ]


def _write(out, obj):
    out.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))
    out.write("\n")
    out.flush()


def log(message, level="info"):
    """A line in the host's log under the plugin's name (stdout is the protocol's: use
    this or stderr, never print)."""
    _write(sys.stdout, {"type": "log", "level": level, "message": message})


def run(plugin, stdin=None, stdout=None):
    """Serves the host: the hello, then one call after another until stdin closes."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    hello = json.loads(stdin.readline() or "{}")
    if hello.get("protocol") != PROTOCOL:
        sys.stderr.write(f"history_plugin: the host speaks protocol {hello.get('protocol')}, this SDK {PROTOCOL}\n")
    try:
        plugin.validate(hello.get("config") or {}, hello.get("agent_max_ctx", 0),
                        [Model(m) for m in hello.get("models", [])])
    except ConfigError as err:
        _write(stdout, {"type": "config_error", "key": err.key, "message": err.message})
        return
    _write(stdout, {"type": "ready", "protocol": PROTOCOL, "name": plugin.name, "version": plugin.version})
    for line in stdin:
        if not line.strip():
            continue
        call = json.loads(line)
        call_id = call.get("id")
        try:
            ctx = Context(call.get("context") or {})
            messages = messages_of(call)
            if call.get("type") == "on_model_switch":
                answer = plugin.on_model_switch(messages, ctx)
            else:
                answer = plugin.process(messages, ctx)
            _write(stdout, encode_result(call_id, answer))
        except Exception as err:  # the plugin's fault is this call's error, not the end
            traceback.print_exc(file=sys.stderr)
            _write(stdout, {"type": "error", "id": call_id, "message": f"{type(err).__name__}: {err}"})
