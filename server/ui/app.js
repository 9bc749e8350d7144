// The inspector page (docs/http-api.md#the-inspector-page). Plain script, no framework.
// Every text that comes from a session is put in with textContent, never parsed as HTML;
// the operator token lives in sessionStorage and goes only in the Authorization header.
"use strict";

const TOKEN_KEY = "history-host.operator-token";
const POLL_MS = 3000;
const PAGE = 50;
const TURN_PAGE = 10; // turns a timeline page shows, newest first
const TRANSCRIPT_PAGE = 200; // transcript messages a page shows
const SVG_NS = "http://www.w3.org/2000/svg";

const state = {
  route: "",
  last: "", // the JSON the current view was drawn from: a poll that changes nothing draws nothing
  expanded: new Set(), // message keys whose original is shown
  page: 0,
  turnPage: 0,
  openTurn: null,
  view: "sent",
  transcriptFrom: null, // the transcript page's first position; null: the last page
  timer: null,
};

// ---- small DOM helpers: every text goes in as text ----

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) append(node, child);
  return node;
}

function append(node, child) {
  if (child === null || child === undefined || child === false) return;
  if (Array.isArray(child)) child.forEach((c) => append(node, c));
  else if (child instanceof Node) node.appendChild(child);
  else node.appendChild(document.createTextNode(String(child)));
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  return node;
}

function status(text) {
  document.getElementById("status").textContent = text;
}

// ---- the API, with the caller's own token ----

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

async function api(path) {
  const headers = { Accept: "application/json" };
  if (token()) headers.Authorization = "Bearer " + token();
  const response = await fetch(path, { headers, cache: "no-store" });
  const text = await response.text();
  let body = null;
  try {
    body = JSON.parse(text);
  } catch (_) {
    body = null;
  }
  return { ok: response.ok, status: response.status, body, text };
}

function apiError(answer) {
  const message = answer.body && answer.body.error ? answer.body.error.message : answer.text;
  return `${answer.status}: ${message}`;
}

// ---- routing ----

function route() {
  const hash = location.hash || "#/";
  if (hash !== state.route) {
    state.route = hash;
    state.last = "";
    state.page = 0;
    state.turnPage = 0;
    state.openTurn = null;
    state.transcriptFrom = null;
  }
  if (hash.startsWith("#/session/")) return showSession(decodeURIComponent(hash.slice(10)));
  if (hash === "#/chain") return showChain();
  if (hash === "#/proxy") return showTraffic();
  return showSessions();
}

function draw(key, build) {
  if (key === state.last) return;
  state.last = key;
  const main = document.getElementById("main");
  main.replaceChildren(build());
}

function redraw() {
  state.last = "";
  route();
}

// ---- sessions ----

async function showSessions() {
  const answer = await api("/v1/sessions");
  if (!answer.ok) {
    draw("refused" + answer.text, () =>
      el("section", { id: "sessions" },
        el("h2", {}, "Live sessions"),
        el("p", { class: "refused", id: "sessions-refused" },
          "The sessions list needs the operator's token (", apiError(answer), "). ",
          "Enter it above, or open a session by its id."))
    );
    return;
  }
  const sessions = answer.body.sessions;
  draw(answer.text + "|" + state.page, () => {
    const pages = Math.max(1, Math.ceil(sessions.length / PAGE));
    state.page = Math.min(state.page, pages - 1);
    const shown = sessions.slice(state.page * PAGE, (state.page + 1) * PAGE);
    const rows = shown.map((s) =>
      el("tr", {},
        el("td", {}, el("a", { href: "#/session/" + encodeURIComponent(s.id), class: "session-link" }, s.id)),
        el("td", {}, s.model), el("td", { class: "num" }, s.effective_ctx),
        el("td", { class: "num" }, s.turn), el("td", { class: "num" }, s.transcript_size),
        el("td", { class: "num" }, s.working_size), el("td", {}, s.last_active))
    );
    return el("section", { id: "sessions" },
      el("h2", {}, `Live sessions (${sessions.length})`),
      el("table", { id: "sessions-table" },
        el("thead", {}, el("tr", {}, ["id", "model", "effective_ctx", "turns", "transcript",
          "working", "last active"].map((h) => el("th", {}, h)))),
        el("tbody", {}, rows)),
      pager(state.page, pages, (p) => { state.page = p; redraw(); }));
  });
}

function pager(page, pages, go) {
  if (pages <= 1) return null;
  return el("div", { class: "pager" },
    el("button", { type: "button", onclick: () => go(Math.max(0, page - 1)) }, "‹ newer"),
    ` page ${page + 1} of ${pages} `,
    el("button", { type: "button", onclick: () => go(Math.min(pages - 1, page + 1)) }, "older ›"));
}

// ---- one session ----

async function showSession(id) {
  const base = "/v1/sessions/" + encodeURIComponent(id);
  const [turns, history, transcript] = await Promise.all([
    api(base + "/turns"),
    api(base + "/history?view=" + state.view + "&form=full"),
    api(base + (state.transcriptFrom === null ? `/transcript?last=${TRANSCRIPT_PAGE}`
      : `/transcript?from=${state.transcriptFrom}&limit=${TRANSCRIPT_PAGE}`)),
  ]);
  for (const answer of [turns, history, transcript]) {
    if (!answer.ok) {
      draw("error" + answer.text, () =>
        el("section", { id: "session" }, el("h2", {}, "Session ", el("code", {}, id)),
          el("p", { class: "refused" }, apiError(answer))));
      return;
    }
  }
  const key = [turns.text, history.text, transcript.text, state.view, state.turnPage, state.transcriptFrom,
    state.openTurn, [...state.expanded].join(",")].join("|");
  draw(key, () => sessionView(id, turns.body, history.body, transcript.body));
}

function sessionView(id, turns, history, transcript) {
  const records = turns.turns;
  const last = records[records.length - 1];
  const sentIds = new Map();
  history.history.forEach((m, i) => sentIds.set(messageId(m), { mark: mark(m), index: i }));
  return el("section", { id: "session" },
    el("h2", {}, "Session ", el("code", {}, id)),
    el("p", { class: "facts" },
      last ? `turn ${last.turn} · model ${last.model} · sent ${last.messages_sent} messages, ` +
        `${last.tokens_sent} tokens · transcript ${last.transcript_tokens} tokens · ` +
        `working ${last.working_size} messages · cached prefix (prefix_kept) ` +
        (last.prefix_kept === null ? "none" : `${last.prefix_kept} messages`)
        : "no turn recorded by this host yet (the record is in memory: a restart empties it)"),
    chart(records),
    timeline(records, turns.kept),
    el("div", { class: "histories" },
      el("div", { class: "column" },
        el("h3", {}, viewPicker(), ` (${history.size} messages)`),
        el("ol", { id: "history", start: 0 },
          history.history.map((m, i) => messageItem(m, i, mark(m), history.view === "sent" && last
            ? last.prefix_kept : null)))),
      el("div", { class: "column" },
        el("h3", {}, `Transcript (messages ${transcript.from}…${transcript.from + transcript.messages.length - 1})`),
        transcriptPager(transcript),
        el("ol", { id: "transcript", start: transcript.from },
          transcript.messages.map((m, i) => {
            const inHistory = sentIds.get(messageId(m));
            return messageItem(m, transcript.from + i, inHistory ? inHistory.mark : "dropped", null);
          })))));
}

function transcriptPager(transcript) {
  const go = (from) => { state.transcriptFrom = from; redraw(); };
  return el("div", { class: "pager" },
    transcript.from > 1 ? el("button", { type: "button", id: "transcript-older",
      onclick: () => go(Math.max(1, transcript.from - TRANSCRIPT_PAGE)) }, "‹ older") : null,
    transcript.next !== null ? el("button", { type: "button", id: "transcript-newer",
      onclick: () => go(transcript.next) }, "newer ›") : null,
    state.transcriptFrom !== null ? el("button", { type: "button", onclick: () => go(null) }, "latest") : null);
}

function viewPicker() {
  const select = el("select", { id: "view", onchange: (e) => { state.view = e.target.value; redraw(); } },
    el("option", { value: "sent" }, "Sent history (last turn)"),
    el("option", { value: "working" }, "Working history"));
  select.value = state.view;
  return select;
}

function messageId(message) {
  return message.metadata && typeof message.metadata.id === "string" ? message.metadata.id : null;
}

// What the chain did to a message, from its metadata flags (docs/wire-format.md#metadata);
// a flag counts only when it is literally true.
function mark(message) {
  const meta = message.metadata || {};
  if (meta.summary_of !== undefined && meta.summary_of !== null) return "summarized";
  if (meta.omitted === true) return "placeholder";
  if (meta.expanded === true) return "expanded";
  if (meta.was_compacted === true) return "compacted";
  return "kept";
}

function contentText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((part) => (part && typeof part.text === "string" ? part.text : JSON.stringify(part))).join("\n");
  }
  return JSON.stringify(content);
}

function messageItem(message, index, kind, prefixKept) {
  const meta = message.metadata || {};
  const key = (messageId(message) || "#" + index) + ":" + kind;
  const cached = prefixKept !== null && prefixKept !== undefined && index < prefixKept;
  const item = el("li", { class: `msg mark-${kind}` + (cached ? " cached" : ""), "data-mark": kind },
    el("div", { class: "msg-head" },
      el("span", { class: "role" }, message.role),
      el("span", { class: "badge" }, kind === "placeholder" ? "placeholder (omitted)" : kind),
      cached ? el("span", { class: "badge cache" }, "cached prefix") : null,
      meta.turn_added ? el("span", { class: "turn" }, "turn " + meta.turn_added) : null,
      messageId(message) ? el("span", { class: "id" }, messageId(message)) : null),
    el("pre", { class: "content" }, contentText(message.content)));
  if (Array.isArray(message.tool_calls)) {
    item.appendChild(el("pre", { class: "tools" }, JSON.stringify(message.tool_calls, null, 1)));
  }
  if (meta.original_content !== undefined && meta.original_content !== null) {
    const open = state.expanded.has(key);
    item.appendChild(el("button", {
      type: "button", class: "expand",
      onclick: () => { if (open) state.expanded.delete(key); else state.expanded.add(key); redraw(); },
    }, open ? "hide original" : "show original"));
    if (open) item.appendChild(el("pre", { class: "original" }, contentText(meta.original_content)));
  }
  return item;
}

// Tokens sent vs the transcript's tokens, one point per recorded turn.
function chart(records) {
  const width = 900, height = 260, left = 60, right = 20, top = 20, bottom = 30;
  const box = svg("svg", { id: "chart", viewBox: `0 0 ${width} ${height}`, role: "img" });
  const title = svg("title");
  title.textContent = "tokens sent vs transcript tokens per turn";
  box.appendChild(title);
  if (records.length === 0) return el("figure", {}, box, el("figcaption", {}, "no turns recorded yet"));
  const max = Math.max(1, ...records.map((r) => Math.max(r.tokens_sent, r.transcript_tokens)));
  const x = (i) => left + (records.length === 1 ? 0 : (i * (width - left - right)) / (records.length - 1));
  const y = (v) => top + (height - top - bottom) * (1 - v / max);
  box.appendChild(svg("line", { x1: left, y1: y(0), x2: width - right, y2: y(0), class: "axis" }));
  box.appendChild(svg("line", { x1: left, y1: top, x2: left, y2: y(0), class: "axis" }));
  for (const [value, anchor] of [[max, top + 4], [0, y(0)]]) {
    const label = svg("text", { x: left - 6, y: anchor, class: "label", "text-anchor": "end" });
    label.textContent = String(value);
    box.appendChild(label);
  }
  for (const [series, field] of [["transcript", "transcript_tokens"], ["sent", "tokens_sent"]]) {
    const points = records.map((r, i) => `${x(i).toFixed(1)},${y(r[field]).toFixed(1)}`).join(" ");
    box.appendChild(svg("polyline", { points, class: "line-" + series }));
    records.forEach((r, i) => {
      const dot = svg("circle", { cx: x(i).toFixed(1), cy: y(r[field]).toFixed(1), r: 3, class: "pt-" + series, "data-turn": r.turn });
      const tip = svg("title");
      tip.textContent = `turn ${r.turn}: ${series} ${r[field]} tokens`;
      dot.appendChild(tip);
      box.appendChild(dot);
    });
  }
  const first = records[0].turn, lastTurn = records[records.length - 1].turn;
  for (const [turn, px] of [[first, x(0)], [lastTurn, x(records.length - 1)]]) {
    const label = svg("text", { x: px, y: height - 8, class: "label", "text-anchor": "middle" });
    label.textContent = "turn " + turn;
    box.appendChild(label);
  }
  return el("figure", {}, box,
    el("figcaption", {}, el("span", { class: "key-sent" }, "■ tokens sent"), "  ",
      el("span", { class: "key-transcript" }, "■ transcript tokens"),
      ` (${records.length} turns)`));
}

function timeline(records, kept) {
  const newest = records.slice().reverse();
  const pages = Math.max(1, Math.ceil(newest.length / TURN_PAGE));
  const page = Math.min(state.turnPage, pages - 1);
  const rows = [];
  for (const r of newest.slice(page * TURN_PAGE, (page + 1) * TURN_PAGE)) {
    rows.push(el("tr", { class: "turn-row", onclick: () => { state.openTurn = state.openTurn === r.turn ? null : r.turn; redraw(); } },
      el("td", { class: "num" }, r.turn), el("td", {}, r.at),
      el("td", { class: "num" }, `${r.messages_in} → ${r.messages_sent}`),
      el("td", { class: "num" }, `${r.tokens_in} → ${r.tokens_sent}`),
      el("td", { class: "num" }, r.transcript_tokens),
      el("td", { class: "num" }, r.prefix_kept === null ? "–" : r.prefix_kept),
      el("td", { class: "num" }, r.events_total)));
    if (state.openTurn === r.turn) rows.push(el("tr", { class: "turn-detail" }, el("td", { colspan: 7 }, turnDetail(r))));
  }
  return el("details", { id: "timeline", open: "" },
    el("summary", {}, `Turns (the last ${kept} are kept in memory; click a turn for its stages and events)`),
    el("table", {},
      el("thead", {}, el("tr", {}, ["turn", "at", "messages in → sent", "tokens in → sent",
        "transcript tokens", "prefix_kept", "events"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows)),
    pager(page, pages, (p) => { state.turnPage = p; redraw(); }));
}

function turnDetail(r) {
  return el("div", {},
    el("table", { class: "stages" },
      el("thead", {}, el("tr", {}, ["stage", "messages", "tokens", "ms", "notes"].map((h) => el("th", {}, h)))),
      el("tbody", {}, r.stages.map((s) => el("tr", {},
        el("td", {}, s.plugin + (s.view ? " (view)" : s.ingest ? " (ingest)" : "")),
        el("td", { class: "num" }, `${s.messages_in} → ${s.messages_out}`),
        el("td", { class: "num" }, `${s.tokens_in} → ${s.tokens_out}`),
        el("td", { class: "num" }, s.ms.toFixed(2)),
        el("td", {}, [s.skipped ? "skipped" : "", s.quarantined ? "quarantined" : ""].filter(Boolean).join(", ")))))),
    el("ul", { class: "events" }, r.events.map((e) =>
      el("li", {}, `${e.plugin}: ${e.kind}`, e.index !== null ? ` #${e.index}` : "",
        e.tokens_saved !== null ? ` (${e.tokens_saved} tokens saved)` : "", e.reason ? ` — ${e.reason}` : ""))),
    r.events_total > r.events.length ? el("p", {}, `… and ${r.events_total - r.events.length} more events`) : null);
}

// ---- the chain ----

async function showChain() {
  const answer = await api("/v1/chain");
  if (!answer.ok) {
    draw("error" + answer.text, () => el("section", { id: "chain" }, el("p", { class: "refused" }, apiError(answer))));
    return;
  }
  const c = answer.body;
  draw(answer.text, () => el("section", { id: "chain" },
    el("h2", {}, "The chain"),
    el("p", { class: "facts" }, `on_plugin_error ${c.on_plugin_error} · agent_max_ctx ${c.agent_max_ctx} · ` +
      `max_users ${c.max_users} · idle timeout ${c.session_idle_timeout_minutes} min · last reload ` +
      (c.last_reload ? `${c.last_reload.at} ${c.last_reload.outcome}${c.last_reload.error ? ": " + c.last_reload.error : ""}` : "none")),
    el("table", { id: "chain-table" },
      el("thead", {}, el("tr", {}, ["stage", "version", "place", "calls", "seconds", "skipped", "failed",
        "quarantined", "worker starts"].map((h) => el("th", {}, h)))),
      el("tbody", {}, c.stages.map((s) => el("tr", { class: s.quarantined ? "quarantined" : "" },
        el("td", {}, s.name), el("td", {}, s.version),
        el("td", {}, s.ingest ? "ingest" : s.view ? "view" : "chain"),
        el("td", { class: "num" }, s.calls), el("td", { class: "num" }, Number(s.seconds).toFixed(3)),
        el("td", { class: "num" }, s.skipped), el("td", { class: "num" }, s.failed),
        el("td", {}, s.quarantined ? "yes" : "no"), el("td", { class: "num" }, s.worker_starts)))))));
}

// ---- proxy traffic (operator) ----

async function showTraffic() {
  const answer = await api("/v1/proxy/traffic");
  if (!answer.ok) {
    draw("error" + answer.text, () => el("section", { id: "traffic" }, el("h2", {}, "Proxy traffic"),
      el("p", { class: "refused", id: "traffic-refused" }, "Proxy traffic needs the operator's token (",
        apiError(answer), ").")));
    return;
  }
  const requests = answer.body.requests.slice().reverse();
  draw(answer.text + "|" + state.page, () => {
    const pages = Math.max(1, Math.ceil(requests.length / PAGE));
    state.page = Math.min(state.page, pages - 1);
    return el("section", { id: "traffic" },
      el("h2", {}, `Proxy traffic (the last ${answer.body.kept} requests are kept in memory; ` +
        (answer.body.bodies ? "with their bodies: [ui] keep_bodies)" : "no bodies)")),
      el("table", { id: "traffic-table" },
        el("thead", {}, el("tr", {}, ["at", "wire", "model", "session", "messages in → sent",
          "tokens in → sent", "added ms", "upstream status"].map((h) => el("th", {}, h)))),
        el("tbody", {}, requests.slice(state.page * PAGE, (state.page + 1) * PAGE).map((r) => [
          el("tr", { class: r.status >= 400 ? "quarantined" : "" },
            el("td", {}, r.at), el("td", {}, r.wire), el("td", {}, r.model === null ? "–" : r.model),
            el("td", {}, r.session ? "yes" : "stateless"),
            el("td", { class: "num" }, `${r.messages_in} → ${r.messages_sent}`),
            el("td", { class: "num" }, `${r.tokens_in} → ${r.tokens_sent}`),
            el("td", { class: "num" }, Number(r.added_ms).toFixed(2)),
            el("td", { class: "num" }, r.status)),
          r.bodies ? el("tr", { class: "bodies" }, el("td", { colspan: "8" }, bodies(r.bodies))) : null]))),
      pager(state.page, pages, (p) => { state.page = p; redraw(); }));
  });
}

// A request's kept bodies, as text (never as markup): what went upstream and the answer.
function bodies(b) {
  const one = (name, kept, cls) => [
    el("h3", {}, `${name}: ${kept.bytes} bytes${kept.cut ? ", cut" : ""}`),
    el("pre", { class: cls }, kept.text)];
  return el("details", {}, el("summary", {}, "bodies"),
    one("sent upstream", b.sent, "body-sent"), one("answer", b.answer, "body-answer"));
}

// ---- the header's forms, and polling ----

function showTokenState() {
  document.getElementById("token-state").textContent = token() ? "token set for this tab" : "no token";
}

function setup() {
  document.getElementById("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const input = document.getElementById("token");
    if (input.value.trim()) sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    input.value = "";
    showTokenState();
    redraw();
  });
  document.getElementById("token-forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showTokenState();
    redraw();
  });
  document.getElementById("open-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const id = document.getElementById("open-id").value.trim();
    if (id) location.hash = "#/session/" + encodeURIComponent(id);
  });
  window.addEventListener("hashchange", route);
  showTokenState();
  const tick = async () => {
    if (document.getElementById("live").checked && !document.hidden) {
      try {
        await route();
        status("updated " + new Date().toLocaleTimeString());
      } catch (err) {
        status("cannot reach the host: " + err);
      }
    }
    state.timer = setTimeout(tick, POLL_MS);
  };
  route().then(() => status("loaded " + new Date().toLocaleTimeString()), (err) => status(String(err)));
  state.timer = setTimeout(tick, POLL_MS);
}

setup();
