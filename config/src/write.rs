//! Writing the configuration safely: one agentctl at a time per file ([`EditLock`]), and
//! an atomic replacement ([`write_atomic`]) that keeps the file's permissions, owner and
//! symlink, and refuses to overwrite a file changed by hand meanwhile.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::edit::Refused;

/// Replaces `file` with `text` atomically: a temporary file in the same folder is
/// written and fsynced, then renamed over the original, then the folder is fsynced. A
/// crash at any point leaves either the old file or the new one, whole. `original` is
/// the text the edit was made from: if the file changed meanwhile, nothing is written.
/// `before_rename` runs once the temporary file is written and fsynced, just before the
/// rename: the binary's fault-injection hook for tests.
pub fn write_atomic(file: &Path, text: &str, original: &str, before_rename: &dyn Fn()) -> Result<(), String> {
    let (target, folder, file_name) = location(file);
    remove_stale_temporaries(&folder, &file_name);
    let temporary = folder.join(format!(".{file_name}.agentctl-{}.tmp", std::process::id()));
    let cannot = |what: &str, err: std::io::Error| {
        format!(
            "cannot {what} {}: {err}; {} is unchanged",
            temporary.display(),
            file.display()
        )
    };
    let _ = std::fs::remove_file(&temporary);
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temporary)
        .map_err(|e| cannot("create", e))?;
    let written = (|| {
        if let Ok(metadata) = std::fs::metadata(&target) {
            keep_owner(&out, &metadata)?;
            out.set_permissions(metadata.permissions())?;
        }
        out.write_all(text.as_bytes())?;
        out.sync_all()
    })();
    drop(out);
    if let Err(err) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(cannot("write", err));
    }
    before_rename();
    match std::fs::read_to_string(&target) {
        Ok(now) if now == original => {}
        _ => {
            let _ = std::fs::remove_file(&temporary);
            return Err(format!(
                "{} changed while agentctl was editing it; nothing written, run the command again",
                file.display()
            ));
        }
    }
    if let Err(err) = std::fs::rename(&temporary, &target) {
        let _ = std::fs::remove_file(&temporary);
        return Err(format!(
            "cannot replace {}: {err}; it is unchanged",
            file.display()
        ));
    }
    // The rename is durable once the folder's entry is on disk.
    if let Ok(dir) = std::fs::File::open(&folder) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Gives the temporary file `out` the owner and group of the file it replaces, so a
/// root edit of a service account's configuration leaves it readable by that account.
/// Changed only where they differ: an unprivileged edit of the operator's own file needs
/// no `chown`. Where they differ and cannot be kept, the edit is refused (the error).
#[cfg(unix)]
fn keep_owner(out: &std::fs::File, original: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let now = out.metadata()?;
    if (now.uid(), now.gid()) != (original.uid(), original.gid()) {
        std::os::unix::fs::fchown(out, Some(original.uid()), Some(original.gid())).map_err(|err| {
            std::io::Error::new(
                err.kind(),
                format!(
                    "cannot give it the owner {}:{} of the file it replaces ({err})",
                    original.uid(),
                    original.gid()
                ),
            )
        })?;
    }
    Ok(())
}

#[cfg(not(unix))]
fn keep_owner(_out: &std::fs::File, _original: &std::fs::Metadata) -> std::io::Result<()> {
    Ok(())
}

/// Where `file` really is (a symlink resolved, so a symlinked configuration stays a
/// symlink): the file, its folder and its name.
pub fn location(file: &Path) -> (PathBuf, PathBuf, String) {
    let target = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
    let folder = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = target
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "plugins-enabled.toml".to_string());
    (target, folder, file_name)
}

/// Whether the agentctl process `pid` that made `path` is gone: by `/proc` where there
/// is one, otherwise by the file's age.
fn holder_is_gone(pid: Option<u32>, path: &Path, max_age_secs: u64) -> bool {
    let proc = Path::new("/proc");
    match pid {
        Some(pid) if proc.join("self").exists() => !proc.join(pid.to_string()).exists(),
        _ => std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() > max_age_secs),
    }
}

/// The claim of one agentctl on editing a configuration: `.NAME.agentctl.lock` beside it,
/// holding the process id, created exclusively and removed when dropped. A lock left by
/// a process that no longer runs is taken over.
pub struct EditLock {
    path: PathBuf,
}

impl EditLock {
    pub fn acquire(file: &Path) -> Result<EditLock, Refused> {
        let (_, folder, file_name) = location(file);
        let path = folder.join(format!(".{file_name}.agentctl.lock"));
        for _ in 0..3 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut lock) => {
                    let _ = write!(lock, "{}", std::process::id());
                    return Ok(EditLock { path });
                }
                Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(&path)
                        .ok()
                        .and_then(|t| t.trim().parse::<u32>().ok());
                    if holder_is_gone(holder, &path, 60) {
                        let _ = std::fs::remove_file(&path);
                        continue;
                    }
                    let who = holder.map_or_else(
                        || "another agentctl".to_string(),
                        |pid| format!("agentctl (pid {pid})"),
                    );
                    return Err(Refused(format!(
                        "{who} is editing {} right now; run the command again when it is done (if no agentctl runs, remove {})",
                        file.display(),
                        path.display()
                    )));
                }
                // A folder agentctl cannot write to: the write would fail the same way.
                Err(err) => {
                    return Err(Refused(format!(
                        "cannot create {}: {err}; {} is unchanged",
                        path.display(),
                        file.display()
                    )))
                }
            }
        }
        Err(Refused(format!(
            "cannot take the edit lock {}; {} is unchanged",
            path.display(),
            file.display()
        )))
    }
}

impl Drop for EditLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Removes temporary files an interrupted agentctl left beside the configuration: those
/// of processes that no longer run (or, where that cannot be told, older than an hour).
pub fn remove_stale_temporaries(folder: &Path, file_name: &str) {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    let start = format!(".{file_name}.agentctl-");
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(pid) = name
            .strip_prefix(&start)
            .and_then(|rest| rest.strip_suffix(".tmp"))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        if holder_is_gone(Some(pid), &entry.path(), 3600) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_replaces_the_file_and_refuses_a_file_changed_meanwhile() {
        let dir = std::env::temp_dir().join(format!("agentctl-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("plugins-enabled.toml");
        std::fs::write(&file, "max_users = 1\n").unwrap();
        write_atomic(&file, "max_users = 2\n", "max_users = 1\n", &|| {}).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "max_users = 2\n");
        // Someone else wrote the file after agentctl read it: nothing is written.
        let err = write_atomic(&file, "max_users = 3\n", "max_users = 1\n", &|| {}).unwrap_err();
        assert!(err.contains("changed while agentctl was editing it"), "{err}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "max_users = 2\n");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("plugins-enabled.toml")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
