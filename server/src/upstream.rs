//! The connections to an OpenAI-compatible upstream (docs/proxy.md): one pooled hyper-util
//! client, over TLS for `https://` (rustls with its `ring` provider; the Mozilla roots, the
//! system's, and `[upstream] ca_file`), used by the proxy's handlers and by
//! `history-host chat --upstream` through [`ModelClient`].

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, HeaderValue, Method, Request, StatusCode};
use history_engine::config::UpstreamConfig;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

/// The upstream's settings: `--upstream URL` over `[upstream] url`, the rest from
/// `[upstream]` (or its defaults). `None` when neither names an upstream.
pub fn resolve(
    url: Option<&str>,
    configured: Option<&UpstreamConfig>,
) -> Result<Option<UpstreamConfig>, String> {
    let config = match (url, configured) {
        (Some(url), configured) => UpstreamConfig {
            url: url.trim_end_matches('/').to_string(),
            ..configured.cloned().unwrap_or_default()
        },
        (None, Some(configured)) => configured.clone(),
        (None, None) => return Ok(None),
    };
    if !config.url.starts_with("http://") && !config.url.starts_with("https://") {
        return Err(format!(
            "--upstream {}: expected an http:// or https:// URL (the upstream's base URL, e.g. http://127.0.0.1:8000/v1)",
            config.url
        ));
    }
    Ok(Some(config))
}

/// The upstream and the connections to it.
pub struct Upstream {
    pub(crate) client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// The base URL, without a trailing `/`.
    pub(crate) base: String,
    pub(crate) timeout: Duration,
    /// `read_timeout_s`: the longest silence once the request is sent.
    pub(crate) read_timeout: Duration,
    /// One permit per request in flight upstream (`max_connections`).
    pub(crate) permits: Arc<Semaphore>,
    /// `recall_tools`: a session's chat requests offer the model the recall tools
    /// (docs/mcp.md#the-proxy), at most `max_recall_rounds` rounds of them.
    pub(crate) recall_rounds: Option<u64>,
    /// `send_over_budget`: a history over the model's `context_tokens` still goes upstream.
    pub(crate) send_over_budget: bool,
}

impl Upstream {
    pub fn new(config: &UpstreamConfig) -> Result<Upstream, String> {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(config.timeout_s)));
        // The TLS layer below takes the `https://` URLs.
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(config)?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(config.max_connections as usize)
            .build(connector);
        Ok(Upstream {
            client,
            base: config.url.trim_end_matches('/').to_string(),
            timeout: Duration::from_secs(config.timeout_s),
            read_timeout: Duration::from_secs(config.read_timeout_s),
            permits: Arc::new(Semaphore::new(config.max_connections as usize)),
            recall_rounds: config.recall_tools.then_some(config.max_recall_rounds),
            send_over_budget: config.send_over_budget,
        })
    }

    pub fn url(&self) -> &str {
        &self.base
    }
}

/// TLS for `https://` upstreams: rustls on `ring`, trusting the Mozilla roots
/// (webpki-roots), the system's certificates, and those of `ca_file`.
fn tls_config(config: &UpstreamConfig) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if config.url.starts_with("https://") {
        // Only where TLS is used: reading the system's store takes a few milliseconds.
        let native = rustls_native_certs::load_native_certs();
        for error in &native.errors {
            tracing::debug!("upstream TLS: a system certificate was not loaded: {error}");
        }
        let (added, _ignored) = roots.add_parsable_certificates(native.certs);
        tracing::debug!("upstream TLS: {added} system certificates trusted");
    }
    if let Some(file) = &config.ca_file {
        let place = format!("[upstream] ca_file {}", file.display());
        let certificates = CertificateDer::pem_file_iter(file)
            .map_err(|e| format!("{place}: {e}"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{place}: not a PEM certificate: {e}"))?;
        if certificates.is_empty() {
            return Err(format!("{place}: no PEM certificate in it"));
        }
        for certificate in certificates {
            roots
                .add(certificate)
                .map_err(|e| format!("{place}: not a usable CA certificate: {e}"))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("upstream TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The host's `metadata` off the messages sent upstream, as the proxy sends them
/// (`history_wire::chat::provider_history_to_string`): a provider refuses members it does
/// not know.
fn strip_metadata(sent: &mut Value) {
    for message in sent.as_array_mut().into_iter().flatten() {
        if let Some(object) = message.as_object_mut() {
            object.remove("metadata");
        }
    }
}

/// Why a request could not reach the upstream: every cause in the chain (refused, reset,
/// a certificate the host does not trust, …), and whether TLS failed.
pub(crate) struct Unreachable {
    pub message: String,
    pub tls: bool,
}

pub(crate) fn unreachable(e: &hyper_util::client::legacy::Error) -> Unreachable {
    let mut message = e.to_string();
    let mut tls = false;
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        tls |= is_tls(cause);
        source = cause.source();
    }
    Unreachable { message, tls }
}

/// Whether an error is rustls' — also inside io::Errors, as tokio-rustls and hyper-rustls
/// hand it up (an io::Error's `source` skips what it wraps).
fn is_tls(error: &(dyn std::error::Error + 'static)) -> bool {
    if error.is::<rustls::Error>() {
        return true;
    }
    match error
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::get_ref)
    {
        Some(inner) => is_tls(inner),
        None => false,
    }
}

/// Chat completions for `history-host chat --upstream` (docs/cli.md#history-host-chat): the
/// session's sent history goes to the upstream, its answer (streamed) comes back as text.
pub struct ModelClient {
    upstream: Upstream,
    /// `Authorization: Bearer KEY`, from `OPENAI_API_KEY`; sent to the upstream only.
    key: Option<HeaderValue>,
}

impl ModelClient {
    /// The client for `url` (the upstream's base URL), with `[upstream]`'s other settings.
    pub fn new(
        url: &str,
        configured: Option<&UpstreamConfig>,
        key: Option<&str>,
    ) -> Result<ModelClient, String> {
        let config = resolve(Some(url), configured)?.expect("a URL was given");
        let key = match key {
            Some(key) => Some(
                HeaderValue::from_str(&format!("Bearer {key}"))
                    .map_err(|_| "OPENAI_API_KEY: not a valid header value".to_string())?,
            ),
            None => None,
        };
        Ok(ModelClient {
            upstream: Upstream::new(&config)?,
            key,
        })
    }

    pub fn url(&self) -> &str {
        self.upstream.url()
    }

    /// Sends `messages` (a JSON array; the host's metadata is taken off) to
    /// `/chat/completions` on `model`, streamed; calls `on_text` with each piece of the
    /// answer as it arrives and returns the whole answer. An upstream that does not stream
    /// is read as a plain answer. An error is one line.
    pub async fn complete(
        &self,
        model: &str,
        mut messages: Value,
        mut on_text: impl FnMut(&str),
    ) -> Result<String, String> {
        strip_metadata(&mut messages);
        let body = json!({"model": model, "messages": messages, "stream": true}).to_string();
        let uri = format!("{}/chat/completions", self.upstream.base);
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(&uri)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "text/event-stream, application/json");
        if let Some(key) = &self.key {
            request = request.header(header::AUTHORIZATION, key.clone());
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("cannot build the request to {uri}: {e}"))?;
        let timeout = self.upstream.timeout;
        let response = tokio::time::timeout(timeout, self.upstream.client.request(request))
            .await
            .map_err(|_| format!("{uri} did not answer within {} s", timeout.as_secs()))?
            .map_err(|e| {
                let why = unreachable(&e);
                let kind = if why.tls { "TLS with" } else { "cannot reach" };
                format!("{kind} {uri}: {}", why.message)
            })?;
        let status = response.status();
        let streamed = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut body = response.into_body();
        let mut events = SseLines::default();
        let mut answer = String::new();
        let mut plain = Vec::new();
        loop {
            let frame = tokio::time::timeout(self.upstream.read_timeout, body.frame())
                .await
                .map_err(|_| {
                    format!(
                        "{uri}: the answer stalled past {} s (read_timeout_s)",
                        self.upstream.read_timeout.as_secs()
                    )
                })?;
            let Some(frame) = frame else { break };
            let frame = frame.map_err(|e| format!("{uri}: the answer broke off: {e}"))?;
            let Ok(data) = frame.into_data() else { continue };
            if !(streamed && status.is_success()) {
                plain.extend_from_slice(&data);
                continue;
            }
            for event in events.push(&data) {
                if event == "[DONE]" {
                    return Ok(answer);
                }
                let chunk: Value = serde_json::from_str(&event)
                    .map_err(|e| format!("{uri}: a streamed chunk is not JSON: {e}"))?;
                if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str() {
                    on_text(text);
                    answer.push_str(text);
                }
            }
        }
        if streamed && status.is_success() {
            return Ok(answer);
        }
        let value: Value = serde_json::from_slice(&plain).unwrap_or(Value::Null);
        if !status.is_success() {
            return Err(upstream_error(&uri, status, &value, &plain));
        }
        let text = value["choices"][0]["message"]["content"]
            .as_str()
            .ok_or_else(|| format!("{uri}: the answer has no choices[0].message.content"))?;
        on_text(text);
        Ok(text.to_string())
    }
}

/// An upstream's error answer as one line: its status and OpenAI-shaped message.
fn upstream_error(uri: &str, status: StatusCode, value: &Value, raw: &[u8]) -> String {
    let message = value["error"]["message"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(&raw[..raw.len().min(200)]).into_owned());
    history_engine::echo::line(&format!("{uri} answered {status}: {message}"))
}

/// The `data:` payloads of a server-sent event stream, fed as the bytes arrive.
#[derive(Default)]
struct SseLines {
    pending: Vec<u8>,
}

impl SseLines {
    fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            if let Some(data) = line.trim_end_matches(['\r', '\n']).strip_prefix("data:") {
                events.push(data.trim_start().to_string());
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_payloads_are_split_across_reads() {
        let mut lines = SseLines::default();
        assert!(lines.push(b"data: {\"a\"").is_empty());
        assert_eq!(lines.push(b":1}\n\ndata: [DONE]\r\n"), ["{\"a\":1}", "[DONE]"]);
        assert!(lines.push(b": comment\nevent: x\n").is_empty());
    }

    #[test]
    fn an_upstream_is_resolved_from_the_flag_and_the_table() {
        assert_eq!(resolve(None, None).unwrap(), None);
        let configured = UpstreamConfig {
            url: "http://a/v1".into(),
            timeout_s: 5,
            read_timeout_s: 5,
            max_connections: 2,
            ..UpstreamConfig::default()
        };
        let flag = resolve(Some("https://b/v1/"), Some(&configured))
            .unwrap()
            .unwrap();
        assert_eq!((flag.url.as_str(), flag.timeout_s), ("https://b/v1", 5));
        let err = resolve(Some("ftp://c"), None).unwrap_err();
        assert!(err.contains("expected an http:// or https:// URL"), "{err}");
    }
}
