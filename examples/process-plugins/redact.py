"""A redactor as a process plugin (docs/process-plugins.md): every text that looks like a
secret key (`sk-` and 20 or more letters, digits or dashes) becomes `[REDACTED]`. The
messages it does not change go back by index; the changed ones as copies of theirs.

Its table: `[plugin.redact] pattern = "..."` replaces the pattern (a Python regex)."""

import re

from history_plugin import ConfigError, Event, Plugin, Result, run


class Redact(Plugin):
    name = "redact"
    version = "0.1.0"

    def validate(self, config, agent_max_ctx, models):
        unknown = set(config) - {"pattern"}
        if unknown:
            raise ConfigError(sorted(unknown)[0], "unknown key (known: pattern)")
        try:
            self.pattern = re.compile(config.get("pattern", r"sk-[A-Za-z0-9-]{20,}"))
        except (re.error, TypeError) as err:
            raise ConfigError("pattern", f"not a regular expression: {err}")

    def process(self, messages, ctx):
        out, events = [], []
        for message in messages:
            changed = message.map_text(lambda text: self.pattern.sub("[REDACTED]", text))
            if changed is not message and changed.data != message.data:
                events.append(Event("message-changed", "redacted a secret", index=message.index))
                out.append(changed)
            else:
                out.append(message)
        return Result(out, events)


if __name__ == "__main__":
    run(Redact())
