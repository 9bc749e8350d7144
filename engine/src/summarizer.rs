//! The summarize service behind `ctx.summarize` (docs/plugins.md#the-summarizer): which
//! summarizer answers, the cache in front of it, and the rules every answer follows
//! (input cut at `max_chars_in`, reply cut at the target, errors the plugin falls back
//! from).
//!
//! The engine knows no HTTP: a binary installs the client once at start
//! ([`set_client`], as it installs the log subscriber), and [`crate::load_chain`] connects
//! it to the configuration's `[summarizer]` ([`connect`]). Answers are cached by a
//! SHA-256 of (model, target, purpose, text): in memory by default ([`MemoryCache`]), in
//! the session store when a service installs its own ([`install_cache`]), so a text is
//! summarized once.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use plugin_api::echo;
use sha2::{Digest, Sha256};

use crate::config::{Config, ConfigError, SummarizerConfig};

/// What `summarize` answers when no summarizer is configured: an error the plugin falls
/// back from.
pub const NO_SUMMARIZER: &str = "no summarizer is configured ([summarizer] in plugins-enabled.toml)";

/// What `summarize` answers when `[summarizer]` is configured in a program that installed
/// no client (a test harness, the bench).
pub const NO_CLIENT: &str = "[summarizer] is configured, but this program has no summarizer client";

/// Below this much of its `timeout_ms` left, a plugin call's next request is not sent.
const MIN_REQUEST_TIME: Duration = Duration::from_millis(10);

/// Entries the in-memory cache holds before it forgets its oldest.
pub const MEMORY_CACHE_ENTRIES: usize = 4096;

/// One request for a summary, as the client sends it.
#[derive(Debug, Clone, Copy)]
pub struct SummaryRequest<'a> {
    /// The text, already cut to `max_chars_in` characters.
    pub text: &'a str,
    /// Characters in the text before the cut.
    pub original_chars: usize,
    /// The length asked for, in characters.
    pub target_chars: usize,
    /// What the summary is for (the plugin's words).
    pub purpose: &'a str,
    /// How long the call may take, connecting and reading included: `timeout_ms`, or what
    /// is left of it in this plugin call ([`summarize`]).
    pub timeout: Duration,
}

/// Something that makes summaries: the HTTP client a binary installs. It answers within
/// the configured `timeout_ms`, or with an error saying why not.
pub trait Summarizer: Send + Sync {
    fn summarize(&self, request: &SummaryRequest<'_>) -> Result<String, String>;
}

/// Where answers are remembered, by key (a hex SHA-256). A cache that cannot be read or
/// written says so in a log line and counts as a miss: a summary costs a call, never a
/// failed turn.
pub trait SummaryCache: Send + Sync {
    fn get(&self, key: &str) -> Option<String>;
    fn put(&self, key: &str, summary: &str);
}

/// Makes the client for a `[summarizer]` table; an `Err` is a configuration error (an
/// unset `api_key_env` variable, say).
pub type Connect = fn(&SummarizerConfig) -> Result<Arc<dyn Summarizer>, String>;

/// The in-memory cache: the newest [`MEMORY_CACHE_ENTRIES`] answers.
#[derive(Default)]
pub struct MemoryCache {
    entries: Mutex<(HashMap<String, String>, VecDeque<String>)>,
}

impl SummaryCache for MemoryCache {
    fn get(&self, key: &str) -> Option<String> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.0.get(key).cloned()
    }

    fn put(&self, key: &str, summary: &str) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = &mut *entries;
        if map.insert(key.to_string(), summary.to_string()).is_none() {
            order.push_back(key.to_string());
        }
        while order.len() > MEMORY_CACHE_ENTRIES {
            if let Some(oldest) = order.pop_front() {
                map.remove(&oldest);
            }
        }
    }
}

/// The configured summarizer with its settings.
struct Active {
    client: Arc<dyn Summarizer>,
    model: String,
    max_chars_in: usize,
    /// `timeout_ms`: the time one plugin call may spend waiting for summaries, in all.
    timeout: Duration,
}

static CLIENT: OnceLock<Connect> = OnceLock::new();
static ACTIVE: RwLock<Option<Result<Arc<Active>, &'static str>>> = RwLock::new(None);
static CACHE: RwLock<Option<Arc<dyn SummaryCache>>> = RwLock::new(None);

/// Installs the client every `[summarizer]` is connected with; a binary calls it once at
/// start (later calls are ignored).
pub fn set_client(connect: Connect) {
    let _ = CLIENT.set(connect);
}

/// A configuration's summarizer, connected and ready to install.
pub struct Connected(Option<Result<Arc<Active>, &'static str>>);

/// Connects `config`'s `[summarizer]` with the installed client. The error names the
/// table's key and line.
pub fn connect(config: &Config) -> Result<Connected, ConfigError> {
    Ok(Connected(match (&config.summarizer, CLIENT.get()) {
        (None, _) => None,
        (Some(_), None) => Some(Err(NO_CLIENT)),
        (Some(settings), Some(connect)) => {
            let client = connect(settings).map_err(|message| {
                config.error(
                    config.summarizer_key_line("api_key_env"),
                    format!("[summarizer]: {message}"),
                )
            })?;
            Some(Ok(Arc::new(Active {
                client,
                model: settings.model.clone(),
                max_chars_in: usize::try_from(settings.max_chars_in).unwrap_or(usize::MAX),
                timeout: Duration::from_millis(settings.timeout_ms),
            })))
        }
    }))
}

impl Connected {
    /// Makes this the summarizer that answers from now on (none: every call answers
    /// [`NO_SUMMARIZER`]).
    pub fn install(self) {
        *ACTIVE.write().unwrap_or_else(|e| e.into_inner()) = self.0;
    }
}

/// Installs the cache answers are kept in (the session service's store); until then, and
/// in a stateless call, it is a [`MemoryCache`].
pub fn install_cache(cache: Arc<dyn SummaryCache>) {
    *CACHE.write().unwrap_or_else(|e| e.into_inner()) = Some(cache);
}

fn cache() -> Arc<dyn SummaryCache> {
    if let Some(cache) = CACHE.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return cache.clone();
    }
    let mut cache = CACHE.write().unwrap_or_else(|e| e.into_inner());
    cache
        .get_or_insert_with(|| Arc::new(MemoryCache::default()))
        .clone()
}

/// The cache key of a summary: a hex SHA-256 over the model, the target, the purpose and
/// the whole text (each length-prefixed, so no two requests share their bytes).
pub fn cache_key(model: &str, target_chars: usize, purpose: &str, text: &str) -> String {
    let mut hash = Sha256::new();
    for part in [
        model.as_bytes(),
        target_chars.to_string().as_bytes(),
        purpose.as_bytes(),
        text.as_bytes(),
    ] {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// `text` cut to its first `chars` characters, and its length in characters.
fn first_chars(text: &str, chars: usize) -> (&str, usize) {
    match text.char_indices().nth(chars) {
        Some((at, _)) => (&text[..at], text.chars().count()),
        None => (text, text.chars().count()),
    }
}

/// A summary of `text` in at most `target_chars` characters, for `purpose`: from the
/// cache, else from the configured summarizer (then cached). An `Err` says why there is
/// none; the plugin falls back.
///
/// The time a plugin call waits here does not count against its `plugin_timeout_ms`
/// (`deadline::in_host_service`); instead one plugin call may wait for summaries for
/// `timeout_ms` in all, so a plugin asking for many is bounded too: past it each request
/// is an error at once (docs/chain.md#deadline).
pub fn summarize(text: &str, target_chars: usize, purpose: &str) -> Result<String, String> {
    let active = ACTIVE.read().unwrap_or_else(|e| e.into_inner()).clone();
    let active = match active {
        None => return Err(NO_SUMMARIZER.to_string()),
        Some(Err(reason)) => return Err(reason.to_string()),
        Some(Ok(active)) => active,
    };
    if target_chars == 0 {
        return Err("a summary of 0 characters was asked for".to_string());
    }
    let key = cache_key(&active.model, target_chars, purpose, text);
    let cache = cache();
    if let Some(summary) = cache.get(&key) {
        tracing::debug!("summarizer: cached summary of {} bytes", text.len());
        return Ok(summary);
    }
    let spent = crate::deadline::host_service_spent().unwrap_or_default();
    let timeout = active.timeout.saturating_sub(spent);
    if timeout < MIN_REQUEST_TIME {
        return Err(format!(
            "this plugin call has already waited {} ms for summaries, its whole [summarizer] timeout_ms ({} ms)",
            spent.as_millis(),
            active.timeout.as_millis()
        ));
    }
    let (cut, original_chars) = first_chars(text, active.max_chars_in);
    let request = SummaryRequest {
        text: cut,
        original_chars,
        target_chars,
        purpose,
        timeout,
    };
    let reply =
        crate::deadline::in_host_service(|| active.client.summarize(&request)).map_err(|e| echo::text(&e))?;
    let (summary, _) = first_chars(reply.trim(), target_chars);
    if summary.is_empty() {
        return Err("the summarizer answered an empty summary".to_string());
    }
    cache.put(&key, summary);
    Ok(summary.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_tells_every_part_apart() {
        let key = cache_key("m", 10, "p", "text");
        assert_eq!(key.len(), 64);
        assert_eq!(key, cache_key("m", 10, "p", "text"));
        for other in [
            cache_key("n", 10, "p", "text"),
            cache_key("m", 11, "p", "text"),
            cache_key("m", 10, "q", "text"),
            cache_key("m", 10, "p", "texT"),
            cache_key("m", 10, "pt", "ext"),
        ] {
            assert_ne!(key, other);
        }
    }

    #[test]
    fn the_memory_cache_forgets_its_oldest_past_its_bound() {
        let cache = MemoryCache::default();
        for n in 0..MEMORY_CACHE_ENTRIES + 2 {
            cache.put(&n.to_string(), "s");
        }
        assert_eq!(cache.get("0"), None);
        assert_eq!(cache.get("1"), None);
        assert_eq!(cache.get("2").as_deref(), Some("s"));
        cache.put("2", "again");
        assert_eq!(cache.get("2").as_deref(), Some("again"));
        assert_eq!(cache.entries.lock().unwrap().1.len(), MEMORY_CACHE_ENTRIES);
    }

    #[test]
    fn first_chars_cuts_characters() {
        assert_eq!(first_chars("héllo", 2), ("hé", 5));
        assert_eq!(first_chars("hé", 5), ("hé", 2));
    }
}
