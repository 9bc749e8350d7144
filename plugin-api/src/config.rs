//! Reading and validating a plugin's config table (`[plugin.NAME]`, docs/abi.md#the-root-module, docs/configuration.md).
//!
//! The host hands `new` the table as JSON text. [`ConfigTable`] reads it key by key with
//! typed getters and [`ConfigTable::finish`] refuses every key that was not read, so an
//! unknown key or a bad value becomes a [`ConfigError`] naming the key — which the host
//! turns into an error naming the file and line.

use abi_stable::{std_types::RString, StableAbi};
use serde_json::{Map, Value};

/// A configuration error: the key (dotted path inside the plugin's table, empty for the
/// whole table) and what is wrong with it.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub key: RString,
    pub message: RString,
}

impl ConfigError {
    pub fn new(key: impl Into<RString>, message: impl Into<RString>) -> ConfigError {
        ConfigError {
            key: key.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.key, self.message)
        }
    }
}

/// A config table being read.
#[derive(Debug)]
pub struct ConfigTable {
    prefix: String,
    entries: Map<String, Value>,
}

fn describe(value: &Value) -> String {
    crate::echo::json(value)
}

impl ConfigTable {
    /// Parses the JSON text handed to `new`.
    pub fn parse(json: &str) -> Result<ConfigTable, ConfigError> {
        match serde_json::from_str::<Value>(json) {
            Ok(Value::Object(entries)) => Ok(ConfigTable {
                prefix: String::new(),
                entries,
            }),
            Ok(other) => Err(ConfigError::new(
                "",
                format!("expected a table, found {}", describe(&other)),
            )),
            Err(err) => Err(ConfigError::new("", format!("not valid JSON: {err}"))),
        }
    }

    fn path(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn error(&self, key: &str, expected: &str, found: &Value) -> ConfigError {
        ConfigError::new(
            self.path(key),
            format!("expected {expected}, found {}", describe(found)),
        )
    }

    /// An error about `key` (for checks the getters cannot express).
    pub fn invalid(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::new(self.path(key), message.into())
    }

    /// A boolean.
    pub fn bool(&mut self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.entries.remove(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(other) => Err(self.error(key, "true or false", &other)),
        }
    }

    /// An integer ≥ 0.
    pub fn u64(&mut self, key: &str) -> Result<Option<u64>, ConfigError> {
        match self.entries.remove(key) {
            None => Ok(None),
            Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
            Some(other) => Err(self.error(key, "an integer ≥ 0", &other)),
        }
    }

    /// An integer ≥ 0, or the string `word` (`Some(None)`), e.g. `keep_thinking_turns =
    /// "all"`.
    pub fn u64_or(&mut self, key: &str, word: &str) -> Result<Option<Option<u64>>, ConfigError> {
        match self.entries.remove(key) {
            None => Ok(None),
            Some(Value::Number(n)) if n.as_u64().is_some() => Ok(Some(n.as_u64())),
            Some(Value::String(s)) if s == word => Ok(Some(None)),
            Some(other) => Err(self.error(key, &format!("an integer ≥ 0 or \"{word}\""), &other)),
        }
    }

    /// An integer ≥ 1.
    pub fn positive(&mut self, key: &str) -> Result<Option<u64>, ConfigError> {
        match self.u64(key)? {
            Some(0) => Err(ConfigError::new(
                self.path(key),
                "expected an integer ≥ 1, found 0",
            )),
            other => Ok(other),
        }
    }

    /// A number ≥ 0 (an integer or a float).
    pub fn number(&mut self, key: &str) -> Result<Option<f64>, ConfigError> {
        match self.entries.remove(key) {
            None => Ok(None),
            Some(Value::Number(n)) if n.as_f64().is_some_and(|x| x >= 0.0) => Ok(n.as_f64()),
            Some(other) => Err(self.error(key, "a number ≥ 0", &other)),
        }
    }

    /// A string.
    pub fn string(&mut self, key: &str) -> Result<Option<String>, ConfigError> {
        match self.entries.remove(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.error(key, "a string", &other)),
        }
    }

    /// One of the listed strings, as the value paired with it:
    /// `config.one_of("mode", &[("merge", Mode::Merge), ("drop", Mode::Drop)])?`.
    /// Anything else is an error listing the choices.
    pub fn one_of<T: Copy>(&mut self, key: &str, choices: &[(&str, T)]) -> Result<Option<T>, ConfigError> {
        let Some(value) = self.string(key)? else {
            return Ok(None);
        };
        match choices.iter().find(|(name, _)| *name == value) {
            Some((_, choice)) => Ok(Some(*choice)),
            None => {
                let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
                Err(ConfigError::new(
                    self.path(key),
                    format!(
                        "expected one of {}, found {}",
                        names.join(", "),
                        crate::echo::quoted(&value)
                    ),
                ))
            }
        }
    }

    /// An array of strings.
    pub fn strings(&mut self, key: &str) -> Result<Option<Vec<String>>, ConfigError> {
        match self.entries.remove(key) {
            None => Ok(None),
            Some(Value::Array(items)) if items.iter().all(Value::is_string) => Ok(Some(
                items
                    .into_iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect(),
            )),
            Some(other) => Err(self.error(key, "an array of strings", &other)),
        }
    }

    /// A nested table.
    pub fn table(&mut self, key: &str) -> Result<Option<ConfigTable>, ConfigError> {
        match self.entries.remove(key) {
            None => Ok(None),
            Some(Value::Object(entries)) => Ok(Some(ConfigTable {
                prefix: format!("{}{key}.", self.prefix),
                entries,
            })),
            Some(other) => Err(self.error(key, "a table", &other)),
        }
    }

    /// A table of tables (e.g. `[plugin.retention.tools.NAME]`), in file order.
    pub fn tables(&mut self, key: &str) -> Result<Vec<(String, ConfigTable)>, ConfigError> {
        let Some(mut outer) = self.table(key)? else {
            return Ok(Vec::new());
        };
        let names: Vec<String> = outer.entries.keys().cloned().collect();
        let mut tables = Vec::new();
        for name in names {
            match outer.table(&name)? {
                Some(table) => tables.push((name, table)),
                None => unreachable!("the key was just listed"),
            }
        }
        Ok(tables)
    }

    /// Refuses every key that was not read: `unknown key`.
    pub fn finish(self) -> Result<(), ConfigError> {
        match self.entries.keys().next() {
            None => Ok(()),
            Some(key) => Err(ConfigError::new(self.path(key), "unknown key")),
        }
    }
}
