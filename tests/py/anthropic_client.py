"""The real `anthropic` Python SDK against the proxy, for the e2e tests (tests/tests/e2e/anthropic.rs).

Reads one request on stdin as JSON: {"base_url", "api_key", "model", "messages", "extra": {...},
"stream": bool, "count_tokens": bool}. Prints one JSON object on stdout:
- plain: {"text", "headers": {name: value}, "sent": the request body the SDK sent, as text};
- stream: {"events": [event types in order], "text", "sent"};
- count_tokens: {"input_tokens", "sent"};
- an error answer: {"status", "body"} (anthropic.APIStatusError).
"""

import json
import sys

import anthropic


def main():
    spec = json.load(sys.stdin)
    client = anthropic.Anthropic(
        base_url=spec["base_url"],
        api_key=spec.get("api_key", "test"),
        max_retries=0,
        timeout=60,
    )
    kwargs = dict(spec.get("extra", {}))
    kwargs["model"] = spec["model"]
    kwargs["messages"] = spec["messages"]
    try:
        if spec.get("count_tokens"):
            kwargs.pop("max_tokens", None)
            raw = client.messages.with_raw_response.count_tokens(**kwargs)
            out = {"input_tokens": raw.parse().input_tokens}
        elif spec.get("stream"):
            events, text = [], ""
            raw = client.messages.with_raw_response.create(stream=True, **kwargs)
            for event in raw.parse():
                events.append(event.type)
                if event.type == "content_block_delta":
                    text += event.delta.text
            out = {"events": events, "text": text}
        else:
            raw = client.messages.with_raw_response.create(**kwargs)
            message = raw.parse()
            out = {
                "text": message.content[0].text,
                "headers": {k.lower(): v for k, v in raw.headers.items()},
            }
    except anthropic.APIStatusError as e:
        out = {"status": e.status_code, "body": e.body}
        raw = None
    # The body the SDK sent, as its bytes: what the host received.
    out["sent"] = raw.http_request.content.decode() if raw is not None else None
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
