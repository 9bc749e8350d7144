//! Logging: the callback plugins log through (their own copy of `tracing` cannot reach
//! ours), tagged with the plugin that is running; and the one-line panic hook of every
//! binary. The subscriber that writes the lines is the binaries' choice.

use std::cell::RefCell;

use plugin_api::{echo, LogLevel, RStr};

thread_local! {
    static CURRENT_PLUGIN: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Runs `f` with `plugin` named as the source of any plugin log line on this thread.
pub(crate) fn with_plugin<R>(plugin: &str, f: impl FnOnce() -> R) -> R {
    let previous = CURRENT_PLUGIN.with(|c| std::mem::replace(&mut *c.borrow_mut(), plugin.to_string()));
    let result = f();
    CURRENT_PLUGIN.with(|c| *c.borrow_mut() = previous);
    result
}

/// Writes a plugin's log line (the host services' `log`), naming the running plugin.
pub extern "C" fn plugin_log(level: LogLevel, message: RStr<'_>) {
    CURRENT_PLUGIN.with(|plugin| log_plugin_line(&plugin.borrow(), level, message.as_str()));
}

/// Writes a log line of plugin `plugin` (also one an isolated plugin's worker sent).
pub(crate) fn log_plugin_line(plugin: &str, level: LogLevel, message: &str) {
    // A plugin's line stays one line: no newline or escape sequence gets through.
    let message = echo::text(message);
    match level {
        LogLevel::Error => tracing::error!(plugin = %plugin, "{message}"),
        LogLevel::Warn => tracing::warn!(plugin = %plugin, "{message}"),
        LogLevel::Info => tracing::info!(plugin = %plugin, "{message}"),
        LogLevel::Debug => tracing::debug!(plugin = %plugin, "{message}"),
    }
}

/// Makes a panic (a bug) end in one line on stderr, `PROGRAM: internal error: …`, never a
/// backtrace: what every binary of the host promises its users.
pub fn one_line_panics(program: &'static str) {
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        crate::output::error_line(program, &format!("internal error: {message}"));
    }));
}
