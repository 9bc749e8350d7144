//! Keeping the live sessions in bounds: deleting a session, reaping idle ones, and
//! putting the least recently active out of memory past `session_memory_mb`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{Service, Slot};
use crate::clock::now_ms;
use crate::error::{ErrorKind, SessionError};
use crate::store::StoreError;

impl Service {
    /// Past `session_memory_mb` MiB of sessions in memory, puts the least recently
    /// active ones out of memory until they hold 90% of it, so this is not done again at
    /// once (docs/sessions.md#memory). A session is only put out between its operations
    /// (one running keeps it), and what is in memory is what is stored, so the next
    /// operation reads it back as a restart would. 0: no limit.
    pub(super) fn keep_within_memory(&self, memory_mb: u64) {
        let budget = usize::try_from(memory_mb)
            .unwrap_or(usize::MAX)
            .saturating_mul(1 << 20);
        if budget == 0 {
            return;
        }
        // Runs after every operation: the common case (within the limit) only adds.
        let resident_bytes = |slot: &Slot| slot.resident.load(Ordering::Relaxed);
        if self
            .slots()
            .values()
            .map(|slot| resident_bytes(slot))
            .sum::<usize>()
            <= budget
        {
            return;
        }
        let resident: Vec<(u64, usize, Arc<Slot>)> = self
            .slots()
            .values()
            .filter_map(|slot| {
                let bytes = resident_bytes(slot);
                let last_active = slot.info.lock().unwrap_or_else(|e| e.into_inner()).last_active;
                (bytes > 0).then(|| (last_active, bytes, slot.clone()))
            })
            .collect();
        let mut total: usize = resident.iter().map(|(_, bytes, _)| bytes).sum();
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
                // An outage is logged once by its watch (`outage`).
                Err(e) if e.kind == crate::error::ErrorKind::StoreUnavailable => {}
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
            // An outage is logged once by its watch (`outage`).
            Err(e) if e.unavailable => return 0,
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
}
