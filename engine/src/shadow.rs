//! Shadow copies of plugin libraries, for hosts that reload (docs/chain.md#hot-reload).
//!
//! A mapped library must never be overwritten in place (the process crashes), and
//! `dlopen` of a path already loaded hands back the old code. So a long-running host maps
//! no file of `plugin_dir` itself: it copies each library it needs to
//! `<plugin_dir>/.shadow/<content hash>/<file name>` and maps the copy. A rebuilt file
//! (same path, new content) gets a new hash, so a new copy and new code; an unchanged one
//! is the library already loaded, reused without reading its copy again.
//!
//! Each folder has a `.lock` file that every process using the folder's library holds
//! shared for as long as it lives (libraries are never unloaded). Cleaning up at start
//! removes the folders whose lock nobody holds, so hosts that share a `plugin_dir` never
//! remove each other's copies.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::library::{PluginLibrary, Refusal};

/// The folder of `plugin_dir` that holds the shadow copies; discovery never looks in it.
pub const SHADOW_DIR: &str = ".shadow";

/// A library that takes longer than this to copy and map is named in an info line...
const SLOW_LOAD: Duration = Duration::from_millis(250);
/// ...and past this, in a warning.
const VERY_SLOW_LOAD: Duration = Duration::from_secs(1);

/// The lock file of one shadow folder.
const LOCK_FILE: &str = ".lock";

/// How a library's content is named: the first 128 bits of its SHA-256, in hex.
pub fn content_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// Where the copy of a library file named `file_name` with content `hash` lives.
pub fn shadow_path(plugin_dir: &Path, hash: &str, file_name: &std::ffi::OsStr) -> PathBuf {
    plugin_dir.join(SHADOW_DIR).join(hash).join(file_name)
}

/// A library loaded from a shadow copy, and the lock that says it is in use.
struct Loaded {
    library: PluginLibrary,
    _in_use: File,
}

/// The libraries a process loaded from shadow copies, by content hash: one per content,
/// whatever file (or reload) asked for it. Shared by every catalog of the process
/// ([`crate::Catalog::shadowed`]).
#[derive(Default)]
pub struct ShadowLibraries {
    loaded: Mutex<HashMap<String, Loaded>>,
}

impl std::fmt::Debug for ShadowLibraries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShadowLibraries")
            .field("loaded", &self.hashes())
            .finish()
    }
}

impl ShadowLibraries {
    pub fn new() -> ShadowLibraries {
        ShadowLibraries::default()
    }

    /// The content hashes loaded so far.
    pub fn hashes(&self) -> Vec<String> {
        let mut hashes: Vec<String> = self.lock().keys().cloned().collect();
        hashes.sort();
        hashes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Loaded>> {
        self.loaded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The library of the file at `path` in `plugin_dir` (read from `target`, a symlink's
    /// target or `path` itself): the one already loaded with the same content, or its
    /// content copied to its shadow path and loaded from there. The library is named by
    /// `path` in errors and reports.
    pub(crate) fn load(&self, path: &Path, target: &Path) -> Result<PluginLibrary, Refusal> {
        let refuse = |reason: String| Refusal {
            path: path.to_path_buf(),
            reason,
            detail: None,
        };
        let started = Instant::now();
        // One read: the bytes hashed are the bytes copied, even while the file is rewritten.
        let bytes = std::fs::read(target).map_err(|e| refuse(format!("cannot read it: {e}")))?;
        let hash = content_hash(&bytes);
        let mut loaded = self.lock();
        if let Some(known) = loaded.get(&hash) {
            let mut library = known.library.clone();
            library.path = path.to_path_buf();
            return Ok(library);
        }
        let plugin_dir = path.parent().unwrap_or(Path::new("."));
        let file_name = path.file_name().unwrap_or_default();
        let copy = shadow_path(plugin_dir, &hash, file_name);
        // A host that reloads loads only copies: plugin_dir must be writable for it.
        let cannot = |what: &str, e: std::io::Error| {
            refuse(format!(
                "cannot {what} {} ({e}): a host that reloads loads each library from a copy in {}, so plugin_dir must be writable",
                copy.display(),
                plugin_dir.join(SHADOW_DIR).display()
            ))
        };
        let in_use = claim(copy.parent().expect("a shadow path has a folder"))
            .map_err(|e| cannot("lock the folder of its shadow copy", e))?;
        write_copy(&copy, &bytes).map_err(|e| cannot("write its shadow copy", e))?;
        let copied = started.elapsed();
        let library = PluginLibrary::load_as(path, &copy)?;
        tracing::debug!("plugin \"{}\" loaded from {}", library.name, copy.display());
        // What a start or reload spends its time on, when it is slow (docs/chain.md#hot-reload):
        // at info, and at warn past a second (what `chat`, logging warnings only, shows).
        let elapsed = started.elapsed();
        if elapsed >= SLOW_LOAD {
            let line = format!(
                "plugin library {}: {:.1} MB read, hashed and copied in {} ms, mapped in {} ms",
                path.display(),
                bytes.len() as f64 / 1e6,
                copied.as_millis(),
                (elapsed - copied).as_millis()
            );
            if elapsed >= VERY_SLOW_LOAD {
                tracing::warn!("{line}");
            } else {
                tracing::info!("{line}");
            }
        }
        loaded.insert(
            hash,
            Loaded {
                library: library.clone(),
                _in_use: in_use,
            },
        );
        Ok(library)
    }

    /// Removes the shadow folders of `plugin_dir` that no process uses: neither this one
    /// (its loaded libraries) nor another (one holding the folder's lock). Returns the
    /// folders removed; one that cannot be removed is a warning.
    pub fn remove_unused(&self, plugin_dir: &Path) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(plugin_dir.join(SHADOW_DIR)) else {
            return Vec::new();
        };
        let used = self.hashes();
        let mut removed = Vec::new();
        for entry in entries.filter_map(Result::ok) {
            let folder = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if used.contains(&name) || !folder.is_dir() {
                continue;
            }
            // Held exclusively while the folder goes, so no process claims it meanwhile.
            let Some(_unused) = claim_unused(&folder) else {
                continue;
            };
            match std::fs::remove_dir_all(&folder) {
                Ok(()) => removed.push(folder),
                Err(e) => tracing::warn!("cannot remove the unused shadow copy {}: {e}", folder.display()),
            }
        }
        removed
    }
}

/// Writes `bytes` to `copy` unless it already holds them: through a temporary file and a
/// rename, so a copy is never seen half-written and a mapped copy is never written over.
/// A present copy is compared byte for byte, not hashed again: one hash per library.
fn write_copy(copy: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if std::fs::read(copy).is_ok_and(|present| present == bytes) {
        return Ok(());
    }
    let file_name = copy.file_name().unwrap_or_default().to_string_lossy();
    let temporary = copy.with_file_name(format!(".{file_name}.{}.tmp", std::process::id()));
    std::fs::write(&temporary, bytes)?;
    std::fs::rename(&temporary, copy).inspect_err(|_| {
        let _ = std::fs::remove_file(&temporary);
    })
}

/// Creates `folder` if needed and holds its lock shared: this process uses its library.
/// Retries when a cleanup removed the folder between opening the lock and taking it.
fn claim(folder: &Path) -> std::io::Result<File> {
    let mut last = None;
    for _ in 0..5 {
        std::fs::create_dir_all(folder)?;
        let lock = folder.join(LOCK_FILE);
        let file = File::options().create(true).append(true).open(&lock)?;
        flock::shared(&file)?;
        if flock::same_file(&file, &lock) {
            return Ok(file);
        }
        last = Some(std::io::Error::other(
            "the folder was removed while it was claimed",
        ));
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("cannot claim the folder")))
}

/// The lock of `folder` held exclusively, when no process holds it.
fn claim_unused(folder: &Path) -> Option<File> {
    let file = File::options()
        .create(true)
        .append(true)
        .open(folder.join(LOCK_FILE))
        .ok()?;
    flock::try_exclusive(&file).then_some(file)
}

/// Advisory whole-file locks (`flock`): released when the file is closed, so a process
/// that ends, however it ends, holds none.
#[cfg(unix)]
mod flock {
    use std::fs::File;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::io::AsRawFd;
    use std::path::Path;

    pub fn shared(file: &File) -> std::io::Result<()> {
        loop {
            // SAFETY: flock on a descriptor this File owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH) } == 0 {
                return Ok(());
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }

    pub fn try_exclusive(file: &File) -> bool {
        // SAFETY: flock on a descriptor this File owns.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
    }

    /// Whether `path` still names the file `file` has open.
    pub fn same_file(file: &File, path: &Path) -> bool {
        match (file.metadata(), std::fs::metadata(path)) {
            (Ok(open), Ok(named)) => open.dev() == named.dev() && open.ino() == named.ino(),
            _ => false,
        }
    }
}

/// Without `flock`, copies are never known to be unused: none is removed.
#[cfg(not(unix))]
mod flock {
    use std::fs::File;
    use std::path::Path;

    pub fn shared(_file: &File) -> std::io::Result<()> {
        Ok(())
    }

    pub fn try_exclusive(_file: &File) -> bool {
        false
    }

    pub fn same_file(_file: &File, _path: &Path) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_named_by_its_content() {
        let dir = Path::new("/plugins");
        let name = std::ffi::OsStr::new("libhistory_plugin_x.so");
        let one = content_hash(b"build one");
        let two = content_hash(b"build two");
        assert_eq!(one.len(), 32);
        assert!(one.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(one, two, "new content, new folder");
        assert_eq!(one, content_hash(b"build one"), "same content, same folder");
        assert_eq!(
            shadow_path(dir, &one, name),
            PathBuf::from(format!("/plugins/.shadow/{one}/libhistory_plugin_x.so"))
        );
    }

    #[test]
    fn a_copy_is_written_whole_and_never_over_itself() {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("libhistory_plugin_x.so");
        write_copy(&copy, b"content").unwrap();
        assert_eq!(std::fs::read(&copy).unwrap(), b"content");
        let before = std::fs::metadata(&copy).unwrap().modified().unwrap();
        write_copy(&copy, b"content").unwrap();
        assert_eq!(
            std::fs::metadata(&copy).unwrap().modified().unwrap(),
            before,
            "a present copy with the right content is not written again"
        );
        std::fs::write(&copy, b"damaged").unwrap();
        write_copy(&copy, b"content").unwrap();
        assert_eq!(
            std::fs::read(&copy).unwrap(),
            b"content",
            "a wrong copy is replaced"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "no temporary file is left: {names:?}");
    }

    #[cfg(unix)]
    #[test]
    fn cleanup_removes_only_what_no_process_uses() {
        let plugin_dir = tempfile::tempdir().unwrap();
        let folder = |hash: &str| plugin_dir.path().join(SHADOW_DIR).join(hash);
        for hash in ["unused", "held", "stale-no-lock"] {
            std::fs::create_dir_all(folder(hash)).unwrap();
            std::fs::write(folder(hash).join("libhistory_plugin_x.so"), hash).unwrap();
        }
        std::fs::write(folder("unused").join(LOCK_FILE), "").unwrap();
        // Another user of "held": a lock held shared on its own open file (flock locks
        // belong to the open file, so this stands for another process).
        let held = claim(&folder("held")).unwrap();
        // A library file in plugin_dir itself is never touched.
        std::fs::write(plugin_dir.path().join("libhistory_plugin_x.so"), "x").unwrap();

        let libraries = ShadowLibraries::new();
        let mut removed = libraries.remove_unused(plugin_dir.path());
        removed.sort();
        assert_eq!(removed, [folder("stale-no-lock"), folder("unused")]);
        assert!(folder("held").join("libhistory_plugin_x.so").exists());
        assert!(plugin_dir.path().join("libhistory_plugin_x.so").exists());

        drop(held);
        assert_eq!(libraries.remove_unused(plugin_dir.path()), [folder("held")]);
        assert!(libraries.remove_unused(plugin_dir.path()).is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn a_claim_survives_a_cleanup_that_removed_its_folder() {
        let plugin_dir = tempfile::tempdir().unwrap();
        let folder = plugin_dir.path().join(SHADOW_DIR).join("h");
        let first = claim(&folder).unwrap();
        drop(first);
        ShadowLibraries::new().remove_unused(plugin_dir.path());
        assert!(!folder.exists());
        let again = claim(&folder).unwrap();
        assert!(flock::same_file(&again, &folder.join(LOCK_FILE)));
        assert!(
            ShadowLibraries::new().remove_unused(plugin_dir.path()).is_empty(),
            "held"
        );
    }

    #[test]
    fn discovery_never_lists_the_shadow_copies() {
        let plugin_dir = tempfile::tempdir().unwrap();
        let copy = shadow_path(
            plugin_dir.path(),
            "h",
            std::ffi::OsStr::new("libhistory_plugin_x.so"),
        );
        std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
        std::fs::write(&copy, "x").unwrap();
        let catalog = crate::Catalog::discover(plugin_dir.path()).unwrap();
        assert!(catalog.files().is_empty(), "{:?}", catalog.files());
    }
}
