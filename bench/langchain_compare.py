#!/usr/bin/env python3
"""Side by side: our chain against LangChain's trim_messages on the same history.

Run by hand (not in CI), from the workspace root:

    pip install langchain-core tiktoken
    python3 bench/langchain_compare.py [--turns 260] [--seed 1] [--max-tokens 123904]
                                       [--input FILE] [--runs 3]

It generates the history with `cargo xtask gen-history` (260 turns = about 1,000
messages) unless --input is given, then replays it turn by turn three ways and prints
the times and the ratios:

1. LangChain re-tokenizing: the pattern LangChain's docs show. The agent keeps the full
   message list and calls trim_messages(strategy="last", start_on="human",
   include_system=True, allow_partial=False) on it before every model call, with a
   tiktoken o200k_base counter that encodes every message it is given, on every call.
2. LangChain memoized: the same, with the counter remembering each message's count
   (keyed by the message object, which lives as long as the history).
3. Ours: `cargo xtask bench --json --input FILE --max-tokens B` (the real host library
   and plugin cdylibs, turn by turn as a session feeds them; replay.total_s).

The token counter is docs/plugins.md#token_budget's formula on both sides: 3 per message plus each item
(content, each tool call's name, each arguments string) encoded separately with the
ordinary o200k_base encoding. Converting JSON to message objects is not timed on either
side (parsing is not timed in the bench either).

tiktoken downloads its encodings on first use; where that is not possible (an offline
machine), the script hands tiktoken the copy of o200k_base.tiktoken that the tiktoken-rs
crate ships in cargo's registry (tiktoken checks its hash: the same file).
"""

import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"


def o200k():
    """tiktoken's o200k_base, from tiktoken-rs's copy when it cannot be downloaded."""
    import tiktoken

    try:
        return tiktoken.get_encoding("o200k_base")
    except Exception:  # noqa: BLE001 - any download failure: fall back to the local copy
        pass
    cargo_home = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
    copies = sorted(glob.glob(os.path.join(cargo_home, "registry/src/*/tiktoken-rs-*/assets/o200k_base.tiktoken")))
    if not copies:
        sys.exit("cannot download o200k_base and found no tiktoken-rs copy: run `cargo xtask bench` once first")
    cache = tempfile.mkdtemp(prefix="tiktoken-cache-")
    shutil.copy(copies[-1], os.path.join(cache, hashlib.sha1(O200K_URL.encode()).hexdigest()))
    os.environ["TIKTOKEN_CACHE_DIR"] = cache
    import tiktoken.registry

    tiktoken.registry.ENCODINGS.pop("o200k_base", None)
    return tiktoken.get_encoding("o200k_base")


def to_langchain(history):
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    messages = []
    for m in history:
        role, content = m["role"], m.get("content")
        text = content if isinstance(content, str) else ""
        if role in ("system", "developer"):
            messages.append(SystemMessage(text))
        elif role == "user":
            messages.append(HumanMessage(text))
        elif role == "assistant":
            calls = [
                {"name": c["function"]["name"], "args": json.loads(c["function"]["arguments"] or "{}"), "id": c["id"]}
                for c in m.get("tool_calls") or []
            ]
            messages.append(AIMessage(text, tool_calls=calls))
        elif role == "tool":
            messages.append(ToolMessage(text, tool_call_id=m["tool_call_id"]))
        else:
            sys.exit(f"unknown role {role!r}")
    return messages


def split_turns(messages):
    """A turn starts at each user message (messages before the first belong to turn 1)."""
    turns, seen_user = [], False
    for m in messages:
        is_user = m.type == "human"
        if not turns or (is_user and seen_user):
            turns.append([])
        seen_user |= is_user
        turns[-1].append(m)
    return turns


def make_counters(enc):
    def count(m):
        # docs/plugins.md#token_budget: per_message_tokens (3) + each item encoded separately.
        n = 3 + len(enc.encode_ordinary(m.content if isinstance(m.content, str) else ""))
        for call in getattr(m, "tool_calls", None) or []:
            n += len(enc.encode_ordinary(call["name"]))
            n += len(enc.encode_ordinary(json.dumps(call["args"], separators=(",", ":"), ensure_ascii=False)))
        return n

    def naive(messages):
        return sum(count(m) for m in messages)

    memo = {}

    def memoized(messages):
        total = 0
        for m in messages:
            key = id(m)  # the message objects live as long as the history: ids are not reused
            c = memo.get(key)
            if c is None:
                c = memo[key] = count(m)
            total += c
        return total

    return naive, memoized


def replay_langchain(turns, counter, max_tokens):
    from langchain_core.messages import trim_messages

    history, elapsed, kept = [], 0.0, []
    for new in turns:
        history.extend(new)
        started = time.perf_counter()
        trimmed = trim_messages(
            history,
            max_tokens=max_tokens,
            token_counter=counter,
            strategy="last",
            start_on="human",
            include_system=True,
            allow_partial=False,
        )
        elapsed += time.perf_counter() - started
        kept.append(len(trimmed))
    return elapsed, kept


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=260)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=123_904, help="the budget (128,000 - 4,096 reserve)")
    parser.add_argument("--input", help="a history file (JSON array) instead of a generated one")
    parser.add_argument("--runs", type=int, default=3, help="runs of the memoized LangChain replay (median)")
    args = parser.parse_args()

    if args.input:
        path = os.path.abspath(args.input)
    else:
        out_dir = os.path.join(ROOT, "target", "langchain-compare")
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, f"h-{args.turns}-{args.seed}.json")
        with open(path, "w") as out:
            subprocess.run(
                ["cargo", "xtask", "gen-history", "--turns", str(args.turns), "--seed", str(args.seed)],
                cwd=ROOT, stdout=out, check=True,
            )
    with open(path) as f:
        history = json.load(f)
    messages = to_langchain(history)
    turns = split_turns(messages)
    print(f"history: {path}: {len(history)} messages, {len(turns)} turns; budget {args.max_tokens} tokens")

    enc = o200k()
    naive, _ = make_counters(enc)
    naive_s, naive_kept = replay_langchain(turns, naive, args.max_tokens)
    print(f"LangChain trim_messages, re-tokenizing:  {naive_s:9.3f} s")
    memo_times = []
    for _ in range(args.runs):
        _, memoized = make_counters(enc)  # a fresh memo each run: every message counted once
        memo_s, memo_kept = replay_langchain(turns, memoized, args.max_tokens)
        memo_times.append(memo_s)
        assert memo_kept == naive_kept, "the memoized counter changed the selection"
    memo_s = sorted(memo_times)[len(memo_times) // 2]
    print(f"LangChain trim_messages, memoized:       {memo_s:9.3f} s   (median of {args.runs})")

    bench = subprocess.run(
        ["cargo", "xtask", "bench", "--json", "--input", path, "--max-tokens", str(args.max_tokens)],
        cwd=ROOT, capture_output=True, text=True,
    )
    if bench.returncode != 0:
        sys.exit(f"cargo xtask bench failed:\n{bench.stderr}")
    ours = json.loads(bench.stdout)
    ours_s = ours["replay"]["total_s"]
    chain = ", ".join(ours["chain"])
    print(f"ours (chain: {chain}):  {ours_s:9.3f} s   (median of {ours['runs']})")
    if not ours["config"]["max_tokens_applied"]:
        print(f"  note: token_budget is not installed, so our chain trimmed by messages "
              f"(agent_max_ctx {ours['config']['agent_max_ctx']}), not by the {args.max_tokens}-token budget")
    print()
    print(f"ours vs LangChain re-tokenizing: {naive_s / ours_s:8.1f}x faster")
    print(f"ours vs LangChain memoized:      {memo_s / ours_s:8.1f}x faster")
    print(f"LangChain kept {min(naive_kept)}-{max(naive_kept)} messages a turn")


if __name__ == "__main__":
    main()
