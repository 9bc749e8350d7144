//! The last stateless proxy requests, in memory and bounded, for the inspector page
//! (docs/http-api.md#proxy-traffic): numbers only, never a body or a header.

use std::collections::VecDeque;
use std::sync::Mutex;

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

/// The last [`TRAFFIC_LEN`] requests.
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    requests: Mutex<VecDeque<Request>>,
}

impl Traffic {
    pub(crate) fn record(&self, request: Request) {
        let mut requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        if requests.len() == TRAFFIC_LEN {
            requests.pop_front();
        }
        requests.push_back(request);
    }

    /// Every kept request as JSON, oldest first.
    pub(crate) fn json(&self) -> Value {
        let requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        let list: Vec<Value> = requests
            .iter()
            .map(|r| {
                json!({
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
                })
            })
            .collect();
        json!({"kept": TRAFFIC_LEN, "requests": list})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_keeps_the_last_requests() {
        let traffic = Traffic::default();
        for n in 0..TRAFFIC_LEN + 3 {
            traffic.record(Request {
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
            });
        }
        let json = traffic.json();
        let requests = json["requests"].as_array().unwrap();
        assert_eq!(requests.len(), TRAFFIC_LEN);
        assert_eq!(requests[0]["messages_in"], 3);
    }
}
