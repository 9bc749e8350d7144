//! `cargo xtask new-plugin NAME --python [--dir DIR]`: a process plugin on the Python SDK
//! (docs/process-plugins.md#the-python-sdk) — its manifest, its script and a test that
//! runs the host's own output check — in DIR (default `./NAME`).

use std::path::{Path, PathBuf};

type Result<T> = std::result::Result<T, String>;

fn is_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Writes the plugin's three files into `dir`; refuses to overwrite any.
pub fn new_python_plugin(name: &str, dir: &Path) -> Result<PathBuf> {
    if !is_name(name) {
        return Err(format!(
            "\"{name}\" is not a plugin name: use lowercase letters, digits and _, starting with a letter"
        ));
    }
    let class: String = name
        .split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map_or(String::new(), |c| {
                c.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect();
    let files = [
        (
            format!("{name}.plugin.toml"),
            format!(
                "# A process plugin (docs/process-plugins.md#the-manifest): put this folder's files in\n\
                 # plugin_dir (agentctl install {name}.plugin.toml), then agentctl history-chain-add {name}.\n\
                 protocol = 1\ncommand = [\"python3\", \"{name}.py\"]\ndescription = \"{name}: what it does, in one line\"\n"
            ),
        ),
        (
            format!("{name}.py"),
            format!(
                "\"\"\"{name}: a history plugin on the Python SDK (pip install ./sdk/python).\"\"\"\n\n\
                 from history_plugin import ConfigError, Plugin, Result, run\n\n\n\
                 class {class}(Plugin):\n    name = \"{name}\"\n    version = \"0.1.0\"\n\n\
                 \x20   def validate(self, config, agent_max_ctx, models):\n\
                 \x20       # The [plugin.{name}] table: refuse what you do not know.\n\
                 \x20       for key in config:\n\
                 \x20           raise ConfigError(key, \"unknown key\")\n\n\
                 \x20   def process(self, messages, ctx):\n\
                 \x20       # Return messages as they came (sent back by index), changed copies\n\
                 \x20       # (m.changed(...), m.map_text(...)) or fewer of them.\n\
                 \x20       return Result(messages, [])\n\n\n\
                 if __name__ == \"__main__\":\n    run({class}())\n"
            ),
        ),
        (
            format!("test_{name}.py"),
            format!(
                "\"\"\"Runs {name} on a history and checks its output with the host's own check\n\
                 (HISTORY_HOST=/path/to/history-host python -m unittest).\"\"\"\n\n\
                 import unittest\n\nfrom history_plugin import testing\n\nfrom {name} import {class}\n\n\
                 HISTORY = [\n    {{\"role\": \"system\", \"content\": \"You are terse.\"}},\n\
                 \x20   {{\"role\": \"user\", \"content\": \"Hello\"}},\n\
                 \x20   {{\"role\": \"assistant\", \"content\": \"Hi.\"}},\n]\n\n\n\
                 class Test{class}(unittest.TestCase):\n\
                 \x20   def test_its_output_passes_the_host_check(self):\n\
                 \x20       plugin = {class}()\n        plugin.validate({{}}, 50, [])\n\
                 \x20       output, events = testing.process(plugin, HISTORY)\n\
                 \x20       self.assertEqual(len(output), len(HISTORY))\n\n\n\
                 if __name__ == \"__main__\":\n    unittest.main()\n"
            ),
        ),
    ];
    for (file, _) in &files {
        if dir.join(file).exists() {
            return Err(format!(
                "{} exists already; nothing written",
                dir.join(file).display()
            ));
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for (file, text) in &files {
        let path = dir.join(file);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(dir.to_path_buf())
}
