//! `history-bench process`: what a process plugin costs per call
//! (docs/process-plugins.md#cost). A pass-through Python plugin on the SDK (it answers
//! every message by index) beside the cdylib floor (`floor`, the bare in-process call),
//! each the second stage of the real `Chain::run` after `default`, on the generated
//! 1,000-message replay history cut to 200 and to 1,000 messages. The report gives the
//! median stage time each way and the difference: the protocol's added cost per call
//! (writing the messages as JSON, the pipe, Python parsing them and answering indices).

use std::path::{Path, PathBuf};

use history_bench::generate_messages;
use history_engine::{turns, Chain, Config};
use history_wire::chat::parse_history;
use plugin_api::{Message, RArc};
use serde_json::{json, Value};

use crate::isolated::{pass_through_chain, stage_times};
use crate::{check_flags, flag, round, us, Result};

/// The history sizes measured: the target's (≤ 2 ms a call at 200) and the replay's.
const SIZES: [usize; 2] = [200, 1_000];

const PASSTHROUGH: &str = "from history_plugin import Plugin, run\n\n\
class PassThrough(Plugin):\n    name = \"bench_passthrough\"\n    version = \"1.0.0\"\n\n\
    def process(self, messages, ctx):\n        return messages\n\n\
run(PassThrough())\n";

fn chain(plugin_dir: &Path, plugin: &str) -> Result<(Config, Chain)> {
    pass_through_chain(plugin_dir, plugin, "", "bench-process.toml")
}

/// [`stage_times`] in microseconds.
fn stage_us(
    config: &Config,
    chain: &Chain,
    history: &[RArc<Message>],
    turn: u64,
    calls: usize,
) -> Result<(f64, f64)> {
    let (median, best) = stage_times(config, chain, history, turn, calls)?;
    Ok((us(median), us(best)))
}

pub fn process(args: &[String]) -> Result<()> {
    check_flags(args, &["--plugin-dir", "--python", "--calls"], &["--json"])?;
    let plugin_dir: PathBuf = flag(args, "--plugin-dir")?.ok_or("--plugin-dir is required")?;
    let python: PathBuf = flag(args, "--python")?.ok_or("--python is required")?;
    let calls: usize = flag(args, "--calls")?.unwrap_or(200).max(1);
    let script = plugin_dir.join("bench_passthrough.py");
    std::fs::write(&script, PASSTHROUGH).map_err(|e| format!("cannot write {}: {e}", script.display()))?;
    let manifest = plugin_dir.join("bench_passthrough.plugin.toml");
    std::fs::write(
        &manifest,
        format!(
            "protocol = 1\ncommand = [{:?}, \"bench_passthrough.py\"]\n",
            python.display().to_string()
        ),
    )
    .map_err(|e| format!("cannot write {}: {e}", manifest.display()))?;
    let (config, floor) = chain(&plugin_dir, "floor")?;
    let (_, program) = chain(&plugin_dir, "bench_passthrough")?;
    let all = parse_history(&Value::Array(generate_messages(SIZES[1], 7)))
        .map_err(|e| format!("bad history: {e}"))?;
    let mut sizes = Vec::new();
    for size in SIZES {
        let mut history = all[..size.min(all.len())].to_vec();
        let turn = turns::current_turn(&history, None);
        turns::prepare(&mut history, turn);
        // Interleaved, so both see the same machine.
        let (floor_us, floor_best) = stage_us(&config, &floor, &history, turn, calls)?;
        let (program_us, program_best) = stage_us(&config, &program, &history, turn, calls)?;
        let (floor_us2, _) = stage_us(&config, &floor, &history, turn, calls)?;
        let floor_us = floor_us.min(floor_us2);
        sizes.push(json!({
            "messages": history.len(),
            "cdylib_floor_us": round(floor_us, 1),
            "cdylib_floor_best_us": round(floor_best, 1),
            "python_us": round(program_us, 1),
            "python_best_us": round(program_best, 1),
            "added_ms": round((program_us - floor_us) / 1000.0, 3),
        }));
    }
    let report = json!({"calls": calls, "python": python.display().to_string(), "sizes": sizes,
        "program_starts": program.stages()[1].program_starts()});
    let _ = std::fs::remove_file(&script);
    let _ = std::fs::remove_file(&manifest);
    if args.iter().any(|a| a == "--json") {
        println!("{report}");
        return Ok(());
    }
    println!("process plugin (pass-through Python, SDK) against the cdylib floor, median of {calls} calls (stage time)");
    for size in &sizes {
        println!(
            "  {:>5} messages: cdylib floor {:>9} us   python {:>9} us   added {:>7} ms a call",
            size["messages"], size["cdylib_floor_us"], size["python_us"], size["added_ms"]
        );
    }
    Ok(())
}
