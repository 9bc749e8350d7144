//! A seeded generator of realistic agent histories (the input of `cargo xtask bench`).
//!
//! Shaped after the real conversations in `tests/data/real/` (SWE-agent, tau-bench,
//! inspect): a long system prompt, a task, then turns of a user message, an agent loop of
//! assistant messages with 1–3 tool calls each answered by its tool results, and a final
//! reply. Assistant messages that call tools carry `null`, `""` or a short thought, as the
//! three sources do. Tool results are the kinds of text real tools return — JSON records,
//! file listings, numbered source views, grep hits, build and service logs, search
//! results — so they tokenize like real output (a repeated single character would
//! tokenize hundreds of times faster and make the token figures meaningless). Sizes:
//! mostly 0.2–2 KB, some 2–5 KB, a few 5–50 KB (above what the real files have), and a
//! few tiny ones (edit acknowledgements, empty results).
//!
//! The same seed gives the same history on every machine: ChaCha8 is a specified stream
//! and nothing else (time, hashing order, the environment) goes in.

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Map, Value};

/// Tool results are drawn from these size classes (bytes, weight in percent).
pub const RESULT_SIZES: [(std::ops::Range<usize>, u32); 4] = [
    (0..200, 8),
    (200..2_048, 77),
    (2_048..5_120, 10),
    (5_120..51_200, 5),
];

/// A generated history: `turns` turns after the system prompt.
pub fn generate(turns: usize, seed: u64) -> Vec<Value> {
    let mut generator = Generator::new(seed);
    let mut history = vec![generator.system_prompt()];
    for turn in 1..=turns {
        history.extend(generator.turn(turn));
    }
    history
}

/// A generated history of whole turns holding at least `messages` messages.
pub fn generate_messages(messages: usize, seed: u64) -> Vec<Value> {
    let mut generator = Generator::new(seed);
    let mut history = vec![generator.system_prompt()];
    let mut turn = 0;
    while history.len() < messages {
        turn += 1;
        history.extend(generator.turn(turn));
    }
    history
}

/// The wide fan-out: a task, then one assistant message with `calls` tool calls, answered
/// newest call first (the reverse of the calls' order). Half the calls edit or write a
/// file and get an empty result back: `tool_result_filter` leaves those alone, so
/// `retention` too looks up the call of thousands of results. Nothing random: the case is
/// the shape, not the text.
pub fn fan_out(calls: usize) -> Vec<Value> {
    let tool = |i: usize| ["read_file", "edit_file", "grep", "write_file"][i % 4];
    let tool_calls: Vec<Value> = (0..calls)
        .map(|i| {
            json!({"id": format!("call_{i:06}"), "type": "function", "function": {
                "name": tool(i), "arguments": format!("{{\"path\": \"src/module_{i}.rs\"}}")}})
        })
        .collect();
    let mut history = vec![
        json!({"role": "user", "content": "Rename `config` to `settings` in every module of the crate."}),
        json!({"role": "assistant", "content": null, "tool_calls": tool_calls}),
    ];
    for i in (0..calls).rev() {
        let content = if matches!(tool(i), "edit_file" | "write_file") {
            String::new()
        } else {
            format!(
                "src/module_{i}.rs:12: let config = Config::load(&path)?; // {} 1 match",
                tool(i)
            )
        };
        history.push(json!({"role": "tool", "tool_call_id": format!("call_{i:06}"), "content": content}));
    }
    history
}

/// A history as a JSON array, one message per line (diffable, and still one JSON value).
pub fn to_json_text(history: &[Value]) -> String {
    let mut out = String::from("[\n");
    for (i, message) in history.iter().enumerate() {
        out.push_str(&message.to_string());
        out.push_str(if i + 1 < history.len() { ",\n" } else { "\n" });
    }
    out.push_str("]\n");
    out
}

/// The generator's state: the random stream and a counter for unique call ids.
pub struct Generator {
    rng: ChaCha8Rng,
    calls: u64,
}

const WORDS: &[&str] = &[
    "the",
    "a",
    "to",
    "of",
    "and",
    "in",
    "is",
    "for",
    "that",
    "with",
    "on",
    "this",
    "it",
    "be",
    "as",
    "we",
    "can",
    "not",
    "from",
    "by",
    "should",
    "when",
    "which",
    "file",
    "function",
    "value",
    "error",
    "request",
    "user",
    "data",
    "test",
    "result",
    "field",
    "update",
    "check",
    "return",
    "config",
    "change",
    "issue",
    "order",
    "booking",
    "flight",
    "reservation",
    "payment",
    "account",
    "server",
    "response",
    "timeout",
    "cache",
    "build",
    "module",
    "version",
    "release",
    "dependency",
    "path",
    "output",
    "input",
    "message",
    "history",
    "token",
    "window",
    "budget",
    "plugin",
    "chain",
    "turn",
    "session",
    "model",
    "context",
    "precision",
    "rounding",
    "serialization",
    "behaviour",
    "expected",
    "actual",
    "instead",
    "because",
    "however",
    "first",
    "then",
    "again",
    "still",
    "already",
    "every",
    "only",
    "also",
    "before",
    "after",
    "between",
    "without",
    "during",
    "around",
    "number",
    "string",
    "list",
    "field",
    "method",
    "class",
    "struct",
    "crate",
    "package",
    "import",
    "query",
    "table",
    "index",
    "column",
    "record",
    "entry",
    "line",
    "column",
    "bug",
    "fix",
    "patch",
    "commit",
    "branch",
    "review",
    "customer",
    "policy",
    "refund",
    "cabin",
    "economy",
    "business",
    "passenger",
    "baggage",
    "date",
    "time",
    "zone",
    "latency",
    "memory",
    "thread",
    "lock",
    "queue",
    "worker",
    "retry",
];

const IDENTS: &[&str] = &[
    "user",
    "id",
    "name",
    "path",
    "config",
    "value",
    "items",
    "result",
    "handler",
    "request",
    "response",
    "client",
    "server",
    "session",
    "token",
    "count",
    "index",
    "buffer",
    "reader",
    "writer",
    "parse",
    "serialize",
    "deserialize",
    "field",
    "timedelta",
    "precision",
    "schema",
    "load",
    "dump",
    "cache",
    "history",
    "message",
    "turn",
    "window",
    "budget",
    "plugin",
    "chain",
    "stage",
    "report",
    "error",
    "state",
    "store",
    "entry",
    "limit",
    "offset",
    "total",
    "price",
    "amount",
    "flight",
    "booking",
    "reservation",
    "payment",
    "status",
    "retry",
    "timeout",
    "worker",
    "queue",
    "event",
    "log",
];

const FIRST_NAMES: &[&str] = &[
    "Omar", "Mia", "Yusuf", "Chen", "Sofia", "Liam", "Aisha", "Noah", "Emma", "Raj", "Lucas", "Fatima",
    "Ivan", "Mei", "Olivia", "Ethan", "Amelia", "Mohamed", "Anya", "Daniel",
];
const LAST_NAMES: &[&str] = &[
    "Davis", "Li", "Garcia", "Kim", "Silva", "Nguyen", "Patel", "Smith", "Müller", "Rossi", "Ahmed",
    "Johnson", "Ito", "Kowalski", "Brown", "Santos", "Taylor", "Lopez", "Wilson", "Anderson",
];
const CITIES: &[(&str, &str)] = &[
    ("San Diego", "SAN"),
    ("New York", "JFK"),
    ("Seattle", "SEA"),
    ("Boston", "BOS"),
    ("Chicago", "ORD"),
    ("Denver", "DEN"),
    ("Atlanta", "ATL"),
    ("Houston", "IAH"),
    ("Miami", "MIA"),
    ("Phoenix", "PHX"),
    ("Las Vegas", "LAS"),
    ("Detroit", "DTW"),
];
const DIRS: &[&str] = &[
    "src",
    "src/fields",
    "src/schema",
    "tests",
    "docs",
    "examples",
    "benches",
    "scripts",
];
const EXTS: &[&str] = &["rs", "py", "toml", "md", "json", "yaml", "txt", "ts"];
const LEVELS: &[&str] = &["INFO", "INFO", "INFO", "DEBUG", "DEBUG", "WARN", "ERROR"];
const CRATES: &[&str] = &[
    "serde",
    "serde_json",
    "tokio",
    "hyper",
    "regex",
    "rand",
    "clap",
    "tracing",
    "anyhow",
    "thiserror",
    "bytes",
    "futures",
    "itertools",
    "once_cell",
    "smallvec",
    "syn",
    "quote",
    "proc-macro2",
];
const KEYWORDS: &[&str] = &[
    "let", "fn", "if", "return", "for", "match", "pub", "def", "self", "const", "while", "else",
];

/// The kinds of tool a generated agent calls; each returns its own kind of text.
#[derive(Clone, Copy)]
enum Tool {
    Bash,
    ReadFile,
    ListDir,
    Grep,
    EditFile,
    GetUserDetails,
    SearchFlights,
    GetReservation,
    WebSearch,
    FetchLogs,
    SqlQuery,
}

const TOOLS: &[(Tool, u32)] = &[
    (Tool::Bash, 18),
    (Tool::ReadFile, 16),
    (Tool::ListDir, 8),
    (Tool::Grep, 10),
    (Tool::EditFile, 8),
    (Tool::GetUserDetails, 7),
    (Tool::SearchFlights, 7),
    (Tool::GetReservation, 7),
    (Tool::WebSearch, 7),
    (Tool::FetchLogs, 6),
    (Tool::SqlQuery, 6),
];

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Bash => "bash",
            Tool::ReadFile => "read_file",
            Tool::ListDir => "list_dir",
            Tool::Grep => "grep",
            Tool::EditFile => "edit_file",
            Tool::GetUserDetails => "get_user_details",
            Tool::SearchFlights => "search_direct_flight",
            Tool::GetReservation => "get_reservation_details",
            Tool::WebSearch => "web_search",
            Tool::FetchLogs => "fetch_logs",
            Tool::SqlQuery => "sql_query",
        }
    }
}

fn weighted<'a, T>(rng: &mut ChaCha8Rng, items: &'a [(T, u32)]) -> &'a T {
    let total: u32 = items.iter().map(|(_, w)| w).sum();
    let mut pick = rng.random_range(0..total);
    for (item, weight) in items {
        if pick < *weight {
            return item;
        }
        pick -= weight;
    }
    &items[items.len() - 1].0
}

impl Generator {
    pub fn new(seed: u64) -> Generator {
        Generator {
            rng: ChaCha8Rng::seed_from_u64(seed),
            calls: 0,
        }
    }

    fn pick<'a>(&mut self, items: &'a [&'a str]) -> &'a str {
        items.choose(&mut self.rng).copied().unwrap_or("")
    }

    fn sentence(&mut self) -> String {
        let words = self.rng.random_range(6..18);
        let mut out = String::new();
        for i in 0..words {
            let word = self.pick(WORDS);
            if i == 0 {
                let mut chars = word.chars();
                if let Some(first) = chars.next() {
                    out.extend(first.to_uppercase());
                    out.push_str(chars.as_str());
                }
            } else {
                out.push(' ');
                if self.rng.random_bool(0.06) {
                    out.push('`');
                    out.push_str(&self.ident());
                    out.push('`');
                } else {
                    out.push_str(word);
                }
            }
        }
        out.push_str(if self.rng.random_bool(0.1) { "?" } else { "." });
        out
    }

    /// Prose of about `bytes` bytes, in paragraphs.
    fn prose(&mut self, bytes: usize) -> String {
        let mut out = String::new();
        while out.len() < bytes {
            if !out.is_empty() {
                out.push_str(if self.rng.random_bool(0.25) { "\n\n" } else { " " });
            }
            out.push_str(&self.sentence());
        }
        out
    }

    /// Prose of a random length within `bytes`.
    fn prose_in(&mut self, bytes: std::ops::Range<usize>) -> String {
        let len = self.rng.random_range(bytes);
        self.prose(len)
    }

    fn ident(&mut self) -> String {
        let parts = self.rng.random_range(1..4);
        (0..parts)
            .map(|_| self.pick(IDENTS))
            .collect::<Vec<_>>()
            .join("_")
    }

    fn file_path(&mut self) -> String {
        format!("{}/{}.{}", self.pick(DIRS), self.ident(), self.pick(EXTS))
    }

    fn alnum(&mut self, len: usize) -> String {
        const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        (0..len)
            .map(|_| CHARS[self.rng.random_range(0..CHARS.len())] as char)
            .collect()
    }

    fn call_id(&mut self) -> String {
        self.calls += 1;
        format!("call_{}", self.alnum(24))
    }

    fn user_id(&mut self) -> String {
        let first = self.pick(FIRST_NAMES).to_lowercase();
        let last = self.pick(LAST_NAMES).to_lowercase();
        format!("{first}_{last}_{}", self.rng.random_range(1000..9999))
    }

    fn reservation_id(&mut self) -> String {
        const CHARS: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZ0123456789";
        (0..6)
            .map(|_| CHARS[self.rng.random_range(0..CHARS.len())] as char)
            .collect()
    }

    fn timestamp(&mut self) -> String {
        format!(
            "2024-05-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            self.rng.random_range(1..29),
            self.rng.random_range(0..24),
            self.rng.random_range(0..60),
            self.rng.random_range(0..60),
            self.rng.random_range(0..1000)
        )
    }

    /// The system prompt: a long policy/instructions text, as in the real data (3–6 KB).
    pub fn system_prompt(&mut self) -> Value {
        let mut text = String::from(
            "# Agent policy\n\nYou are an autonomous agent working in a terminal and with the \
             company's booking APIs. Use the tools to inspect files, run commands and look up \
             records; never invent a result you did not see.\n",
        );
        let sections = self.rng.random_range(4..8);
        for _ in 0..sections {
            text.push_str(&format!(
                "\n## {}\n\n",
                self.sentence().trim_end_matches(['.', '?'])
            ));
            let bullets = self.rng.random_range(3..7);
            for _ in 0..bullets {
                text.push_str("- ");
                text.push_str(&self.sentence());
                text.push('\n');
            }
        }
        json!({"role": "system", "content": text})
    }

    /// One turn: the user message, 0–3 rounds of tool calls with their results, the reply.
    pub fn turn(&mut self, turn: usize) -> Vec<Value> {
        let mut messages = Vec::new();
        let user = if turn == 1 {
            // The task: an issue text with a code block, as in SWE-agent's first message.
            let mut task = format!(
                "We need to fix the following issue.\nISSUE:\n{}\n\n```\n",
                self.prose(600)
            );
            for _ in 0..self.rng.random_range(4..12) {
                task.push_str(&self.code_line());
                task.push('\n');
            }
            task.push_str("```\n");
            task.push_str(&self.prose(300));
            task
        } else {
            let bytes = *weighted(&mut self.rng, &[(40usize, 40), (160, 40), (500, 20)]);
            self.prose_in(bytes / 2..bytes * 2)
        };
        messages.push(json!({"role": "user", "content": user}));

        let rounds = *weighted(&mut self.rng, &[(0usize, 35), (1, 45), (2, 15), (3, 5)]);
        for _ in 0..rounds {
            let calls = *weighted(&mut self.rng, &[(1usize, 75), (2, 18), (3, 7)]);
            let mut tool_calls = Vec::new();
            let mut results = Vec::new();
            for _ in 0..calls {
                let tool = *weighted(&mut self.rng, TOOLS);
                let id = self.call_id();
                let arguments = self.arguments(tool);
                tool_calls.push(json!({
                    "id": id,
                    "type": "function",
                    "function": {"name": tool.name(), "arguments": arguments},
                }));
                let size = weighted(&mut self.rng, &RESULT_SIZES).clone();
                let target = self.rng.random_range(size);
                let content = self.tool_output(tool, target);
                results.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            // The three real sources: tau-bench sends null, inspect "", SWE-agent a thought.
            let content = match self.rng.random_range(0..10) {
                0..=3 => Value::Null,
                4 => Value::String(String::new()),
                _ => Value::String(self.prose_in(80..400)),
            };
            let mut assistant = Map::new();
            assistant.insert("role".into(), "assistant".into());
            assistant.insert("content".into(), content);
            assistant.insert("tool_calls".into(), Value::Array(tool_calls));
            messages.push(Value::Object(assistant));
            messages.extend(results);
        }

        let mut reply = self.prose_in(100..800);
        if self.rng.random_bool(0.4) {
            reply.push_str("\n\n");
            for _ in 0..self.rng.random_range(2..6) {
                reply.push_str(&format!("- **{}**: {}\n", self.ident(), self.sentence()));
            }
        }
        messages.push(json!({"role": "assistant", "content": reply}));
        messages
    }

    fn arguments(&mut self, tool: Tool) -> String {
        let value = match tool {
            Tool::Bash => {
                let command = match self.rng.random_range(0..5) {
                    0 => format!("cargo test -p {} -- --nocapture", self.ident()),
                    1 => format!("ls -la {}", self.pick(DIRS)),
                    2 => format!("python -m pytest tests/test_{}.py -x -q", self.ident()),
                    3 => "cargo build --release 2>&1 | tail -n 200".to_string(),
                    _ => format!("git log --oneline -n 20 -- {}", self.file_path()),
                };
                json!({"command": command})
            }
            Tool::ReadFile => json!({"path": self.file_path(), "line": self.rng.random_range(1..400)}),
            Tool::ListDir => json!({"path": self.pick(DIRS), "recursive": self.rng.random_bool(0.3)}),
            Tool::Grep => json!({"pattern": self.ident(), "path": self.pick(DIRS), "regex": false}),
            Tool::EditFile => json!({
                "path": self.file_path(),
                "old_str": self.code_line(),
                "new_str": self.code_line(),
            }),
            Tool::GetUserDetails => json!({"user_id": self.user_id()}),
            Tool::SearchFlights => {
                let from = self.rng.random_range(0..CITIES.len());
                let to = (from + self.rng.random_range(1..CITIES.len())) % CITIES.len();
                json!({"origin": CITIES[from].1, "destination": CITIES[to].1,
                       "date": format!("2024-05-{:02}", self.rng.random_range(16..31))})
            }
            Tool::GetReservation => json!({"reservation_id": self.reservation_id()}),
            Tool::WebSearch => json!({"query": self.sentence().trim_end_matches(['.', '?']).to_lowercase()}),
            Tool::FetchLogs => json!({"service": self.ident(), "since": self.timestamp(), "level": "INFO"}),
            Tool::SqlQuery => json!({"query": format!(
                "SELECT id, {}, {}, created_at FROM {} WHERE status = 'open' ORDER BY created_at DESC LIMIT 50",
                self.ident(), self.ident(), self.ident())}),
        };
        value.to_string()
    }

    /// A tool's output of about `target` bytes (never more than `target` + one line).
    fn tool_output(&mut self, tool: Tool, target: usize) -> String {
        if target < 40 {
            // Tiny results: acknowledgements and empty outputs, as real tools give.
            return match self.rng.random_range(0..3) {
                0 => String::new(),
                1 => "OK".to_string(),
                _ => "File updated successfully.".to_string(),
            };
        }
        match tool {
            Tool::GetUserDetails | Tool::GetReservation | Tool::SearchFlights | Tool::SqlQuery => {
                self.json_records(tool, target)
            }
            Tool::ReadFile => {
                let path = self.file_path();
                let mut out = format!(
                    "[File: {path} ({} lines total)]\r\n",
                    self.rng.random_range(50..900)
                );
                let mut line = self.rng.random_range(1..300);
                self.lines(&mut out, target, |g| {
                    line += 1;
                    format!("{line}:{}\r\n", g.code_line())
                });
                out
            }
            Tool::ListDir => {
                let mut out = format!("total {}\n", self.rng.random_range(8..400));
                self.lines(&mut out, target, |g| {
                    let dir = g.rng.random_bool(0.2);
                    format!(
                        "{} {:>3} agent agent {:>8} May {:>2} {:02}:{:02} {}{}\n",
                        if dir { "drwxr-xr-x" } else { "-rw-r--r--" },
                        g.rng.random_range(1..5),
                        g.rng.random_range(0..200_000),
                        g.rng.random_range(1..31),
                        g.rng.random_range(0..24),
                        g.rng.random_range(0..60),
                        g.ident(),
                        if dir {
                            "/".to_string()
                        } else {
                            format!(".{}", g.pick(EXTS))
                        },
                    )
                });
                out
            }
            Tool::Grep => {
                let mut out = String::new();
                self.lines(&mut out, target, |g| {
                    format!(
                        "{}:{}:{}\n",
                        g.file_path(),
                        g.rng.random_range(1..2000),
                        g.code_line()
                    )
                });
                out
            }
            Tool::Bash => {
                let mut out = String::new();
                self.lines(&mut out, target, |g| match g.rng.random_range(0..6) {
                    0 => format!(
                        "   Compiling {} v{}.{}.{}\n",
                        g.pick(CRATES),
                        g.rng.random_range(0..3),
                        g.rng.random_range(0..40),
                        g.rng.random_range(0..20)
                    ),
                    1 => format!(
                        "test {}::{}::{} ... {}\n",
                        g.ident(),
                        g.ident(),
                        g.ident(),
                        if g.rng.random_bool(0.93) { "ok" } else { "FAILED" }
                    ),
                    2 => format!(
                        "warning: unused variable: `{}`\n  --> {}:{}:{}\n",
                        g.ident(),
                        g.file_path(),
                        g.rng.random_range(1..900),
                        g.rng.random_range(1..80)
                    ),
                    3 => format!(
                        "Requirement already satisfied: {}>={}.{} in /usr/lib/python3/site-packages ({}.{}.{})\n",
                        g.ident(),
                        g.rng.random_range(0..5),
                        g.rng.random_range(0..20),
                        g.rng.random_range(0..5),
                        g.rng.random_range(0..20),
                        g.rng.random_range(0..9)
                    ),
                    _ => format!("{}\n", g.code_line()),
                });
                out
            }
            Tool::FetchLogs => {
                let mut out = String::new();
                self.lines(&mut out, target, |g| {
                    format!(
                        "{} {:<5} {} request_id={} user={} latency_ms={} status={} msg=\"{}\"\n",
                        g.timestamp(),
                        g.pick(LEVELS),
                        g.ident(),
                        g.alnum(12).to_lowercase(),
                        g.user_id(),
                        g.rng.random_range(1..4_000),
                        [200, 200, 200, 201, 404, 500, 503][g.rng.random_range(0..7)],
                        g.sentence()
                    )
                });
                out
            }
            Tool::WebSearch => {
                let mut out = String::new();
                let mut rank = 0;
                self.lines(&mut out, target, |g| {
                    rank += 1;
                    format!(
                        "{rank}. {}\n   https://{}.example.org/{}/{}\n   {}\n\n",
                        g.sentence().trim_end_matches(['.', '?']),
                        g.pick(IDENTS),
                        g.ident(),
                        g.alnum(8).to_lowercase(),
                        g.prose(160)
                    )
                });
                out
            }
            Tool::EditFile => {
                let mut out = String::from(
                    "The file has been edited. Here is the result of running `cat -n` on a snippet:\n",
                );
                let mut line = self.rng.random_range(1..300);
                self.lines(&mut out, target, |g| {
                    line += 1;
                    format!("{line:>6}\t{}\n", g.code_line())
                });
                out
            }
        }
    }

    /// Appends lines made by `line` while `out` stays within `target` bytes (at least one).
    fn lines(&mut self, out: &mut String, target: usize, mut line: impl FnMut(&mut Generator) -> String) {
        loop {
            let next = line(self);
            if out.len() + next.len() > target && !out.is_empty() {
                break;
            }
            out.push_str(&next);
            if out.len() >= target {
                break;
            }
        }
    }

    fn code_line(&mut self) -> String {
        let indent = "    ".repeat(self.rng.random_range(0..4));
        match self.rng.random_range(0..7) {
            0 => format!(
                "{indent}let {} = {}.{}()?;",
                self.ident(),
                self.ident(),
                self.ident()
            ),
            1 => format!(
                "{indent}if {} > {} {{",
                self.ident(),
                self.rng.random_range(0..1000)
            ),
            2 => format!(
                "{indent}return {}({}, {});",
                self.ident(),
                self.ident(),
                self.ident()
            ),
            3 => format!("{indent}# {}", self.sentence()),
            4 => format!(
                "{indent}{} {}(self, {}: {}) -> {}:",
                self.pick(KEYWORDS),
                self.ident(),
                self.ident(),
                self.pick(&["int", "str", "float", "dict", "list"]),
                self.pick(&["None", "bool", "str"])
            ),
            5 => format!("{indent}}}"),
            _ => format!(
                "{indent}self.{} = {}[\"{}\"]",
                self.ident(),
                self.ident(),
                self.ident()
            ),
        }
    }

    /// A JSON document of records (a user, reservations, flights, rows) of about `target` bytes.
    fn json_records(&mut self, tool: Tool, target: usize) -> String {
        let mut records = Vec::new();
        let mut size = 2;
        loop {
            let record = self.record(tool);
            let len = record.to_string().len() + 2;
            if size + len > target && !records.is_empty() {
                break;
            }
            size += len;
            records.push(record);
            if size >= target {
                break;
            }
        }
        match tool {
            Tool::GetUserDetails => {
                let first = self.pick(FIRST_NAMES);
                let last = self.pick(LAST_NAMES);
                let (city, _) = *CITIES.choose(&mut self.rng).unwrap_or(&CITIES[0]);
                json!({
                    "name": {"first_name": first, "last_name": last},
                    "address": {"address1": format!("{} Spruce Street", self.rng.random_range(1..999)),
                                "city": city, "country": "USA"},
                    "email": format!("{}.{}{}@example.com", first.to_lowercase(), last.to_lowercase(),
                                     self.rng.random_range(1..9999)),
                    "reservations": records,
                })
                .to_string()
            }
            _ => Value::Array(records).to_string(),
        }
    }

    fn record(&mut self, tool: Tool) -> Value {
        let from = self.rng.random_range(0..CITIES.len());
        let to = (from + self.rng.random_range(1..CITIES.len())) % CITIES.len();
        let cabin = ["basic_economy", "economy", "business"][self.rng.random_range(0..3)];
        let status = ["available", "booked", "cancelled"][self.rng.random_range(0..3)];
        match tool {
            Tool::SqlQuery => json!({
                "id": self.rng.random_range(10_000..99_999),
                self.ident(): self.sentence(),
                "status": "open",
                "amount": (self.rng.random_range(100..900_000) as f64) / 100.0,
                "created_at": self.timestamp(),
            }),
            _ => json!({
                "reservation_id": self.reservation_id(),
                "flight_number": format!("HAT{:03}", self.rng.random_range(1..400)),
                "origin": CITIES[from].1,
                "destination": CITIES[to].1,
                "date": format!("2024-05-{:02}", self.rng.random_range(1..31)),
                "cabin": cabin,
                "price": self.rng.random_range(50..2_500),
                "passengers": [{"first_name": self.pick(FIRST_NAMES), "last_name": self.pick(LAST_NAMES),
                                "dob": format!("19{}-{:02}-{:02}", self.rng.random_range(50..99),
                                               self.rng.random_range(1..13), self.rng.random_range(1..29))}],
                "status": status,
            }),
        }
    }
}
