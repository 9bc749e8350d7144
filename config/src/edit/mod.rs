//! The edits of `plugins-enabled.toml` (`agentctl`'s commands, the runtime commands of
//! `serve` and `chat`): the rules of each, applied to the text keeping its layout.
//!
//! An edit changes only the value it is about: the file goes through
//! [`toml_edit::DocumentMut`], so comments, key order, blank lines and the formatting of
//! every untouched line survive ([`layout`] puts back the bytes toml_edit normalizes),
//! and a plugin list keeps its layout ([`array`]: one line or one entry per line, with the
//! comments around entries). A key the file lacks is inserted in its table (`[history]`
//! is created, before the first table, when missing).
//!
//! [`apply`] gives the edited text; it needs no plugin. What does — whether a plugin to
//! add is available, whether every plugin accepts its table in the edited file, whether
//! the chain loads — is the engine's `edit` module, which validates the text by the rules
//! the host applies at load and then has [`crate::write`] replace the file atomically. A
//! refusal or a crash never leaves a changed or half-written file.

mod array;
mod layout;
mod plugin_table;

use std::path::Path;

use plugin_api::naming::is_plugin_name;
use toml_edit::{Array, DocumentMut, Item, Table, Value};

use crate::Config;
use array::{insert_entry, remove_entry, Layout};
use layout::keep_untouched_lines;

/// One edit of the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// Append `name` to the chain (or, with `view`, to the view), or insert it at
    /// position `at` (in the chain 0 is `default`'s).
    ChainAdd {
        name: String,
        at: Option<usize>,
        view: bool,
    },
    /// Remove `name` from whichever list holds it.
    ChainRemove { name: String },
    /// Move `name` to position `to` of the resulting list that holds it (in the chain,
    /// 1 = right after `default`).
    ChainMove { name: String, to: usize },
    /// `[history] agent_max_ctx`.
    MaxCtx(u64),
    /// `max_users`.
    MaxUsers(u64),
    /// `session_idle_timeout_minutes` (0 = never reap).
    SessionTimeout(u64),
    /// Add `name` (in the chain or the view) to `[history] required`: its fault fails
    /// the turn even under `on_plugin_error = "skip"`.
    Require { name: String },
    /// Remove `name` from `[history] required`.
    Unrequire { name: String },
    /// Set `key` of `[plugin.NAME]` to `value` (TOML, or else a string), validated by
    /// the plugin's own `new` before anything is written.
    PluginSet {
        name: String,
        key: String,
        value: String,
    },
    /// Remove `key` from `[plugin.NAME]` (the plugin's default applies again).
    PluginUnset { name: String, key: String },
    /// Add `name` (in the chain or the view) to `[history] isolate`: it runs in a worker
    /// process, so its crash ends the worker, not the host.
    Isolate { name: String },
    /// Remove `name` from `[history] isolate`.
    Unisolate { name: String },
}

/// Plugins that belong in the view, not the chain, and why: in the chain what they drop
/// leaves the working history for good (docs/plugins.md#relevance).
const VIEW_PLUGINS: &[(&str, &str)] = &[(
    "relevance",
    "in the chain, the old exchanges it drops leave the working history for good, and a later \
     question cannot bring them back (but with `from_transcript = true`); in the view it picks from the \
     whole working history each turn, and with `from_transcript = true` from the whole transcript too",
)];

impl Edit {
    /// Advice about an edit that is allowed but probably not meant: adding a plugin that
    /// belongs in the view to the chain. Shown beside the edit's summary, never a refusal.
    pub fn hint(&self) -> Option<String> {
        match self {
            Edit::ChainAdd {
                name, view: false, ..
            } => VIEW_PLUGINS.iter().find(|(n, _)| n == name).map(|(_, why)| {
                format!(
                    "{why}: `agentctl history-chain-remove {name}` then `agentctl history-chain-add {name} --view`"
                )
            }),
            _ => None,
        }
    }

    /// The plugin whose own table the edit changes, if any.
    pub fn plugin_table(&self) -> Option<&str> {
        match self {
            Edit::PluginSet { name, .. } | Edit::PluginUnset { name, .. } => Some(name),
            _ => None,
        }
    }
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

/// Whether a plugin can be added: the engine's answer, from the plugins it finds.
pub type Availability<'a> = &'a dyn Fn(&str, &Config) -> Result<(), Refused>;

/// Applies `edit` to `source`, the text of `file`, refusing what the command's own rules
/// forbid (docs/cli.md#agentctl). With `available`, a plugin to add must pass it.
pub fn apply(
    file: &Path,
    source: &str,
    edit: &Edit,
    available: Option<Availability<'_>>,
) -> Result<Planned, Refused> {
    let config = Config::parse(file, source.to_string()).map_err(|err| Refused(err.to_string()))?;
    let mut document: DocumentMut = source
        .parse()
        .map_err(|err| Refused(format!("{}: not valid TOML: {err}", file.display())))?;
    // toml_edit writes `\n` line endings; [`keep_untouched_lines`] gives the file its own back.
    let newline = "\n";
    let summary = match edit {
        Edit::ChainAdd { name, at, view } => {
            check_name(name)?;
            if let Some(available) = available {
                available(name, &config)?;
            }
            if let Some((list, position)) = List::holding(&config, name) {
                let hint = if name == "default" {
                    "it is always first".to_string()
                } else {
                    format!("move it with `agentctl history-chain-move {name} POS`")
                };
                return Err(Refused(format!(
                    "plugin \"{name}\" is already in the {}, at position {position} ({hint})",
                    list.key()
                )));
            }
            let list = if *view { List::View } else { List::Chain };
            let names = list.names(&config);
            let at = at.unwrap_or(names.len());
            list.check_position(at, names.len(), names, "--at")?;
            match list_array(&mut document, list) {
                Some(array) => {
                    let layout = Layout::of(array);
                    insert_entry(array, at, name, "", &layout, newline);
                }
                None => {
                    let mut after: Vec<&str> = names.iter().map(String::as_str).collect();
                    after.insert(at, name);
                    history_table(&mut document)
                        .insert(list.key(), toml_edit::value(Array::from_iter(after)));
                }
            }
            let mut after = names.to_vec();
            after.insert(at, name.clone());
            format!(
                "added \"{name}\" to the {} at position {at}: {}",
                list.key(),
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
            let (list, from) = holding(&config, name)?;
            let array = list_array(&mut document, list).ok_or_else(|| no_list_array(file, list))?;
            remove_entry(array, from);
            let mut after = list.names(&config).to_vec();
            after.remove(from);
            format!(
                "removed \"{name}\" from the {}: {}",
                list.key(),
                list.shown(&after)
            )
        }
        Edit::ChainMove { name, to } => {
            check_name(name)?;
            if name == "default" {
                return Err(Refused(
                    "\"default\" cannot be moved: it is always first in the chain (position 0)".to_string(),
                ));
            }
            let (list, from) = holding(&config, name)?;
            let names = list.names(&config);
            list.check_position(*to, names.len() - 1, names, "position")?;
            if from == *to {
                return Ok(Planned {
                    text: source.to_string(),
                    summary: format!("\"{name}\" is already at position {to}: {}", names.join(", ")),
                });
            }
            let array = list_array(&mut document, list).ok_or_else(|| no_list_array(file, list))?;
            let layout = Layout::of(array);
            let comment = remove_entry(array, from);
            insert_entry(array, *to, name, &comment, &layout, newline);
            let mut after = names.to_vec();
            let moved = after.remove(from);
            after.insert(*to, moved);
            format!(
                "moved \"{name}\" to position {to} of the {}: {}",
                list.key(),
                after.join(", ")
            )
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
        Edit::Require { name } => {
            check_name(name)?;
            holding(&config, name)?;
            let after = add_named(&mut document, file, "required", &config.required, name, newline)?;
            format!("required: {}", after.join(", "))
        }
        Edit::PluginSet { name, key, value } => {
            check_name(name)?;
            plugin_table::check_key(key)?;
            if let Some(available) = available {
                available(name, &config)?;
            }
            plugin_table::set(&mut document, name, key, plugin_table::parse_value(value))?
        }
        Edit::PluginUnset { name, key } => {
            check_name(name)?;
            plugin_table::check_key(key)?;
            plugin_table::unset(&mut document, name, key)?
        }
        Edit::Unrequire { name } => {
            check_name(name)?;
            let after = remove_named(
                &mut document,
                file,
                "required",
                &config.required,
                name,
                "required",
            )?;
            format!("required: {}", List::View.shown(&after))
        }
        Edit::Isolate { name } => {
            check_name(name)?;
            holding(&config, name)?;
            let after = add_named(&mut document, file, "isolate", &config.isolate, name, newline)?;
            format!("isolate: {}", after.join(", "))
        }
        Edit::Unisolate { name } => {
            check_name(name)?;
            let after = remove_named(&mut document, file, "isolate", &config.isolate, name, "isolated")?;
            format!("isolate: {}", List::View.shown(&after))
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

/// Adds `name` to the `[history]` name list `key` (now `names`), creating the key when
/// the file lacks it; returns the list after. A name already there changes nothing.
fn add_named(
    document: &mut DocumentMut,
    file: &Path,
    key: &str,
    names: &[String],
    name: &str,
    newline: &str,
) -> Result<Vec<String>, Refused> {
    let mut after = names.to_vec();
    if names.iter().any(|n| n == name) {
        return Ok(after);
    }
    match named_array(document, key) {
        Some(array) => {
            let layout = Layout::of(array);
            insert_entry(array, after.len(), name, "", &layout, newline);
        }
        None if names.is_empty() => {
            history_table(document).insert(key, toml_edit::value(Array::from_iter([name])));
        }
        None => return Err(no_array(file, key)),
    }
    after.push(name.to_string());
    Ok(after)
}

/// Removes `name` from the `[history]` name list `key` (now `names`); the key goes with its
/// last name, as if it had never been added. Returns the list after.
fn remove_named(
    document: &mut DocumentMut,
    file: &Path,
    key: &str,
    names: &[String],
    name: &str,
    state: &str,
) -> Result<Vec<String>, Refused> {
    let Some(from) = names.iter().position(|n| n == name) else {
        return Err(Refused(format!(
            "plugin \"{name}\" is not {state} ({key}: {})",
            List::View.shown(names)
        )));
    };
    let mut after = names.to_vec();
    after.remove(from);
    if after.is_empty() {
        history_table(document).remove(key);
    } else {
        let array = named_array(document, key).ok_or_else(|| no_array(file, key))?;
        remove_entry(array, from);
    }
    Ok(after)
}

fn no_list_array(file: &Path, list: List) -> Refused {
    no_array(file, list.key())
}

fn no_array(file: &Path, key: &str) -> Refused {
    Refused(format!(
        "{}: [history] {key} is not an array agentctl can edit; edit it by hand",
        file.display(),
    ))
}

/// The two plugin lists of `[history]`: the chain (its output is kept) and the view (run
/// after it on what is sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum List {
    Chain,
    View,
}

impl List {
    fn key(self) -> &'static str {
        match self {
            List::Chain => "chain",
            List::View => "view",
        }
    }

    fn names(self, config: &Config) -> &[String] {
        match self {
            List::Chain => &config.chain,
            List::View => &config.view,
        }
    }

    /// The list holding `name`, and its position there.
    fn holding(config: &Config, name: &str) -> Option<(List, usize)> {
        [List::Chain, List::View]
            .into_iter()
            .find_map(|list| Some((list, list.names(config).iter().position(|n| n == name)?)))
    }

    fn shown(self, names: &[String]) -> String {
        if names.is_empty() {
            "(empty)".to_string()
        } else {
            names.join(", ")
        }
    }

    /// A position for a plugin: in the chain 1 ..= `last` (0 is `default`'s), in the
    /// view 0 ..= `last`.
    fn check_position(
        self,
        position: usize,
        last: usize,
        names: &[String],
        what: &str,
    ) -> Result<(), Refused> {
        let first = match self {
            List::Chain => 1,
            List::View => 0,
        };
        let range = match (self, last) {
            (List::Chain, 1) => "the only position is 1".to_string(),
            (List::Chain, _) => format!("positions run from 1 (right after default) to {last}"),
            (List::View, 0) => "the only position is 0".to_string(),
            (List::View, _) => format!("positions run from 0 to {last}"),
        };
        if position < first {
            return Err(Refused(format!(
                "{what} 0 is default's: default is always first; {range}"
            )));
        }
        if position > last {
            return Err(Refused(format!(
                "{what} {position} is out of range: the {} is {} ({} plugins), {range}",
                self.key(),
                self.shown(names),
                names.len()
            )));
        }
        Ok(())
    }
}

/// The list holding `name` and its position, or a refusal naming both lists.
fn holding(config: &Config, name: &str) -> Result<(List, usize), Refused> {
    List::holding(config, name).ok_or_else(|| {
        let view = if config.view.is_empty() {
            String::new()
        } else {
            format!("; view: {}", config.view.join(", "))
        };
        Refused(format!(
            "plugin \"{name}\" is not in the chain (chain: {}{view})",
            config.chain.join(", ")
        ))
    })
}

fn check_name(name: &str) -> Result<(), Refused> {
    if is_plugin_name(name) {
        Ok(())
    } else {
        Err(Refused(format!(
            "{} is not a plugin name: names are plain identifiers (lowercase letters, digits, _), never paths",
            plugin_api::echo::quoted(name)
        )))
    }
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
/// order of docs/configuration.md (top-level keys, `[history]`, models, plugin tables).
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

/// `[history] chain` or `view`, when the file has it.
fn list_array(document: &mut DocumentMut, list: List) -> Option<&mut Array> {
    named_array(document, list.key())
}

/// The array `[history] key`, when the file has it.
fn named_array<'d>(document: &'d mut DocumentMut, key: &str) -> Option<&'d mut Array> {
    document
        .get_mut("history")?
        .as_table_like_mut()?
        .get_mut(key)?
        .as_array_mut()
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
                view: false,
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
            at: None,
            view: false,
        })
        .contains("already in the chain, at position 1"));
        assert!(refused(Edit::ChainAdd {
            name: "b".into(),
            at: Some(0),
            view: false,
        })
        .contains("0 is default's"));
        assert!(refused(Edit::ChainAdd {
            name: "b".into(),
            at: Some(3),
            view: false,
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
            at: None,
            view: false,
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
    fn required_edits_keep_the_layout() {
        let s = "[history]\nchain = [\"default\", \"a\", \"b\"]  # the chain\non_plugin_error = \"skip\"\n\n[plugin.a]\n";
        let require = |s: &str, name: &str| edit(s, Edit::Require { name: name.into() });
        let unrequire = |s: &str, name: &str| edit(s, Edit::Unrequire { name: name.into() });
        let one = require(s, "a").unwrap();
        assert_eq!(one, s.replace("\"skip\"\n", "\"skip\"\nrequired = [\"a\"]\n"));
        let two = require(&one, "b").unwrap();
        assert!(two.contains("required = [\"a\", \"b\"]\n"), "{two}");
        assert_eq!(require(&two, "b").unwrap(), two, "already required: unchanged");
        assert_eq!(unrequire(&two, "b").unwrap(), one);
        assert_eq!(unrequire(&one, "a").unwrap(), s);
        let multi = "[history]\nchain = [\"default\", \"a\", \"b\"]\nrequired = [\n  \"a\",  # redacts\n]\n";
        assert_eq!(
            require(multi, "b").unwrap(),
            "[history]\nchain = [\"default\", \"a\", \"b\"]\nrequired = [\n  \"a\",  # redacts\n  \"b\",\n]\n"
        );
        assert!(require(s, "c")
            .unwrap_err()
            .0
            .contains("\"c\" is not in the chain"));
        assert!(unrequire(s, "a").unwrap_err().0.contains("\"a\" is not required"));
        assert!(require(s, "../x").unwrap_err().0.contains("not a plugin name"));
    }

    #[test]
    fn moving_to_the_current_position_changes_nothing() {
        let s = "[history]\nchain = [ \"default\" ,  \"a\" ]\n";
        assert_eq!(move_to(s, "a", 1), s);
    }
}
