//! The session service over HTTP (docs/http-api.md): axum on tokio, the only crate of the
//! workspace that knows HTTP. [`serve`] is `history-host serve`.
//!
//! Every error is `{"error": {"code", "message"}}` with its status; operator endpoints
//! need `Authorization: Bearer TOKEN`; bodies past `max_body_mb` are refused with 413
//! before they are read whole.

mod answers;
mod anthropic;
mod app;
mod auth;
mod body;
mod conn;
mod mcp;
mod proxy;
mod proxy_recall;
mod recall;
mod resent;
mod responses;
mod routes;
mod traffic;
mod ui;
mod upstream;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use history_sessions::{Options, Service};

pub use auth::operator_token;
pub use upstream::ModelClient;

/// The request bodies of the endpoints that take one, parsed as the endpoints parse them
/// but without a service (the fuzz targets in fuzz/ drive these). `Ok` is what the
/// endpoint would go on with; `Err` is the status and message it would answer.
pub mod bodies {
    use history_sessions::{Command, TurnInput};
    use serde_json::Value;

    use crate::routes;

    type Answer<T> = Result<T, (u16, String)>;

    fn answer<T>(result: Result<T, routes::ApiError>) -> Answer<T> {
        result.map_err(|e| {
            let (status, message) = e.parts();
            (status, message.to_string())
        })
    }

    /// `POST /v1/sessions`.
    pub fn create(bytes: &[u8]) -> Answer<(Option<String>, Option<Value>)> {
        answer(routes::create_body(bytes))
    }

    /// `POST /v1/sessions/{id}/turns`.
    pub fn turn(bytes: &[u8]) -> Answer<TurnInput> {
        answer(routes::turn_body(bytes).map(|(input, _form)| input))
    }

    /// `POST /v1/sessions/{id}/model`.
    pub fn model(bytes: &[u8]) -> Answer<String> {
        answer(routes::model_body(bytes))
    }

    /// `POST /v1/sessions/{id}/commands`.
    pub fn command(bytes: &[u8]) -> Answer<Command> {
        answer(routes::command_body(bytes))
    }

    /// `POST /v1/sessions/{id}/expand`.
    pub fn expand(bytes: &[u8]) -> Answer<String> {
        answer(routes::expand_body(bytes))
    }
}

/// The address the service listens on unless told otherwise: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";

/// What `history-host serve` was asked.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub config_file: PathBuf,
    pub listen: Option<SocketAddr>,
    pub store: Option<PathBuf>,
    /// `--upstream URL`: the proxy's upstream, over `[upstream] url` (docs/proxy.md).
    pub upstream: Option<String>,
}

/// Runs the service until SIGTERM or Ctrl-C: then it stops accepting, lets running
/// requests (and so running turns) finish within `[server] shutdown_grace_s`, answers the
/// rest 503, and returns (docs/http-api.md#connections). Prints `listening on ADDR` on
/// stdout once bound. An error is one line: the configuration, the store, the token, the
/// address.
pub fn serve(options: ServeOptions) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(64)
        .thread_name("history-serve")
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let result = runtime.block_on(run(options));
    // A turn still on a blocking thread past the drain was answered 503; its store write
    // is one transaction, so the process need not wait for it (docs/http-api.md#stopping).
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    result
}

async fn run(options: ServeOptions) -> Result<(), String> {
    // On a blocking thread: a store's client may block (PostgreSQL's does).
    let service = {
        let options = Options {
            config_file: options.config_file.clone(),
            store: options.store.clone(),
        };
        tokio::task::spawn_blocking(move || Service::open(&options))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?
    };
    let config = service.config();
    let token = operator_token(&config)?;
    let listen = match options.listen {
        Some(listen) => listen,
        None => DEFAULT_LISTEN.parse().expect("a valid address"),
    };
    if !listen.ip().is_loopback() && token.is_none() {
        return Err(format!(
            "refusing to listen on {listen} without an operator token: set operator_token_file in {} \
             or HISTORY_OPERATOR_TOKEN (or listen on a loopback address)",
            config.file.display()
        ));
    }
    let upstream = match upstream::resolve(options.upstream.as_deref(), config.upstream.as_ref())? {
        Some(upstream) => Some(Arc::new(upstream::Upstream::new(&upstream)?)),
        None => None,
    };
    if let Some(upstream) = &upstream {
        tracing::info!("proxying /v1/chat/completions to {}", upstream.url());
    }
    let app = routes::router(
        app::App {
            service: service.clone(),
            token: token.map(Arc::from),
            upstream,
            resent: Arc::default(),
            resent_items: Arc::default(),
            resent_anthropic: Arc::default(),
            traffic: Arc::new(traffic::Traffic::new(&config.ui)),
        },
        config.max_body_mb,
        &config.server.mcp_allowed_hosts,
    );
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    let shutdown = shutdown_signal();
    {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "listening on {bound}");
        let _ = stdout.flush();
    }
    tracing::info!(
        "serving on http://{bound}; store {}; max_body_mb {}",
        service.store_path().display(),
        config.max_body_mb
    );
    let reaper = service.spawn_reaper();
    // Hot reload (docs/chain.md#hot-reload); without a watch the host still serves.
    if let Err(e) = service.watch() {
        tracing::warn!("hot reload is off: {e}");
    }
    let shutting_down = service.clone();
    let limits = conn::Limits::new(&config.server);
    tracing::info!(
        "connections: at most {} open; header_timeout_s {}, idle_timeout_s {}, body_timeout_s {}, shutdown_grace_s {}",
        limits.max_connections,
        limits.header_timeout.as_secs(),
        limits.idle_timeout.as_secs(),
        limits.body_timeout.as_secs(),
        limits.grace.as_secs()
    );
    conn::serve(listener, app, limits, shutdown, move || shutting_down.shut_down()).await;
    reaper.abort();
    tracing::info!("stopped");
    Ok(())
}

/// SIGTERM or Ctrl-C (SIGINT). The handlers are installed when this is called, not when
/// the future is first polled: `serve` calls it before it prints `listening on`, so a
/// SIGTERM sent the moment after is a shutdown, never the default kill.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let (terminate, interrupt) = {
        use tokio::signal::unix::{signal, SignalKind};
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    };
    async move {
        #[cfg(unix)]
        match (terminate, interrupt) {
            (Ok(mut terminate), Ok(mut interrupt)) => {
                tokio::select! {
                    _ = terminate.recv() => {},
                    _ = interrupt.recv() => {},
                }
            }
            (Ok(mut terminate), Err(_)) => {
                terminate.recv().await;
            }
            (Err(_), Ok(mut interrupt)) => {
                interrupt.recv().await;
            }
            (Err(_), Err(_)) => std::future::pending::<()>().await,
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
