//! `history-bench`: the measurements of `cargo xtask bench` (docs/chain.md#performance), and the history
//! generator on the command line. Run it through `cargo xtask bench` / `cargo xtask
//! gen-history`, which build everything in release and install the plugins first.
//!
//! ```text
//! history-bench gen-history [--turns N] [--seed S]
//! history-bench run --plugin-dir DIR [--json] [--input FILE] [--max-tokens K] [--runs R]
//! ```
//!
//! What `run` measures, with the real plugin libraries in DIR loaded by the real host
//! library (`load_chain`) and run by `Chain::run`:
//!
//! - **replay**: a 1,000-turn generated history (or `--input`) fed turn by turn the way a
//!   session does it: each turn's new messages get `metadata.turn_added`, are appended to
//!   the previous turn's output, and the chain runs on that. Every run starts from freshly
//!   parsed messages, so each run tokenizes each message once, as a session would.
//! - **single**: one call on a 10,000-message history; the cold first call (nothing counted
//!   yet) and the median of warm calls (the same messages again: counts remembered).
//!   Then each strategy of [`STRATEGIES`] that is installed alone on that history, with the
//!   same window, and its warm ratio to `default`'s (in the chain `default` runs first, so
//!   a later stage never sees the 10,000 messages).
//! - **floor**: the same histories through a chain of as many `floor` stages (a fixture
//!   that returns its input shared, doing nothing) run by the same `Chain::run` (the chain
//!   refuses a name twice, so the floor chain is built with `Chain::repeated`). So the
//!   floor holds what the host itself does per run and per stage (turns, identities, the
//!   structural check, remembered token counts, the ABI calls), and a ratio to it is what
//!   the plugins, and counting new messages, add on top. The replay's floor gets each
//!   turn's input exactly as the chain got it.
//! - **fanout**: one assistant message with 20,000 tool calls answered in reverse order
//!   ([`history_bench::fan_out`]), the chain and the floor on it, cold and warm, per
//!   plugin: every lookup of the call a result answers happens once per result here, so
//!   a lookup that scans the calls shows as seconds instead of milliseconds.
//! - **tokens**: `o200k_base` (and `cl100k_base`) throughput of the host's counter on the replay's text, on its
//!   worst cases (a megabyte of one letter, and of random A/C/G/T: each a single piece for
//!   the byte-pair merge), and the bytes tokenized during a replay over the bytes that
//!   entered it (1.0 = nothing tokenized twice).
//! - **dedupe's hashing**: the replay's history through `dedupe` alone, each turn's whole
//!   working history handed back with the next turn's messages; the bytes `dedupe` hashed
//!   (its own count, from its log lines: [`history_bench::hashing`]) over the tool results'
//!   bytes that entered. 1.0 = each result hashed once.
//! - **media**: counting a message that carries a 1 MB base64 PNG (a header read, never
//!   the tokenizer, docs/wire-format.md#part-kinds), in µs; and the replay's text-only
//!   history counted by the host's counter over the counting before part kinds, in the
//!   same run (1.0 = no slower).
//! - **peak RSS** of the process after the replays (VmHWM).

mod big;
mod cpu;
mod isolated;
mod loopback;
mod process_plugin;
mod proxy;
mod proxy_anthropic;
mod proxy_responses;
mod serve;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use history_bench::{fan_out, generate, generate_messages, median, quantile, split_turns, to_json_text};
use history_engine::chain::stateless_context;
use history_engine::{load_chain, tokens, turns, Call, Catalog, Chain, Config};
use history_wire::chat::parse_history;
use plugin_api::{Message, ModelInfo, RArc, Tokenizer};
use serde_json::{json, Value};

/// The full chain of docs/configuration.md, in order; the bench measures the part of it installed.
const FULL_CHAIN: [&str; 5] = [
    "default",
    "tool_result_filter",
    "retention",
    "token_budget",
    "role_pair",
];
/// Strategies measured one at a time on the single-call history, each alone in a chain of
/// one stage with the same window, against `default` (the first): the shipped chain runs
/// `default` first, so a later stage never sees 10,000 messages there.
const STRATEGIES: [&str; 4] = ["default", "relevance", "dedupe", "summarize"];
/// Turns of the generated replay history.
const REPLAY_TURNS: usize = 1_000;
/// Messages of the single-call history.
const SINGLE_MESSAGES: usize = 10_000;
/// Warm calls of the single-call measurement, chain and floor alternating in blocks: a
/// burst of someone else's work hits both, and a block's calls find the CPU caches holding
/// its own history (alternating call by call, each 10,000-message history evicted the
/// other and doubled the floor: 1.3 -> 3.6 ms).
const WARM_CALLS: usize = 50;
const WARM_BLOCK: usize = 5;
/// Tool calls of the fan-out history, and its warm calls (each takes tens of milliseconds).
const FANOUT_CALLS: usize = 20_000;
const FANOUT_WARM_CALLS: usize = 10;
/// Bytes of each worst case of the token counter.
const WORST_CASE_BYTES: usize = 1_000_000;
/// The window of the bench configuration: the shipped defaults (`plugins-enabled.toml`).
const AGENT_MAX_CTX: u64 = 200;
const CONTEXT_TOKENS: u64 = 128_000;

type Result<T> = std::result::Result<T, String>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("gen-history") => gen_history(&args[1..]),
        Some("run") => run(&args[1..]),
        Some("big") => big::big(&args[1..]),
        Some("isolated") => isolated::isolated(&args[1..]),
        Some("process") => process_plugin::process(&args[1..]),
        Some("serve") => serve::serve(&args[1..]),
        Some("proxy") => proxy::proxy(&args[1..]),
        _ => Err(USAGE.trim().to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("history-bench: {message}");
            ExitCode::FAILURE
        }
    }
}

const USAGE: &str = "
usage: history-bench <command>
  gen-history [--turns N] [--seed S]    print a generated agent history (JSON array)
  run --plugin-dir DIR [--json] [--input FILE] [--max-tokens K] [--runs R] [--seed S]
      [--plugin-timeout-ms MS]          measure the chain installed in DIR (MS: the
                                        per-call deadline, default the host's; 0 = none)
  big --host FILE --plugin-dir DIR [--case NAME]
                                        huge inputs through history-host process:
                                        time, exit status, peak RSS
  isolated --host FILE --plugin-dir DIR [--calls N] [--json]
  process --plugin-dir DIR --python FILE [--calls N] [--json]
                                        a plugin's call in a worker process against
                                        in-process, at 1,000 messages
  serve --host FILE --plugin-dir DIR --floor-dir DIR [--json] [--sessions N] [--clients C] [--turns T]
      [--store postgres://…] [--hosts H] [--time-cap S] [--reloads N] [--rate R]
      [--callgrind [--callgrind-sessions N] [--callgrind-dir DIR]]
                                        a real serve under concurrent loopback clients:
                                        turns/s, p50/p99, peak RSS, CPU per turn, beside a
                                        floor; --rate R: the open loop, R turns/s on a
                                        schedule, latency from each turn's slot;
                                        --callgrind: the host's instructions per turn;
                                        --reloads N: the chain alone, N hot reloads during
                                        the load, turns inside them against the rest
  proxy --host FILE --plugin-dir DIR [--json] [--requests N] [--clients C] [--time-cap S]
        [--wire chat|responses|anthropic|all]
                                        serve --upstream against a stand-in upstream:
                                        added latency, requests/s, first byte, token cache;
                                        other wires beside the chat wire
";

/// The value after flag `name`, parsed.
fn flag<T: std::str::FromStr>(args: &[String], name: &str) -> Result<Option<T>> {
    match args.iter().position(|a| a == name) {
        None => Ok(None),
        Some(i) => {
            let value = args.get(i + 1).ok_or(format!("{name} needs a value"))?;
            value
                .parse()
                .map(Some)
                .map_err(|_| format!("{name}: not a valid value: {value:?}"))
        }
    }
}

fn check_flags(args: &[String], with_value: &[&str], switches: &[&str]) -> Result<()> {
    let mut i = 0;
    while i < args.len() {
        if with_value.contains(&args[i].as_str()) {
            i += 2;
        } else if switches.contains(&args[i].as_str()) {
            i += 1;
        } else {
            return Err(format!("unknown argument {:?}\n{}", args[i], USAGE.trim()));
        }
    }
    Ok(())
}

fn gen_history(args: &[String]) -> Result<()> {
    check_flags(args, &["--turns", "--seed"], &[])?;
    let turns = flag(args, "--turns")?.unwrap_or(REPLAY_TURNS);
    let seed = flag(args, "--seed")?.unwrap_or(1);
    print!("{}", to_json_text(&generate(turns, seed)));
    Ok(())
}

/// The chain under test, its floor and the call settings.
struct Bench {
    config: Config,
    chain: Chain,
    floor: Chain,
    /// Each installed strategy of [`STRATEGIES`] alone in a chain of one stage.
    strategies: Vec<(&'static str, Chain)>,
    model: ModelInfo,
    missing: Vec<&'static str>,
    max_tokens: Option<u64>,
    max_tokens_applied: bool,
}

/// Writes the bench configuration into `plugin_dir` (the full chain where installed, else
/// the plugins that are) and loads it through the host library.
fn load_bench(plugin_dir: &Path, max_tokens: Option<u64>, plugin_timeout_ms: Option<u64>) -> Result<Bench> {
    let catalog = Catalog::discover(plugin_dir).map_err(|e| e.to_string())?;
    if !catalog.has("floor") {
        return Err(format!(
            "{} has no floor plugin: run the bench with `cargo xtask bench`",
            plugin_dir.display()
        ));
    }
    let (present, missing): (Vec<&str>, Vec<&str>) = FULL_CHAIN.iter().partition(|name| catalog.has(name));
    let max_tokens_applied = max_tokens.is_some() && present.contains(&"token_budget");
    let chain_list = present
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut text = format!(
        "# Written by `cargo xtask bench`: the chain measured and its window.\n\
         plugin_dir = \".\"\n\n\
         [history]\n\
         agent_max_ctx = {AGENT_MAX_CTX}\n\
         chain = [{chain_list}]\n\
         # A failing plugin must show, not be skipped into a flattering figure.\n\
         on_plugin_error = \"fail\"\n\
         {}\n\
         [models.default]\n\
         max_context = {AGENT_MAX_CTX}\n\
         context_tokens = {CONTEXT_TOKENS}\n\
         tokenizer = \"o200k_base\"\n",
        plugin_timeout_ms
            .map(|ms| format!("plugin_timeout_ms = {ms}"))
            .unwrap_or_default()
    );
    if let (true, Some(k)) = (max_tokens_applied, max_tokens) {
        text.push_str(&format!("\n[plugin.token_budget]\nmax_tokens = {k}\n"));
    }
    let file = plugin_dir.join("bench-plugins-enabled.toml");
    std::fs::write(&file, text).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    let (config, catalog, chain) = load_chain(&file).map_err(|e| e.to_string())?;
    let floor =
        Chain::repeated(&config, &catalog, "floor", chain.stages().len()).map_err(|e| e.to_string())?;
    let model = config.model("default");
    let mut strategies = Vec::new();
    for name in STRATEGIES.iter().filter(|name| catalog.has(name)) {
        strategies.push((
            *name,
            Chain::repeated(&config, &catalog, name, 1).map_err(|e| e.to_string())?,
        ));
    }
    Ok(Bench {
        config,
        chain,
        floor,
        strategies,
        model,
        missing,
        max_tokens,
        max_tokens_applied,
    })
}

/// Parses a history, failing with the message's index.
fn parse(values: &[Value]) -> Result<Vec<RArc<Message>>> {
    parse_history(&Value::Array(values.to_vec())).map_err(|e| format!("bad history: {e}"))
}

/// One replay: per-turn times, bytes tokenized / bytes entered, and each turn's input.
struct Replay {
    per_turn: Vec<Duration>,
    bytes_entered: u64,
    bytes_tokenized: u64,
    inputs: Vec<Vec<RArc<Message>>>,
}

impl Replay {
    fn total(&self) -> Duration {
        self.per_turn.iter().sum()
    }
}

/// Feeds `history` turn by turn through the chain, as a session does; keeps each turn's
/// input (shared messages) for the floor.
fn replay(bench: &Bench, history: &[Value]) -> Result<Replay> {
    // Parsing is the wire's cost, not the chain's: done before the clock starts. Fresh
    // messages every run, so each run counts every message's tokens once, like a session.
    let turns = split_turns(parse(history)?, history_bench::is_user);
    let bytes_entered = turns
        .iter()
        .flatten()
        .map(|m| history_bench::token_item_bytes(m))
        .sum();
    let tokenized_before = tokens::bytes_tokenized();
    let mut per_turn = Vec::with_capacity(turns.len());
    let mut inputs = Vec::with_capacity(turns.len());
    let mut previous: Vec<RArc<Message>> = Vec::new();
    for (index, new_messages) in turns.into_iter().enumerate() {
        let turn = index as u64 + 1;
        let started = Instant::now();
        let mut new_messages = new_messages;
        // Stamped as a session stamps what enters, while the messages are not shared yet:
        // the copy of the input kept for the floor below would otherwise make the host
        // copy each new message.
        turns::stamp_entering(&mut new_messages, turn, None);
        let mut input = previous;
        input.append(&mut new_messages);
        let appended = started.elapsed();
        inputs.push(input.clone());
        let ctx = stateless_context(&bench.config, bench.model.clone(), turn);
        let started = Instant::now();
        let run = bench
            .chain
            .run(input, &ctx, Call::Process)
            .map_err(|e| e.to_string())?;
        // The working history is what a session keeps and appends the next turn to.
        previous = run.working;
        per_turn.push(appended + started.elapsed());
    }
    Ok(Replay {
        per_turn,
        bytes_entered,
        bytes_tokenized: tokens::bytes_tokenized() - tokenized_before,
        inputs,
    })
}

/// The floor of a replay: each turn's input, as the chain got it, through the floor chain.
/// (Not a replay of its own: a floor that trims nothing would grow the history to every
/// message and measure another workload.) The messages were counted by the chain's run,
/// so the floor holds no tokenizing: the ratio includes counting each new message once.
fn floor_replay(bench: &Bench, inputs: Vec<Vec<RArc<Message>>>) -> Result<Vec<Duration>> {
    let mut per_turn = Vec::with_capacity(inputs.len());
    for (index, input) in inputs.into_iter().enumerate() {
        let ctx = stateless_context(&bench.config, bench.model.clone(), index as u64 + 1);
        let started = Instant::now();
        let run = bench
            .floor
            .run(input, &ctx, Call::Process)
            .map_err(|e| e.to_string())?;
        per_turn.push(started.elapsed());
        drop(run);
    }
    Ok(per_turn)
}

/// One call on a history: the total and each stage's time.
struct Call1 {
    total: Duration,
    stages: Vec<(String, Duration)>,
}

fn call_once(bench: &Bench, chain: &Chain, history: &[RArc<Message>], turn: u64) -> Result<Call1> {
    let input = history.to_vec();
    let ctx = stateless_context(&bench.config, bench.model.clone(), turn);
    let started = Instant::now();
    let run = chain.run(input, &ctx, Call::Process).map_err(|e| e.to_string())?;
    let total = started.elapsed();
    let stages = run.stages.iter().map(|s| (s.plugin.clone(), s.elapsed)).collect();
    Ok(Call1 { total, stages })
}

/// The single-call history, parsed, with identities and turns set as the host would set
/// them; counts not yet remembered. Setting them up front lets every call share the same
/// messages (a shared message whose identity or turn the host had to set would be copied).
fn single_history(values: &[Value]) -> Result<(Vec<RArc<Message>>, u64)> {
    let mut history = parse(values)?;
    let turn = turns::current_turn(&history, None);
    turns::prepare(&mut history, turn);
    Ok((history, turn))
}

/// Cold call (counts not remembered) then the median of warm calls, per stage too.
struct Single {
    cold: Call1,
    warm: Duration,
    /// The fastest warm call: what the work costs when nothing else wants the CPU.
    warm_best: Duration,
    warm_stages: Vec<(String, Duration)>,
}

/// One call on `values` through the chain and through the floor: each on its own fresh
/// copy of the history (so both cold calls count every message), then `warm_calls` warm
/// calls each, alternated in blocks ([`WARM_BLOCK`]).
fn singles(bench: &Bench, values: &[Value], warm_calls: usize) -> Result<(Single, Single)> {
    let chains = [&bench.chain, &bench.floor];
    let mut histories = Vec::new();
    let mut colds = Vec::new();
    for chain in chains {
        let (history, turn) = single_history(values)?;
        colds.push(call_once(bench, chain, &history, turn)?);
        histories.push((history, turn));
    }
    let mut totals = [Vec::new(), Vec::new()];
    let mut stages: [Vec<Vec<Duration>>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..warm_calls.div_ceil(WARM_BLOCK) {
        for (which, chain) in chains.iter().enumerate() {
            let (history, turn) = &histories[which];
            for _ in 0..WARM_BLOCK {
                let call = call_once(bench, chain, history, *turn)?;
                totals[which].push(call.total);
                stages[which].resize(call.stages.len(), Vec::new());
                for (samples, (_, elapsed)) in stages[which].iter_mut().zip(&call.stages) {
                    samples.push(*elapsed);
                }
            }
        }
    }
    let mut results = colds.into_iter().enumerate().map(|(which, cold)| {
        let names = cold.stages.iter().map(|(name, _)| name.clone());
        let warm_stages = names.zip(stages[which].iter().map(|s| median(s))).collect();
        Single {
            warm: median(&totals[which]),
            warm_best: quantile(&totals[which], 0.0),
            warm_stages,
            cold,
        }
    });
    let chain = results.next().expect("two results");
    let floor = results.next().expect("two results");
    Ok((chain, floor))
}

/// Each strategy alone on `values`: its cold call (a fresh copy of the history) and the
/// median of `warm_calls` warm calls, in ms, with the warm ratio to `default`'s.
fn strategy_singles(bench: &Bench, values: &[Value], warm_calls: usize) -> Result<Value> {
    let mut table = serde_json::Map::new();
    let mut default_warm = None;
    for (name, chain) in &bench.strategies {
        let (history, turn) = single_history(values)?;
        let cold = call_once(bench, chain, &history, turn)?.total;
        let mut warm = Vec::with_capacity(warm_calls);
        for _ in 0..warm_calls {
            warm.push(call_once(bench, chain, &history, turn)?.total);
        }
        let warm = median(&warm);
        let base = *default_warm.get_or_insert(warm);
        table.insert(
            name.to_string(),
            json!({
                "cold_ms": round(ms(cold), 3),
                "warm_ms": round(ms(warm), 4),
                "ratio_to_default": round(ratio(warm, base), 3),
            }),
        );
    }
    Ok(Value::Object(table))
}

/// The host counter's throughput on the history's items, MB/s, and the time to count them
/// all once (median of 3): the part of a replay no chain can avoid.
fn token_throughput(values: &[Value], tokenizer: Tokenizer) -> Result<(f64, Duration)> {
    let history = parse(values)?;
    let items: Vec<&str> = history.iter().flat_map(|m| m.token_items()).collect();
    let bytes: usize = items.iter().map(|i| i.len()).sum();
    let mut times = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let mut total = 0;
        for item in &items {
            total += tokens::count_text(tokenizer, item);
        }
        std::hint::black_box(total);
        times.push(started.elapsed());
    }
    let time = median(&times);
    Ok((bytes as f64 / time.as_secs_f64() / 1e6, time))
}

/// The reference the host's counter replaced, tiktoken-rs's `o200k_base`, on the same
/// items: its load time (decoding and hashing the vocabulary, once per process) and its
/// throughput, MB/s (median of 3), so the bench shows before and after in one run.
fn reference_token_throughput(values: &[Value]) -> Result<(Duration, f64)> {
    let started = Instant::now();
    let reference = tiktoken_rs::o200k_base().map_err(|e| format!("tiktoken-rs o200k_base: {e}"))?;
    let load = started.elapsed();
    let history = parse(values)?;
    let items: Vec<&str> = history.iter().flat_map(|m| m.token_items()).collect();
    let bytes: usize = items.iter().map(|i| i.len()).sum();
    let times: Vec<Duration> = (0..3)
        .map(|_| {
            let started = Instant::now();
            let total: usize = items
                .iter()
                .map(|item| reference.encode_ordinary(item).len())
                .sum();
            std::hint::black_box(total);
            started.elapsed()
        })
        .collect();
    Ok((load, bytes as f64 / median(&times).as_secs_f64() / 1e6))
}

/// `o200k_base` throughput of the host's counter on its worst cases, MB/s (median of 3):
/// a megabyte of one letter and a megabyte of random A/C/G/T, each one piece of text for
/// the byte-pair merge (a merge that rescans the piece after each step takes many minutes).
fn worst_token_throughput() -> (f64, f64) {
    let one_letter = "a".repeat(WORST_CASE_BYTES);
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let acgt: String = (0..WORST_CASE_BYTES)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ['A', 'C', 'G', 'T'][(state % 4) as usize]
        })
        .collect();
    let throughput = |text: &str| {
        let times: Vec<Duration> = (0..3)
            .map(|_| {
                let started = Instant::now();
                std::hint::black_box(tokens::count_text(Tokenizer::O200kBase, text));
                started.elapsed()
            })
            .collect();
        text.len() as f64 / median(&times).as_secs_f64() / 1e6
    };
    (throughput(&one_letter), throughput(&acgt))
}

/// Counting with part kinds (docs/wire-format.md#part-kinds): the median time to count a
/// message carrying a 1 MB base64 PNG (its header read, never the tokenizer), in µs; and
/// the text-only `history` counted fresh (no message remembers a count, the content cache
/// warm) by the host's counter over the same counting as before part kinds (every item
/// through the content cache): 1.0 = no slower.
fn media_counting(history: &[Value]) -> Result<(f64, u64, f64)> {
    // A text-only history: the same count both ways (an --input with media counts less now).
    use plugin_api::parts::{samples, MediaRules};
    let part = samples::image_url_part("image/png", &samples::png_stored(870, 900), Some("high"));
    let image = parse(&[
        json!({"role": "user", "content": [{"type": "text", "text": "the screen"}, serde_json::from_str::<Value>(&part).map_err(|e| e.to_string())?]}),
    ])?;
    // Alternating the rules makes each call count again (the memo says which rules it holds).
    let times: Vec<Duration> = (0..200)
        .map(|i| {
            let rules = if i % 2 == 0 {
                MediaRules::OPENAI
            } else {
                MediaRules::ANTHROPIC
            };
            tokens::with_media_rules(rules, || {
                let started = Instant::now();
                std::hint::black_box(tokens::message_tokens(Tokenizer::O200kBase, &image[0], 3));
                started.elapsed()
            })
        })
        .collect();
    let image_us = us(median(&times));
    let mut now = Vec::new();
    let mut before = Vec::new();
    for run in 0..7 {
        let messages = parse(history)?;
        let started = Instant::now();
        let counted = tokens::history_tokens(Tokenizer::O200kBase, &messages);
        let host = started.elapsed();
        let messages = parse(history)?;
        let started = Instant::now();
        let old: u64 = messages
            .iter()
            .map(|m| 3 + tokens::items_tokens(Tokenizer::O200kBase, m.token_items()))
            .sum();
        let old_time = started.elapsed();
        std::hint::black_box((counted, old));
        // The first run fills the content cache for both.
        if run > 0 {
            now.push(host);
            before.push(old_time);
        }
    }
    Ok((image_us, part.len() as u64, ratio(median(&now), median(&before))))
}

/// The process's peak resident set so far, in MB (VmHWM; Linux only, else 0).
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The 1-minute load average (Linux; `null` elsewhere).
fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
fn ratio(a: Duration, b: Duration) -> f64 {
    if b.is_zero() {
        0.0
    } else {
        a.as_secs_f64() / b.as_secs_f64()
    }
}
/// Rounds for the report (figures are not more precise than this).
fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

fn run(args: &[String]) -> Result<()> {
    check_flags(
        args,
        &[
            "--plugin-dir",
            "--input",
            "--max-tokens",
            "--runs",
            "--seed",
            "--plugin-timeout-ms",
        ],
        &["--json"],
    )?;
    let plugin_dir: PathBuf = flag(args, "--plugin-dir")?.ok_or("--plugin-dir is required")?;
    let json_out = args.iter().any(|a| a == "--json");
    let input: Option<PathBuf> = flag(args, "--input")?;
    let max_tokens: Option<u64> = flag(args, "--max-tokens")?;
    let runs: usize = flag(args, "--runs")?.unwrap_or(5).max(1);
    let seed: u64 = flag(args, "--seed")?.unwrap_or(1);

    let plugin_timeout_ms: Option<u64> = flag(args, "--plugin-timeout-ms")?;
    let bench = load_bench(&plugin_dir, max_tokens, plugin_timeout_ms)?;
    // The encoding is built on first use, once per process (a serving host pays it once,
    // each `history-host process` call pays it): measured apart, not charged to turn 1.
    let started = Instant::now();
    tokens::count_text(Tokenizer::O200kBase, "warm up");
    let tokenizer_init = started.elapsed();
    let started = Instant::now();
    tokens::count_text(Tokenizer::Cl100kBase, "warm up");
    let cl100k_init = started.elapsed();
    let names = bench.chain.names().join(", ");
    eprintln!(
        "chain measured: {names}{}; floor: {} × floor",
        if bench.missing.is_empty() {
            String::new()
        } else {
            format!(" (not installed: {})", bench.missing.join(", "))
        },
        bench.floor.stages().len()
    );
    if max_tokens.is_some() && !bench.max_tokens_applied {
        eprintln!("--max-tokens not applied: token_budget is not installed");
    }

    let replay_history: Vec<Value> = match &input {
        Some(file) => {
            let text =
                std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            match serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))? {
                Value::Array(messages) => messages,
                // The document form `history-host process` also reads.
                Value::Object(mut document) => match document.remove("messages") {
                    Some(Value::Array(messages)) => messages,
                    _ => return Err(format!("{}: no \"messages\" array", file.display())),
                },
                _ => return Err(format!("{}: not a JSON array of messages", file.display())),
            }
        }
        None => generate(REPLAY_TURNS, seed),
    };

    // Replays, chain and floor interleaved so a slow moment of the machine hits both.
    let mut chain_runs = Vec::new();
    let mut floor_runs = Vec::new();
    for _ in 0..runs {
        let mut run = replay(&bench, &replay_history)?;
        floor_runs.push(floor_replay(&bench, std::mem::take(&mut run.inputs))?);
        chain_runs.push(run);
    }
    let peak_rss = peak_rss_mb();
    let turns_count = chain_runs[0].per_turn.len();
    let totals: Vec<Duration> = chain_runs.iter().map(Replay::total).collect();
    let total = median(&totals);
    let floor_total = median(&floor_runs.iter().map(|r| r.iter().sum()).collect::<Vec<_>>());
    let turn_median = median(&chain_runs.iter().map(|r| median(&r.per_turn)).collect::<Vec<_>>());
    let turn_p99 = median(
        &chain_runs
            .iter()
            .map(|r| quantile(&r.per_turn, 0.99))
            .collect::<Vec<_>>(),
    );
    let floor_turn_median = median(&floor_runs.iter().map(|r| median(r)).collect::<Vec<_>>());
    let first = &chain_runs[0];
    let tokenized_ratio = first.bytes_tokenized as f64 / first.bytes_entered.max(1) as f64;

    // dedupe alone on the replay, every turn's working history handed back whole (nothing
    // trims it): the bytes it hashed against the tool results' bytes that entered.
    let hashing = match bench.strategies.iter().find(|(name, _)| *name == "dedupe") {
        Some((_, chain)) => Some(history_bench::hashing::replay(
            chain,
            &bench.config,
            &bench.model,
            parse(&replay_history)?,
        )?),
        None => None,
    };

    let single_values = generate_messages(SINGLE_MESSAGES, seed.wrapping_add(1));
    let (chain_single, floor_single) = singles(&bench, &single_values, WARM_CALLS)?;
    let strategies_single = strategy_singles(&bench, &single_values, WARM_CALLS)?;
    let fanout_values = fan_out(FANOUT_CALLS);
    let (chain_fanout, floor_fanout) = singles(&bench, &fanout_values, FANOUT_WARM_CALLS)?;
    let (throughput, counting) = token_throughput(&replay_history, Tokenizer::O200kBase)?;
    let (cl100k_throughput, _) = token_throughput(&replay_history, Tokenizer::Cl100kBase)?;
    let (one_letter, acgt) = worst_token_throughput();
    let (image_us, image_bytes, text_ratio) = media_counting(&replay_history)?;
    let (reference_load, reference_throughput) = reference_token_throughput(&replay_history)?;

    let per_plugin = |single: &Single| -> BTreeMap<String, f64> {
        single
            .warm_stages
            .iter()
            .map(|(name, d)| (name.clone(), round(ms(*d), 4)))
            .collect()
    };
    let cold_per_plugin = |single: &Single| -> BTreeMap<String, f64> {
        single
            .cold
            .stages
            .iter()
            .map(|(name, d)| (name.clone(), round(ms(*d), 3)))
            .collect()
    };
    let report = json!({
        "chain": bench.chain.names(),
        "not_installed": bench.missing,
        "floor": format!("{} x floor (pass-through) through the same Chain::run", bench.floor.stages().len()),
        "config": {
            "agent_max_ctx": AGENT_MAX_CTX,
            "context_tokens": CONTEXT_TOKENS,
            "tokenizer": "o200k_base",
            "max_tokens": bench.max_tokens,
            "max_tokens_applied": bench.max_tokens_applied,
            "plugin_timeout_ms": bench.config.plugin_timeout_ms,
        },
        "runs": runs,
        // Load while measuring (1-minute average, /proc/loadavg): the medians of a run on
        // a busy machine say more about the machine than about the chain.
        "load_average": load_average(),
        "replay": {
            "input": input.as_ref().map(|p| p.display().to_string()),
            "turns": turns_count,
            "messages": replay_history.len(),
            "bytes": first.bytes_entered,
            "total_s": round(total.as_secs_f64(), 4),
            "per_turn_median_us": round(us(turn_median), 1),
            "per_turn_p99_us": round(us(turn_p99), 1),
            "floor_total_s": round(floor_total.as_secs_f64(), 4),
            "best_total_s": round(quantile(&totals, 0.0).as_secs_f64(), 4),
            "floor_per_turn_median_us": round(us(floor_turn_median), 1),
            "ratio_to_floor": round(ratio(total, floor_total), 3),
            // The floor sees messages the chain's run already counted; counting each
            // message once is work every chain does, so here is the floor with it.
            "counting_s": round(counting.as_secs_f64(), 4),
            "ratio_to_floor_and_counting": round(ratio(total, floor_total + counting), 3),
        },
        // Bytes dedupe hashed (its own count) / tool-result bytes that entered, over the
        // replay through dedupe alone; null when dedupe is not installed.
        "dedupe_hashing": hashing.map(|h| json!({
            "turns": h.turns,
            "bytes_entered": h.bytes_entered,
            "bytes_hashed": h.bytes_hashed,
            "ratio": round(h.ratio(), 4),
        })),
        "single": {
            "messages": single_values.len(),
            "cold_ms": round(ms(chain_single.cold.total), 3),
            "floor_cold_ms": round(ms(floor_single.cold.total), 3),
            "cold_per_plugin_ms": cold_per_plugin(&chain_single),
            "total_ms": round(ms(chain_single.warm), 4),
            "floor_ms": round(ms(floor_single.warm), 4),
            "best_ms": round(ms(chain_single.warm_best), 4),
            "floor_best_ms": round(ms(floor_single.warm_best), 4),
            "ratio_to_floor": round(ratio(chain_single.warm, floor_single.warm), 3),
            "per_plugin_ms": per_plugin(&chain_single),
            // Each strategy alone on the same history and window (the chain runs
            // `default` first, so later stages never see all of it).
            "alone": strategies_single,
        },
        // One assistant message with FANOUT_CALLS calls, answered in reverse order.
        "fanout": {
            "calls": FANOUT_CALLS,
            "messages": fanout_values.len(),
            "cold_ms": round(ms(chain_fanout.cold.total), 3),
            "floor_cold_ms": round(ms(floor_fanout.cold.total), 3),
            "cold_per_plugin_ms": cold_per_plugin(&chain_fanout),
            "total_ms": round(ms(chain_fanout.warm), 3),
            "floor_ms": round(ms(floor_fanout.warm), 3),
            "ratio_to_floor": round(ratio(chain_fanout.warm, floor_fanout.warm), 3),
            "per_plugin_ms": per_plugin(&chain_fanout),
        },
        "tokens": {
            "o200k_mb_per_s": round(throughput, 2),
            // The lower of the two worst cases, each 1 MB in one piece.
            "o200k_worst_mb_per_s": round(one_letter.min(acgt), 2),
            "o200k_one_letter_mb_per_s": round(one_letter, 2),
            "o200k_acgt_mb_per_s": round(acgt, 2),
            "cl100k_mb_per_s": round(cl100k_throughput, 2),
            // tiktoken-rs on the same items: what the host used before its own counter.
            "reference_o200k_mb_per_s": round(reference_throughput, 2),
            "reference_o200k_load_ms": round(ms(reference_load), 1),
            "o200k_throughput_ratio_to_reference": round(throughput / reference_throughput, 2),
            "bytes_tokenized_ratio": round(tokenized_ratio, 4),
            "bytes_tokenized": first.bytes_tokenized,
            "bytes_entered": first.bytes_entered,
            "image_count_us": round(image_us, 2),
            "image_part_bytes": image_bytes,
            "text_count_ratio_to_before": round(text_ratio, 3),
        },
        "peak_rss_mb": round(peak_rss, 1),
        "tokenizer_init_ms": round(ms(tokenizer_init), 1),
        "cl100k_init_ms": round(ms(cl100k_init), 1),
    });
    if json_out {
        println!("{report}");
    } else {
        print_table(&report);
    }
    Ok(())
}

fn print_table(r: &Value) {
    let replay = &r["replay"];
    let single = &r["single"];
    println!("chain: {}   floor: {}", r["chain"], r["floor"]);
    println!(
        "medians over {} runs; load average {} on {} CPUs",
        r["runs"],
        r["load_average"],
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!();
    println!(
        "replay     {} turns, {} messages, {} bytes",
        replay["turns"], replay["messages"], replay["bytes"]
    );
    println!(
        "  total        {:>10} s    floor {:>10} s    ratio {}",
        replay["total_s"], replay["floor_total_s"], replay["ratio_to_floor"]
    );
    println!(
        "  per turn     {:>10} µs   floor {:>10} µs   (median)",
        replay["per_turn_median_us"], replay["floor_per_turn_median_us"]
    );
    println!("  per turn p99 {:>10} µs", replay["per_turn_p99_us"]);
    println!("  best total   {:>10} s    (fastest run)", replay["best_total_s"]);
    println!(
        "  counting every message once: {} s; ratio to floor + counting {}",
        replay["counting_s"], replay["ratio_to_floor_and_counting"]
    );
    let hashing = &r["dedupe_hashing"];
    if !hashing.is_null() {
        println!(
            "  dedupe alone: {} bytes hashed / {} tool-result bytes entered = {} over {} turns",
            hashing["bytes_hashed"], hashing["bytes_entered"], hashing["ratio"], hashing["turns"]
        );
    }
    println!();
    println!("single     one call on {} messages", single["messages"]);
    println!(
        "  cold         {:>10} ms   floor {:>10} ms",
        single["cold_ms"], single["floor_cold_ms"]
    );
    println!(
        "  warm         {:>10} ms   floor {:>10} ms   ratio {}",
        single["total_ms"], single["floor_ms"], single["ratio_to_floor"]
    );
    println!(
        "  warm best    {:>10} ms   floor {:>10} ms   (fastest call)",
        single["best_ms"], single["floor_best_ms"]
    );
    if let Some(plugins) = single["per_plugin_ms"].as_object() {
        for (name, warm) in plugins {
            println!(
                "  {name:<20} {warm:>10} ms warm, {} ms cold",
                single["cold_per_plugin_ms"][name]
            );
        }
    }
    if let Some(alone) = single["alone"].as_object() {
        println!("  each strategy alone on the same history (warm median; ratio to default's):");
        for (name, row) in alone {
            println!(
                "  {name:<20} {:>10} ms warm, {} ms cold, ratio {}",
                row["warm_ms"], row["cold_ms"], row["ratio_to_default"]
            );
        }
    }
    let fanout = &r["fanout"];
    println!();
    println!(
        "fanout     one assistant message with {} tool calls answered in reverse order ({} messages)",
        fanout["calls"], fanout["messages"]
    );
    println!(
        "  cold         {:>10} ms   floor {:>10} ms",
        fanout["cold_ms"], fanout["floor_cold_ms"]
    );
    println!(
        "  warm         {:>10} ms   floor {:>10} ms   ratio {}",
        fanout["total_ms"], fanout["floor_ms"], fanout["ratio_to_floor"]
    );
    if let Some(plugins) = fanout["per_plugin_ms"].as_object() {
        for (name, warm) in plugins {
            println!(
                "  {name:<20} {warm:>10} ms warm, {} ms cold",
                fanout["cold_per_plugin_ms"][name]
            );
        }
    }
    println!();
    let tokens = &r["tokens"];
    println!(
        "tokens     o200k_base {} MB/s; worst case {} MB/s (1 MB of one letter {} MB/s, of random ACGT {} MB/s)",
        tokens["o200k_mb_per_s"],
        tokens["o200k_worst_mb_per_s"],
        tokens["o200k_one_letter_mb_per_s"],
        tokens["o200k_acgt_mb_per_s"]
    );
    println!("           cl100k_base {} MB/s", tokens["cl100k_mb_per_s"]);
    println!(
        "           before: tiktoken-rs o200k_base {} MB/s on the same items ({}x now), load {} ms",
        tokens["reference_o200k_mb_per_s"],
        tokens["o200k_throughput_ratio_to_reference"],
        tokens["reference_o200k_load_ms"]
    );
    println!(
        "           bytes tokenized / entered over a replay: {}",
        tokens["bytes_tokenized_ratio"]
    );
    println!(
        "           a {}-byte base64 PNG counted in {} µs; a text-only history counted now / before part kinds: {}",
        tokens["image_part_bytes"], tokens["image_count_us"], tokens["text_count_ratio_to_before"]
    );
    println!("peak RSS   {} MB (after the replays)", r["peak_rss_mb"]);
    println!(
        "o200k_base load {} ms, cl100k_base load {} ms (once per process, before the measurements)",
        r["tokenizer_init_ms"], r["cl100k_init_ms"]
    );
}
