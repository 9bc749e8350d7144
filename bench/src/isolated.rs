//! `history-bench isolated`: what running a plugin in a worker process costs per call
//! (docs/chain.md#isolation). The same plugin on the same 1,000-message history, called
//! in-process and isolated (`[history] isolate`, its worker the release `history-host
//! worker`), through the real `Chain::run`; the report gives the median time of that
//! stage's call each way and the difference — the isolation's overhead per call — beside
//! what encoding the history costs: the worker's binary form against the wire JSON.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use history_bench::{generate_messages, median, quantile};
use history_engine::chain::stateless_context;
use history_engine::{load_chain, turns, Call, Chain, Config};
use history_wire::chat::{history_from_str, history_to_string, parse_history};
use plugin_api::{Message, RArc};
use serde_json::{json, Value};

use crate::{check_flags, flag, ms, round, us, Result};

/// Messages the measured plugin is handed.
const MESSAGES: usize = 1_000;
/// The plugins measured: the pass-through floor (the bare cost of crossing) and a
/// shipped plugin that changes copies of messages (what crosses back grows).
const PLUGINS: [&str; 2] = ["floor", "tool_result_filter"];

/// A chain of `default` (with a window past the history, so it passes everything on) and
/// `plugin`, with `history_extra` added to its `[history]` (e.g. `isolate = [...]`),
/// written to `plugin_dir/file_name`: what the per-call benches (`isolated`, `process`)
/// measure the second stage of.
pub(crate) fn pass_through_chain(
    plugin_dir: &Path,
    plugin: &str,
    history_extra: &str,
    file_name: &str,
) -> Result<(Config, Chain)> {
    let text = format!(
        "# Written by `cargo xtask bench`.\nplugin_dir = \".\"\n[history]\n\
         agent_max_ctx = 100000\nchain = [\"default\", {plugin:?}]\non_plugin_error = \"fail\"\n{history_extra}\n\
         [models.default]\nmax_context = 100000\ncontext_tokens = 10000000\ntokenizer = \"o200k_base\"\n"
    );
    let file = plugin_dir.join(file_name);
    std::fs::write(&file, text).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    let (config, _, chain) = load_chain(&file).map_err(|e| e.to_string())?;
    Ok((config, chain))
}

fn chain(plugin_dir: &Path, plugin: &str, isolated: bool) -> Result<(Config, Chain)> {
    let isolate = if isolated {
        format!("isolate = [{plugin:?}]")
    } else {
        String::new()
    };
    pass_through_chain(plugin_dir, plugin, &isolate, "bench-isolated.toml")
}

/// The median and fastest time of the measured plugin's stage (the second) over `calls`
/// calls, after one unmeasured call (a worker's or a program's start, the host's counts
/// warm). Every message must pass through both stages.
pub(crate) fn stage_times(
    config: &Config,
    chain: &Chain,
    history: &[RArc<Message>],
    turn: u64,
    calls: usize,
) -> Result<(Duration, Duration)> {
    let ctx = stateless_context(config, config.model("default"), turn);
    let mut samples = Vec::with_capacity(calls);
    for call in 0..=calls {
        let run = chain
            .run(history.to_vec(), &ctx, Call::Process)
            .map_err(|e| e.to_string())?;
        if let Some(stage) = run
            .stages
            .iter()
            .find(|stage| stage.messages_out != history.len() || stage.skipped.is_some())
        {
            return Err(format!("a stage did not pass everything on: {stage:?}"));
        }
        if call > 0 {
            samples.push(run.stages[1].elapsed);
        }
    }
    Ok((median(&samples), quantile(&samples, 0.0)))
}

/// The median of `f` over `runs` runs.
fn timed(runs: usize, mut f: impl FnMut()) -> Duration {
    let samples: Vec<Duration> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed()
        })
        .collect();
    median(&samples)
}

pub fn isolated(args: &[String]) -> Result<()> {
    check_flags(args, &["--host", "--plugin-dir", "--calls"], &["--json"])?;
    let host: PathBuf = flag(args, "--host")?.ok_or("--host is required")?;
    let plugin_dir: PathBuf = flag(args, "--plugin-dir")?.ok_or("--plugin-dir is required")?;
    let calls: usize = flag(args, "--calls")?.unwrap_or(200).max(1);
    history_engine::isolate::set_worker_command(&host, ["worker"]);
    let mut history = parse_history(&Value::Array(generate_messages(MESSAGES, 7)))
        .map_err(|e| format!("bad history: {e}"))?;
    history.truncate(MESSAGES);
    let turn = turns::current_turn(&history, None);
    turns::prepare(&mut history, turn);

    let mut plugins = serde_json::Map::new();
    for plugin in PLUGINS {
        let (config, in_process) = chain(&plugin_dir, plugin, false)?;
        let (_, isolated) = chain(&plugin_dir, plugin, true)?;
        let (direct, direct_best) = stage_times(&config, &in_process, &history, turn, calls)?;
        let (worker, worker_best) = stage_times(&config, &isolated, &history, turn, calls)?;
        plugins.insert(
            plugin.to_string(),
            json!({
                "in_process_us": round(us(direct), 1),
                "isolated_us": round(us(worker), 1),
                "overhead_us": round(us(worker.saturating_sub(direct)), 1),
                "in_process_best_us": round(us(direct_best), 1),
                "isolated_best_us": round(us(worker_best), 1),
                "worker_starts": isolated.stages()[1].worker_starts(),
            }),
        );
    }
    // One way of what a call carries: the history, encoded and decoded.
    let (binary_bytes, _) = history_engine::isolate::codec_round_trip(&history);
    let binary = timed(51, || drop(history_engine::isolate::codec_round_trip(&history)));
    let json_text = history_to_string(&history);
    let json = timed(51, || drop(history_from_str(&history_to_string(&history))));
    let report = json!({
        "messages": MESSAGES,
        "calls": calls,
        "plugins": plugins,
        "codec": {
            "binary_bytes": binary_bytes,
            "binary_round_trip_ms": round(ms(binary), 3),
            "json_bytes": json_text.len(),
            "json_round_trip_ms": round(ms(json), 3),
        },
    });
    if args.iter().any(|a| a == "--json") {
        println!("{report}");
        return Ok(());
    }
    println!("isolated plugin call, {MESSAGES} messages, median of {calls} calls (stage time)");
    for (name, r) in report["plugins"].as_object().into_iter().flatten() {
        println!(
            "  {name:<20} in-process {:>9} us   isolated {:>9} us   overhead {:>9} us",
            r["in_process_us"], r["isolated_us"], r["overhead_us"]
        );
    }
    let codec = &report["codec"];
    println!(
        "  history encode+decode: binary {} ms ({} bytes), wire JSON {} ms ({} bytes)",
        codec["binary_round_trip_ms"],
        codec["binary_bytes"],
        codec["json_round_trip_ms"],
        codec["json_bytes"]
    );
    Ok(())
}
