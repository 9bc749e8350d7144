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
use history_engine::{stateless_context, turns, Call, ChainRun};
use history_sessions::service::history_json;
use history_sessions::{ErrorKind, SessionError};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Map, Value};
use tokio::sync::OwnedSemaphorePermit;

use crate::routes::App;
use crate::upstream::{strip_stamps, unreachable, Upstream};

/// The header that makes a request a turn of a session.
const SESSION_HEADER: &str = "x-history-session";

/// An error in OpenAI's shape: `{"error": {"message", "type", "code", "param"}}`.
pub struct OpenAiError {
    status: StatusCode,
    kind: &'static str,
    code: &'static str,
    message: String,
}

impl OpenAiError {
    fn new(status: StatusCode, kind: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        OpenAiError {
            status,
            kind,
            code,
            message: message.into(),
        }
    }

    fn invalid(message: impl Into<String>) -> Self {
        OpenAiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_request",
            message,
        )
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

type Result<T> = std::result::Result<T, OpenAiError>;

fn upstream(app: &App) -> Result<&Upstream> {
    app.upstream.as_deref().ok_or_else(|| {
        OpenAiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "no_upstream",
            "this host has no upstream: start it with --upstream URL or set [upstream] url",
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
    let bytes = body.map_err(|rejection| {
        OpenAiError::new(
            rejection.status(),
            "invalid_request_error",
            "invalid_body",
            format!("cannot read the body: {}", rejection.body_text()),
        )
    })?;
    let mut request: Map<String, Value> = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(object)) => object,
        Ok(_) => return Err(OpenAiError::invalid("the body must be a JSON object")),
        Err(e) => return Err(OpenAiError::invalid(format!("the body is not valid JSON: {e}"))),
    };
    let model = match request.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(model)) => Some(model.clone()),
        Some(other) => {
            return Err(OpenAiError::invalid(format!(
                "model: expected a string, found {}",
                history_engine::echo::bare(&other.to_string())
            )))
        }
    };
    let messages = match request.get_mut("messages").map(Value::take) {
        Some(Value::Array(messages)) if !messages.is_empty() => messages,
        Some(Value::Array(_)) => {
            return Err(OpenAiError::invalid("messages: at least one message is needed"))
        }
        Some(_) => return Err(OpenAiError::invalid("messages: expected an array of messages")),
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

    let run = match &session {
        Some(id) => {
            let outcome = app.service.turn_resent(id, messages, model).await?;
            outcome.run
        }
        None => stateless_run(&app, messages, model).await?,
    };
    let mut sent = history_json(&run.history);
    if session.is_some() {
        strip_stamps(&mut sent);
    }
    request.insert("messages".to_string(), sent);
    let body = serde_json::to_vec(&Value::Object(request)).expect("JSON values serialize");

    let mut response = forward(
        upstream,
        Method::POST,
        "/chat/completions",
        &headers,
        Bytes::from(body),
    )
    .await?;
    let added = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&format!("{}->{}", run.messages_in, run.history.len())) {
        added.insert(HeaderName::from_static("x-history-messages"), value);
    }
    if let Ok(value) = HeaderValue::from_str(&format!("{}->{}", run.tokens_in, run.tokens_out)) {
        added.insert(HeaderName::from_static("x-history-tokens"), value);
    }
    Ok(response)
}

/// `GET /v1/models`: passed through.
pub async fn models(State(app): State<App>, headers: HeaderMap) -> Result<Response> {
    let upstream = upstream(&app)?;
    forward(upstream, Method::GET, "/models", &headers, Bytes::new()).await
}

/// The chain on a stateless request, on a blocking thread.
async fn stateless_run(app: &App, messages: Vec<Value>, model: Option<String>) -> Result<ChainRun> {
    let service = app.service.clone();
    let result = tokio::task::spawn_blocking(move || -> Result<ChainRun> {
        let history = plugin_api::wire::parse_history(&Value::Array(messages))
            .map_err(|e| OpenAiError::invalid(format!("messages: {e}")))?;
        let config = service.config();
        let chain = service.chain();
        let model = config.model(model.as_deref().unwrap_or("default"));
        let turn = turns::current_turn(&history, None);
        let ctx = stateless_context(&config, model, turn);
        match chain.run(history, &ctx, Call::Process) {
            Ok(run) => {
                service.metrics.run(&run);
                tracing::info!("proxy: {}", history_engine::summary::summary_line(&run));
                Ok(run)
            }
            Err(failure) => {
                service.metrics.plugin_failed(&failure.plugin);
                tracing::warn!("proxy: request refused: {failure}");
                Err(OpenAiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "history_plugin_error",
                    "plugin_failed",
                    failure.to_string(),
                ))
            }
        }
    })
    .await;
    result.unwrap_or_else(|e| {
        Err(OpenAiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "internal",
            format!("the chain run failed: {e}"),
        ))
    })
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

fn timeout_error(timeout: Duration) -> OpenAiError {
    OpenAiError::new(
        StatusCode::GATEWAY_TIMEOUT,
        "upstream_error",
        "upstream_timeout",
        format!(
            "the upstream did not answer within {} s (timeout_s)",
            timeout.as_secs()
        ),
    )
}

/// Sends a request upstream and passes its answer back as it comes: status and headers
/// once they arrive (within `timeout_s`), then each chunk of the body as soon as it is
/// read (at most `timeout_s` apart; a longer gap ends the body).
async fn forward(
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
        let response = upstream.client.request(request).await.map_err(|e| {
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
            return Err(timeout_error(timeout));
        }
    };
    let (parts, incoming) = response.into_parts();
    let mut out = Response::builder().status(parts.status);
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) {
            out = out.header(name, value);
        }
    }
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
