//! `history-summarizer`: the client behind the host's `summarize` service
//! (docs/plugins.md#the-summarizer). One job: turn a [`SummaryRequest`] into one
//! OpenAI-compatible chat-completions call to `[summarizer] url` and its answer into a
//! summary, within `timeout_ms`. The cache and the cuts are the engine's
//! (`history_engine::summarizer`); a binary installs [`connect`] with
//! `history_engine::summarizer::set_client`.

use std::sync::Arc;
use std::time::Duration;

use history_engine::config::SummarizerConfig;
use history_engine::summarizer::{Summarizer, SummaryRequest};
use plugin_api::echo;
use serde_json::{json, Value};

/// The client for one `[summarizer]` table. An unset `api_key_env` variable is an error
/// here, at load: the host refuses to start rather than fail every call.
pub fn connect(config: &SummarizerConfig) -> Result<Arc<dyn Summarizer>, String> {
    let api_key = match &config.api_key_env {
        None => None,
        Some(name) => match std::env::var(name) {
            Ok(key) if !key.is_empty() => Some(key),
            _ => {
                return Err(format!(
                    "api_key_env names {name}, which is not set in the environment (the API key goes there)"
                ))
            }
        },
    };
    let timeout = Duration::from_millis(config.timeout_ms);
    // Each phase, and the request as a whole (connecting, sending, reading the answer),
    // within timeout_ms.
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(timeout)
        .timeout_read(timeout)
        .timeout_write(timeout)
        .timeout(timeout)
        .redirects(0)
        .build();
    Ok(Arc::new(ChatCompletions {
        agent,
        endpoint: format!("{}/chat/completions", config.url),
        model: config.model.clone(),
        api_key,
        timeout_ms: config.timeout_ms,
    }))
}

/// An OpenAI-compatible chat-completions endpoint.
struct ChatCompletions {
    agent: ureq::Agent,
    endpoint: String,
    model: String,
    api_key: Option<String>,
    timeout_ms: u64,
}

/// The system prompt: what the summary is for and what it must keep.
fn system_prompt(target_chars: usize) -> String {
    format!(
        "You summarize text for a language model that will read your summary instead of the \
         original in its later turns of a conversation. Keep every fact it may need: names, \
         numbers, identifiers, file paths, commands, URLs, error messages, decisions taken and \
         their reasons, and what is still open. Drop pleasantries, repetition and decoration. \
         Write plain text in the text's own language, with no preamble (never \"Here is a \
         summary\") and no Markdown headings, in at most {target_chars} characters."
    )
}

/// The user message: the purpose, a note when the text was cut, then the text.
fn user_message(request: &SummaryRequest<'_>) -> String {
    let shown = request.text.chars().count();
    let cut = if shown < request.original_chars {
        format!(
            "The text was cut to its first {shown} of {} characters.\n",
            request.original_chars
        )
    } else {
        String::new()
    };
    format!(
        "Purpose of the summary: {}.\n{cut}\nText to summarize:\n\n{}",
        request.purpose, request.text
    )
}

/// The request body for `request`.
fn body(model: &str, request: &SummaryRequest<'_>) -> Value {
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": system_prompt(request.target_chars)},
            {"role": "user", "content": user_message(request)},
        ],
        "stream": false,
    })
}

/// The summary in a chat completion's answer: its first choice's message content.
fn answer_text(answer: &str) -> Result<String, String> {
    let value: Value = serde_json::from_str(answer).map_err(|e| {
        format!(
            "the summarizer's answer is not JSON ({e}): {}",
            echo::text(answer)
        )
    })?;
    match value["choices"][0]["message"]["content"].as_str() {
        Some(text) => Ok(text.to_string()),
        None => Err(format!(
            "the summarizer's answer has no choices[0].message.content: {}",
            echo::text(answer)
        )),
    }
}

impl ChatCompletions {
    /// "within timeout_ms (N ms)", or the part of it a plugin call had left.
    fn within(&self, timeout: Duration) -> String {
        let ms = timeout.as_millis();
        if ms >= u128::from(self.timeout_ms) {
            format!("within timeout_ms ({ms} ms)")
        } else {
            format!(
                "within the {ms} ms this plugin call had left of timeout_ms ({} ms)",
                self.timeout_ms
            )
        }
    }

    /// Why a call failed, in one line.
    fn failure(&self, error: ureq::Error, timeout: Duration) -> String {
        match error {
            ureq::Error::Status(status, response) => {
                let text = response.into_string().unwrap_or_default();
                let detail = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                    .unwrap_or(text);
                format!(
                    "the summarizer at {} answered {status}: {}",
                    self.endpoint,
                    echo::text(&detail)
                )
            }
            ureq::Error::Transport(transport) => {
                let text = transport.to_string();
                if text.contains("timed out") || text.contains("Resource temporarily unavailable") {
                    format!(
                        "no answer from the summarizer at {} {}",
                        self.endpoint,
                        self.within(timeout)
                    )
                } else {
                    format!(
                        "cannot reach the summarizer at {}: {}",
                        self.endpoint,
                        echo::text(&text)
                    )
                }
            }
        }
    }
}

impl Summarizer for ChatCompletions {
    fn summarize(&self, request: &SummaryRequest<'_>) -> Result<String, String> {
        let mut call = self
            .agent
            .post(&self.endpoint)
            .set("Content-Type", "application/json");
        if let Some(key) = &self.api_key {
            call = call.set("Authorization", &format!("Bearer {key}"));
        }
        let response = call
            .timeout(request.timeout)
            .send_string(&body(&self.model, request).to_string())
            .map_err(|e| self.failure(e, request.timeout))?;
        let answer = response.into_string().map_err(|e| {
            let e = e.to_string();
            if e.contains("timed out") {
                format!(
                    "no answer from the summarizer at {} {}",
                    self.endpoint,
                    self.within(request.timeout)
                )
            } else {
                format!("cannot read the summarizer's answer: {}", echo::text(&e))
            }
        })?;
        answer_text(&answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(text: &'a str, original_chars: usize) -> SummaryRequest<'a> {
        SummaryRequest {
            text,
            original_chars,
            target_chars: 300,
            purpose: "an expired tool result",
            timeout: Duration::from_millis(100),
        }
    }

    #[test]
    fn the_request_carries_the_prompt_the_purpose_and_the_text() {
        let body = body("small", &request("the text", 8));
        assert_eq!(body["model"], "small");
        let system = body["messages"][0]["content"].as_str().unwrap();
        assert!(
            system.contains("file paths") && system.contains("at most 300 characters"),
            "{system}"
        );
        let user = body["messages"][1]["content"].as_str().unwrap();
        assert_eq!(
            user,
            "Purpose of the summary: an expired tool result.\n\nText to summarize:\n\nthe text"
        );
        let cut = body_user(&request("the", 8));
        assert!(cut.contains("cut to its first 3 of 8 characters"), "{cut}");
    }

    fn body_user(request: &SummaryRequest<'_>) -> String {
        body("m", request)["messages"][1]["content"]
            .as_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn the_answer_is_the_first_choices_content() {
        let answer = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"short"}}]}"#;
        assert_eq!(answer_text(answer).unwrap(), "short");
        assert!(answer_text("{}")
            .unwrap_err()
            .contains("no choices[0].message.content"));
        assert!(answer_text("<html>").unwrap_err().contains("not JSON"));
    }

    #[test]
    fn an_unset_key_variable_is_refused_at_connect() {
        let config = SummarizerConfig {
            url: "http://127.0.0.1:9/v1".into(),
            model: "m".into(),
            api_key_env: Some("HISTORY_SUMMARIZER_TEST_KEY_NEVER_SET".into()),
            timeout_ms: 100,
            max_chars_in: 10,
        };
        let err = connect(&config).err().unwrap();
        assert!(
            err.contains("HISTORY_SUMMARIZER_TEST_KEY_NEVER_SET, which is not set"),
            "{err}"
        );
    }
}
