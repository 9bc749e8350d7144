//! The last proxy requests, in memory and bounded, for the inspector page
//! (docs/http-api.md#proxy-traffic): their numbers, never a header, and their bodies only
//! under `[ui] keep_bodies = true` (docs/configuration.md#ui), each cut at `max_body_kb`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::response::Response;
use http_body_util::BodyExt;
use serde_json::{json, Value};

/// The requests kept: the oldest goes when one more comes.
pub(crate) const TRAFFIC_LEN: usize = 200;

/// One proxied request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Request {
    /// When it came, in ms since the epoch.
    pub(crate) at: u64,
    pub(crate) wire: &'static str,
    pub(crate) model: Option<String>,
    /// `X-History-Session` given: a session turn, not stateless.
    pub(crate) session: bool,
    pub(crate) messages_in: usize,
    pub(crate) messages_sent: usize,
    pub(crate) tokens_in: u64,
    pub(crate) tokens_sent: u64,
    /// What the host added before forwarding: parsing and the chain.
    pub(crate) added_ms: f64,
    /// The upstream's status, or the proxy's own error status when it never answered.
    pub(crate) status: u16,
}

impl Request {
    /// A request whose history the chain ran on as `run`.
    pub(crate) fn of_run(
        at: u64,
        wire: &'static str,
        model: Option<String>,
        session: bool,
        run: &history_engine::ChainRun,
        added_ms: f64,
        status: u16,
    ) -> Request {
        Request {
            at,
            wire,
            model,
            session,
            messages_in: run.messages_in,
            messages_sent: run.history.len(),
            tokens_in: run.tokens_in,
            tokens_sent: run.tokens_out,
            added_ms,
            status,
        }
    }
}

/// One body's first bytes, at most the bound, and its whole length.
#[derive(Debug, Default)]
struct Kept {
    bytes: Vec<u8>,
    total: usize,
}

impl Kept {
    fn add(&mut self, chunk: &[u8], bound: usize) {
        let room = bound.saturating_sub(self.bytes.len());
        self.bytes.extend_from_slice(&chunk[..chunk.len().min(room)]);
        self.total += chunk.len();
    }

    fn json(&self) -> Value {
        json!({
            "text": String::from_utf8_lossy(&self.bytes),
            "bytes": self.total,
            "cut": self.total > self.bytes.len(),
        })
    }
}

/// A request's bodies: what went upstream, and the answer as it passed through (filled
/// while the client reads it).
#[derive(Debug, Default)]
struct Bodies {
    sent: Kept,
    answer: Mutex<Kept>,
}

/// The last [`TRAFFIC_LEN`] requests.
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    requests: Mutex<VecDeque<(Request, Option<Arc<Bodies>>)>>,
    /// `[ui] keep_bodies`: each body's bound in bytes; `None`: no bodies kept.
    keep: Option<usize>,
}

impl Traffic {
    pub(crate) fn new(ui: &history_engine::config::UiConfig) -> Traffic {
        Traffic {
            requests: Mutex::default(),
            keep: ui
                .keep_bodies
                .then(|| usize::try_from(ui.max_body_kb.saturating_mul(1024)).unwrap_or(usize::MAX)),
        }
    }

    /// Whether bodies are kept: the caller keeps the body it sends upstream for
    /// [`Traffic::record`] then.
    pub(crate) fn keeps_bodies(&self) -> bool {
        self.keep.is_some()
    }

    /// Records `request`; with bodies kept, `sent` (the body that went upstream) and the
    /// answer's body as the client reads it (`answer`'s body is wrapped to see it pass).
    pub(crate) fn record(&self, request: Request, sent: Option<&Bytes>, answer: Option<&mut Response>) {
        let bodies = match (self.keep, sent) {
            (Some(bound), Some(sent)) => {
                let mut bodies = Bodies::default();
                bodies.sent.add(sent, bound);
                let bodies = Arc::new(bodies);
                if let Some(answer) = answer {
                    let seen = bodies.clone();
                    let body = std::mem::take(answer.body_mut()).map_frame(move |frame| {
                        if let Some(data) = frame.data_ref() {
                            seen.answer
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .add(data, bound);
                        }
                        frame
                    });
                    *answer.body_mut() = Body::new(body);
                }
                Some(bodies)
            }
            _ => None,
        };
        let mut requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        if requests.len() == TRAFFIC_LEN {
            requests.pop_front();
        }
        requests.push_back((request, bodies));
    }

    /// Every kept request as JSON, oldest first.
    pub(crate) fn json(&self) -> Value {
        let requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        let list: Vec<Value> = requests
            .iter()
            .map(|(r, bodies)| {
                let mut row = json!({
                    "at": history_sessions::clock::rfc3339(r.at),
                    "wire": r.wire,
                    "model": r.model,
                    "session": r.session,
                    "messages_in": r.messages_in,
                    "messages_sent": r.messages_sent,
                    "tokens_in": r.tokens_in,
                    "tokens_sent": r.tokens_sent,
                    "added_ms": r.added_ms,
                    "status": r.status,
                });
                if let Some(bodies) = bodies {
                    let answer = bodies.answer.lock().unwrap_or_else(|e| e.into_inner()).json();
                    row["bodies"] = json!({"sent": bodies.sent.json(), "answer": answer});
                }
                row
            })
            .collect();
        json!({"kept": TRAFFIC_LEN, "bodies": self.keep.is_some(), "requests": list})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_keeps_the_last_requests() {
        let traffic = Traffic::default();
        for n in 0..TRAFFIC_LEN + 3 {
            traffic.record(
                Request {
                    at: n as u64,
                    wire: "chat",
                    model: None,
                    session: false,
                    messages_in: n,
                    messages_sent: n,
                    tokens_in: 0,
                    tokens_sent: 0,
                    added_ms: 0.0,
                    status: 200,
                },
                Some(&Bytes::from_static(b"{}")),
                None,
            );
        }
        let json = traffic.json();
        let requests = json["requests"].as_array().unwrap();
        assert_eq!(requests.len(), TRAFFIC_LEN);
        assert_eq!(requests[0]["messages_in"], 3);
        assert!(
            requests[0].get("bodies").is_none(),
            "no bodies unless [ui] keep_bodies"
        );
    }

    #[tokio::test]
    async fn with_keep_bodies_the_bodies_are_kept_cut_at_the_bound() {
        let ui = history_engine::config::UiConfig {
            keep_bodies: true,
            max_body_kb: 1,
        };
        let traffic = Traffic::new(&ui);
        let request = Request {
            at: 0,
            wire: "chat",
            model: None,
            session: false,
            messages_in: 1,
            messages_sent: 1,
            tokens_in: 0,
            tokens_sent: 0,
            added_ms: 0.0,
            status: 200,
        };
        let sent = Bytes::from("x".repeat(1500));
        let mut answer = Response::new(Body::from("<script>ok</script>"));
        traffic.record(request, Some(&sent), Some(&mut answer));
        // The client reads the answer whole, unchanged.
        let read = answer.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&read[..], b"<script>ok</script>");
        let json = traffic.json();
        let bodies = &json["requests"][0]["bodies"];
        assert_eq!(bodies["sent"]["bytes"], 1500);
        assert_eq!(bodies["sent"]["text"].as_str().unwrap().len(), 1024);
        assert_eq!(bodies["sent"]["cut"], true);
        assert_eq!(bodies["answer"]["text"], "<script>ok</script>");
        assert_eq!(bodies["answer"]["cut"], false);
        assert_eq!(json["bodies"], true);
    }
}
