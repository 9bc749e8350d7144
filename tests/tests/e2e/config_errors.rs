//! Configuration errors (docs/configuration.md, docs/cli.md#exit-statuses): one clear line, exit 3, nothing on stdout.
//! (`TestConfig` writes `plugin_dir` on line 1, so the body starts on line 2.)

use e2e_tests::{describe, TestConfig};

fn refused(body: &str) -> String {
    let config = TestConfig::new(body);
    let output = config.process(&[], "[]");
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
    let last = stderr.lines().last().unwrap().to_string();
    assert!(last.contains("plugins-enabled.toml"), "names the file: {last}");
    last
}

#[test]
fn an_unknown_key_is_named_with_its_line() {
    let line = refused("max_users = 5\n[history]\nagent_max_ctx = 10\nchian = [\"default\"]\n");
    assert!(line.contains(":5: unknown key `chian` in [history]"), "{line}");
}

#[test]
fn default_removed_or_moved_is_refused() {
    let line = refused("[history]\nchain = []\n");
    assert!(line.contains("must start with \"default\""), "{line}");
    let line = refused("[history]\nchain = [\"panicker\", \"default\"]\n");
    assert!(line.contains("\"default\" must be first"), "{line}");
}

#[test]
fn a_chain_name_that_is_a_path_is_refused() {
    let line = refused("[history]\nchain = [\"default\", \"../x\"]\n");
    assert!(line.contains("\"../x\" is not a plugin name"), "{line}");
    assert!(line.contains(":3:"), "{line}");
}

#[test]
fn a_missing_plugin_is_named_with_the_available_ones() {
    let line = refused("[history]\nchain = [\"default\", \"no_such_plugin\"]\n");
    assert!(
        line.contains("plugin \"no_such_plugin\" in the chain is not available"),
        "{line}"
    );
    assert!(line.contains("available: ") && line.contains("default"), "{line}");
}

#[test]
fn a_plugin_validates_its_own_table_naming_key_and_line() {
    let line = refused(
        "[history]\nchain = [\"default\"]\n\n[plugin.default]\npin_system = true\ntarget_mesages = 3\n",
    );
    assert!(
        line.contains(
            ":7: [plugin.default] target_mesages: unknown key (known: pin_system, pin_first_user, target_messages)"
        ),
        "{line}"
    );
    let line = refused("[plugin.default]\npin_system = \"yes\"\n");
    assert!(
        line.contains(":3: [plugin.default] pin_system: expected true or false"),
        "{line}"
    );
    let line = refused("[history]\nagent_max_ctx = 50\n[plugin.default]\ntarget_messages = 80\n");
    assert!(
        line.contains("target_messages: 80 is not below the window"),
        "{line}"
    );
}

#[test]
fn a_missing_plugin_dir_and_bad_toml_are_clear() {
    let line = refused("plugin_dir = \"/nonexistent/plugins\"\n");
    assert!(
        line.contains("cannot read plugin_dir /nonexistent/plugins"),
        "{line}"
    );
    let line = refused("[history\n");
    assert!(line.contains("not valid TOML"), "{line}");
}

#[test]
fn a_table_for_no_available_plugin_is_a_warning() {
    let config = TestConfig::new("[plugin.someday]\nx = 1\n");
    let output = config.process(&[], "[]");
    assert!(output.status.success(), "{}", describe(&output));
    assert!(String::from_utf8_lossy(&output.stderr).contains("[plugin.someday] names no available plugin"));
}

#[test]
fn a_refused_entry_of_an_array_value_points_at_its_line() {
    let dir = e2e_tests::fixtures::plugin_dir_with(&[&e2e_tests::fixtures::fixture_library("redactor")]);
    let body = |also: &str| {
        format!(
            "plugin_dir = {:?}\n[history]\nchain = [\"default\", \"redactor\"]\n\n[plugin.redactor]\nalso = {also}\n",
            dir.path().display().to_string()
        )
    };
    // One entry per line: the entry's own line (8); on one line: the key's (6).
    let line = refused(&body("[\n  \"TOKEN\",\n  \"\",\n]"));
    assert!(
        line.contains(
            "plugins-enabled.toml:8: [plugin.redactor] also[1]: an empty secret would match everywhere"
        ),
        "{line}"
    );
    let line = refused(&body("[\"TOKEN\", \"\"]"));
    assert!(
        line.contains("plugins-enabled.toml:6: [plugin.redactor] also[1]"),
        "{line}"
    );
}
