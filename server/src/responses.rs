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
use plugin_api::{Message, RArc};
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::app::App;
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
    let bytes = body.map_err(|rejection| {
        OpenAiError::new(
            rejection.status(),
            "invalid_request_error",
            "invalid_body",
            format!("cannot read the body: {}", rejection.body_text()),
        )
    })?;
    let members = match serde_json::from_slice::<Body<'_>>(&bytes) {
        Ok(Body::Object(members)) => members,
        Ok(Body::Other) => return Err(OpenAiError::invalid("the body must be a JSON object")),
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
    let input = member(&members, "input").ok_or_else(|| OpenAiError::invalid("missing \"input\""))?;
    let parsed = history_wire::responses::parse(member(&members, "instructions"), input)
        .map_err(OpenAiError::invalid)?;
    if parsed.messages.is_empty() {
        return Err(OpenAiError::invalid("input: at least one item is needed"));
    }
    let StatelessRun { run, unknown_model } = run_chain(&app, &headers, &parsed.messages, model).await?;
    let written = parsed.record.write(&run.history);
    let body = forwarded_body(&members, &written);
    drop(parsed);
    drop(members);
    drop(bytes);

    let mut response = forward(upstream, Method::POST, PATH, &headers, body).await?;
    let added = response.headers_mut();
    let mut add = |name: &'static str, value: String| {
        if let Ok(value) = HeaderValue::from_str(&value) {
            added.insert(HeaderName::from_static(name), value);
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
        let shown = history_engine::echo::quoted(&name);
        add("x-history-model", format!("default (unknown {shown})"));
    }
    Ok(response)
}

/// The chain on the request's messages: a turn of the session `X-History-Session` names,
/// or a stateless run.
async fn run_chain(
    app: &App,
    headers: &HeaderMap,
    messages: &[RArc<Message>],
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
            let messages = messages
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
            let mut history = messages.to_vec();
            let turn = turns::current_turn(&history, None);
            turns::prepare(&mut history, turn);
            Ok(app.service.run_stateless("proxy", history, turn, model).await?)
        }
    }
}

fn member<'a>(members: &[(String, &'a RawValue)], name: &str) -> Option<&'a RawValue> {
    members.iter().find(|(key, _)| key == name).map(|(_, raw)| *raw)
}

/// The body sent upstream: the request's members in their order and as their bytes came,
/// `input` the written history and `instructions` the written system text (left out when
/// the chain did not keep it).
fn forwarded_body(members: &[(String, &RawValue)], written: &history_wire::responses::Written) -> Bytes {
    let size = members
        .iter()
        .map(|(key, raw)| key.len() + raw.get().len() + 4)
        .sum::<usize>();
    let mut out = Vec::with_capacity(size + written.input.len());
    out.push(b'{');
    for (key, raw) in members {
        let value = match key.as_str() {
            "input" => written.input.as_str(),
            "instructions" => match &written.instructions {
                Some(text) => text.as_str(),
                None if raw.get() == "null" => raw.get(),
                None => continue,
            },
            _ => raw.get(),
        };
        if out.len() > 1 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, key).expect("writing to a Vec cannot fail");
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
    }
    out.push(b'}');
    Bytes::from(out)
}

/// A request body: an object's members in their order, each value as its raw JSON text
/// (borrowed from the body), or any other JSON value.
enum Body<'a> {
    Object(Vec<(String, &'a RawValue)>),
    Other,
}

impl<'de> Deserialize<'de> for Body<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = Body<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
                let mut members: Vec<(String, &'de RawValue)> = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    let value = map.next_value::<&'de RawValue>()?;
                    // A repeated key: the last value in the first one's place, as
                    // serde_json reads it (docs/proxy.md#what-goes-upstream).
                    match members.iter_mut().find(|(k, _)| *k == key) {
                        Some(member) => member.1 = value,
                        None => members.push((key, value)),
                    }
                }
                Ok(Body::Object(members))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Body::Other)
            }

            fn visit_bool<E>(self, _: bool) -> std::result::Result<Self::Value, E> {
                Ok(Body::Other)
            }
            fn visit_i64<E>(self, _: i64) -> std::result::Result<Self::Value, E> {
                Ok(Body::Other)
            }
            fn visit_u64<E>(self, _: u64) -> std::result::Result<Self::Value, E> {
                Ok(Body::Other)
            }
            fn visit_f64<E>(self, _: f64) -> std::result::Result<Self::Value, E> {
                Ok(Body::Other)
            }
            fn visit_str<E>(self, _: &str) -> std::result::Result<Self::Value, E> {
                Ok(Body::Other)
            }
            fn visit_unit<E>(self) -> std::result::Result<Self::Value, E> {
                Ok(Body::Other)
            }
        }
        deserializer.deserialize_any(Members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use history_wire::responses::Written;

    fn members(body: &str) -> Vec<(String, &RawValue)> {
        match serde_json::from_str::<Body<'_>>(body) {
            Ok(Body::Object(members)) => members,
            _ => panic!("not an object: {body}"),
        }
    }

    #[test]
    fn the_forwarded_body_keeps_every_other_member_in_place_and_drops_instructions_not_kept() {
        let body =
            r#"{"model":"m", "instructions":"be", "input":[{"type":"x"}], "store": false ,"z":{"a":1.50}}"#;
        let written = Written {
            instructions: Some(r#""be!""#.into()),
            input: "[]".into(),
        };
        let forwarded = forwarded_body(&members(body), &written);
        assert_eq!(
            std::str::from_utf8(&forwarded).unwrap(),
            r#"{"model":"m","instructions":"be!","input":[],"store":false,"z":{"a":1.50}}"#
        );
        let body = r#"{"instructions":"be","input":"hi"}"#;
        let written = Written {
            instructions: None,
            input: r#""hi""#.into(),
        };
        let forwarded = forwarded_body(&members(body), &written);
        assert_eq!(std::str::from_utf8(&forwarded).unwrap(), r#"{"input":"hi"}"#);
    }
}
