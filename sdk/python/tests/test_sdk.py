"""The SDK's own tests: the protocol's lines, and the test helper running the host's own
output check (the built history-host, $HISTORY_HOST). Run by `cargo xtask test`."""

import io
import json
import os
import sys
import unittest

from history_plugin import ConfigError, Event, Message, Plugin, Result, encode_result, run
from history_plugin import testing

HISTORY = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "read the file"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "key sk-abcdefghijklmnopqrstuvwxyz"},
    {"role": "user", "content": "thanks"},
]


class Upper(Plugin):
    name = "upper"

    def process(self, messages, ctx):
        return [m.map_text(str.upper) if m.role == "user" else m for m in messages]


class DropCall(Plugin):
    """Drops the assistant's tool call and leaves its result: an orphan."""

    def process(self, messages, ctx):
        return [m for m in messages if not m.tool_calls]


class Invents(Plugin):
    def process(self, messages, ctx):
        return messages + [Message.new("user", "made up")]


def serve(plugin, lines):
    out = io.StringIO()
    run(plugin, io.StringIO("".join(json.dumps(line) + "\n" for line in lines)), out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


HELLO = {"type": "hello", "protocol": 1, "name": "upper", "config": {}, "agent_max_ctx": 50, "models": []}


class Protocol(unittest.TestCase):
    def test_unchanged_messages_go_back_by_index_and_changed_ones_say_their_source(self):
        result = encode_result(7, Upper().process([Message(m, i) for i, m in enumerate(HISTORY)], None))
        self.assertEqual(result["id"], 7)
        self.assertEqual(result["history"][0], 0)
        self.assertEqual(result["history"][1], {"from": 1, "message": {"role": "user", "content": "READ THE FILE"}})
        self.assertEqual(result["history"][2:4], [2, 3])

    def test_a_session_ready_then_results_then_an_error_for_a_raising_plugin(self):
        class Raises(Plugin):
            def process(self, messages, ctx):
                raise ValueError("nope")

        call = {"type": "process", "id": 1, "context": {"turn": 2}, "messages": HISTORY, "tokens": [1] * 5}
        lines = serve(Upper(), [HELLO, call, dict(call, id=2, type="on_model_switch")])
        self.assertEqual(lines[0], {"type": "ready", "protocol": 1, "name": "upper", "version": "0.1.0"})
        self.assertEqual([line["id"] for line in lines[1:]], [1, 2])
        stderr, sys.stderr = sys.stderr, io.StringIO()
        try:
            lines = serve(Raises(), [HELLO, call])
        finally:
            sys.stderr = stderr
        self.assertEqual(lines[1], {"type": "error", "id": 1, "message": "ValueError: nope"})

    def test_a_refused_table_is_a_config_error_line(self):
        class Strict(Plugin):
            def validate(self, config, agent_max_ctx, models):
                if "keep" in config and not isinstance(config["keep"], int):
                    raise ConfigError("keep", "must be a whole number")

        lines = serve(Strict(), [dict(HELLO, config={"keep": "x"})])
        self.assertEqual(lines, [{"type": "config_error", "key": "keep", "message": "must be a whole number"}])

    def test_events_are_checked_and_written(self):
        with self.assertRaises(ValueError):
            Event("message-vanished", "x")
        result = encode_result(1, Result([Message(HISTORY[0], 0)], [Event("message-removed", "old", index=1)]))
        self.assertEqual(result["events"], [{"kind": "message-removed", "reason": "old", "index": 1}])


@unittest.skipUnless(os.environ.get("HISTORY_HOST"), "HISTORY_HOST names the built history-host")
class HostCheck(unittest.TestCase):
    def test_a_good_answer_passes_the_host_check(self):
        output, _ = testing.process(Upper(), HISTORY)
        self.assertEqual(output[1]["content"], "READ THE FILE")
        self.assertEqual(len(output), 5)

    def test_an_orphan_tool_result_is_refused_in_the_hosts_words(self):
        with self.assertRaises(testing.OutputRefused) as refused:
            testing.process(DropCall(), HISTORY)
        self.assertIn("invalid output", str(refused.exception))
        self.assertIn("structural fault", str(refused.exception))

    def test_an_invented_message_is_refused(self):
        with self.assertRaises(testing.OutputRefused) as refused:
            testing.process(Invents(), HISTORY)
        self.assertIn("invalid output", str(refused.exception))

    def test_the_example_redactor(self):
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "process-plugins"))
        from redact import Redact

        plugin = Redact()
        plugin.validate({}, 50, [])
        output, events = testing.process(plugin, HISTORY)
        self.assertEqual(output[3]["content"], "key [REDACTED]")
        self.assertEqual([e.kind for e in events], ["message-changed"])
        with self.assertRaises(ConfigError):
            Redact().validate({"patern": "x"}, 50, [])


if __name__ == "__main__":
    unittest.main()
