//! The part of an edit of `plugins-enabled.toml` that needs the plugins (docs/cli.md#agentctl):
//! the text is edited by `history_config::edit` keeping its layout; here the edited text is
//! validated by the rules the host applies at load — a plugin to add must be available,
//! a plugin whose table changed must accept it (its `new`, in a child process), and the
//! chain must load with every plugin validating its table — and only then written
//! atomically. `agentctl` and the runtime commands of `serve` and `chat` edit through
//! [`run`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use history_config::edit::{apply, Edit, Refused};
use history_config::write::{location, write_atomic, EditLock};

use crate::shadow::ShadowLibraries;
use crate::{Catalog, Chain, Config, Prober, Unavailable};

/// What [`run`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The file that was (or would have been) written.
    pub file: PathBuf,
    /// What changed, in one line.
    pub summary: String,
    /// False when the edit asked for what the file already says: nothing was written.
    pub written: bool,
    /// The file's text the edit read, under the edit lock.
    pub before: String,
    /// The file's text after the edit (`before` when nothing was written).
    pub after: String,
}

/// How an edit's validation loads the libraries it maps.
pub enum Loading {
    /// Each first in a child process run by the prober, so one that crashes while it
    /// loads is a refusal, not the end of the caller (the `agentctl` binary).
    Probed(Prober),
    /// From the shadow copies of a host that reloads its chain, which never maps a file of
    /// `plugin_dir` itself (a runtime command of `serve`, docs/chain.md#hot-reload).
    Shadowed(Arc<ShadowLibraries>),
}

/// Reads `file`, applies `edit`, validates the result as the host would load it (the
/// libraries loaded as `loading` says), and writes it atomically ([`write_atomic`];
/// `before_rename` runs just before the rename, see there). Any refusal leaves the file
/// as it was.
pub fn run(file: &Path, edit: &Edit, loading: Loading, before_rename: &dyn Fn()) -> Result<Outcome, Refused> {
    // One agentctl edits a file at a time: no edit is lost to another's read-modify-write.
    let _lock = EditLock::acquire(file)?;
    let source = std::fs::read_to_string(file).map_err(|err| {
        Refused(format!(
            "cannot read {}: {err} (point --config at your plugins-enabled.toml)",
            file.display()
        ))
    })?;
    let config = Config::parse(file, source.clone()).map_err(|err| Refused(err.to_string()))?;
    let catalog =
        Catalog::discover(&config.plugin_dir).map_err(|err| Refused(format!("{}: {err}", file.display())))?;
    // plugin-set's check runs the plugin's `new` in a child process (a runtime command
    // inside `serve` never sets a plugin's table).
    let prober = match &loading {
        Loading::Probed(prober) => Some(prober.clone()),
        Loading::Shadowed(_) => None,
    };
    let catalog = match loading {
        Loading::Probed(prober) => catalog.probed(prober),
        Loading::Shadowed(libraries) => catalog.shadowed(libraries),
    };
    let available = |name: &str, config: &Config| check_available(name, config, &catalog);
    let planned = apply(file, &source, edit, Some(&available))?;
    if planned.text == source {
        return Ok(Outcome {
            file: file.to_path_buf(),
            summary: planned.summary,
            written: false,
            after: source.clone(),
            before: source,
        });
    }
    if let (Some(name), Some(prober)) = (edit.plugin_table(), &prober) {
        probe(file, &planned.text, name, &catalog, prober)?;
    }
    if let Err(refused) = validate(file, &planned.text, &catalog) {
        // Say so when the file was broken before the edit and the edit does not fix it.
        return Err(match validate(file, &source, &catalog) {
            Ok(_) => refused,
            Err(_) => Refused(refused.0.replace(
                "refused: after this edit the configuration would not load:",
                "refused: the configuration does not load, and this edit does not fix it:",
            )),
        });
    }
    write_atomic(file, &planned.text, &source, before_rename).map_err(Refused)?;
    Ok(Outcome {
        file: file.to_path_buf(),
        summary: planned.summary,
        written: true,
        before: source,
        after: planned.text,
    })
}

/// Checks edited text by the host's own rules: it parses ([`Config::parse`]), every
/// chain plugin is available, and the chain loads with every plugin validating its table.
pub fn validate(file: &Path, text: &str, catalog: &Catalog) -> Result<Config, Refused> {
    let refuse = |why: String| {
        Refused(format!(
            "refused: after this edit the configuration would not load: {why}"
        ))
    };
    let config = Config::parse(file, text.to_string()).map_err(|err| refuse(err.to_string()))?;
    Chain::load(&config, catalog).map_err(|err| refuse(err.to_string()))?;
    Ok(config)
}

fn check_available(name: &str, config: &Config, catalog: &Catalog) -> Result<(), Refused> {
    // A process plugin: its manifest read; validate() starts it on the edited table.
    if let Some(program) = catalog.program(name) {
        return match &program.manifest {
            Ok(_) => Ok(()),
            Err(why) => Err(Refused(format!("plugin \"{name}\" cannot be loaded: {why}"))),
        };
    }
    match catalog.library(name) {
        Ok(_) => Ok(()),
        Err(Unavailable::Refused(refusal)) => {
            Err(Refused(format!("plugin \"{name}\" cannot be loaded: {refusal}")))
        }
        Err(Unavailable::Missing) => Err(Refused(format!(
            "unknown plugin \"{name}\": no library in {} exports it (available: {})",
            config.plugin_dir.display(),
            catalog.available_names()
        ))),
    }
}

/// Runs the plugin `name`'s own `new` on its table in the edited `text`, in a child
/// process (a plugin that crashes in `new` ends the child, not agentctl): the edited text
/// is written to a temporary file beside `file` (so relative paths in it mean the same),
/// which the child reads and which is removed after.
fn probe(file: &Path, text: &str, name: &str, catalog: &Catalog, prober: &Prober) -> Result<(), Refused> {
    let Some(library) = catalog.file(name) else {
        return Ok(()); // Not installed: validate() refuses it, naming what is available.
    };
    let (_, folder, file_name) = location(file);
    let candidate = folder.join(format!(".{file_name}.agentctl-{}.tmp", std::process::id()));
    std::fs::write(&candidate, text).map_err(|err| {
        Refused(format!(
            "cannot write {} to check the edit: {err}; {} is unchanged",
            candidate.display(),
            file.display()
        ))
    })?;
    let probed = prober.probe(&library.target, Some(&candidate));
    let _ = std::fs::remove_file(&candidate);
    let refuse = |why: String| {
        // The child read the candidate: name the real file in what it says.
        let why = why.replace(&candidate.display().to_string(), &file.display().to_string());
        Refused(format!(
            "refused: after this edit the configuration would not load: {why}"
        ))
    };
    match probed {
        Err(refusal) => Err(refuse(refusal.to_string())),
        Ok(probed) => match probed.config_error {
            Some(err) => Err(refuse(err)),
            None => Ok(()),
        },
    }
}
