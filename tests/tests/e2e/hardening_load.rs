//! Loading plugin libraries safely: a library file cut short (a half-finished copy into
//! `plugin_dir`), a library whose load-time code crashes, symlinks that lead out of
//! `plugin_dir`, and libraries found by their file names. The host maps only the libraries
//! its configuration names, after checking each is a complete shared library; `agentctl`'s
//! commands that look at every file load each one in a child process.

use std::path::{Path, PathBuf};
use std::process::Output;

use e2e_tests::fixtures::{fixture_library, plugin_dir_with};
use e2e_tests::{agentctl, describe, json, plugin_dir, TestConfig};
use history_engine::library_file_name;

const HISTORY: &str = r#"[{"role":"system","content":"s"},{"role":"user","content":"task"},
    {"role":"user","content":"and more"}]"#;

/// A configuration over `dir` with `chain`, on a chars4 model (no tokenizer to load).
fn config(dir: &Path, chain: &str) -> TestConfig {
    TestConfig::new(&format!(
        "plugin_dir = {:?}\n[history]\nchain = {chain}\n[models.default]\ntokenizer = \"chars4\"\n",
        dir.display().to_string()
    ))
}

/// The real `role_pair` library's bytes.
fn role_pair_bytes() -> Vec<u8> {
    std::fs::read(plugin_dir().join(library_file_name("role_pair"))).unwrap()
}

/// The lengths a copy is cut to: its first pages (what crashed a loader that mapped it), a
/// few bytes, half, all but the end.
fn cut_lengths(len: usize) -> [usize; 4] {
    [10_000, 100, len / 2, len - 100]
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).to_string()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).to_string()
}

/// The lines of `text` that mention `path`.
fn lines_naming<'a>(text: &'a str, path: &Path) -> Vec<&'a str> {
    let path = path.display().to_string();
    text.lines().filter(|line| line.contains(&path)).collect()
}

/// `agentctl plugins --json`'s entry for the library file `file`.
fn plugins_entry(config: &TestConfig, file: &Path, envs: &[(&str, &str)]) -> serde_json::Value {
    let output = agentctl(&config.path, &["plugins", "--json"], envs);
    assert!(output.status.success(), "{}", describe(&output));
    let value = json(&stdout(&output));
    let file = file.display().to_string();
    value["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["file"] == file.as_str())
        .unwrap_or_else(|| panic!("no entry for {file}: {value}"))
        .clone()
}

#[test]
fn a_truncated_library_outside_the_chain_is_refused_in_one_line_and_everything_runs() {
    let whole = role_pair_bytes();
    for len in cut_lengths(whole.len()) {
        let dir = plugin_dir_with(&[]);
        let cut = dir.path().join(library_file_name("x"));
        std::fs::write(&cut, &whole[..len]).unwrap();
        let config = config(dir.path(), r#"["default"]"#);
        let size = format!("of a {len}-byte file");

        // The host never maps it: the run goes on, and one line says it was refused.
        let output = config.process(&[], HISTORY);
        assert!(output.status.success(), "cut to {len}: {}", describe(&output));
        assert_eq!(json(&stdout(&output)), json(HISTORY), "cut to {len}");
        let errors = stderr(&output);
        let named = lines_naming(&errors, &cut);
        assert_eq!(named.len(), 1, "cut to {len}: {errors}");
        assert!(
            named[0].contains("refused plugin library")
                && named[0].contains("truncated: ")
                && named[0].contains(&size),
            "cut to {len}: {errors}"
        );

        // `plugins` lists it as not loading, with the reason, and exits normally.
        let output = agentctl(&config.path, &["plugins"], &[]);
        assert!(output.status.success(), "cut to {len}: {}", describe(&output));
        let text = stdout(&output);
        let line = text
            .lines()
            .find(|l| l.starts_with("x "))
            .unwrap_or_else(|| panic!("cut to {len}: no line for x:\n{text}"));
        assert!(
            line.contains("DOES NOT LOAD: truncated: ")
                && line.contains(&size)
                && line.ends_with("; not enabled"),
            "cut to {len}: {line}"
        );
        let entry = plugins_entry(&config, &cut, &[]);
        assert_eq!(entry["loads"], false, "{entry}");
        assert!(
            entry["reason"].as_str().unwrap().starts_with("truncated: "),
            "{entry}"
        );

        // `check` warns about it and still runs the chain on its sample.
        let output = agentctl(&config.path, &["check"], &[]);
        assert!(output.status.success(), "cut to {len}: {}", describe(&output));
        let text = stdout(&output);
        assert!(
            text.contains(&format!(
                "warning: refused plugin library {}: truncated: ",
                cut.display()
            )),
            "cut to {len}: {text}"
        );
        assert!(text.contains("sample run, model default"), "{text}");
        assert!(text.trim_end().ends_with("check: ok"), "{text}");

        // Every other command works too.
        let output = agentctl(&config.path, &["history-list"], &[]);
        assert!(output.status.success(), "cut to {len}: {}", describe(&output));
        let output = agentctl(&config.path, &["max-users", "7"], &[]);
        assert!(output.status.success(), "cut to {len}: {}", describe(&output));
    }
}

#[test]
fn a_truncated_library_in_the_chain_stops_the_run_with_one_line_naming_it() {
    let whole = role_pair_bytes();
    for len in cut_lengths(whole.len()) {
        let dir = plugin_dir_with(&[]);
        let cut = dir.path().join(library_file_name("role_pair"));
        std::fs::write(&cut, &whole[..len]).unwrap();
        let config = config(dir.path(), r#"["default", "role_pair"]"#);

        let output = config.process(&[], HISTORY);
        assert_eq!(
            output.status.code(),
            Some(3),
            "cut to {len}: {}",
            describe(&output)
        );
        assert!(output.stdout.is_empty(), "cut to {len}: {}", describe(&output));
        let errors = stderr(&output);
        assert_eq!(errors.lines().count(), 1, "cut to {len}: {errors}");
        assert!(
            errors.starts_with("history-host: ")
                && errors.contains(&format!(
                    "plugin \"role_pair\" in the chain cannot be loaded: refused plugin library {}: truncated: ",
                    cut.display()
                ))
                && errors.contains(&format!("of a {len}-byte file")),
            "cut to {len}: {errors}"
        );

        // agentctl reports it, and exits as it does for any broken chain.
        let entry = plugins_entry(&config, &cut, &[]);
        assert_eq!(entry["loads"], false, "{entry}");
        assert_eq!(entry["position"], 1, "{entry}");
        let output = agentctl(&config.path, &["check"], &[]);
        assert_eq!(
            output.status.code(),
            Some(1),
            "cut to {len}: {}",
            describe(&output)
        );
        assert!(
            stdout(&output)
                .contains("problem: plugin \"role_pair\": cannot be loaded: refused plugin library"),
            "{}",
            describe(&output)
        );
        let output = agentctl(&config.path, &["max-users", "7"], &[]);
        assert_eq!(
            output.status.code(),
            Some(1),
            "cut to {len}: {}",
            describe(&output)
        );
        assert_eq!(stderr(&output).lines().count(), 1, "{}", describe(&output));
        assert!(stderr(&output).contains("truncated: "), "{}", describe(&output));
    }
}

#[test]
fn a_library_that_crashes_while_it_loads_is_reported_and_never_ends_the_caller() {
    let crasher = fixture_library("crasher");
    let dir = plugin_dir_with(&[&crasher]);
    let file = dir.path().join(library_file_name("crasher"));
    let config = config(dir.path(), r#"["default"]"#);

    // Not in the chain: the host never maps it.
    let output = config.process(&[], HISTORY);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(json(&stdout(&output)), json(HISTORY));

    let sigbus = "the library crashed the probe (signal 7 SIGBUS)";
    for (on_load, reason) in [
        ("bus", sigbus),
        ("abort", "the library crashed the probe (signal 6 SIGABRT)"),
        (
            "exit",
            "the library ended the probe (exit status 0) before it answered",
        ),
    ] {
        let envs = [("HISTORY_FIXTURE_ON_LOAD", on_load)];
        let entry = plugins_entry(&config, &file, &envs);
        assert_eq!(entry["loads"], false, "{on_load}: {entry}");
        assert_eq!(entry["reason"], reason, "{on_load}: {entry}");

        let output = agentctl(&config.path, &["check"], &envs);
        assert!(output.status.success(), "{on_load}: {}", describe(&output));
        assert!(
            stdout(&output).contains(&format!(
                "warning: refused plugin library {}: {reason}",
                file.display()
            )),
            "{on_load}: {}",
            describe(&output)
        );
    }
    let output = agentctl(&config.path, &["plugins"], &[]);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(
        stdout(&output).contains(&format!("DOES NOT LOAD: {sigbus}; not enabled")),
        "{}",
        describe(&output)
    );
    let output = agentctl(&config.path, &["history-list"], &[]);
    assert!(output.status.success(), "{}", describe(&output));

    // Edits that would map it refuse in one line; the others go through.
    let output = agentctl(&config.path, &["history-chain-add", "crasher"], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        stderr(&output).trim_end(),
        format!(
            "agentctl: plugin \"crasher\" cannot be loaded: refused plugin library {}: {sigbus}",
            file.display()
        )
    );
    let output = agentctl(&config.path, &["max-users", "7"], &[]);
    assert!(output.status.success(), "{}", describe(&output));
}

#[test]
fn a_crashing_library_in_the_chain_is_a_problem_agentctl_reports_and_can_remove() {
    let crasher = fixture_library("crasher");
    let dir = plugin_dir_with(&[&crasher]);
    let config = config(dir.path(), r#"["default", "crasher"]"#);

    let output = agentctl(&config.path, &["check"], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        stderr(&output)
            .contains("check failed: plugin \"crasher\": cannot be loaded: refused plugin library")
            && stderr(&output).contains("the library crashed the probe (signal 7 SIGBUS)"),
        "{}",
        describe(&output)
    );
    let output = agentctl(&config.path, &["max-users", "7"], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(stderr(&output).lines().count(), 1, "{}", describe(&output));
    assert!(
        stderr(&output).contains("the library crashed the probe (signal 7 SIGBUS)"),
        "{}",
        describe(&output)
    );
    let output = agentctl(&config.path, &["history-chain-remove", "crasher"], &[]);
    assert!(output.status.success(), "{}", describe(&output));
    let output = config.process(&[], HISTORY);
    assert!(output.status.success(), "{}", describe(&output));
}

/// A symlink `link` (in a plugin folder) to `target`.
fn symlink(target: &Path, link: &Path) {
    #[cfg(unix)]
    std::os::unix::fs::symlink(target, link).unwrap();
    #[cfg(not(unix))]
    panic!("symlinks: unix only ({} -> {})", link.display(), target.display());
}

#[cfg(unix)]
#[test]
fn a_symlink_out_of_plugin_dir_is_refused_and_one_inside_it_is_loaded() {
    let real = plugin_dir().join(library_file_name("role_pair"));
    let canonical = std::fs::canonicalize(&real).unwrap();

    // A link to the installed library, outside this plugin_dir.
    let dir = plugin_dir_with(&[]);
    let link = dir.path().join(library_file_name("role_pair"));
    symlink(&real, &link);
    let outside = format!(
        "refused plugin library {}: a symbolic link to {}, outside plugin_dir",
        link.display(),
        canonical.display()
    );
    let in_chain = config(dir.path(), r#"["default", "role_pair"]"#);
    let output = in_chain.process(&[], HISTORY);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    let errors = stderr(&output);
    assert_eq!(errors.lines().count(), 1, "{errors}");
    assert!(
        errors.contains(&format!(
            "plugin \"role_pair\" in the chain cannot be loaded: {outside}"
        )),
        "{errors}"
    );
    let not_in_chain = config(dir.path(), r#"["default"]"#);
    let output = not_in_chain.process(&[], HISTORY);
    assert!(output.status.success(), "{}", describe(&output));
    let errors = stderr(&output);
    let named = lines_naming(&errors, &link);
    assert_eq!(named.len(), 1, "{}", describe(&output));
    assert!(named[0].contains(&outside), "{}", describe(&output));
    let entry = plugins_entry(&not_in_chain, &link, &[]);
    assert_eq!(entry["loads"], false, "{entry}");
    assert!(
        entry["reason"].as_str().unwrap().contains("outside plugin_dir"),
        "{entry}"
    );

    // A relative link that climbs out, and a link to a link that leads out, likewise.
    let dir = plugin_dir_with(&[]);
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::copy(&real, elsewhere.path().join("role_pair.so")).unwrap();
    let climbing = PathBuf::from("..")
        .join(elsewhere.path().file_name().unwrap())
        .join("role_pair.so");
    let relative = dir.path().join(library_file_name("role_pair"));
    assert_eq!(
        dir.path().parent(),
        elsewhere.path().parent(),
        "both in the temp folder"
    );
    symlink(&climbing, &relative);
    let chained = dir.path().join(library_file_name("chained"));
    symlink(Path::new(&library_file_name("role_pair")), &chained);
    let config_out = config(dir.path(), r#"["default", "role_pair"]"#);
    let output = config_out.process(&[], HISTORY);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    assert!(
        stderr(&output).contains("outside plugin_dir"),
        "{}",
        describe(&output)
    );
    let entry = plugins_entry(&config_out, &chained, &[]);
    assert!(
        entry["reason"].as_str().unwrap().contains("outside plugin_dir"),
        "{entry}"
    );

    // A link to a file inside plugin_dir (here in a subfolder) is loaded.
    let dir = plugin_dir_with(&[]);
    std::fs::create_dir(dir.path().join("store")).unwrap();
    std::fs::copy(&real, dir.path().join("store/role_pair-0.1.0.so")).unwrap();
    symlink(
        Path::new("store/role_pair-0.1.0.so"),
        &dir.path().join(library_file_name("role_pair")),
    );
    let inside = config(dir.path(), r#"["default", "role_pair"]"#);
    let output = inside.process(&[], HISTORY);
    assert!(output.status.success(), "{}", describe(&output));
    // role_pair ran: it merged the two user messages.
    let out = json(&stdout(&output));
    assert_eq!(out.as_array().unwrap().len(), 2, "{out}");
    assert_eq!(
        plugins_entry(&inside, &dir.path().join(library_file_name("role_pair")), &[])["loads"],
        true
    );
}

#[test]
fn a_library_is_found_by_its_file_name_and_must_export_that_name() {
    let real = plugin_dir().join(library_file_name("role_pair"));
    let dir = plugin_dir_with(&[&real]);
    let backup = dir.path().join(library_file_name("role_pair_old"));
    std::fs::copy(&real, &backup).unwrap();

    // A renamed copy nothing names is never loaded: it does not stop the run.
    let output = config(dir.path(), r#"["default", "role_pair"]"#).process(&[], HISTORY);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(json(&stdout(&output)).as_array().unwrap().len(), 2);

    // Named, it is refused, naming both files that export the name.
    let output = config(dir.path(), r#"["default", "role_pair_old"]"#).process(&[], HISTORY);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    let errors = stderr(&output);
    assert_eq!(errors.lines().count(), 1, "{errors}");
    assert!(
        errors.contains(&format!(
            "two plugin libraries export the name \"role_pair\": {} and {}",
            dir.path().join(library_file_name("role_pair")).display(),
            backup.display()
        )),
        "{errors}"
    );

    // Alone, it is refused for its name.
    std::fs::remove_file(dir.path().join(library_file_name("role_pair"))).unwrap();
    let output = config(dir.path(), r#"["default", "role_pair_old"]"#).process(&[], HISTORY);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    assert!(
        stderr(&output).contains(&format!(
            "it exports the name \"role_pair\", not \"role_pair_old\" as its file name says (rename it {})",
            library_file_name("role_pair")
        )),
        "{}",
        describe(&output)
    );
    // And a plugin with no file named for it is unknown, the message listing what is there.
    let output = config(dir.path(), r#"["default", "role_pair"]"#).process(&[], HISTORY);
    assert_eq!(output.status.code(), Some(3), "{}", describe(&output));
    assert!(
        stderr(&output).contains("plugin \"role_pair\" in the chain is not available in")
            && stderr(&output).contains("(available: default, role_pair_old)"),
        "{}",
        describe(&output)
    );
}
