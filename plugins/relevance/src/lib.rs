//! `relevance`: recent and relevant (docs/plugins.md#relevance).
//!
//! Keeps the pinned messages, the newest `recent` units, and then, while the window has
//! room (`effective_ctx` messages, and `max_tokens` if set), the older units that best
//! match the newest user message: BM25 over words, one document per unit, highest score
//! first, ties to the newer, a unit scoring `min_score` or less never. Kept units stay in
//! order and whole; the start and never-empty rules of the shared trimming rules hold
//! ([`history_trim`]). With no match the result is what recency alone keeps.
//!
//! The words of each message are counted once and remembered by the message's identity
//! (its shared allocation, held by the cache so it cannot be reused), each word as a
//! number (interned once per plugin instance), so a warm call on a long history hashes
//! no text: per message one pointer lookup and a binary search per query word.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::HashSet;
use std::sync::Mutex;

use history_trim::Pins;
use plugin_api::structure::Faults;
use plugin_api::{
    ConfigError, ConfigTable, Context, Event, EventKind, HistoryPlugin, LoadContext, Message, Output, RArc,
    Role, DEFAULT_PER_MESSAGE_TOKENS,
};
use rustc_hash::FxHashMap;

/// `recent` when the config does not set it.
pub const DEFAULT_RECENT: u64 = 8;
/// `recall_limit` when the config does not set it: the transcript's exchanges asked for
/// per call with `from_transcript`.
pub const DEFAULT_RECALL_LIMIT: u64 = 4;
/// The stop words when `stop_words` is not set (BM25's shared definition).
pub use history_bm25::DEFAULT_STOP_WORDS;
use history_bm25::{idf, term_score};

/// The words of one message: `(word id, occurrences)` sorted by id, and how many words
/// there are.
#[derive(Debug, Default)]
struct Terms {
    counts: Box<[(u32, u32)]>,
    length: u32,
}

impl Terms {
    fn count(&self, word: u32) -> u32 {
        self.counts
            .binary_search_by_key(&word, |&(id, _)| id)
            .map_or(0, |at| self.counts[at].1)
    }
}

/// Each message's [`Terms`], by identity, with the call that last saw it; and the word
/// ids the terms use.
#[derive(Default)]
struct TermCache {
    call: u64,
    words: FxHashMap<Box<str>, u32>,
    entries: FxHashMap<usize, (RArc<Message>, Terms, u64)>,
}

/// Distinct words remembered before the cache starts over (ids and terms together).
const MAX_WORDS: usize = 1 << 20;

/// What is left of the window.
struct Room {
    messages: u64,
    tokens: Option<u64>,
}

impl Room {
    /// Takes a unit of `messages` messages and `tokens` tokens if it fits.
    fn take(&mut self, messages: u64, tokens: u64) -> bool {
        let fits = messages <= self.messages && self.tokens.is_none_or(|room| tokens <= room);
        if fits {
            self.messages -= messages;
            if let Some(room) = self.tokens.as_mut() {
                *room -= tokens;
            }
        }
        fits
    }
}

pub struct Relevance {
    pins: Pins,
    recent: usize,
    max_tokens: Option<u64>,
    min_score: f64,
    stop_words: HashSet<String>,
    /// Draw older exchanges from the session's transcript too (`from_transcript`).
    from_transcript: bool,
    /// Exchanges asked of the transcript per call (`recall_limit`).
    recall_limit: usize,
    cache: Mutex<TermCache>,
}

/// The words of `text` as BM25 counts them (lower-cased, split on anything not a
/// letter or digit).
pub use history_bm25::words;

impl Relevance {
    /// The terms of `message`, its words numbered in `words`.
    fn terms_of(&self, message: &Message, words: &mut FxHashMap<Box<str>, u32>) -> Terms {
        let mut counts: FxHashMap<u32, u32> = FxHashMap::default();
        let mut length = 0;
        for item in message.token_items() {
            for word in self::words(item) {
                if self.stop_words.contains(&word) {
                    continue;
                }
                length += 1;
                let next = words.len() as u32;
                let id = *words.entry(word.into_boxed_str()).or_insert(next);
                *counts.entry(id).or_default() += 1;
            }
        }
        let mut counts: Vec<(u32, u32)> = counts.into_iter().collect();
        counts.sort_unstable();
        Terms {
            counts: counts.into_boxed_slice(),
            length,
        }
    }

    /// Per unit: its length in words and the count of each query word
    /// (`counts[unit * query.len() + q]`), from the cache where a message was seen before.
    fn unit_counts(
        &self,
        history: &[RArc<Message>],
        units: &[Vec<usize>],
        query: &[String],
    ) -> (Vec<f64>, Vec<u32>) {
        let mut guard = self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let cache = &mut *guard;
        if cache.words.len() > MAX_WORDS {
            *cache = TermCache::default();
        }
        cache.call += 1;
        let call = cache.call;
        // Query words no message has are in no unit: they score nothing.
        let query_ids: Vec<Option<u32>> = query
            .iter()
            .map(|w| cache.words.get(w.as_str()).copied())
            .collect();
        let mut lengths = Vec::with_capacity(units.len());
        let mut counts = vec![0u32; units.len() * query.len()];
        let mut query_ids = query_ids;
        for (unit, members) in units.iter().enumerate() {
            let mut length = 0u64;
            for &i in members {
                let message = &history[i];
                let key = &**message as *const Message as usize;
                let entry = match cache.entries.entry(key) {
                    Entry::Occupied(entry) => entry.into_mut(),
                    Entry::Vacant(vacant) => {
                        let terms = self.terms_of(message, &mut cache.words);
                        // New words may be query words.
                        for (id, word) in query_ids.iter_mut().zip(query) {
                            if id.is_none() {
                                *id = cache.words.get(word.as_str()).copied();
                            }
                        }
                        vacant.insert((message.clone(), terms, call))
                    }
                };
                entry.2 = call;
                let terms = &entry.1;
                length += u64::from(terms.length);
                if terms.counts.is_empty() {
                    continue;
                }
                for (q, id) in query_ids.iter().enumerate() {
                    if let Some(id) = id {
                        counts[unit * query.len() + q] += terms.count(*id);
                    }
                }
            }
            lengths.push(length as f64);
        }
        // Forget messages no recent call has seen, once the cache outgrows what is in use.
        if cache.entries.len() > 2 * history.len() + 1024 {
            cache.entries.retain(|_, entry| entry.2 + 4 > call);
        }
        (lengths, counts)
    }

    /// The newest user message's words, each once, without stop words: the query.
    fn query(&self, history: &[RArc<Message>]) -> Vec<String> {
        let Some(question) = history.iter().rev().find(|m| m.role == Role::User) else {
            return Vec::new();
        };
        let mut query: Vec<String> = Vec::new();
        for item in question.content.items() {
            for word in words(item) {
                if !self.stop_words.contains(&word) && !query.contains(&word) {
                    query.push(word);
                }
            }
        }
        query
    }

    /// With `from_transcript`, in a session: the transcript's exchanges that match the
    /// query and that the input lacks entirely, each whole and starting with a user
    /// message (docs/plugins.md#relevance). A failed recall is logged and leaves the input
    /// alone.
    fn recalled(
        &self,
        history: &[RArc<Message>],
        query: &[String],
        ctx: &Context,
    ) -> Vec<Vec<RArc<Message>>> {
        if !self.from_transcript || ctx.session_id.is_none() || query.is_empty() || self.recall_limit == 0 {
            return Vec::new();
        }
        let found = match ctx.recall(&query.join(" "), self.recall_limit) {
            Ok(found) => found,
            Err(reason) => {
                ctx.log().warn(&format!(
                    "from_transcript: {reason}; choosing within the history only"
                ));
                return Vec::new();
            }
        };
        let origins: HashSet<u64> = history.iter().map(|m| m.origin()).collect();
        found
            .into_iter()
            .map(|exchange| exchange.messages.into_vec())
            .filter(|messages| {
                messages.first().is_some_and(|m| m.role == Role::User)
                    && messages.iter().all(|m| !origins.contains(&m.origin()))
                    && Faults::of(messages).count() == 0
            })
            .collect()
    }

    fn select(&self, history: &[RArc<Message>], ctx: &Context) -> Output {
        // The query is read only when it is used: a history that fits needs none, unless
        // the transcript is asked.
        let asks_transcript = self.from_transcript && ctx.session_id.is_some();
        let mut query = asks_transcript.then(|| self.query(history));
        let recalled = match &query {
            Some(words) => self.recalled(history, words, ctx),
            None => Vec::new(),
        };
        let pinned = history_trim::pinned_messages(history, self.pins);
        // The history's messages, then the recalled exchanges' (each a unit of its own);
        // without any, the history itself (not copied).
        let mut units = history_trim::unpinned_units(history, &pinned);
        let history_units = units.len();
        let all: Cow<'_, [RArc<Message>]> = if recalled.is_empty() {
            Cow::Borrowed(history)
        } else {
            let mut all = history.to_vec();
            for exchange in recalled {
                let from = all.len();
                all.extend(exchange);
                units.push((from..all.len()).collect());
            }
            Cow::Owned(all)
        };
        let tokens = |i: usize| match self.max_tokens {
            Some(_) => ctx
                .tokens()
                .message(ctx.model.tokenizer, &all[i], DEFAULT_PER_MESSAGE_TOKENS),
            None => 0,
        };
        let costs: Vec<u64> = (0..all.len()).map(tokens).collect();
        let unpinned_count = pinned.iter().filter(|p| !**p).count() as u64;
        let total_tokens: u64 = costs[..history.len()].iter().sum();
        let fits_tokens = |used: u64| self.max_tokens.is_none_or(|max| used <= max);
        let history_fits = unpinned_count <= ctx.effective_ctx && fits_tokens(total_tokens);
        if history_fits && units.len() == history_units {
            return Output::unchanged(history);
        }

        let pinned_tokens: u64 = (0..history.len()).filter(|&i| pinned[i]).map(|i| costs[i]).sum();
        let unit_tokens: Vec<u64> = units.iter().map(|u| u.iter().map(|&i| costs[i]).sum()).collect();
        let mut room = Room {
            messages: ctx.effective_ctx,
            tokens: self.max_tokens.map(|max| max.saturating_sub(pinned_tokens)),
        };
        let take = |unit: usize, room: &mut Room| room.take(units[unit].len() as u64, unit_tokens[unit]);

        // The newest `recent` units, as long as they fit.
        let mut keep = vec![false; units.len()];
        let mut oldest_recent = history_units;
        let mut recent_fit = true;
        for unit in (0..history_units).rev().take(self.recent) {
            if !take(unit, &mut room) {
                recent_fit = false;
                break;
            }
            keep[unit] = true;
            oldest_recent = unit;
        }

        // Then the older units that best match the newest user message, the recalled
        // exchanges among them, scored as one more unit each. When the history itself
        // fits, its other older units follow, newest first: a recalled exchange displaces
        // only the oldest that do not match (docs/plugins.md#relevance).
        let query = query.get_or_insert_with(|| self.query(history));
        let scores = self.scores(query, &all, &units);
        let matches = |u: usize| scores[u] > 0.0 && scores[u] > self.min_score;
        if recent_fit {
            let mut candidates: Vec<usize> = (0..oldest_recent)
                .chain(history_units..units.len())
                .filter(|&u| matches(u) || (history_fits && u < history_units))
                .collect();
            candidates.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(b.cmp(&a)));
            for unit in candidates {
                if room.messages == 0 {
                    break;
                }
                if take(unit, &mut room) {
                    keep[unit] = true;
                }
            }
        }
        let recalled_keep = keep.split_off(history_units);
        let (units, recalled_units) = units.split_at(history_units);
        // Start rule: the kept part starts with a user message unless the pinned user
        // message precedes it.
        let pinned_user = (0..history.len()).find(|&i| pinned[i] && history[i].role == Role::User);
        let starts_with_user = |u: usize| history[units[u][0]].role == Role::User;
        let preceded_by_pinned_user = |u: usize| pinned_user.is_some_and(|p| p < units[u][0]);
        let pinned_ids: HashSet<u64> = (0..history.len())
            .filter(|&i| pinned[i])
            .map(|i| history[i].origin())
            .collect();
        let mut start_dropped = vec![false; units.len()];
        for unit in 0..units.len() {
            if !keep[unit] {
                continue;
            }
            if starts_with_user(unit) || preceded_by_pinned_user(unit) {
                break;
            }
            keep[unit] = false;
            start_dropped[unit] = true;
        }

        // Never empty.
        let mut over_budget = false;
        if !units.is_empty() && !keep.iter().any(|k| *k) {
            over_budget = true;
            let newest = units.len() - 1;
            let from = if preceded_by_pinned_user(newest) {
                Some(newest)
            } else {
                match (0..units.len()).rposition(starts_with_user) {
                    Some(last_user_unit) => Some(last_user_unit),
                    None if pinned_user.is_some() => None,
                    None => Some(newest),
                }
            };
            if let Some(from) = from {
                for (unit, flag) in keep.iter_mut().enumerate().skip(from) {
                    *flag = true;
                    start_dropped[unit] = false;
                }
            }
        }

        let mut events = Vec::new();
        let mut kept_messages = pinned.clone();
        for (unit, members) in units.iter().enumerate() {
            if keep[unit] {
                for &i in members {
                    kept_messages[i] = true;
                }
                continue;
            }
            let why = if start_dropped[unit] {
                "not relevant: the kept part must start with a user message"
            } else {
                "not relevant"
            };
            let saved: u64 = members
                .iter()
                .map(|&i| {
                    ctx.tokens()
                        .message(ctx.model.tokenizer, &history[i], DEFAULT_PER_MESSAGE_TOKENS)
                })
                .sum();
            events.push(
                Event::new(
                    EventKind::MessageRemoved,
                    ctx.turn,
                    format!("{why} (score {:.3}, {} messages)", scores[unit], members.len()),
                )
                .at(members[0], &history[members[0]])
                .saving(i64::try_from(saved).unwrap_or(i64::MAX)),
            );
        }
        if over_budget {
            events.push(Event::new(
                EventKind::OverBudget,
                ctx.turn,
                "relevance: nothing that fits starts validly; kept the newest valid part",
            ));
        }
        let mut kept: Vec<RArc<Message>> = history
            .iter()
            .zip(&kept_messages)
            .filter(|(_, keep)| **keep)
            .map(|(m, _)| m.clone())
            .collect();
        let recalled: Vec<&[usize]> = recalled_units
            .iter()
            .zip(&recalled_keep)
            .filter(|(_, keep)| **keep)
            .map(|(members, _)| members.as_slice())
            .collect();
        self.insert_recalled(&mut kept, &all, &recalled, &pinned_ids, ctx, &mut events);
        Output::new(kept, events)
    }

    /// Puts each kept recalled exchange into `kept` in transcript order: before the first
    /// unpinned message that entered after it (never between a call and its results, and
    /// never after the question), so the history stays in the order it happened and whole.
    fn insert_recalled(
        &self,
        kept: &mut Vec<RArc<Message>>,
        all: &[RArc<Message>],
        recalled: &[&[usize]],
        pinned: &HashSet<u64>,
        ctx: &Context,
        events: &mut Vec<Event>,
    ) {
        let mut recalled = recalled.to_vec();
        recalled.sort_by_key(|members| all[members[0]].origin());
        for members in recalled {
            let first = &all[members[0]];
            let Some(mut at) = kept
                .iter()
                .position(|m| m.origin() > first.origin() && !pinned.contains(&m.origin()))
            else {
                continue;
            };
            // Never between a call and its results.
            while kept.get(at).is_some_and(|m| m.role == Role::Tool) {
                at += 1;
            }
            if at == kept.len() {
                continue;
            }
            let tokens: u64 = members
                .iter()
                .map(|&i| {
                    ctx.tokens()
                        .message(ctx.model.tokenizer, &all[i], DEFAULT_PER_MESSAGE_TOKENS)
                })
                .sum();
            events.push(
                Event::new(
                    EventKind::MessageRecalled,
                    ctx.turn,
                    format!(
                        "relevant again: {} messages of turn {} from the transcript",
                        members.len(),
                        first.turn
                    ),
                )
                .at(at, first)
                .saving(-i64::try_from(tokens).unwrap_or(i64::MAX)),
            );
            kept.splice(at..at, members.iter().map(|&i| all[i].clone()));
        }
    }

    /// Each unit's BM25 score against the newest user message's words (the `query`), with
    /// every unit a document.
    fn scores(&self, query: &[String], history: &[RArc<Message>], units: &[Vec<usize>]) -> Vec<f64> {
        if query.is_empty() || units.is_empty() {
            return vec![0.0; units.len()];
        }
        let (lengths, counts) = self.unit_counts(history, units, query);
        let documents = units.len() as f64;
        let average = (lengths.iter().sum::<f64>() / documents).max(1.0);
        let idf: Vec<f64> = (0..query.len())
            .map(|q| {
                let df = (0..units.len())
                    .filter(|&u| counts[u * query.len() + q] > 0)
                    .count() as f64;
                idf(documents, df)
            })
            .collect();
        (0..units.len())
            .map(|unit| {
                (0..query.len())
                    .map(|q| {
                        let tf = f64::from(counts[unit * query.len() + q]);
                        term_score(idf[q], tf, lengths[unit], average)
                    })
                    .sum()
            })
            .collect()
    }
}

impl HistoryPlugin for Relevance {
    const NAME: &'static str = "relevance";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const SUMMARY: &'static str =
        "recent and relevant: pinned messages, the newest units, then older units matching the newest user message (BM25)";
    const CONFIG_KEYS: &'static [(&'static str, &'static str)] = &[
        ("recent", "the newest units always kept (default 8)"),
        (
            "max_tokens",
            "a token window on top of effective_ctx messages (default: none)",
        ),
        (
            "min_score",
            "older units scoring this or less are never kept (default 0)",
        ),
        ("pin_system", "keep the leading system messages (default true)"),
        (
            "pin_first_user",
            "keep the first user message, the task (default true)",
        ),
        (
            "stop_words",
            "words ignored when matching (default: a list of common English words)",
        ),
        (
            "from_transcript",
            "in a session, also draw matching older exchanges from the whole transcript (default false)",
        ),
        (
            "recall_limit",
            "with from_transcript, the transcript's best exchanges considered per turn (default 4)",
        ),
    ];

    fn new(load: &LoadContext) -> Result<Self, ConfigError> {
        let mut config = ConfigTable::parse(&load.config_json)?;
        let recent = config.u64("recent")?.unwrap_or(DEFAULT_RECENT);
        let max_tokens = config.positive("max_tokens")?;
        let min_score = config.number("min_score")?.unwrap_or(0.0);
        let pins = Pins {
            system: config.bool("pin_system")?.unwrap_or(true),
            first_user: config.bool("pin_first_user")?.unwrap_or(true),
        };
        let stop_words = match config.strings("stop_words")? {
            Some(words) => words.iter().map(|w| w.to_lowercase()).collect(),
            None => DEFAULT_STOP_WORDS.iter().map(|w| w.to_string()).collect(),
        };
        let from_transcript = config.bool("from_transcript")?.unwrap_or(false);
        let recall_limit = config.u64("recall_limit")?.unwrap_or(DEFAULT_RECALL_LIMIT);
        config.finish()?;
        Ok(Relevance {
            from_transcript,
            recall_limit: usize::try_from(recall_limit).unwrap_or(usize::MAX),
            pins,
            recent: usize::try_from(recent).unwrap_or(usize::MAX),
            max_tokens,
            min_score,
            stop_words,
            cache: Mutex::new(TermCache::default()),
        })
    }

    fn process(&self, history: &[RArc<Message>], ctx: &Context) -> Result<Output, String> {
        Ok(self.select(history, ctx))
    }
}

plugin_api::export_plugin!(Relevance);

#[cfg(test)]
mod tests;
