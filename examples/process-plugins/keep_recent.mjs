// A process plugin in JavaScript (Node 20, standard library only), protocol 1
// (docs/process-plugins.md): keeps the system messages and the last `keep` others, cut
// so that no tool result is left without its call. Every message it keeps goes back by
// index: it never echoes a message.
//
// Types: keep_recent.d.ts describes the protocol's lines (checked by `tsc --checkJs` if
// you have TypeScript; Node runs this file as it is).
// @ts-check
import { createInterface } from "node:readline";

/** @typedef {import("./keep_recent").Hello} Hello */
/** @typedef {import("./keep_recent").Call} Call */
/** @typedef {import("./keep_recent").Answer} Answer */

/** @param {object} line */
function send(line) {
  process.stdout.write(JSON.stringify(line) + "\n");
}

let keep = 4;
/** @type {Hello | null} */
let hello = null;

const input = createInterface({ input: process.stdin });
input.on("line", (text) => {
  if (hello === null) {
    hello = /** @type {Hello} */ (JSON.parse(text));
    const config = hello.config ?? {};
    for (const key of Object.keys(config)) {
      if (key !== "keep") {
        send({ type: "config_error", key, message: "unknown key (known: keep)" });
        process.exit(0);
      }
    }
    if (config.keep !== undefined) {
      if (!Number.isInteger(config.keep) || config.keep < 1) {
        send({ type: "config_error", key: "keep", message: "must be a whole number of at least 1" });
        process.exit(0);
      }
      keep = config.keep;
    }
    send({ type: "ready", protocol: 1, name: "keep_recent", version: "0.1.0" });
    return;
  }
  /** @type {Call} */
  const call = JSON.parse(text);
  try {
    send(answer(call));
  } catch (err) {
    send({ type: "error", id: call.id, message: String(err) });
  }
});

/**
 * @param {Call} call
 * @returns {Answer}
 */
function answer(call) {
  const messages = call.messages;
  let start = Math.max(0, messages.length - keep);
  // The kept part starts with a user message (the host's start rule), so no tool result
  // is left without its call: move the cut back to one.
  while (start > 0 && messages[start].role !== "user") start -= 1;
  /** @type {number[]} */
  const history = [];
  /** @type {Answer["events"]} */
  const events = [];
  messages.forEach((message, index) => {
    if (message.role === "system" || index >= start) history.push(index);
    else events.push({ kind: "message-removed", index, reason: `older than the last ${keep}` });
  });
  return { type: "result", id: call.id, history, events };
}
