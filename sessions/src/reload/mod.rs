//! Hot reload of the service's configuration and chain (docs/chain.md#hot-reload).
//!
//! A watch of the configuration file and `plugin_dir` ([`Watcher`], debounced) wakes a
//! thread of its own, which loads the new configuration and chain beside the running ones
//! and checks the chain on the built-in sample history
//! ([`history_engine::reload::load_checked`]). A chain that passes is swapped in between
//! operations, with every host-wide setting of the new file; one that fails is refused
//! with one error line, counted, reported by health and `GET /v1/chain`, and the running
//! chain keeps serving. Nothing is reloaded when the files are what the running chain was
//! loaded from (a runtime command's own write included), unless the last reload failed
//! or a plugin is quarantined: then the same files are a retry, or the way to end the
//! quarantine.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use history_engine::reload::{load_checked, Fingerprint, Loaded, Watcher};
use history_engine::Config;

use crate::clock::{now_ms, rfc3339};

/// How long a failed reload waits for the files to settle before it is refused: two of
/// the watch's debounce periods.
const SETTLE: std::time::Duration = history_engine::reload::DEBOUNCE.saturating_mul(2);
use crate::service::{idle_timeout_ms_for, Service};

pub(crate) mod state;
pub use state::LastReload;
use state::ReloadState;

impl Service {
    /// Starts hot reload: watches the configuration file and `plugin_dir`, and reloads on
    /// a change, on a thread of its own, until [`Service::shut_down`].
    pub fn watch(self: &Arc<Self>) -> Result<(), String> {
        let (changed, changes) = std::sync::mpsc::channel();
        let watcher = Watcher::start(&self.config_file, &self.config().plugin_dir, changed)?;
        *self.watcher.lock().unwrap_or_else(|e| e.into_inner()) = Some(watcher);
        // Weak: the thread ends with the service, or when the watch stops (its sender
        // goes with it).
        let service = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("history-reload".into())
            .spawn(move || {
                while changes.recv().is_ok() {
                    // Changes that came in meanwhile are all in the files read now.
                    while changes.try_recv().is_ok() {}
                    match service.upgrade() {
                        Some(service) if !service.is_shutting_down() => service.reload(),
                        _ => break,
                    }
                }
            })
            .map_err(|e| format!("cannot start the reload thread: {e}"))?;
        tracing::info!(
            "hot reload: watching {} and {}",
            self.config_file.display(),
            self.config().plugin_dir.display()
        );
        Ok(())
    }

    /// Stops the watch (the reload thread ends after any reload it is running).
    pub fn stop_watching(&self) {
        self.watcher.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    pub(crate) fn lock_reload(&self) -> std::sync::MutexGuard<'_, ReloadState> {
        self.reload.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How the last reload went, if there was one.
    pub fn last_reload(&self) -> Option<LastReload> {
        self.lock_reload().last.clone()
    }

    /// Health's line for a failed last reload.
    pub(crate) fn reload_failure(&self) -> Option<String> {
        let last = self.last_reload()?;
        let error = last.error?;
        Some(format!(
            "chain reload failed at {}: {error}; the previous chain keeps serving",
            rfc3339(last.at)
        ))
    }

    /// Loads the configuration and chain beside the running ones and swaps them in, or
    /// refuses them (one error line) and keeps the running ones. Blocks: the chain loads
    /// and runs on the sample here, and the swap waits for running operations.
    pub(crate) fn reload(&self) {
        let running = self.config();
        let now = self.fingerprint(&running);
        let quarantined = !self.chain.current().quarantined().is_empty();
        if let Some(now) = &now {
            if !self.lock_reload().needs_reload(now, quarantined) {
                tracing::debug!("the configuration and plugin_dir are as last loaded: nothing to reload");
                return;
            }
        }
        tracing::info!("the configuration or plugin_dir changed: loading the chain beside the running one");
        let result = load_checked(&self.config_file, &self.libraries);
        let at = now_ms();
        match result {
            Ok(loaded) => {
                let fingerprint = loaded.fingerprint.clone();
                self.swap_in(loaded, &running);
                let mut state = self.lock_reload();
                state.running = fingerprint;
                state.last = Some(LastReload { at, error: None });
                state.refused = None;
                drop(state);
                self.metrics.reload(true);
            }
            Err(error) => {
                // Files still being written: an editor saving in place truncates, then
                // writes, and a library being copied is short until it is whole; the
                // watch may have woken in between. Files that change within a moment
                // of the failure are reloaded by that change's own event; only files
                // that stay as they were loaded are refused.
                std::thread::sleep(SETTLE);
                if self.fingerprint(&running) != now {
                    tracing::debug!("the files changed while they were loaded: waiting for that change");
                    return;
                }
                tracing::error!("chain reload refused, the previous chain keeps serving: {error}");
                let mut state = self.lock_reload();
                state.last = Some(LastReload {
                    at,
                    error: Some(error),
                });
                state.refused = now;
                self.metrics.reload(false);
            }
        }
    }

    /// What the configuration file and `plugin_dir` hold now (`None`: the file cannot
    /// be read); `plugin_dir` is the running one while the file does not parse.
    fn fingerprint(&self, running: &Config) -> Option<Fingerprint> {
        let text = std::fs::read_to_string(&self.config_file).ok()?;
        let plugin_dir = Config::parse(&self.config_file, text.clone())
            .map(|c| c.plugin_dir)
            .unwrap_or_else(|_| running.plugin_dir.clone());
        Some(Fingerprint::of(&text, &plugin_dir))
    }

    /// Puts a reloaded configuration and chain in place between operations, with the
    /// settings they bring: `effective_ctx` of every live session, the idle timeout, the
    /// token cache's size, the watched `plugin_dir`.
    fn swap_in(&self, loaded: Loaded, old: &Config) {
        let Loaded {
            config,
            chain,
            summarizer,
            ..
        } = loaded;
        summarizer.install();
        let restart_only = restart_only(old, &config);
        if !restart_only.is_empty() {
            tracing::warn!(
                "{}: {} changed; that takes effect at the next start",
                config.file.display(),
                restart_only.join(", ")
            );
        }
        if config.plugin_dir != old.plugin_dir {
            if let Some(watcher) = self.watcher.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                if let Err(e) = watcher.set_plugin_dir(&config.plugin_dir) {
                    tracing::warn!("hot reload: {e}");
                }
            }
        }
        let names = format!("chain {:?}, view {:?}", chain.names(), chain.view_names());
        let config = Arc::new(config);
        let _settings = self.settings.write().unwrap_or_else(|e| e.into_inner());
        if config.token_cache_entries != old.token_cache_entries {
            history_engine::tokens::set_cache_entries(config.token_cache_entries);
        }
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = config.clone();
        self.chain.replace(chain);
        self.idle_timeout_ms
            .store(idle_timeout_ms_for(&config), Ordering::SeqCst);
        let sessions = match self.recompute_effective_ctx(&config) {
            Ok(changed) => format!("effective_ctx recomputed for {changed} sessions"),
            Err(e) => format!("effective_ctx not stored: {e}"),
        };
        tracing::info!("chain reloaded: {names}; {sessions}");
    }
}

/// The keys whose change a reload cannot apply: what the server and the store were
/// started with.
fn restart_only(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut keys = Vec::new();
    if old.store != new.store || old.store_limits != new.store_limits {
        keys.push("store");
    }
    if old.operator_token_file != new.operator_token_file {
        keys.push("operator_token_file");
    }
    if old.max_body_mb != new.max_body_mb {
        keys.push("max_body_mb");
    }
    if old.upstream != new.upstream {
        keys.push("[upstream]");
    }
    if old.server != new.server {
        keys.push("[server]");
    }
    if old.ui != new.ui {
        keys.push("[ui]");
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fingerprint(config: &str, plugin_dir: &std::path::Path) -> Fingerprint {
        Fingerprint::of(config, plugin_dir)
    }

    #[test]
    fn settings_the_process_started_with_are_named_as_restart_only() {
        let parse =
            |text: &str| Config::parse(std::path::Path::new("/x/plugins-enabled.toml"), text.into()).unwrap();
        let old = parse("[server]\nidle_timeout_s = 61\n");
        assert!(restart_only(&old, &parse("[server]\nidle_timeout_s = 61\n")).is_empty());
        assert_eq!(
            restart_only(&old, &parse("max_body_mb = 3\n[ui]\nkeep_bodies = true\n")),
            ["max_body_mb", "[server]", "[ui]"]
        );
    }

    #[test]
    fn only_a_change_of_the_files_reloads() {
        let plugin_dir = tempfile::tempdir().unwrap();
        let library = plugin_dir.path().join("libhistory_plugin_x.so");
        std::fs::write(&library, "build one").unwrap();
        let state = ReloadState::new(fingerprint("a = 1\n", plugin_dir.path()));
        assert!(!state.needs_reload(&fingerprint("a = 1\n", plugin_dir.path()), false));
        assert!(state.needs_reload(&fingerprint("a = 2\n", plugin_dir.path()), false));
        assert!(
            state.needs_reload(&fingerprint("a = 1\n", plugin_dir.path()), true),
            "the same files end a quarantine"
        );
        std::fs::write(&library, "build two, longer").unwrap();
        assert!(
            state.needs_reload(&fingerprint("a = 1\n", plugin_dir.path()), false),
            "a rebuilt library"
        );
        std::fs::write(plugin_dir.path().join("notes.txt"), "not a library").unwrap();
        let state = ReloadState::new(fingerprint("a = 1\n", plugin_dir.path()));
        std::fs::write(plugin_dir.path().join("notes.txt"), "changed").unwrap();
        assert!(!state.needs_reload(&fingerprint("a = 1\n", plugin_dir.path()), false));
    }

    #[test]
    fn refused_files_are_not_loaded_again_but_the_running_ones_are() {
        let plugin_dir = tempfile::tempdir().unwrap();
        let mut state = ReloadState::new(fingerprint("a = 1\n", plugin_dir.path()));
        state.last = Some(LastReload {
            at: 1,
            error: Some("bad".into()),
        });
        state.refused = Some(fingerprint("a = [\n", plugin_dir.path()));
        assert!(
            !state.needs_reload(&fingerprint("a = [\n", plugin_dir.path()), false),
            "another event of the refused files"
        );
        assert!(state.needs_reload(&fingerprint("a = 2\n", plugin_dir.path()), false));
        assert!(
            state.needs_reload(&fingerprint("a = 1\n", plugin_dir.path()), false),
            "the running files back: reloaded, so health stops reporting the refusal"
        );
    }

    #[test]
    fn the_services_own_write_reloads_nothing() {
        let plugin_dir = tempfile::tempdir().unwrap();
        let (old, new) = ("max_users = 50\n", "max_users = 7\n");
        let mut state = ReloadState::new(fingerprint(old, plugin_dir.path()));
        state.own_write(
            &history_engine::reload::config_hash(old),
            &history_engine::reload::config_hash(new),
        );
        assert!(
            !state.needs_reload(&fingerprint(new, plugin_dir.path()), false),
            "the file the command wrote is the running configuration"
        );
        assert!(state.needs_reload(&fingerprint(old, plugin_dir.path()), false));
    }

    #[test]
    fn an_own_write_over_an_edit_not_reloaded_yet_still_reloads() {
        let plugin_dir = tempfile::tempdir().unwrap();
        let (running, edited, written) = (
            "max_users = 50\n",
            "max_users = 50\nx = 1\n",
            "max_users = 7\nx = 1\n",
        );
        let mut state = ReloadState::new(fingerprint(running, plugin_dir.path()));
        state.own_write(
            &history_engine::reload::config_hash(edited),
            &history_engine::reload::config_hash(written),
        );
        assert!(
            state.needs_reload(&fingerprint(written, plugin_dir.path()), false),
            "the hand edit under the command's write is not lost"
        );
    }
}
