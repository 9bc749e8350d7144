"""A plugin's own tests: call it as the host would and put its answer through the
host's own output check — the built ``history-host`` binary's hidden
``check-plugin-output`` command, not a Python copy of it (docs/process-plugins.md#testing).

The binary is ``$HISTORY_HOST`` or ``history-host`` on PATH.
"""

import json
import os
import shutil
import subprocess

from .protocol import Context, Result, encode_result, messages_of


class OutputRefused(AssertionError):
    """The host's output check refused the plugin's answer; the message is the host's."""


def host_binary():
    binary = os.environ.get("HISTORY_HOST") or shutil.which("history-host")
    if not binary:
        raise RuntimeError("set HISTORY_HOST to the built history-host binary (cargo xtask build)")
    return binary


def context(effective_ctx=50, turn=1, model="test-model", tokenizer="chars4"):
    return Context({
        "model": {"name": model, "max_context": effective_ctx, "context_tokens": 128000,
                  "tokenizer": tokenizer, "effective_ctx": effective_ctx},
        "agent_max_ctx": effective_ctx, "effective_ctx": effective_ctx, "turn": turn,
    })


def process(plugin, history, ctx=None):
    """Calls ``plugin.process`` on ``history`` (a list of message dicts in the host's
    wire format) and checks its answer with the host's own check. Returns the output
    history as dicts; raises OutputRefused with the host's words."""
    ctx = ctx or context()
    call = {"messages": history, "tokens": [0] * len(history)}
    answer = plugin.process(messages_of(call), ctx)
    result = encode_result(1, answer)
    checked = subprocess.run(
        [host_binary(), "check-plugin-output"],
        input=json.dumps({"input": history, "result": result}),
        capture_output=True, text=True, timeout=60,
    )
    if checked.returncode != 0:
        raise OutputRefused(checked.stderr.strip())
    events = answer.events if isinstance(answer, Result) else []
    return json.loads(checked.stdout), events
