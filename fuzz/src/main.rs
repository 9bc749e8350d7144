//! The fuzz driver: `history-fuzz [--time S] [--target NAME] [--seed N] [--corpus DIR]`.
//!
//! For each target (all of them unless `--target`), runs every input of its corpus folder,
//! then mutates them (bit flips, interesting bytes, the target's dictionary, deletions,
//! duplications, splices of two inputs) for its share of `--time` seconds, checking each
//! mutant. A panic stops the run: the input is written to
//! `target/fuzz-findings/<target>/<hash>` and the exit status is 1. No instrumentation,
//! no nightly toolchain: a bounded pass that CI can afford, seeded for repeatability.

use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use history_fuzz::{Target, TARGETS};

/// Inputs never grow past this (the parsers' big inputs are tests and bench entries).
const MAX_INPUT: usize = 64 * 1024;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const INTERESTING: &[u8] = b"\"{}[],:\\0-e.\n\r\t #='\x00\xff\xc3\xa9\xe2\x80";

fn mutate(input: &mut Vec<u8>, corpus: &[Vec<u8>], target: &Target, rng: &mut Rng) {
    for _ in 0..1 + rng.below(4) {
        let len = input.len();
        match rng.below(8) {
            0 if len > 0 => {
                let at = rng.below(len);
                input[at] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let at = rng.below(len);
                input[at] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => {
                let at = rng.below(len + 1);
                input.insert(at, INTERESTING[rng.below(INTERESTING.len())]);
            }
            3 if !target.dictionary.is_empty() => {
                let word = target.dictionary[rng.below(target.dictionary.len())].as_bytes();
                let at = rng.below(len + 1);
                input.splice(at..at, word.iter().copied());
            }
            4 if len > 0 => {
                let at = rng.below(len);
                let end = (at + 1 + rng.below(16)).min(len);
                input.drain(at..end);
            }
            5 if len > 0 => {
                let at = rng.below(len);
                let end = (at + 1 + rng.below(32)).min(len);
                let copy: Vec<u8> = input[at..end].to_vec();
                let to = rng.below(len + 1);
                input.splice(to..to, copy);
            }
            6 if !corpus.is_empty() => {
                let other = &corpus[rng.below(corpus.len())];
                let (at, from) = (rng.below(len + 1), rng.below(other.len() + 1));
                input.truncate(at);
                input.extend_from_slice(&other[from..]);
            }
            _ => {
                // Random bytes: what a structured target reads as choices.
                let at = rng.below(len + 1);
                let byte = rng.next() as u8;
                input.insert(at, byte);
            }
        }
    }
    input.truncate(MAX_INPUT);
}

/// Reads a target's corpus folder (missing: empty).
pub fn corpus(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut inputs: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let bytes = std::fs::read(&path).ok()?;
            Some((path, bytes))
        })
        .collect();
    inputs.sort();
    inputs
}

/// Runs one input; a panic is returned as its message.
fn check(target: &Target, input: &[u8]) -> Result<(), String> {
    catch_unwind(AssertUnwindSafe(|| (target.run)(input))).map_err(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".to_string())
    })
}

fn finding(findings: &Path, target: &Target, input: &[u8], why: &str) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    input.hash(&mut hasher);
    let dir = findings.join(target.name);
    let file = dir.join(format!("{:016x}", hasher.finish()));
    let saved = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&file, input));
    let place = match saved {
        Ok(()) => file.display().to_string(),
        Err(e) => format!("(not saved: {e})"),
    };
    format!("{}: a panic: {why}\ninput: {place}", target.name)
}

fn run(args: &[String]) -> Result<(), String> {
    let mut seconds = 10.0f64;
    let mut only: Option<String> = None;
    let mut seed = 0x5eed_u64;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut corpus_root = root.join("corpus");
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().cloned().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--time" => seconds = value()?.parse().map_err(|e| format!("--time: {e}"))?,
            "--target" => only = Some(value()?),
            "--seed" => seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--corpus" => corpus_root = PathBuf::from(value()?),
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    let targets: Vec<&Target> = TARGETS
        .iter()
        .filter(|t| only.is_none() || only.as_deref() == Some(t.name))
        .collect();
    if targets.is_empty() {
        let names: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
        return Err(format!(
            "no target named {only:?} (targets: {})",
            names.join(", ")
        ));
    }
    let findings = root.join("../target/fuzz-findings");
    // Panics are caught and reported once, with their input.
    std::panic::set_hook(Box::new(|_| {}));
    let share = Duration::from_secs_f64(seconds / targets.len() as f64);
    let mut rng = Rng(seed | 1);
    for target in targets {
        let inputs: Vec<Vec<u8>> = corpus(&corpus_root.join(target.name))
            .into_iter()
            .map(|(_, b)| b)
            .collect();
        for input in &inputs {
            check(target, input).map_err(|why| finding(&findings, target, input, &why))?;
        }
        let started = Instant::now();
        let mut runs = 0u64;
        while started.elapsed() < share {
            let mut input = if inputs.is_empty() {
                Vec::new()
            } else {
                inputs[rng.below(inputs.len())].clone()
            };
            mutate(&mut input, &inputs, target, &mut rng);
            check(target, &input).map_err(|why| finding(&findings, target, &input, &why))?;
            runs += 1;
        }
        eprintln!(
            "fuzz {:<14} {} corpus inputs, {runs} mutants in {:.1} s: no panic",
            target.name,
            inputs.len(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("history-fuzz: {message}");
            ExitCode::FAILURE
        }
    }
}
