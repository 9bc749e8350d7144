//! Around every route: the body's deadline (a body stream that gives up, answered 408,
//! since hyper has none) and the drain (a request still running when `shutdown_grace_s`
//! ends is answered 503), docs/http-api.md#connections.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use tokio::sync::watch;

/// What every request watches: SIGTERM came (a body still being sent is cut), and the
/// drain's deadline passed (a request still running is answered 503).
#[derive(Clone)]
pub(super) struct Phases {
    pub(super) stopping: watch::Receiver<bool>,
    pub(super) deadline: watch::Receiver<bool>,
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let mut response = (
        status,
        axum::Json(serde_json::json!({"error": {"code": code, "message": message}})),
    )
        .into_response();
    // hyper closes the connection after an answer that says so.
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Why a request's body stopped coming.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cut {
    Timeout,
    Stopping,
}

/// The body timeout and the drain, around every route.
pub(super) async fn guard(phases: Phases, body_timeout: Duration, request: Request, next: Next) -> Response {
    if *phases.stopping.borrow() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the host is shutting down",
        );
    }
    let cut: Arc<std::sync::Mutex<Option<Cut>>> = Arc::default();
    let (parts, body) = request.into_parts();
    let deadline = tokio::time::Instant::now() + body_timeout;
    let mut stopping = phases.stopping.clone();
    let ends: std::pin::Pin<Box<dyn Future<Output = Cut> + Send>> = Box::pin(async move {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => Cut::Timeout,
            _ = stopping.wait_for(|s| *s) => Cut::Stopping,
        }
    });
    let seen = cut.clone();
    let stream = futures_util::stream::unfold(Some((body.into_data_stream(), ends)), move |state| {
        let seen = seen.clone();
        async move {
            let (mut data, mut ends) = state?;
            tokio::select! {
                biased;
                next = data.next() => next.map(|chunk| (chunk, Some((data, ends)))),
                why = &mut ends => {
                    *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
                    let e = axum::Error::new(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the body did not arrive in time",
                    ));
                    Some((Err(e), None))
                }
            }
        }
    });
    let request = Request::from_parts(parts, Body::from_stream(stream));
    let mut deadline = phases.deadline.clone();
    let response = tokio::select! {
        biased;
        response = next.run(request) => response,
        _ = deadline.wait_for(|d| *d) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the host shut down before this request finished (shutdown_grace_s); nothing of it was stored unless it had finished",
            )
        }
    };
    let cut = *cut.lock().unwrap_or_else(|e| e.into_inner());
    match cut {
        Some(Cut::Timeout) => error(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            &format!(
                "the request body did not arrive within {} s ([server] body_timeout_s)",
                body_timeout.as_secs()
            ),
        ),
        Some(Cut::Stopping) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the host is shutting down",
        ),
        None => response,
    }
}
