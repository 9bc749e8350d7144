//! `agentctl install` and `plugin-set` / `plugin-unset` (docs/cli.md#agentctl) with real
//! fixture libraries: a library installed then used by `history-chain-add`; a library
//! built against another `plugin-api` refused in one line; a name clash refused; an
//! install interrupted before its rename leaving no library; a plugin table edited with
//! its comments kept, and a value the plugin refuses refused with the plugin's words,
//! the file byte-identical.

use std::path::{Path, PathBuf};

use e2e_tests::fixtures::{fixture_library, plugin_built_against_changed_api, plugin_dir_with, ApiChange};
use e2e_tests::{agentctl, describe, json, TestConfig};
use history_engine::library_file_name;

/// A configuration over a plugin folder holding only `default`.
struct Folder {
    _plugins: tempfile::TempDir,
    plugins: PathBuf,
    config: TestConfig,
}

const COMMENTED: &str =
    "# the operator's file\n[history]\nchain = [\"default\"]  # trimming first\non_plugin_error = \"fail\"\n";

impl Folder {
    fn new(extra: &str) -> Folder {
        let plugins = plugin_dir_with(&[]);
        let config = TestConfig::new(&format!(
            "plugin_dir = {:?}\n{COMMENTED}{extra}",
            plugins.path().display().to_string()
        ));
        Folder {
            plugins: plugins.path().to_path_buf(),
            _plugins: plugins,
            config,
        }
    }

    fn agentctl(&self, args: &[&str]) -> std::process::Output {
        agentctl(&self.config.path, args, &[])
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.config.path).unwrap()
    }

    /// The file names in the plugin folder, hidden ones included.
    fn files(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.plugins)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        names
    }
}

/// A refusal: status 1, one line on stderr containing `what`, nothing on stdout.
fn refused_line(output: &std::process::Output, what: &str) -> String {
    assert_eq!(output.status.code(), Some(1), "{}", describe(output));
    assert!(output.stdout.is_empty(), "{}", describe(output));
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.starts_with("agentctl: ") && stderr.contains(what),
        "{stderr}"
    );
    stderr
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_good_library_is_installed_and_then_usable_by_history_chain_add() {
    let folder = Folder::new("");
    let redactor = fixture_library("redactor");
    // Not available yet.
    refused_line(
        &folder.agentctl(&["history-chain-add", "redactor"]),
        "unknown plugin \"redactor\"",
    );

    let output = folder.agentctl(&["install", path(&redactor)]);
    assert!(output.status.success(), "{}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with("redactor 0.1.0 installed: "), "{stdout}");
    assert!(
        stdout.contains("next: agentctl history-chain-add redactor"),
        "{stdout}"
    );
    let installed = folder.plugins.join(library_file_name("redactor"));
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        std::fs::read(&redactor).unwrap()
    );
    assert_eq!(
        folder.files(),
        [library_file_name("default"), library_file_name("redactor")],
        "no temporary file left"
    );

    // Installed again: identical, nothing written.
    let again = folder.agentctl(&["install", path(&redactor), "--json"]);
    assert!(again.status.success(), "{}", describe(&again));
    let value = json(&String::from_utf8_lossy(&again.stdout));
    assert_eq!(
        (value["written"].clone(), value["name"].clone()),
        (false.into(), "redactor".into())
    );

    // Usable: added to the chain, it runs.
    let added = folder.agentctl(&["history-chain-add", "redactor"]);
    assert!(added.status.success(), "{}", describe(&added));
    let output = folder
        .config
        .process(&[], r#"[{"role":"user","content":"my SECRET"}]"#);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(String::from_utf8_lossy(&output.stdout).contains("my [redacted]"));

    // A plugin built against the previous plugin-api release is an older patch: it installs.
    let previous = folder.agentctl(&["install", path(&fixture_library("previous_api"))]);
    assert!(previous.status.success(), "{}", describe(&previous));
}

#[test]
fn a_library_built_against_another_plugin_api_is_refused_in_one_line() {
    let folder = Folder::new("");
    for change in [ApiChange::Layout, ApiChange::Version] {
        let library = plugin_built_against_changed_api(change);
        let line = refused_line(&folder.agentctl(&["install", path(&library)]), "plugin-api");
        assert!(line.contains(&format!("install {}", library.display())), "{line}");
        assert!(line.len() < 400, "one short line, not a layout dump: {line}");
    }
    assert_eq!(folder.files(), [library_file_name("default")], "nothing copied");

    // Not a library at all, and a file not named like one.
    let text = folder.config.dir.path().join(library_file_name("notes"));
    std::fs::write(&text, "not an ELF file").unwrap();
    let line = refused_line(&folder.agentctl(&["install", path(&text)]), "install");
    assert!(line.contains("ELF") || line.contains("too short"), "{line}");
    let badly_named = folder.config.dir.path().join("redactor.so");
    std::fs::copy(fixture_library("redactor"), &badly_named).unwrap();
    refused_line(
        &folder.agentctl(&["install", path(&badly_named)]),
        "not named like a plugin library",
    );
}

#[test]
fn a_name_clash_is_refused_and_force_replaces() {
    let folder = Folder::new("");
    // A different library under the file name `redactor`: it exports "panicker".
    let renamed = folder.config.dir.path().join(library_file_name("redactor"));
    std::fs::copy(fixture_library("panicker"), &renamed).unwrap();
    let line = refused_line(
        &folder.agentctl(&["install", path(&renamed)]),
        "exports the plugin name \"panicker\"",
    );
    assert!(
        line.contains("rename it to libhistory_plugin_panicker.so"),
        "{line}"
    );

    // An installed redactor, then a different library of the same name.
    let installed = folder.plugins.join(library_file_name("redactor"));
    std::fs::copy(fixture_library("redactor"), &installed).unwrap();
    let before = std::fs::read(&installed).unwrap();
    let other = folder.config.dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let other = other.join(library_file_name("redactor"));
    let mut bytes = std::fs::read(fixture_library("redactor")).unwrap();
    bytes.extend_from_slice(b"\0another build");
    std::fs::write(&other, &bytes).unwrap();
    refused_line(
        &folder.agentctl(&["install", path(&other)]),
        "a different library is already installed as",
    );
    assert_eq!(std::fs::read(&installed).unwrap(), before, "untouched");

    let forced = folder.agentctl(&["install", path(&other), "--force"]);
    assert!(forced.status.success(), "{}", describe(&forced));
    assert!(String::from_utf8_lossy(&forced.stdout).contains("replacing a different library"));
    assert_eq!(std::fs::read(&installed).unwrap(), bytes);
}

#[test]
fn an_install_interrupted_before_its_rename_leaves_no_library() {
    let folder = Folder::new("");
    let redactor = fixture_library("redactor");
    let output = agentctl(
        &folder.config.path,
        &["install", path(&redactor)],
        &[("AGENTCTL_FAULT", "after-write")],
    );
    assert_eq!(output.status.code(), Some(70), "{}", describe(&output));
    // The whole copy is left under a hidden temporary name, which discovery never lists.
    let files = folder.files();
    assert!(!files.contains(&library_file_name("redactor")), "{files:?}");
    let temporary: Vec<&String> = files.iter().filter(|n| n.ends_with(".tmp")).collect();
    assert_eq!(temporary.len(), 1, "{files:?}");
    assert!(temporary[0].starts_with('.'), "{files:?}");
    let plugins = folder.agentctl(&["plugins", "--json"]);
    let listed = json(&String::from_utf8_lossy(&plugins.stdout));
    assert_eq!(listed["plugins"].as_array().unwrap().len(), 1, "{listed}");
    refused_line(
        &folder.agentctl(&["history-chain-add", "redactor"]),
        "unknown plugin",
    );

    // The next install works and removes what the interrupted one left.
    let output = folder.agentctl(&["install", path(&redactor)]);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(
        folder.files(),
        [library_file_name("default"), library_file_name("redactor")]
    );
}

#[test]
fn plugin_set_keeps_the_layout_and_the_plugins_own_refusal_leaves_the_file_alone() {
    let folder =
        Folder::new("\n[plugin.redactor]   # the redaction rules\nfail = false  # never in production\n");
    std::fs::copy(
        fixture_library("redactor"),
        folder.plugins.join(library_file_name("redactor")),
    )
    .unwrap();
    let original = folder.text();

    // A string that is not TOML is taken as text; the comments stay where they were.
    let output = folder.agentctl(&["plugin-set", "redactor", "replacement", "[gone]"]);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout)
            .starts_with("[plugin.redactor] replacement: (unset) -> \"[gone]\""),
        "{}",
        describe(&output)
    );
    let set = folder.text();
    assert_eq!(
        set,
        original.replace(
            "# never in production\n",
            "# never in production\nreplacement = \"[gone]\"\n"
        )
    );
    let output = folder.agentctl(&["plugin-set", "redactor", "fail", "true"]);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(folder.text(), set.replace("fail = false  #", "fail = true  #"));
    let output = folder.agentctl(&["plugin-unset", "redactor", "fail"]);
    assert!(output.status.success(), "{}", describe(&output));
    let unset = folder.text();
    assert_eq!(unset, set.replace("fail = false  # never in production\n", ""));

    // The plugin refuses: its own words, with the file and line; the file byte-identical.
    let line = refused_line(
        &folder.agentctl(&["plugin-set", "redactor", "replacement", "\"\""]),
        "replacement: must be a non-empty text without the secret in it",
    );
    assert!(line.contains("[plugin.redactor]"), "{line}");
    assert_eq!(folder.text(), unset, "byte-identical");
    refused_line(
        &folder.agentctl(&["plugin-set", "redactor", "fail", "sometimes"]),
        "fail",
    );
    refused_line(
        &folder.agentctl(&["plugin-set", "redactor", "colour", "red"]),
        "colour",
    );
    refused_line(
        &folder.agentctl(&["plugin-set", "nosuch", "a", "1"]),
        "unknown plugin \"nosuch\"",
    );
    refused_line(
        &folder.agentctl(&["plugin-unset", "redactor", "fail"]),
        "has no fail to unset",
    );
    assert_eq!(folder.text(), unset, "byte-identical");
    // Nothing left beside the configuration.
    let left: Vec<String> = std::fs::read_dir(folder.config.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn plugins_tells_a_library_that_does_not_load_from_a_refused_table() {
    let folder = Folder::new("\n[plugin.redactor]\nreplacement = \"\"\n");
    std::fs::copy(
        fixture_library("redactor"),
        folder.plugins.join(library_file_name("redactor")),
    )
    .unwrap();
    std::fs::write(folder.plugins.join(library_file_name("broken")), b"not a library").unwrap();
    let output = folder.agentctl(&["plugins"]);
    assert!(output.status.success(), "{}", describe(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no line for {name}:\n{text}"))
            .to_string()
    };
    let redactor = line("redactor");
    assert!(
        redactor.contains("loads, but its [plugin.redactor] table is refused: ")
            && redactor.contains("replacement: must be a non-empty text"),
        "{text}"
    );
    assert!(!redactor.contains("DOES NOT LOAD"), "{text}");
    assert!(line("broken").contains("DOES NOT LOAD: "), "{text}");

    let output = folder.agentctl(&["plugins", "--json"]);
    let value = json(&String::from_utf8_lossy(&output.stdout));
    let find = |name: &str| {
        value["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()
            .clone()
    };
    let (redactor, broken) = (find("redactor"), find("broken"));
    assert_eq!(
        (redactor["loads"].clone(), redactor["available"].clone()),
        (false.into(), true.into())
    );
    assert!(
        redactor["config_error"].as_str().unwrap().contains("replacement"),
        "{redactor}"
    );
    assert_eq!(
        (broken["available"].clone(), broken["config_error"].clone()),
        (false.into(), serde_json::Value::Null)
    );
}

/// `plugin-keys NAME` lists the keys a plugin accepts, as its `describe` gives them (so
/// `history-list` and `plugins --json` need not be read for them); a plugin's refusal of
/// an unknown key names the keys it accepts, in `plugin-set` and at load.
#[test]
fn plugin_keys_lists_a_plugins_keys_and_an_unknown_key_is_told_with_them() {
    let plugins = plugin_dir_with(&[&fixture_library("redactor")]);
    let config = TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"redactor\"]\n",
        plugins.path().display().to_string()
    ));
    let output = agentctl(&config.path, &["plugin-keys", "redactor"], &[]);
    assert!(output.status.success(), "{}", describe(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("redactor 0.1.0 (") && lines[0].ends_with(") accepts, in [plugin.redactor]:"),
        "{text}"
    );
    assert_eq!(
        lines[1..],
        [
            "  fail         fail every call",
            "  replacement  what a secret becomes (default \"[redacted]\", never empty)",
            "  also         more secrets to redact (none empty)",
        ],
        "{text}"
    );
    let output = agentctl(&config.path, &["--json", "plugin-keys", "redactor"], &[]);
    let value = json(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(
        value["config_keys"][0],
        json(r#"{"name": "fail", "meaning": "fail every call"}"#)
    );
    let listed = agentctl(&config.path, &["--json", "plugins"], &[]);
    let listed = json(&String::from_utf8_lossy(&listed.stdout));
    let redactor = listed["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "redactor")
        .unwrap();
    assert_eq!(
        redactor["config_keys"], value["config_keys"],
        "plugins --json shows them too"
    );

    let output = agentctl(&config.path, &["plugin-keys", "redactr"], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("agentctl: plugin \"redactr\" is not available in ")
            && stderr.contains("(available: default, redactor)"),
        "{stderr}"
    );

    // The refusal of an unknown key lists the known ones: in an edit, and at load.
    let known = "[plugin.redactor] replacment: unknown key (known: fail, replacement, also)";
    let output = agentctl(&config.path, &["plugin-set", "redactor", "replacment", "x"], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains(known),
        "{}",
        describe(&output)
    );
    std::fs::write(
        &config.path,
        format!(
            "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"redactor\"]\n[plugin.redactor]\nreplacment = \"x\"\n",
            plugins.path().display().to_string()
        ),
    )
    .unwrap();
    let output = config.process(&[], r#"[{"role":"user","content":"hi"}]"#);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains(&format!(":5: {known}")),
        "{}",
        describe(&output)
    );
}
