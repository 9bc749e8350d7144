//! `plugin-set` and `plugin-unset`: one key of a `[plugin.NAME]` table
//! (docs/cli.md#agentctl). The value keeps the key's place, its decoration and any
//! comment after it; a missing key is appended to the table, a missing table appended to
//! the file. Whether the plugin accepts the new table is for the plugin to say: the
//! engine's `edit` runs its `new` on the edited file in a child process before anything is
//! written.

use toml_edit::{DocumentMut, Item, Table, Value};

use super::Refused;

/// `VALUE` as the command line gives it: a TOML value (`5`, `true`, `"text"`, `[1, 2]`,
/// `{ a = 1 }`), or else the text itself as a string (`[redacted]` is not TOML: it is the
/// string "[redacted]").
pub(super) fn parse_value(text: &str) -> Value {
    match format!("value = {text}").parse::<DocumentMut>() {
        Ok(document) => match document.get("value") {
            Some(Item::Value(value)) => {
                let mut value = value.clone();
                value.decor_mut().clear();
                value
            }
            _ => Value::from(text),
        },
        Err(_) => Value::from(text),
    }
}

/// Checks `key`: one key of the plugin's table, not a dotted path (a nested table is
/// edited by hand).
pub(super) fn check_key(key: &str) -> Result<(), Refused> {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if plain {
        Ok(())
    } else {
        Err(Refused(format!(
            "{} is not a key agentctl can set: one key of the plugin's table (letters, digits, _ and -); edit nested tables by hand",
            plugin_api::echo::quoted(key)
        )))
    }
}

/// `[plugin.NAME]`, created at the end of the file when missing.
fn plugin_table<'d>(document: &'d mut DocumentMut, name: &str) -> Result<&'d mut Table, Refused> {
    let not_a_table = || {
        Refused(format!(
            "[plugin.{name}] is not a table agentctl can edit; edit it by hand"
        ))
    };
    let plugins = document
        .entry("plugin")
        .or_insert_with(|| {
            let mut table = Table::new();
            table.set_implicit(true);
            Item::Table(table)
        })
        .as_table_mut()
        .ok_or_else(not_a_table)?;
    if !plugins.contains_key(name) {
        let mut table = Table::new();
        table.decor_mut().set_prefix("\n");
        plugins.insert(name, Item::Table(table));
    }
    plugins
        .get_mut(name)
        .and_then(Item::as_table_mut)
        .ok_or_else(not_a_table)
}

/// The value of `key` in `[plugin.NAME]`, as TOML text, when the file has one.
fn current(document: &DocumentMut, name: &str, key: &str) -> Option<String> {
    let value = document.get("plugin")?.get(name)?.get(key)?.as_value()?;
    Some(value.to_string().trim().to_string())
}

/// Sets `key` of `[plugin.NAME]` to `value`; the summary line.
pub(super) fn set(
    document: &mut DocumentMut,
    name: &str,
    key: &str,
    value: Value,
) -> Result<String, Refused> {
    let before = current(document, name, key);
    let table = plugin_table(document, name)?;
    let shown = value.to_string().trim().to_string();
    match table.get_mut(key) {
        Some(Item::Value(old)) => {
            let decor = old.decor().clone();
            let mut new = value;
            *new.decor_mut() = decor;
            *old = new;
        }
        Some(_) => {
            return Err(Refused(format!(
                "[plugin.{name}] {key} is a table; edit it by hand"
            )))
        }
        None => {
            table.insert(key, Item::Value(value));
        }
    }
    Ok(format!(
        "[plugin.{name}] {key}: {} -> {shown}",
        before.as_deref().unwrap_or("(unset)")
    ))
}

/// Removes `key` from `[plugin.NAME]`; the summary line. A table left empty stays (its
/// header and comments are the operator's).
pub(super) fn unset(document: &mut DocumentMut, name: &str, key: &str) -> Result<String, Refused> {
    let Some(before) = current(document, name, key) else {
        return Err(Refused(format!("[plugin.{name}] has no {key} to unset")));
    };
    let table = plugin_table(document, name)?;
    table.remove(key);
    Ok(format!(
        "[plugin.{name}] {key}: {before} -> (unset: the plugin's default)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_table_edits_keep_the_layout() {
        let edit = |source: &str, edit: super::super::Edit| {
            super::super::apply(
                std::path::Path::new("/etc/h/plugins-enabled.toml"),
                source,
                &edit,
                None,
            )
            .map(|p| p.text)
        };
        let s = "[history]\nchain = [\"default\"]\n\n[plugin.default]\npin_system = true  # keep it\n\n# models\n[models.m]\nmax_context = 10\n";
        let set = |s: &str, key: &str, value: &str| {
            edit(
                s,
                super::super::Edit::PluginSet {
                    name: "default".into(),
                    key: key.into(),
                    value: value.into(),
                },
            )
        };
        assert_eq!(
            set(s, "pin_system", "false").unwrap(),
            s.replace("pin_system = true  #", "pin_system = false  #")
        );
        assert_eq!(
            set(s, "target_messages", "8").unwrap(),
            s.replace("# keep it\n", "# keep it\ntarget_messages = 8\n")
        );
        let unset = edit(
            s,
            super::super::Edit::PluginUnset {
                name: "default".into(),
                key: "pin_system".into(),
            },
        )
        .unwrap();
        assert_eq!(unset, s.replace("pin_system = true  # keep it\n", ""));
        // A table the file lacks is appended.
        let bare = "[history]\nchain = [\"default\", \"a\"]\n";
        let added = edit(
            bare,
            super::super::Edit::PluginSet {
                name: "a".into(),
                key: "label".into(),
                value: "[redacted]".into(),
            },
        )
        .unwrap();
        assert_eq!(added, format!("{bare}\n[plugin.a]\nlabel = \"[redacted]\"\n"));
        assert!(edit(
            s,
            super::super::Edit::PluginUnset {
                name: "default".into(),
                key: "nope".into()
            }
        )
        .unwrap_err()
        .0
        .contains("[plugin.default] has no nope to unset"));
        assert!(set(s, "a.b", "1")
            .unwrap_err()
            .0
            .contains("edit nested tables by hand"));
    }

    #[test]
    fn values_are_toml_or_else_text() {
        assert_eq!(parse_value("5").as_integer(), Some(5));
        assert_eq!(parse_value("true").as_bool(), Some(true));
        assert_eq!(parse_value("\"x y\"").as_str(), Some("x y"));
        assert_eq!(parse_value("[redacted]").as_str(), Some("[redacted]"));
        assert_eq!(parse_value("plain words").as_str(), Some("plain words"));
        assert_eq!(parse_value("[1, 2]").as_array().map(|a| a.len()), Some(2));
        assert!(check_key("keep_last").is_ok());
        assert!(check_key("tools.search").is_err());
        assert!(check_key("").is_err());
    }
}
