// The process plugins' protocol 1 lines (docs/process-plugins.md#the-protocol), as
// TypeScript types for keep_recent.mjs's JSDoc.

export interface Model {
  name: string;
  max_context: number;
  context_tokens: number;
  tokenizer: "o200k_base" | "cl100k_base" | "chars4";
  effective_ctx: number;
}

/** The host's first line. */
export interface Hello {
  type: "hello";
  protocol: 1;
  name: string;
  config: Record<string, unknown> & { keep?: number };
  agent_max_ctx: number;
  models: Model[];
}

/** A message in the host's wire format (docs/wire-format.md#messages). */
export interface WireMessage {
  role: "system" | "developer" | "user" | "assistant" | "tool";
  content?: string | Array<Record<string, unknown>> | null;
  tool_calls?: Array<{ id: string; type: "function"; function: { name: string; arguments: string } }>;
  tool_call_id?: string;
  metadata?: Record<string, unknown>;
  [member: string]: unknown;
}

export interface Context {
  session_id: string | null;
  model: Model;
  agent_max_ctx: number;
  effective_ctx: number;
  turn: number;
  last_active: string | null;
  per_message_tokens: number;
  old_model?: Model;
  new_model?: Model;
}

/** A call: `process`, or `on_model_switch`. */
export interface Call {
  type: "process" | "on_model_switch";
  id: number;
  context: Context;
  messages: WireMessage[];
  /** Each message's tokens, counted by the host with the call's model's tokenizer. */
  tokens: number[];
}

/** An entry of a result's history: an input index, a changed copy, or a new message. */
export type Entry = number | { from: number; message: WireMessage } | { message: WireMessage };

export interface Event {
  kind: string;
  reason: string;
  index?: number;
  id?: string;
  tokens_saved?: number;
}

export interface Answer {
  type: "result";
  id: number;
  history: Entry[];
  events: Event[];
}
