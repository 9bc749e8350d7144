//! The OpenAI-compatible proxy (docs/proxy.md): `POST /v1/chat/completions` runs the
//! chain on the request's `messages` and forwards the request, with the sent history in
//! their place, to the upstream; `GET /v1/models` passes through. Everything else in the
//! request (members, the `Authorization` header) goes upstream untouched and is never
//! stored or logged; the answer comes back as it arrives, chunk by chunk.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use history_engine::turns;
use history_sessions::{ErrorKind, SessionError};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tokio::sync::OwnedSemaphorePermit;

use crate::app::App;
use crate::body::{forwarded_body, Elements, RequestBody};
use crate::upstream::{unreachable, Upstream};

/// The header that makes a request a turn of a session.
pub(crate) const SESSION_HEADER: &str = "x-history-session";

/// An error in OpenAI's shape: `{"error": {"message", "type", "code", "param"}}`.
pub struct OpenAiError {
    status: StatusCode,
    kind: &'static str,
    code: &'static str,
    message: String,
}

impl OpenAiError {
    pub(crate) fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        OpenAiError {
            status,
            kind,
            code,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        OpenAiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_request",
            message,
        )
    }
}

impl OpenAiError {
    /// The status, for another wire's error shape (crate::anthropic).
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    /// The message, for another wire's error shape (crate::anthropic).
    pub(crate) fn message(&self) -> &str {
        &self.message
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        (
            self.status,
            axum::Json(json!({"error": {
                "message": self.message,
                "type": self.kind,
                "code": self.code,
                "param": Value::Null,
            }})),
        )
            .into_response()
    }
}

impl From<SessionError> for OpenAiError {
    fn from(e: SessionError) -> Self {
        let (status, kind) = match e.kind {
            ErrorKind::BadInput => (StatusCode::BAD_REQUEST, "invalid_request_error"),
            ErrorKind::NotFound => (StatusCode::NOT_FOUND, "invalid_request_error"),
            ErrorKind::Busy | ErrorKind::Conflict => (StatusCode::CONFLICT, "invalid_request_error"),
            ErrorKind::PluginFailed => (StatusCode::UNPROCESSABLE_ENTITY, "history_plugin_error"),
            ErrorKind::TooManySessions => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
            ErrorKind::ShuttingDown | ErrorKind::StoreUnavailable => {
                (StatusCode::SERVICE_UNAVAILABLE, "server_error")
            }
            ErrorKind::Store => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
        };
        OpenAiError::new(status, kind, e.kind.code(), e.message)
    }
}

pub(crate) type Result<T> = std::result::Result<T, OpenAiError>;

pub(crate) fn upstream(app: &App) -> Result<&Upstream> {
    app.upstream.as_deref().ok_or_else(|| {
        OpenAiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "no_upstream",
            "this host has no upstream: start it with --upstream URL or set [upstream] url",
        )
    })
}

/// A request's body, or why it could not be read, in OpenAI's error shape (the chat and
/// Responses wires').
pub(crate) fn body_bytes(body: std::result::Result<Bytes, BytesRejection>) -> Result<Bytes> {
    body.map_err(|rejection| {
        OpenAiError::new(
            rejection.status(),
            "invalid_request_error",
            "invalid_body",
            format!("cannot read the body: {}", rejection.body_text()),
        )
    })
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(app): State<App>,
    headers: HeaderMap,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let upstream = upstream(&app)?;
    let started = std::time::Instant::now();
    let at = history_sessions::clock::now_ms();
    let bytes = body_bytes(body)?;
    // Parsed once: the members stay raw JSON text, `messages` is split into its messages'
    // texts in the same pass, and only `model` is read further.
    let body = match RequestBody::read(&bytes, Some("messages")) {
        Ok(RequestBody::Object(body)) => body,
        Ok(RequestBody::Other) => return Err(OpenAiError::invalid("the body must be a JSON object")),
        Err(e) => return Err(OpenAiError::invalid(format!("the body is not valid JSON: {e}"))),
    };
    let model = match body
        .member("model")
        .map(|raw| serde_json::from_str::<Value>(raw.get()))
    {
        None | Some(Ok(Value::Null)) => None,
        Some(Ok(Value::String(model))) => Some(model),
        Some(Ok(other)) => {
            return Err(OpenAiError::invalid(format!(
                "model: expected a string, found {}",
                history_engine::echo::bare(&other.to_string())
            )))
        }
        Some(Err(e)) => return Err(OpenAiError::invalid(format!("model: {e}"))),
    };
    let messages = match &body.split {
        Some(Elements::Array(messages)) if !messages.is_empty() => messages,
        Some(Elements::Array(_)) => {
            return Err(OpenAiError::invalid("messages: at least one message is needed"))
        }
        Some(Elements::Other) => return Err(OpenAiError::invalid("messages: expected an array of messages")),
        None => return Err(OpenAiError::invalid("missing \"messages\"")),
    };
    let session = match headers.get(SESSION_HEADER) {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| OpenAiError::invalid("X-History-Session: not a session id"))?
                .to_string(),
        ),
    };

    let (run, unknown_model) = match &session {
        Some(id) => {
            let messages = messages
                .iter()
                .map(|text| serde_json::from_str::<Value>(text.get()))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| OpenAiError::invalid(format!("messages: {e}")))?;
            (
                app.service.turn_resent(id, messages, model.clone()).await?.run,
                None,
            )
        }
        None => {
            // Parsed here, on the async thread, as the body was: a resent message is found,
            // not parsed (crate::resent); only the chain goes to a blocking thread.
            let mut turn = 0;
            let history = app
                .resent
                .parse(messages, |history| {
                    turn = turns::current_turn(history, None);
                    turns::prepare(history, turn);
                })
                .map_err(|e| OpenAiError::invalid(format!("messages: {e}")))?;
            // An unlisted model runs as `default`, never refused: the upstream judges model
            // names (docs/proxy.md#models).
            let stateless = app
                .service
                .run_stateless("proxy", history, turn, model.clone())
                .await?;
            (stateless.run, stateless.unknown_model)
        }
    };
    if !upstream.send_over_budget {
        over_budget(&app, &run, model.as_deref(), unknown_model.is_some())?;
    }
    // The sent history written once, straight to JSON text (no Value in between), as a
    // provider takes it: without the host's `metadata` (docs/proxy.md#what-goes-upstream).
    let sent = history_wire::chat::provider_history_to_string(&run.history);
    let added_ms = started.elapsed().as_secs_f64() * 1000.0;
    let (mut forwarded, kept) = match (&session, upstream.recall_rounds) {
        // A session's plain request may have the model call the recall tools
        // (docs/mcp.md#the-proxy); a streamed one is forwarded as it is.
        (Some(id), Some(rounds)) if !crate::proxy_recall::streamed(&body.members) => {
            let recall = crate::proxy_recall::Recall {
                service: &app.service,
                session: id,
                rounds,
            };
            (recall.run(upstream, &headers, &body.members, &sent).await, None)
        }
        _ => {
            let body = forwarded_body(&body.members, &sent, &[]);
            let kept = app.traffic.keeps_bodies().then(|| body.clone());
            drop(bytes);
            (
                forward(upstream, Method::POST, "/chat/completions", &headers, body).await,
                kept,
            )
        }
    };
    let request = crate::traffic::Request::of_run(
        at,
        "chat",
        model,
        session.is_some(),
        &run,
        added_ms,
        match &forwarded {
            Ok(response) => response.status().as_u16(),
            Err(e) => e.status.as_u16(),
        },
    );
    app.traffic
        .record(request, kept.as_ref(), forwarded.as_mut().ok());
    let mut response = forwarded?;
    add_report(response.headers_mut(), &run, unknown_model.as_deref());
    Ok(response)
}

/// What the chain did, on the answer of every wire (docs/proxy.md#a-request):
/// `X-History-Messages` and `X-History-Tokens` as `IN->OUT`, and `X-History-Model` when
/// the request named a model the configuration does not list.
pub(crate) fn add_report(
    headers: &mut HeaderMap,
    run: &history_engine::ChainRun,
    unknown_model: Option<&str>,
) {
    let mut add = |name: &'static str, value: String| {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    };
    add(
        "x-history-messages",
        format!("{}->{}", run.messages_in, run.history.len()),
    );
    add(
        "x-history-tokens",
        format!("{}->{}", run.tokens_in, run.tokens_out),
    );
    if let Some(name) = unknown_model {
        let shown = history_engine::echo::quoted(name);
        add("x-history-model", format!("default (unknown {shown})"));
    }
}

/// A history still over the model's `context_tokens` after the chain is answered as the
/// provider would, 400 `context_length_exceeded`, before anything goes upstream, unless
/// `[upstream] send_over_budget = true` (docs/proxy.md#over-budget).
fn over_budget(app: &App, run: &history_engine::ChainRun, model: Option<&str>, unknown: bool) -> Result<()> {
    let name = match model {
        Some(name) if !unknown => name,
        _ => "default",
    };
    let limit = app.service.config().model(name).context_tokens;
    if run.tokens_out <= limit {
        return Ok(());
    }
    Err(OpenAiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "context_length_exceeded",
        format!(
            "This model's maximum context length is {limit} tokens. However, your messages resulted in {} \
             tokens after the history chain ({} before). Nothing was sent upstream; configure the chain to \
             fit (token_budget, tool_result_filter max_result_tokens) or set [upstream] send_over_budget = true.",
            run.tokens_out, run.tokens_in
        ),
    ))
}

/// `GET /v1/models`: passed through.
pub async fn models(State(app): State<App>, headers: HeaderMap) -> Result<Response> {
    let upstream = upstream(&app)?;
    forward(upstream, Method::GET, "/models", &headers, Bytes::new()).await
}

/// Headers that belong to one connection, never forwarded either way.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-authorization"
            | "proxy-authenticate"
    )
}

fn unreachable_error(e: impl std::fmt::Display) -> OpenAiError {
    OpenAiError::new(
        StatusCode::BAD_GATEWAY,
        "upstream_error",
        "upstream_unreachable",
        format!("the upstream cannot be reached: {e}"),
    )
}

fn tls_error(message: String) -> OpenAiError {
    OpenAiError::new(
        StatusCode::BAD_GATEWAY,
        "upstream_error",
        "upstream_tls",
        format!("TLS with the upstream failed: {message} (a private CA is trusted with [upstream] ca_file)"),
    )
}

fn timeout_error(timeout: Duration, key: &str) -> OpenAiError {
    OpenAiError::new(
        StatusCode::GATEWAY_TIMEOUT,
        "upstream_error",
        "upstream_timeout",
        format!(
            "the upstream did not answer within {} s ([upstream] {key})",
            timeout.as_secs()
        ),
    )
}

/// Sends a request upstream and passes its answer back as it comes: status and headers
/// once they arrive (within `timeout_s`, and `read_timeout_s` once the request is sent),
/// then each chunk of the body as soon as it is read (at most `read_timeout_s` apart; a
/// longer gap ends the body).
pub(crate) async fn forward(
    upstream: &Upstream,
    method: Method,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let uri = format!("{}{path}", upstream.base);
    let mut builder = axum::http::Request::builder().method(method).uri(&uri);
    for (name, value) in headers {
        if hop_by_hop(name)
            || name == header::HOST
            || name == header::CONTENT_LENGTH
            || name.as_str() == SESSION_HEADER
        {
            continue;
        }
        builder = builder.header(name, value);
    }
    if !body.is_empty() {
        builder = builder.header(header::CONTENT_LENGTH, body.len());
    }
    let request = builder
        .body(Full::new(body))
        .map_err(|e| OpenAiError::invalid(format!("cannot build the upstream request: {e}")))?;
    let timeout = upstream.timeout;
    let answer = tokio::time::timeout(timeout, async {
        let permit = upstream
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(unreachable_error)?;
        // Once a slot is held, the upstream may stay silent at most `read_timeout_s`.
        let read_timeout = upstream.read_timeout;
        let response = tokio::time::timeout(read_timeout, upstream.client.request(request))
            .await
            .map_err(|_| {
                tracing::warn!(
                    "proxy: upstream {uri} sent no answer within {} s (read_timeout_s)",
                    read_timeout.as_secs()
                );
                timeout_error(read_timeout, "read_timeout_s")
            })?
            .map_err(|e| {
                // The chain of causes says why (refused, reset, an untrusted certificate, …).
                let why = unreachable(&e);
                if why.tls {
                    tls_error(why.message)
                } else {
                    unreachable_error(why.message)
                }
            })?;
        Ok::<_, OpenAiError>((permit, response))
    })
    .await;
    let (permit, response) = match answer {
        Ok(answer) => answer?,
        Err(_) => {
            tracing::warn!("proxy: upstream {uri} timed out after {} s", timeout.as_secs());
            return Err(timeout_error(timeout, "timeout_s"));
        }
    };
    let (parts, incoming) = response.into_parts();
    let mut out = Response::builder().status(parts.status);
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) {
            out = out.header(name, value);
        }
    }
    let timeout = upstream.read_timeout;
    let stream = futures_util::stream::unfold(
        Some((incoming, permit)),
        move |state: Option<(hyper::body::Incoming, OwnedSemaphorePermit)>| async move {
            let (mut incoming, permit) = state?;
            loop {
                match tokio::time::timeout(timeout, incoming.frame()).await {
                    Err(_) => {
                        tracing::warn!(
                            "proxy: the upstream's answer stalled past {} s",
                            timeout.as_secs()
                        );
                        let e = std::io::Error::new(std::io::ErrorKind::TimedOut, "the upstream stalled");
                        return Some((Err(e), None));
                    }
                    Ok(None) => return None,
                    Ok(Some(Err(e))) => {
                        return Some((Err(std::io::Error::other(e)), None));
                    }
                    Ok(Some(Ok(frame))) => match frame.into_data() {
                        Ok(data) => return Some((Ok(data), Some((incoming, permit)))),
                        // Trailers: nothing to pass on.
                        Err(_) => continue,
                    },
                }
            }
        },
    );
    out.body(Body::from_stream(stream)).map_err(|e| {
        OpenAiError::new(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            "bad_upstream_answer",
            e.to_string(),
        )
    })
}
