//! How plugins are named: chain names, crate names and library file names.
//!
//! A plugin called `x` in the chain is built by the crate `history_plugin_x` into the
//! library `libhistory_plugin_x.so` (`history_plugin_x.dll` on Windows,
//! `libhistory_plugin_x.dylib` on macOS). The host, `cargo xtask` and plugin authors all
//! derive one name from another with these functions. Nothing here crosses the plugin
//! boundary: a change to this module is not an ABI change.

use std::path::Path;

/// What a plugin crate's name (and its library's stem, without the platform prefix)
/// starts with: the crate `history_plugin_x` is the plugin `x`.
pub const STEM_PREFIX: &str = "history_plugin_";

/// Whether `name` is a plugin name: a plain identifier, never a path — lowercase ASCII
/// letters, digits and `_`, starting with a letter.
pub fn is_plugin_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The file name of plugin `name`'s library (`x` → `libhistory_plugin_x.so` on Linux):
/// the inverse of [`plugin_stem`].
pub fn library_file_name(name: &str) -> String {
    format!(
        "{}{STEM_PREFIX}{name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    )
}

/// The plugin name a library file's name suggests (`libhistory_plugin_x.so` → `x`), or
/// `None` for a file that is not named like a plugin library on this platform.
pub fn plugin_stem(path: &Path) -> Option<&str> {
    let file = path.file_name()?.to_str()?;
    let stem = file
        .strip_prefix(std::env::consts::DLL_PREFIX)?
        .strip_suffix(std::env::consts::DLL_SUFFIX)?;
    stem.strip_prefix(STEM_PREFIX).filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::env::consts::{DLL_PREFIX, DLL_SUFFIX};

    #[test]
    fn plugin_names_are_lowercase_identifiers() {
        for name in ["default", "x", "token_budget", "v2", "a_1_b", "trailing_"] {
            assert!(is_plugin_name(name), "{name:?} is a plugin name");
        }
        for name in [
            "",
            "_leading",
            "1st",
            "Upper",
            "camelCase",
            "with-dash",
            "with space",
            "../evil",
            "dir/name",
            "dot.ted",
            "é",
            "naïve",
        ] {
            assert!(!is_plugin_name(name), "{name:?} is not a plugin name");
        }
    }

    #[test]
    fn library_file_name_has_the_platform_prefix_and_suffix() {
        assert_eq!(
            library_file_name("retention"),
            format!("{DLL_PREFIX}history_plugin_retention{DLL_SUFFIX}")
        );
        if cfg!(target_os = "linux") {
            assert_eq!(library_file_name("x"), "libhistory_plugin_x.so");
        }
    }

    #[test]
    fn plugin_stem_inverts_library_file_name() {
        for name in ["default", "token_budget", "v2"] {
            let file = library_file_name(name);
            assert_eq!(plugin_stem(Path::new(&file)), Some(name));
            let in_a_folder = Path::new("some/dir").join(&file);
            assert_eq!(plugin_stem(&in_a_folder), Some(name), "only the file name counts");
        }
    }

    #[test]
    fn plugin_stem_refuses_files_not_named_like_plugin_libraries() {
        let files = [
            // no stem after the prefix
            format!("{DLL_PREFIX}history_plugin_{DLL_SUFFIX}"),
            // another library
            format!("{DLL_PREFIX}serde{DLL_SUFFIX}"),
            format!("{DLL_PREFIX}plugin_x{DLL_SUFFIX}"),
            // the crate name alone, or with another suffix
            "history_plugin_x".to_string(),
            format!("{DLL_PREFIX}history_plugin_x{DLL_SUFFIX}.bak"),
            format!("{DLL_PREFIX}history_plugin_x.rlib"),
            // the temporary file of an install in progress
            format!(".{DLL_PREFIX}history_plugin_x{DLL_SUFFIX}.installing"),
        ];
        for file in files {
            assert_eq!(plugin_stem(Path::new(&file)), None, "{file:?}");
        }
        assert_eq!(plugin_stem(Path::new("/")), None, "no file name");
    }
}
