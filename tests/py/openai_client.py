"""The real `openai` Python client against the proxy, for the e2e tests (tests/tests/e2e/proxy.rs).

Reads one request on stdin as JSON: {"base_url", "api_key", "model", "messages", "extra": {...},
"headers": {...}, "stream": bool}. Prints one JSON object on stdout:
- plain: {"content", "headers": {name: value}, "model"};
- stream: {"parts": [delta content...], "times": [arrival of each chunk, seconds since the epoch]};
- an error answer: {"status", "body"} (openai.APIStatusError).
"""

import json
import sys
import time

import openai


def main():
    spec = json.load(sys.stdin)
    client = openai.OpenAI(
        base_url=spec["base_url"],
        api_key=spec.get("api_key", "sk-test"),
        max_retries=0,
        timeout=60,
    )
    kwargs = dict(spec.get("extra", {}))
    kwargs["model"] = spec["model"]
    kwargs["messages"] = spec["messages"]
    headers = spec.get("headers") or None
    try:
        if spec.get("stream"):
            parts, times = [], []
            for chunk in client.chat.completions.create(stream=True, extra_headers=headers, **kwargs):
                times.append(time.time())
                parts.append(chunk.choices[0].delta.content if chunk.choices else None)
            out = {"parts": parts, "times": times}
        else:
            raw = client.chat.completions.with_raw_response.create(extra_headers=headers, **kwargs)
            completion = raw.parse()
            out = {
                "content": completion.choices[0].message.content,
                "model": completion.model,
                "headers": {k.lower(): v for k, v in raw.headers.items()},
            }
    except openai.APIStatusError as e:
        out = {"status": e.status_code, "body": e.body}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
