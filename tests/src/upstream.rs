//! A stand-in OpenAI-compatible upstream for the proxy's tests: a small HTTP/1.1 server on
//! a free loopback port, one thread per connection, that records every request (headers
//! and body) and answers a chat completion plainly, or, for `"stream": true`, as
//! server-sent events written one at a time with a gap between them. A request whose
//! `model` is `"slow"` gets no answer for `slow` (past the proxy's timeout). The time each
//! streamed chunk was written is recorded (seconds since the Unix epoch), so a test can
//! show a client got a chunk before the upstream finished. [`Upstream::start_tls`] serves
//! the same over TLS (rustls), with a certificate the test made. `POST /v1/responses` is
//! checked and answered as OpenAI's Responses API would ([`crate::responses_upstream`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

/// One request the upstream received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// The running stand-in; it stops accepting when dropped.
pub struct Upstream {
    pub addr: String,
    /// `http` or `https`.
    scheme: &'static str,
    pub received: Arc<Mutex<Vec<Received>>>,
    /// When each streamed chunk was written, per streamed request.
    pub chunk_times: Arc<Mutex<Vec<Vec<f64>>>>,
    stop: Arc<AtomicBool>,
}

/// How the stand-in answers.
#[derive(Debug, Clone, Copy)]
pub struct Behaviour {
    /// Chunks of a streamed answer.
    pub chunks: usize,
    /// The gap between two streamed chunks.
    pub gap: Duration,
    /// How long a `"model": "slow"` request waits before its answer.
    pub slow: Duration,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            chunks: 5,
            gap: Duration::from_millis(300),
            slow: Duration::from_secs(5),
        }
    }
}

/// The plain answer's body for a request on `model`.
pub fn completion(model: &str, content: &str) -> Value {
    json!({
        "id": "chatcmpl-standin",
        "object": "chat.completion",
        "created": 1_700_000_000u64,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": "stop"
        }],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    })
}

/// What OpenAI refuses in a chat request's `messages`, as it words it: a `tool` message
/// that answers no call of the assistant message before it, or an assistant's call left
/// without its result before the next message of another kind.
pub fn chat_problem(request: &Value) -> Option<String> {
    let messages = request["messages"].as_array()?;
    let mut open: Vec<String> = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        match message["role"].as_str() {
            Some("tool") => {
                let id = message["tool_call_id"].as_str().unwrap_or("");
                match open.iter().position(|call| call == id) {
                    Some(at) => {
                        open.remove(at);
                    }
                    None => {
                        return Some(format!(
                            "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls' (messages.[{index}])"
                        ))
                    }
                }
            }
            _ => {
                if !open.is_empty() {
                    return Some(format!(
                        "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {} (messages.[{index}])",
                        open.join(", ")
                    ));
                }
                open = message["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|call| call["id"].as_str().map(str::to_string))
                    .collect();
            }
        }
    }
    None
}

/// The model `recall-agent` (docs/mcp.md#the-proxy): offered `expand_message`, it calls
/// it for the first placeholder that names one (`… expand_message with id "ID" …`);
/// given the call's result, it answers with what the result said.
fn recall_agent(request: &Value) -> Value {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let offered = request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|tool| tool["function"]["name"] == "expand_message");
    let mut answer = completion("recall-agent", "");
    if let Some(last) = messages.last().filter(|m| m["role"] == "tool") {
        answer["choices"][0]["message"]["content"] =
            json!(format!("recalled: {}", last["content"].as_str().unwrap_or("")));
        return answer;
    }
    let wanted = messages.iter().find_map(|m| {
        let text = m["content"].as_str()?;
        let rest = text.split("expand_message with id \"").nth(1)?;
        Some(rest.split('"').next()?.to_string())
    });
    match (offered, wanted) {
        (true, Some(id)) => {
            answer["choices"][0]["message"] = json!({
                "role": "assistant",
                "content": null,
                "tool_calls": [{"id": "call_recall_1", "type": "function",
                    "function": {"name": "expand_message", "arguments": json!({"id": id}).to_string()}}],
            });
            answer["choices"][0]["finish_reason"] = json!("tool_calls");
        }
        _ => answer["choices"][0]["message"]["content"] = json!("nothing to recall"),
    }
    answer
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A certificate chain (DER, the server's first) and its private key (PKCS#8 DER).
pub struct TlsIdentity {
    pub chain: Vec<Vec<u8>>,
    pub key: Vec<u8>,
}

impl Upstream {
    pub fn start(behaviour: Behaviour) -> Upstream {
        Upstream::listen(behaviour, None)
    }

    /// The same stand-in over TLS, presenting `identity`.
    pub fn start_tls(behaviour: Behaviour, identity: TlsIdentity) -> Upstream {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                identity.chain.into_iter().map(CertificateDer::from).collect(),
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(identity.key)),
            )
            .unwrap();
        Upstream::listen(behaviour, Some(Arc::new(config)))
    }

    fn listen(behaviour: Behaviour, tls: Option<Arc<rustls::ServerConfig>>) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let upstream = Upstream {
            addr,
            scheme: if tls.is_some() { "https" } else { "http" },
            received: Arc::default(),
            chunk_times: Arc::default(),
            stop: Arc::default(),
        };
        let (received, times, stop) = (
            upstream.received.clone(),
            upstream.chunk_times.clone(),
            upstream.stop.clone(),
        );
        accept(listener, stop, move |stream| {
            let (received, times, tls) = (received.clone(), times.clone(), tls.clone());
            move || {
                let _ = match tls {
                    None => serve(&mut { stream }, behaviour, &received, &times),
                    // A handshake the client refuses ends here, with an error.
                    Some(config) => match rustls::ServerConnection::new(config) {
                        Ok(connection) => {
                            let mut tls = rustls::StreamOwned::new(connection, stream);
                            let served = serve(&mut tls, behaviour, &received, &times);
                            // A stream's end is the connection's close: said over TLS
                            // first, or the client sees a truncation.
                            tls.conn.send_close_notify();
                            let _ = tls.flush();
                            served
                        }
                        Err(e) => Err(std::io::Error::other(e)),
                    },
                };
            }
        });
        upstream
    }

    /// The base URL a client would use: `http://ADDR/v1` (`https://` over TLS).
    pub fn base_url(&self) -> String {
        format!("{}://{}/v1", self.scheme, self.addr)
    }

    pub fn requests(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// Accepts connections on `listener` until `stop` is set (and a connection wakes it),
/// each served on its own thread by what `serve` makes of it: what every stand-in
/// upstream shares, each with its own answers and validation.
pub(crate) fn accept<F, G>(listener: TcpListener, stop: Arc<AtomicBool>, serve: F)
where
    F: Fn(TcpStream) -> G + Send + 'static,
    G: FnOnce() + Send + 'static,
{
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let Ok(stream) = stream else { continue };
            std::thread::spawn(serve(stream));
        }
    });
}

/// One HTTP/1.1 request read whole (line, headers, a `Content-Length` body); `None` when
/// the client closed the connection.
pub(crate) fn read_request(reader: &mut impl BufRead) -> std::io::Result<Option<Received>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok(Some(Received {
        method,
        path,
        headers,
        body,
    }))
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(&self.addr);
    }
}

/// Answers requests on one connection until the client closes it.
fn serve(
    stream: impl Read + Write,
    behaviour: Behaviour,
    received: &Mutex<Vec<Received>>,
    times: &Mutex<Vec<Vec<f64>>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    // Writes go past the reader's buffer, straight to the connection (`get_mut`).
    while let Some(request) = read_request(&mut reader)? {
        received.lock().unwrap().push(request.clone());
        if request.path.ends_with("/models") {
            let body = json!({"object": "list", "data": [{"id": "gpt-4o", "object": "model", "created": 0, "owned_by": "standin"}]}).to_string();
            write!(
                reader.get_mut(),
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )?;
            continue;
        }
        let value: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        if request.path.ends_with("/responses") {
            if responses(reader.get_mut(), &value, behaviour)? {
                return Ok(());
            }
            continue;
        }
        let model = value["model"].as_str().unwrap_or("").to_string();
        if let Some(problem) = chat_problem(&value) {
            // As OpenAI answers a request it refuses.
            let body = json!({"error": {"message": problem, "type": "invalid_request_error", "param": "messages", "code": null}}).to_string();
            write!(
                reader.get_mut(),
                "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )?;
            reader.get_mut().flush()?;
            continue;
        }
        if model == "recall-agent" {
            let body = recall_agent(&value).to_string();
            write!(
                reader.get_mut(),
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )?;
            reader.get_mut().flush()?;
            continue;
        }
        if model == "slow" {
            std::thread::sleep(behaviour.slow);
        }
        let content = format!(
            "answer to {} messages",
            value["messages"].as_array().map_or(0, Vec::len)
        );
        if value["stream"] == true {
            reader.get_mut().write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
            )?;
            let mut written = Vec::new();
            for i in 0..behaviour.chunks {
                if i > 0 {
                    std::thread::sleep(behaviour.gap);
                }
                let finish = if i + 1 == behaviour.chunks {
                    json!("stop")
                } else {
                    Value::Null
                };
                let chunk = json!({
                    "id": "chatcmpl-standin",
                    "object": "chat.completion.chunk",
                    "created": 1_700_000_000u64,
                    "model": model,
                    "choices": [{"index": 0, "delta": {"content": format!("part{i} ")}, "finish_reason": finish}]
                });
                reader
                    .get_mut()
                    .write_all(format!("data: {chunk}\n\n").as_bytes())?;
                reader.get_mut().flush()?;
                written.push(now());
            }
            reader.get_mut().write_all(b"data: [DONE]\n\n")?;
            reader.get_mut().flush()?;
            written.push(now());
            times.lock().unwrap().push(written);
            return Ok(());
        }
        let body = completion(&model, &content).to_string();
        write!(
            reader.get_mut(),
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Standin: yes\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        reader.get_mut().flush()?;
    }
    Ok(())
}

/// Answers a Responses request: 400 with OpenAI's error if the API would refuse it, else
/// a Response object or its event stream. Whether the connection is done (a stream).
fn responses(out: &mut impl Write, body: &Value, behaviour: Behaviour) -> std::io::Result<bool> {
    use crate::responses_upstream as r;
    if let Some(why) = r::refusal(body) {
        let error = json!({"error": {"message": why, "type": "invalid_request_error", "param": "input", "code": null}});
        let error = error.to_string();
        write!(
            out,
            "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{error}",
            error.len()
        )?;
        out.flush()?;
        return Ok(false);
    }
    if body["stream"] == true {
        out.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
        )?;
        r::stream(out, body, behaviour.chunks, behaviour.gap)?;
        return Ok(true);
    }
    let answer = r::response(body, "completed", Some(&r::answer_text(body))).to_string();
    write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Standin: yes\r\nContent-Length: {}\r\n\r\n{answer}",
        answer.len()
    )?;
    out.flush()?;
    Ok(false)
}
