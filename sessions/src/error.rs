//! Why a session operation did not happen.

/// What kind of failure: each maps to one HTTP status (docs/http-api.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad input: the request, a message, a command. Nothing changed.
    BadInput,
    /// No such session.
    NotFound,
    /// The session's previous turn was still running when this one stopped waiting.
    Busy,
    /// A plugin failed the turn under `on_plugin_error = "fail"`, or a `required` plugin
    /// faulted. Nothing was stored.
    PluginFailed,
    /// `max_users` live sessions already.
    TooManySessions,
    /// The service is shutting down.
    ShuttingDown,
    /// The store failed; nothing was stored.
    Store,
    /// The store cannot be reached now (a database server down); nothing was stored, and
    /// the same request may succeed later.
    StoreUnavailable,
    /// A resent conversation that does not extend the session's transcript. Nothing changed.
    Conflict,
}

impl ErrorKind {
    /// The `code` of the error body.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::BadInput => "bad_input",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Busy => "busy",
            ErrorKind::PluginFailed => "plugin_failed",
            ErrorKind::TooManySessions => "too_many_sessions",
            ErrorKind::ShuttingDown => "shutting_down",
            ErrorKind::Store => "store_failed",
            ErrorKind::StoreUnavailable => "store_unavailable",
            ErrorKind::Conflict => "transcript_conflict",
        }
    }
}

/// A failed session operation: its kind and one line saying why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionError {
    pub kind: ErrorKind,
    pub message: String,
    /// The plugin that failed the turn ([`ErrorKind::PluginFailed`]).
    pub plugin: Option<String>,
}

impl SessionError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> SessionError {
        SessionError {
            kind,
            message: message.into(),
            plugin: None,
        }
    }

    pub fn bad_input(message: impl Into<String>) -> SessionError {
        SessionError::new(ErrorKind::BadInput, message)
    }

    pub fn not_found(id: &str) -> SessionError {
        SessionError::new(ErrorKind::NotFound, format!("no session \"{id}\""))
    }
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SessionError {}

impl From<crate::store::StoreError> for SessionError {
    fn from(e: crate::store::StoreError) -> SessionError {
        let kind = if e.unavailable {
            ErrorKind::StoreUnavailable
        } else {
            ErrorKind::Store
        };
        SessionError::new(kind, e.to_string())
    }
}
