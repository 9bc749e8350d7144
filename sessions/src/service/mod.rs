//! The session service: every live session, the host-wide settings and the reaper. HTTP
//! (`history-server`) and `history-host chat` both drive it.
//!
//! Turns of one session run one at a time (each session has an async lock; a turn that
//! waits longer than the turn wait gives up with [`ErrorKind::Busy`]); turns of different
//! sessions run in parallel. The chain and the store run on tokio's blocking threads,
//! never on the async ones.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use history_engine::reload::{load_shadowed, Watcher};
use history_engine::shadow::ShadowLibraries;
use history_engine::{Config, SharedChain};
use serde_json::Value;
use tokio::sync::Mutex as AsyncMutex;

use crate::clock::{new_session_id, now_ms};
use crate::error::{ErrorKind, SessionError};
use crate::metrics::Metrics;
use crate::reload::state::ReloadState;
use crate::session::{parse_override, Env, Session, SwitchOutcome, TurnInput, TurnOutcome};
use crate::store::{self, Locked, SessionLock, SessionRow, Store, StoreError, TranscriptRow};

mod outage;
mod recall;
mod report;
mod settings;
mod stateless;
pub use recall::Recalled;
pub use report::{ChainReport, StageInfo, StagePlace};
pub use stateless::StatelessRun;
mod stores;
mod turn_log;
mod upkeep;
pub use turn_log::{EventRecord, StageRecord, TurnRecord, EVENTS_PER_TURN, TURN_LOG_LEN};

use outage::Outage;

use stores::{LockedStore, TimedStore};

/// How long a turn waits for the session's previous turn by default.
const DEFAULT_TURN_WAIT: Duration = Duration::from_secs(30);

/// What the listing (`GET /v1/sessions`) shows of a session, kept outside its lock so
/// listing never waits for a running turn.
/// Which page of a transcript to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TranscriptPage {
    /// Up to `limit` messages from position `from` (from 1).
    From { from: u64, limit: u64 },
    /// The last N messages.
    Last(u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    pub id: String,
    pub model: String,
    pub effective_ctx: u64,
    pub turn: u64,
    pub transcript_size: u64,
    pub working_size: usize,
    pub created_at: u64,
    pub last_active: u64,
}

impl SessionInfo {
    fn of(row: &SessionRow, working_size: usize) -> SessionInfo {
        SessionInfo {
            id: row.id.clone(),
            model: row.model.clone(),
            effective_ctx: row.effective_ctx,
            turn: row.turn,
            transcript_size: row.transcript_len,
            working_size,
            created_at: row.created_at,
            last_active: row.last_active,
        }
    }
}

struct Slot {
    info: Mutex<SessionInfo>,
    /// `None` until first used after a start (sessions load lazily), and again once put
    /// out of memory past `session_memory_mb` (docs/sessions.md#memory).
    state: Arc<AsyncMutex<Option<Session>>>,
    /// What the session in `state` holds in memory (`Session::memory_estimate`), as of
    /// the end of its last operation under a `session_memory_mb` limit; 0 while it is
    /// not in memory, or not counted yet (a limit set by a reload counts each session
    /// from its next operation).
    resident: AtomicUsize,
    closed: AtomicBool,
    /// The last turns' numbers, in memory only (docs/http-api.md#turns).
    turns: Mutex<turn_log::TurnLog>,
}

impl Slot {
    fn info(&self) -> SessionInfo {
        self.info.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Where the service's configuration and store are.
#[derive(Debug, Clone)]
pub struct Options {
    pub config_file: PathBuf,
    /// Overrides the configuration's `store`.
    pub store: Option<PathBuf>,
}

/// The session service. Hot reload (`crate::reload`) swaps its configuration and chain.
pub struct Service {
    pub(crate) config_file: PathBuf,
    /// The live configuration: the file as loaded, with the runtime commands' changes.
    pub(crate) config: RwLock<Arc<Config>>,
    pub(crate) chain: SharedChain,
    /// Every library this process loaded, each from a shadow copy (docs/chain.md#hot-reload).
    pub(crate) libraries: Arc<ShadowLibraries>,
    /// What the running chain was loaded from, and how the last reload went.
    pub(crate) reload: Mutex<ReloadState>,
    /// The watch of the configuration and `plugin_dir`, while hot reload runs.
    pub(crate) watcher: Mutex<Option<Watcher>>,
    store: Arc<dyn Store>,
    store_path: PathBuf,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Held (shared) by every session operation, and exclusively by a change of
    /// `agent_max_ctx` or a reload, so every session's `effective_ctx`, the configuration
    /// and the chain change between operations.
    pub(crate) settings: RwLock<()>,
    pub(crate) idle_timeout_ms: AtomicU64,
    turn_wait: Duration,
    /// On a shared store: the session operations this host runs at once (each holds a
    /// connection of the store's pool for its whole length).
    operations: Option<Arc<tokio::sync::Semaphore>>,
    shutting_down: AtomicBool,
    pub metrics: Arc<Metrics>,
    /// The unknown model names stateless calls have been warned about (`stateless`).
    warned_models: Mutex<std::collections::HashSet<String>>,
    /// Whether the store is unavailable now, as the log and readiness report it.
    outage: Arc<Outage>,
}

/// A failed start: the configuration, the chain or the store.
#[derive(Debug)]
pub struct StartError(pub String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The idle timeout `config` asks for, in milliseconds. Hidden, for tests:
/// `HISTORY_SESSION_TIMEOUT_SECONDS` overrides it, in seconds.
pub(crate) fn idle_timeout_ms_for(config: &Config) -> u64 {
    env_u64("HISTORY_SESSION_TIMEOUT_SECONDS")
        .map(|s| s * 1000)
        .unwrap_or(config.session_idle_timeout_minutes * 60_000)
}

impl Service {
    /// Loads the configuration and the chain (every library from a shadow copy, and the
    /// shadow copies no process uses removed), opens the store and finds every stored
    /// session (their messages load on first use).
    pub fn open(options: &Options) -> Result<Arc<Service>, StartError> {
        let libraries = Arc::new(ShadowLibraries::new());
        let loaded =
            load_shadowed(&options.config_file, &libraries).map_err(|e| StartError(e.to_string()))?;
        loaded.summarizer.install();
        let (config, chain) = (loaded.config, loaded.chain);
        for removed in libraries.remove_unused(&config.plugin_dir) {
            tracing::info!("removed the unused shadow copy {}", removed.display());
        }
        history_engine::tokens::set_cache_entries(config.token_cache_entries);
        let store_path = options.store.clone().unwrap_or_else(|| config.store.clone());
        let metrics = Arc::new(Metrics::default());
        let turn_wait = env_u64("HISTORY_TURN_WAIT_MS")
            .map(Duration::from_millis)
            .unwrap_or(DEFAULT_TURN_WAIT);
        let outage = Arc::new(Outage::new(if store::is_postgres(&store_path) {
            "unreachable"
        } else {
            "unavailable"
        }));
        let store: Arc<dyn Store> = Arc::new(TimedStore {
            inner: store::open(&store_path, turn_wait, config.store_limits)
                .map_err(|e| StartError(e.to_string()))?,
            metrics: metrics.clone(),
            outage: outage.clone(),
        });
        // The summarizer's answers are kept in the store, for every session and restart.
        history_engine::summarizer::install_cache(Arc::new(store::StoreSummaries(store.clone())));
        let operations = store
            .shared()
            .then(|| Arc::new(tokio::sync::Semaphore::new(store::PgStore::MAX_OPERATIONS)));
        let mut rows = store.sessions().map_err(|e| StartError(e.to_string()))?;
        // agent_max_ctx may differ from the last run's (an edit, or a `!maxctx N temp`
        // that ended with it): every session's window follows the configuration.
        let mut changed = Vec::new();
        for (row, _) in &mut rows {
            let effective_ctx = config.model(&row.model).effective_ctx;
            if row.effective_ctx != effective_ctx {
                row.effective_ctx = effective_ctx;
                changed.push((row.id.clone(), effective_ctx));
            }
        }
        store
            .set_effective_ctx(&changed)
            .map_err(|e| StartError(e.to_string()))?;
        let slots = rows
            .iter()
            .map(|(row, working_size)| {
                (
                    row.id.clone(),
                    Arc::new(new_slot(SessionInfo::of(row, *working_size), None)),
                )
            })
            .collect();
        let idle_timeout_ms = idle_timeout_ms_for(&config);
        tracing::info!(
            "store {}: {} sessions; chain {:?}, view {:?}",
            store::shown(&store_path),
            rows.len(),
            chain.names(),
            chain.view_names()
        );
        Ok(Arc::new(Service {
            config_file: options.config_file.clone(),
            config: RwLock::new(Arc::new(config)),
            chain: SharedChain::new(chain),
            libraries,
            reload: Mutex::new(ReloadState::new(loaded.fingerprint)),
            watcher: Mutex::new(None),
            store,
            store_path,
            slots: Mutex::new(slots),
            settings: RwLock::new(()),
            idle_timeout_ms: AtomicU64::new(idle_timeout_ms),
            turn_wait,
            operations,
            shutting_down: AtomicBool::new(false),
            metrics,
            warned_models: Mutex::default(),
            outage,
        }))
    }

    /// The live configuration.
    pub fn config(&self) -> Arc<Config> {
        self.config.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn change_config(&self, change: impl FnOnce(&mut Config)) -> Arc<Config> {
        let mut current = self.config.write().unwrap_or_else(|e| e.into_inner());
        let mut config = (**current).clone();
        change(&mut config);
        *current = Arc::new(config);
        current.clone()
    }

    /// The chain turns run on now.
    pub fn chain(&self) -> Arc<history_engine::Chain> {
        self.chain.current()
    }

    pub fn store_path(&self) -> &Path {
        &self.store_path
    }

    /// From now on, no new session or turn starts ([`ErrorKind::ShuttingDown`]);
    /// running ones finish.
    pub fn shut_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.stop_watching();
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    fn refuse_if_shutting_down(&self) -> Result<(), SessionError> {
        if self.is_shutting_down() {
            return Err(SessionError::new(
                ErrorKind::ShuttingDown,
                "the host is shutting down",
            ));
        }
        Ok(())
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot(&self, id: &str) -> Result<Arc<Slot>, SessionError> {
        self.slots()
            .get(id)
            .cloned()
            .ok_or_else(|| SessionError::not_found(id))
    }

    /// Session `id`: the one this host knows, or on a shared store one another host
    /// created (its messages load on first use).
    async fn find(self: &Arc<Self>, id: &str) -> Result<Arc<Slot>, SessionError> {
        if let Ok(slot) = self.slot(id) {
            return Ok(slot);
        }
        if !self.store.shared() {
            return Err(SessionError::not_found(id));
        }
        let service = self.clone();
        let owned = id.to_string();
        let row = tokio::task::spawn_blocking(move || service.store.row(&owned))
            .await
            .unwrap_or_else(|e| Err(StoreError::new(e.to_string())))?;
        let (row, working_size) = row.ok_or_else(|| SessionError::not_found(id))?;
        let slot = self
            .slots()
            .entry(id.to_string())
            .or_insert_with(|| Arc::new(new_slot(SessionInfo::of(&row, working_size), None)))
            .clone();
        Ok(slot)
    }

    /// Every live session, oldest first: on a shared store, every host's.
    pub async fn list(self: &Arc<Self>) -> Result<Vec<SessionInfo>, SessionError> {
        if self.store.shared() {
            let service = self.clone();
            let rows = tokio::task::spawn_blocking(move || service.store.sessions())
                .await
                .unwrap_or_else(|e| Err(StoreError::new(e.to_string())))?;
            return Ok(rows
                .iter()
                .map(|(row, working_size)| SessionInfo::of(row, *working_size))
                .collect());
        }
        let mut infos: Vec<SessionInfo> = self.slots().values().map(|s| s.info()).collect();
        infos.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(infos)
    }

    pub fn live_sessions(&self) -> usize {
        self.slots().len()
    }

    /// One session's listing entry.
    pub fn info(&self, id: &str) -> Result<SessionInfo, SessionError> {
        Ok(self.slot(id)?.info())
    }

    /// Creates a session on `model` (default `default`), refused past `max_users`.
    pub async fn create(
        self: &Arc<Self>,
        model: Option<String>,
        expiration_override: Option<Value>,
    ) -> Result<SessionInfo, SessionError> {
        self.refuse_if_shutting_down()?;
        let expiration_override = checked_override(expiration_override)?;
        let config = self.config();
        let model = model.unwrap_or_else(|| "default".to_string());
        if model.is_empty() {
            return Err(SessionError::bad_input("model: must not be empty"));
        }
        let now = now_ms();
        let effective_ctx = config
            .known_model(&model)
            .map_err(|e| SessionError::bad_input(format!("model: {e}")))?
            .effective_ctx;
        let row = SessionRow {
            expiration_override,
            ..SessionRow::new(new_session_id(), model, effective_ctx, now)
        };
        let slot = Arc::new(new_slot(
            SessionInfo::of(&row, 0),
            Some(Session::new(row.clone())),
        ));
        if self.store.shared() {
            // max_users counts the sessions of every host: counted in the store.
            let service = self.clone();
            let stored = {
                let row = row.clone();
                let max_users = config.max_users;
                tokio::task::spawn_blocking(move || service.store.create_limited(&row, max_users))
                    .await
                    .unwrap_or_else(|e| Err(StoreError::new(format!("the store task failed: {e}"))))?
            };
            if let Err(live) = stored {
                return Err(SessionError::new(
                    ErrorKind::TooManySessions,
                    format!(
                        "max_users reached: {live} live sessions (the limit is max_users = {})",
                        config.max_users
                    ),
                ));
            }
            self.slots().insert(row.id.clone(), slot.clone());
            tracing::info!(session = %row.id, "session created on model {}", row.model);
            return Ok(slot.info());
        }
        {
            let mut slots = self.slots();
            if slots.len() as u64 >= config.max_users {
                return Err(SessionError::new(
                    ErrorKind::TooManySessions,
                    format!(
                        "max_users reached: {} live sessions (the limit is max_users = {})",
                        slots.len(),
                        config.max_users
                    ),
                ));
            }
            slots.insert(row.id.clone(), slot.clone());
        }
        let service = self.clone();
        let stored = {
            let row = row.clone();
            tokio::task::spawn_blocking(move || service.store.create(&row))
                .await
                .unwrap_or_else(|e| Err(StoreError::new(format!("the store task failed: {e}"))))
        };
        if let Err(e) = stored {
            self.slots().remove(&row.id);
            return Err(e.into());
        }
        tracing::info!(session = %row.id, "session created on model {}", row.model);
        Ok(slot.info())
    }

    /// Runs `f` on session `id` on a blocking thread, holding the session's lock (waiting
    /// at most the turn wait for it) and the settings' shared lock.
    pub async fn with_session<R, F>(self: &Arc<Self>, id: &str, f: F) -> Result<R, SessionError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Session, &Env<'_>) -> Result<R, SessionError> + Send + 'static,
    {
        let slot = self.find(id).await?;
        let guard = tokio::time::timeout(self.turn_wait, slot.state.clone().lock_owned())
            .await
            .map_err(|_| {
                SessionError::new(
                    ErrorKind::Busy,
                    format!(
                        "session \"{id}\" is busy: its previous turn still runs after {} ms",
                        self.turn_wait.as_millis()
                    ),
                )
            })?;
        let permit = match &self.operations {
            Some(operations) => Some(
                operations
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|e| SessionError::new(ErrorKind::Store, e.to_string()))?,
            ),
            None => None,
        };
        let service = self.clone();
        let id = id.to_string();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let mut guard = guard;
            if slot.closed.load(Ordering::SeqCst) {
                return Err(SessionError::not_found(&id));
            }
            let _settings = service.settings.read().unwrap_or_else(|e| e.into_inner());
            let locked = service.bring_in(&slot, &id, &mut guard)?;
            let session = guard.as_mut().expect("bring_in leaves it in memory");
            // effective_ctx may have changed host-wide (`!maxctx`) since the last operation.
            session.row.effective_ctx = slot.info().effective_ctx;
            let config = service.config();
            let chain = service.chain.current();
            let locked_store = locked.map(|lock| LockedStore {
                store: &*service.store,
                lock: Mutex::new(lock),
                metrics: &service.metrics,
                outage: &service.outage,
            });
            let env = Env {
                chain: &chain,
                config: &config,
                store: match &locked_store {
                    Some(locked) => locked,
                    None => &*service.store,
                },
                now: now_ms(),
            };
            // The session's transcript, for the plugins' `ctx.recall` during this
            // operation (docs/abi.md#host-services).
            let transcript = recall::TranscriptRecall {
                store: service.store.clone(),
                session: id.clone(),
            };
            let recall = history_engine::recall::provide(&id, Arc::new(transcript));
            let result = f(session, &env);
            drop(recall);
            *slot.info.lock().unwrap_or_else(|e| e.into_inner()) =
                SessionInfo::of(&session.row, session.working().len());
            // Counted only under a limit: without one nothing reads it, and the estimate
            // walks every message.
            if config.session_memory_mb > 0 {
                slot.resident.store(session.memory_estimate(), Ordering::Relaxed);
            }
            drop(locked_store);
            drop(guard);
            service.keep_within_memory(config.session_memory_mb);
            result
        })
        .await
        .unwrap_or_else(|e| {
            Err(SessionError::new(
                ErrorKind::Store,
                format!("the session operation failed: {e}"),
            ))
        })
    }

    /// Makes `session` (the slot's, under its lock) the stored one, before an operation.
    /// On a shared store it takes the session's lock across hosts, and reads the session
    /// back if another host changed it since this one last did (only what this host
    /// lacks). Otherwise it loads the session if it is not in memory. Returns the lock an
    /// operation commits through, on a shared store.
    fn bring_in(
        &self,
        slot: &Slot,
        id: &str,
        session: &mut Option<Session>,
    ) -> Result<Option<Box<dyn SessionLock>>, SessionError> {
        let held = session
            .as_ref()
            .filter(|_| self.store.shared())
            .map(Session::host_copy);
        let mut locked = None;
        match self.store.lock(id, held.as_ref())? {
            Locked::NotShared => {}
            Locked::Busy => {
                return Err(SessionError::new(
                    ErrorKind::Busy,
                    format!(
                        "session \"{id}\" is busy: an operation on it still runs on another host after {} ms",
                        self.turn_wait.as_millis()
                    ),
                ))
            }
            Locked::Held(mut lock) => {
                let Some(version) = lock.version() else {
                    // Deleted or reaped by another host.
                    slot.closed.store(true, Ordering::SeqCst);
                    self.slots().remove(id);
                    return Err(SessionError::not_found(id));
                };
                if session.as_ref().is_none_or(|s| s.row.version != version) {
                    // The last sent history comes with it: stored with each turn.
                    let stored = lock.load()?.ok_or_else(|| SessionError::not_found(id))?;
                    *session = Some(Session::from_stored_reusing(stored, session.as_ref())?);
                }
                locked = Some(lock);
            }
        }
        if session.is_none() {
            let stored = self.store.load(id)?.ok_or_else(|| SessionError::not_found(id))?;
            *session = Some(Session::from_stored(stored)?);
        }
        Ok(locked)
    }

    /// One turn (docs/sessions.md#a-turn).
    pub async fn turn(self: &Arc<Self>, id: &str, input: TurnInput) -> Result<TurnOutcome, SessionError> {
        self.counted_turn(id, move |session, env| session.turn(env, input))
            .await
    }

    /// A turn given as the whole conversation, as an OpenAI client resends it
    /// (docs/proxy.md): `messages` must begin with the session's transcript, and the rest
    /// are the turn's new messages. One that does not extend the transcript is a
    /// [`ErrorKind::Conflict`] naming the first message that differs.
    pub async fn turn_resent(
        self: &Arc<Self>,
        id: &str,
        messages: Vec<Value>,
        model: Option<String>,
    ) -> Result<TurnOutcome, SessionError> {
        self.counted_turn(id, move |session, env| session.turn_resent(env, messages, model))
            .await
    }

    async fn counted_turn<F>(self: &Arc<Self>, id: &str, f: F) -> Result<TurnOutcome, SessionError>
    where
        F: FnOnce(&mut Session, &Env<'_>) -> Result<TurnOutcome, SessionError> + Send + 'static,
    {
        let started = Instant::now();
        let result = match self.refuse_if_shutting_down() {
            Ok(()) => self.with_session(id, f).await,
            Err(e) => Err(e),
        };
        match &result {
            Ok(outcome) => {
                self.metrics.run(&outcome.run);
                if let Ok(slot) = self.slot(id) {
                    slot.turns
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .record(outcome);
                }
                tracing::info!(
                    session = %id,
                    turn = outcome.turn,
                    "{}",
                    history_engine::summary::summary_line(&outcome.run)
                );
            }
            Err(e) => {
                if let Some(plugin) = &e.plugin {
                    self.metrics.plugin_failed(plugin);
                }
                // A store outage is logged once by its watch (`outage`), not per turn.
                if e.kind == ErrorKind::StoreUnavailable {
                    tracing::debug!(session = %id, "turn refused: {}", e.message);
                } else {
                    tracing::warn!(session = %id, "turn refused: {}", e.message);
                }
            }
        }
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.kind.code_for_metrics(),
        };
        self.metrics.turn(outcome, started.elapsed().as_secs_f64());
        result
    }

    /// A model switch (docs/sessions.md#model-switch).
    pub async fn switch_model(
        self: &Arc<Self>,
        id: &str,
        model: String,
    ) -> Result<SwitchOutcome, SessionError> {
        self.refuse_if_shutting_down()?;
        if model.is_empty() {
            return Err(SessionError::bad_input("model: must not be empty"));
        }
        let result = self
            .with_session(id, move |session, env| session.switch_model(env, &model))
            .await;
        if let Ok(outcome) = &result {
            tracing::info!(
                session = %id,
                "model {} -> {}, effective_ctx {}, working history {} messages",
                outcome.old,
                outcome.model.name,
                outcome.model.effective_ctx,
                outcome.run.working.len()
            );
        }
        result
    }

    /// Replaces a session's expiration override (docs/sessions.md; `null` removes it),
    /// stored at once and applied from its next turn. Returns the override now in force.
    pub async fn set_expiration_override(
        self: &Arc<Self>,
        id: &str,
        value: Option<Value>,
    ) -> Result<Value, SessionError> {
        self.refuse_if_shutting_down()?;
        let json = checked_override(value)?;
        self.with_session(id, move |session, env| {
            session.set_expiration_override(env, json)?;
            Ok(session
                .expiration_override()
                .and_then(|json| serde_json::from_str(json).ok())
                .unwrap_or(Value::Null))
        })
        .await
    }

    /// The working history, or with `sent` the last sent history (empty before the
    /// first turn since the session was loaded).
    pub async fn history(
        self: &Arc<Self>,
        id: &str,
        sent: bool,
    ) -> Result<Vec<plugin_api::RArc<plugin_api::Message>>, SessionError> {
        self.with_session(id, move |session, _| {
            Ok(if sent {
                session.last_sent().map(<[_]>::to_vec).unwrap_or_default()
            } else {
                session.working().to_vec()
            })
        })
        .await
    }

    /// The last `last` turns' records this host keeps of session `id` (all of them with
    /// `None`), oldest first: in memory, bounded (docs/http-api.md#turns).
    pub async fn turns(
        self: &Arc<Self>,
        id: &str,
        last: Option<usize>,
    ) -> Result<Vec<TurnRecord>, SessionError> {
        let slot = self.find(id).await?;
        let records = slot.turns.lock().unwrap_or_else(|e| e.into_inner()).last(last);
        Ok(records)
    }

    /// A page of the transcript: `(from, rows, next)`, `from` the first message's position
    /// (from 1) and `next` the `from` of the next page if there is one.
    pub async fn transcript(
        self: &Arc<Self>,
        id: &str,
        page: TranscriptPage,
    ) -> Result<(u64, Vec<TranscriptRow>, Option<u64>), SessionError> {
        self.find(id).await?;
        let service = self.clone();
        let id = id.to_string();
        tokio::task::spawn_blocking(move || {
            let (from, limit) = match page {
                TranscriptPage::From { from, limit } => (from.max(1), limit),
                TranscriptPage::Last(last) => {
                    // The stored length, not the memory's: on a shared store another host
                    // may have added to it.
                    let len = service.store.row(&id)?.map_or(0, |(row, _)| row.transcript_len);
                    (len.saturating_sub(last) + 1, last)
                }
            };
            let rows = service.store.transcript(&id, from, limit + 1)?;
            let next = (rows.len() as u64 > limit).then(|| rows[limit as usize].seq);
            let mut rows = rows;
            rows.truncate(limit as usize);
            Ok((from, rows, next))
        })
        .await
        .unwrap_or_else(|e| Err(SessionError::new(ErrorKind::Store, e.to_string())))
    }

    /// Whether the host can take turns now (`/readyz`): `unready` holds every reason it
    /// cannot (the store unreachable or not taking writes, a plugin quarantined), `notes`
    /// what is worth knowing but does not stop turns (a refused reload: the previous
    /// chain keeps serving).
    pub async fn readiness(self: &Arc<Self>) -> Readiness {
        let service = self.clone();
        let mut unready = Vec::new();
        let store = tokio::task::spawn_blocking(move || service.store.check_writable())
            .await
            .map_err(|e| e.to_string())
            .and_then(|checked| checked.map_err(|e| e.to_string()));
        if let Err(e) = store {
            unready.push(
                self.outage
                    .reason()
                    .unwrap_or_else(|| format!("store unwritable: {e}")),
            );
        }
        let chain = self.chain.current();
        for plugin in chain.quarantined() {
            unready.push(format!(
                "plugin \"{plugin}\" quarantined: a call ran past plugin_timeout_ms ({} ms); reload the chain to call it again",
                chain.deadline().unwrap_or_default().as_millis()
            ));
        }
        Readiness {
            unready,
            notes: self.reload_failure().into_iter().collect(),
        }
    }
}

/// What `/readyz` reports ([`Service::readiness`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Readiness {
    /// Why turns cannot be taken now; empty: ready.
    pub unready: Vec<String>,
    /// Worth knowing, not a reason to be unready.
    pub notes: Vec<String>,
}

fn new_slot(info: SessionInfo, session: Option<Session>) -> Slot {
    Slot {
        info: Mutex::new(info),
        resident: AtomicUsize::new(session.as_ref().map_or(0, Session::memory_estimate)),
        state: Arc::new(AsyncMutex::new(session)),
        closed: AtomicBool::new(false),
        turns: Mutex::default(),
    }
}

impl ErrorKind {
    fn code_for_metrics(self) -> &'static str {
        match self {
            ErrorKind::BadInput | ErrorKind::Conflict => "bad_input",
            ErrorKind::PluginFailed => "plugin_failed",
            ErrorKind::Busy => "busy",
            ErrorKind::NotFound => "not_found",
            _ => "store_failed",
        }
    }
}

/// An expiration override from a request, checked, as the JSON the store keeps; `null` or
/// absent is none.
fn checked_override(value: Option<Value>) -> Result<Option<String>, SessionError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(value) => {
            parse_override(&value)?;
            Ok(Some(value.to_string()))
        }
    }
}
