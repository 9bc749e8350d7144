//! The recall tools themselves (docs/mcp.md#the-tools), one implementation for both ways
//! an agent reaches them: the MCP server (`mcp`) and the proxy, which offers them to the
//! model as functions and runs the calls it makes (`proxy_recall`). Each answers JSON, or
//! a reason the model can read and act on.

use std::sync::Arc;

use history_sessions::{Command, CommandAnswer, Recalled, Service};
use serde_json::{json, Value};

/// The tools' names, as the model calls them.
pub(crate) const TOOLS: [&str; 3] = ["expand_message", "search_history", "get_messages"];
/// The most messages `search_history` and `get_messages` answer with.
const MAX_RESULTS: usize = 50;
/// The most characters of a message's text a search result shows.
const SNIPPET_CHARS: usize = 600;

/// A transcript message as the tools show it.
fn shown(found: &Recalled, snippet: bool) -> Value {
    let mut text = found.message.content.text();
    for call in &found.message.tool_calls {
        text.push_str(&format!(
            "\ncall {}({})",
            call.name.as_str(),
            call.arguments.as_str()
        ));
    }
    if snippet && text.chars().count() > SNIPPET_CHARS {
        text = text.chars().take(SNIPPET_CHARS).collect::<String>() + "…";
    }
    let mut value = json!({
        "id": found.identity,
        "position": found.seq,
        "turn": found.turn,
        "role": found.message.role.as_str(),
        "text": text,
    });
    if let Some(call) = found.message.call_id() {
        value["tool_call_id"] = json!(call);
    }
    if found.score > 0.0 {
        value["score"] = json!((found.score * 1000.0).round() / 1000.0);
    }
    value
}

/// `expand_message`: the original of message `id` (a metadata id, `#N`, or a working
/// index), which the session keeps expanded.
pub(crate) async fn expand(service: &Arc<Service>, session: &str, id: &str) -> Result<Value, String> {
    match service.command(session, Command::Expand(id.to_string())).await {
        Ok(CommandAnswer::Expand {
            index,
            message,
            event,
        }) => {
            let found = Recalled {
                identity: message.identity(),
                seq: message.origin(),
                turn: message.turn,
                score: 0.0,
                message: (*message).clone(),
            };
            let mut value = shown(&found, false);
            value["index"] = json!(index);
            value["note"] = json!(event.reason.as_str());
            Ok(value)
        }
        Ok(_) => Err("expansion answered something else".into()),
        Err(e) => Err(e.message),
    }
}

/// `search_history`: the best `limit` (default 5) transcript messages for `query`.
pub(crate) async fn search(
    service: &Arc<Service>,
    session: &str,
    query: &str,
    limit: Option<usize>,
) -> Result<Value, String> {
    let limit = limit.unwrap_or(5).clamp(1, MAX_RESULTS);
    let found = service
        .search_transcript(session, query, limit)
        .await
        .map_err(|e| e.message)?;
    Ok(json!({"matches": found.iter().map(|f| shown(f, true)).collect::<Vec<_>>()}))
}

/// `get_messages`: transcript messages by id, an unknown id named.
pub(crate) async fn messages(service: &Arc<Service>, session: &str, ids: &[String]) -> Result<Value, String> {
    if ids.is_empty() || ids.len() > MAX_RESULTS {
        return Err(format!("ids: give 1 to {MAX_RESULTS} message ids"));
    }
    let found = service
        .recall_messages(session, ids)
        .await
        .map_err(|e| e.message)?;
    Ok(json!({
        "messages": found
            .iter()
            .map(|(id, found)| match found {
                Some(found) => shown(found, false),
                None => json!({"id": id, "error": "no message of this session has this id"}),
            })
            .collect::<Vec<_>>(),
    }))
}

/// Runs recall tool `name` with `arguments` (a model's call: JSON text) on `session`.
pub(crate) async fn call(
    service: &Arc<Service>,
    session: &str,
    name: &str,
    arguments: &str,
) -> Result<Value, String> {
    let args: Value = serde_json::from_str(arguments).map_err(|e| format!("arguments: not JSON: {e}"))?;
    let text = |key: &str| {
        args[key]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("{name}: `{key}` must be a string"))
    };
    match name {
        "expand_message" => expand(service, session, &text("id")?).await,
        "search_history" => {
            let limit = args["limit"].as_u64().map(|n| n as usize);
            search(service, session, &text("query")?, limit).await
        }
        "get_messages" => {
            let ids: Vec<String> = args["ids"]
                .as_array()
                .ok_or_else(|| "get_messages: `ids` must be an array of strings".to_string())?
                .iter()
                .filter_map(|id| id.as_str().map(str::to_string))
                .collect();
            messages(service, session, &ids).await
        }
        other => Err(format!(
            "no recall tool is named {}",
            history_engine::echo::quoted(other)
        )),
    }
}

/// The tools as chat-completions function definitions: what the proxy adds to a
/// request's `tools` (the session is the request's, so no `session` parameter).
pub(crate) fn chat_functions() -> Vec<Value> {
    let function = |name: &str, description: &str, properties: Value, required: &[&str]| {
        json!({"type": "function", "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        }})
    };
    vec![
        function(
            "expand_message",
            "Read the original of a message the history manager omitted or compacted, by the id its placeholder names. It stays expanded from then on.",
            json!({"id": {"type": "string", "description": "the message id the placeholder names"}}),
            &["id"],
        ),
        function(
            "search_history",
            "Search the whole conversation so far, including what the history manager trimmed, for the messages that best match a query.",
            json!({
                "query": {"type": "string", "description": "what to look for, in words"},
                "limit": {"type": "integer", "description": "how many messages, best first (default 5)"},
            }),
            &["query"],
        ),
        function(
            "get_messages",
            "Read messages of the conversation by id, e.g. the ones a summary stands for.",
            json!({"ids": {"type": "array", "items": {"type": "string"}}}),
            &["ids"],
        ),
    ]
}
