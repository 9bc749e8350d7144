//! The recall tools over the Model Context Protocol at `/mcp` (docs/mcp.md): what an agent
//! asks for when the chain trimmed it. Streamable HTTP by rmcp (the protocol's own Rust
//! SDK), mounted beside the other routes so it shares the connections' limits and drain.
//!
//! The session is the tool's `session` argument, or else the `X-History-Session` header of
//! the MCP connection's requests (an agent framework configures it once). As on the HTTP
//! API, a session id is the capability: nothing here lists sessions.

use std::sync::Arc;

use axum::http::request::Parts;
use history_sessions::Service;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, Implementation, ServerCapabilities, ServerConfig};
use rmcp::schemars::{self, JsonSchema};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::recall;

/// The header that names the session for every tool call of an MCP connection.
const SESSION_HEADER: &str = "x-history-session";
/// The `/mcp` service: one [`Recall`] per MCP session. It answers requests whose `Host`
/// is a loopback name or one of `extra_hosts` (`[server] mcp_allowed_hosts`); rmcp refuses
/// any other with 403, its protection against DNS rebinding (docs/mcp.md#the-server).
pub(crate) fn service(
    service: Arc<Service>,
    extra_hosts: &[String],
) -> StreamableHttpService<Recall, LocalSessionManager> {
    let mut config = StreamableHttpServerConfig::default();
    config.allowed_hosts.extend(extra_hosts.iter().cloned());
    StreamableHttpService::new(
        move || Ok(Recall::new(service.clone())),
        LocalSessionManager::default().into(),
        config,
    )
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ExpandArgs {
    /// The session id (optional when the connection sends X-History-Session).
    session: Option<String>,
    /// The message's id as its placeholder names it: its metadata id, or "#" and its
    /// transcript position, or its index in the working history.
    id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct SearchArgs {
    /// The session id (optional when the connection sends X-History-Session).
    session: Option<String>,
    /// What to look for, in words.
    query: String,
    /// How many messages to return, best first (default 5, at most 50).
    limit: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct GetArgs {
    /// The session id (optional when the connection sends X-History-Session).
    session: Option<String>,
    /// Message ids, e.g. those a summary's `summary_of` lists.
    ids: Vec<String>,
}

/// The recall tools of one MCP session.
#[derive(Clone)]
pub(crate) struct Recall {
    service: Arc<Service>,
    tool_router: ToolRouter<Recall>,
}

/// A tool's failure as the model reads it: a result marked as an error, not a protocol
/// error, so the agent can correct its call.
fn answered(result: Result<Value, String>) -> CallToolResult {
    match result {
        Ok(value) => CallToolResult::structured(value),
        Err(why) => CallToolResult::structured_error(json!({"error": why})),
    }
}

#[tool_router]
impl Recall {
    fn new(service: Arc<Service>) -> Recall {
        Recall {
            service,
            tool_router: Self::tool_router(),
        }
    }

    /// The session a call is about: its argument, else the connection's header.
    fn session(given: Option<String>, ctx: &RequestContext<RoleServer>) -> Result<String, String> {
        if let Some(id) = given.filter(|id| !id.is_empty()) {
            return Ok(id);
        }
        ctx.extensions
            .get::<Parts>()
            .and_then(|parts| parts.headers.get(SESSION_HEADER))
            .and_then(|value| value.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| {
                "no session: pass `session`, or send X-History-Session on the MCP connection".into()
            })
    }

    /// Runs `call` on the session a tool call is about, its answer (or why there is no
    /// session) as the tool's result.
    async fn on_session<Call, Answer>(
        &self,
        given: Option<String>,
        ctx: &RequestContext<RoleServer>,
        call: Call,
    ) -> Result<CallToolResult, ErrorData>
    where
        Call: FnOnce(Arc<Service>, String) -> Answer,
        Answer: std::future::Future<Output = Result<Value, String>>,
    {
        let result = match Self::session(given, ctx) {
            Ok(session) => call(self.service.clone(), session).await,
            Err(why) => Err(why),
        };
        Ok(answered(result))
    }

    #[tool(
        description = "Read the original of a message the history manager omitted, compacted or summarized away, by the id its placeholder names. The session keeps it expanded from then on."
    )]
    async fn expand_message(
        &self,
        Parameters(args): Parameters<ExpandArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.on_session(args.session, &ctx, |service, session| async move {
            recall::expand(&service, &session, &args.id).await
        })
        .await
    }

    #[tool(
        description = "Search the whole conversation so far, including what the history manager trimmed, for the messages that best match a query (BM25). Returns ids to pass to expand_message or get_messages."
    )]
    async fn search_history(
        &self,
        Parameters(args): Parameters<SearchArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.on_session(args.session, &ctx, |service, session| async move {
            recall::search(&service, &session, &args.query, args.limit).await
        })
        .await
    }

    #[tool(
        description = "Read messages of the conversation by id, e.g. the ones a summary stands for (its summary_of). Does not change what the history manager sends."
    )]
    async fn get_messages(
        &self,
        Parameters(args): Parameters<GetArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.on_session(args.session, &ctx, |service, session| async move {
            recall::messages(&service, &session, &args.ids).await
        })
        .await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Recall {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("history-host", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Recall for a conversation whose history a history manager trims: placeholders such as \
                 [Omitted: call expand_message with id \"#12\"] name what to expand; search_history finds \
                 older messages by content; get_messages reads messages by id.",
            )
    }
}
