//! Structured inputs from raw bytes: a reader that turns the fuzzer's bytes into choices
//! (what `arbitrary`'s `Unstructured` does), and a generator of valid configuration files
//! in many layouts, which records where each value it wrote is.

use std::ops::Range;

/// Choices read from bytes; past the end every choice is 0 (the first option).
pub struct Choices<'a> {
    data: &'a [u8],
}

impl<'a> Choices<'a> {
    pub fn new(data: &'a [u8]) -> Choices<'a> {
        Choices { data }
    }

    fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// A number in `0..n` (`n` ≥ 1, at most 65,536).
    pub fn below(&mut self, n: usize) -> usize {
        let value = if n <= 256 {
            usize::from(self.byte())
        } else {
            usize::from(self.byte()) << 8 | usize::from(self.byte())
        };
        value % n
    }

    pub fn flag(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    pub fn pick<T: Copy>(&mut self, options: &[T]) -> T {
        options[self.below(options.len())]
    }
}

/// Plugins the generated files name (available or not: no library is ever loaded).
pub const PLUGINS: &[&str] = &[
    "tool_result_filter",
    "retention",
    "token_budget",
    "role_pair",
    "summarize",
];

/// A generated configuration and where its values are, as line indexes into the text.
pub struct Generated {
    pub text: String,
    /// The lines of `chain = [...]` and of `view = [...]` (from the key to the `]`).
    pub chain: Option<Range<usize>>,
    pub view: Option<Range<usize>>,
    /// The line of each scalar the edits change.
    pub agent_max_ctx: Option<usize>,
    pub max_users: Option<usize>,
    pub session_timeout: Option<usize>,
}

struct Writer {
    text: String,
    line: usize,
    newline: &'static str,
}

impl Writer {
    fn line(&mut self, text: &str) -> usize {
        self.text.push_str(text);
        self.text.push_str(self.newline);
        self.line += 1;
        self.line - 1
    }
}

fn comment(c: &mut Choices) -> &'static str {
    c.pick(&[
        "",
        "",
        "  # a comment",
        " #",
        "\t# tabs\t",
        "  # \"quoted\" = [x]",
    ])
}

fn key_value(c: &mut Choices, key: &str, value: &str) -> String {
    let eq = c.pick(&[" = ", "=", "  =  ", " =\t"]);
    format!("{key}{eq}{value}{}", comment(c))
}

fn filler(c: &mut Choices, w: &mut Writer) {
    for _ in 0..c.below(3) {
        let line = c.pick(&["", "# operator's note", "   ", "#[history]", "# chain = [\"x\"]"]);
        w.line(line);
    }
}

/// A list of plugin names, on one line or one per line with comments.
fn list(c: &mut Choices, w: &mut Writer, key: &str, names: &[&str]) -> Range<usize> {
    let quoted: Vec<String> = names
        .iter()
        .map(|n| {
            if c.below(4) == 0 {
                format!("'{n}'")
            } else {
                format!("\"{n}\"")
            }
        })
        .collect();
    if names.is_empty() || c.flag() {
        let sep = c.pick(&[", ", ",", " , "]);
        let trailing = if !names.is_empty() && c.below(4) == 0 {
            ","
        } else {
            ""
        };
        let at = w.line(&key_value(c, key, &format!("[{}{trailing}]", quoted.join(sep))));
        at..at + 1
    } else {
        let indent = c.pick(&["  ", "    ", "\t", ""]);
        let first = w.line(&key_value(c, key, "["));
        for (i, name) in quoted.iter().enumerate() {
            if c.below(4) == 0 {
                w.line(&format!("{indent}# about {}", names[i]));
            }
            let comma = if i + 1 < quoted.len() || c.flag() { "," } else { "" };
            w.line(&format!("{indent}{name}{comma}{}", comment(c)));
        }
        let last = w.line(c.pick(&["]", "]  # end", "  ]"]));
        first..last + 1
    }
}

/// A configuration file the host accepts (`default` first in the chain, names unique,
/// integers ≥ 1 where they must be), in a layout chosen by `c`.
pub fn config(c: &mut Choices) -> Generated {
    let mut w = Writer {
        text: String::new(),
        line: 0,
        newline: if c.below(4) == 0 { "\r\n" } else { "\n" },
    };
    let mut generated = Generated {
        text: String::new(),
        chain: None,
        view: None,
        agent_max_ctx: None,
        max_users: None,
        session_timeout: None,
    };
    filler(c, &mut w);
    w.line(&key_value(c, "plugin_dir", "\"plugins\""));
    if c.flag() {
        let n = 1 + c.below(100);
        generated.max_users = Some(w.line(&key_value(c, "max_users", &n.to_string())));
    }
    if c.flag() {
        let n = c.below(1000);
        generated.session_timeout =
            Some(w.line(&key_value(c, "session_idle_timeout_minutes", &n.to_string())));
    }
    filler(c, &mut w);
    // Unique plugins, split between the chain and the view.
    let mut chain = vec!["default"];
    let mut view = Vec::new();
    for &plugin in PLUGINS {
        match c.below(3) {
            0 => chain.push(plugin),
            1 => view.push(plugin),
            _ => {}
        }
    }
    if chain.len() > 1 && c.flag() {
        let (a, b) = (1 + c.below(chain.len() - 1), 1 + c.below(chain.len() - 1));
        chain.swap(a, b);
    }
    if c.below(5) != 0 {
        w.line(c.pick(&["[history]", "[history]  # the chain", "[ history ]"]));
        for part in 0..4 {
            match (part + c.below(4)) % 4 {
                0 if generated.agent_max_ctx.is_none() && c.flag() => {
                    let n = 1 + c.below(300);
                    generated.agent_max_ctx = Some(w.line(&key_value(c, "agent_max_ctx", &n.to_string())));
                }
                1 if generated.chain.is_none() => generated.chain = Some(list(c, &mut w, "chain", &chain)),
                2 if generated.view.is_none() && c.flag() => {
                    generated.view = Some(list(c, &mut w, "view", &view))
                }
                3 if c.below(4) == 0 => {
                    w.line(&key_value(c, "on_plugin_error", "\"skip\""));
                }
                _ => filler(c, &mut w),
            }
        }
        if generated.chain.is_none() {
            generated.chain = Some(list(c, &mut w, "chain", &chain));
        }
    }
    for _ in 0..c.below(3) {
        filler(c, &mut w);
        match c.below(3) {
            0 => {
                w.line(&format!("[models.{}]", c.pick(&["gpt-4o", "local", "\"a.b\""])));
                w.line(&key_value(c, "context_tokens", "8192"));
                let tokenizer = c.pick(&["\"o200k_base\"", "\"cl100k_base\"", "\"chars4\""]);
                w.line(&key_value(c, "tokenizer", tokenizer));
            }
            1 => {
                w.line(&format!("[plugin.{}]{}", c.pick(PLUGINS), comment(c)));
                w.line(&key_value(c, "placeholder", "\"[Omitted]\""));
            }
            _ => {
                w.line("[plugin.default]");
                w.line(&key_value(c, "pin_system", "true"));
            }
        }
    }
    let mut text = w.text;
    if c.below(8) == 0 {
        // No final line ending.
        let end = text.trim_end_matches(['\r', '\n']).len();
        text.truncate(end);
    }
    generated.text = text;
    generated
}
