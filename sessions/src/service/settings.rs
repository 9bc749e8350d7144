//! The runtime commands (docs/sessions.md#runtime-commands), and the host-wide settings
//! they change: written to the configuration file as agentctl writes it, and applied to
//! every live session.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Service, Slot};
use crate::commands::{Command, CommandAnswer};
use crate::error::{ErrorKind, SessionError};
use crate::store::StoreError;
use history_engine::config::edit::{Edit, Refused};
use history_engine::reload::config_hash;
use history_engine::Config;

impl Service {
    /// Runs a runtime command on session `id` (docs/sessions.md#runtime-commands).
    pub async fn command(
        self: &Arc<Self>,
        id: &str,
        command: Command,
    ) -> Result<CommandAnswer, SessionError> {
        self.refuse_if_shutting_down()?;
        self.find(id).await?;
        match command {
            Command::Model(model) => Ok(CommandAnswer::Model(self.switch_model(id, model).await?)),
            Command::MaxCtx { value, temporary } => {
                if !temporary {
                    self.edit_config(Edit::MaxCtx(value)).await?;
                }
                let updated = self.set_agent_max_ctx(value).await?;
                Ok(CommandAnswer::MaxCtx {
                    agent_max_ctx: value,
                    written: !temporary,
                    sessions_updated: updated,
                    effective_ctx: self.info(id)?.effective_ctx,
                })
            }
            Command::MaxUsers(value) => {
                self.edit_config(Edit::MaxUsers(value)).await?;
                self.change_config(|c| c.max_users = value);
                Ok(CommandAnswer::MaxUsers(value))
            }
            Command::SessionTimeout(minutes) => {
                self.edit_config(Edit::SessionTimeout(minutes)).await?;
                self.change_config(|c| c.session_idle_timeout_minutes = minutes);
                self.idle_timeout_ms.store(minutes * 60_000, Ordering::SeqCst);
                Ok(CommandAnswer::SessionTimeout(minutes))
            }
            Command::Expand(target) => {
                let (index, message, event) = self
                    .with_session(id, move |session, env| session.expand(env, &target))
                    .await?;
                Ok(CommandAnswer::Expand {
                    index,
                    message,
                    event,
                })
            }
            Command::History => {
                self.with_session(id, |session, _| {
                    Ok(CommandAnswer::History {
                        working_size: session.working().len(),
                        lines: session.history_lines(),
                    })
                })
                .await
            }
            Command::Clear { all } => {
                self.with_session(id, move |session, env| {
                    let working_size = session.clear(env, all)?;
                    Ok(CommandAnswer::Clear {
                        working_size,
                        cleared_at: session.row.cleared_at,
                    })
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
            let loading = history_engine::edit::Loading::Shadowed(service.libraries.clone());
            let outcome = history_engine::edit::run(&service.config_file, &edit, loading, &|| {})?;
            service
                .lock_reload()
                .own_write(&config_hash(&outcome.before), &config_hash(&outcome.after));
            Ok::<_, Refused>(outcome)
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
}
