//! `history-bench proxy` (`cargo xtask bench proxy`): what the OpenAI-compatible proxy
//! (docs/proxy.md) adds to a chat completion. A stand-in upstream runs inside the bench (a
//! hyper server on a free loopback port that reads each request whole and answers at once,
//! plain JSON or a server-sent event stream), a real `history-host serve --upstream` (the
//! shipped chain) sits in front of it, and the same requests go to both: the direct calls
//! are the floor. The request is an agent's resent conversation of realistic size (a
//! generated 200-message history, about 200 KB), sent again and again as agents do.
//!
//! Measured, each beside the direct call in the same run:
//! - **latency**: one client, requests one after another (direct and proxied alternating
//!   in blocks): p50/p99, and the proxy's added p50/p99;
//! - **throughput**: `--clients` concurrent clients (default 32): requests per second;
//! - **first byte**: `"stream": true`, time to the first byte of the body;
//! - **token cache**: `/metrics` before and after: the bytes tokenized by the first request
//!   and by every request after it (0: a resent conversation is not tokenized again).

use std::convert::Infallible;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use history_bench::generate_messages;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

use crate::loopback::{self, http_client, latency, ms, round, HttpClient, Serve};
use crate::{check_flags, flag, Result};

/// Messages of the resent conversation.
const CONVERSATION_MESSAGES: usize = 200;
/// Requests in one block of the alternating latency measurement.
pub(crate) const BLOCK: usize = 10;

pub fn proxy(args: &[String]) -> Result<()> {
    check_flags(
        args,
        &[
            "--host",
            "--plugin-dir",
            "--requests",
            "--clients",
            "--time-cap",
            "--wire",
        ],
        &["--json"],
    )?;
    let json_out = args.iter().any(|a| a == "--json");
    let host: PathBuf = flag(args, "--host")?.ok_or("--host is required")?;
    let plugin_dir: PathBuf = flag(args, "--plugin-dir")?.ok_or("--plugin-dir is required")?;
    let requests: usize = flag(args, "--requests")?.unwrap_or(500);
    let clients: usize = flag(args, "--clients")?.unwrap_or(32);
    let cap = Duration::from_secs(flag(args, "--time-cap")?.unwrap_or(120u64));
    // Other wires measured too, beside the chat wire: `responses` (docs/proxy.md#responses),
    // `anthropic` (docs/proxy.md#anthropic-messages), `all` both.
    let wires: &[Wire] = match flag::<String>(args, "--wire")?.as_deref() {
        None | Some("chat") => &[],
        Some("responses") => &[Wire::Responses],
        Some("anthropic") => &[Wire::Anthropic],
        Some("all") => &[Wire::Responses, Wire::Anthropic],
        Some(other) => {
            return Err(format!(
                "--wire: chat, responses, anthropic or all, not {other:?}"
            ))
        }
    };
    if requests == 0 || clients == 0 {
        return Err("--requests and --clients must be at least 1".into());
    }
    let machine_before = loopback::machine();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let standin = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .map_err(|e| format!("cannot bind the stand-in upstream: {e}"))?;
    let standin_addr = standin.local_addr().map_err(|e| e.to_string())?;
    runtime.spawn(serve_standin(standin));

    let stages = loopback::shipped_stages(&plugin_dir)?;
    let config = loopback::write_config(&plugin_dir, &stages, "proxy", "")?;
    let work = plugin_dir.join(format!("proxy-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let store = work.join("sessions.db").display().to_string();
    let upstream = format!("http://{standin_addr}/v1");
    let server = Serve::start(
        &host,
        &config,
        &["--store", &store, "--upstream", &upstream],
        &work.join("serve.log"),
    )?;
    let measured = runtime.block_on(measure(&server, &upstream, requests, clients, cap, wires));
    let peak_rss = server.peak_rss_mb();
    server.stop()?;
    let _ = std::fs::remove_dir_all(&work);
    let mut report = measured?;
    report["stages"] = json!(stages);
    report["serve_peak_rss_mb"] = json!(round(peak_rss?, 1));
    report["machine_before"] = machine_before;
    report["machine_after"] = loopback::machine();
    report["targets"] = json!({"added_p50_ms": 2, "added_p99_ms": 5, "requests_per_s_at_32_clients": 1000, "first_byte_added_ms": 1});
    if json_out {
        println!("{report}");
    } else {
        print_table(&report);
    }
    Ok(())
}

/// A wire measured beside the chat wire.
#[derive(Debug, Clone, Copy)]
enum Wire {
    Responses,
    Anthropic,
}

/// The stand-in upstream: every connection served by hyper, every answer at once.
async fn serve_standin(listener: tokio::net::TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service_fn(standin_answer))
                .await;
        });
    }
}

const COMPLETION: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"default","choices":[{"index":0,"message":{"role":"assistant","content":"Done: the tests pass."},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":5,"total_tokens":6}}"#;
const STREAM: &str = concat!(
    "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Done\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\": the tests pass.\"},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n",
);

/// Reads the request whole (as a real upstream must), then answers: a stream when the
/// body asks for one (`"stream":true` near either end: the member's place in the JSON
/// object), else the plain completion.
async fn standin_answer(
    request: Request<Incoming>,
) -> std::result::Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path().to_string();
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let responses = path.ends_with("/responses");
    let anthropic = path.ends_with("/messages");
    let edge = |part: &[u8]| part.windows(13).any(|w| w == b"\"stream\":true");
    let streamed = edge(&body[..body.len().min(200)]) || edge(&body[body.len().saturating_sub(200)..]);
    let (kind, text) = if responses {
        ("application/json", crate::proxy_responses::RESPONSE)
    } else if anthropic {
        ("application/json", crate::proxy_anthropic::MESSAGE)
    } else if streamed {
        ("text/event-stream", STREAM)
    } else {
        ("application/json", COMPLETION)
    };
    Ok(Response::builder()
        .header("content-type", kind)
        .body(Full::new(Bytes::from_static(text.as_bytes())))
        .expect("a valid response"))
}

/// Time to the answer's end, or to its first body byte.
pub(crate) async fn timed(
    client: &HttpClient,
    url: &str,
    body: &Bytes,
    first_byte: bool,
) -> Result<Duration> {
    let request = Request::builder()
        .method(Method::POST)
        .uri(url)
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-bench")
        .body(Full::new(body.clone()))
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let response = client.request(request).await.map_err(|e| format!("{url}: {e}"))?;
    if !response.status().is_success() {
        let status = response.status();
        let text = response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Err(format!(
            "{url}: status {status}: {}",
            String::from_utf8_lossy(&text)
        ));
    }
    let mut body = response.into_body();
    let mut took = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("{url}: {e}"))?;
        if first_byte && took.is_none() && frame.data_ref().is_some_and(|d| !d.is_empty()) {
            took = Some(started.elapsed());
        }
    }
    Ok(took.unwrap_or_else(|| started.elapsed()))
}

/// `n` requests to each of `a` and `b`, alternating in blocks of [`BLOCK`].
pub(crate) async fn alternating(
    client: &HttpClient,
    a: &str,
    b: &str,
    body: &Bytes,
    n: usize,
    first_byte: bool,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut on_a, mut on_b) = (Vec::with_capacity(n), Vec::with_capacity(n));
    while on_a.len() < n {
        for _ in 0..BLOCK.min(n - on_a.len()) {
            on_a.push(timed(client, a, body, first_byte).await?);
        }
        for _ in 0..BLOCK.min(n - on_b.len()) {
            on_b.push(timed(client, b, body, first_byte).await?);
        }
    }
    Ok((on_a, on_b))
}

/// `clients` concurrent clients sending `per_client` requests each to `url` (within `cap`):
/// requests per second and the latencies.
async fn concurrent(
    client: &HttpClient,
    url: &str,
    body: &Bytes,
    clients: usize,
    per_client: usize,
    cap: Duration,
) -> Result<Value> {
    let deadline = Instant::now() + cap;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (client, url, body) = (client.clone(), url.to_string(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::with_capacity(per_client);
            for _ in 0..per_client {
                if Instant::now() > deadline {
                    break;
                }
                took.push(timed(&client, &url, &body, false).await?);
            }
            Ok::<_, String>(took)
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.map_err(|e| e.to_string())??);
    }
    let elapsed = started.elapsed();
    Ok(json!({
        "requests": all.len(),
        "seconds": round(elapsed.as_secs_f64(), 3),
        "requests_per_s": round(all.len() as f64 / elapsed.as_secs_f64().max(1e-9), 1),
        "latency": latency(&all),
        "capped": all.len() < clients * per_client,
    }))
}

async fn metrics(client: &HttpClient, server: &Serve) -> Result<String> {
    let answer = loopback::request(client, Method::GET, &server.url("/metrics"), Bytes::new()).await?;
    String::from_utf8(answer.body.to_vec()).map_err(|e| e.to_string())
}

/// The token-cache figures between two `/metrics` pages.
fn tokenized(before: &str, after: &str) -> Value {
    let delta = |name: &str| {
        loopback::metric(after, name).unwrap_or(0.0) - loopback::metric(before, name).unwrap_or(0.0)
    };
    json!({
        "bytes_tokenized": delta("history_tokens_counted_bytes_total"),
        "cache_hits": delta("history_token_cache_lookups_total{result=\"hit\"}"),
        "cache_misses": delta("history_token_cache_lookups_total{result=\"miss\"}"),
    })
}

async fn measure(
    server: &Serve,
    upstream: &str,
    requests: usize,
    clients: usize,
    cap: Duration,
    wires: &[Wire],
) -> Result<Value> {
    let direct = &format!("{upstream}/chat/completions");
    let conversation = generate_messages(CONVERSATION_MESSAGES, 1);
    let messages = conversation.len();
    let request = |stream: bool| {
        Bytes::from(
            json!({"model": "default", "stream": stream, "temperature": 0.2, "messages": conversation})
                .to_string(),
        )
    };
    let (plain, streamed) = (request(false), request(true));
    let proxied = server.url("/v1/chat/completions");
    let client = http_client(clients * 2);

    // The first request counts the conversation's tokens; none after it should.
    let start = metrics(&client, server).await?;
    timed(&client, &proxied, &plain, false).await?;
    let after_first = metrics(&client, server).await?;
    for _ in 0..BLOCK {
        timed(&client, direct, &plain, false).await?;
    }

    let (direct_seq, proxied_seq) = alternating(&client, direct, &proxied, &plain, requests, false).await?;
    let per_client = requests.div_ceil(clients).max(20);
    let direct_many = concurrent(&client, direct, &plain, clients, per_client, cap).await?;
    let proxied_many = concurrent(&client, &proxied, &plain, clients, per_client, cap).await?;
    let (direct_first, proxied_first) =
        alternating(&client, direct, &proxied, &streamed, requests.min(200), true).await?;
    let end = metrics(&client, server).await?;

    let quantile = |s: &[Duration], q: f64| history_bench::quantile(s, q);
    let added = |a: &[Duration], b: &[Duration], q: f64| round(ms(quantile(b, q)) - ms(quantile(a, q)), 3);
    let throughput_ratio = direct_many["requests_per_s"].as_f64().unwrap_or(0.0)
        / proxied_many["requests_per_s"].as_f64().unwrap_or(1.0).max(1e-9);
    let others = match wires {
        [] => Value::Null,
        wires => {
            let wires: Vec<crate::proxy_responses::Wire> = wires
                .iter()
                .map(|wire| match wire {
                    Wire::Responses => crate::proxy_responses::Wire {
                        name: "responses",
                        path: "/responses",
                        body: crate::proxy_responses::request(&conversation),
                    },
                    Wire::Anthropic => crate::proxy_responses::Wire {
                        name: "anthropic",
                        path: "/messages",
                        body: crate::proxy_anthropic::request(&conversation),
                    },
                })
                .collect();
            crate::proxy_responses::measure(&client, server, upstream, &plain, &wires, requests).await?
        }
    };
    Ok(json!({
        "wires": others,
        "conversation": {"messages": messages, "request_bytes": plain.len()},
        "latency": {
            "requests": requests,
            "direct": latency(&direct_seq),
            "proxy": latency(&proxied_seq),
            "added_p50_ms": added(&direct_seq, &proxied_seq, 0.5),
            "added_p99_ms": added(&direct_seq, &proxied_seq, 0.99),
        },
        "throughput": {
            "clients": clients,
            "direct": direct_many,
            "proxy": proxied_many,
            "direct_over_proxy": round(throughput_ratio, 3),
        },
        "first_byte": {
            "requests": direct_first.len(),
            "direct": latency(&direct_first),
            "proxy": latency(&proxied_first),
            "added_p50_ms": added(&direct_first, &proxied_first, 0.5),
            "added_p99_ms": added(&direct_first, &proxied_first, 0.99),
        },
        "token_cache": {
            "first_request": tokenized(&start, &after_first),
            "every_request_after": tokenized(&after_first, &end),
            "entries": loopback::metric(&end, "history_token_cache_entries"),
        },
    }))
}

fn print_table(r: &Value) {
    println!(
        "proxy bench: chain {}   machine before: {}   after: {}",
        r["stages"], r["machine_before"], r["machine_after"]
    );
    println!(
        "conversation: {} messages, {} bytes per request; stand-in upstream in the bench, answering at once",
        r["conversation"]["messages"], r["conversation"]["request_bytes"]
    );
    let l = &r["latency"];
    println!();
    println!(
        "latency, one client, {} requests each (direct and proxied alternating):",
        l["requests"]
    );
    print_direct_proxy_added(l, "   (targets ≤ 2, ≤ 5)");
    let t = &r["throughput"];
    println!();
    println!("throughput, {} concurrent clients:", t["clients"]);
    for name in ["direct", "proxy"] {
        println!(
            "  {name:<8} {:>8} requests/s   p50 {:>8} ms   p99 {:>8} ms   ({} requests in {} s)",
            t[name]["requests_per_s"],
            t[name]["latency"]["p50_ms"],
            t[name]["latency"]["p99_ms"],
            t[name]["requests"],
            t[name]["seconds"]
        );
    }
    let f = &r["first_byte"];
    println!();
    println!("first streamed byte, {} requests each:", f["requests"]);
    print_direct_proxy_added(f, "");
    let c = &r["token_cache"];
    println!();
    println!("token cache: first request {}", c["first_request"]);
    println!("             every request after it {}", c["every_request_after"]);
    let wires = r["wires"].as_object();
    if wires.is_some() {
        println!();
        println!("the wires interleaved (chat first, each wire's direct and proxied calls in blocks):");
    }
    for (name, w) in wires.into_iter().flatten() {
        println!();
        println!(
            "{name} wire ({}), {} requests each, {} bytes per request:",
            w["path"], w["requests"], w["request_bytes"]
        );
        print_direct_proxy_added(w, "");
        if name == "chat" {
            continue;
        }
        println!(
            "  added over the chat wire's: p50 {}×  p99 {}×   (target ≤ 1.2×)",
            w["added_p50_over_chat"], w["added_p99_over_chat"]
        );
    }
    println!("serve peak RSS {} MB", r["serve_peak_rss_mb"]);
}

/// A section's direct and proxied p50/p99, and what the proxy added (`note` after it).
fn print_direct_proxy_added(section: &Value, note: &str) {
    for name in ["direct", "proxy"] {
        println!(
            "  {name:<8} p50 {:>8} ms   p99 {:>8} ms",
            section[name]["p50_ms"], section[name]["p99_ms"]
        );
    }
    println!(
        "  added    p50 {:>8} ms   p99 {:>8} ms{note}",
        section["added_p50_ms"], section["added_p99_ms"]
    );
}
