//! Sessions (docs/sessions.md): the session model, the durable store and the runtime
//! commands. No HTTP: `history-server` serves this over HTTP and `history-host chat`
//! drives it from a terminal.
//!
//! - [`store`]: the [`Store`](store::Store) trait and the embedded SQLite store;
//! - [`session`]: one session in memory and its operations (a turn, a model switch,
//!   `/clear`, an expansion), each one store transaction;
//! - [`service`]: every live session, per-session serialization, host-wide settings,
//!   `max_users` and the idle reaper;
//! - [`commands`]: the runtime commands (`!model`, `!maxctx`, …, `/history`, `/clear`);
//! - [`reload`]: hot reload of the configuration and the chain (`Service::watch`);
//! - [`metrics`]: the counters `/metrics` shows; [`clock`]: time stamps and session ids.

pub mod clock;
pub mod commands;
pub mod error;
pub mod metrics;
pub mod reload;
pub mod service;
pub mod session;
pub mod store;

pub use commands::{Command, CommandAnswer};
pub use error::{ErrorKind, SessionError};
pub use service::{
    ChainReport, EventRecord, Options, Readiness, Recalled, Service, SessionInfo, StageInfo, StagePlace,
    StageRecord, StartError, StatelessRun, TranscriptPage, TurnRecord, TURN_LOG_LEN,
};
pub use session::{ContextItem, TurnInput, TurnOutcome};
