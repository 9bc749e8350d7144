//! Anthropic's Messages API on the proxy (docs/proxy.md#anthropic-messages):
//! `POST /v1/messages` reads the request's `system` and `messages` into the host's
//! messages (history_wire::anthropic), runs the chain, and forwards the request with the
//! result written back in Anthropic's shape; `POST /v1/messages/count_tokens` passes
//! through. Every other member and header goes upstream untouched; errors are in
//! Anthropic's shape.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use history_engine::{turns, ChainRun};
use history_sessions::SessionError;
use history_wire::anthropic;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::app::App;
use crate::body::{add_member, forwarded_body, Elements, Member, RequestBody};
use crate::proxy::{self, OpenAiError, SESSION_HEADER};

/// An error in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.
pub struct AnthropicError {
    status: StatusCode,
    message: String,
}

impl AnthropicError {
    fn invalid(message: impl Into<String>) -> Self {
        AnthropicError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    /// Anthropic's error type for a status (docs/proxy.md#anthropic-messages).
    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 409 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            504 => "timeout_error",
            _ => "api_error",
        }
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let kind = self.kind();
        (
            self.status,
            axum::Json(json!({"type": "error", "error": {"type": kind, "message": self.message}})),
        )
            .into_response()
    }
}

impl From<OpenAiError> for AnthropicError {
    fn from(e: OpenAiError) -> Self {
        AnthropicError {
            status: e.status(),
            message: e.message().to_string(),
        }
    }
}

impl From<SessionError> for AnthropicError {
    fn from(e: SessionError) -> Self {
        OpenAiError::from(e).into()
    }
}

type Result<T> = std::result::Result<T, AnthropicError>;

/// The upstream path of `/v1/messages{tail}`: the base is Anthropic's own (no `/v1`, as
/// the SDK's `ANTHROPIC_BASE_URL`), or an OpenAI-style base ending in `/v1`
/// (docs/proxy.md#anthropic-messages).
fn upstream_path(base: &str, tail: &str) -> String {
    if base.ends_with("/v1") {
        format!("/messages{tail}")
    } else {
        format!("/v1/messages{tail}")
    }
}

fn read_body(body: std::result::Result<Bytes, BytesRejection>) -> Result<Bytes> {
    body.map_err(|rejection| AnthropicError {
        status: rejection.status(),
        message: format!("cannot read the body: {}", rejection.body_text()),
    })
}

/// `POST /v1/messages/count_tokens`: passed through.
pub async fn count_tokens(
    State(app): State<App>,
    headers: HeaderMap,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let upstream = proxy::upstream(&app)?;
    let bytes = read_body(body)?;
    let path = upstream_path(&upstream.base, "/count_tokens");
    Ok(proxy::forward(upstream, Method::POST, &path, &headers, bytes).await?)
}

/// `POST /v1/messages`.
pub async fn messages(
    State(app): State<App>,
    headers: HeaderMap,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let upstream = proxy::upstream(&app)?;
    let started = std::time::Instant::now();
    let at = history_sessions::clock::now_ms();
    let bytes = read_body(body)?;
    let body = match RequestBody::read(&bytes, Some("messages")) {
        Ok(RequestBody::Object(body)) => body,
        Ok(RequestBody::Other) => return Err(AnthropicError::invalid("the body must be a JSON object")),
        Err(e) => {
            return Err(AnthropicError::invalid(format!(
                "the body is not valid JSON: {e}"
            )))
        }
    };
    let model = match body
        .member("model")
        .map(|raw| serde_json::from_str::<Value>(raw.get()))
    {
        None => return Err(AnthropicError::invalid("model: Field required")),
        Some(Ok(Value::String(model))) => model,
        Some(_) => return Err(AnthropicError::invalid("model: expected a string")),
    };
    let texts: Vec<&str> = match &body.split {
        Some(Elements::Array(messages)) if !messages.is_empty() => messages.iter().map(|m| m.get()).collect(),
        Some(Elements::Array(_)) => {
            return Err(AnthropicError::invalid(
                "messages: at least one message is needed",
            ))
        }
        Some(Elements::Other) => {
            return Err(AnthropicError::invalid("messages: expected an array of messages"))
        }
        None => return Err(AnthropicError::invalid("messages: Field required")),
    };
    let session = match headers.get(SESSION_HEADER) {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| AnthropicError::invalid("X-History-Session: not a session id"))?
                .to_string(),
        ),
    };
    let system = body.member("system").map(RawValue::get);
    // A resent message is found, not parsed (crate::resent).
    let mut parsed = anthropic::parse_with(system, &texts, &*app.resent_anthropic)
        .map_err(|e| AnthropicError::invalid(e.0))?;

    let (run, unknown_model) = run_chain(&app, session.as_deref(), &mut parsed, model.clone()).await?;
    let written = anthropic::write(&parsed, &run.history);
    let forwarded = forwarded_with_system(&body.members, &written);
    let path = upstream_path(&upstream.base, "");
    let added_ms = started.elapsed().as_secs_f64() * 1000.0;
    let kept = app.traffic.keeps_bodies().then(|| forwarded.clone());
    let mut answer = proxy::forward(upstream, Method::POST, &path, &headers, forwarded).await;
    let request = crate::traffic::Request::of_run(
        at,
        "anthropic",
        Some(model),
        session.is_some(),
        &run,
        added_ms,
        match &answer {
            Ok(response) => response.status().as_u16(),
            Err(e) => e.status().as_u16(),
        },
    );
    app.traffic.record(request, kept.as_ref(), answer.as_mut().ok());
    let mut response = answer?;
    let added = response.headers_mut();
    proxy::add_report(added, &run, unknown_model.as_deref());
    if parsed.cache_breakpoints > 0 {
        let breakpoints = format!("{}->{}", parsed.cache_breakpoints, written.cache_breakpoints);
        if let Ok(value) = HeaderValue::from_str(&breakpoints) {
            added.insert(HeaderName::from_static("x-history-cache-breakpoints"), value);
        }
    }
    Ok(response)
}

/// The chain on the request's host messages: a turn of the session `session`, or a
/// stateless run; the run, and the model named when it is not listed.
async fn run_chain(
    app: &App,
    session: Option<&str>,
    parsed: &mut anthropic::Parsed<'_>,
    model: String,
) -> Result<(ChainRun, Option<String>)> {
    Ok(match session {
        Some(id) => {
            // The session service takes the chat format (docs/wire-format.md#messages).
            let messages = parsed
                .messages
                .iter()
                .map(|m| serde_json::from_str::<Value>(&history_wire::chat::message_to_string(m)))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| AnthropicError::invalid(format!("messages: {e}")))?;
            (
                app.service.turn_resent(id, messages, Some(model)).await?.run,
                None,
            )
        }
        None => {
            let turn = turns::current_turn(&parsed.messages, None);
            turns::prepare(&mut parsed.messages, turn);
            parsed.note_origins();
            app.resent_anthropic.remember(parsed);
            let history = parsed.messages.clone();
            // An unlisted model runs as `default` (docs/proxy.md#models).
            let stateless = app
                .service
                .run_stateless("proxy", history, turn, Some(model))
                .await?;
            (stateless.run, stateless.unknown_model)
        }
    })
}

/// The body sent upstream: the request's members as they came, `messages` the written
/// history, and `system` as written: replaced in its place, dropped when the output has
/// none, put first when the chain gave one the request did not have.
fn forwarded_with_system(members: &[Member<'_>], written: &anthropic::Written) -> Bytes {
    let system = written.system.as_deref();
    let had = members.iter().any(|(key, _)| key == "system");
    match (had, system) {
        (false, Some(system)) => add_member(
            &forwarded_body(members, &written.messages, &[]),
            "system",
            system,
            true,
        ),
        _ => forwarded_body(members, &written.messages, &[("system", system)]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_anthropic_base_gets_v1_messages_and_an_openai_style_base_messages() {
        // `[upstream] url` is stored without its trailing slash (crate::upstream).
        assert_eq!(upstream_path("https://api.anthropic.com", ""), "/v1/messages");
        assert_eq!(upstream_path("http://127.0.0.1:8000/v1", ""), "/messages");
        assert_eq!(
            upstream_path("https://gw.example/anthropic", "/count_tokens"),
            "/v1/messages/count_tokens"
        );
    }

    #[test]
    fn error_types_follow_anthropics_statuses() {
        let kind = |status: u16| {
            AnthropicError {
                status: StatusCode::from_u16(status).unwrap(),
                message: String::new(),
            }
            .kind()
        };
        assert_eq!(kind(400), "invalid_request_error");
        assert_eq!(kind(404), "not_found_error");
        assert_eq!(kind(413), "request_too_large");
        assert_eq!(kind(429), "rate_limit_error");
        assert_eq!(kind(502), "api_error");
        assert_eq!(kind(504), "timeout_error");
    }

    #[test]
    fn system_is_replaced_in_its_place_dropped_or_put_first() {
        let members = |body: &'static str| match RequestBody::read(body.as_bytes(), Some("messages")) {
            Ok(RequestBody::Object(body)) => body.members,
            _ => panic!("an object"),
        };
        let written = |system: Option<&str>| anthropic::Written {
            system: system.map(str::to_string),
            messages: "[]".into(),
            cache_breakpoints: 0,
        };
        let text = |bytes: Bytes| String::from_utf8(bytes.to_vec()).unwrap();
        let with = members(r#"{"model":"m","system":"s","messages":[1]}"#);
        assert_eq!(
            text(forwarded_with_system(&with, &written(Some(r#""t""#)))),
            r#"{"model":"m","system":"t","messages":[]}"#
        );
        assert_eq!(
            text(forwarded_with_system(&with, &written(None))),
            r#"{"model":"m","messages":[]}"#
        );
        let without = members(r#"{"model":"m","messages":[1]}"#);
        assert_eq!(
            text(forwarded_with_system(&without, &written(Some(r#""t""#)))),
            r#"{"system":"t","model":"m","messages":[]}"#
        );
    }
}
