//! What the agent asks for when the chain trimmed it (docs/mcp.md): the session's whole
//! transcript searched by BM25, as `relevance` scores (`history-bm25`), and transcript
//! messages by identity, e.g. the ones a summary's `summary_of` names. Expansion itself is
//! the `!expand` command (`settings`). The same search, by exchange, answers a plugin's
//! `ctx.recall` during an operation on the session ([`TranscriptRecall`]).

use std::sync::Arc;

use history_wire::chat::parse_message;
use plugin_api::{Message, RArc, Role};

use super::Service;
use crate::error::{ErrorKind, SessionError};
use crate::store::{Store, TranscriptRow};

/// The most transcript messages one search or lookup reads.
const MAX_SCANNED: u64 = 100_000;

/// A transcript message found by a search or a lookup.
#[derive(Debug, Clone)]
pub struct Recalled {
    /// Its identity: `metadata.id`, else `#` and its transcript position (what
    /// placeholders, `summary_of` and `expand_message` name it by).
    pub identity: String,
    /// Its transcript position, from 1.
    pub seq: u64,
    pub turn: u64,
    /// Its BM25 score against the query (0 for a lookup).
    pub score: f64,
    pub message: Message,
}

impl Service {
    /// The `limit` messages of session `id`'s transcript that best match `query`, best
    /// first; messages matching no query word are left out.
    pub async fn search_transcript(
        self: &Arc<Self>,
        id: &str,
        query: &str,
        limit: usize,
    ) -> Result<Vec<Recalled>, SessionError> {
        let query: Vec<String> = distinct_words(query);
        if query.is_empty() {
            return Err(SessionError::bad_input(
                "query: no word to search for (stop words like \"the\" are left out)",
            ));
        }
        let messages = self.transcript_messages(id).await?;
        let mut found: Vec<Recalled> = scored(messages, &query)
            .into_iter()
            .filter(|found| found.score > 0.0)
            .collect();
        // Best first; among equals the newer.
        found.sort_by(|a, b| b.score.total_cmp(&a.score).then(b.seq.cmp(&a.seq)));
        found.truncate(limit);
        Ok(found)
    }

    /// The messages of session `id`'s transcript with the identities `ids`, in that
    /// order; `None` for an identity no message has.
    pub async fn recall_messages(
        self: &Arc<Self>,
        id: &str,
        ids: &[String],
    ) -> Result<Vec<(String, Option<Recalled>)>, SessionError> {
        let messages = self.transcript_messages(id).await?;
        Ok(ids
            .iter()
            .map(|wanted| {
                let found = messages.iter().find(|m| &m.identity == wanted).cloned();
                (wanted.clone(), found)
            })
            .collect())
    }

    /// Every message of the transcript (up to [`MAX_SCANNED`]), parsed.
    async fn transcript_messages(self: &Arc<Self>, id: &str) -> Result<Vec<Recalled>, SessionError> {
        self.find(id).await?;
        let service = self.clone();
        let id = id.to_string();
        tokio::task::spawn_blocking(move || {
            let rows = service.store.transcript(&id, 1, MAX_SCANNED)?;
            rows.into_iter()
                .map(recalled)
                .collect::<Result<Vec<_>, SessionError>>()
        })
        .await
        .unwrap_or_else(|e| Err(SessionError::new(ErrorKind::Store, e.to_string())))
    }
}

/// `messages`, each with its BM25 score against `query` (distinct words, no stop words),
/// every message a document.
fn scored(messages: Vec<Recalled>, query: &[String]) -> Vec<Recalled> {
    let documents: Vec<Vec<String>> = messages
        .iter()
        .map(|found| {
            found
                .message
                .token_items()
                .flat_map(history_bm25::words)
                .filter(|w| !history_bm25::DEFAULT_STOP_WORDS.contains(&w.as_str()))
                .collect()
        })
        .collect();
    let scores = history_bm25::scores(query, &documents);
    messages
        .into_iter()
        .zip(scores)
        .map(|(mut found, score)| {
            found.score = score;
            found
        })
        .collect()
}

/// A session's transcript as `ctx.recall` searches it (docs/abi.md#host-services): read
/// from the store at each call, for the time of one operation on the session
/// ([`history_engine::recall::provide`]).
pub(crate) struct TranscriptRecall {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) session: String,
}

impl history_engine::recall::Transcript for TranscriptRecall {
    fn recall(&self, query: &str, limit: usize) -> Result<Vec<plugin_api::Recalled>, String> {
        let query = distinct_words(query);
        if query.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let rows = self
            .store
            .transcript(&self.session, 1, MAX_SCANNED)
            .map_err(|e| format!("the session's transcript could not be read: {e}"))?;
        let messages = rows
            .into_iter()
            .map(recalled)
            .collect::<Result<Vec<_>, SessionError>>()
            .map_err(|e| e.to_string())?;
        Ok(exchanges(scored(messages, &query), limit))
    }
}

/// The `limit` best exchanges of a scored transcript, best first (among equals the newer):
/// an exchange is a user message and every message after it up to the next user message
/// (the messages before the first user message are one too), scored by its best message.
fn exchanges(messages: Vec<Recalled>, limit: usize) -> Vec<plugin_api::Recalled> {
    let mut all: Vec<(f64, Vec<Recalled>)> = Vec::new();
    for found in messages {
        match all.last_mut() {
            Some((score, members)) if found.message.role != Role::User => {
                *score = score.max(found.score);
                members.push(found);
            }
            _ => all.push((found.score, vec![found])),
        }
    }
    let mut best: Vec<(usize, f64)> = all
        .iter()
        .enumerate()
        .filter(|(_, (score, _))| *score > 0.0)
        .map(|(at, (score, _))| (at, *score))
        .collect();
    best.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
    best.truncate(limit);
    best.into_iter()
        .map(|(at, score)| plugin_api::Recalled {
            score,
            messages: std::mem::take(&mut all[at].1)
                .into_iter()
                .map(|found| RArc::new(found.message))
                .collect(),
        })
        .collect()
}

fn recalled(row: TranscriptRow) -> Result<Recalled, SessionError> {
    let value: serde_json::Value = serde_json::from_str(&row.message)
        .map_err(|e| SessionError::new(ErrorKind::Store, format!("transcript message {}: {e}", row.seq)))?;
    let mut message = parse_message(&value)
        .map_err(|e| SessionError::new(ErrorKind::Store, format!("transcript message {}: {e}", row.seq)))?;
    message.set_origin(row.seq);
    // The turn it entered on, as the working history's messages carry theirs.
    message.turn = row.turn;
    Ok(Recalled {
        identity: message.identity(),
        seq: row.seq,
        turn: row.turn,
        score: 0.0,
        message,
    })
}

/// The query's words, each once, without stop words.
fn distinct_words(query: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    for word in history_bm25::words(query) {
        if !history_bm25::DEFAULT_STOP_WORDS.contains(&word.as_str()) && !words.contains(&word) {
            words.push(word);
        }
    }
    words
}
