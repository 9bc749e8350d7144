//! `agentctl`'s edits of `plugins-enabled.toml` (SPEC §6.2).
//!
//! An edit changes only the value it is about: the file goes through
//! [`toml_edit::DocumentMut`], so comments, key order, blank lines and the formatting of
//! every untouched line survive, and the chain array keeps its layout (one line or one
//! entry per line, with the comments around entries). A key the file lacks is inserted in
//! its table (`[history]` is created, before the first table, when missing).
//!
//! Every edit is validated before anything is written, by the rules the host applies at
//! load: the edited text is re-parsed by [`Config::parse`], the chain's plugins must be
//! in the [`Catalog`], and [`Chain::load`] instantiates the chain so every plugin validates
//! its own table. Then [`write_atomic`] replaces the file: a temporary file in the same
//! folder, written and fsynced, renamed over the original, and the folder fsynced. A
//! refusal or a crash never leaves a changed or half-written file.

use std::io::Write;
use std::path::{Path, PathBuf};

use toml_edit::{Array, DocumentMut, Item, RawString, Table, Value};

use crate::chain::Chain;
use crate::config::{is_plugin_name, Config};
use crate::loader::Catalog;

/// The environment variable of the fault-injection hook: `after-write` makes the process
/// exit after the temporary file is written and before it is renamed over the
/// configuration (what a crash at the worst moment does). For tests.
pub const FAULT_ENV: &str = "AGENTCTL_FAULT";

/// The exit status of a process stopped by the fault hook.
pub const FAULT_EXIT_STATUS: i32 = 70;

/// One edit of the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// Append `name` to the chain, or insert it at position `at` (0 is `default`'s).
    ChainAdd { name: String, at: Option<usize> },
    /// Remove `name` from the chain.
    ChainRemove { name: String },
    /// Move `name` to position `to` of the resulting chain (1 = right after `default`).
    ChainMove { name: String, to: usize },
    /// `[history] agent_max_ctx`.
    MaxCtx(u64),
    /// `max_users`.
    MaxUsers(u64),
    /// `session_idle_timeout_minutes` (0 = never reap).
    SessionTimeout(u64),
}

/// A refused edit: one line saying what and why. The file is untouched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// An edit applied to the text (not yet validated against the plugins, not written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// The whole new file text.
    pub text: String,
    /// What changed, in one line (`agent_max_ctx: 200 -> 500`).
    pub summary: String,
}

/// What [`run`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The file that was (or would have been) written.
    pub file: PathBuf,
    /// What changed, in one line.
    pub summary: String,
    /// False when the edit asked for what the file already says: nothing was written.
    pub written: bool,
}

/// Reads `file`, applies `edit`, validates the result as the host would load it, and
/// writes it atomically. Any refusal leaves the file as it was.
pub fn run(file: &Path, edit: &Edit) -> Result<Outcome, Refused> {
    // One agentctl edits a file at a time: no edit is lost to another's read-modify-write.
    let _lock = EditLock::acquire(file)?;
    let source = std::fs::read_to_string(file).map_err(|err| {
        Refused(format!(
            "cannot read {}: {err} (point --config at your plugins-enabled.toml)",
            file.display()
        ))
    })?;
    let config = Config::parse(file, source.clone()).map_err(|err| Refused(err.to_string()))?;
    let catalog =
        Catalog::discover(&config.plugin_dir).map_err(|err| Refused(format!("{}: {err}", file.display())))?;
    let planned = apply(file, &source, edit, Some(&catalog))?;
    if planned.text == source {
        return Ok(Outcome {
            file: file.to_path_buf(),
            summary: planned.summary,
            written: false,
        });
    }
    if let Err(refused) = validate(file, &planned.text, &catalog) {
        // Say so when the file was broken before the edit and the edit does not fix it.
        return Err(match validate(file, &source, &catalog) {
            Ok(_) => refused,
            Err(_) => Refused(refused.0.replace(
                "refused: after this edit the configuration would not load:",
                "refused: the configuration does not load, and this edit does not fix it:",
            )),
        });
    }
    write_atomic(file, &planned.text, &source).map_err(Refused)?;
    Ok(Outcome {
        file: file.to_path_buf(),
        summary: planned.summary,
        written: true,
    })
}

/// Checks edited text by the host's own rules: it parses ([`Config::parse`]), every
/// chain plugin is available, and the chain loads with every plugin validating its table.
pub fn validate(file: &Path, text: &str, catalog: &Catalog) -> Result<Config, Refused> {
    let refuse = |why: String| {
        Refused(format!(
            "refused: after this edit the configuration would not load: {why}"
        ))
    };
    let config = Config::parse(file, text.to_string()).map_err(|err| refuse(err.to_string()))?;
    Chain::load(&config, catalog).map_err(|err| refuse(err.to_string()))?;
    Ok(config)
}

/// Applies `edit` to `source`, the text of `file`, refusing what the command's own rules
/// forbid (SPEC §6.2). With a catalog, a plugin to add must be in it.
pub fn apply(file: &Path, source: &str, edit: &Edit, catalog: Option<&Catalog>) -> Result<Planned, Refused> {
    let config = Config::parse(file, source.to_string()).map_err(|err| Refused(err.to_string()))?;
    let mut document: DocumentMut = source
        .parse()
        .map_err(|err| Refused(format!("{}: not valid TOML: {err}", file.display())))?;
    // toml_edit writes `\n` line endings; [`keep_untouched_lines`] gives the file its own back.
    let newline = "\n";
    let chain = &config.chain;
    let summary = match edit {
        Edit::ChainAdd { name, at } => {
            check_name(name)?;
            if let Some(catalog) = catalog {
                check_available(name, &config, catalog)?;
            }
            if let Some(position) = chain.iter().position(|n| n == name) {
                let hint = if name == "default" {
                    "it is always first".to_string()
                } else {
                    format!("move it with `agentctl history-chain-move {name} POS`")
                };
                return Err(Refused(format!(
                    "plugin \"{name}\" is already in the chain, at position {position} ({hint})"
                )));
            }
            let at = at.unwrap_or(chain.len());
            check_position(at, chain.len(), chain, "--at")?;
            match chain_array(&mut document) {
                Some(array) => {
                    let layout = Layout::of(array);
                    insert_entry(array, at, name, "", &layout, newline);
                }
                None => {
                    let mut names: Vec<&str> = chain.iter().map(String::as_str).collect();
                    names.insert(at, name);
                    history_table(&mut document).insert("chain", toml_edit::value(Array::from_iter(names)));
                }
            }
            let mut after = chain.clone();
            after.insert(at, name.clone());
            format!(
                "added \"{name}\" to the chain at position {at}: {}",
                after.join(", ")
            )
        }
        Edit::ChainRemove { name } => {
            check_name(name)?;
            if name == "default" {
                return Err(Refused(
                    "\"default\" cannot be removed: it is always first in the chain".to_string(),
                ));
            }
            let from = in_chain(name, chain)?;
            let array = chain_array(&mut document).ok_or_else(|| no_chain_array(file))?;
            remove_entry(array, from);
            let mut after = chain.clone();
            after.remove(from);
            format!("removed \"{name}\" from the chain: {}", after.join(", "))
        }
        Edit::ChainMove { name, to } => {
            check_name(name)?;
            if name == "default" {
                return Err(Refused(
                    "\"default\" cannot be moved: it is always first in the chain (position 0)".to_string(),
                ));
            }
            let from = in_chain(name, chain)?;
            check_position(*to, chain.len() - 1, chain, "position")?;
            if from == *to {
                return Ok(Planned {
                    text: source.to_string(),
                    summary: format!("\"{name}\" is already at position {to}: {}", chain.join(", ")),
                });
            }
            let array = chain_array(&mut document).ok_or_else(|| no_chain_array(file))?;
            let layout = Layout::of(array);
            let comment = remove_entry(array, from);
            insert_entry(array, *to, name, &comment, &layout, newline);
            let mut after = chain.clone();
            let moved = after.remove(from);
            after.insert(*to, moved);
            format!("moved \"{name}\" to position {to}: {}", after.join(", "))
        }
        Edit::MaxCtx(n) => {
            check_at_least_one(*n, "history-maxctx", "agent_max_ctx")?;
            set_integer(history_table(&mut document), "agent_max_ctx", *n)?;
            format!("agent_max_ctx: {} -> {n}", config.agent_max_ctx)
        }
        Edit::MaxUsers(n) => {
            check_at_least_one(*n, "max-users", "max_users")?;
            set_integer(document.as_table_mut(), "max_users", *n)?;
            format!("max_users: {} -> {n}", config.max_users)
        }
        Edit::SessionTimeout(n) => {
            set_integer(document.as_table_mut(), "session_idle_timeout_minutes", *n)?;
            let shown = |m: u64| {
                if m == 0 {
                    "0 (never reap)".to_string()
                } else {
                    m.to_string()
                }
            };
            format!(
                "session_idle_timeout_minutes: {} -> {}",
                shown(config.session_idle_timeout_minutes),
                shown(*n)
            )
        }
    };
    let text = keep_untouched_lines(source, &document.to_string());
    let summary = if text == source {
        format!("{summary} (the file already says so; unchanged)")
    } else {
        summary
    };
    Ok(Planned { text, summary })
}

/// The edited text with every line the edit did not touch exactly as in `source`.
///
/// toml_edit keeps a document's text except for a few normalizations: it writes `\n`
/// line endings, drops a byte-order mark and ends the file with a line ending. So the
/// lines of the edited text that are unchanged from toml_edit's rendering of the original
/// (matched by a line diff) are written as the original's own lines, and new or changed
/// lines take the file's usual line ending.
fn keep_untouched_lines(source: &str, edited: &str) -> String {
    const BOM: char = '\u{feff}';
    let (bom, body) = match source.strip_prefix(BOM) {
        Some(body) => (BOM.to_string(), body),
        None => (String::new(), source),
    };
    let Ok(original) = body.parse::<DocumentMut>() else {
        return edited.to_string();
    };
    let rendered = original.to_string();
    let bare = |line: &str| -> String {
        let line = line.strip_suffix('\n').unwrap_or(line);
        line.strip_suffix('\r').unwrap_or(line).to_string()
    };
    let src: Vec<&str> = body.split_inclusive('\n').collect();
    let old: Vec<&str> = rendered.split_inclusive('\n').collect();
    let new: Vec<&str> = edited.split_inclusive('\n').collect();
    if src.len() != old.len() || src.iter().zip(&old).any(|(s, o)| bare(s) != bare(o)) {
        // Not a line-for-line rendering: keep toml_edit's text as it is.
        return format!("{bom}{edited}");
    }
    let crlf_lines = src.iter().filter(|l| l.ends_with("\r\n")).count();
    let newline = if crlf_lines * 2 > src.iter().filter(|l| l.ends_with('\n')).count() {
        "\r\n"
    } else {
        "\n"
    };

    // Unchanged lines: the common start and end, then a longest common subsequence of
    // the (small) middle.
    let mut start = 0;
    while start < old.len() && start < new.len() && old[start] == new[start] {
        start += 1;
    }
    let mut end = 0;
    while end < old.len() - start
        && end < new.len() - start
        && old[old.len() - 1 - end] == new[new.len() - 1 - end]
    {
        end += 1;
    }
    let (old_mid, new_mid) = (&old[start..old.len() - end], &new[start..new.len() - end]);
    let mut lcs = vec![vec![0usize; new_mid.len() + 1]; old_mid.len() + 1];
    for i in (0..old_mid.len()).rev() {
        for j in (0..new_mid.len()).rev() {
            lcs[i][j] = if old_mid[i] == new_mid[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut origin: Vec<Option<usize>> = (0..start).map(Some).collect();
    let (mut i, mut j) = (0, 0);
    while j < new_mid.len() {
        if i < old_mid.len() && old_mid[i] == new_mid[j] {
            origin.push(Some(start + i));
            i += 1;
            j += 1;
        } else if i < old_mid.len() && lcs[i + 1][j] >= lcs[i][j + 1] {
            i += 1;
        } else {
            origin.push(None);
            j += 1;
        }
    }
    origin.extend((old.len() - end..old.len()).map(Some));

    let mut out = bom;
    let mut unterminated = false;
    for (line, origin) in new.iter().zip(origin) {
        if unterminated {
            // The original's last line had no line ending and is no longer last.
            out.push_str(newline);
        }
        unterminated = false;
        match origin {
            Some(k) => {
                out.push_str(src[k]);
                unterminated = !src[k].ends_with('\n');
            }
            None => match line.strip_suffix('\n') {
                Some(content) => {
                    out.push_str(content.strip_suffix('\r').unwrap_or(content));
                    out.push_str(newline);
                }
                None => out.push_str(line),
            },
        }
    }
    if !body.is_empty() && !body.ends_with('\n') {
        let trimmed = out.strip_suffix('\n').map(|o| o.strip_suffix('\r').unwrap_or(o));
        if let Some(trimmed) = trimmed {
            out.truncate(trimmed.len());
        }
    }
    out
}

fn no_chain_array(file: &Path) -> Refused {
    Refused(format!(
        "{}: [history] chain is not an array agentctl can edit; edit it by hand",
        file.display()
    ))
}

fn check_name(name: &str) -> Result<(), Refused> {
    if is_plugin_name(name) {
        Ok(())
    } else {
        Err(Refused(format!(
            "\"{name}\" is not a plugin name: names are plain identifiers (lowercase letters, digits, _), never paths"
        )))
    }
}

fn check_available(name: &str, config: &Config, catalog: &Catalog) -> Result<(), Refused> {
    if catalog.plugins.contains_key(name) {
        return Ok(());
    }
    if let Some(refusal) = catalog.refusal_for(name) {
        return Err(Refused(format!("plugin \"{name}\" cannot be loaded: {refusal}")));
    }
    Err(Refused(format!(
        "unknown plugin \"{name}\": no library in {} exports it (available: {})",
        config.plugin_dir.display(),
        catalog.available_names()
    )))
}

fn in_chain(name: &str, chain: &[String]) -> Result<usize, Refused> {
    chain.iter().position(|n| n == name).ok_or_else(|| {
        Refused(format!(
            "plugin \"{name}\" is not in the chain (chain: {})",
            if chain.is_empty() {
                "default".to_string()
            } else {
                chain.join(", ")
            }
        ))
    })
}

/// A position for a plugin: 1 ..= `last` (0 is `default`'s).
fn check_position(position: usize, last: usize, chain: &[String], what: &str) -> Result<(), Refused> {
    let range = if last == 1 {
        "the only position is 1".to_string()
    } else {
        format!("positions run from 1 (right after default) to {last}")
    };
    if position == 0 {
        return Err(Refused(format!(
            "{what} 0 is default's: default is always first; {range}"
        )));
    }
    if position > last {
        return Err(Refused(format!(
            "{what} {position} is out of range: the chain is {} ({} plugins), {range}",
            chain.join(", "),
            chain.len()
        )));
    }
    Ok(())
}

fn check_at_least_one(n: u64, command: &str, key: &str) -> Result<(), Refused> {
    if n == 0 {
        Err(Refused(format!("{command} 0: {key} must be at least 1")))
    } else {
        Ok(())
    }
}

/// Sets integer `key` of `table`, keeping the key, its decoration and any comment after
/// the value; a missing key is appended to the table.
fn set_integer(table: &mut Table, key: &str, n: u64) -> Result<(), Refused> {
    let n = i64::try_from(n).map_err(|_| Refused(format!("{n} is too large for `{key}`")))?;
    match table.get_mut(key) {
        Some(Item::Value(value)) => {
            let decor = value.decor().clone();
            let mut new = Value::from(n);
            *new.decor_mut() = decor;
            *value = new;
        }
        _ => {
            table.insert(key, toml_edit::value(n));
        }
    }
    Ok(())
}

/// `[history]`, created when missing: before the first table, so the file keeps the
/// order of SPEC §4.1 (top-level keys, `[history]`, models, plugin tables).
fn history_table(document: &mut DocumentMut) -> &mut Table {
    let exists = matches!(document.get("history"), Some(Item::Table(_)));
    if !exists {
        let mut table = Table::new();
        let first = first_position(document.as_table());
        if let Some(first) = first {
            table.set_position(Some(first - 1));
        }
        let has_content = document.as_table().iter().next().is_some();
        if has_content {
            table.decor_mut().set_prefix("\n");
        }
        document.insert("history", Item::Table(table));
    }
    document["history"].as_table_mut().expect("[history] is a table")
}

fn first_position(table: &Table) -> Option<isize> {
    table
        .iter()
        .filter_map(|(_, item)| item.as_table())
        .flat_map(|t| {
            let own = if t.is_implicit() { None } else { t.position() };
            own.into_iter().chain(first_position(t))
        })
        .min()
}

/// `[history] chain`, when the file has it.
fn chain_array(document: &mut DocumentMut) -> Option<&mut Array> {
    document
        .get_mut("history")?
        .as_table_like_mut()?
        .get_mut("chain")?
        .as_array_mut()
}

/// How a chain array is laid out, taken before an edit.
struct Layout {
    /// One entry per line (at least one line break between entries or before `]`).
    multiline: bool,
    /// The indentation of an entry on its own line.
    indent: String,
    /// What separates entries on one line (after the comma).
    separator: String,
    /// The entries are 'literal strings'.
    literal: bool,
}

fn raw(text: Option<&RawString>) -> String {
    text.and_then(RawString::as_str).unwrap_or("").to_string()
}

fn prefix(array: &Array, index: usize) -> String {
    array
        .get(index)
        .map(|v| raw(v.decor().prefix()))
        .unwrap_or_default()
}

fn suffix(array: &Array, index: usize) -> String {
    array
        .get(index)
        .map(|v| raw(v.decor().suffix()))
        .unwrap_or_default()
}

fn set_prefix(array: &mut Array, index: usize, text: String) {
    if let Some(value) = array.get_mut(index) {
        value.decor_mut().set_prefix(text);
    }
}

fn set_suffix(array: &mut Array, index: usize, text: String) {
    if let Some(value) = array.get_mut(index) {
        value.decor_mut().set_suffix(text);
    }
}

impl Layout {
    fn of(array: &Array) -> Layout {
        let prefixes: Vec<String> = (0..array.len()).map(|i| prefix(array, i)).collect();
        let last_suffix = array
            .len()
            .checked_sub(1)
            .map(|i| suffix(array, i))
            .unwrap_or_default();
        let trailing = raw(Some(array.trailing()));
        let multiline = prefixes.iter().any(|p| p.contains('\n'))
            || trailing.contains('\n')
            || last_suffix.contains('\n');
        let indent = prefixes
            .iter()
            .rev()
            .find_map(|p| p.rfind('\n').map(|i| p[i + 1..].to_string()))
            .unwrap_or_else(|| "    ".to_string());
        let separator = prefixes
            .iter()
            .skip(1)
            .find(|p| !p.contains('\n'))
            .cloned()
            .unwrap_or_else(|| " ".to_string());
        let literal = match array.get(0) {
            Some(Value::String(s)) => s
                .as_repr()
                .and_then(|r| r.as_raw().as_str())
                .is_some_and(|raw| raw.starts_with('\'')),
            _ => false,
        };
        Layout {
            multiline,
            indent,
            separator,
            literal,
        }
    }
}

/// Splits a gap between entries into the rest of the current line (a comment trailing
/// the entry before, without the line ending) and the remainder from the line ending.
fn split_first_line(gap: &str) -> (&str, &str) {
    match gap.find('\n') {
        Some(i) => {
            let end = if i > 0 && gap.as_bytes()[i - 1] == b'\r' {
                i - 1
            } else {
                i
            };
            (&gap[..end], &gap[end..])
        }
        None => (gap, ""),
    }
}

/// `text` without its last line (from its last line ending on).
fn before_last_line(text: &str) -> &str {
    match text.rfind('\n') {
        Some(i) if i > 0 && text.as_bytes()[i - 1] == b'\r' => &text[..i - 1],
        Some(i) => &text[..i],
        None => "",
    }
}

/// Makes sure a same-line comment is followed by a line ending.
fn after_comment(comment: &str, rest: &str, newline: &str, indent: &str) -> String {
    if comment.trim().is_empty() || rest.starts_with('\n') || rest.starts_with("\r\n") {
        format!("{comment}{rest}")
    } else {
        format!("{comment}{newline}{indent}{rest}")
    }
}

/// Inserts `name` at `index` (≥ 1) in the chain array, laid out like its neighbours;
/// `comment` is a same-line comment that travels with a moved entry.
fn insert_entry(array: &mut Array, index: usize, name: &str, comment: &str, layout: &Layout, newline: &str) {
    // Quoted like the other entries: 'literal' or "basic" (names need no escaping).
    let mut value = if layout.literal {
        format!("'{name}'").parse().unwrap_or_else(|_| Value::from(name))
    } else {
        Value::from(name)
    };
    if index < array.len() {
        // The entry now at `index` gives up the start of its gap: the comment trailing the
        // entry before stays on that entry's line; the new entry gets its own line.
        let gap = prefix(array, index);
        let (first, rest) = split_first_line(&gap);
        if gap.contains('\n') {
            value
                .decor_mut()
                .set_prefix(format!("{first}{newline}{}", layout.indent));
            set_prefix(
                array,
                index,
                after_comment(comment, rest, newline, &layout.indent),
            );
        } else {
            value.decor_mut().set_prefix(gap.clone());
            if !comment.trim().is_empty() {
                set_prefix(array, index, format!("{comment}{newline}{}{gap}", layout.indent));
            }
        }
        value.decor_mut().set_suffix("");
        array.insert_formatted(index, value);
    } else {
        // Appending: the gap after the last entry (before `]`, or after the trailing comma)
        // keeps its first line with the old last entry and closes the array after the new one.
        let last = array.len() - 1;
        let trailing_comma = array.trailing_comma();
        let gap = if trailing_comma {
            raw(Some(array.trailing()))
        } else {
            suffix(array, last)
        };
        let (first, rest) = split_first_line(&gap);
        let (new_prefix, after) = if gap.contains('\n') {
            (format!("{first}{newline}{}", layout.indent), rest.to_string())
        } else if layout.multiline {
            (format!("{newline}{}", layout.indent), gap.clone())
        } else {
            (layout.separator.clone(), gap.clone())
        };
        let after = after_comment(comment, &after, newline, "");
        value.decor_mut().set_prefix(new_prefix);
        if trailing_comma {
            value.decor_mut().set_suffix("");
            array.set_trailing(after);
        } else {
            set_suffix(array, last, String::new());
            value.decor_mut().set_suffix(after);
        }
        array.push_formatted(value);
    }
}

/// Removes the entry at `index` (≥ 1) with its line, keeping the comment that trails the
/// entry before it and any comment lines above it. Returns the removed entry's own
/// same-line comment (for a move).
fn remove_entry(array: &mut Array, index: usize) -> String {
    let gap = prefix(array, index);
    let (first, rest) = split_first_line(&gap);
    let kept_before = if gap.contains('\n') {
        format!("{first}{}", before_last_line(rest))
    } else {
        String::new()
    };
    let last = array.len() - 1;
    let own_comment;
    if index < last {
        let next = prefix(array, index + 1);
        let (next_first, next_rest) = split_first_line(&next);
        let new_next = if next.contains('\n') {
            own_comment = next_first.to_string();
            format!("{kept_before}{next_rest}")
        } else {
            own_comment = String::new();
            gap.clone()
        };
        set_prefix(array, index + 1, new_next);
    } else {
        let trailing_comma = array.trailing_comma();
        let after_gap = if trailing_comma {
            raw(Some(array.trailing()))
        } else {
            suffix(array, index)
        };
        let (gap_first, gap_rest) = split_first_line(&after_gap);
        let after = if after_gap.contains('\n') {
            own_comment = gap_first.to_string();
            gap_rest.to_string()
        } else {
            own_comment = String::new();
            after_gap.clone()
        };
        if trailing_comma {
            array.set_trailing(format!("{kept_before}{after}"));
        } else {
            let previous = suffix(array, index - 1);
            set_suffix(array, index - 1, format!("{previous}{kept_before}{after}"));
        }
    }
    array.remove(index);
    own_comment
}

/// Replaces `file` with `text` atomically: a temporary file in the same folder is
/// written and fsynced, then renamed over the original, then the folder is fsynced. A
/// crash at any point leaves either the old file or the new one, whole. `original` is
/// the text the edit was made from: if the file changed meanwhile, nothing is written.
pub fn write_atomic(file: &Path, text: &str, original: &str) -> Result<(), String> {
    let (target, folder, file_name) = location(file);
    remove_stale_temporaries(&folder, &file_name);
    let temporary = folder.join(format!(".{file_name}.agentctl-{}.tmp", std::process::id()));
    let cannot = |what: &str, err: std::io::Error| {
        format!(
            "cannot {what} {}: {err}; {} is unchanged",
            temporary.display(),
            file.display()
        )
    };
    let _ = std::fs::remove_file(&temporary);
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temporary)
        .map_err(|e| cannot("create", e))?;
    let written = (|| {
        if let Ok(metadata) = std::fs::metadata(&target) {
            out.set_permissions(metadata.permissions())?;
        }
        out.write_all(text.as_bytes())?;
        out.sync_all()
    })();
    drop(out);
    if let Err(err) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(cannot("write", err));
    }
    if std::env::var(FAULT_ENV).is_ok_and(|v| v == "after-write") {
        eprintln!(
            "agentctl: {FAULT_ENV}=after-write: stopping before the rename ({} is unchanged)",
            file.display()
        );
        std::process::exit(FAULT_EXIT_STATUS);
    }
    match std::fs::read_to_string(&target) {
        Ok(now) if now == original => {}
        _ => {
            let _ = std::fs::remove_file(&temporary);
            return Err(format!(
                "{} changed while agentctl was editing it; nothing written, run the command again",
                file.display()
            ));
        }
    }
    if let Err(err) = std::fs::rename(&temporary, &target) {
        let _ = std::fs::remove_file(&temporary);
        return Err(format!(
            "cannot replace {}: {err}; it is unchanged",
            file.display()
        ));
    }
    // The rename is durable once the folder's entry is on disk.
    if let Ok(dir) = std::fs::File::open(&folder) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Where `file` really is (a symlink resolved, so a symlinked configuration stays a
/// symlink): the file, its folder and its name.
fn location(file: &Path) -> (PathBuf, PathBuf, String) {
    let target = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
    let folder = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = target
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "plugins-enabled.toml".to_string());
    (target, folder, file_name)
}

/// Whether the agentctl process `pid` that made `path` is gone: by `/proc` where there
/// is one, otherwise by the file's age.
fn holder_is_gone(pid: Option<u32>, path: &Path, max_age_secs: u64) -> bool {
    let proc = Path::new("/proc");
    match pid {
        Some(pid) if proc.join("self").exists() => !proc.join(pid.to_string()).exists(),
        _ => std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() > max_age_secs),
    }
}

/// The claim of one agentctl on editing a configuration: `.NAME.agentctl.lock` beside it,
/// holding the process id, created exclusively and removed when dropped. A lock left by
/// a process that no longer runs is taken over.
struct EditLock {
    path: PathBuf,
}

impl EditLock {
    fn acquire(file: &Path) -> Result<EditLock, Refused> {
        let (_, folder, file_name) = location(file);
        let path = folder.join(format!(".{file_name}.agentctl.lock"));
        for _ in 0..3 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut lock) => {
                    let _ = write!(lock, "{}", std::process::id());
                    return Ok(EditLock { path });
                }
                Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(&path)
                        .ok()
                        .and_then(|t| t.trim().parse::<u32>().ok());
                    if holder_is_gone(holder, &path, 60) {
                        let _ = std::fs::remove_file(&path);
                        continue;
                    }
                    let who = holder.map_or_else(
                        || "another agentctl".to_string(),
                        |pid| format!("agentctl (pid {pid})"),
                    );
                    return Err(Refused(format!(
                        "{who} is editing {} right now; run the command again when it is done (if no agentctl runs, remove {})",
                        file.display(),
                        path.display()
                    )));
                }
                // A folder agentctl cannot write to: the write would fail the same way.
                Err(err) => {
                    return Err(Refused(format!(
                        "cannot create {}: {err}; {} is unchanged",
                        path.display(),
                        file.display()
                    )))
                }
            }
        }
        Err(Refused(format!(
            "cannot take the edit lock {}; {} is unchanged",
            path.display(),
            file.display()
        )))
    }
}

impl Drop for EditLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Removes temporary files an interrupted agentctl left beside the configuration: those
/// of processes that no longer run (or, where that cannot be told, older than an hour).
fn remove_stale_temporaries(folder: &Path, file_name: &str) {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    let start = format!(".{file_name}.agentctl-");
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(pid) = name
            .strip_prefix(&start)
            .and_then(|rest| rest.strip_suffix(".tmp"))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        if holder_is_gone(Some(pid), &entry.path(), 3600) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(source: &str, edit: Edit) -> Result<String, Refused> {
        apply(Path::new("/etc/h/plugins-enabled.toml"), source, &edit, None).map(|p| p.text)
    }

    fn add(source: &str, name: &str, at: Option<usize>) -> String {
        edit(
            source,
            Edit::ChainAdd {
                name: name.into(),
                at,
            },
        )
        .unwrap()
    }

    fn remove(source: &str, name: &str) -> String {
        edit(source, Edit::ChainRemove { name: name.into() }).unwrap()
    }

    fn move_to(source: &str, name: &str, to: usize) -> String {
        edit(
            source,
            Edit::ChainMove {
                name: name.into(),
                to,
            },
        )
        .unwrap()
    }

    #[test]
    fn single_line_chains_stay_on_one_line() {
        let s = "[history]\nchain = [\"default\", \"a\"]  # the chain\n";
        assert_eq!(
            add(s, "b", None),
            "[history]\nchain = [\"default\", \"a\", \"b\"]  # the chain\n"
        );
        assert_eq!(
            add(s, "b", Some(1)),
            "[history]\nchain = [\"default\", \"b\", \"a\"]  # the chain\n"
        );
        assert_eq!(remove(s, "a"), "[history]\nchain = [\"default\"]  # the chain\n");
        let padded = "[history]\nchain = [ \"default\",\"a\" ]\n";
        assert_eq!(
            add(padded, "b", None),
            "[history]\nchain = [ \"default\",\"a\",\"b\" ]\n"
        );
        assert_eq!(remove(padded, "a"), "[history]\nchain = [ \"default\" ]\n");
        let alone = "[history]\nchain = [ \"default\" ]\n";
        assert_eq!(
            add(alone, "b", None),
            "[history]\nchain = [ \"default\", \"b\" ]\n"
        );
        let comma = "[history]\nchain = [\"default\", \"a\",]\n";
        assert_eq!(
            add(comma, "b", None),
            "[history]\nchain = [\"default\", \"a\", \"b\",]\n"
        );
        assert_eq!(remove(comma, "a"), "[history]\nchain = [\"default\",]\n");
        let three = "[history]\nchain = [\"default\", \"a\", \"b\"]\n";
        assert_eq!(
            move_to(three, "b", 1),
            "[history]\nchain = [\"default\", \"b\", \"a\"]\n"
        );
        assert_eq!(
            move_to(three, "a", 2),
            "[history]\nchain = [\"default\", \"b\", \"a\"]\n"
        );
    }

    const MULTI: &str = "[history]\nchain = [\n    \"default\",   # always first\n    # trimming\n    \"a\",  # the a\n    \"b\",\n]\nx = 1\n";

    #[test]
    fn multiline_chains_keep_one_entry_per_line_with_their_comments() {
        let s = MULTI.replace("x = 1\n", "");
        assert_eq!(
            add(&s, "c", None),
            "[history]\nchain = [\n    \"default\",   # always first\n    # trimming\n    \"a\",  # the a\n    \"b\",\n    \"c\",\n]\n"
        );
        assert_eq!(
            add(&s, "c", Some(1)),
            "[history]\nchain = [\n    \"default\",   # always first\n    \"c\",\n    # trimming\n    \"a\",  # the a\n    \"b\",\n]\n"
        );
        assert_eq!(
            add(&s, "c", Some(2)),
            "[history]\nchain = [\n    \"default\",   # always first\n    # trimming\n    \"a\",  # the a\n    \"c\",\n    \"b\",\n]\n"
        );
        assert_eq!(
            remove(&s, "a"),
            "[history]\nchain = [\n    \"default\",   # always first\n    # trimming\n    \"b\",\n]\n"
        );
        assert_eq!(
            remove(&s, "b"),
            "[history]\nchain = [\n    \"default\",   # always first\n    # trimming\n    \"a\",  # the a\n]\n"
        );
        assert_eq!(
            move_to(&s, "a", 2),
            "[history]\nchain = [\n    \"default\",   # always first\n    # trimming\n    \"b\",\n    \"a\",  # the a\n]\n"
        );
        assert_eq!(
            move_to(&s, "b", 1),
            "[history]\nchain = [\n    \"default\",   # always first\n    \"b\",\n    # trimming\n    \"a\",  # the a\n]\n"
        );
    }

    #[test]
    fn multiline_chains_without_a_trailing_comma() {
        let s = "[history]\nchain = [\n  \"default\",\n  \"a\"  # the a\n]\n";
        assert_eq!(
            add(s, "b", None),
            "[history]\nchain = [\n  \"default\",\n  \"a\",  # the a\n  \"b\"\n]\n"
        );
        assert_eq!(remove(s, "a"), "[history]\nchain = [\n  \"default\"\n]\n");
        let s = "[history]\nchain = [\n  \"default\",\n  \"a\",\n  \"b\" # the b\n]\n";
        assert_eq!(
            move_to(s, "b", 1),
            "[history]\nchain = [\n  \"default\",\n  \"b\", # the b\n  \"a\"\n]\n"
        );
    }

    #[test]
    fn crlf_files_keep_their_line_endings() {
        let s = "[history]\r\nchain = [\r\n    \"default\", # d\r\n    \"a\",\r\n]\r\n";
        assert_eq!(
            add(s, "b", None),
            "[history]\r\nchain = [\r\n    \"default\", # d\r\n    \"a\",\r\n    \"b\",\r\n]\r\n"
        );
        assert_eq!(
            remove(s, "a"),
            "[history]\r\nchain = [\r\n    \"default\", # d\r\n]\r\n"
        );
    }

    #[test]
    fn scalars_keep_their_comments_and_missing_keys_land_in_their_table() {
        let s = "# top\nmax_users   =  50   # sessions\n\n[history]\nagent_max_ctx=200 # ceiling\n\n# models\n[models.m]\nmax_context = 10\n";
        assert_eq!(
            edit(s, Edit::MaxUsers(7)).unwrap(),
            s.replace("=  50   #", "=  7   #")
        );
        assert_eq!(edit(s, Edit::MaxCtx(9)).unwrap(), s.replace("=200 #", "=9 #"));
        assert_eq!(
            edit(s, Edit::SessionTimeout(0)).unwrap(),
            s.replace("# sessions\n", "# sessions\nsession_idle_timeout_minutes = 0\n")
        );
        let no_history = "max_users = 5\n\n# models\n[models.m]\nmax_context = 10\n";
        assert_eq!(
            edit(no_history, Edit::MaxCtx(9)).unwrap(),
            "max_users = 5\n\n[history]\nagent_max_ctx = 9\n\n# models\n[models.m]\nmax_context = 10\n"
        );
        assert_eq!(
            add(no_history, "a", None),
            "max_users = 5\n\n[history]\nchain = [\"default\", \"a\"]\n\n# models\n[models.m]\nmax_context = 10\n"
        );
        assert_eq!(
            edit("", Edit::MaxCtx(9)).unwrap(),
            "[history]\nagent_max_ctx = 9\n"
        );
        let history_only = "[history]\non_plugin_error = \"fail\" # strict\n\n[plugin.default]\n";
        assert_eq!(
            add(history_only, "a", Some(1)),
            "[history]\non_plugin_error = \"fail\" # strict\nchain = [\"default\", \"a\"]\n\n[plugin.default]\n"
        );
    }

    #[test]
    fn refusals_say_what_and_why() {
        let s = "[history]\nchain = [\"default\", \"a\"]\n";
        let refused = |e: Edit| edit(s, e).unwrap_err().0;
        assert!(refused(Edit::ChainRemove {
            name: "default".into()
        })
        .contains("cannot be removed"));
        assert!(refused(Edit::ChainMove {
            name: "default".into(),
            to: 1
        })
        .contains("cannot be moved"));
        assert!(refused(Edit::ChainAdd {
            name: "a".into(),
            at: None
        })
        .contains("already in the chain, at position 1"));
        assert!(refused(Edit::ChainAdd {
            name: "b".into(),
            at: Some(0)
        })
        .contains("0 is default's"));
        assert!(refused(Edit::ChainAdd {
            name: "b".into(),
            at: Some(3)
        })
        .contains("--at 3 is out of range"));
        assert!(refused(Edit::ChainMove {
            name: "a".into(),
            to: 2
        })
        .contains("position 2 is out of range"));
        assert!(refused(Edit::ChainRemove { name: "b".into() }).contains("\"b\" is not in the chain"));
        assert!(refused(Edit::ChainAdd {
            name: "../x".into(),
            at: None
        })
        .contains("not a plugin name"));
        assert!(refused(Edit::MaxCtx(0)).contains("at least 1"));
        assert!(refused(Edit::MaxUsers(0)).contains("at least 1"));
        let broken = edit("[history\n", Edit::MaxCtx(3)).unwrap_err().0;
        assert!(
            broken.starts_with("/etc/h/plugins-enabled.toml:1: not valid TOML"),
            "{broken}"
        );
    }

    #[test]
    fn literal_strings_and_dotted_keys_keep_their_style() {
        let s = "[history]\nchain = ['default', 'a']\n";
        assert_eq!(add(s, "b", Some(1)), "[history]\nchain = ['default', 'b', 'a']\n");
        let dotted = "history.chain = [\"default\"]\nhistory.agent_max_ctx = 5 # dotted\n";
        assert_eq!(
            add(dotted, "b", None),
            "history.chain = [\"default\", \"b\"]\nhistory.agent_max_ctx = 5 # dotted\n"
        );
        assert_eq!(
            edit(dotted, Edit::MaxCtx(7)).unwrap(),
            "history.chain = [\"default\"]\nhistory.agent_max_ctx = 7 # dotted\n"
        );
        assert_eq!(
            edit("history.chain = [\"default\"]\n", Edit::MaxCtx(7)).unwrap(),
            "history.chain = [\"default\"]\nhistory.agent_max_ctx = 7\n"
        );
        assert_eq!(edit("", Edit::MaxUsers(3)).unwrap(), "max_users = 3\n");
    }

    #[test]
    fn untouched_lines_keep_their_bytes() {
        // A byte-order mark, mixed line endings, a multi-line string with a CRLF inside.
        let s = "\u{feff}# c\r\nmax_users = 5\nx_note = 1\r\n";
        let s = s.replace("x_note = 1", "session_idle_timeout_minutes = 1");
        assert_eq!(
            edit(&s, Edit::MaxUsers(7)).unwrap(),
            "\u{feff}# c\r\nmax_users = 7\r\nsession_idle_timeout_minutes = 1\r\n"
        );
        let s = "[plugin.default]\r\nnote = \"\"\"\nmulti\r\nline\"\"\"\r\n";
        assert_eq!(
            edit(s, Edit::MaxUsers(7)).unwrap(),
            "max_users = 7\r\n[plugin.default]\r\nnote = \"\"\"\nmulti\r\nline\"\"\"\r\n"
        );
        // No line ending at the end of the file: still none, even after an appended key.
        assert_eq!(
            edit("[history]\nagent_max_ctx = 5", Edit::MaxCtx(6)).unwrap(),
            "[history]\nagent_max_ctx = 6"
        );
        assert_eq!(
            edit("max_users = 5", Edit::SessionTimeout(3)).unwrap(),
            "max_users = 5\nsession_idle_timeout_minutes = 3"
        );
        // A no-op is byte-identical whatever the normalizations.
        let s = "\u{feff}max_users = 5\r\n[history]\nagent_max_ctx = 9";
        assert_eq!(edit(s, Edit::MaxCtx(9)).unwrap(), s);
    }

    #[test]
    fn write_atomic_replaces_the_file_and_refuses_a_file_changed_meanwhile() {
        let dir = std::env::temp_dir().join(format!("agentctl-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("plugins-enabled.toml");
        std::fs::write(&file, "max_users = 1\n").unwrap();
        write_atomic(&file, "max_users = 2\n", "max_users = 1\n").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "max_users = 2\n");
        // Someone else wrote the file after agentctl read it: nothing is written.
        let err = write_atomic(&file, "max_users = 3\n", "max_users = 1\n").unwrap_err();
        assert!(err.contains("changed while agentctl was editing it"), "{err}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "max_users = 2\n");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("plugins-enabled.toml")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn moving_to_the_current_position_changes_nothing() {
        let s = "[history]\nchain = [ \"default\" ,  \"a\" ]\n";
        assert_eq!(move_to(s, "a", 1), s);
    }
}
