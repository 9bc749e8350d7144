//! OpenAI's Responses API through the proxy (docs/proxy.md#responses): `POST
//! /v1/responses` runs the chain on the request's `instructions` and `input` (read by
//! `history_wire::responses`) and forwards the request, with the sent history as its
//! `input`, to `{upstream}/responses`; every other member and the headers go upstream
//! untouched, and the answer (JSON or server-sent events) comes back as it arrives.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use axum::response::Response;
use history_engine::turns;
use history_sessions::StatelessRun;
use history_wire::responses::{Input, Parsed};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::app::App;
use crate::body::{forwarded_body, member, Elements, Members, RequestBody};
use crate::proxy::{forward, upstream, OpenAiError, Result, SESSION_HEADER};

/// The upstream path, under the upstream's base URL (which ends in `/v1`).
const PATH: &str = "/responses";

/// `POST /v1/responses`.
pub async fn responses(
    State(app): State<App>,
    headers: HeaderMap,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let upstream = upstream(&app)?;
    let started = std::time::Instant::now();
    let at = history_sessions::clock::now_ms();
    let bytes = crate::proxy::body_bytes(body)?;
    // Read once, `input` split into its items in the same pass; a string `input` (or
    // any other value) is read again whole, its text written back as it came.
    let (members, items) = match RequestBody::read(&bytes, Some("input")) {
        Ok(RequestBody::Object(Members {
            members,
            split: Some(Elements::Array(items)),
        })) => (members, Some(items)),
        Ok(RequestBody::Object(_)) => match RequestBody::read(&bytes, None) {
            Ok(RequestBody::Object(body)) => (body.members, None),
            _ => return Err(OpenAiError::invalid("the body must be a JSON object")),
        },
        Ok(RequestBody::Other) => return Err(OpenAiError::invalid("the body must be a JSON object")),
        Err(e) => return Err(OpenAiError::invalid(format!("the body is not valid JSON: {e}"))),
    };
    let present = |name: &str| member(&members, name).is_some_and(|raw| raw.get() != "null");
    // The history lives at the provider (a stored response or a conversation): what is
    // sent is only the new input, nothing the chain could trim (docs/proxy.md#previous_response_id).
    if present("previous_response_id") || present("conversation") {
        let mut response = forward(upstream, Method::POST, PATH, &headers, bytes).await?;
        response.headers_mut().insert(
            HeaderName::from_static("x-history-messages"),
            HeaderValue::from_static("passthrough"),
        );
        return Ok(response);
    }
    let model = match member(&members, "model").map(|raw| serde_json::from_str::<Value>(raw.get())) {
        None | Some(Ok(Value::Null)) => None,
        Some(Ok(Value::String(model))) => Some(model),
        Some(Ok(_)) => return Err(OpenAiError::invalid("model: expected a string")),
        Some(Err(e)) => return Err(OpenAiError::invalid(format!("model: {e}"))),
    };
    let input = match (&items, member(&members, "input")) {
        (Some(items), _) => Input::Items(items),
        (None, Some(raw)) => Input::Raw(raw),
        (None, None) => return Err(OpenAiError::invalid("missing \"input\"")),
    };
    // A resent item is found, not parsed (crate::resent), here on the async thread as the
    // body was; only the chain goes to a blocking thread.
    let mut parsed =
        history_wire::responses::parse_with(member(&members, "instructions"), input, &*app.resent_items)
            .map_err(OpenAiError::invalid)?;
    if parsed.messages.is_empty() {
        return Err(OpenAiError::invalid("input: at least one item is needed"));
    }
    let StatelessRun { run, unknown_model } = run_chain(&app, &headers, &mut parsed, model.clone()).await?;
    let written = parsed.write(&run.history);
    // `instructions` as written, or left out when the chain did not keep it (a `null`
    // stays as it came).
    let instructions = match &written.instructions {
        Some(text) => Some(text.as_str()),
        None => member(&members, "instructions")
            .map(RawValue::get)
            .filter(|raw| *raw == "null"),
    };
    let body = forwarded_body(
        &members,
        "",
        &[("input", Some(&written.input)), ("instructions", instructions)],
    );
    drop(parsed);
    drop(members);
    drop(bytes);
    let added_ms = started.elapsed().as_secs_f64() * 1000.0;
    let kept = app.traffic.keeps_bodies().then(|| body.clone());
    let mut forwarded = forward(upstream, Method::POST, PATH, &headers, body).await;
    let request = crate::traffic::Request::of_run(
        at,
        "responses",
        model,
        headers.contains_key(SESSION_HEADER),
        &run,
        added_ms,
        match &forwarded {
            Ok(response) => response.status().as_u16(),
            Err(e) => e.status().as_u16(),
        },
    );
    app.traffic
        .record(request, kept.as_ref(), forwarded.as_mut().ok());
    let mut response = forwarded?;
    crate::proxy::add_report(response.headers_mut(), &run, unknown_model.as_deref());
    Ok(response)
}

/// The chain on the request's messages: a turn of the session `X-History-Session` names,
/// or a stateless run. A stateless run's messages are prepared in place and what was
/// parsed is remembered once they are.
async fn run_chain(
    app: &App,
    headers: &HeaderMap,
    parsed: &mut Parsed<'_>,
    model: Option<String>,
) -> Result<StatelessRun> {
    let session = match headers.get(SESSION_HEADER) {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| OpenAiError::invalid("X-History-Session: not a session id"))?,
        ),
    };
    match session {
        Some(id) => {
            // A session's transcript is kept in the chat format (docs/wire-format.md).
            let messages = parsed
                .messages
                .iter()
                .map(|message| serde_json::from_str::<Value>(&history_wire::chat::message_to_string(message)))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| OpenAiError::invalid(format!("input: {e}")))?;
            let run = app.service.turn_resent(id, messages, model).await?.run;
            Ok(StatelessRun {
                run,
                unknown_model: None,
            })
        }
        None => {
            let turn = turns::current_turn(&parsed.messages, None);
            turns::prepare(&mut parsed.messages, turn);
            app.resent_items.remember(parsed);
            let history = parsed.messages.clone();
            Ok(app.service.run_stateless("proxy", history, turn, model).await?)
        }
    }
}
