//! What hot reload remembers (docs/chain.md#hot-reload): what the running chain was
//! loaded from and how the last reload went. A leaf the service holds and the reload
//! thread (`super`) updates, so neither module imports the other both ways.

use history_engine::reload::Fingerprint;

/// How the last reload went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastReload {
    /// When it ended, in ms since the epoch.
    pub at: u64,
    /// Why it was refused; `None` when the new chain serves.
    pub error: Option<String>,
}

/// What the running chain was loaded from, and the last reload.
#[derive(Debug)]
pub(crate) struct ReloadState {
    pub(crate) running: Fingerprint,
    pub(crate) last: Option<LastReload>,
    /// What the last reload refused, while it is the last reload.
    pub(crate) refused: Option<Fingerprint>,
}

impl ReloadState {
    pub(crate) fn new(running: Fingerprint) -> ReloadState {
        ReloadState {
            running,
            last: None,
            refused: None,
        }
    }

    /// Whether files that look like `now` call for a reload: they differ from the running
    /// chain's, or the running chain's are back after a refused reload (which health
    /// still reports), or a plugin is quarantined (a reload ends it). Files just refused
    /// are not loaded again until they change.
    pub(crate) fn needs_reload(&self, now: &Fingerprint, quarantined: bool) -> bool {
        if self.refused.as_ref() == Some(now) {
            return false;
        }
        *now != self.running || self.refused.is_some() || quarantined
    }

    /// The service wrote the configuration (a runtime command), which held `before` and
    /// now holds `after`: when `before` was the running configuration, `after` is too (the
    /// command applied its setting already), so the event the write makes reloads nothing.
    /// When it was not (an edit not reloaded yet), the reload that follows applies both.
    pub(crate) fn own_write(&mut self, before: &str, after: &str) {
        if self.running.config == before {
            self.running.config = after.to_string();
        }
    }
}
