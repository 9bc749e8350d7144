//! `history-bench big`: inputs far past what a conversation holds, through the real
//! `history-host process` binary, each in a child whose peak memory is read from its
//! rusage: a 100 MB message, a 300 MB document, 1,000,000 tiny messages and 10,000
//! levels of nesting. Each must end with a result (exit 0) or a clear error (exit 2),
//! never a panic or a stack overflow; the report gives the wall time, the exit status,
//! the peak RSS and its multiple of the input size (docs/limits.md states the bound).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::json;

use crate::{flag, Result};

const CHAIN: &str = r#"["default", "tool_result_filter", "retention", "token_budget", "role_pair"]"#;

/// One case: its name and a writer of its input.
struct Case {
    name: &'static str,
    write: fn(&mut dyn Write) -> std::io::Result<()>,
}

fn message_100mb(out: &mut dyn Write) -> std::io::Result<()> {
    out.write_all(br#"[{"role":"user","content":""#)?;
    let chunk = "lorem ipsum dolor sit amet, ".repeat(1 << 12);
    let mut written = 0;
    while written < 100_000_000 {
        out.write_all(chunk.as_bytes())?;
        written += chunk.len();
    }
    out.write_all(br#""}]"#)
}

fn document_300mb(out: &mut dyn Write) -> std::io::Result<()> {
    out.write_all(br#"{"model":"default","turn":2,"messages":["#)?;
    let content = "fn main() { println!(\\\"hello\\\"); } // words and code ".repeat(200);
    let mut written = 0;
    let mut first = true;
    while written < 300_000_000 {
        if !first {
            out.write_all(b",")?;
        }
        first = false;
        let role = if written % 2 == 0 { "user" } else { "assistant" };
        let message = format!(r#"{{"role":"{role}","content":"{content}"}}"#);
        out.write_all(message.as_bytes())?;
        written += message.len();
    }
    out.write_all(b"]}")
}

fn tiny_1m(out: &mut dyn Write) -> std::io::Result<()> {
    out.write_all(b"[")?;
    for i in 0..1_000_000 {
        let comma = if i == 0 { "" } else { "," };
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        write!(out, r#"{comma}{{"role":"{role}","content":"hi"}}"#)?;
    }
    out.write_all(b"]")
}

fn nesting_10k(out: &mut dyn Write) -> std::io::Result<()> {
    out.write_all(br#"[{"role":"user","content":"x","metadata":{"note":"#)?;
    out.write_all("[".repeat(10_000).as_bytes())?;
    out.write_all("]".repeat(10_000).as_bytes())?;
    out.write_all(b"}}]")
}

const CASES: &[Case] = &[
    Case {
        name: "message_100mb",
        write: message_100mb,
    },
    Case {
        name: "document_300mb",
        write: document_300mb,
    },
    Case {
        name: "tiny_1m",
        write: tiny_1m,
    },
    Case {
        name: "nesting_10k",
        write: nesting_10k,
    },
];

/// Runs `command` to its end: (exit code, peak RSS in bytes), from the child's rusage.
fn run_measured(command: &mut Command) -> Result<(i32, u64)> {
    let child = command
        .spawn()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, whose pid std gave us and has not reaped.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    if waited != pid {
        return Err(format!("wait4: {}", std::io::Error::last_os_error()));
    }
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    Ok((code, usage.ru_maxrss as u64 * 1024))
}

pub fn big(args: &[String]) -> Result<()> {
    let host: PathBuf = flag(args, "--host")?.ok_or("--host is required")?;
    let plugin_dir: PathBuf = flag(args, "--plugin-dir")?.ok_or("--plugin-dir is required")?;
    let only: Option<String> = flag(args, "--case")?;
    let config = plugin_dir.join("big-plugins-enabled.toml");
    std::fs::write(
        &config,
        format!("plugin_dir = \".\"\n[history]\nchain = {CHAIN}\n[models.default]\ncontext_tokens = 128000\ntokenizer = \"o200k_base\"\n"),
    )
    .map_err(|e| format!("{}: {e}", config.display()))?;
    let mut results = Vec::new();
    for case in CASES
        .iter()
        .filter(|c| only.is_none() || only.as_deref() == Some(c.name))
    {
        let input = plugin_dir.join(format!("big-{}.json", case.name));
        write_input(&input, case.write)?;
        let size = std::fs::metadata(&input).map_err(|e| e.to_string())?.len();
        let started = Instant::now();
        let (code, peak) = run_measured(
            Command::new(&host)
                .args(["process", "--config"])
                .arg(&config)
                .arg("--input")
                .arg(&input)
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
        )?;
        let wall = started.elapsed().as_secs_f64();
        let _ = std::fs::remove_file(&input);
        let multiple = peak as f64 / size as f64;
        eprintln!(
            "big {:<15} input {:>7.1} MB  exit {code}  {wall:>6.2} s  peak RSS {:>7.1} MB ({multiple:.2}x the input)",
            case.name,
            size as f64 / 1e6,
            peak as f64 / 1e6
        );
        if code != 0 && code != 2 {
            return Err(format!("{}: history-host ended with status {code}", case.name));
        }
        results.push(json!({
            "case": case.name, "input_mb": size as f64 / 1e6, "exit": code,
            "wall_s": wall, "peak_rss_mb": peak as f64 / 1e6, "peak_over_input": multiple,
        }));
    }
    println!("{}", json!({ "big": results }));
    Ok(())
}

fn write_input(path: &Path, write: fn(&mut dyn Write) -> std::io::Result<()>) -> Result<()> {
    let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    write(&mut out)
        .and_then(|()| out.flush())
        .map_err(|e| format!("{}: {e}", path.display()))
}
