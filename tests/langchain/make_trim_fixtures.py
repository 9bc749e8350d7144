#!/usr/bin/env python3
"""Fixtures for the LangChain agreement test of `token_budget` (docs/plugins.md#token_budget).

docs/plugins.md#token_budget: with `pin_first_user = false`, no target and the same token counter,
`token_budget` selects what LangChain's

    trim_messages(strategy="last", start_on="human", include_system=True,
                  allow_partial=False, token_counter=..., max_tokens=B)

selects, except where the spec deliberately differs (every leading system message is
pinned, a history that fits is returned unchanged, the result is never empty).

This script generates seeded agent histories (OpenAI Chat Completions messages), runs
LangChain on each with a `chars4` counter that follows docs/plugins.md#token_budget's formula
(per_message_tokens + sum of ceil(chars / 4) over the message's items, per_message_tokens
= 3), and writes the indices LangChain keeps to `trim_fixtures.json` beside it. The Rust
test `tests/tests/token_budget.rs` (langchain_*) runs `token_budget` on the same histories.

For histories with several leading system messages it also records LangChain's selection
on the history with those messages counted as one pinned block
(`langchain_system_block`): that is what "every leading system message is pinned" means,
stated in LangChain's own terms.

Run it again after changing the generator (needs `pip install langchain-core`); CI has no
Python and only reads the committed fixture:

    python3 tests/langchain/make_trim_fixtures.py
"""

import json
import math
import os
import random

import langchain_core
from langchain_core.messages import (
    AIMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    trim_messages,
)

PER_MESSAGE_TOKENS = 3
SEED = 20261122
CASES = 32
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "trim_fixtures.json")

WORDS = (
    "flight booking change cancel refund seat baggage fare reservation passenger "
    "search result error retry file patch test diff café naïve 東京 ümlaut"
).split()


def chars4(text):
    # Characters are Unicode scalar values (docs/wire-format.md#messages); a Python str indexes them.
    return math.ceil(len(text) / 4)


def compact(value):
    # serde_json's compact writer: "," and ":" separators, input order, non-ASCII as is.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def items(message):
    """The items docs/plugins.md#token_budget counts: text parts, opaque parts' JSON, call names, arguments."""
    content = message.get("content")
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if part.get("type") == "text" and isinstance(part.get("text"), str):
                yield part["text"]
            else:
                yield compact(part)
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        yield function.get("name", "")
        arguments = function.get("arguments", "")
        yield arguments if isinstance(arguments, str) else compact(arguments)


def tokens(message):
    return PER_MESSAGE_TOKENS + sum(chars4(item) for item in items(message))


def words(rng, low, high):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def content(rng, low=2, high=20):
    shape = rng.random()
    if shape < 0.7:
        return words(rng, low, high)
    parts = [{"type": "text", "text": words(rng, low, high)}]
    if rng.random() < 0.5:
        parts.append({"type": "image_url", "image_url": {"url": f"https://example.invalid/{rng.randint(1, 999)}.png"}})
    return parts


def generate(rng, index):
    """A well-formed agent history: systems, a task, then exchanges and tool loops."""
    history = []
    systems = 1
    if index % 5 == 1:
        systems = 2 + index % 2  # the deliberate difference: several leading systems
    elif index % 7 == 3:
        systems = 0
    for _ in range(systems):
        history.append({"role": "system", "content": words(rng, 5, 30)})
    if index % 9 == 4:
        # Starts with the assistant after the system messages (LangChain drops that even
        # when everything fits; the spec returns a history that fits unchanged).
        history.append({"role": "assistant", "content": words(rng, 3, 10)})
    call = 0
    for _ in range(rng.randint(2, 7)):
        history.append({"role": "user", "content": content(rng)})
        for _ in range(rng.randint(0, 2)):
            calls = []
            for _ in range(rng.randint(1, 3)):
                call += 1
                arguments = compact({"q": words(rng, 1, 4)})
                calls.append({"id": f"call_{call}", "type": "function",
                              "function": {"name": rng.choice(["search", "book", "read_file"]),
                                           "arguments": arguments}})
            history.append({"role": "assistant", "content": None, "tool_calls": calls})
            for c in calls:
                history.append({"role": "tool", "tool_call_id": c["id"], "content": words(rng, 2, 60)})
        history.append({"role": "assistant", "content": content(rng, 2, 30)})
    if index % 6 == 5:
        # A newest message larger than any budget below: the never-empty rule.
        history.append({"role": "user", "content": words(rng, 200, 240)})
        history.append({"role": "assistant", "content": words(rng, 200, 240)})
    return history


LC_TYPES = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}


def to_langchain(history):
    """LangChain messages carrying their history index as id (what trim_messages keeps)."""
    messages = []
    for i, message in enumerate(history):
        if message["role"] == "tool":
            messages.append(ToolMessage(content="", tool_call_id=message["tool_call_id"], id=str(i)))
        else:
            messages.append(LC_TYPES[message["role"]](content="", id=str(i)))
    return messages


def select(history, messages, budget, cost):
    kept = trim_messages(
        messages,
        max_tokens=budget,
        token_counter=lambda msgs: sum(cost[m.id] for m in msgs),
        strategy="last",
        start_on="human",
        include_system=True,
        allow_partial=False,
    )
    return [m.id for m in kept]


def main():
    rng = random.Random(SEED)
    cases = []
    for index in range(CASES):
        history = generate(rng, index)
        cost = {str(i): tokens(m) for i, m in enumerate(history)}
        total = sum(cost.values())
        if index % 8 == 2 or index % 18 == 4:
            budget = total + rng.randint(0, 20)  # fits
        else:
            budget = max(1, int(total * rng.uniform(0.12, 0.95)))
        lc = [int(i) for i in select(history, to_langchain(history), budget, cost)]
        leading = 0
        while leading < len(history) and history[leading]["role"] == "system":
            leading += 1
        block = None
        if leading >= 2:
            # The leading systems as one pinned SystemMessage costing their sum.
            messages = [SystemMessage(content="", id="block")] + to_langchain(history)[leading:]
            block_cost = dict(cost)
            block_cost["block"] = sum(cost[str(i)] for i in range(leading))
            block = []
            for i in select(history, messages, budget, block_cost):
                block.extend(range(leading) if i == "block" else [int(i)])
        cases.append({
            "name": f"case-{index:02}",
            "max_tokens": budget,
            "total_tokens": total,
            "langchain": lc,
            "langchain_system_block": block,
            "history": history,
        })
    document = {
        "about": "LangChain trim_messages(strategy='last', start_on='human', include_system=True, "
                 "allow_partial=False) selections; made by make_trim_fixtures.py",
        "langchain_core": langchain_core.__version__,
        "seed": SEED,
        "tokenizer": "chars4",
        "per_message_tokens": PER_MESSAGE_TOKENS,
        "cases": cases,
    }
    with open(OUT, "w", encoding="utf-8") as out:
        json.dump(document, out, ensure_ascii=False, indent=None, separators=(",", ":"))
        out.write("\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
