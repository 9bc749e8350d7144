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
//! cargo xtask bench [--json] [--input FILE] [--max-tokens K] [--runs R] | --big [--case C] | --isolated
//!                                      build everything in release, install the plugins
//!                                      and the floor fixture into target/bench-plugins,
//!                                      measure the chain
//! cargo xtask bench serve [--json] [--sessions N] [--clients C] [--turns T] [--store URL]
//!                         [--reloads N] [--session-memory-mb N] [--sticky] [--rate R]
//!                         [--callgrind [--callgrind-sessions N] [--callgrind-dir DIR]]
//!                                      the same build, then a real serve under concurrent
//!                                      loopback clients, beside a pass-through floor (or
//!                                      an open loop at R turns/s; instructions per turn
//!                                      under callgrind); or N hot reloads during the
//!                                      load (--reloads)
//! cargo xtask bench proxy [--json]     the same build, then serve --upstream against a
//!                                      stand-in upstream, beside calling it directly
//! cargo xtask fuzz [--time S] [--target NAME] [--seed N]
//!                                      the fuzz targets (fuzz/): their corpus, then
//!                                      mutations for S seconds in all (default 60)
//! ```
//!
//! Every task acts on the workspace the current directory is in (see [`workspace`]).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

mod install;
mod scaffold;
mod scaffold_python;
mod tidy;
mod workspace;

use install::{Install, Profile};
use workspace::{cargo, Metadata, XTASK_PACKAGE};

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
        Some("fuzz") => fuzz(rest).map_err(Failure::from),
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
  test [ARGS...]              build (debug), make target/py (a virtualenv with the openai,
                              anthropic and mcp clients) if missing, then run every test:
                              cargo test --workspace ARGS...
  new-plugin NAME [--dir DIR] scaffold a plugin crate in plugins/NAME (or standalone in DIR)
  new-plugin NAME --python [--dir DIR]
                              scaffold a Python process plugin (manifest, script, test) in
                              DIR (default ./NAME), docs/process-plugins.md
  gen-history [--turns N] [--seed S]
                              print a generated agent history (JSON array) to stdout
  bench [--json] [--input FILE] [--max-tokens K] [--runs R]
                              build in release, install into target/bench-plugins and
                              measure the chain against its floor
  bench --isolated [--calls N] the same build, then an isolated plugin's call against
                              in-process at 1,000 messages (docs/chain.md#isolation)
  bench --process [--calls N] the same build, then a pass-through Python process plugin's
                              call against the cdylib floor at 200 and 1,000 messages
                              (docs/process-plugins.md#cost)
  bench --big [--case NAME]   the same build, then huge inputs through history-host
                              process: time, exit status, peak RSS
  bench serve [--json] [--sessions N] [--clients C] [--turns T] [--store URL] [--hosts H]
              [--reloads N] [--session-memory-mb N] [--sticky] [--rate R]
              [--callgrind [--callgrind-sessions N] [--callgrind-dir DIR]]
                              the same build, then a real serve driven by concurrent
                              loopback clients: turns/s, p50/p99, peak RSS, CPU per
                              turn, beside a pass-through floor (docs/sessions.md#performance);
                              --rate R: an open loop at R turns/s, latency from each
                              turn's slot; --callgrind: instructions per turn; with
                              --reloads N, N hot reloads during the load instead
                              (docs/chain.md#hot-reload);
                              --store postgres://… also one SQLite host in the same run,
                              the ratio, and round trips per turn (docs/scaling-out.md)
  bench proxy [--json] [--requests N] [--clients C] [--wire chat|responses|anthropic|all]
                              the same build, then serve --upstream in front of a
                              stand-in upstream: added latency, requests/s, first byte,
                              token cache, beside direct calls (docs/proxy.md#performance);
                              --wire responses / anthropic / all: /v1/responses,
                              /v1/messages or both too, beside the chat wire
  fuzz [--time S] [--target NAME] [--seed N]
                              run the fuzz targets (fuzz/) on their corpus, then on
                              mutations of it for S seconds in all (default 60)
  help, -h, --help            print this
Installing removes the plugin libraries an earlier install put in the folder that this
build no longer produces (listed in its .xtask-installed); others (agentctl install) stay.
";

/// The benchmark's package and its pass-through fixture plugin (installed only into
/// `target/bench-plugins`, never with the shipped plugins).
const BENCH_PACKAGE: &str = "history-bench";
const FLOOR_PLUGIN: &str = "history_plugin_floor";
/// The fuzz targets and their driver.
const FUZZ_PACKAGE: &str = "history-fuzz";

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

fn build_task(args: &[String]) -> std::result::Result<(), Failure> {
    let mut release = false;
    for arg in args {
        match arg.as_str() {
            "--release" => release = true,
            other => return Err(Failure::Usage(format!("build: unexpected argument `{other}`"))),
        }
    }
    let root = workspace::current_root()?;
    build(&root, if release { Profile::Release } else { Profile::Dev })?;
    Ok(())
}

/// Builds the workspace's binaries and every plugin; installs the plugins into
/// `target/plugins`.
fn build(root: &Path, profile: Profile) -> Result<()> {
    let metadata = Metadata::load(root)?;
    Install {
        root,
        target_dir: &metadata.target_dir,
        profile,
        packages: &metadata.binaries(&[XTASK_PACKAGE, BENCH_PACKAGE]),
        plugins: &metadata.plugins(&[FLOOR_PLUGIN]),
        dir: &metadata.target_dir.join("plugins"),
    }
    .run()?;
    Ok(())
}

fn test(args: &[String]) -> Result<()> {
    let root = workspace::current_root()?;
    build(&root, Profile::Dev)?;
    let target_dir = Metadata::load(&root)?.target_dir;
    python_env(&target_dir)?;
    python_sdk(&root, &target_dir)?;
    run(cargo()
        .current_dir(&root)
        .args(["test", "--workspace"])
        .args(args))
}

/// The Python clients the tests drive (the real `openai`, `anthropic` and `mcp`
/// packages): a virtualenv in `target/py`, created and filled only when one is missing.
const PYTHON_CLIENTS: &[&str] = &["openai", "anthropic", "mcp"];

/// The tests' virtualenv in `target/py` with [`PYTHON_CLIENTS`] installed.
fn python_env(target_dir: &Path) -> Result<()> {
    let venv = target_dir.join("py");
    let python = venv.join("bin").join("python");
    let ready = Command::new(&python)
        .args(["-c", &format!("import {}", PYTHON_CLIENTS.join(", "))])
        .output()
        .is_ok_and(|o| o.status.success());
    if ready {
        return Ok(());
    }
    eprintln!(
        "xtask: making {} with the Python clients ({})",
        venv.display(),
        PYTHON_CLIENTS.join(", ")
    );
    if !python.exists() {
        run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    }
    run(Command::new(venv.join("bin").join("pip"))
        .args(["install", "--quiet"])
        .args(PYTHON_CLIENTS))
}

/// The Python SDK (`sdk/python`, docs/process-plugins.md#the-python-sdk): installed into
/// the tests' virtualenv as its users install it (`pip install ./sdk/python`, every run,
/// so the e2e tests' plugins use this tree's SDK), then its own tests, whose test helper
/// runs the host's output check through the built `history-host`.
fn python_sdk(root: &Path, target_dir: &Path) -> Result<()> {
    let bin = target_dir.join("py").join("bin");
    install_sdk(root, target_dir)?;
    run(Command::new(bin.join("python"))
        .args(["-m", "unittest", "discover", "-s"])
        .arg(root.join("sdk").join("python").join("tests"))
        .env("HISTORY_HOST", target_dir.join("debug").join("history-host")))
}

/// `pip install ./sdk/python` into the tests' virtualenv, when what is installed is not
/// this tree's SDK (pip's build needs the package index: only then).
fn install_sdk(root: &Path, target_dir: &Path) -> Result<()> {
    let bin = target_dir.join("py").join("bin");
    let same = "import filecmp, os, sys, history_plugin\n\
        here = os.path.dirname(history_plugin.__file__)\n\
        tree = sys.argv[1]\n\
        names = sorted(n for n in os.listdir(tree) if n.endswith('.py'))\n\
        ok = names == sorted(n for n in os.listdir(here) if n.endswith('.py'))\n\
        sys.exit(0 if ok and all(filecmp.cmp(os.path.join(tree, n), os.path.join(here, n), shallow=False) for n in names) else 1)\n";
    let installed = Command::new(bin.join("python"))
        .args(["-c", same])
        .arg(root.join("sdk").join("python").join("history_plugin"))
        .output()
        .is_ok_and(|o| o.status.success());
    if installed {
        return Ok(());
    }
    run(Command::new(bin.join("pip"))
        .args(["install", "--quiet", "--force-reinstall", "--no-deps"])
        .arg(root.join("sdk").join("python")))
}

/// The fuzz driver (`fuzz/src/main.rs`), built in the dev profile as the tests are, so it
/// shares the test build; a finding fails the task and is saved under
/// `target/fuzz-findings/`.
fn fuzz(args: &[String]) -> Result<()> {
    let root = workspace::current_root()?;
    let mut args = args.to_vec();
    if !args.iter().any(|a| a == "--time") {
        args.extend(["--time".to_string(), "60".to_string()]);
    }
    run(cargo()
        .current_dir(&root)
        .args(["run", "--quiet", "--package", FUZZ_PACKAGE, "--"])
        .args(&args))
}

fn new_plugin(args: &[String]) -> std::result::Result<(), Failure> {
    const USAGE: &str = "new-plugin: usage: cargo xtask new-plugin NAME [--python] [--dir DIR]";
    let mut name = None;
    let mut dir = None;
    let mut python = false;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--python" => python = true,
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
    if python {
        let dir = dir.unwrap_or_else(|| PathBuf::from(name));
        let created = scaffold_python::new_python_plugin(name, &dir)?;
        eprintln!(
            "created process plugin {name} in {}
next: pip install ./sdk/python; HISTORY_HOST=target/debug/history-host python3 -m unittest discover -s {}; agentctl install {}; agentctl history-chain-add {name}",
            created.display(),
            created.display(),
            created.join(format!("{name}.plugin.toml")).display()
        );
        return Ok(());
    }
    let root = workspace::current_root()?;
    let created = scaffold::new_plugin(&root, name, dir.as_deref())?;
    eprintln!("created plugin crate {}", created.display());
    if dir.is_some() {
        let manifest = created.join("Cargo.toml");
        // The README's out-of-tree flow, word for word in its steps.
        let library = created
            .join("target/debug")
            .join(plugin_api::naming::library_file_name(name));
        eprintln!(
            "next: cargo build --manifest-path {}, then agentctl install {} (it checks the \
             library loads and copies it into plugin_dir), then agentctl history-chain-add {name}",
            manifest.display(),
            library.display()
        );
    } else {
        eprintln!(
            "next: cargo xtask build (installs it into target/plugins), then agentctl \
             history-chain-add {name} (or add \"{name}\" to [history] chain)"
        );
    }
    Ok(())
}

/// The floor of `bench serve`: a configured chain must start with `default`, so the floor
/// fixture is built under that name (its `as-default` feature) and installed alone in
/// `<bench-plugins>/serve-floor/` as `default`. Building it overwrites the release floor
/// library, after it was installed; the next bench rebuilds it.
fn serve_floor(root: &Path, target_dir: &Path, bench_plugins: &Path) -> Result<PathBuf> {
    run(cargo().current_dir(root).args([
        "build",
        "--release",
        "--package",
        FLOOR_PLUGIN,
        "--features",
        "as-default",
    ]))?;
    let built = target_dir
        .join("release")
        .join(plugin_api::naming::library_file_name("floor"));
    let dir = bench_plugins.join("serve-floor");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let installed = dir.join(plugin_api::naming::library_file_name("default"));
    // A new file, not an overwrite in place: a library is never changed under a loader.
    let _ = std::fs::remove_file(&installed);
    std::fs::copy(&built, &installed).map_err(|e| {
        format!(
            "cannot install {} as {}: {e}",
            built.display(),
            installed.display()
        )
    })?;
    Ok(dir)
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

/// Builds the binaries, every plugin, the floor fixture and the bench in release; installs
/// the plugins and the fixture into `target/bench-plugins` (a folder of its own, so the
/// fixture never shows up among the shipped plugins); runs the measurements. The bench
/// writes its configuration there, choosing the full chain where it is installed.
fn bench(args: &[String]) -> Result<()> {
    let root = workspace::current_root()?;
    let metadata = Metadata::load(&root)?;
    let mut packages = metadata.binaries(&[XTASK_PACKAGE, BENCH_PACKAGE]);
    packages.push(BENCH_PACKAGE.to_string());
    // The floor fixture is among the plugins here, and only here.
    let plugins = metadata.plugins(&[]);
    if !plugins.iter().any(|p| p.package == FLOOR_PLUGIN) {
        return Err(format!("the workspace has no {FLOOR_PLUGIN} package"));
    }
    let dir = metadata.target_dir.join("bench-plugins");
    Install {
        root: &root,
        target_dir: &metadata.target_dir,
        profile: Profile::Release,
        packages: &packages,
        plugins: &plugins,
        dir: &dir,
    }
    .run()?;
    let plugin_dir = dir.display().to_string();
    let host = metadata
        .target_dir
        .join("release/history-host")
        .display()
        .to_string();
    // The service under load and the proxy (bench/src/serve.rs, bench/src/proxy.rs).
    if let Some("proxy") = args.first().map(String::as_str) {
        return history_bench(
            &root,
            &["proxy", "--host", &host, "--plugin-dir", &plugin_dir],
            &args[1..],
        );
    }
    if let Some("serve") = args.first().map(String::as_str) {
        let floor_dir = serve_floor(&root, &metadata.target_dir, &dir)?;
        return history_bench(
            &root,
            &[
                "serve",
                "--host",
                &host,
                "--plugin-dir",
                &plugin_dir,
                "--floor-dir",
                &floor_dir.display().to_string(),
            ],
            &args[1..],
        );
    }
    if let Some(at) = args.iter().position(|a| a == "--big") {
        // The huge inputs through the release host (bench/src/big.rs), instead of the
        // chain measurements.
        let mut rest = args.to_vec();
        rest.remove(at);
        return history_bench(
            &root,
            &["big", "--host", &host, "--plugin-dir", &plugin_dir],
            &rest,
        );
    }
    if let Some(at) = args.iter().position(|a| a == "--process") {
        // A pass-through Python process plugin against the cdylib floor
        // (bench/src/process_plugin.rs), on this tree's SDK.
        let mut rest = args.to_vec();
        rest.remove(at);
        python_env(&metadata.target_dir)?;
        install_sdk(&root, &metadata.target_dir)?;
        let python = metadata.target_dir.join("py/bin/python").display().to_string();
        return history_bench(
            &root,
            &["process", "--plugin-dir", &plugin_dir, "--python", &python],
            &rest,
        );
    }
    if let Some(at) = args.iter().position(|a| a == "--isolated") {
        // An isolated plugin's call against the same call in-process
        // (bench/src/isolated.rs), its worker the release host.
        let mut rest = args.to_vec();
        rest.remove(at);
        let host = metadata
            .target_dir
            .join("release/history-host")
            .display()
            .to_string();
        return history_bench(
            &root,
            &["isolated", "--host", &host, "--plugin-dir", &plugin_dir],
            &rest,
        );
    }
    history_bench(&root, &["run", "--plugin-dir", &plugin_dir], args)
}
