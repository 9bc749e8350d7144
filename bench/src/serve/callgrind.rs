//! `bench serve --callgrind`: the host's instructions per turn, counted by valgrind's
//! callgrind (docs/sessions.md#instructions-per-turn). Instruction counts do not depend
//! on what else the machine runs, so they compare before and after on a shared machine
//! where CPU time and turns per second drift.
//!
//! A short run of the case (its turns, on `--callgrind-sessions` sessions, default 8)
//! against a `serve` run under `valgrind --tool=callgrind`, and the same run with no turns
//! (the start, the sessions created, the scrapes of `/metrics`, the stop): the difference
//! over the turns is what a turn costs the host, its HTTP, JSON, chain, store and answer.
//! A plugin call's deadline is raised to a minute there (valgrind runs the host tens of
//! times slower); nothing else in the configuration changes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use super::{drive, served_config, Case, Settings};
use crate::loopback::{Chain, Serve};
use crate::{flag, Result};

/// What `--callgrind` asked for.
pub(super) struct Options {
    sessions: usize,
    /// `--callgrind-dir DIR`: keep the callgrind files there (for `callgrind_annotate`).
    dir: Option<PathBuf>,
}

impl Options {
    /// `None` without `--callgrind`.
    pub(super) fn from_args(args: &[String]) -> Result<Option<Options>> {
        let sessions: Option<usize> = flag(args, "--callgrind-sessions")?;
        let dir: Option<PathBuf> = flag(args, "--callgrind-dir")?;
        if !args.iter().any(|a| a == "--callgrind") {
            if sessions.is_some() || dir.is_some() {
                return Err("--callgrind-sessions and --callgrind-dir go with --callgrind".into());
            }
            return Ok(None);
        }
        let sessions = sessions.unwrap_or(8);
        if sessions == 0 {
            return Err("--callgrind-sessions must be at least 1".into());
        }
        Ok(Some(Options { sessions, dir }))
    }
}

/// The host's instructions per turn on a short run of `case` with `chain`:
/// `{per_turn, turns, sessions, total, baseline}`.
pub(super) fn instructions(
    settings: &Settings,
    case: &Case,
    chain: Chain,
    options: &Options,
) -> Result<Value> {
    if settings.postgres.is_some() {
        return Err("--callgrind counts a host on its own SQLite file: leave out --store".into());
    }
    let sessions = options.sessions.min(case.sessions);
    let work = settings
        .plugin_dir
        .join(format!("callgrind-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let out_dir = options.dir.clone().unwrap_or_else(|| work.clone());
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    let (config, _) = served_config(settings, chain, "callgrind", "plugin_timeout_ms = 60000")?;
    let mut counted = Vec::new();
    for turns in [0, case.turns] {
        let short = Case {
            name: format!("{}_{}_{turns}", case.name, chain.name()),
            sessions,
            clients: sessions,
            turns,
            sticky: false,
            rate: None,
            answer: case.answer,
        };
        let out = out_dir.join(format!("callgrind.{}.out", short.name));
        eprintln!(
            "serve bench: callgrind, {} on {sessions} sessions × {turns} turns…",
            chain.name()
        );
        let store = work.join(format!("{}.db", short.name));
        let log = work.join(format!("{}.log", short.name));
        let out_file = format!("--callgrind-out-file={}", out.display());
        let server = Serve::start_under(
            &["valgrind", "--tool=callgrind", &out_file],
            &settings.host,
            &config,
            &["--store", &store.display().to_string()],
            &log,
        )?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let addrs = [server.addr.clone()];
        let load = runtime.block_on(drive(&addrs, &short, Duration::from_secs(3600), None));
        server.stop()?;
        let load = load?;
        if load.errors > 0 {
            return Err(format!(
                "callgrind run: {} failed turns, first: {}",
                load.errors,
                load.first_error.unwrap_or_default()
            ));
        }
        counted.push((load.latencies.len(), total_instructions(&out)?));
    }
    let _ = std::fs::remove_dir_all(&work);
    let (_, baseline) = counted[0];
    let (turns, total) = counted[1];
    let per_turn = (turns > 0).then(|| total.saturating_sub(baseline) / turns as u64);
    Ok(json!({
        "per_turn": per_turn,
        "turns": turns,
        "sessions": sessions,
        "total": total,
        "baseline": baseline,
    }))
}

/// The instructions a callgrind output file counted (its `totals:` or `summary:` line,
/// the first event being `Ir`).
fn total_instructions(file: &Path) -> Result<u64> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    parse_totals(&text).ok_or_else(|| format!("{}: no totals: or summary: line", file.display()))
}

fn parse_totals(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| {
            line.strip_prefix("totals:")
                .or_else(|| line.strip_prefix("summary:"))
        })
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_totals_line_gives_the_instructions() {
        assert_eq!(
            parse_totals("events: Ir\nfn=main\n1 5\ntotals: 123456\n"),
            Some(123456)
        );
        assert_eq!(parse_totals("events: Ir\nsummary: 42 7\n"), Some(42));
        assert_eq!(parse_totals("events: Ir\n"), None);
    }
}
