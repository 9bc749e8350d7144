//! `cargo xtask`: the project's tasks, in Rust instead of shell scripts.
//!
//! ```text
//! cargo xtask build [--release]        build the host and every plugin, install the
//!                                      plugin libraries into target/plugins
//! cargo xtask test [ARGS…]             build (debug), then cargo test --workspace ARGS…
//! cargo xtask new-plugin NAME [--dir D] scaffold a plugin crate (in plugins/NAME, or a
//!                                      standalone crate in D)
//! cargo xtask gen-history [--turns N] [--seed S]
//!                                      print a generated agent history (JSON array)
//! cargo xtask bench [--json] [--input FILE] [--max-tokens K] [--runs R]
//!                                      build everything in release, install the plugins
//!                                      and the floor fixture into target/bench-plugins,
//!                                      measure the chain (SPEC §8)
//! ```
//!
//! Every task acts on the workspace the current directory is in (see [`workspace`]).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use plugin_api::naming::{library_file_name, STEM_PREFIX};

mod scaffold;
mod workspace;

use workspace::cargo;

type Result<T> = std::result::Result<T, String>;

/// Why a task did not run to the end.
enum Failure {
    /// The command line is wrong: the usage goes to stderr, exit code 2.
    Usage(String),
    /// The task failed: exit code 1.
    Task(String),
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure::Task(message)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (task, rest) = match args.split_first() {
        Some((task, rest)) => (Some(task.as_str()), rest),
        None => (None, &[][..]),
    };
    let result = match task {
        Some("-h" | "--help" | "help") => {
            print!("{}", USAGE.trim_start());
            Ok(())
        }
        Some("build") => build_task(rest),
        Some("test") => test(rest).map_err(Failure::from),
        Some("new-plugin") => new_plugin(rest),
        Some("gen-history") => gen_history(rest).map_err(Failure::from),
        Some("bench") => bench(rest).map_err(Failure::from),
        Some(other) => Err(Failure::Usage(format!("unknown task `{other}`"))),
        None => Err(Failure::Usage("no task given".to_string())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("xtask: {message}\n\n{}", USAGE.trim());
            ExitCode::from(2)
        }
        Err(Failure::Task(message)) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

const USAGE: &str = "
usage: cargo xtask <task>
  build [--release]           build the host and every plugin; install plugins into target/plugins
  test [ARGS...]              build (debug), then run every test: cargo test --workspace ARGS...
  new-plugin NAME [--dir DIR] scaffold a plugin crate in plugins/NAME (or standalone in DIR)
  gen-history [--turns N] [--seed S]
                              print a generated agent history (JSON array) to stdout
  bench [--json] [--input FILE] [--max-tokens K] [--runs R]
                              build in release, install into target/bench-plugins and
                              measure the chain against its floor (SPEC §8)
  help, -h, --help            print this
";

/// The benchmark's package and its pass-through fixture plugin (installed only into
/// `target/bench-plugins`, never with the shipped plugins).
const BENCH_PACKAGE: &str = "history-bench";
const FLOOR_PLUGIN: &str = "history_plugin_floor";

fn run(command: &mut Command) -> Result<()> {
    let status = command
        .status()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{command:?} failed ({status})"))
    }
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

/// The workspace's plugin packages: members with a `cdylib` target named `history_plugin_*`,
/// as (package, plugin name).
fn plugin_packages(root: &Path) -> Result<Vec<(String, String)>> {
    let output = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).map_err(|e| format!("cargo metadata: {e}"))?;
    let mut names = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        let name = package["name"].as_str().unwrap_or_default();
        // The library's file is named after its cdylib target (not its package).
        let plugin = package["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["kind"].as_array().into_iter().flatten().any(|k| k == "cdylib"))
            .filter_map(|t| t["name"].as_str()?.strip_prefix(STEM_PREFIX))
            .find(|plugin| !plugin.is_empty());
        // The bench's fixture is a plugin only for the bench: never installed with the others.
        if let Some(plugin) = plugin.filter(|_| name != FLOOR_PLUGIN) {
            names.push((name.to_string(), plugin.to_string()));
        }
    }
    names.sort();
    Ok(names)
}

/// Refuses `panic = "abort"` for the profile: a plugin's panic must unwind to the export
/// macro's `catch_unwind`, or it takes the whole host process down (SPEC §3.2).
fn refuse_panic_abort(root: &Path, profile: &str) -> Result<()> {
    let env_key = format!("CARGO_PROFILE_{}_PANIC", profile.to_uppercase());
    if std::env::var(&env_key).is_ok_and(|v| v == "abort") {
        return Err(format!(
            "{env_key}=abort: plugins must be built with panic = \"unwind\""
        ));
    }
    for file in [root.join("Cargo.toml"), root.join(".cargo/config.toml")] {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let document: toml_edit::DocumentMut =
            text.parse().map_err(|e| format!("{}: {e}", file.display()))?;
        let panic = document
            .get("profile")
            .and_then(|p| p.get(profile))
            .and_then(|p| p.get("panic"))
            .and_then(|p| p.as_str());
        if panic == Some("abort") {
            return Err(format!(
                "{} sets panic = \"abort\" in [profile.{profile}]: refusing to build plugins that way — \
                 a panicking plugin would take the host down instead of becoming an error; use panic = \"unwind\"",
                file.display()
            ));
        }
    }
    Ok(())
}

/// Copies a library into `dir` under a temporary name, then renames it into place: a
/// process that has the old file loaded keeps its mapping (overwriting a loaded library
/// in place crashes that process, SPEC §3.2).
pub fn install_library(library: &Path, dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let file_name = library.file_name().ok_or("library without a file name")?;
    let destination = dir.join(file_name);
    let temporary = dir.join(format!(".{}.installing", file_name.to_string_lossy()));
    std::fs::copy(library, &temporary).map_err(|e| {
        format!(
            "cannot copy {} to {}: {e}",
            library.display(),
            temporary.display()
        )
    })?;
    std::fs::rename(&temporary, &destination)
        .map_err(|e| format!("cannot install {}: {e}", destination.display()))?;
    Ok(destination)
}

fn build_task(args: &[String]) -> std::result::Result<(), Failure> {
    let mut release = false;
    for arg in args {
        match arg.as_str() {
            "--release" => release = true,
            other => return Err(Failure::Usage(format!("build: unexpected argument `{other}`"))),
        }
    }
    build(&workspace::current_root()?, release)?;
    Ok(())
}

/// Builds the host and every plugin, and installs the plugins into `target/plugins`.
fn build(root: &Path, release: bool) -> Result<PathBuf> {
    let profile = if release { "release" } else { "dev" };
    refuse_panic_abort(root, profile)?;
    let plugins = plugin_packages(root)?;
    let mut command = cargo();
    command
        .current_dir(root)
        .args(["build", "--package", "history-host", "--package", "agentctl"]);
    for (package, _) in &plugins {
        command.args(["--package", package]);
    }
    if release {
        command.arg("--release");
    }
    run(&mut command)?;
    let built = target_dir(root).join(if release { "release" } else { "debug" });
    let plugin_dir = target_dir(root).join("plugins");
    for (_, plugin) in &plugins {
        let installed = install_library(&built.join(library_file_name(plugin)), &plugin_dir)?;
        eprintln!("installed {}", installed.display());
    }
    Ok(plugin_dir)
}

fn test(args: &[String]) -> Result<()> {
    let root = workspace::current_root()?;
    build(&root, false)?;
    run(cargo()
        .current_dir(&root)
        .args(["test", "--workspace"])
        .args(args))
}

fn new_plugin(args: &[String]) -> std::result::Result<(), Failure> {
    const USAGE: &str = "new-plugin: usage: cargo xtask new-plugin NAME [--dir DIR]";
    let mut name = None;
    let mut dir = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--dir" => {
                let folder = args
                    .next()
                    .ok_or(Failure::Usage("new-plugin: --dir needs a folder".into()))?;
                dir = Some(PathBuf::from(folder));
            }
            _ if name.is_none() => name = Some(arg.as_str()),
            other => return Err(Failure::Usage(format!("{USAGE} (unexpected `{other}`)"))),
        }
    }
    let name = name.ok_or(Failure::Usage(USAGE.into()))?;
    let root = workspace::current_root()?;
    let created = scaffold::new_plugin(&root, name, dir.as_deref())?;
    eprintln!("created plugin crate {}", created.display());
    eprintln!(
        "next: cargo xtask build, then agentctl history-chain-add {name} (or add it to [history] chain)"
    );
    Ok(())
}

/// Runs the release `history-bench` with `args` (building it first if needed).
fn history_bench(root: &Path, args: &[&str], extra: &[String]) -> Result<()> {
    run(cargo()
        .current_dir(root)
        .args(["run", "--quiet", "--release", "--package", BENCH_PACKAGE, "--"])
        .args(args)
        .args(extra))
}

fn gen_history(args: &[String]) -> Result<()> {
    history_bench(&workspace::current_root()?, &["gen-history"], args)
}

/// Builds the host, every plugin, the floor fixture and the bench in release; installs the
/// plugins and the fixture into `target/bench-plugins` (a folder of its own, so the
/// fixture never shows up among the shipped plugins); runs the measurements. The bench
/// writes its configuration there, choosing the full chain where it is installed.
fn bench(args: &[String]) -> Result<()> {
    let root = workspace::current_root()?;
    refuse_panic_abort(&root, "release")?;
    let plugins = plugin_packages(&root)?;
    let mut command = cargo();
    command.current_dir(&root).args([
        "build",
        "--release",
        "--package",
        "history-host",
        "--package",
        BENCH_PACKAGE,
        "--package",
        FLOOR_PLUGIN,
    ]);
    for (package, _) in &plugins {
        command.args(["--package", package]);
    }
    run(&mut command)?;
    let built = target_dir(&root).join("release");
    let bench_dir = target_dir(&root).join("bench-plugins");
    // A plugin removed from the workspace since the last bench must not be measured.
    if let Ok(entries) = std::fs::read_dir(&bench_dir) {
        for entry in entries.filter_map(|e| e.ok()) {
            if plugin_api::naming::plugin_stem(&entry.path()).is_some() {
                std::fs::remove_file(entry.path())
                    .map_err(|e| format!("cannot remove {}: {e}", entry.path().display()))?;
            }
        }
    }
    let floor = FLOOR_PLUGIN
        .strip_prefix(STEM_PREFIX)
        .expect("the floor is a plugin crate");
    for plugin in plugins.iter().map(|(_, plugin)| plugin.as_str()).chain([floor]) {
        install_library(&built.join(library_file_name(plugin)), &bench_dir)?;
    }
    let plugin_dir = bench_dir.display().to_string();
    history_bench(&root, &["run", "--plugin-dir", &plugin_dir], args)
}
