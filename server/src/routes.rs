//! The endpoints (docs/http-api.md).

use std::collections::HashMap;

use crate::answers::{
    command_json, history_json_as, last_reload_json, session_json, switch_json, turn_json, turn_records_json,
    AnswerShape, HistoryForm,
};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use history_sessions::{
    Command, ContextItem, ErrorKind, SessionError, StagePlace, TranscriptPage, TurnInput,
};
use serde_json::{json, Map, Value};

use crate::app::App;
use crate::auth::{self, Denied};

/// The largest transcript page.
const MAX_PAGE: u64 = 1000;

/// Every route on `app`: bodies up to `max_body_mb`, `/mcp` answering the loopback names
/// and `mcp_hosts` (`[server] mcp_allowed_hosts`).
pub fn router(app: App, max_body_mb: u64, mcp_hosts: &[String]) -> Router {
    let limit = (max_body_mb as usize).saturating_mul(1 << 20);
    Router::new()
        .route("/v1/sessions", post(create).get(list))
        .route("/v1/sessions/{id}", axum::routing::delete(delete))
        .route("/v1/sessions/{id}/turns", post(turn).get(turns))
        .route("/v1/sessions/{id}/model", post(model))
        .route("/v1/sessions/{id}/commands", post(command))
        .route("/v1/sessions/{id}/history", get(history))
        .route("/v1/sessions/{id}/transcript", get(transcript))
        .route("/v1/sessions/{id}/expand", post(expand))
        .route(
            "/v1/sessions/{id}/expiration_override",
            axum::routing::put(expiration_override),
        )
        .route("/v1/chain", get(chain))
        .route("/v1/proxy/traffic", get(traffic))
        .route("/v1/chat/completions", post(crate::proxy::chat_completions))
        .route("/v1/models", get(crate::proxy::models))
        .route("/v1/responses", post(crate::responses::responses))
        .route("/v1/messages", post(crate::anthropic::messages))
        .route("/v1/messages/count_tokens", post(crate::anthropic::count_tokens))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        // Readiness, under the name it had before the split (docs/http-api.md#probes).
        .route("/healthz", get(readyz))
        .route("/metrics", get(metrics))
        .nest_service("/mcp", crate::mcp::service(app.service.clone(), mcp_hosts))
        .merge(crate::ui::router())
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint") })
        // A body that says it is too large is refused before any of it is read; one that
        // does not say (chunked) is cut off as soon as it passes the limit.
        .layer(axum::middleware::from_fn(
            move |request: Request, next: Next| async move {
                let declared = request
                    .headers()
                    .get(axum::http::header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<usize>().ok());
                if declared.is_some_and(|length| length > limit) {
                    return too_large().into_response();
                }
                next.run(request).await
            },
        ))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(app)
}

fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        "the request body is larger than max_body_mb",
    )
}

/// An error response: `{"error": {"code", "message"}}`.
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    fn bad_input(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_input", message)
    }
}

impl ApiError {
    /// The status and the error's message, as the response gives them.
    pub(crate) fn parts(&self) -> (u16, &str) {
        (self.status.as_u16(), &self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"error": {"code": self.code, "message": self.message}})),
        )
            .into_response()
    }
}

impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> ApiError {
        let status = match e.kind {
            ErrorKind::BadInput => StatusCode::BAD_REQUEST,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::Busy | ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::PluginFailed => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorKind::TooManySessions => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Store => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorKind::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError::new(status, e.kind.code(), e.message)
    }
}

type Result<T> = std::result::Result<T, ApiError>;

fn operator(app: &App, headers: &HeaderMap) -> Result<()> {
    auth::check(headers, app.token.as_deref()).map_err(|denied| match denied {
        Denied::Missing if app.token.is_none() => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this needs the operator's token, and none is configured: set operator_token_file \
             in the configuration or HISTORY_OPERATOR_TOKEN, restart, then send \
             Authorization: Bearer TOKEN",
        ),
        Denied::Missing => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this needs the operator's token: Authorization: Bearer TOKEN",
        ),
        Denied::Wrong if app.token.is_none() => ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "no operator token is configured (operator_token_file or HISTORY_OPERATOR_TOKEN)",
        ),
        Denied::Wrong => ApiError::new(StatusCode::FORBIDDEN, "forbidden", "not the operator's token"),
    })
}

/// The body's bytes. Too large a body is a 413.
fn bytes(body: std::result::Result<Bytes, BytesRejection>) -> Result<Bytes> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            too_large()
        } else {
            ApiError::bad_input(format!("cannot read the body: {}", rejection.body_text()))
        }
    })
}

/// The body as a JSON object; an empty body is `{}`.
fn object(bytes: &[u8]) -> Result<Map<String, Value>> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(ApiError::bad_input("the body must be a JSON object")),
        Err(e) => Err(ApiError::bad_input(format!("the body is not valid JSON: {e}"))),
    }
}

/// Refuses members other than `known`.
fn only(object: &Map<String, Value>, known: &[&str]) -> Result<()> {
    match object.keys().find(|k| !known.contains(&k.as_str())) {
        Some(key) => Err(ApiError::bad_input(format!(
            "unknown member \"{key}\" (expected {})",
            known.join(", ")
        ))),
        None => Ok(()),
    }
}

fn string_member(object: &Map<String, Value>, key: &str) -> Result<Option<String>> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ApiError::bad_input(format!(
            "{key}: expected a string, found {other}"
        ))),
    }
}

async fn create(
    State(app): State<App>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let (model, expiration_override) = create_body(&bytes(body)?)?;
    let info = app.service.create(model, expiration_override).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": info.id, "model": info.model, "effective_ctx": info.effective_ctx})),
    )
        .into_response())
}

async fn list(State(app): State<App>, headers: HeaderMap) -> Result<Json<Value>> {
    operator(&app, &headers)?;
    let sessions: Vec<Value> = app.service.list().await?.iter().map(session_json).collect();
    Ok(Json(json!({"sessions": sessions})))
}

async fn turn(
    State(app): State<App>,
    Path(id): Path<String>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let (input, shape) = turn_body(&bytes(body)?)?;
    let outcome = app.service.turn(&id, input).await?;
    // Already JSON text (turn_json writes the sent history straight out).
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        turn_json(&outcome, shape),
    )
        .into_response())
}

/// `POST /v1/sessions`: the model and the expiration override.
pub(crate) fn create_body(bytes: &[u8]) -> Result<(Option<String>, Option<Value>)> {
    let body = object(bytes)?;
    only(&body, &["model", "expiration_override"])?;
    Ok((
        string_member(&body, "model")?,
        body.get("expiration_override").cloned(),
    ))
}

/// `POST /v1/sessions/{id}/turns`: the turn's input, checked as far as it can be without
/// the session, and the shape its answer's history is written in (its form, whole or a
/// delta).
pub(crate) fn turn_body(bytes: &[u8]) -> Result<(TurnInput, AnswerShape)> {
    let body = object(bytes)?;
    only(&body, &["messages", "model", "context", "form", "delta"])?;
    let form = match string_member(&body, "form")? {
        None => HistoryForm::Full,
        Some(name) => HistoryForm::parse(&name).map_err(ApiError::bad_input)?,
    };
    let delta = match body.get("delta") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(delta)) => *delta,
        Some(other) => {
            return Err(ApiError::bad_input(format!(
                "delta: expected true or false, found {}",
                history_engine::echo::json(other)
            )))
        }
    };
    let messages = match body.get("messages") {
        None => return Err(ApiError::bad_input("missing \"messages\"")),
        Some(value) => history_wire::chat::parse_history(value)
            .map_err(|e| ApiError::bad_input(format!("messages: {e}")))?,
    };
    if messages.is_empty() {
        return Err(ApiError::bad_input("messages: a turn needs at least one message"));
    }
    let context = match body.get("context") {
        None | Some(Value::Null) => Vec::new(),
        Some(value) => ContextItem::parse_list(value)?,
    };
    let input = TurnInput {
        messages,
        model: string_member(&body, "model")?,
        context,
    };
    Ok((input, AnswerShape { form, delta }))
}

async fn model(
    State(app): State<App>,
    Path(id): Path<String>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Json<Value>> {
    let model = model_body(&bytes(body)?)?;
    let outcome = app.service.switch_model(&id, model).await?;
    Ok(Json(switch_json(&outcome)))
}

/// `PUT /v1/sessions/{id}/expiration_override` `{expiration_override}`.
async fn expiration_override(
    State(app): State<App>,
    Path(id): Path<String>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Json<Value>> {
    let body = object(&bytes(body)?)?;
    only(&body, &["expiration_override"])?;
    let value = body.get("expiration_override").cloned().ok_or_else(|| {
        ApiError::bad_input("missing \"expiration_override\" (an object, or null to remove it)")
    })?;
    let now = app.service.set_expiration_override(&id, Some(value)).await?;
    Ok(Json(serde_json::json!({ "expiration_override": now })))
}

async fn command(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Json<Value>> {
    let command = command_body(&bytes(body)?)?;
    app.service.info(&id)?;
    if command.is_host_wide() {
        operator(&app, &headers)?;
    }
    Ok(Json(command_json(&app.service.command(&id, command).await?)))
}

/// `POST /v1/sessions/{id}/model`: the model.
pub(crate) fn model_body(bytes: &[u8]) -> Result<String> {
    let body = object(bytes)?;
    only(&body, &["model"])?;
    string_member(&body, "model")?.ok_or_else(|| ApiError::bad_input("missing \"model\""))
}

/// `POST /v1/sessions/{id}/commands`: the command.
pub(crate) fn command_body(bytes: &[u8]) -> Result<Command> {
    let body = object(bytes)?;
    only(&body, &["command"])?;
    let line = string_member(&body, "command")?.ok_or_else(|| ApiError::bad_input("missing \"command\""))?;
    Ok(Command::parse(&line)?)
}

async fn history(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>> {
    only_params(&query, &["view", "form"])?;
    let form = match query.get("form") {
        None => HistoryForm::Full,
        Some(name) => HistoryForm::parse(name).map_err(ApiError::bad_input)?,
    };
    let sent = match query.get("view").map(String::as_str) {
        None | Some("working") => false,
        Some("sent") => true,
        Some(other) => {
            return Err(ApiError::bad_input(format!(
                "view: expected working or sent, found \"{other}\""
            )))
        }
    };
    let history = app.service.history(&id, sent).await?;
    Ok(Json(json!({
        "view": if sent { "sent" } else { "working" },
        "size": history.len(),
        "history": history_json_as(&history, form),
    })))
}

/// `GET /v1/sessions/{id}/turns?last=N`: the last turns' records this host keeps, in
/// memory and bounded (docs/http-api.md#turns). The same rule as the history: whoever
/// knows the id.
async fn turns(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response> {
    only_params(&query, &["last"])?;
    let last = match query.get("last") {
        None => None,
        Some(_) => Some(number(&query, "last", 0)?.clamp(1, history_sessions::TURN_LOG_LEN as u64) as usize),
    };
    let records = app.service.turns(&id, last).await?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        turn_records_json(history_sessions::TURN_LOG_LEN, &records),
    )
        .into_response())
}

/// Refuses query parameters other than `known`: a misspelt one is not ignored.
fn only_params(query: &HashMap<String, String>, known: &[&str]) -> Result<()> {
    match query.keys().find(|k| !known.contains(&k.as_str())) {
        Some(key) => Err(ApiError::bad_input(format!(
            "unknown query parameter \"{}\" (expected {})",
            history_engine::echo::bare(key),
            known.join(", ")
        ))),
        None => Ok(()),
    }
}

fn number(query: &HashMap<String, String>, key: &str, default: u64) -> Result<u64> {
    match query.get(key) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|_| ApiError::bad_input(format!("{key}: expected an integer ≥ 0, found \"{v}\""))),
    }
}

async fn transcript(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>> {
    only_params(&query, &["from", "limit", "last"])?;
    let page = match query.get("last") {
        Some(_) if query.contains_key("from") || query.contains_key("limit") => {
            return Err(ApiError::bad_input(
                "last: give either last=N or from=N&limit=L, not both",
            ))
        }
        Some(_) => TranscriptPage::Last(number(&query, "last", 0)?.clamp(1, MAX_PAGE)),
        None => TranscriptPage::From {
            from: number(&query, "from", 1)?.max(1),
            limit: number(&query, "limit", MAX_PAGE)?.clamp(1, MAX_PAGE),
        },
    };
    let (from, rows, next) = app.service.transcript(&id, page).await?;
    let mut messages = Vec::with_capacity(rows.len());
    for row in &rows {
        messages.push(
            serde_json::from_str::<Value>(&row.message).map_err(|e| {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "store_failed", e.to_string())
            })?,
        );
    }
    Ok(Json(json!({"from": from, "messages": messages, "next": next})))
}

async fn expand(
    State(app): State<App>,
    Path(id): Path<String>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Json<Value>> {
    let target = expand_body(&bytes(body)?)?;
    Ok(Json(command_json(
        &app.service.command(&id, Command::Expand(target)).await?,
    )))
}

/// `POST /v1/sessions/{id}/expand`: the message to expand, by index or id.
pub(crate) fn expand_body(bytes: &[u8]) -> Result<String> {
    let body = object(bytes)?;
    only(&body, &["index", "id"])?;
    let target = match (body.get("index"), body.get("id")) {
        (Some(index), None) => index
            .as_u64()
            .map(|i| i.to_string())
            .ok_or_else(|| ApiError::bad_input(format!("index: expected an integer ≥ 0, found {index}")))?,
        (None, Some(Value::String(id))) if id.parse::<u64>().is_err() => id.clone(),
        (None, Some(id)) => {
            return Err(ApiError::bad_input(format!(
                "id: expected a message id, found {id}"
            )))
        }
        _ => return Err(ApiError::bad_input("give exactly one of \"index\" and \"id\"")),
    };
    Ok(target)
}

async fn delete(State(app): State<App>, Path(id): Path<String>) -> Result<StatusCode> {
    app.service.delete(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/proxy/traffic` (operator): the last proxy requests' numbers, no bodies
/// (docs/http-api.md#proxy-traffic).
async fn traffic(State(app): State<App>, headers: HeaderMap) -> Result<Json<Value>> {
    operator(&app, &headers)?;
    Ok(Json(app.traffic.json()))
}

async fn chain(State(app): State<App>) -> Json<Value> {
    let report = app.service.chain_report();
    let stages: Vec<Value> = report
        .stages
        .iter()
        .map(|s| {
            json!({
                "name": s.name,
                "version": s.version,
                "ingest": s.place == StagePlace::Ingest,
                "view": s.place == StagePlace::View,
                "calls": s.totals.calls,
                "seconds": s.totals.seconds,
                "skipped": s.totals.skipped,
                "failed": s.totals.failed,
                "quarantined": s.quarantined,
                "worker_starts": s.worker_starts,
                "program_starts": s.program_starts,
            })
        })
        .collect();
    Json(json!({
        "stages": stages,
        "on_plugin_error": report.on_plugin_error,
        "agent_max_ctx": report.agent_max_ctx,
        "max_users": report.max_users,
        "session_idle_timeout_minutes": report.session_idle_timeout_minutes,
        "last_reload": report.last_reload.as_ref().map(last_reload_json),
    }))
}

/// Liveness: the process answers. Nothing it could fix by a restart is reported here
/// (docs/http-api.md#probes).
async fn livez() -> Response {
    (StatusCode::OK, "ok\n").into_response()
}

/// Readiness: whether the host can take turns now, with every reason it cannot, and the
/// notes that are no reason (a refused reload: the previous chain serves), one per line.
async fn readyz(State(app): State<App>) -> Response {
    let mut readiness = app.service.readiness().await;
    if app.service.is_shutting_down() {
        readiness.unready.insert(0, "shutting down".to_string());
    }
    let mut body = if readiness.unready.is_empty() {
        "ok\n".to_string()
    } else {
        readiness
            .unready
            .iter()
            .map(|reason| format!("{reason}\n"))
            .collect()
    };
    for note in &readiness.notes {
        body.push_str(&format!("note: {note}\n"));
    }
    let status = if readiness.unready.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body).into_response()
}

async fn metrics(State(app): State<App>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            history_sessions::metrics::CONTENT_TYPE,
        )],
        app.service.metrics_text(),
    )
        .into_response()
}
