"""History plugins in Python, over the host's process-plugin protocol (version 1).

The protocol is docs/process-plugins.md in the host's repository. A plugin is a class
with a ``process`` method (and optionally ``on_model_switch`` and ``validate``), run by
``history_plugin.run(MyPlugin())`` from the script its manifest names::

    from history_plugin import Plugin, run

    class Upper(Plugin):
        name = "upper"
        version = "0.1.0"

        def process(self, messages, ctx):
            return [m.changed(content=m.text().upper()) if m.role == "user" else m
                    for m in messages]

    if __name__ == "__main__":
        run(Upper())

Standard library only.
"""

from .protocol import (
    PROTOCOL,
    ConfigError,
    Context,
    Event,
    Message,
    Model,
    Plugin,
    Result,
    encode_result,
    run,
)

__all__ = [
    "PROTOCOL",
    "ConfigError",
    "Context",
    "Event",
    "Message",
    "Model",
    "Plugin",
    "Result",
    "encode_result",
    "run",
]
