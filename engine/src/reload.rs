//! Hot reload's engine side (docs/chain.md#hot-reload): loading a configuration and its
//! chain from shadow copies ([`crate::shadow`]) beside the running one and checking it on
//! the built-in sample history, what the running files look like ([`Fingerprint`]), and
//! the debounced watch of the configuration file and `plugin_dir` ([`Watcher`]). When to
//! reload and what a reload changes in a service is the service's business.

use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use notify_debouncer_mini::notify::{RecommendedWatcher, RecursiveMode};
use notify_debouncer_mini::{new_debouncer, DebounceEventResult, DebouncedEventKind, Debouncer};

use crate::shadow::{content_hash, ShadowLibraries};
use crate::{plugin_stem, selfcheck, Catalog, Chain, Config, ConfigError};

/// How long the watched files must be quiet before a change counts: an editor's or a
/// build's burst of writes is one reload.
pub const DEBOUNCE: Duration = Duration::from_millis(300);

/// What a chain was loaded from: the configuration's content and each library file of
/// `plugin_dir` as the file system describes it (size, modification time, inode). Equal
/// fingerprints mean nothing a reload would read has changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    /// The configuration's content hash.
    pub config: String,
    libraries: Vec<(PathBuf, u64, Option<SystemTime>, u64)>,
}

impl Fingerprint {
    /// The fingerprint of configuration text `config` and the libraries of `plugin_dir`.
    pub fn of(config: &str, plugin_dir: &Path) -> Fingerprint {
        let mut libraries: Vec<_> = std::fs::read_dir(plugin_dir)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| plugin_stem(path).is_some())
            .chain(program_files(plugin_dir))
            .filter_map(|path| {
                let meta = std::fs::metadata(&path).ok()?;
                Some((path, meta.len(), meta.modified().ok(), inode(&meta)))
            })
            .collect();
        libraries.sort();
        libraries.dedup();
        Fingerprint {
            config: config_hash(config),
            libraries,
        }
    }
}

/// The process plugins' files in `plugin_dir`: each manifest and the files it names
/// (its script, its `files`), so an edited script is a change (docs/process-plugins.md#hot-reload).
fn program_files(plugin_dir: &Path) -> Vec<PathBuf> {
    let Ok(catalog) = Catalog::discover(plugin_dir) else {
        return Vec::new();
    };
    catalog
        .programs()
        .iter()
        .flat_map(|program| match &program.manifest {
            Ok(manifest) => manifest.files.clone(),
            Err(_) => vec![program.path.clone()],
        })
        .collect()
}

/// The content hash of configuration text (what a runtime command's own write is known by).
pub fn config_hash(text: &str) -> String {
    content_hash(text.as_bytes())
}

#[cfg(unix)]
fn inode(meta: &std::fs::Metadata) -> u64 {
    std::os::unix::fs::MetadataExt::ino(meta)
}

#[cfg(not(unix))]
fn inode(_meta: &std::fs::Metadata) -> u64 {
    0
}

/// A configuration and its chain, loaded from shadow copies.
pub struct Loaded {
    pub config: Config,
    pub chain: Chain,
    pub fingerprint: Fingerprint,
    /// The configuration's `[summarizer]`, to install with the chain
    /// ([`crate::summarizer::Connected::install`]).
    pub summarizer: crate::summarizer::Connected,
}

/// Loads `config_file` and its chain, every library from a shadow copy held by
/// `libraries`: what a long-running host does at start.
pub fn load_shadowed(config_file: &Path, libraries: &Arc<ShadowLibraries>) -> Result<Loaded, ConfigError> {
    let text = std::fs::read_to_string(config_file).map_err(|err| ConfigError {
        file: config_file.to_path_buf(),
        line: None,
        message: format!("cannot read it: {err}"),
    })?;
    let config = Config::parse(config_file, text)?;
    let summarizer = crate::summarizer::connect(&config)?;
    let fingerprint = Fingerprint::of(config.source(), &config.plugin_dir);
    let catalog = Catalog::discover(&config.plugin_dir)
        .map_err(|e| config.error(None, e.0))?
        .shadowed(libraries.clone());
    let chain = Chain::load(&config, &catalog)?;
    Ok(Loaded {
        config,
        chain,
        fingerprint,
        summarizer,
    })
}

/// Loads `config_file` and its chain beside the running one, as [`load_shadowed`] does
/// (every plugin's `new` validating its table), then runs the chain on the built-in
/// sample history once per model ([`selfcheck::sample_runs`]). A chain that fails is
/// refused in one line.
pub fn load_checked(config_file: &Path, libraries: &Arc<ShadowLibraries>) -> Result<Loaded, String> {
    let loaded = load_shadowed(config_file, libraries).map_err(|e| e.to_string())?;
    let (_, problems) = selfcheck::sample_runs(&loaded.chain, &loaded.config);
    match problems.as_slice() {
        [] => Ok(loaded),
        [only] => Err(only.clone()),
        [first, rest @ ..] => Err(format!("{first} (and {} more problems)", rest.len())),
    }
}

/// Watches the configuration file and `plugin_dir` (not its `.shadow` folder), and sends
/// `()` on `changed` once they have been quiet for [`DEBOUNCE`] after a change. Dropping
/// it stops the watch.
pub struct Watcher {
    debouncer: Debouncer<RecommendedWatcher>,
    config_dir: PathBuf,
    /// The watched `plugin_dir`, shared with the event handler's filter.
    plugin_dir: Arc<RwLock<PathBuf>>,
}

impl Watcher {
    /// Starts watching. The configuration's folder is watched, not the file, so a file
    /// replaced by a rename (agentctl, most editors) stays watched; only the events of the
    /// configuration file and of plugin_dir's files count.
    pub fn start(config_file: &Path, plugin_dir: &Path, changed: Sender<()>) -> Result<Watcher, String> {
        let config_file = canonical(config_file)?;
        let config_dir = config_file.parent().unwrap_or(Path::new("/")).to_path_buf();
        let plugin_dir = Arc::new(RwLock::new(canonical(plugin_dir)?));
        let relevant = {
            let plugin_dir = plugin_dir.clone();
            move |path: &Path| {
                // Any file of plugin_dir but hidden ones (the shadow copies): a process
                // plugin's script has no fixed name; an event that changes nothing the
                // fingerprint covers reloads nothing.
                let hidden = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_none_or(|n| n.starts_with('.'));
                path == config_file
                    || (!hidden
                        && path.parent() == Some(&*plugin_dir.read().unwrap_or_else(|e| e.into_inner())))
            }
        };
        let handler = move |events: DebounceEventResult| match events {
            // A burst still going on (`AnyContinuous`) waits for its end.
            Ok(events) => {
                if events
                    .iter()
                    .any(|e| e.kind == DebouncedEventKind::Any && relevant(&e.path))
                {
                    let _ = changed.send(());
                }
            }
            Err(err) => tracing::warn!("watching the configuration and plugin_dir: {err}"),
        };
        let debouncer = new_debouncer(DEBOUNCE, handler).map_err(|e| format!("cannot watch files: {e}"))?;
        let mut watcher = Watcher {
            debouncer,
            config_dir: config_dir.clone(),
            plugin_dir: plugin_dir.clone(),
        };
        watcher.watch(&config_dir)?;
        let plugin_dir = plugin_dir.read().unwrap_or_else(|e| e.into_inner()).clone();
        if plugin_dir != config_dir {
            watcher.watch(&plugin_dir)?;
        }
        Ok(watcher)
    }

    /// Watches `plugin_dir` instead of the one watched so far (a reload changed it).
    pub fn set_plugin_dir(&mut self, plugin_dir: &Path) -> Result<(), String> {
        let new = canonical(plugin_dir)?;
        let old = self.plugin_dir.read().unwrap_or_else(|e| e.into_inner()).clone();
        if new == old {
            return Ok(());
        }
        if new != self.config_dir {
            self.watch(&new)?;
        }
        if old != self.config_dir {
            let _ = self.debouncer.watcher().unwatch(&old);
        }
        *self.plugin_dir.write().unwrap_or_else(|e| e.into_inner()) = new;
        Ok(())
    }

    fn watch(&mut self, dir: &Path) -> Result<(), String> {
        self.debouncer
            .watcher()
            .watch(dir, RecursiveMode::NonRecursive)
            .map_err(|e| format!("cannot watch {}: {e}", dir.display()))
    }
}

fn canonical(path: &Path) -> Result<PathBuf, String> {
    std::fs::canonicalize(path).map_err(|e| format!("cannot watch {}: {e}", path.display()))
}
