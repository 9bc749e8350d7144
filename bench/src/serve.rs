//! `history-bench serve` (`cargo xtask bench serve`): a real `history-host serve` (release)
//! on a free loopback port, driven over HTTP by many concurrent clients, each sending the
//! turns of its sessions one at a time: turns per second, turn latency p50/p99 and the
//! server's peak RSS (VmHWM), beside a floor measured in the same run — the same requests
//! to a `serve` whose chain is the pass-through `floor` fixture — so the chain's share and
//! the service's (HTTP, JSON, the store's durable commit) show. docs/sessions.md#performance
//! has the figures.
//!
//! Each session replays its own generated agent conversation (seed = its number), split
//! into turns at user messages as an agent would send them: about four messages a turn,
//! so 50 turns make a session of about 200 messages. Every session is created first,
//! then the clients send turn 1 of each of their sessions, then turn 2, …, so all
//! sessions are live and grow together. Bounded by the turn count and a time cap.
//!
//! `--reloads N` measures hot reload under that load instead (docs/chain.md#hot-reload):
//! the shipped chain alone, and while the clients run the bench rewrites the
//! configuration N times with an equivalent change (a comment), one reload after another.
//! A reload's window runs from the write to `/metrics` showing
//! `history_reloads_total{outcome="ok"}` moved (so it holds the watch's 300 ms debounce,
//! the load beside the running chain, its sample run and the swap). A turn that overlaps
//! a window is "during"; the rest are "outside". The target (issue #10): no failed turn,
//! and no turn during a reload slower than 2× the outside p99.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use history_bench::{generate, split_turns};
use hyper::Method;
use serde_json::{json, Value};

use crate::cpu;
use crate::loopback::{self, http_client, latency, round, Chain, HttpClient, Serve};
use crate::{check_flags, flag, Result};

mod callgrind;
mod open_loop;

/// A measured case: how many sessions, clients and turns.
#[derive(Debug, Clone)]
struct Case {
    name: String,
    sessions: usize,
    clients: usize,
    turns: usize,
    /// `--sticky`: each session's turns go to one host, as a load balancer with session
    /// affinity routes them; otherwise they alternate between the hosts.
    sticky: bool,
    /// `--rate R`: the open loop, R turns a second on a schedule (open_loop.rs); else
    /// `clients` closed-loop clients, one request in flight each.
    rate: Option<f64>,
    /// `--answer`: the shape the clients ask each answer in.
    answer: Answer,
}

/// The load, timing and store of a run.
#[derive(Clone)]
struct Settings {
    host: PathBuf,
    plugin_dir: PathBuf,
    /// The floor fixture built as `default`, alone in its folder.
    floor_dir: PathBuf,
    /// `None`: a fresh SQLite file per run; else a PostgreSQL server, a fresh database per run.
    postgres: Option<String>,
    /// Hosts serving one PostgreSQL store (the clients alternate between them).
    hosts: usize,
    time_cap: Duration,
    /// `--session-memory-mb N`: the served configuration's `session_memory_mb`.
    session_memory_mb: Option<u64>,
}

pub fn serve(args: &[String]) -> Result<()> {
    check_flags(
        args,
        &[
            "--host",
            "--plugin-dir",
            "--floor-dir",
            "--sessions",
            "--clients",
            "--turns",
            "--store",
            "--hosts",
            "--time-cap",
            "--reloads",
            "--session-memory-mb",
            "--rate",
            "--callgrind-sessions",
            "--callgrind-dir",
            "--answer",
        ],
        &["--json", "--sticky", "--callgrind"],
    )?;
    let json_out = args.iter().any(|a| a == "--json");
    let store: Option<String> = flag(args, "--store")?;
    let postgres = match store {
        None => None,
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => Some(url),
        Some(other) => {
            return Err(format!(
                "--store {other}: expected a postgres:// URL (without it each run gets a fresh SQLite file)"
            ))
        }
    };
    let hosts = flag(args, "--hosts")?.unwrap_or(1usize);
    if hosts == 0 || (hosts > 1 && postgres.is_none()) {
        return Err("--hosts N (N ≥ 1) needs --store postgres://… when N > 1: hosts share one store".into());
    }
    let settings = Settings {
        host: flag(args, "--host")?.ok_or("--host is required")?,
        plugin_dir: flag(args, "--plugin-dir")?.ok_or("--plugin-dir is required")?,
        floor_dir: flag(args, "--floor-dir")?.ok_or("--floor-dir is required")?,
        postgres,
        hosts,
        time_cap: Duration::from_secs(flag(args, "--time-cap")?.unwrap_or(300u64)),
        session_memory_mb: flag(args, "--session-memory-mb")?,
    };
    let reloads: Option<usize> = flag(args, "--reloads")?;
    if reloads == Some(0) || (reloads.is_some() && hosts > 1) {
        return Err("--reloads N needs N ≥ 1 and one host (the bench reads one host's /metrics)".into());
    }
    let sticky = args.iter().any(|a| a == "--sticky");
    let rate: Option<f64> = flag(args, "--rate")?;
    if let Some(rate) = rate {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(format!(
                "--rate {rate}: expected turns a second, a number above 0"
            ));
        }
        if reloads.is_some() || args.iter().any(|a| a == "--clients") {
            return Err(
                "--rate R sends each session's turns on a schedule: it takes no --clients and no --reloads"
                    .into(),
            );
        }
    }
    let callgrind = callgrind::Options::from_args(args)?;
    let answer = match flag::<String>(args, "--answer")? {
        None => Answer::Full,
        Some(name) => Answer::parse(&name)?,
    };
    let custom = ["--sessions", "--clients", "--turns", "--rate"]
        .iter()
        .any(|f| args.iter().any(|a| a == f));
    let cases = if custom || reloads.is_some() {
        let sessions = flag(args, "--sessions")?.unwrap_or(64usize);
        vec![Case {
            name: match rate {
                Some(rate) => format!("sessions_{sessions}_rate_{rate}"),
                None => format!("sessions_{sessions}"),
            },
            sessions,
            // The open loop has a connection per session: as many in flight as are due.
            clients: match rate {
                Some(_) => sessions,
                None => flag(args, "--clients")?.unwrap_or(sessions.min(64)),
            },
            turns: flag(args, "--turns")?.unwrap_or(50),
            sticky,
            rate,
            answer,
        }]
    } else {
        vec![
            Case {
                name: "sessions_64".into(),
                sessions: 64,
                clients: 64,
                turns: 50,
                sticky,
                rate: None,
                answer,
            },
            Case {
                name: "live_1000".into(),
                sessions: 1000,
                clients: 64,
                turns: 50,
                sticky,
                rate: None,
                answer,
            },
        ]
    };
    for case in &cases {
        if case.sessions == 0 || case.clients == 0 || case.turns == 0 {
            return Err("--sessions, --clients and --turns must be at least 1".into());
        }
    }
    let machine_before = loopback::machine();
    if let Some(reloads) = reloads {
        return reload_bench(&settings, &cases[0], reloads, machine_before, json_out);
    }
    let mut reports = Vec::new();
    for case in &cases {
        let mut runs = serde_json::Map::new();
        // With PostgreSQL, the single-host SQLite figures of the same run beside them
        // (docs/scaling-out.md#performance): the same load, one host, a fresh SQLite file.
        let sqlite = Settings {
            postgres: None,
            hosts: 1,
            ..settings.clone()
        };
        let mut sqlite_runs = serde_json::Map::new();
        // The floor first: its store and caches start as cold as the chain's.
        for chain in [Chain::Floor, Chain::Shipped] {
            eprintln!(
                "serve bench: {} ({} sessions, {} clients, {} turns each) on the {}…",
                case.name,
                case.sessions,
                case.clients,
                case.turns,
                chain.name()
            );
            let run = run_case(&settings, case, chain, 0)?;
            runs.insert(chain.name().to_string(), run);
            if settings.postgres.is_some() {
                eprintln!("serve bench: … and on one host with SQLite");
                sqlite_runs.insert(chain.name().to_string(), run_case(&sqlite, case, chain, 0)?);
            }
        }
        if let Some(options) = &callgrind {
            for chain in [Chain::Floor, Chain::Shipped] {
                let counted = callgrind::instructions(&settings, case, chain, options)?;
                runs[chain.name()]["instructions"] = counted;
            }
        }
        let ratio = |key: &str| {
            let chain = runs["chain"][key].as_f64().unwrap_or(0.0);
            let floor = runs["floor"][key].as_f64().unwrap_or(0.0);
            if floor > 0.0 {
                round(chain / floor, 3)
            } else {
                0.0
            }
        };
        let ratios = json!({
            "turns_per_s": ratio("turns_per_s"),
            "p50": runs["chain"]["latency"]["p50_ms"].as_f64().zip(runs["floor"]["latency"]["p50_ms"].as_f64()).map(|(c, f)| round(c / f.max(1e-9), 3)),
            "p99": runs["chain"]["latency"]["p99_ms"].as_f64().zip(runs["floor"]["latency"]["p99_ms"].as_f64()).map(|(c, f)| round(c / f.max(1e-9), 3)),
            "peak_rss": ratio("peak_rss_mb"),
        });
        let sqlite_side = (!sqlite_runs.is_empty()).then(|| {
            let over = |chain: &str, key: &str| {
                let pg = runs[chain]["turns_per_s"].as_f64().unwrap_or(0.0);
                let lite = sqlite_runs[chain][key].as_f64().unwrap_or(0.0);
                (lite > 0.0).then(|| round(pg / lite, 3))
            };
            json!({
                "chain": sqlite_runs["chain"],
                "floor": sqlite_runs["floor"],
                "postgres_over_sqlite_turns_per_s": {
                    "chain": over("chain", "turns_per_s"),
                    "floor": over("floor", "turns_per_s"),
                },
            })
        });
        reports.push(json!({
            "sqlite_one_host": sqlite_side,
            "case": case.name,
            "sessions": case.sessions,
            "clients": case.clients,
            "turns_per_session": case.turns,
            "chain": runs["chain"],
            "floor": runs["floor"],
            "chain_over_floor": ratios,
        }));
    }
    let report = json!({
        "store": if settings.postgres.is_some() { "postgres" } else { "sqlite" },
        "hosts": settings.hosts,
        "routing": if sticky { "sticky" } else { "alternate" },
        "answer": answer.name(),
        "machine_before": machine_before,
        "machine_after": loopback::machine(),
        "targets": {
            "turns_per_s": 2000,
            "p99_ms": 20,
            "peak_rss_mb_1000_sessions": 300,
            "host_cpu_ms_per_turn": 0.5,
            "open_loop_p99_ms_at_1000_per_s": 20,
        },
        "cases": reports,
    });
    if json_out {
        println!("{report}");
    } else {
        print_table(&report);
    }
    Ok(())
}

/// `--reloads N`: the shipped chain under the case's load with N reloads during it; the
/// turns inside a reload's window against the rest.
fn reload_bench(
    settings: &Settings,
    case: &Case,
    reloads: usize,
    machine_before: Value,
    json_out: bool,
) -> Result<()> {
    eprintln!(
        "serve bench: {} ({} sessions, {} clients, {} turns each) on the chain, {reloads} reloads during the load…",
        case.name, case.sessions, case.clients, case.turns
    );
    let run = run_case(settings, case, Chain::Shipped, reloads)?;
    let report = json!({
        "store": if settings.postgres.is_some() { "postgres" } else { "sqlite" },
        "machine_before": machine_before,
        "machine_after": loopback::machine(),
        "target": "no failed turn; no turn during a reload slower than 2x the p99 outside reloads",
        "case": case.name,
        "sessions": case.sessions,
        "clients": case.clients,
        "turns_per_session": case.turns,
        "chain": run,
    });
    if json_out {
        println!("{report}");
    } else {
        let run = &report["chain"];
        let r = &run["reload"];
        println!(
            "store: {}   machine before: {}   after: {}",
            report["store"], report["machine_before"], report["machine_after"]
        );
        println!("target: {}", report["target"].as_str().unwrap_or_default());
        println!(
            "{}: {} sessions, {} clients, {} turns each; {} of {} reloads done, windows {:?} ms",
            report["case"],
            report["sessions"],
            report["clients"],
            report["turns_per_session"],
            r["done"],
            r["asked"],
            r["windows_ms"]
                .as_array()
                .map(|w| w.iter().map(|v| v.as_f64().unwrap_or(0.0)).collect::<Vec<_>>())
                .unwrap_or_default(),
        );
        println!(
            "  failed turns {}{}   turns {} ({} during reloads)   {} turns/s",
            run["errors"],
            run["first_error"]
                .as_str()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default(),
            run["turns"],
            r["turns_during"],
            run["turns_per_s"],
        );
        println!(
            "  outside reloads: p50 {} ms   p99 {} ms   max {} ms",
            r["outside"]["p50_ms"], r["outside"]["p99_ms"], r["outside"]["max_ms"]
        );
        println!(
            "  during reloads:  p50 {} ms   p99 {} ms   max {} ms",
            r["during"]["p50_ms"], r["during"]["p99_ms"], r["during"]["max_ms"]
        );
        println!(
            "  during / outside p99: max {}x   p99 {}x   (target: max ≤ 2x)",
            r["max_over_outside_p99"], r["p99_over_outside_p99"]
        );
    }
    Ok(())
}

/// One `serve` (or several on one PostgreSQL database), its sessions created, the load
/// run (with `reloads` hot reloads during it), its figures read, stopped; its store
/// removed.
fn run_case(settings: &Settings, case: &Case, chain: Chain, reloads: usize) -> Result<Value> {
    let work = settings
        .plugin_dir
        .join(format!("serve-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let (config, stages) = served_config(settings, chain, "serve", "")?;
    let database = match &settings.postgres {
        Some(url) => Some(postgres::Database::create(
            url,
            &format!("{}_{}", case.name, chain.name()),
        )?),
        None => None,
    };
    let store = match &database {
        Some(database) => database.url.clone(),
        None => work
            .join(format!("{}-{}.db", case.name, chain.name()))
            .display()
            .to_string(),
    };
    let mut servers = Vec::new();
    for host in 0..settings.hosts {
        let log = work.join(format!("{}-{}-{host}.log", case.name, chain.name()));
        servers.push(Serve::start(&settings.host, &config, &["--store", &store], &log)?);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let reload = (reloads > 0).then(|| Reload {
        config: config.clone(),
        count: reloads,
    });
    // The CPU each part uses under the load (crate::cpu): the hosts, the database server
    // when there is one, and the bench's own clients.
    let pids = || servers.iter().map(|s| s.pid());
    let cpu_before = (
        cpu::Sample::of(pids()),
        cpu::Sample::named("postgres"),
        cpu::Sample::of([std::process::id()]),
    );
    let load = runtime.block_on(drive(&addrs, case, settings.time_cap, reload));
    let cpu_ms = [
        cpu::Sample::of(pids()).ms_since(&cpu_before.0),
        cpu::Sample::named("postgres").ms_since(&cpu_before.1),
        cpu::Sample::of([std::process::id()]).ms_since(&cpu_before.2),
    ];
    let peak_rss = servers
        .iter()
        .map(Serve::peak_rss_mb)
        .collect::<Result<Vec<f64>>>()
        .map(|all| all.into_iter().fold(0.0, f64::max));
    for server in servers {
        server.stop()?;
    }
    let load = load?;
    let peak_rss = peak_rss?;
    let postgres = database.is_some();
    if let Some(database) = database {
        database.drop_it()?;
    }
    let _ = std::fs::remove_dir_all(&work);
    let reload = (reloads > 0).then(|| reload_figures(&load, reloads));
    Ok(json!({
        "stages": stages,
        "turns": load.latencies.len(),
        "turns_planned": case.sessions * case.turns,
        "capped": load.capped,
        "errors": load.errors,
        "first_error": load.first_error,
        "seconds": round(load.elapsed.as_secs_f64(), 3),
        "turns_per_s": round(load.latencies.len() as f64 / load.elapsed.as_secs_f64().max(1e-9), 1),
        "latency": latency(&load.latencies),
        "create_s": round(load.create.as_secs_f64(), 3),
        "messages_sent": load.messages,
        "store_round_trips": load.round_trips,
        "store_round_trips_per_turn": if load.latencies.is_empty() {
            Value::Null
        } else {
            json!(round(load.round_trips as f64 / load.latencies.len() as f64, 2))
        },
        "peak_rss_mb": round(peak_rss, 1),
        "cpu_ms_per_turn": cpu_per_turn(&cpu_ms, load.latencies.len(), postgres),
        "reload": reload,
        "open_loop": case.rate.map(|rate| json!({
            "rate": rate,
            "sent_late": load.sent_late,
            "latency_from_send": latency(&load.from_send),
        })),
    }))
}

/// The configuration a bench `serve` runs with `chain` (written into the plugin folder,
/// or the floor's, under `label`; `history_extra`: more `[history]` keys), and the
/// chain's stages.
fn served_config(
    settings: &Settings,
    chain: Chain,
    label: &str,
    history_extra: &str,
) -> Result<(PathBuf, Vec<String>)> {
    let top_level = settings
        .session_memory_mb
        .map_or(String::new(), |mb| format!("session_memory_mb = {mb}"));
    let (config, stages) = match chain {
        Chain::Shipped => {
            let stages = loopback::shipped_stages(&settings.plugin_dir)?;
            (
                loopback::write_config(&settings.plugin_dir, &stages, label, &top_level)?,
                stages,
            )
        }
        Chain::Floor => {
            let fixture = settings
                .floor_dir
                .join(plugin_api::naming::library_file_name("default"));
            if !fixture.exists() {
                return Err(format!(
                    "{} is missing: run the bench with `cargo xtask bench serve`",
                    fixture.display()
                ));
            }
            let config =
                loopback::write_config(&settings.floor_dir, &["default".to_string()], label, &top_level)?;
            (config, vec!["floor (built as default)".to_string()])
        }
    };
    if !history_extra.is_empty() {
        let text = std::fs::read_to_string(&config).map_err(|e| format!("{}: {e}", config.display()))?;
        let text = text.replacen("[history]\n", &format!("[history]\n{history_extra}\n"), 1);
        std::fs::write(&config, text).map_err(|e| format!("{}: {e}", config.display()))?;
    }
    Ok((config, stages))
}

/// CPU milliseconds per turn of the hosts, the database server (PostgreSQL only) and the
/// bench's clients, from what each used over the load.
fn cpu_per_turn(ms: &[f64; 3], turns: usize, database: bool) -> Value {
    if turns == 0 {
        return Value::Null;
    }
    let per_turn = |ms: f64| round(ms / turns as f64, 3);
    json!({
        "hosts": per_turn(ms[0]),
        "database": database.then(|| per_turn(ms[1])),
        "clients": per_turn(ms[2]),
    })
}

/// The turns that overlapped a reload's window against the rest.
fn reload_figures(load: &Load, asked: usize) -> Value {
    let mut during = Vec::new();
    let mut outside = Vec::new();
    for (sent, took) in load.sent.iter().zip(&load.latencies) {
        let ended = *sent + *took;
        if load
            .windows
            .iter()
            .any(|(start, end)| *sent < *end && ended > *start)
        {
            during.push(*took);
        } else {
            outside.push(*took);
        }
    }
    let outside_p99 = loopback::ms(crate::quantile(&outside, 0.99));
    let over = |d: Duration| {
        if during.is_empty() || outside_p99 <= 0.0 {
            Value::Null
        } else {
            json!(round(loopback::ms(d) / outside_p99, 2))
        }
    };
    json!({
        "asked": asked,
        "done": load.windows.len(),
        "windows_ms": load.windows.iter().map(|(s, e)| round(loopback::ms(*e - *s), 1)).collect::<Vec<_>>(),
        "turns_during": during.len(),
        "turns_outside": outside.len(),
        "during": if during.is_empty() { Value::Null } else { latency(&during) },
        "outside": latency(&outside),
        "max_over_outside_p99": over(crate::quantile(&during, 1.0)),
        "p99_over_outside_p99": over(crate::quantile(&during, 0.99)),
    })
}

/// The reloads to trigger during a load.
struct Reload {
    config: PathBuf,
    count: usize,
}

/// How long the load runs before the first reload, and between a reload's end and the
/// next write: turns outside reloads to compare with.
const RELOAD_GAP: Duration = Duration::from_millis(1000);
/// The most a reload may take to show in `/metrics` (its debounce is 300 ms; a debug
/// build on a saturated machine took over 30 s to load, check and swap, and to answer a
/// scrape behind 64 clients' turns).
const RELOAD_TIMEOUT: Duration = Duration::from_secs(120);

/// Triggers `reload.count` reloads one after another on the serve at `addr` until `done`,
/// each by rewriting the configuration with one more comment line (an equivalent chain,
/// a changed file); the window of each, from the write to `/metrics` counting it.
async fn reloader(
    client: HttpClient,
    addr: String,
    reload: Reload,
    done: Rc<Cell<bool>>,
) -> Result<Vec<(Instant, Instant)>> {
    let text =
        std::fs::read_to_string(&reload.config).map_err(|e| format!("{}: {e}", reload.config.display()))?;
    let url = format!("http://{addr}/metrics");
    // One scrape: the reloads swapped in and refused.
    let reloads = || {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let page = loopback::request(&client, Method::GET, &url, Bytes::new()).await?;
            let page = String::from_utf8_lossy(&page.body).into_owned();
            let count = |outcome: &str| {
                loopback::metric(&page, &format!("history_reloads_total{{outcome=\"{outcome}\"}}"))
                    .ok_or_else(|| format!("no history_reloads_total{{outcome=\"{outcome}\"}} in /metrics"))
            };
            Ok::<_, String>((count("ok")?, count("failed")?))
        }
    };
    let mut windows = Vec::new();
    for n in 0..reload.count {
        tokio::time::sleep(RELOAD_GAP).await;
        if done.get() {
            break;
        }
        let (ok, failed) = reloads().await?;
        let started = Instant::now();
        write_atomically(&reload.config, &format!("{text}# bench reload {}\n", n + 1))?;
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let (now_ok, now_failed) = reloads().await?;
            if now_ok > ok {
                break;
            }
            if now_failed > failed {
                return Err(format!("reload {} was refused: see the serve log", n + 1));
            }
            if started.elapsed() > RELOAD_TIMEOUT {
                return Err(format!(
                    "reload {} did not show in /metrics within {RELOAD_TIMEOUT:?}",
                    n + 1
                ));
            }
        }
        windows.push((started, Instant::now()));
    }
    Ok(windows)
}

/// Replaces `file` through a rename, as agentctl does: the watch never reads half a file.
fn write_atomically(file: &Path, text: &str) -> Result<()> {
    let temporary = file.with_extension("toml.tmp");
    std::fs::write(&temporary, text).map_err(|e| format!("{}: {e}", temporary.display()))?;
    std::fs::rename(&temporary, file).map_err(|e| format!("{}: {e}", file.display()))
}

/// What the clients measured.
struct Load {
    latencies: Vec<Duration>,
    /// When each turn of `latencies` was sent.
    sent: Vec<Instant>,
    /// The reloads' windows, from the write to `/metrics` counting the reload.
    windows: Vec<(Instant, Instant)>,
    elapsed: Duration,
    create: Duration,
    capped: bool,
    errors: usize,
    first_error: Option<String>,
    messages: usize,
    /// PostgreSQL round trips of every host while the turns ran (0 with SQLite).
    round_trips: u64,
    /// The open loop only: each turn's latency from when it left (`latencies` counts
    /// from its slot), and the turns that left late, behind their session's previous one.
    from_send: Vec<Duration>,
    sent_late: usize,
}

impl Load {
    fn empty() -> Load {
        Load {
            latencies: Vec::new(),
            sent: Vec::new(),
            windows: Vec::new(),
            elapsed: Duration::ZERO,
            create: Duration::ZERO,
            capped: false,
            errors: 0,
            first_error: None,
            messages: 0,
            round_trips: 0,
            from_send: Vec::new(),
            sent_late: 0,
        }
    }

    /// Adds one client's (or session's) part.
    fn absorb(&mut self, part: Load) {
        self.latencies.extend(part.latencies);
        self.sent.extend(part.sent);
        self.from_send.extend(part.from_send);
        self.sent_late += part.sent_late;
        self.capped |= part.capped;
        self.errors += part.errors;
        if self.first_error.is_none() {
            self.first_error = part.first_error;
        }
    }
}

/// The PostgreSQL round trips the hosts at `addrs` made so far, summed
/// (`history_store_round_trips_total` on their `/metrics`).
async fn round_trips(client: &HttpClient, addrs: &[String]) -> Result<u64> {
    let mut total = 0;
    for addr in addrs {
        let answer = loopback::request(
            client,
            Method::GET,
            &format!("http://{addr}/metrics"),
            Bytes::new(),
        )
        .await?;
        let text = String::from_utf8_lossy(&answer.body);
        total += text
            .lines()
            .find_map(|line| line.strip_prefix("history_store_round_trips_total "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                format!(
                    "{addr}/metrics has no history_store_round_trips_total: {}",
                    answer.describe()
                )
            })?;
    }
    Ok(total)
}

/// One session's turns, as request bodies asking for the answer in `answer`'s shape.
fn session_turns(seed: u64, turns: usize, answer: Answer) -> Vec<Bytes> {
    let history = generate(turns, seed);
    split_turns(history, |m: &Value| m["role"] == "user")
        .into_iter()
        .take(turns)
        .map(|messages| {
            let mut body = json!({ "messages": messages });
            if matches!(answer, Answer::Provider | Answer::ProviderDelta) {
                body["form"] = json!("provider");
            }
            if matches!(answer, Answer::Delta | Answer::ProviderDelta) {
                body["delta"] = json!(true);
            }
            Bytes::from(body.to_string())
        })
        .collect()
}

/// `--answer`: the shape the clients ask a turn's answer in (docs/http-api.md#forms,
/// docs/http-api.md#deltas).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Answer {
    /// The whole sent history with the host's metadata (the default).
    #[default]
    Full,
    Provider,
    /// The full form as a delta against the previous answer.
    Delta,
    ProviderDelta,
}

impl Answer {
    fn parse(name: &str) -> Result<Answer> {
        match name {
            "full" => Ok(Answer::Full),
            "provider" => Ok(Answer::Provider),
            "delta" => Ok(Answer::Delta),
            "provider-delta" => Ok(Answer::ProviderDelta),
            other => Err(format!(
                "--answer {other}: expected full, provider, delta or provider-delta"
            )),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Answer::Full => "full",
            Answer::Provider => "provider",
            Answer::Delta => "delta",
            Answer::ProviderDelta => "provider-delta",
        }
    }
}

/// Creates every session, then runs the turns: `clients` tasks, each sending the turns of
/// its sessions (session `s` belongs to client `s % clients`) round by round, one request
/// at a time; turn `t` of session `s` goes to host `(s + t) % hosts`.
async fn drive(addrs: &[String], case: &Case, cap: Duration, reload: Option<Reload>) -> Result<Load> {
    // Built before the clock starts: generating is the bench's work, not the server's.
    let bodies: Vec<Vec<Bytes>> = (0..case.sessions)
        .map(|s| session_turns(s as u64 + 1, case.turns, case.answer))
        .collect();
    let messages = bodies
        .iter()
        .flatten()
        .map(|b| {
            serde_json::from_slice::<Value>(b).map_or(0, |v| v["messages"].as_array().map_or(0, Vec::len))
        })
        .sum();
    let client = http_client(case.clients);
    let started = Instant::now();
    let mut ids = vec![String::new(); case.sessions];
    for (s, id) in ids.iter_mut().enumerate() {
        let url = format!("http://{}/v1/sessions", addrs[s % addrs.len()]);
        let answer = loopback::request(&client, Method::POST, &url, Bytes::from_static(b"{}")).await?;
        if answer.status != 201 {
            return Err(format!("creating a session: {}", answer.describe()));
        }
        *id = answer.json()["id"]
            .as_str()
            .ok_or("no id in the create answer")?
            .to_string();
    }
    let create = started.elapsed();
    let bodies = Rc::new(bodies);
    let ids = Rc::new(ids);
    let addrs = Rc::new(addrs.to_vec());
    let trips_before = round_trips(&client, &addrs).await?;
    let deadline = Instant::now() + cap;
    let sticky = case.sticky;
    let started = Instant::now();
    let local = tokio::task::LocalSet::new();
    let mut tasks = Vec::new();
    match case.rate {
        Some(rate) => {
            let schedule = open_loop::Schedule {
                start: started,
                rate,
                sessions: case.sessions,
                deadline,
            };
            for s in 0..case.sessions {
                tasks.push(local.spawn_local(open_loop::session_loop(
                    client.clone(),
                    addrs.clone(),
                    ids[s].clone(),
                    bodies[s].clone(),
                    s,
                    sticky,
                    schedule,
                )));
            }
        }
        None => {
            for c in 0..case.clients {
                let (client, bodies, ids, addrs) =
                    (client.clone(), bodies.clone(), ids.clone(), addrs.clone());
                let sessions: Vec<usize> = (c..case.sessions).step_by(case.clients).collect();
                tasks.push(local.spawn_local(async move {
                    client_loop(&client, &addrs, &ids, &bodies, &sessions, sticky, deadline).await
                }));
            }
        }
    }
    let done = Rc::new(Cell::new(false));
    let reloader = reload
        .map(|reload| local.spawn_local(reloader(client.clone(), addrs[0].clone(), reload, done.clone())));
    let mut load = Load {
        create,
        messages,
        ..Load::empty()
    };
    local
        .run_until(async {
            for task in tasks {
                load.absorb(task.await.map_err(|e| e.to_string())?);
            }
            load.elapsed = started.elapsed();
            done.set(true);
            if let Some(reloader) = reloader {
                load.windows = reloader.await.map_err(|e| e.to_string())??;
            }
            Ok::<_, String>(())
        })
        .await?;
    load.round_trips = round_trips(&client, &addrs).await? - trips_before;
    Ok(load)
}

/// One client's share of the turns: round by round over its sessions.
async fn client_loop(
    client: &HttpClient,
    addrs: &[String],
    ids: &[String],
    bodies: &[Vec<Bytes>],
    sessions: &[usize],
    sticky: bool,
    deadline: Instant,
) -> Load {
    let mut load = Load::empty();
    let rounds = sessions.iter().map(|&s| bodies[s].len()).max().unwrap_or(0);
    for turn in 0..rounds {
        for &s in sessions {
            let Some(body) = bodies[s].get(turn) else { continue };
            if Instant::now() > deadline {
                load.capped = true;
                return load;
            }
            let url = format!(
                "http://{}/v1/sessions/{}/turns",
                addrs[if sticky { s } else { s + turn } % addrs.len()],
                ids[s]
            );
            let sent = Instant::now();
            let answer = loopback::request(client, Method::POST, &url, body.clone()).await;
            let took = sent.elapsed();
            match answer {
                Ok(answer) if answer.status == 200 => {
                    load.latencies.push(took);
                    load.sent.push(sent);
                }
                Ok(answer) => {
                    load.errors += 1;
                    load.first_error.get_or_insert_with(|| answer.describe());
                }
                Err(e) => {
                    load.errors += 1;
                    load.first_error.get_or_insert(e);
                }
            }
        }
    }
    load
}

fn print_table(r: &Value) {
    println!(
        "store: {}   hosts: {} ({})   answers: {}   machine before: {}   after: {}",
        r["store"], r["hosts"], r["routing"], r["answer"], r["machine_before"], r["machine_after"]
    );
    println!(
        "targets: ≥ 2000 turns/s, p99 ≤ 20 ms, peak RSS ≤ 300 MB with 1000 live sessions; \
         host CPU ≤ 0.5 ms a turn; open loop at 1000 turns/s, 64 sessions: p99 ≤ 20 ms from the slot"
    );
    for case in r["cases"].as_array().into_iter().flatten() {
        println!();
        println!(
            "{}: {} sessions, {} clients, {} turns each",
            case["case"], case["sessions"], case["clients"], case["turns_per_session"]
        );
        for name in ["chain", "floor"] {
            let run = &case[name];
            println!(
                "  {name:<6} {:>8} turns/s   p50 {:>8} ms   p99 {:>8} ms   max {:>8} ms   peak RSS {:>7} MB   {} turns in {} s{}{}",
                run["turns_per_s"],
                run["latency"]["p50_ms"],
                run["latency"]["p99_ms"],
                run["latency"]["max_ms"],
                run["peak_rss_mb"],
                run["turns"],
                run["seconds"],
                if run["capped"] == true { " (time cap reached)" } else { "" },
                if run["errors"].as_u64().unwrap_or(0) > 0 {
                    format!("   {} errors, first: {}", run["errors"], run["first_error"])
                } else {
                    String::new()
                }
            );
        }
        println!("  chain/floor: {}", case["chain_over_floor"]);
        for name in ["chain", "floor"] {
            println!(
                "  CPU ms per turn, {name}: {}",
                cpu_line(&case[name]["cpu_ms_per_turn"])
            );
        }
        for name in ["chain", "floor"] {
            let open = &case[name]["open_loop"];
            if !open.is_null() {
                println!(
                    "  open loop, {name}: {} turns/s offered; latency from the slot above; from the send p50 {} ms   p99 {} ms; {} sent late",
                    open["rate"], open["latency_from_send"]["p50_ms"], open["latency_from_send"]["p99_ms"], open["sent_late"]
                );
            }
            let counted = &case[name]["instructions"];
            if !counted.is_null() {
                println!(
                    "  instructions per turn, {name}: {} (callgrind, {} turns on {} sessions)",
                    counted["per_turn"], counted["turns"], counted["sessions"]
                );
            }
        }
        if r["store"] == "postgres" {
            println!(
                "  PostgreSQL round trips per turn: chain {}   floor {}",
                case["chain"]["store_round_trips_per_turn"], case["floor"]["store_round_trips_per_turn"]
            );
        }
        let lite = &case["sqlite_one_host"];
        if !lite.is_null() {
            println!("  the same load on ONE host with SQLite (same run):");
            for name in ["chain", "floor"] {
                let run = &lite[name];
                println!(
                    "  {name:<6} {:>8} turns/s   p50 {:>8} ms   p99 {:>8} ms   {} turns in {} s{}",
                    run["turns_per_s"],
                    run["latency"]["p50_ms"],
                    run["latency"]["p99_ms"],
                    run["turns"],
                    run["seconds"],
                    if run["errors"].as_u64().unwrap_or(0) > 0 {
                        format!("   {} errors, first: {}", run["errors"], run["first_error"])
                    } else {
                        String::new()
                    }
                );
            }
            for name in ["chain", "floor"] {
                println!(
                    "  CPU ms per turn, {name}: {}",
                    cpu_line(&lite[name]["cpu_ms_per_turn"])
                );
            }
            println!(
                "  {} hosts on PostgreSQL / one host on SQLite, turns/s: {} (target ≥ 0.7 with the chain)",
                r["hosts"], lite["postgres_over_sqlite_turns_per_s"]
            );
        }
    }
}

/// `hosts 0.61   database 0.48   clients 0.2` (the database only where there is one).
fn cpu_line(cpu: &Value) -> String {
    ["hosts", "database", "clients"]
        .iter()
        .filter(|part| !cpu[**part].is_null())
        .map(|part| format!("{part} {}", cpu[*part]))
        .collect::<Vec<_>>()
        .join("   ")
}

/// A fresh PostgreSQL database per run, made through the server `--store` names and
/// dropped after: the bench's sessions never mix with anything else there.
mod postgres {
    use crate::Result;

    pub struct Database {
        server: String,
        name: String,
        pub url: String,
    }

    impl Database {
        pub fn create(server: &str, label: &str) -> Result<Database> {
            let name = format!("history_bench_{}_{label}", std::process::id());
            let mut client = ::postgres::Client::connect(server, ::postgres::NoTls)
                .map_err(|e| format!("--store: cannot reach PostgreSQL: {e}"))?;
            client
                .batch_execute(&format!("CREATE DATABASE {name}"))
                .map_err(|e| format!("--store: cannot create database {name}: {e}"))?;
            Ok(Database {
                url: with_database(server, &name),
                server: server.to_string(),
                name,
            })
        }

        pub fn drop_it(self) -> Result<()> {
            let mut client = ::postgres::Client::connect(&self.server, ::postgres::NoTls)
                .map_err(|e| format!("cannot reach PostgreSQL: {e}"))?;
            client
                .batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name))
                .map_err(|e| format!("cannot drop database {}: {e}", self.name))
        }
    }

    /// `url` with its database replaced by `database`.
    pub(super) fn with_database(url: &str, database: &str) -> String {
        let (base, query) = match url.split_once('?') {
            Some((base, query)) => (base, Some(query)),
            None => (url, None),
        };
        let scheme_end = base.find("://").map_or(0, |i| i + 3);
        let host_end = base[scheme_end..]
            .find('/')
            .map_or(base.len(), |i| scheme_end + i);
        let mut out = format!("{}/{database}", &base[..host_end]);
        if let Some(query) = query {
            out.push('?');
            out.push_str(query);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sessions_turns_start_at_user_messages_and_are_bounded() {
        let turns = session_turns(3, 5, Answer::Full);
        assert_eq!(turns.len(), 5);
        for body in &turns {
            let value: Value = serde_json::from_slice(body).unwrap();
            let messages = value["messages"].as_array().unwrap();
            assert!(messages.iter().any(|m| m["role"] == "user"), "{value}");
        }
    }

    #[test]
    fn a_database_is_named_in_the_url() {
        assert_eq!(
            postgres::with_database("postgres://u@h:5432/test?sslmode=disable", "b"),
            "postgres://u@h:5432/b?sslmode=disable"
        );
    }
}
