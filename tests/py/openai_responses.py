"""The real `openai` Python client's Responses API against the proxy, for the e2e tests
(tests/tests/e2e/responses.rs).

Reads one request on stdin as JSON: {"base_url", "api_key", "model", "input", "extra": {...},
"headers": {...}, "stream": bool}. Prints one JSON object on stdout:
- plain: {"output_text", "id", "headers": {name: value}};
- stream: {"events": [event types...], "deltas": [text deltas...], "output_text"};
- an error answer: {"status", "body"} (openai.APIStatusError).
"""

import json
import sys

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
    kwargs["input"] = spec["input"]
    headers = spec.get("headers") or None
    try:
        if spec.get("stream"):
            events, deltas, text = [], [], None
            for event in client.responses.create(stream=True, extra_headers=headers, **kwargs):
                events.append(event.type)
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
                if event.type == "response.completed":
                    text = event.response.output_text
            out = {"events": events, "deltas": deltas, "output_text": text}
        else:
            raw = client.responses.with_raw_response.create(extra_headers=headers, **kwargs)
            response = raw.parse()
            out = {
                "output_text": response.output_text,
                "id": response.id,
                "headers": {k.lower(): v for k, v in raw.headers.items()},
            }
    except openai.APIStatusError as e:
        out = {"status": e.status_code, "body": e.body}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
