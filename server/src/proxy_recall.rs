//! The proxy's recall loop (docs/mcp.md#the-proxy): with `[upstream] recall_tools`, a
//! session's plain chat request offers the model the recall tools beside its own; when
//! the model's answer calls only recall tools, the host runs them, adds the call and its
//! results to the conversation and asks the upstream again, at most `max_recall_rounds`
//! times. The client sees one answer, the last. The session keeps what `expand_message`
//! expanded; the exchange itself is not stored (the client's next request resends the
//! conversation as it knows it).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::Response;
use history_sessions::Service;
use serde_json::{json, Value};

use crate::body::{add_member, forwarded_body, member, Member};
use crate::proxy::{forward, OpenAiError};
use crate::upstream::Upstream;

/// The most bytes of an upstream answer the loop reads to look for recall calls.
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// Whether the request asks for a streamed answer (`"stream": true`): then the recall
/// tools are not offered, since their calls would reach the client mid-stream.
pub(crate) fn streamed(members: &[Member<'_>]) -> bool {
    members
        .iter()
        .any(|(key, raw)| key == "stream" && raw.is_some_and(|raw| raw.get().trim() == "true"))
}

/// One request's recall loop.
pub(crate) struct Recall<'a> {
    pub service: &'a Arc<Service>,
    pub session: &'a str,
    /// `max_recall_rounds`.
    pub rounds: u64,
}

impl Recall<'_> {
    /// Sends the request with `sent` as its messages and the recall tools added, runs the
    /// recall calls of each answer, and answers with the first answer that calls none (or
    /// the last one allowed). Adds `X-History-Recall: N` (rounds run).
    pub(crate) async fn run(
        &self,
        upstream: &Upstream,
        headers: &HeaderMap,
        members: &[Member<'_>],
        sent: &str,
    ) -> Result<Response, OpenAiError> {
        let mut messages: Vec<Value> = serde_json::from_str(sent).map_err(|e| bad_answer(e.to_string()))?;
        let own_tools: Vec<Value> = match member(members, "tools") {
            None => Vec::new(),
            Some(raw) => match serde_json::from_str(raw.get()) {
                Ok(Value::Array(tools)) => tools,
                Ok(Value::Null) => Vec::new(),
                _ => return Err(OpenAiError::invalid("tools: expected an array")),
            },
        };
        let taken = own_tools
            .iter()
            .filter_map(|tool| tool["function"]["name"].as_str())
            .find(|name| crate::recall::TOOLS.contains(name));
        if let Some(name) = taken {
            // The client's own tool of that name wins: its calls go back to the client.
            tracing::debug!("proxy: the request has its own tool {name:?}; no recall tools offered");
        }
        let mut round = 0;
        loop {
            let offer = taken.is_none() && round < self.rounds;
            let mut tools = own_tools.clone();
            if offer {
                tools.extend(crate::recall::chat_functions());
            }
            let body = with_members(members, &messages, (!tools.is_empty()).then_some(&tools));
            let response = forward(upstream, Method::POST, "/chat/completions", headers, body).await?;
            let (parts, body) = response.into_parts();
            let bytes = axum::body::to_bytes(body, MAX_ANSWER_BYTES)
                .await
                .map_err(|e| bad_answer(format!("the upstream's answer could not be read: {e}")))?;
            let calls = if offer && parts.status == StatusCode::OK {
                recall_calls(&bytes)
            } else {
                None
            };
            let Some((assistant, calls)) = calls else {
                let mut response = Response::from_parts(parts, Body::from(bytes));
                if let Ok(value) = HeaderValue::from_str(&round.to_string()) {
                    response
                        .headers_mut()
                        .insert(HeaderName::from_static("x-history-recall"), value);
                }
                return Ok(response);
            };
            round += 1;
            messages.push(assistant);
            for (id, name, arguments) in calls {
                let result = crate::recall::call(self.service, self.session, &name, &arguments).await;
                let content = match result {
                    Ok(value) => value.to_string(),
                    Err(why) => json!({"error": why}).to_string(),
                };
                tracing::debug!(
                    "proxy: recall {name} for session {} ({} bytes)",
                    self.session,
                    content.len()
                );
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
        }
    }
}

fn bad_answer(why: String) -> OpenAiError {
    OpenAiError::new(
        StatusCode::BAD_GATEWAY,
        "upstream_error",
        "bad_upstream_answer",
        why,
    )
}

/// The body sent upstream: the request's members as their bytes came, `messages` and
/// `tools` in their place (`tools` added last when the request had none, dropped when
/// `None`).
fn with_members(members: &[Member<'_>], messages: &[Value], tools: Option<&Vec<Value>>) -> Bytes {
    let messages = serde_json::to_string(messages).expect("a JSON value is written");
    let tools = tools.map(|tools| serde_json::to_string(tools).expect("a JSON value is written"));
    let body = forwarded_body(
        members,
        &messages,
        &[("messages", Some(&messages)), ("tools", tools.as_deref())],
    );
    match tools {
        Some(tools) if !members.iter().any(|(key, _)| key == "tools") => {
            add_member(&body, "tools", &tools, false)
        }
        _ => body,
    }
}

/// A model's call of a recall tool: its id, the tool's name, its arguments (JSON text).
type RecallCall = (String, String, String);

/// The answer's assistant message and its calls when it calls recall tools only; `None`
/// for any other answer.
fn recall_calls(bytes: &[u8]) -> Option<(Value, Vec<RecallCall>)> {
    let answer: Value = serde_json::from_slice(bytes).ok()?;
    let message = answer["choices"][0]["message"].clone();
    let calls = message["tool_calls"].as_array()?;
    let mut out = Vec::with_capacity(calls.len());
    for call in calls {
        let name = call["function"]["name"].as_str()?;
        if !crate::recall::TOOLS.contains(&name) {
            return None;
        }
        let arguments = match &call["function"]["arguments"] {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        out.push((call["id"].as_str()?.to_string(), name.to_string(), arguments));
    }
    (!out.is_empty()).then_some((message, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_answer_calling_recall_tools_alone_is_run() {
        let answer = |calls: Value| {
            json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": calls}}]})
                .to_string()
        };
        let call = |id: &str, name: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": "{\"id\":\"s-3\"}"}});
        let (_, calls) = recall_calls(answer(json!([call("a", "expand_message")])).as_bytes()).unwrap();
        assert_eq!(
            calls,
            [(
                "a".to_string(),
                "expand_message".to_string(),
                "{\"id\":\"s-3\"}".to_string()
            )]
        );
        assert!(recall_calls(
            answer(json!([call("a", "expand_message"), call("b", "read_file")])).as_bytes()
        )
        .is_none());
        assert!(recall_calls(answer(json!([])).as_bytes()).is_none());
        assert!(recall_calls(br#"{"choices":[{"message":{"role":"assistant","content":"hi"}}]}"#).is_none());
        assert!(recall_calls(b"not json").is_none());
    }

    #[test]
    fn the_tools_are_added_in_place_or_last_and_other_members_kept() {
        let body = r#"{"model":"m","messages":[],"temperature":0.50}"#;
        let members = match crate::body::RequestBody::read(body.as_bytes(), Some("messages")) {
            Ok(crate::body::RequestBody::Object(body)) => body.members,
            _ => unreachable!("an object"),
        };
        let out = with_members(
            &members,
            &[json!({"role": "user", "content": "q"})],
            Some(&vec![json!({"type": "function"})]),
        );
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"model":"m","messages":[{"role":"user","content":"q"}],"temperature":0.50,"tools":[{"type":"function"}]}"#
        );
        // Tools the request had: replaced in their place, or dropped.
        let body = r#"{"tools":[{"own":1}],"messages":[]}"#;
        let members = match crate::body::RequestBody::read(body.as_bytes(), Some("messages")) {
            Ok(crate::body::RequestBody::Object(body)) => body.members,
            _ => unreachable!("an object"),
        };
        let out = with_members(&members, &[], Some(&vec![json!(2)]));
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"tools":[2],"messages":[]}"#
        );
        let out = with_members(&members, &[], None);
        assert_eq!(std::str::from_utf8(&out).unwrap(), r#"{"messages":[]}"#);
        assert!(!streamed(&members));
    }
}
