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

use agentctl::edit::Edit;
use history_engine::reload::{config_hash, load_shadowed, Watcher};
use history_engine::shadow::ShadowLibraries;
use history_engine::{Config, SharedChain};
use serde_json::{json, Value};
use tokio::sync::Mutex as AsyncMutex;

use crate::answers::{event_json, message_json, switch_json};
use crate::clock::{new_session_id, now_ms, rfc3339};
use crate::commands::Command;
use crate::error::{ErrorKind, SessionError};
use crate::metrics::Metrics;
use crate::reload::ReloadState;
use crate::session::{parse_override, Env, Session, SwitchOutcome, TurnInput, TurnOutcome};
use crate::store::{
    self, HostCopy, Locked, SessionLock, SessionRow, SessionWrite, Store, StoreError, StoredSession,
    TranscriptRow,
};

/// How long a turn waits for the session's previous turn by default.
const DEFAULT_TURN_WAIT: Duration = Duration::from_secs(30);

/// What the listing (`GET /v1/sessions`) shows of a session, kept outside its lock so
/// listing never waits for a running turn.
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

    /// As JSON (times as RFC 3339).
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "model": self.model,
            "effective_ctx": self.effective_ctx,
            "turn": self.turn,
            "transcript_size": self.transcript_size,
            "working_size": self.working_size,
            "created_at": rfc3339(self.created_at),
            "last_active": rfc3339(self.last_active),
        })
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

/// A store that times its transactions.
struct TimedStore {
    inner: Box<dyn Store>,
    metrics: Arc<Metrics>,
}

impl TimedStore {
    fn timed<T>(&self, f: impl FnOnce(&dyn Store) -> T) -> T {
        let started = Instant::now();
        let result = f(&*self.inner);
        self.metrics.store(started.elapsed().as_secs_f64());
        result
    }
}

/// The store as an operation on a session of a shared store sees it: its writes go
/// through the session's lock (its connection), everything else to the store.
struct LockedStore<'a> {
    store: &'a dyn Store,
    lock: Mutex<Box<dyn SessionLock>>,
    metrics: &'a Metrics,
}

impl Store for LockedStore<'_> {
    fn create(&self, row: &SessionRow) -> Result<(), StoreError> {
        self.store.create(row)
    }
    fn commit(&self, write: &SessionWrite<'_>) -> Result<(), StoreError> {
        let started = Instant::now();
        let result = self.lock.lock().unwrap_or_else(|e| e.into_inner()).commit(write);
        self.metrics.store(started.elapsed().as_secs_f64());
        result
    }
    fn set_effective_ctx(&self, sessions: &[(String, u64)]) -> Result<(), StoreError> {
        self.store.set_effective_ctx(sessions)
    }
    fn delete(&self, id: &str) -> Result<bool, StoreError> {
        self.store.delete(id)
    }
    fn sessions(&self) -> Result<Vec<(SessionRow, usize)>, StoreError> {
        self.store.sessions()
    }
    fn load(&self, id: &str) -> Result<Option<StoredSession>, StoreError> {
        self.store.load(id)
    }
    fn transcript(&self, id: &str, from: u64, limit: u64) -> Result<Vec<TranscriptRow>, StoreError> {
        self.store.transcript(id, from, limit)
    }
    fn check_writable(&self) -> Result<(), StoreError> {
        self.store.check_writable()
    }
    fn summary(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.store.summary(key)
    }
    fn put_summary(&self, key: &str, summary: &str) -> Result<(), StoreError> {
        self.store.put_summary(key, summary)
    }
}

impl Store for TimedStore {
    fn create(&self, row: &SessionRow) -> Result<(), StoreError> {
        self.timed(|s| s.create(row))
    }
    fn commit(&self, write: &SessionWrite<'_>) -> Result<(), StoreError> {
        self.timed(|s| s.commit(write))
    }
    fn set_effective_ctx(&self, sessions: &[(String, u64)]) -> Result<(), StoreError> {
        self.timed(|s| s.set_effective_ctx(sessions))
    }
    fn delete(&self, id: &str) -> Result<bool, StoreError> {
        self.timed(|s| s.delete(id))
    }
    fn sessions(&self) -> Result<Vec<(SessionRow, usize)>, StoreError> {
        self.inner.sessions()
    }
    fn load(&self, id: &str) -> Result<Option<StoredSession>, StoreError> {
        self.inner.load(id)
    }
    fn transcript(&self, id: &str, from: u64, limit: u64) -> Result<Vec<TranscriptRow>, StoreError> {
        self.inner.transcript(id, from, limit)
    }
    fn check_writable(&self) -> Result<(), StoreError> {
        self.inner.check_writable()
    }
    fn summary(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.timed(|s| s.summary(key))
    }
    fn put_summary(&self, key: &str, summary: &str) -> Result<(), StoreError> {
        self.timed(|s| s.put_summary(key, summary))
    }
    fn shared(&self) -> bool {
        self.inner.shared()
    }
    fn lock(&self, id: &str, held: Option<&HostCopy>) -> Result<Locked, StoreError> {
        self.inner.lock(id, held)
    }
    fn create_limited(&self, row: &SessionRow, max_users: u64) -> Result<Result<(), u64>, StoreError> {
        self.timed(|s| s.create_limited(row, max_users))
    }
    fn reap(&self, cutoff_ms: u64) -> Result<Vec<String>, StoreError> {
        self.timed(|s| s.reap(cutoff_ms))
    }
    fn row(&self, id: &str) -> Result<Option<(SessionRow, usize)>, StoreError> {
        self.inner.row(id)
    }
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
        let store: Arc<dyn Store> = Arc::new(TimedStore {
            inner: store::open(&store_path, turn_wait).map_err(|e| StartError(e.to_string()))?,
            metrics: metrics.clone(),
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
        let row = SessionRow {
            id: new_session_id(),
            effective_ctx: config.model(&model).effective_ctx,
            model,
            turn: 0,
            transcript_len: 0,
            cleared_at: 0,
            expiration_override,
            created_at: now,
            last_active: now,
            next_copy: 1,
            version: 0,
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
            // On a shared store: the session's lock across hosts, and the session as
            // stored if another host changed it since this one last did.
            let mut locked = None;
            match service
                .store
                .lock(&id, guard.as_ref().map(Session::host_copy).as_ref())?
            {
                Locked::NotShared => {}
                Locked::Busy => {
                    return Err(SessionError::new(
                        ErrorKind::Busy,
                        format!(
                        "session \"{id}\" is busy: an operation on it still runs on another host after {} ms",
                        service.turn_wait.as_millis()
                    ),
                    ))
                }
                Locked::Held(mut lock) => {
                    let Some(version) = lock.version() else {
                        // Deleted or reaped by another host.
                        slot.closed.store(true, Ordering::SeqCst);
                        service.slots().remove(&id);
                        return Err(SessionError::not_found(&id));
                    };
                    if guard.as_ref().is_none_or(|s| s.row.version != version) {
                        // The last sent history comes with it: stored with each turn.
                        let stored = lock.load()?.ok_or_else(|| SessionError::not_found(&id))?;
                        *guard = Some(Session::from_stored_reusing(stored, guard.as_ref())?);
                    }
                    locked = Some(lock);
                }
            }
            if guard.is_none() {
                let stored = service
                    .store
                    .load(&id)?
                    .ok_or_else(|| SessionError::not_found(&id))?;
                *guard = Some(Session::from_stored(stored)?);
            }
            let session = guard.as_mut().expect("loaded above");
            // effective_ctx may have changed host-wide (`!maxctx`) since the last operation.
            session.row.effective_ctx = slot.info().effective_ctx;
            let config = service.config();
            let chain = service.chain.current();
            let locked_store = locked.map(|lock| LockedStore {
                store: &*service.store,
                lock: Mutex::new(lock),
                metrics: &service.metrics,
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
            let result = f(session, &env);
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

    /// Past `session_memory_mb` MiB of sessions in memory, puts the least recently
    /// active ones out of memory until they hold 90% of it, so this is not done again at
    /// once (docs/sessions.md#memory). A session is only put out between its operations
    /// (one running keeps it), and what is in memory is what is stored, so the next
    /// operation reads it back as a restart would. 0: no limit.
    fn keep_within_memory(&self, memory_mb: u64) {
        let budget = usize::try_from(memory_mb)
            .unwrap_or(usize::MAX)
            .saturating_mul(1 << 20);
        if budget == 0 {
            return;
        }
        let resident: Vec<(u64, usize, Arc<Slot>)> = self
            .slots()
            .values()
            .filter_map(|slot| {
                let bytes = slot.resident.load(Ordering::Relaxed);
                (bytes > 0).then(|| (slot.info().last_active, bytes, slot.clone()))
            })
            .collect();
        let mut total: usize = resident.iter().map(|(_, bytes, _)| bytes).sum();
        if total <= budget {
            return;
        }
        let mut oldest_first = resident;
        oldest_first.sort_unstable_by_key(|(last_active, ..)| *last_active);
        let mut put_out = 0;
        for (_, _, slot) in oldest_first {
            if total <= budget / 10 * 9 {
                break;
            }
            let Ok(mut state) = slot.state.try_lock() else {
                continue;
            };
            if state.take().is_some() {
                total = total.saturating_sub(slot.resident.swap(0, Ordering::Relaxed));
                put_out += 1;
            }
        }
        self.metrics.sessions_put_out(put_out);
        tracing::debug!("{put_out} sessions put out of memory past session_memory_mb = {memory_mb}");
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
                tracing::warn!(session = %id, "turn refused: {}", e.message);
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

    /// A page of the transcript from message `from` (from 1): `(rows, next)`, `next` the
    /// `from` of the next page if there is one.
    pub async fn transcript(
        self: &Arc<Self>,
        id: &str,
        from: u64,
        limit: u64,
    ) -> Result<(Vec<TranscriptRow>, Option<u64>), SessionError> {
        self.find(id).await?;
        let service = self.clone();
        let id = id.to_string();
        tokio::task::spawn_blocking(move || {
            let rows = service.store.transcript(&id, from.max(1), limit + 1)?;
            let next = (rows.len() as u64 > limit).then(|| rows[limit as usize].seq);
            let mut rows = rows;
            rows.truncate(limit as usize);
            Ok((rows, next))
        })
        .await
        .unwrap_or_else(|e| Err(SessionError::new(ErrorKind::Store, e.to_string())))
    }

    /// Ends a session and deletes what is stored of it.
    pub async fn delete(self: &Arc<Self>, id: &str) -> Result<(), SessionError> {
        let slot = self.find(id).await?;
        let _guard = tokio::time::timeout(self.turn_wait, slot.state.clone().lock_owned())
            .await
            .map_err(|_| SessionError::new(ErrorKind::Busy, format!("session \"{id}\" is busy")))?;
        self.close(id, &slot).await?;
        tracing::info!(session = %id, "session deleted");
        Ok(())
    }

    /// Removes a session whose lock the caller holds.
    async fn close(self: &Arc<Self>, id: &str, slot: &Arc<Slot>) -> Result<(), SessionError> {
        if slot.closed.swap(true, Ordering::SeqCst) {
            return Err(SessionError::not_found(id));
        }
        let service = self.clone();
        let owned = id.to_string();
        let deleted = tokio::task::spawn_blocking(move || service.store.delete(&owned))
            .await
            .unwrap_or_else(|e| Err(StoreError::new(e.to_string())));
        if let Err(e) = deleted {
            slot.closed.store(false, Ordering::SeqCst);
            return Err(e.into());
        }
        self.slots().remove(id);
        Ok(())
    }

    /// The idle timeout in milliseconds (0 = never reap).
    pub fn idle_timeout_ms(&self) -> u64 {
        self.idle_timeout_ms.load(Ordering::SeqCst)
    }

    /// Closes every session idle longer than the idle timeout (a running turn keeps its
    /// session). Returns how many.
    pub async fn reap_idle(self: &Arc<Self>) -> usize {
        let timeout = self.idle_timeout_ms();
        if timeout == 0 {
            return 0;
        }
        let now = now_ms();
        if self.store.shared() {
            return self.reap_shared(now.saturating_sub(timeout), timeout).await;
        }
        let idle: Vec<(String, Arc<Slot>)> = self
            .slots()
            .iter()
            .filter(|(_, slot)| now.saturating_sub(slot.info().last_active) > timeout)
            .map(|(id, slot)| (id.clone(), slot.clone()))
            .collect();
        let mut reaped = 0;
        for (id, slot) in idle {
            let Ok(_guard) = slot.state.clone().try_lock_owned() else {
                continue;
            };
            let idle_ms = now.saturating_sub(slot.info().last_active);
            if idle_ms <= timeout {
                continue;
            }
            match self.close(&id, &slot).await {
                Ok(()) => {
                    reaped += 1;
                    tracing::info!(
                        session = %id,
                        "session reaped: idle {:.1} s, past the idle timeout of {:.1} s",
                        idle_ms as f64 / 1000.0,
                        timeout as f64 / 1000.0
                    );
                }
                Err(e) => tracing::warn!(session = %id, "cannot reap the session: {e}"),
            }
        }
        reaped
    }

    /// The reaper on a shared store: the store deletes what is idle and not in use on
    /// any host; every host runs it, and no two reap the same session.
    async fn reap_shared(self: &Arc<Self>, cutoff: u64, timeout: u64) -> usize {
        let service = self.clone();
        let reaped = tokio::task::spawn_blocking(move || service.store.reap(cutoff))
            .await
            .unwrap_or_else(|e| Err(StoreError::new(e.to_string())));
        let reaped = match reaped {
            Ok(reaped) => reaped,
            Err(e) => {
                tracing::warn!("cannot reap idle sessions: {e}");
                return 0;
            }
        };
        for id in &reaped {
            if let Some(slot) = self.slots().remove(id) {
                slot.closed.store(true, Ordering::SeqCst);
            }
            tracing::info!(
                session = %id,
                "session reaped: idle past the idle timeout of {:.1} s",
                timeout as f64 / 1000.0
            );
        }
        reaped.len()
    }

    /// Runs the reaper until the service shuts down: it looks every quarter of the idle
    /// timeout (between 50 ms and 30 s).
    pub fn spawn_reaper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let service = self.clone();
        tokio::spawn(async move {
            while !service.is_shutting_down() {
                let timeout = service.idle_timeout_ms();
                let every = if timeout == 0 {
                    1000
                } else {
                    (timeout / 4).clamp(50, 30_000)
                };
                tokio::time::sleep(Duration::from_millis(every)).await;
                service.reap_idle().await;
            }
        })
    }

    /// Runs a runtime command on session `id` (docs/sessions.md#runtime-commands).
    pub async fn command(self: &Arc<Self>, id: &str, command: Command) -> Result<Value, SessionError> {
        self.refuse_if_shutting_down()?;
        self.find(id).await?;
        match command {
            Command::Model(model) => {
                let outcome = self.switch_model(id, model).await?;
                Ok(switch_json(&outcome))
            }
            Command::MaxCtx { value, temporary } => {
                if !temporary {
                    self.edit_config(Edit::MaxCtx(value)).await?;
                }
                let updated = self.set_agent_max_ctx(value).await?;
                Ok(json!({
                    "agent_max_ctx": value,
                    "written": !temporary,
                    "sessions_updated": updated,
                    "effective_ctx": self.info(id)?.effective_ctx,
                }))
            }
            Command::MaxUsers(value) => {
                self.edit_config(Edit::MaxUsers(value)).await?;
                self.change_config(|c| c.max_users = value);
                Ok(json!({"max_users": value, "written": true}))
            }
            Command::SessionTimeout(minutes) => {
                self.edit_config(Edit::SessionTimeout(minutes)).await?;
                self.change_config(|c| c.session_idle_timeout_minutes = minutes);
                self.idle_timeout_ms.store(minutes * 60_000, Ordering::SeqCst);
                Ok(json!({"session_idle_timeout_minutes": minutes, "written": true}))
            }
            Command::Expand(target) => {
                let (index, message, event) = self
                    .with_session(id, move |session, env| session.expand(env, &target))
                    .await?;
                Ok(json!({
                    "index": index,
                    "message": message_json(&message),
                    "event": event_json("host", &event),
                }))
            }
            Command::History => {
                self.with_session(id, |session, _| {
                    Ok(json!({
                        "working_size": session.working().len(),
                        "lines": session.history_lines(),
                    }))
                })
                .await
            }
            Command::Clear => {
                self.with_session(id, |session, env| {
                    session.clear(env)?;
                    Ok(json!({"working_size": 0, "cleared_at": session.row.cleared_at}))
                })
                .await
            }
        }
    }

    /// Writes a host-wide setting to the configuration file as agentctl does (its
    /// validation loading the libraries from this host's shadow copies). The file written
    /// is remembered as the running configuration's when the file it edited was, so hot
    /// reload does not reload for this host's own write (docs/chain.md#hot-reload).
    async fn edit_config(self: &Arc<Self>, edit: Edit) -> Result<(), SessionError> {
        let service = self.clone();
        let outcome = tokio::task::spawn_blocking(move || {
            let loading = agentctl::edit::Loading::Shadowed(service.libraries.clone());
            let outcome = agentctl::edit::run(&service.config_file, &edit, loading, &|| {})?;
            service
                .lock_reload()
                .own_write(&config_hash(&outcome.before), &config_hash(&outcome.after));
            Ok::<_, agentctl::edit::Refused>(outcome)
        })
        .await
        .map_err(|e| SessionError::new(ErrorKind::Store, e.to_string()))?
        .map_err(|refused| SessionError::bad_input(refused.0))?;
        tracing::info!("{}: {}", outcome.file.display(), outcome.summary);
        Ok(())
    }

    /// Sets the live `agent_max_ctx` and recomputes every session's `effective_ctx`
    /// between their operations. Returns how many sessions changed.
    async fn set_agent_max_ctx(self: &Arc<Self>, value: u64) -> Result<usize, SessionError> {
        let service = self.clone();
        tokio::task::spawn_blocking(move || {
            let _settings = service.settings.write().unwrap_or_else(|e| e.into_inner());
            let config = service.change_config(|c| c.agent_max_ctx = value);
            let changed = service.recompute_effective_ctx(&config)?;
            tracing::info!("agent_max_ctx = {value}: effective_ctx recomputed for {changed} sessions");
            Ok(changed)
        })
        .await
        .map_err(|e| SessionError::new(ErrorKind::Store, e.to_string()))?
    }

    /// Recomputes every live session's `effective_ctx` by `config` (the caller holds the
    /// settings exclusively). Returns how many changed.
    pub(crate) fn recompute_effective_ctx(&self, config: &Config) -> Result<usize, StoreError> {
        let slots: Vec<Arc<Slot>> = self.slots().values().cloned().collect();
        let mut changes = Vec::new();
        for slot in &slots {
            let info = slot.info();
            let effective_ctx = config.model(&info.model).effective_ctx;
            if effective_ctx != info.effective_ctx {
                changes.push((slot.clone(), info.id, effective_ctx));
            }
        }
        let updates: Vec<(String, u64)> = changes.iter().map(|(_, id, e)| (id.clone(), *e)).collect();
        self.store.set_effective_ctx(&updates)?;
        for (slot, _, effective_ctx) in &changes {
            slot.info.lock().unwrap_or_else(|e| e.into_inner()).effective_ctx = *effective_ctx;
        }
        Ok(changes.len())
    }

    /// `Ok` when the store takes writes, the last reload did not fail and no plugin of the
    /// chain is quarantined; else every reason, one per line.
    pub async fn health(self: &Arc<Self>) -> Result<(), String> {
        let service = self.clone();
        let mut reasons = Vec::new();
        let store = tokio::task::spawn_blocking(move || service.store.check_writable())
            .await
            .map_err(|e| e.to_string())
            .and_then(|checked| checked.map_err(|e| e.to_string()));
        if let Err(e) = store {
            reasons.push(format!("store unwritable: {e}"));
        }
        reasons.extend(self.reload_failure());
        let chain = self.chain.current();
        for plugin in chain.quarantined() {
            reasons.push(format!(
                "plugin \"{plugin}\" quarantined: a call ran past plugin_timeout_ms ({} ms); reload the chain to call it again",
                chain.deadline().unwrap_or_default().as_millis()
            ));
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(reasons.join("\n"))
        }
    }
}

fn new_slot(info: SessionInfo, session: Option<Session>) -> Slot {
    Slot {
        info: Mutex::new(info),
        resident: AtomicUsize::new(session.as_ref().map_or(0, Session::memory_estimate)),
        state: Arc::new(AsyncMutex::new(session)),
        closed: AtomicBool::new(false),
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
